"""The reference engine over broken single-type managers: the meta-tests' way to build an engine
that gets one group behaviour wrong (tests/test_hybrid_lifecycle.py, tests/test_mamba_align_suite.py)."""

from __future__ import annotations

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.reference import KVCacheManager, Request, SingleTypeManager
from kvoracle.reference.hybrid import HybridConfig


def groups_engine(groups_class: type[SingleTypeManager], need_contracts: bool = True) -> type[ReferenceEngine]:
    """The reference engine with every group built as ``groups_class``; without the reference's
    postconditions on what it caches, and (``need_contracts=False``) on the summed need."""
    class Manager(KVCacheManager):
        def __init__(self, config: HybridConfig) -> None:
            super().__init__(config)
            self.groups = tuple(groups_class(g.group_id, g.kind, g.block_size, g.param, g.pool, g.coordinator,
                                             g.eagle, g.num_speculative_blocks,
                                             mamba_cache_mode="align" if g.align else "none",
                                             num_prefill_checkpoint_blocks=int(g.has_checkpoint_blocks),
                                             prefill_checkpoint_alignment=g.prefill_checkpoint_alignment)
                                for g in self.groups)

        def _cache(self, request: Request, num_tokens: int) -> None:
            # Without the reference's own postcondition on what it caches (KV-HLC-005), which
            # would stop a broken engine before the suite judges it.
            KVCacheManager._cache.__wrapped__(self, request, num_tokens)

        def _allocate(self, *args: object) -> object:
            # Without its postconditions on the summed need (KV-HYB-012, KV-HLC-002) where a broken
            # need is the behaviour under test, for the same reason.
            method = KVCacheManager._allocate if need_contracts else KVCacheManager._allocate.__wrapped__
            return method(self, *args)

    return type(f"Broken_{groups_class.__name__}", (ReferenceEngine,),
                {"make_manager": lambda self, config: Manager(config)})
