"""The suites built into kvoracle. Importing this module registers each with the harness.

The command and the pytest plugin import it; the harness itself never does. A
suite of a third party registers itself the same way, by importing
:func:`kvoracle.conformance.harness.register_suite` in its own module.
"""

from . import external_store, hybrid_lookup, manager, prefix_tree

#: The built-in suites' modules, in the order ``kvoracle check`` runs them.
MODULES = (manager, hybrid_lookup, external_store, prefix_tree)
BUILTIN = ("manager", "hybrid", "external-store", "prefix-tree")
