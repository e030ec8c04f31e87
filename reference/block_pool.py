"""The reference block pool (spec chapter ``block_pool``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import icontract

from kvoracle.spec import block_pool as spec

from .block import CacheKey, KVCacheBlock
from .contracts import ENABLED
from .free_queue import FreeBlockQueue


def _free_iff_unreferenced(pool: BlockPool) -> bool:
    in_queue = [False] * pool.num_blocks
    for block in pool.free_queue:
        in_queue[block.block_id] = True
    return spec.free_iff_unreferenced(pool._ref_counts(), tuple(in_queue))


def _cache_map_consistent(pool: BlockPool) -> bool:
    listed: dict[int, CacheKey] = {}
    for key, blocks in pool.cached.items():
        if not blocks:
            return False
        for block_id, block in blocks.items():
            if block.block_id != block_id or block.cache_key != key or block_id in listed:
                return False
            listed[block_id] = key
    return all(
        (block.cache_key is None) == (block.block_id not in listed) for block in pool.blocks
    ) and 0 not in listed


def is_unhashed(pool: BlockPool, block: KVCacheBlock) -> bool:
    """KV-POOL-006: whether ``block``, released to count 0, counts as unhashed (no cache key and
    no partial entry, or caching off), the kind the unhashed-first order puts at the front."""
    return (block.cache_key is None and block.partial_key is None) or not pool.enable_caching


def _is_first_cached(pool: BlockPool, key: CacheKey, block: KVCacheBlock | None) -> bool:
    """KV-POOL-009: a lookup of ``key`` returning ``block`` returns the first block cached."""
    return block is None or block.block_id == spec.lookup_block(tuple(pool.cached[key]))


def _can_cache(pool: BlockPool, block: KVCacheBlock) -> bool:
    """KV-POOL-002/KV-POOL-015: only a non-null uncached block is cached (caching on)."""
    return pool.enable_caching and not block.is_null and block.cache_key is None


def _can_cache_all(pool: BlockPool, pairs: Sequence[tuple[KVCacheBlock, CacheKey]]) -> bool:
    """:func:`_can_cache` for each block of a batch, as if cached one after the other.

    A block listed twice would be cached already at its second occurrence.
    """
    return (all(_can_cache(pool, block) for block, _ in pairs)
            and len({id(block) for block, _ in pairs}) == len(pairs))


def _cached_after_batch(under_key: dict[CacheKey, tuple[int, ...]],
                        pairs: Sequence[tuple[KVCacheBlock, CacheKey]]
                        ) -> dict[CacheKey, tuple[int, ...]]:
    """KV-POOL-009 over a batch: each key's blocks, old ones first, then the batch's in order."""
    expected = {key: list(block_ids) for key, block_ids in under_key.items()}
    for block, key in pairs:
        expected[key].append(block.block_id)
    return {key: tuple(block_ids) for key, block_ids in expected.items()}


def _released_in_order(pool: BlockPool, blocks: Sequence[KVCacheBlock]
                       ) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """The blocks a free_blocks call returns to the queue, and which carry a key."""
    remaining = {block.block_id: block.ref_cnt for block in blocks}
    released: list[int] = []
    hashed: list[bool] = []
    for block in blocks:
        if block.is_null:
            continue
        remaining[block.block_id] -= 1
        if remaining[block.block_id] == 0:
            released.append(block.block_id)
            hashed.append(pool.enable_caching and (block.cache_key is not None or block.partial_key is not None))
    return tuple(released), tuple(hashed)


@icontract.invariant(lambda self: self.null_block.block_id == 0 and self.null_block.is_null
                     and spec.null_count_untouched((self.null_block.ref_cnt,)) and self.null_block.cache_key is None,
                     "KV-POOL-001/KV-POOL-002/KV-POOL-017: block 0 is the null block, never counted or hashed",
                     enabled=ENABLED)
@icontract.invariant(lambda self: _free_iff_unreferenced(self),
                     "KV-POOL-010: a non-null block is in the free queue iff its ref count is 0",
                     enabled=ENABLED)
@icontract.invariant(lambda self: _cache_map_consistent(self),
                     "KV-POOL-015: the cache map and the blocks' cache keys agree",
                     enabled=ENABLED)
@icontract.invariant(lambda self: self.enable_caching or not self.cached,
                     "KV-LIFE-012: with caching off nothing is cached", enabled=ENABLED)
class BlockPool:
    """Every physical block, the free queue and the cache map."""

    @icontract.require(lambda num_blocks: num_blocks >= 2,
                       "KV-CFG-001: num_blocks must be >= 2", enabled=ENABLED)
    @icontract.ensure(lambda self: self.free_queue.block_ids()
                      == tuple(range(1, self.num_blocks)),
                      "KV-POOL-003: the initial free queue is 1..num_blocks-1", enabled=ENABLED)
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        # KV-POOL-001: block 0 never enters the free queue.
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        #: The free order: unhashed blocks to the front (KV-POOL-006), or, when False, every
        #: released block to the back (the append order of KV-POOL-016).
        self.unhashed_first = True
        # Cache key -> {block id: block}, in caching order (KV-POOL-009: no de-dup).
        self.cached: dict[CacheKey, dict[int, KVCacheBlock]] = {}

    # -- observation -----------------------------------------------------------------
    def ref_counts(self) -> tuple[int, ...]:
        return self._ref_counts()

    def _ref_counts(self) -> tuple[int, ...]:
        """``ref_counts`` without the class-invariant checks icontract puts around it.

        For contract conditions (here and in the managers): reading the counts
        changes nothing, so checking the O(num_blocks) invariants around it only
        costs time.
        """
        return tuple(block.ref_cnt for block in self.blocks)

    def num_free_blocks(self) -> int:
        """KV-POOL-012."""
        return len(self.free_queue)

    def usage(self) -> float:
        """KV-POOL-012."""
        return spec.usage(len(self.free_queue), self.num_blocks)

    # -- lookup ----------------------------------------------------------------------
    @icontract.ensure(lambda self, key, result: _is_first_cached(self, key, result),
                      "KV-POOL-009: a lookup returns the first block cached under the key",
                      enabled=ENABLED)
    def get_cached_block(self, key: CacheKey) -> KVCacheBlock | None:
        return self._cached_block(key)

    def _cached_block(self, key: CacheKey) -> KVCacheBlock | None:
        """The lookup itself, for the managers' per-block lookups and their contracts.

        Non-public, so icontract does not check the class invariants around each call
        (a lookup changes nothing); callers check KV-POOL-009 with
        :func:`_is_first_cached` where they rely on it.
        """
        blocks = self.cached.get(key)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    # -- allocation ------------------------------------------------------------------
    @icontract.require(lambda self, n: 0 <= n <= len(self.free_queue),
                       "KV-POOL-004: cannot allocate more blocks than are free", enabled=ENABLED)
    @icontract.snapshot(lambda self: self.free_queue.block_ids(), name="queue", enabled=ENABLED)
    @icontract.ensure(lambda self, n, result, OLD: tuple(b.block_id for b in result)
                      == spec.pop_front(OLD.queue, n)[0],
                      "KV-POOL-004: allocation pops the front of the free queue", enabled=ENABLED)
    @icontract.ensure(lambda result: all(b.ref_cnt == 1 and b.cache_key is None for b in result),
                      "KV-POOL-005: allocated blocks have count 1 and no cache key",
                      enabled=ENABLED)
    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        blocks = self.free_queue.popleft_n(n)
        for block in blocks:
            if block.cache_key is not None:
                self._evict(block)  # KV-POOL-005
            block.partial_key = None
            block.ref_cnt += 1
        return blocks

    # -- touch -----------------------------------------------------------------------
    @icontract.snapshot(lambda self, blocks: (self.free_queue.block_ids(), tuple(
        b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null)),
        name="before", enabled=ENABLED)
    @icontract.ensure(lambda self, OLD: self.free_queue.block_ids()
                      == spec.queue_after_touch(OLD.before[0], OLD.before[1]),
                      "KV-POOL-008: touch takes ref-count-0 hits out of the free queue",
                      enabled=ENABLED)
    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue  # KV-POOL-002, KV-POOL-017
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    # -- free ------------------------------------------------------------------------
    @icontract.require(lambda blocks: all(b.is_null or b.ref_cnt > 0 for b in blocks),
                       "KV-POOL-011: only referenced blocks can be freed", enabled=ENABLED)
    @icontract.snapshot(lambda self, blocks: (self.free_queue.block_ids(),
                                              _released_in_order(self, blocks)),
                        name="before", enabled=ENABLED)
    @icontract.ensure(lambda self, OLD: not self.unhashed_first or self.free_queue.block_ids()
                      == spec.queue_after_release(OLD.before[0], *OLD.before[1]),
                      "KV-POOL-006: unhashed blocks are prepended, hashed blocks appended",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, OLD: self.unhashed_first or self.free_queue.block_ids()
                      == spec.queue_after_append(OLD.before[0], OLD.before[1][0]),
                      "KV-POOL-016: in the append order every released block is appended",
                      enabled=ENABLED)
    def free_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Release one reference to each block, in eviction-priority order."""
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in blocks:
            if block.is_null:
                continue  # KV-POOL-002, KV-POOL-017
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if is_unhashed(self, block) and self.unhashed_first:  # else the append order (KV-POOL-016)
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_queue.prepend_n(evict_first)
        self.free_queue.append_n(evict_last)

    # -- caching ---------------------------------------------------------------------
    @icontract.require(lambda self, block: _can_cache(self, block),
                       "KV-POOL-002/KV-POOL-015: only a non-null uncached block is cached",
                       enabled=ENABLED)
    @icontract.snapshot(lambda self, key: tuple(self.cached.get(key, ())), name="under_key",
                        enabled=ENABLED)
    @icontract.ensure(lambda self, key, block, OLD: tuple(self.cached[key])
                      == (*OLD.under_key, block.block_id),
                      "KV-POOL-009: caching appends, never replaces", enabled=ENABLED)
    def cache_block(self, block: KVCacheBlock, key: CacheKey) -> None:
        self._cache(block, key)

    @icontract.require(lambda self, pairs: _can_cache_all(self, pairs),
                       "KV-POOL-002/KV-POOL-015: only a non-null uncached block is cached",
                       enabled=ENABLED)
    @icontract.snapshot(lambda self, pairs: {key: tuple(self.cached.get(key, ()))
                                             for _, key in pairs},
                        name="under_key", enabled=ENABLED)
    @icontract.ensure(lambda self, pairs, OLD: all(
        tuple(self.cached.get(key, ())) == block_ids
        for key, block_ids in _cached_after_batch(OLD.under_key, pairs).items()),
        "KV-POOL-009: caching appends, never replaces", enabled=ENABLED)
    def cache_blocks(self, pairs: Sequence[tuple[KVCacheBlock, CacheKey]]) -> None:
        """``cache_block(block, key)`` for each pair, in order, as one pool operation.

        The class invariants are checked once around the batch instead of around
        every block.
        """
        for block, key in pairs:
            self._cache(block, key)

    @icontract.ensure(lambda block, key: block.is_null or block.cache_key is not None or block.partial_key == key,
                      "KV-HLC-006: a block not cached whole carries the partial entry", enabled=ENABLED)
    def register_partial(self, block: KVCacheBlock, key: CacheKey) -> None:
        """KV-HLC-006: a partial tail entry for a block not cached whole (else ignored)."""
        if not block.is_null and block.cache_key is None:
            block.partial_key = key

    @icontract.require(lambda self, block: self.enable_caching and not block.is_null,
                       "KV-POOL-002: the null block is never cached", enabled=ENABLED)
    @icontract.snapshot(lambda self, block, key: (block.cache_key, tuple(self.cached.get(key, ()))),
                        name="before", enabled=ENABLED)
    @icontract.ensure(lambda self, block, key, OLD: block.cache_key == key and tuple(self.cached[key])
                      == (*(b for b in OLD.before[1] if b != block.block_id), block.block_id)
                      and (OLD.before[0] in (None, key) or block.block_id not in self.cached.get(OLD.before[0], {})),
                      "KV-MAMBA-011: a re-keyed page loses its old key and is listed last under the new one",
                      enabled=ENABLED)
    def rekey(self, block: KVCacheBlock, key: CacheKey) -> None:
        """Cache ``block`` under ``key`` in place of any key it carries (a Mamba state page
        whose contents now stand for another prefix, KV-MAMBA-011)."""
        if block.cache_key is not None:
            self._evict(block)
        self._cache(block, key)

    @icontract.require(lambda self, source, copy: self.enable_caching and not source.is_null
                       and not copy.is_null and copy.cache_key is None and source is not copy,
                       "KV-MAMBA-024: the copy is a fresh page", enabled=ENABLED)
    @icontract.snapshot(lambda self, source: (source.cache_key, tuple(self.cached.get(source.cache_key, ()))
                                              if source.cache_key is not None else ()),
                        name="before", enabled=ENABLED)
    @icontract.ensure(lambda self, source, copy, OLD: source.cache_key is None and copy.cache_key == OLD.before[0]
                      and (OLD.before[0] is None or tuple(self.cached[OLD.before[0]]) == (
                          *(b for b in OLD.before[1] if b != source.block_id), copy.block_id)),
                      "KV-MAMBA-024: the key moves to the copy, listed last under it", enabled=ENABLED)
    def move_key(self, source: KVCacheBlock, copy: KVCacheBlock) -> None:
        """Re-point ``source``'s cache entry to ``copy`` (a producer keeps writing ``source``,
        and the cache keeps the state in the copy instead, KV-MAMBA-024)."""
        key = source.cache_key
        if key is None:
            return
        self._evict(source)
        self._cache(copy, key)

    def _cache(self, block: KVCacheBlock, key: CacheKey) -> None:
        block.partial_key = None  # a partial entry is promoted to the whole block's key
        block.cache_key = key
        self.cached.setdefault(key, {})[block.block_id] = block

    def _evict(self, block: KVCacheBlock) -> None:
        key = block.cache_key
        assert key is not None
        under_key = self.cached[key]
        del under_key[block.block_id]
        if not under_key:
            del self.cached[key]
        block.cache_key = None

    @icontract.require(lambda self, block_ids: all(0 <= b < self.num_blocks for b in block_ids),
                       "KV-POOL-013: evicted block ids must be < num_blocks", enabled=ENABLED)
    @icontract.snapshot(lambda self: (self.free_queue.block_ids(), self.ref_counts()),
                        name="before", enabled=ENABLED)
    @icontract.ensure(lambda self, block_ids, OLD:
                      (self.free_queue.block_ids(), self.ref_counts()) == OLD.before
                      and all(self.blocks[b].cache_key is None for b in block_ids),
                      "KV-POOL-013: evict_blocks drops cache keys only", enabled=ENABLED)
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            block = self.blocks[block_id]
            block.partial_key = None
            if block.cache_key is not None:
                self._evict(block)

    @icontract.snapshot(lambda self: len(self.free_queue), name="num_free", enabled=ENABLED)
    @icontract.ensure(lambda self, result, OLD: result == spec.can_reset_prefix_cache(
        OLD.num_free, self.num_blocks),
        "KV-POOL-014: reset succeeds iff every non-null block is free", enabled=ENABLED)
    @icontract.ensure(lambda self, result: not result or not self.cached,
                      "KV-POOL-014: a successful reset forgets every cache key", enabled=ENABLED)
    def reset_prefix_cache(self) -> bool:
        if not spec.can_reset_prefix_cache(len(self.free_queue), self.num_blocks):
            return False
        for blocks in self.cached.values():
            for block in blocks.values():
                block.cache_key = None
        for block in self.blocks:
            block.partial_key = None
        self.cached = {}
        return True
