"""kvoracle: executable specification, reference implementation and conformance
suite for paged KV-cache managers with prefix caching.

Sub-packages: ``kvoracle.spec`` (the rules), ``kvoracle.reference`` (the
reference engine), ``kvoracle.conformance`` (adapters, state machines, the
``kvoracle`` command) and ``kvoracle.gpu`` (torch-backed allocator; needs the
``gpu`` extra).
"""

__version__ = "0.1.0"
