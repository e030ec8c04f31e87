"""Broken align-mode Mamba groups: the reference's single-type manager with one of chapter 8's
behaviours wrong each, for tests/test_mamba_align_suite.py (built into an engine by
:func:`broken_groups.groups_engine`).

Each class changes what an engine would get wrong, after the reference has done it right where
it can (so the reference's own contracts on the step hold and the difference is the engine's
observable behaviour): the suite must charge it to the rule named in the test's table.
"""

from __future__ import annotations

from collections.abc import Sequence

import icontract

from kvoracle.reference import Request, SingleTypeManager
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.free_queue import FreeBlockQueue
from kvoracle.spec import mamba as mamba_spec


class ReturnsOnlyNewBlocks(SingleTypeManager):
    """KV-MAMBA-004: the allocation returns the pages taken, not the table's new tail."""

    def _align_allocate(self, request_id: str, main_tokens: int) -> list[KVCacheBlock]:
        return [b for b in super()._align_allocate(request_id, main_tokens) if not b.is_null]


class SwapsMovedPage(SingleTypeManager):
    """KV-MAMBA-005: a moved speculative page and the new running page trade places."""

    def _align_allocate(self, request_id: str, main_tokens: int) -> list[KVCacheBlock]:
        old = {b.block_id for b in self.req_to_blocks.get(request_id, ()) if not b.is_null}
        result = super()._align_allocate(request_id, main_tokens)
        table = self.req_to_blocks[request_id]
        moved = [i for i, b in enumerate(table) if b.block_id in old and i >= len(table) - len(result)]
        new = [i for i, b in enumerate(table) if not b.is_null and b.block_id not in old]
        if moved and new:
            i, j = moved[0], new[0]
            table[i], table[j] = table[j], table[i]
            result[:] = table[len(table) - len(result):]
        return result


class NoCheckpoint(SingleTypeManager):
    """KV-MAMBA-006: no prefill checkpoint page is ever reserved."""

    def checkpoint_of(self, request_id: str, num_computed_tokens: int, main_tokens: int) -> int:
        return 0


class NeedsOneMore(SingleTypeManager):
    """KV-MAMBA-007: a growing align-mode table counts one page more than it takes."""

    def _align_need(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int,
                    main_tokens: int) -> int:
        need = super()._align_need(request_id, hits, num_computed_tokens, main_tokens)
        return need + 1 if 0 < need <= self.pool.num_blocks else need


class NegativeNeed(SingleTypeManager):
    """KV-MAMBA-008: the need is the table's growth unfloored, as vLLM 0.33.0 computes it; another
    group then finds the pool short in the middle of the allocation and raises, as vLLM does."""

    def allocate_new_blocks(self, request_id: str, num_tokens: int, main_tokens: int | None = None
                            ) -> list[KVCacheBlock]:
        try:
            return super().allocate_new_blocks(request_id, num_tokens, main_tokens)
        except icontract.ViolationError as error:  # the pool's own precondition: too few free blocks
            raise ValueError("cannot get the blocks from the pool") from error

    def _align_need(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int,
                    main_tokens: int) -> int:
        need = super()._align_need(request_id, hits, num_computed_tokens, main_tokens)
        held = len(self.req_to_blocks.get(request_id, ()))
        growth = mamba_spec.num_required_entries(main_tokens, self.block_size, self.num_speculative_blocks) \
            - len(hits) - held
        return growth if growth < 0 else need


class NeverDefers(SingleTypeManager):
    """KV-MAMBA-009: a hit on a state cached in the current step is admitted at once."""

    def _align_need(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int,
                    main_tokens: int) -> int:
        saved, self.cached_this_step = self.cached_this_step, set()
        try:
            return super()._align_need(request_id, hits, num_computed_tokens, main_tokens)
        finally:
            self.cached_this_step = saved


class NeverRetires(SingleTypeManager):
    """KV-MAMBA-010: the states before the last processed token's page are kept."""

    def _retire_states(self, request_id: str, processed: int) -> None:
        pass


class CachesNoState(SingleTypeManager):
    """KV-MAMBA-011: an align-mode group caches none of its pages."""

    def _align_cache(self, request: Request, num_tokens: int) -> None:
        if not self.align:
            super()._align_cache(request, num_tokens)


class FreesHeadFirst(SingleTypeManager):
    """KV-MAMBA-012: an align-mode table's pages are released head first (where the reference
    puts them in the free queue, in the other order)."""

    def free(self, request_id: str) -> None:
        pages = {b.block_id for b in self.req_to_blocks.get(request_id, ()) if not b.is_null} if self.align else set()
        super().free(request_id)
        queue = list(self.pool.free_queue)
        where = [i for i, b in enumerate(queue) if b.block_id in pages]
        for i, block in zip(where, [queue[i] for i in reversed(where)]):
            queue[i] = block
        self.pool.free_queue = FreeBlockQueue(queue)


class DropsLastSpeculativePage(SingleTypeManager):
    """KV-MAMBA-013: a growing table's last speculative page is handed back, a null left in its place.
    (The reference's class invariant naming KV-MAMBA-013 stops it in the call, and the suite
    charges an engine that names its rule to that rule.)"""

    def _align_allocate(self, request_id: str, main_tokens: int) -> list[KVCacheBlock]:
        result = super()._align_allocate(request_id, main_tokens)
        table = self.req_to_blocks[request_id]
        if result and self.num_speculative_blocks and not table[-1].is_null:
            last = table[-1]
            table[-1] = self.pool.null_block
            self.pool.free_blocks([last])
            result[-1] = self.pool.null_block
        return result


class AssertsOnDraftCheckpoint(SingleTypeManager):
    """KV-MAMBA-017: keying a checkpoint past the hashed tokens fails an assertion, as in vLLM 0.33.0."""

    def _align_cache(self, request: Request, num_tokens: int) -> None:
        position = self.checkpoints.get(request.request_id, (0, 0))[0]
        assert position <= len(request.block_hashes) * request.hash_block_size, "no key past the hashed tokens"
        super()._align_cache(request, num_tokens)
