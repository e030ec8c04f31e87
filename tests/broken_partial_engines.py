"""Broken partial-hit Mamba engines (KV-MAMBA-019 .. KV-MAMBA-025), for
tests/test_mamba_partial_suite.py: the reference with one of the partial-hit behaviours wrong each.
The single-type managers are built into an engine by :func:`broken_groups.groups_engine`; the
lookup that ignores partial entries is a coordinator, built into an engine here.

As in tests/broken_align_engines.py, each class does the reference's work where it can and then
gets one observable behaviour wrong, so that the suite must charge the rule it breaks.
"""

from __future__ import annotations

from collections.abc import Sequence

import icontract

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.reference import KVCacheManager, Request, SingleTypeManager
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
from kvoracle.spec import hybrid as hybrid_spec


class RoundsWhatItCaches(SingleTypeManager):
    """KV-MAMBA-019: the attention groups cache only up to the scheduler block size, as with partial
    hits off."""

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        if self.partial_hits and self.kind != hybrid_spec.MAMBA:
            num_tokens = hybrid_spec.num_cacheable_tokens(num_tokens, self.coordinator.config.scheduler_block_size,
                                                          self.eagle, self.block_size)
        super().cache_blocks(request, num_tokens)


class IgnoresPartialEntries(HybridCoordinator):
    """KV-MAMBA-020: a Mamba group's lookup sees only the positional keys of its pages, never a key
    inside a block."""

    def _cached_flags(self, block_hashes: Sequence[bytes], group: object) -> tuple[bool, ...]:
        flags = super()._cached_flags(block_hashes, group)
        if not self._fine(group):  # type: ignore[arg-type]
            return flags
        units = group.kv_cache_spec.block_size // self.config.hash_block_size  # type: ignore[attr-defined]
        return tuple(flag and (f + 1) % units == 0 for f, flag in enumerate(flags))


class IgnoresPartialEntriesEngine(ReferenceEngine):
    def make_manager(self, config: HybridConfig) -> KVCacheManager:  # type: ignore[override]
        class Manager(KVCacheManager):
            coordinator_class = IgnoresPartialEntries
        return Manager(config)


class RegistersNoTail(SingleTypeManager):
    """KV-MAMBA-021: the prompt's last hash boundary is never keyed inside a block."""

    def _register_tail(self, request: Request, num_tokens: int) -> None:
        return


class NeedsNoCopy(SingleTypeManager):
    """KV-MAMBA-022: the copy's page is left out of the need (the pool's own precondition then
    fails where the pool was one page short, as vLLM's get_new_blocks raises)."""

    def _align_need(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int,
                    main_tokens: int) -> int:
        need = super()._align_need(request_id, hits, num_computed_tokens, main_tokens)
        due = request_id in self.copy_due or (bool(hits) and self.fine and num_computed_tokens % self.block_size)
        return need - 1 if due and 0 < need <= self.pool.num_blocks else need

    def allocate_new_blocks(self, request_id: str, num_tokens: int, main_tokens: int | None = None
                            ) -> list[KVCacheBlock]:
        try:
            return super().allocate_new_blocks(request_id, num_tokens, main_tokens)
        except icontract.ViolationError as error:
            raise ValueError("cannot get the blocks from the pool") from error


class WritesTheSharedPage(SingleTypeManager):
    """KV-MAMBA-023: a request resuming inside a shared page keeps it in its table (the copy is
    taken and queued, but its table never holds it)."""

    # Without the reference's postcondition on the table it builds, which would stop the engine
    # before the suite judges it.
    _align_allocate = SingleTypeManager._align_allocate.__wrapped__  # type: ignore[attr-defined]

    def _copy(self, request_id: str, due: tuple[int, KVCacheBlock], copy: KVCacheBlock, allocated: bool
              ) -> list[KVCacheBlock]:
        returned = super()._copy(request_id, due, copy, allocated)
        if not allocated:
            entry, source = due
            self.req_to_blocks[request_id][entry] = source
            self.pool.touch([source])
            self.pool.free_blocks([copy])
            return []
        return returned


class SwapsItsTail(SingleTypeManager):
    """KV-MAMBA-024: a producer puts the copy in its table and leaves the key on its old page."""

    _align_allocate = SingleTypeManager._align_allocate.__wrapped__  # type: ignore[attr-defined]

    def _copy(self, request_id: str, due: tuple[int, KVCacheBlock], copy: KVCacheBlock, allocated: bool
              ) -> list[KVCacheBlock]:
        if not allocated:
            return super()._copy(request_id, due, copy, allocated)
        entry, source = due
        self.pending_copies.append((source, copy))
        self.req_to_blocks[request_id][entry] = copy
        self.pool.touch([copy])  # the table's reference beside the one held for the copy
        return []  # (the source's table reference is now the one held for the copy)


class ReleasesAtOnce(SingleTypeManager):
    """KV-MAMBA-025: the pages of a copy are not held until it has run."""

    def _copy(self, request_id: str, due: tuple[int, KVCacheBlock], copy: KVCacheBlock, allocated: bool
              ) -> list[KVCacheBlock]:
        returned = super()._copy(request_id, due, copy, allocated)
        source, page = self.pending_copies.pop()
        self.pool.free_blocks([source, page])
        return returned
