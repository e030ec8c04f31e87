"""The reference ``KVCacheManager`` (spec chapter ``lifecycle``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import attrs
import icontract

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import config as config_spec
from kvoracle.spec import full_attention as full_spec
from kvoracle.spec import lifecycle

from .block import KVCacheBlock
from .config import ManagerConfig
from .contracts import ENABLED
from .coordinator import make_coordinator
from .request import Request


@attrs.frozen
class KVCacheBlocks:
    """An allocation result: ``blocks[g]`` lists group ``g``'s blocks."""

    blocks: tuple[tuple[KVCacheBlock, ...], ...]

    def get_block_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(b.block_id for b in group) for group in self.blocks)


def _state(manager: KVCacheManager) -> tuple:
    """Everything observable about a manager, for before/after comparisons."""
    pool = manager.pool
    return (
        pool.free_queue.block_ids(),
        pool._ref_counts(),
        tuple((key, tuple(blocks)) for key, blocks in pool.cached.items()),
        tuple(sorted((rid, tuple(tuple(b.block_id for b in t) for t in
                                 manager.coordinator.block_tables(rid)))
                     for rid in manager.coordinator.requests())),
    )


def _table_ids(manager: KVCacheManager, request_id: str) -> tuple[int, ...]:
    return tuple(b.block_id for b in manager.coordinator.block_tables(request_id)[0])


def _refcounts_balanced(manager: KVCacheManager) -> bool:
    occurrences = Counter(
        b.block_id for m in manager.coordinator.managers
        for table in m.req_to_blocks.values() for b in table)
    pool = manager.pool
    # The pool's non-public reader: a public call would re-check the pool's invariants.
    return pool_spec.refcounts_balanced(
        pool._ref_counts(), tuple(occurrences.get(i, 0) for i in range(pool.num_blocks)))


def _hit_is_valid(manager: KVCacheManager, request: Request, max_length: int,
                  result: tuple[KVCacheBlocks, int]) -> bool:
    blocks, length = result
    size = manager.config.block_size
    return (length == len(blocks.blocks[0]) * size
            and length == full_spec.align_hit(length, size)
            and 0 <= length <= max(max_length, 0))


def _num_cached(manager: KVCacheManager, request_id: str) -> int:
    return manager.coordinator.manager.num_cached_block.get(request_id, 0)


def _cached_prefix_ok(manager: KVCacheManager, request: Request, cache_tokens: int,
                      first: int) -> bool:
    """KV-LIFE-007: blocks ``first`` .. num_full_blocks_to_cache carry their own keys."""
    config = manager.config
    table = manager.coordinator.block_tables(request.request_id)[0]
    num_full = lifecycle.num_full_blocks_to_cache(
        cache_tokens, len(request.block_hashes), config.hash_block_size, config.block_size)
    scale = config.block_size // config.hash_block_size
    return all(
        table[j].cache_key == (request.block_hashes[(j + 1) * scale - 1], 0)
        for j in range(first, min(num_full, len(table))))


@icontract.invariant(lambda self: _refcounts_balanced(self),
                     "KV-POOL-011: each block's ref count equals its block-table occurrences",
                     enabled=ENABLED)
@icontract.invariant(lambda self: all(not b.is_null for m in self.coordinator.managers
                                      for t in m.req_to_blocks.values() for b in t),
                     "KV-POOL-002: no null block in a full-attention block table",
                     enabled=ENABLED)
class KVCacheManager:
    """The KV-cache manager a scheduler talks to."""

    def __init__(self, config: ManagerConfig) -> None:
        self.config = config
        self.coordinator = make_coordinator(config)
        self.pool = self.coordinator.pool

    @property
    def usage(self) -> float:
        return self.pool.usage()

    # -- lookup ----------------------------------------------------------------------
    @icontract.ensure(lambda self, request, max_cache_hit_length, result: _hit_is_valid(
        self, request, request.num_tokens - 1 if max_cache_hit_length is None
        else max_cache_hit_length, result),
        "KV-LIFE-001/KV-FULL-004: the hit is block-aligned and within max_cache_hit_length",
        enabled=ENABLED)
    @icontract.ensure(lambda self, result: self.config.enable_caching or result[1] == 0,
                      "KV-LIFE-002: no hit without prefix caching", enabled=ENABLED)
    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> tuple[KVCacheBlocks, int]:
        """The longest prefix-cache hit of a waiting request."""
        if not self.config.enable_caching or request.skip_reading_prefix_cache:
            return KVCacheBlocks(((),)), 0
        if max_cache_hit_length is None:
            max_cache_hit_length = lifecycle.max_cache_hit_length(request.num_tokens)
        config_spec.require_non_negative("max_cache_hit_length", max_cache_hit_length)
        groups, length = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length)
        return KVCacheBlocks(tuple(tuple(g) for g in groups)), length

    # -- allocation ------------------------------------------------------------------
    @icontract.snapshot(lambda self: _state(self), name="state", enabled=ENABLED)
    @icontract.snapshot(lambda self, request: _table_ids(self, request.request_id),
                        name="table", enabled=ENABLED)
    @icontract.snapshot(lambda self, request, new_computed_blocks: _num_cached(
        self, request.request_id) or len(new_computed_blocks.blocks[0] if new_computed_blocks
                                         else ()), name="num_cached", enabled=ENABLED)
    @icontract.ensure(lambda self, result, OLD: result is not None or _state(self) == OLD.state,
                      "KV-LIFE-004: a failed allocation changes nothing", enabled=ENABLED)
    @icontract.ensure(lambda self, request, new_computed_blocks, result, OLD: result is None
                      or _table_ids(self, request.request_id) == OLD.table + tuple(
                          b.block_id for b in (new_computed_blocks.blocks[0]
                                               if new_computed_blocks else ()))
                      + result.get_block_ids()[0],
                      "KV-LIFE-005/KV-LIFE-014: table = old table + hits + new blocks",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, request, result: result is None or len(
        _table_ids(self, request.request_id)) <= lifecycle.cdiv(
            self.config.max_model_len, self.config.block_size),
        "KV-LIFE-015: no more blocks than max_model_len needs", enabled=ENABLED)
    @icontract.ensure(lambda self, request, num_new_tokens, num_new_computed_tokens,
                      delay_cache_blocks, result, OLD: result is None or delay_cache_blocks
                      or not self.config.enable_caching or _cached_prefix_ok(
                          self, request, lifecycle.num_tokens_to_cache(
                              request.num_computed_tokens, num_new_computed_tokens,
                              num_new_tokens, request.num_tokens), OLD.num_cached),
                      "KV-LIFE-007: every committed full block is cached under its key",
                      enabled=ENABLED)
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for its hit, its new tokens and its lookahead tokens.

        ``num_encoder_tokens`` must be 0: one full-attention group has no cross attention.
        """
        if num_encoder_tokens:
            raise ValueError("KV-CROSS-001: num_encoder_tokens needs a cross-attention group; "
                             f"this manager has one full-attention group (got {num_encoder_tokens})")
        for name, value in (("num_new_tokens", num_new_tokens),
                            ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens)):
            config_spec.require_non_negative(name, value)
        if lifecycle.allocation_is_empty(num_new_tokens, num_new_computed_tokens):
            raise ValueError("KV-LIFE-013: num_new_tokens must be > 0 when no computed "
                             "tokens are adopted")
        hits: tuple[Sequence[KVCacheBlock], ...] = (
            new_computed_blocks.blocks if new_computed_blocks is not None
            else tuple(() for _ in self.coordinator.managers))
        coordinator = self.coordinator
        if coordinator.is_tracked(request.request_id) and any(hits):
            raise ValueError("a running request cannot adopt new prefix-cache hits")

        slots = lifecycle.num_slots(request.num_computed_tokens, num_new_computed_tokens,
                                    num_new_tokens, num_lookahead_tokens,
                                    self.config.max_model_len)
        needed = coordinator.num_blocks_to_allocate(request.request_id, slots, hits)
        if needed > len(self.pool.free_queue):
            return None  # KV-LIFE-003 / KV-LIFE-004

        if any(hits):
            coordinator.add_computed_blocks(request.request_id, hits)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, slots)

        if not delay_cache_blocks:  # KV-LIFE-008
            coordinator.cache_blocks(request, lifecycle.num_tokens_to_cache(
                request.num_computed_tokens, num_new_computed_tokens, num_new_tokens,
                request.num_tokens))
        return KVCacheBlocks(tuple(tuple(g) for g in new_blocks))

    # -- release ---------------------------------------------------------------------
    @icontract.ensure(lambda self, request: request.request_id not in self.coordinator.requests(),
                      "KV-LIFE-009: free forgets the request", enabled=ENABLED)
    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        block_ids = list(block_ids)
        for block_id in block_ids:
            if not isinstance(block_id, int) or not 0 <= block_id < self.config.num_blocks:
                raise ValueError(f"KV-POOL-013: block id {block_id!r} is not in "
                                 f"0..{self.config.num_blocks - 1}")
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- queries ---------------------------------------------------------------------
    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """KV-LIFE-010: vLLM 0.33.0 removed cascade attention; always 0 per group."""
        return [0 for _ in self.coordinator.managers]

    def get_num_common_prefix_blocks_cascade(self, request_id: str) -> list[int]:
        """KV-LIFE-011: the seed's cascade-attention count, per group."""
        return [m.num_common_prefix_blocks(request_id) for m in self.coordinator.managers]

    def requests(self) -> set[str]:
        """Requests holding a block table."""
        return self.coordinator.requests()

    def get_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(b.block_id for b in t)
                     for t in self.coordinator.block_tables(request_id))
