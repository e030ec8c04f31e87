"""Adapters: kvoracle's reference and real engines (vLLM, the torch engine, paged stores).

Which adapter serves which suite under which ``--engine`` name is declared by the
suites (:attr:`kvoracle.conformance.harness.SuiteDef.engines`); the harness's engine
registry resolves the names.
"""

from ..harness.engines import EngineLoadError

__all__ = ["EngineLoadError"]
