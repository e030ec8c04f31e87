"""Deliberately broken engines: each re-creates one plausible bug in a KV-cache manager.

The meta-tests run the conformance suite against each and require it to fail
with the named rule. Each engine is the reference adapter with exactly one
behaviour replaced; ``EXPECTED`` maps the engine to the rule that must fail.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence

import attrs

from kvoracle.conformance.adapter import Lookup, Observation
from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.reference import BlockPool, HybridCoordinator, KVCacheManager, SingleTypeManager
from kvoracle.reference.block import KVCacheBlock
from kvoracle.spec import hybrid_lifecycle as lifecycle_spec


class _Broken(ReferenceEngine):
    """The reference adapter over a manager with one broken piece: its single-type managers
    (``group_class``), its lookups (``coordinator_class``) or its block pool (``pool_class``)."""

    group_class: type[SingleTypeManager] = SingleTypeManager
    coordinator_class: type[HybridCoordinator] = HybridCoordinator
    pool_class: type[BlockPool] | None = None

    def make_manager(self, config) -> KVCacheManager:
        manager_class = type("BrokenManager", (KVCacheManager,), {
            "group_class": self.group_class, "coordinator_class": self.coordinator_class})
        manager = manager_class(config)
        if self.pool_class is not None:  # the pool is still empty: swap it everywhere it is held
            pool = self.pool_class(config.num_blocks, config.enable_caching)
            manager.pool = manager.coordinator.pool = pool
            for group in manager.groups:
                group.pool = pool
        return manager


# The coordinator's lookup without its own postconditions: the suite, not the reference's
# contracts, must catch what a broken lookup answers.
_LOOKUP = inspect.unwrap(HybridCoordinator.find_longest_cache_hit)


# -- 1. frees a request's blocks head first --------------------------------------------------
class _ForwardFreeManager(SingleTypeManager):
    def free(self, request_id: str) -> None:
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.pool.free_blocks([b for b in table if not b.is_null])  # bug: not reversed


class ForwardFree(_Broken):
    name = "broken-forward-free"
    group_class = _ForwardFreeManager


# -- 2. forgets that touching a free hit consumes a free block -------------------------------
class _NoEvictableHitsManager(SingleTypeManager):
    def blocks_to_allocate(self, request_id: str, num_tokens: int, hits: Sequence[KVCacheBlock],
                           num_computed_tokens: int) -> int:
        return lifecycle_spec.group_blocks_to_allocate(  # bug: no hit is counted as evictable
            self.slots(num_tokens), self.block_size, len(self.req_to_blocks.get(request_id, ())),
            tuple(False for _ in hits), self.skipped_tokens(num_computed_tokens),
            request_id in self.num_cached_block)


class ForgetsEvictableHits(_Broken):
    name = "broken-forgets-evictable-hits"
    group_class = _NoEvictableHitsManager


# -- 3. the hit is one block short ----------------------------------------------------------
class _ShortHitCoordinator(HybridCoordinator):
    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        blocks, hit, uncached = _LOOKUP(self, block_hashes, max_cache_hit_length)
        if not blocks[0]:
            return blocks, hit, uncached
        size = self.config.kv_cache_specs[0].block_size
        return (blocks[0][:-1], *blocks[1:]), hit - size, uncached  # bug: off by one block


class HitOneBlockShort(_Broken):
    name = "broken-hit-one-block-short"
    coordinator_class = _ShortHitCoordinator


# -- 4. the lookup bound is off by one block ------------------------------------------------
class _PastBoundCoordinator(HybridCoordinator):
    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        size = self.config.kv_cache_specs[0].block_size
        return _LOOKUP(self, block_hashes, max_cache_hit_length + size)  # bug: one block past


class HitPastBound(_Broken):
    name = "broken-hit-past-bound"
    coordinator_class = _PastBoundCoordinator


# -- 5. touch leaves free hits in the free queue (a referenced block can be evicted) ---------
class _TouchKeepsFreePool(BlockPool):
    def touch(self, blocks) -> None:
        for block in blocks:
            if not block.is_null:
                block.ref_cnt += 1  # bug: a ref-count-0 hit stays in the free queue


class TouchLeavesHitsFree(_Broken):
    name = "broken-touch-leaves-hits-free"
    pool_class = _TouchKeepsFreePool


# -- 6. caches blocks although the caller asked to delay caching ----------------------------
class IgnoresDelayCache(ReferenceEngine):
    name = "broken-ignores-delay-cache"

    def allocate(self, request_id, num_new_tokens, num_new_computed_tokens,
                 num_lookahead_tokens=0, delay_cache_blocks=False):
        return super().allocate(request_id, num_new_tokens, num_new_computed_tokens,
                                num_lookahead_tokens, delay_cache_blocks=False)  # bug


# -- 7. hashed blocks are prepended like unhashed ones (cached prefixes evicted first) -------
class _PrependAllPool(BlockPool):
    def free_blocks(self, blocks) -> None:
        released = []
        for block in blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        self.free_queue.prepend_n(released)  # bug: hashed blocks too


class PrependsHashedBlocks(_Broken):
    name = "broken-prepends-hashed-blocks"
    pool_class = _PrependAllPool


# -- 8. an engine that hangs, and one that raises -------------------------------------------
class HangsOnEvict(ReferenceEngine):
    """Never returns from evict: the suite must report an engine error and go on."""

    name = "broken-hangs-on-evict"

    def evict(self, block_ids) -> None:
        time.sleep(3600)


class RaisesOnReset(ReferenceEngine):
    name = "broken-raises-on-reset"

    def reset_prefix_cache(self) -> bool:
        raise RuntimeError("reset is not implemented")


#: Engine class name -> the rule the suite must report as failing (or erroring).
EXPECTED = {
    "ForwardFree": "KV-POOL-007",
    "ForgetsEvictableHits": "KV-LIFE-003",
    "HitOneBlockShort": "KV-FULL-001",
    "HitPastBound": "KV-LIFE-001",
    "TouchLeavesHitsFree": "KV-POOL-008",
    "IgnoresDelayCache": "KV-LIFE-008",
    "PrependsHashedBlocks": "KV-POOL-006",
    "HangsOnEvict": "KV-POOL-013",
    "RaisesOnReset": "KV-POOL-014",
}


# -- not broken: a correct engine that numbers its blocks differently ------------------------
class RelabelledBlocks(ReferenceEngine):
    """The reference with every block id but 0 relabelled (reversed).

    It claims only semantic correctness (``exact_block_ids=False``), so the suite must
    pass it and report the id- and order-dependent rules as not applicable.
    """

    name = "relabelled-blocks"

    def capabilities(self):
        return attrs.evolve(super().capabilities(), exact_block_ids=False)

    def _out(self, block_id: int) -> int:
        assert self.config is not None
        return 0 if block_id == 0 else self.config.num_blocks - block_id

    _in = _out  # the relabelling is its own inverse

    def lookup(self, request_id, max_cache_hit_length=None):
        hit = super().lookup(request_id, max_cache_hit_length)
        return Lookup(tuple(tuple(map(self._out, g)) for g in hit.block_ids), hit.num_tokens)

    def allocate(self, *args, **kwargs):
        result = super().allocate(*args, **kwargs)
        return None if result is None else tuple(tuple(map(self._out, g)) for g in result)

    def evict(self, block_ids) -> None:
        super().evict([self._in(b) for b in block_ids])

    def observe(self) -> Observation:
        seen = super().observe()
        counts = seen.ref_counts
        return attrs.evolve(
            seen,
            block_tables={rid: tuple(tuple(map(self._out, g)) for g in groups)
                          for rid, groups in seen.block_tables.items()},
            free_queue=tuple(map(self._out, seen.free_queue)),
            ref_counts=tuple(counts[self._in(i)] for i in range(len(counts))),
            cached={key: tuple(map(self._out, blocks)) for key, blocks in seen.cached.items()})
