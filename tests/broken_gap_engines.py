"""Deliberately broken engines, one per rule that moved off the gap list (spec/registry.py).

Each breaks exactly one rule the hybrid suites judge since the move, and the meta-tests
(tests/test_gap_rules.py) require the suite to charge that rule. The hybrid lookups are the
reference adapter over a coordinator that swaps in one broken piece -- one kind's finder,
its null entries, the single-pass stop, or how a spec group's groups share a lookup -- and
drops the reference's own postconditions, so that the suite's checks, not the reference's
contracts, must catch it (as tests/broken_hybrid_engines.py does). The lifecycle engine is
the reference lifecycle adapter over a manager that caches cross-attention blocks.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import attrs
from broken_loop import broken_fixed_point

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup
from kvoracle.reference import KVCacheManager
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator, SpecGroup
from kvoracle.spec import hybrid as spec
from kvoracle.spec import hybrid_lifecycle as lifecycle_spec
from kvoracle.spec import mamba, sliding_window


class _GapCoordinator(HybridCoordinator):
    """The reference coordinator, unchecked, with the pieces a broken variant replaces.

    ``fixed_point`` is the spec's loop (tests/broken_loop.py's copy) asking :meth:`finder`
    for each group's answer and stopping after one pass where :attr:`one_pass` and KV-HYB-005
    say so; :meth:`null_entries` says how many of a group's
    hit entries are the null block.
    """

    find_longest_cache_hit = inspect.unwrap(HybridCoordinator.find_longest_cache_hit)
    one_pass = True

    def finder(self, kind: str, cached: tuple[bool, ...], bound: int, size: int, param: int, drop: bool,
               alignment: int) -> int:
        return spec.group_hit_length(kind, cached, bound, size, param, drop, alignment)

    def null_entries(self, kind: str, num_blocks: int, bound: int, drop: bool, size: int, param: int) -> int:
        return spec.num_null_hit_blocks(kind, num_blocks, bound, drop, size, param)

    def fixed_point(self, groups, cached, max_cache_hit_length, num_hashed_tokens, alignment):
        return broken_fixed_point(groups, cached, max_cache_hit_length, num_hashed_tokens, alignment,
                                  finder=self.finder, one_pass=self.one_pass)

    def _hit_blocks(self, block_hashes: Sequence[bytes], flat: tuple[spec.SpecGroup, ...],
                    entries: Sequence[tuple[int, int, bool]]) -> tuple[list[KVCacheBlock], ...]:
        blocks: list[list[KVCacheBlock]] = [[] for _ in self.config.kv_cache_specs]
        for group, (kind, size, param, _), (num_blocks, bound, drop) in zip(self.spec_groups, flat, entries):
            nulls = self.null_entries(kind, num_blocks, bound, drop, size, param)
            for group_id in group.group_ids:
                blocks[group_id] = [self.entry(kind, block_hashes, size, group_id, j, j < nulls)
                                    for j in range(num_blocks)]
        return tuple(blocks)

    def entry(self, kind: str, block_hashes: Sequence[bytes], size: int, group_id: int, j: int,
              null: bool) -> KVCacheBlock:
        """Hit entry ``j`` of a group: the null block, or the block cached under its key (the
        null block where a broken finder answered a block that is not cached)."""
        if null:
            return self.pool.null_block
        block = self.pool._cached_block((self.view_hash(block_hashes, size, j), group_id))
        return self.pool.null_block if block is None else block


# -- KV-CHUNK-001: the chunk start of the last token within the bound -------------------------
class _ChunkOfLastToken(_GapCoordinator):
    """The chunked-local finder starts the current chunk at (max_length - 1) // chunk * chunk:
    the chunk of the last token within the bound, not the chunk the next token starts. At a
    bound on a chunk boundary it looks up (and reports) the previous chunk's blocks."""

    @staticmethod
    def _start(bound: int, size: int, chunk: int) -> int:
        return (bound - 1) // chunk * chunk // size if bound > 0 else 0

    def finder(self, kind, cached, bound, size, param, drop, alignment):
        if kind != spec.CHUNKED_LOCAL:
            return super().finder(kind, cached, bound, size, param, drop, alignment)
        blocks = self._start(bound, size, param)
        while blocks < bound // size and blocks < len(cached) and cached[blocks]:
            blocks += 1
        return blocks * size

    def null_entries(self, kind, num_blocks, bound, drop, size, param):
        if kind != spec.CHUNKED_LOCAL:
            return super().null_entries(kind, num_blocks, bound, drop, size, param)
        return min(self._start(bound, size, param), num_blocks)


class ChunkStartOfLastToken(ReferenceHybridLookup):
    name = "broken-chunk-start-of-last-token"
    coordinator_class = _ChunkOfLastToken


# -- KV-MAMBA-001: a Mamba state block off the alignment --------------------------------------
class _MambaAnyBlock(_GapCoordinator):
    """The Mamba finder takes the last cached block, whether or not its end is aligned."""

    def finder(self, kind, cached, bound, size, param, drop, alignment):
        if kind == spec.MAMBA:
            return mamba.hit_length(cached, bound, size, size)
        return super().finder(kind, cached, bound, size, param, drop, alignment)


class _NoPartialHitModels(ReferenceHybridLookup):
    """A lookup adapter that claims no fine-grained partial Mamba hits, so that no partial-hit model
    is drawn: these engines break KV-MAMBA-001 and KV-SWA-005, which partial-hit models judge as
    KV-MAMBA-020 (their Mamba group's finder), and their one-round seed-0 searches were measured on
    the draws without them (with them, seed 0 charged KV-MAMBA-020 / KV-HYB-002 first). That
    KV-MAMBA-020 is a true charge, not the suite mistaking a window's or a Mamba block's alignment
    for a partial-hit bug: :class:`_GapCoordinator` answers a fine-grained Mamba group per hash block,
    a null entry per hash block before the page instead of one per page (as
    tests/broken_hybrid_partial_engines.py's NullPerHashUnit does), whichever piece it breaks.
    tests/test_hybrid_partial.py judges the lookup on partial-hit models."""

    def capabilities(self) -> Capabilities:
        return attrs.evolve(super().capabilities(), mamba_partial_hits=False)


class MambaIgnoresAlignment(_NoPartialHitModels):
    name = "broken-mamba-ignores-alignment"
    coordinator_class = _MambaAnyBlock


# -- KV-SWA-002: cached blocks instead of nulls before the window's run -----------------------
class _WindowKeepsOldBlocks(_GapCoordinator):
    """A sliding-window hit keeps the cached blocks before its run, where the window no
    longer reaches, instead of putting the null block there."""

    def entry(self, kind, block_hashes, size, group_id, j, null):
        if kind == spec.SLIDING_WINDOW and null:
            block = self.pool._cached_block((self.view_hash(block_hashes, size, j), group_id))
            if block is not None:
                return block
        return super().entry(kind, block_hashes, size, group_id, j, null)


class SwaKeepsBlocksBeforeRun(ReferenceHybridLookup):
    name = "broken-swa-keeps-blocks-before-run"
    coordinator_class = _WindowKeepsOldBlocks


# -- KV-SWA-004: the EAGLE run of need + 1 blocks, not dropped --------------------------------
class _WindowKeepsPeek(_GapCoordinator):
    """With the EAGLE drop, the sliding-window finder needs cdiv(window - 1, b) + 1 blocks but
    then keeps the last one (the peek block) instead of dropping it."""

    def finder(self, kind, cached, bound, size, param, drop, alignment):
        if kind == spec.SLIDING_WINDOW and drop:
            # cdiv(window + b - 1, b) == cdiv(window - 1, b) + 1: the run EAGLE needs, no drop.
            return sliding_window.hit_length(cached, bound, size, param + size, False, alignment)
        return super().finder(kind, cached, bound, size, param, drop, alignment)

    def null_entries(self, kind, num_blocks, bound, drop, size, param):
        if kind == spec.SLIDING_WINDOW and drop:
            return spec.num_null_hit_blocks(kind, num_blocks, bound, False, size, param + size)
        return super().null_entries(kind, num_blocks, bound, drop, size, param)


class SwaEagleKeepsPeekBlock(ReferenceHybridLookup):
    name = "broken-swa-eagle-keeps-peek-block"
    coordinator_class = _WindowKeepsPeek


# -- KV-SWA-005: a sliding-window run may end anywhere ----------------------------------------
class _WindowUnaligned(_GapCoordinator):
    """The sliding-window finder ignores the alignment: a run may end on any block, and a
    short run from block 0 is not rounded down."""

    def finder(self, kind, cached, bound, size, param, drop, alignment):
        if kind == spec.SLIDING_WINDOW:
            return sliding_window.hit_length(cached, bound, size, param, drop, size)
        return super().finder(kind, cached, bound, size, param, drop, alignment)


class SwaIgnoresAlignment(_NoPartialHitModels):
    name = "broken-swa-ignores-alignment"
    coordinator_class = _WindowUnaligned


# -- KV-HYB-002: the groups of one spec group -------------------------------------------------
class _FirstMemberGetsHit(_GapCoordinator):
    """Only the first group of a spec group is handed the hit blocks; the other groups of the
    spec group report an empty hit."""

    def _hit_blocks(self, block_hashes, flat, entries):
        blocks = list(super()._hit_blocks(block_hashes, flat, entries))
        for group in self.spec_groups:
            for group_id in group.group_ids[1:]:
                blocks[group_id] = []
        return tuple(blocks)


class SpecGroupHitForFirstGroupOnly(ReferenceHybridLookup):
    name = "broken-spec-group-hit-for-first-group-only"
    coordinator_class = _FirstMemberGetsHit


class _FirstMemberDecides(_GapCoordinator):
    """A key hits when it is cached in the spec group's first group; the other groups are
    not consulted, and their hit entries are the first group's blocks."""

    def _cached_flags(self, block_hashes: Sequence[bytes], group: SpecGroup) -> tuple[bool, ...]:
        return super()._cached_flags(block_hashes, SpecGroup(group.kv_cache_spec, group.group_ids[:1], group.kind))

    def entry(self, kind, block_hashes, size, group_id, j, null):
        first = next(g.group_ids[0] for g in self.spec_groups if group_id in g.group_ids)
        return super().entry(kind, block_hashes, size, first, j, null)


class SpecGroupReadsFirstGroupOnly(ReferenceHybridLookup):
    name = "broken-spec-group-reads-first-group-only"
    coordinator_class = _FirstMemberDecides


# -- KV-HYB-005: no single-pass stop ----------------------------------------------------------
class _NoSinglePass(_GapCoordinator):
    """With one full-attention and one other spec group the loop does not stop after its first
    pass: it runs on to its fixed point, looking the other group up again."""

    one_pass = False


class NoSinglePassStop(ReferenceHybridLookup):
    name = "broken-no-single-pass-stop"
    coordinator_class = _NoSinglePass


# -- KV-CROSS-002: cross-attention blocks cached ----------------------------------------------
class _CachesCrossBlocks(KVCacheManager):
    """Caches each cross-attention group's full blocks under the prompt's keys after every
    allocation, as if encoder KV could be shared between requests (prefix caching stays off
    for every other group)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.pool.enable_caching = True  # the pool may hold keys; only cross blocks get them

    def allocate_slots(self, request, *args, **kwargs):
        result = super().allocate_slots(request, *args, **kwargs)
        if result is not None:
            for group in self.groups:
                if group.kind != lifecycle_spec.CROSS_ATTENTION:
                    continue
                table = group.req_to_blocks.get(request.request_id, [])
                hashed = len(request.block_hashes) * request.hash_block_size // group.block_size
                pairs = [(table[i], (self.coordinator.view_hash(request.block_hashes, group.block_size, i),
                                     group.group_id))
                         for i in range(min(len(table), hashed)) if table[i].cache_key is None]
                if pairs:
                    self.pool.cache_blocks(pairs)
        return result


class CachesCrossAttentionBlocks(ReferenceEngine):
    name = "broken-caches-cross-attention-blocks"

    def make_manager(self, config: HybridConfig) -> KVCacheManager:  # type: ignore[override]
        return _CachesCrossBlocks(config)


#: Broken engine -> (suite, the rule that suite must charge it with).
EXPECTED = {
    "ChunkStartOfLastToken": ("hybrid", "KV-CHUNK-001"),
    "MambaIgnoresAlignment": ("hybrid", "KV-MAMBA-001"),
    "SwaKeepsBlocksBeforeRun": ("hybrid", "KV-SWA-002"),
    "SwaEagleKeepsPeekBlock": ("hybrid", "KV-SWA-004"),
    "SwaIgnoresAlignment": ("hybrid", "KV-SWA-005"),
    "SpecGroupHitForFirstGroupOnly": ("hybrid", "KV-HYB-002"),
    "SpecGroupReadsFirstGroupOnly": ("hybrid", "KV-HYB-002"),
    "NoSinglePassStop": ("hybrid", "KV-HYB-005"),
    "CachesCrossAttentionBlocks": ("manager", "KV-CROSS-002"),
}
