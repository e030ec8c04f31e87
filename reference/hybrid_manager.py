"""The hybrid KV-cache manager's lifecycle (spec chapter ``hybrid_lifecycle``).

:class:`HybridKVCacheManager` is the manager a scheduler talks to when a model
has several KV-cache groups (or one group of a windowed kind). Lookups are the
hybrid coordinator's (:class:`~.hybrid.HybridCoordinator`); everything that
holds blocks is here: one :class:`GroupTables` per KV-cache group, sharing the
coordinator's block pool.

The order of one allocation is KV-HLC-001's: drop skipped blocks in every
group, check the summed need, adopt every group's hit, allocate group by
group, cache. A Mamba group is supported only with prefix caching off, in
vLLM's "none" mode (KV-HLC-008); its "align" allocation is not specified
(KV-MAMBA-003).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import icontract

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle
from kvoracle.spec import sliding_window as swa_spec
from kvoracle.spec.config import ConfigError, require_non_negative

from .block import KVCacheBlock
from .block_pool import BlockPool
from .contracts import ENABLED
from .hybrid import HybridConfig, HybridCoordinator, _window_or_chunk
from .kv_cache_spec import MambaSpec, SinkFullAttentionSpec
from .manager import KVCacheBlocks
from .request import Request


def _lifecycle_kind(kv_spec: object) -> str:
    kind = getattr(kv_spec, "kind", None)
    if isinstance(kv_spec, SinkFullAttentionSpec):
        return hybrid_spec.FULL
    return kind  # type: ignore[return-value]


class GroupTables:
    """The block tables of one KV-cache group.

    ``req_to_blocks`` maps a request to its table; a request is *tracked* once it is
    in ``num_cached_block`` (it adopted a hit or cached a block), which is what
    KV-HLC-002 distinguishes.
    """

    def __init__(self, group_id: int, kind: str, block_size: int, param: int, pool: BlockPool,
                 coordinator: HybridCoordinator, eagle: bool, num_speculative_blocks: int = 0) -> None:
        self.group_id = group_id
        self.kind = kind
        self.block_size = block_size
        self.param = param
        self.pool = pool
        self.coordinator = coordinator
        self.eagle = eagle
        #: A Mamba group's blocks for speculative decoding, beyond the request's slots (KV-HLC-008).
        self.num_speculative_blocks = num_speculative_blocks
        #: With one group vLLM's unitary coordinator hashes and aligns at the block size and
        #: caches every computed token; with several, hits align to the scheduler block size.
        self.several_groups = len(coordinator.config.kv_cache_specs) > 1
        self.alignment = coordinator.config.scheduler_block_size if self.several_groups else block_size
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return spec.skipped_tokens(self.kind, self.param, num_computed_tokens)

    def slots(self, num_tokens: int) -> int:
        """The slots this group allocates for ``num_tokens`` tokens (KV-HLC-008 for Mamba)."""
        if self.kind == hybrid_spec.MAMBA:
            return spec.mamba_slots(num_tokens, self.block_size, self.num_speculative_blocks)
        return num_tokens

    # -- the steps of one allocation (KV-HLC-001) --------------------------------------
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """KV-SWA-007: free the skipped blocks right to left, up to the first null."""
        skipped = self.skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        # vLLM reads the table through a defaultdict: a request with no table gets an
        # empty one here, which is invisible (empty tables are not reported).
        table = self.req_to_blocks.setdefault(request_id, [])
        indices = swa_spec.blocks_to_free(tuple(b.is_null for b in table), skipped // self.block_size)
        freed = [table[i] for i in indices]
        for i in indices:
            table[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)

    def blocks_to_allocate(self, request_id: str, num_tokens: int, hits: Sequence[KVCacheBlock],
                           num_computed_tokens: int) -> int:
        """KV-HLC-002."""
        tracked = request_id in self.num_cached_block
        evictable = () if tracked else tuple(b.ref_cnt == 0 and not b.is_null for b in hits)
        return spec.group_blocks_to_allocate(
            self.slots(num_tokens), self.block_size, len(self.req_to_blocks.get(request_id, ())), evictable,
            self.skipped_tokens(num_computed_tokens), tracked)

    def adopt_hit(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int) -> None:
        """KV-HLC-003: nulls for the skipped positions, the later hits touched and appended."""
        if self.kind == spec.CROSS_ATTENTION:
            return  # KV-CROSS-002: nothing to adopt, and the request stays untracked
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, "hits are only adopted by a request without blocks"
        skipped_blocks = self.skipped_tokens(num_computed_tokens) // self.block_size
        kept = list(hits[skipped_blocks:])
        self.pool.touch(kept)  # KV-LIFE-006: before any group takes a new block
        table.extend([self.pool.null_block] * skipped_blocks + kept)
        self.num_cached_block[request_id] = len(table)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new = lifecycle.cdiv(self.slots(num_tokens), self.block_size) - len(table)
        if num_new <= 0:
            return []
        blocks = self.pool.get_new_blocks(num_new)
        table.extend(blocks)
        return blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """KV-HLC-005: cache the reachable non-null full blocks up to the cacheable tokens."""
        if self.several_groups:  # KV-HYB-010
            num_tokens = hybrid_spec.num_cacheable_tokens(num_tokens, self.alignment, self.eagle, self.block_size)
        self._cache_full_blocks(request, num_tokens)
        if self.kind == hybrid_spec.FULL and self.block_size != request.hash_block_size:
            self._register_partial_tail(request, num_tokens)

    def _register_partial_tail(self, request: Request, num_tokens: int) -> None:
        """KV-HLC-006: the block holding the prompt's last hash boundary gets a partial entry."""
        boundary = spec.partial_tail_boundary(request.num_prompt_tokens, len(request.block_hashes),
                                              request.hash_block_size, self.block_size, self.eagle)
        table = self.req_to_blocks.get(request.request_id, [])
        if boundary == 0 or boundary > num_tokens or boundary // self.block_size >= len(table):
            return
        key = (request.block_hashes[boundary // request.hash_block_size - 1], self.group_id)
        self.pool.register_partial(table[boundary // self.block_size], key)

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_hashed = len(request.block_hashes) * request.hash_block_size
        num_full = min(num_tokens, num_hashed) // self.block_size
        if num_cached >= num_full:
            return  # nothing new: the request stays untracked if it was
        table = self.req_to_blocks[request.request_id]
        indices = spec.blocks_to_cache(self.kind, self.param, num_cached, num_full, self.block_size,
                                       self.alignment, self.eagle, tuple(b.is_null for b in table))
        pairs = [(table[i], (self.coordinator.view_hash(request.block_hashes, self.block_size, i),
                             self.group_id)) for i in indices]
        if pairs:
            self.pool.cache_blocks(pairs)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        """KV-HLC-004: this group's table, tail first, without its leading nulls."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        order = spec.free_order((tuple(b.block_id for b in table),))
        self.pool.free_blocks([self.pool.blocks[block_id] for block_id in order])


# -- contracts -------------------------------------------------------------------------------
def _refcounts_balanced(manager: HybridKVCacheManager) -> bool:
    occurrences = Counter(b.block_id for group in manager.groups for table in group.req_to_blocks.values()
                          for b in table if not b.is_null)
    pool = manager.pool
    return pool_spec.refcounts_balanced(
        pool._ref_counts(), tuple(occurrences.get(i, 0) for i in range(pool.num_blocks)))


def _nulls_placed(manager: HybridKVCacheManager) -> bool:
    return all(spec.table_nulls_ok(group.kind, tuple(b.is_null for b in table))
               for group in manager.groups for table in group.req_to_blocks.values())


def _state(manager: HybridKVCacheManager) -> tuple:
    pool = manager.pool
    return (pool.free_queue.block_ids(), pool._ref_counts(),
            tuple((key, tuple(blocks)) for key, blocks in pool.cached.items()),
            manager.tables())


def _cached_as_specified(manager: HybridKVCacheManager, request: Request, OLD: object) -> bool:
    """KV-HLC-005: each group's newly committed blocks carry their keys."""
    for group, before in zip(manager.groups, OLD.num_cached):  # type: ignore[attr-defined]
        after = group.num_cached_block.get(request.request_id, 0)
        table = group.req_to_blocks.get(request.request_id, [])
        for i in spec.blocks_to_cache(group.kind, group.param, before, after, group.block_size, group.alignment,
                                      group.eagle, tuple(b.is_null for b in table)):
            key = (manager.coordinator.view_hash(request.block_hashes, group.block_size, i), group.group_id)
            if table[i].cache_key != key:
                return False
    return True


@icontract.invariant(lambda self: _refcounts_balanced(self),
                     "KV-POOL-011: each block's ref count equals its block-table occurrences",
                     enabled=ENABLED)
@icontract.invariant(lambda self: _nulls_placed(self),
                     "KV-HYB-013: no null in full or cross tables, nulls only as a windowed prefix",
                     enabled=ENABLED)
class HybridKVCacheManager:
    """A scheduler's KV-cache manager over several groups sharing one pool."""

    def __init__(self, config: HybridConfig) -> None:
        for index, kv_spec in enumerate(config.kv_cache_specs):
            if isinstance(kv_spec, MambaSpec) and (config.enable_caching or kv_spec.mamba_cache_mode != "none"):
                raise ConfigError("KV-MAMBA-003", f"kv_cache_specs[{index}]",
                                  "Mamba allocation is specified only with prefix caching off and "
                                  "mamba_cache_mode='none' (KV-HLC-008); 'align' mode is not")
        if len(config.kv_cache_specs) == 1 and config.enable_caching and \
                config.kv_cache_specs[0].block_size != config.hash_block_size:
            raise ConfigError("KV-HYB-001", "hash_block_size",
                              "a model with one KV-cache group hashes at its block size "
                              f"{config.kv_cache_specs[0].block_size}, not {config.hash_block_size}")
        self.config = config
        self.coordinator = HybridCoordinator(config)
        self.pool = self.coordinator.pool
        self.groups = tuple(
            GroupTables(group_id, _lifecycle_kind(kv_spec), kv_spec.block_size, _window_or_chunk(kv_spec),
                        self.pool, self.coordinator,
                        eagle=config.use_eagle and kv_spec.kind != hybrid_spec.CHUNKED_LOCAL,
                        num_speculative_blocks=getattr(kv_spec, "num_speculative_blocks", 0))
            for group_id, kv_spec in enumerate(config.kv_cache_specs))

    @property
    def usage(self) -> float:
        return self.pool.usage()

    # -- lookup ----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> tuple[KVCacheBlocks, int]:
        """The longest prefix-cache hit of a waiting request, per group (KV-HYB-003)."""
        if not self.config.enable_caching or request.skip_reading_prefix_cache:
            return KVCacheBlocks(tuple(() for _ in self.groups)), 0  # KV-LIFE-002
        if max_cache_hit_length is None:
            max_cache_hit_length = lifecycle.max_cache_hit_length(request.num_tokens)
        require_non_negative("max_cache_hit_length", max_cache_hit_length)
        blocks, length, _ = self.coordinator.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)
        return KVCacheBlocks(tuple(tuple(g) for g in blocks)), length

    # -- allocation (KV-HLC-001) -----------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0
                       ) -> KVCacheBlocks | None:
        """Slots for the hit, the new tokens and the lookahead tokens, in every group."""
        for name, value in (("num_new_tokens", num_new_tokens),
                            ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens),
                            ("num_encoder_tokens", num_encoder_tokens)):
            require_non_negative(name, value)
        if lifecycle.allocation_is_empty(num_new_tokens, num_new_computed_tokens):
            raise ValueError("KV-LIFE-013: num_new_tokens must be > 0 when no computed "
                             "tokens are adopted")
        hits = new_computed_blocks.blocks if new_computed_blocks is not None and any(
            new_computed_blocks.blocks) else None
        computed = min(request.num_computed_tokens + num_new_computed_tokens, self.config.max_model_len)
        slots = lifecycle.num_slots(request.num_computed_tokens, num_new_computed_tokens, num_new_tokens,
                                    num_lookahead_tokens, self.config.max_model_len)
        for group in self.groups:  # KV-SWA-008: before the capacity check
            group.remove_skipped_blocks(request.request_id, computed)
        result = self._allocate(request, slots, computed, hits, num_encoder_tokens)
        if result is not None and not delay_cache_blocks and self.config.enable_caching:  # KV-LIFE-008
            self._cache(request, min(computed + num_new_tokens, request.num_tokens))
        return result

    def _needed(self, request_id: str, slots: int, computed: int,
                hits: tuple[Sequence[KVCacheBlock], ...] | None, num_encoder_tokens: int) -> int:
        """KV-HYB-012: the groups' needs summed (cross attention sized by the encoder)."""
        total = 0
        for index, group in enumerate(self.groups):
            if group.kind == spec.CROSS_ATTENTION:
                total += group.blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
            else:
                total += group.blocks_to_allocate(request_id, slots, hits[index] if hits else (), computed)
        return total

    @icontract.snapshot(lambda self: _state(self), name="state", enabled=ENABLED)
    @icontract.snapshot(lambda self, request, slots, computed, hits, num_encoder_tokens: (
        self._needed(request.request_id, slots, computed, hits, num_encoder_tokens),
        self.pool.num_free_blocks()), name="need", enabled=ENABLED)
    @icontract.ensure(lambda result, OLD: (result is None) == (OLD.need[0] > OLD.need[1]),
                      "KV-HYB-012: the allocation fails iff the summed need exceeds the free blocks",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, result, OLD: result is not None or _state(self) == OLD.state,
                      "KV-SWA-008/KV-LIFE-004: past the skipped blocks, a failed allocation changes nothing",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, result, OLD: result is None
                      or self.pool.num_free_blocks() == OLD.need[1] - OLD.need[0],
                      "KV-HLC-002: the allocation consumes exactly the summed need", enabled=ENABLED)
    def _allocate(self, request: Request, slots: int, computed: int,
                  hits: tuple[Sequence[KVCacheBlock], ...] | None, num_encoder_tokens: int
                  ) -> KVCacheBlocks | None:
        if self._needed(request.request_id, slots, computed, hits, num_encoder_tokens) > \
                self.pool.num_free_blocks():
            return None
        if hits is not None and not any(request.request_id in g.num_cached_block for g in self.groups):
            for group, group_hits in zip(self.groups, hits):  # every group before any allocates
                group.adopt_hit(request.request_id, group_hits, computed)
        return KVCacheBlocks(tuple(
            tuple(group.allocate_new_blocks(
                request.request_id, num_encoder_tokens if group.kind == spec.CROSS_ATTENTION else slots))
            for group in self.groups))

    @icontract.snapshot(lambda self, request: tuple(
        g.num_cached_block.get(request.request_id, 0) for g in self.groups), name="num_cached", enabled=ENABLED)
    @icontract.ensure(lambda self, request, OLD: _cached_as_specified(self, request, OLD),
                      "KV-HLC-005: every reachable committed block is cached under its key", enabled=ENABLED)
    def _cache(self, request: Request, num_tokens: int) -> None:
        for group in self.groups:
            if group.kind != spec.CROSS_ATTENTION:
                group.cache_blocks(request, num_tokens)

    # -- release ---------------------------------------------------------------------
    @icontract.ensure(lambda self, request: request.request_id not in self.requests(),
                      "KV-LIFE-009: free forgets the request", enabled=ENABLED)
    def free(self, request: Request) -> None:
        for group in self.groups:  # KV-HLC-004: group by group
            group.free(request.request_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        block_ids = list(block_ids)
        for block_id in block_ids:
            if not isinstance(block_id, int) or not 0 <= block_id < self.config.num_blocks:
                raise ValueError(f"KV-POOL-013: block id {block_id!r} is not in 0..{self.config.num_blocks - 1}")
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- queries ---------------------------------------------------------------------
    def requests(self) -> set[str]:
        """Requests holding at least one table entry in some group."""
        return {rid for group in self.groups for rid, table in group.req_to_blocks.items() if table}

    def get_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(b.block_id for b in group.req_to_blocks.get(request_id, ()))
                     for group in self.groups)

    def tables(self) -> tuple:
        return tuple(sorted((rid, self.get_block_ids(rid)) for rid in self.requests()))
