"""The reference ``KVCacheManager`` (spec chapters ``lifecycle`` and ``hybrid_lifecycle``).

One manager serves every model, as in vLLM, where one ``KVCacheManager`` holds whichever
coordinator the model needs. Its KV-cache groups share one block pool; each group's block
tables are a :class:`~.single_type.SingleTypeManager`, and lookups go through the
coordinator (:class:`~.hybrid.HybridCoordinator`), which answers a model of one group with
that group's own finder, as vLLM's unitary coordinator does (KV-HYB-014), and several
groups with the hybrid fixed point. A model of one full-attention group -- the common case,
:class:`~.config.ManagerConfig` -- is the unitary case of the same manager: one group,
hashed at its block size.

The order of one allocation is KV-HLC-001's: drop skipped blocks in every group, check the
summed need, adopt every group's hit, allocate group by group, cache. A Mamba group runs in
vLLM's "none" mode with prefix caching off (KV-HLC-008) and in its "align" mode with caching
on (chapter 8, KV-MAMBA-004 to KV-MAMBA-017); a mode that contradicts the caching switch is
rejected (KV-MAMBA-003).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import attrs
import icontract

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec.config import ConfigError, require_non_negative

from .block import KVCacheBlock
from .config import ManagerConfig
from .contracts import ENABLED
from .hybrid import HybridConfig, HybridCoordinator, _window_or_chunk
from .kv_cache_spec import FullAttentionSpec, MambaSpec, SinkFullAttentionSpec
from .request import Request
from .single_type import SingleTypeManager


@attrs.frozen
class KVCacheBlocks:
    """An allocation result or a hit: ``blocks[g]`` lists group ``g``'s blocks."""

    blocks: tuple[tuple[KVCacheBlock, ...], ...]

    def get_block_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(b.block_id for b in group) for group in self.blocks)


def groups_config(config: ManagerConfig | HybridConfig) -> HybridConfig:
    """The configuration as KV-cache groups: a :class:`ManagerConfig` is one full-attention group."""
    if isinstance(config, HybridConfig):
        return config
    return HybridConfig((FullAttentionSpec(config.block_size),), config.num_blocks, config.max_model_len,
                        config.hash_block_size, config.use_eagle, config.enable_caching)


def _kind(kv_spec: object) -> str:
    if isinstance(kv_spec, SinkFullAttentionSpec):
        return hybrid_spec.FULL
    return kv_spec.kind  # type: ignore[attr-defined, no-any-return]


def group_kinds(config: ManagerConfig | HybridConfig) -> tuple[str, ...]:
    """The attention kind of each KV-cache group, as the lifecycle chapter names them."""
    return tuple(_kind(kv_spec) for kv_spec in groups_config(config).kv_cache_specs)


def _mamba_settings(kv_spec: object) -> dict[str, object]:
    """A Mamba group's cache mode and checkpoint settings (chapter 8), for its group's manager."""
    if not isinstance(kv_spec, MambaSpec):
        return {}
    return {"mamba_cache_mode": kv_spec.mamba_cache_mode,
            "num_prefill_checkpoint_blocks": kv_spec.num_prefill_checkpoint_blocks,
            "prefill_checkpoint_alignment": kv_spec.prefill_checkpoint_alignment or 0}


# -- contracts -------------------------------------------------------------------------------
def _refcounts_balanced(manager: KVCacheManager) -> bool:
    """KV-POOL-011, with KV-MAMBA-025: both pages of a queued copy hold one reference more."""
    occurrences = Counter(b.block_id for group in manager.groups for table in group.req_to_blocks.values()
                          for b in table if not b.is_null)
    occurrences.update(b.block_id for group in manager.groups for pair in group.pending_copies for b in pair)
    pool = manager.pool
    # The pool's non-public reader: a public call would re-check the pool's invariants.
    return pool_spec.refcounts_balanced(
        pool._ref_counts(), tuple(occurrences.get(i, 0) for i in range(pool.num_blocks)))


def _copies_released(manager: KVCacheManager, refs_before: tuple[int, ...], copies: tuple) -> bool:
    """KV-MAMBA-025: each block's count fell by the number of taken copies it was a page of."""
    pages = Counter(block_id for source, copy in copies for block_id in {source.block_id, copy.block_id})
    refs_after = manager.pool._ref_counts()
    return all(refs_after[b] == refs_before[b] - pages[b] for b in range(manager.pool.num_blocks))


def _nulls_placed(manager: KVCacheManager) -> bool:
    """KV-HYB-013 for every table but an align-mode Mamba one."""
    return all(spec.table_nulls_ok(group.kind, tuple(b.is_null for b in table))
               for group in manager.groups if not group.align for table in group.req_to_blocks.values())


def _align_tables_end_in_pages(manager: KVCacheManager) -> bool:
    """KV-MAMBA-013: an align-mode Mamba table has nulls anywhere, but not at its end."""
    return all(mamba_spec.align_table_ok(tuple(b.is_null for b in table), group.num_speculative_blocks)
               for group in manager.groups if group.align for table in group.req_to_blocks.values())


def _state(manager: KVCacheManager) -> tuple:
    """Everything observable about a manager, for before/after comparisons."""
    pool = manager.pool
    return (pool.free_queue.block_ids(), pool._ref_counts(),
            tuple((key, tuple(blocks)) for key, blocks in pool.cached.items()),
            manager.tables())


def _hit_is_valid(manager: KVCacheManager, bound: int, result: tuple[KVCacheBlocks, int]) -> bool:
    """Within the bound, aligned, and each group holding the entries that cover it."""
    blocks, length = result
    sizes = [s.block_size for s in manager.config.kv_cache_specs]
    alignment = sizes[0] if len(sizes) == 1 else manager.config.hit_alignment
    full_groups_cover = all(len(group) == lifecycle.cdiv(length, size)
                            for group, size, g in zip(blocks.blocks, sizes, manager.groups)
                            if g.kind == hybrid_spec.FULL)
    return 0 <= length <= max(bound, 0) and length % alignment == 0 and full_groups_cover


def _grown_by(manager: KVCacheManager, request_id: str, old: tuple, hits: KVCacheBlocks | None,
              result: KVCacheBlocks) -> bool:
    """KV-LIFE-005/KV-LIFE-014: a full-attention table is the old table, then the adopted hit,
    then the new blocks (windowed tables also turn skipped blocks into nulls)."""
    new = manager.get_block_ids(request_id)
    adopted = hits.get_block_ids() if hits is not None else tuple(() for _ in manager.groups)
    return all(new[g] == old[g] + (adopted[g] if not old[g] else ()) + result.get_block_ids()[g]
               for g, group in enumerate(manager.groups) if group.kind == hybrid_spec.FULL)


def _within_model_length(manager: KVCacheManager, request_id: str) -> bool:
    """KV-LIFE-015: no attention group holds more blocks than max_model_len tokens need."""
    return all(len(group.req_to_blocks.get(request_id, ())) <= lifecycle.cdiv(
        manager.config.max_model_len, group.block_size)
        for group in manager.groups
        if group.kind in (hybrid_spec.FULL, hybrid_spec.SLIDING_WINDOW, hybrid_spec.CHUNKED_LOCAL))


def _cached_as_specified(manager: KVCacheManager, request: Request, OLD: object) -> bool:
    """KV-LIFE-007 / KV-HLC-005: each group's newly committed blocks carry their keys
    (KV-MAMBA-011: an align-mode checkpoint page the key of its checkpoint)."""
    for group, before in zip(manager.groups, OLD.num_cached):  # type: ignore[attr-defined]
        after = group.num_cached_block.get(request.request_id, 0)
        table = group.req_to_blocks.get(request.request_id, [])
        position, checkpoint = group.checkpoints.get(request.request_id, (0, -1))
        if position > len(request.block_hashes) * request.hash_block_size:
            position = 0  # KV-MAMBA-017: past the committed tokens, not keyed
        keeps = not group.fine or mamba_spec.checkpoint_keeps_key(
            position or request.hash_block_size, request.num_prompt_tokens, request.hash_block_size, group.block_size,
            manager.config.use_eagle)
        if position and 0 <= checkpoint < len(table) and not table[checkpoint].is_null and table[checkpoint].cache_key \
                != ((request.block_hashes[position // request.hash_block_size - 1], group.group_id) if keeps else None):
            return False  # KV-MAMBA-011, KV-MAMBA-021: keyed at its position, or no key inside a block
        for i in spec.blocks_to_cache(group.kind, group.param, before, after, group.block_size, group.cache_alignment,
                                      group.eagle, tuple(b.is_null for b in table)):
            if position and i == checkpoint:
                continue
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
@icontract.invariant(lambda self: _align_tables_end_in_pages(self),
                     "KV-MAMBA-013: an align-mode Mamba table ends with its running and speculative pages",
                     enabled=ENABLED)
class KVCacheManager:
    """The KV-cache manager a scheduler talks to, over one or several KV-cache groups.

    ``coordinator_class`` answers the lookups and ``group_class`` holds each group's tables:
    a variant (a broken engine of the meta-tests) subclasses the manager and replaces them.
    """

    coordinator_class: type[HybridCoordinator] = HybridCoordinator
    group_class: type[SingleTypeManager] = SingleTypeManager

    def __init__(self, config: ManagerConfig | HybridConfig) -> None:
        config = groups_config(config)
        for index, kv_spec in enumerate(config.kv_cache_specs):
            mode = "align" if config.enable_caching else "none"
            if isinstance(kv_spec, MambaSpec) and kv_spec.mamba_cache_mode != mode:
                raise ConfigError(mamba_spec.KV_MAMBA_003, f"kv_cache_specs[{index}].mamba_cache_mode",
                                  f"with prefix caching {'on' if config.enable_caching else 'off'} a Mamba group "
                                  f"runs in {mode!r} mode (vLLM derives it from enable_prefix_caching), "
                                  f"not {kv_spec.mamba_cache_mode!r}")
        if len(config.kv_cache_specs) == 1 and config.enable_caching and \
                config.kv_cache_specs[0].block_size != config.hash_block_size:
            raise ConfigError("KV-HYB-001", "hash_block_size",
                              "a model with one KV-cache group hashes at its block size "
                              f"{config.kv_cache_specs[0].block_size}, not {config.hash_block_size}")
        self.config = config
        self.coordinator = self.coordinator_class(config)
        self.pool = self.coordinator.pool
        self.groups = tuple(
            self.group_class(group_id, _kind(kv_spec), kv_spec.block_size, _window_or_chunk(kv_spec),
                             self.pool, self.coordinator,
                             eagle=config.use_eagle and kv_spec.kind != hybrid_spec.CHUNKED_LOCAL,
                             num_speculative_blocks=getattr(kv_spec, "num_speculative_blocks", 0),
                             **_mamba_settings(kv_spec))
            for group_id, kv_spec in enumerate(config.kv_cache_specs))

    @property
    def usage(self) -> float:
        return self.pool.usage()

    # -- lookup ----------------------------------------------------------------------
    @icontract.ensure(lambda self, request, max_cache_hit_length, result: _hit_is_valid(
        self, lifecycle.max_cache_hit_length(request.num_tokens) if max_cache_hit_length is None
        else max_cache_hit_length, result),
        "KV-LIFE-001/KV-FULL-004: the hit is aligned, within max_cache_hit_length, and every "
        "full-attention group holds the blocks that cover it", enabled=ENABLED)
    @icontract.ensure(lambda self, result: self.config.enable_caching or result[1] == 0,
                      "KV-LIFE-002: no hit without prefix caching", enabled=ENABLED)
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
    @icontract.snapshot(lambda self, request: self.get_block_ids(request.request_id), name="table",
                        enabled=ENABLED)
    @icontract.ensure(lambda self, request, new_computed_blocks, result, OLD: result is None or _grown_by(
        self, request.request_id, OLD.table, new_computed_blocks, result),
        "KV-LIFE-005/KV-LIFE-014: a full-attention table = old table + hits + new blocks", enabled=ENABLED)
    @icontract.ensure(lambda self, request, result: result is None or _within_model_length(
        self, request.request_id), "KV-LIFE-015: no more blocks than max_model_len needs", enabled=ENABLED)
    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0
                       ) -> KVCacheBlocks | None:
        """Slots for the hit, the new tokens and the lookahead tokens, in every group.

        ``num_encoder_tokens`` sizes a cross-attention group (KV-CROSS-001); a model without
        one must be given 0.
        """
        for name, value in (("num_new_tokens", num_new_tokens),
                            ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens),
                            ("num_encoder_tokens", num_encoder_tokens)):
            require_non_negative(name, value)
        if num_encoder_tokens and not any(g.kind == spec.CROSS_ATTENTION for g in self.groups):
            raise ValueError("KV-CROSS-001: num_encoder_tokens needs a cross-attention group; "
                             f"this model has none (got {num_encoder_tokens})")
        if lifecycle.allocation_is_empty(num_new_tokens, num_new_computed_tokens):
            raise ValueError("KV-LIFE-013: num_new_tokens must be > 0 when no computed "
                             "tokens are adopted")
        hits = new_computed_blocks.blocks if new_computed_blocks is not None and any(
            new_computed_blocks.blocks) else None
        if hits is not None and self.is_tracked(request.request_id):
            raise ValueError("a running request cannot adopt new prefix-cache hits")
        computed = min(request.num_computed_tokens + num_new_computed_tokens, self.config.max_model_len)
        slots = lifecycle.num_slots(request.num_computed_tokens, num_new_computed_tokens, num_new_tokens,
                                    num_lookahead_tokens, self.config.max_model_len)
        # Main tokens (no look-ahead): what an align-mode Mamba group allocates for (KV-MAMBA-004).
        main_tokens = computed + num_new_tokens
        for group in self.groups:  # KV-SWA-008: before the capacity check
            group.remove_skipped_blocks(request.request_id, computed)
        result = self._allocate(request, slots, computed, hits, num_encoder_tokens, main_tokens)
        if result is not None and not delay_cache_blocks and self.config.enable_caching:  # KV-LIFE-008
            self._cache(request, lifecycle.num_tokens_to_cache(
                request.num_computed_tokens, num_new_computed_tokens, num_new_tokens, request.num_tokens))
        return result

    def num_blocks_to_allocate(self, request_id: str, slots: int, computed: int,
                               hits: tuple[Sequence[KVCacheBlock], ...] | None, num_encoder_tokens: int = 0,
                               main_tokens: int | None = None) -> int:
        """KV-LIFE-003 / KV-HYB-012: the free blocks an allocation consumes, the groups' needs
        summed (a cross-attention group sized by the encoder, an align-mode Mamba group by the
        ``main_tokens``, slots without look-ahead)."""
        total = 0
        for index, group in enumerate(self.groups):
            if group.kind == spec.CROSS_ATTENTION:
                total += group.blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
            elif group.align:
                total += group.blocks_to_allocate(request_id, slots, hits[index] if hits else (), computed,
                                                  main_tokens=main_tokens)
            else:
                total += group.blocks_to_allocate(request_id, slots, hits[index] if hits else (), computed)
        return total

    @icontract.snapshot(lambda self: _state(self), name="state", enabled=ENABLED)
    @icontract.snapshot(lambda self, request, slots, computed, hits, num_encoder_tokens, main_tokens: (
        self.num_blocks_to_allocate(request.request_id, slots, computed, hits, num_encoder_tokens, main_tokens),
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
                  hits: tuple[Sequence[KVCacheBlock], ...] | None, num_encoder_tokens: int, main_tokens: int
                  ) -> KVCacheBlocks | None:
        if self.num_blocks_to_allocate(request.request_id, slots, computed, hits, num_encoder_tokens,
                                       main_tokens) > self.pool.num_free_blocks():
            return None  # KV-LIFE-003 / KV-LIFE-004
        for group in self.groups:  # KV-MAMBA-006: decided on the table the need saw, before any hit
            if group.align:
                group.plan_checkpoint(request.request_id, computed, main_tokens)
        if hits is not None:
            for group, group_hits in zip(self.groups, hits):  # every group before any allocates
                group.adopt_hit(request.request_id, group_hits, computed)
        return KVCacheBlocks(tuple(
            tuple(group.allocate_new_blocks(request.request_id, slots, main_tokens=main_tokens) if group.align
                  else group.allocate_new_blocks(
                      request.request_id, num_encoder_tokens if group.kind == spec.CROSS_ATTENTION else slots))
            for group in self.groups))

    @icontract.snapshot(lambda self, request: tuple(
        g.num_cached_block.get(request.request_id, 0) for g in self.groups), name="num_cached", enabled=ENABLED)
    @icontract.ensure(lambda self, request, OLD: _cached_as_specified(self, request, OLD),
                      "KV-LIFE-007/KV-HLC-005/KV-SWA-012: every reachable committed block is cached under its key",
                      enabled=ENABLED)
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

    def new_step_starts(self) -> None:
        """The scheduler begins a step (KV-MAMBA-009): states cached in earlier steps are hits now."""
        for group in self.groups:
            group.new_step_starts()

    @icontract.snapshot(lambda self: tuple(pair for group in self.groups for pair in group.pending_copies),
                        name="pending", enabled=ENABLED)
    @icontract.snapshot(lambda self: self.pool._ref_counts(), name="refs", enabled=ENABLED)
    @icontract.ensure(lambda self, result, OLD: result == [(s.block_id, c.block_id) for s, c in OLD.pending]
                      and not any(group.pending_copies for group in self.groups),
                      "KV-MAMBA-023/KV-MAMBA-024: every queued copy, in order, once", enabled=ENABLED)
    @icontract.ensure(lambda self, OLD: _copies_released(self, OLD.refs, OLD.pending),
        "KV-MAMBA-025: once taken, both pages of each copy lose the reference that held them", enabled=ENABLED)
    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """The copies the allocations queued since the last call, as (source, copy) block ids in
        the order the runner makes them (KV-MAMBA-023, KV-MAMBA-024), and, as vLLM's scheduler does
        with the pages ``take_kv_cache_block_copies`` hands it (without deferred frees), the
        reference that held both pages of each released (KV-MAMBA-025)."""
        copies = [pair for group in self.groups for pair in group.take_copies()]
        self.pool.free_blocks([block for pair in copies for block in pair])
        return [(source.block_id, copy.block_id) for source, copy in copies]

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        block_ids = list(block_ids)
        for block_id in block_ids:
            if not isinstance(block_id, int) or not 0 <= block_id < self.config.num_blocks:
                raise ValueError(f"KV-POOL-013: block id {block_id!r} is not in 0..{self.config.num_blocks - 1}")
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- queries ---------------------------------------------------------------------
    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """KV-LIFE-010: vLLM 0.33.0 removed cascade attention; always 0 per group."""
        return [0 for _ in self.groups]

    def get_num_common_prefix_blocks_cascade(self, request_id: str) -> list[int]:
        """KV-LIFE-011: the seed's cascade-attention count, per group (0 with caching off)."""
        if not self.config.enable_caching:
            return [0 for _ in self.groups]
        return [group.num_common_prefix_blocks(request_id) for group in self.groups]

    def is_tracked(self, request_id: str) -> bool:
        """Whether the request adopted its hit or cached a block already (a running request)."""
        return any(request_id in group.num_cached_block for group in self.groups)

    def requests(self) -> set[str]:
        """Requests holding at least one table entry in some group."""
        return {rid for group in self.groups for rid, table in group.req_to_blocks.items() if table}

    def get_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(b.block_id for b in group.req_to_blocks.get(request_id, ()))
                     for group in self.groups)

    def tables(self) -> tuple:
        return tuple(sorted((rid, self.get_block_ids(rid)) for rid in self.requests()))
