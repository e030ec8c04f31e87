"""kvoracle's conformance layer: the harness, the suites, the adapters and the command.

Importing the package registers the built-in suites (:mod:`.suites`) with the
harness (:mod:`.harness`), so that ``run_suite(engine, suite="hybrid")`` finds them.
"""

from . import suites  # noqa: F401
