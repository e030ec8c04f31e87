"""Chapter 2 -- The block pool.

The block pool owns every physical KV block, numbered ``0 .. num_blocks - 1``.
Each block carries a reference count (how many request block tables hold it)
and, once it is full and cached, the cache key of its contents.

**The null block.** Block 0 is taken out of the pool when the pool is built
and never comes back. It is a placeholder for block-table positions that hold
no KV (tokens outside a sliding window, say). It is never in the free queue,
its reference count is not maintained, it is never hashed and never freed.

**The free queue** holds every non-null block whose reference count is 0, in
eviction order: the front is reused first. At start it is ``1, 2, ...,
num_blocks - 1``. Allocating ``n`` blocks pops the first ``n``; a popped block
that was cached loses its cache key (this is eviction). Freeing a list of
blocks decrements their counts; of those that reach 0, blocks without a cache
key go to the *front* of the queue (nothing can reuse them, so hand them out
first) and cached blocks go to the *back* (least recently used first), each
group in the order given. A request's blocks are freed in *reverse* order, so
that within one request the tail blocks -- the ones least likely to be shared --
are evicted first.

**Touching** a block (a prefix-cache hit) increments its count, taking it out
of the free queue if the count was 0. The null block is skipped.

**The cache map** goes from a cache key to the blocks cached under it. Blocks
are never de-duplicated: two requests that fill identical blocks
independently cache both, so that block tables stay append-only. A lookup
returns the first block cached under the key that is still cached.

Two maintenance operations complete the pool. ``evict_blocks`` removes given
blocks from the cache map without touching reference counts or queue order.
``reset_prefix_cache`` forgets every cache key, and only succeeds when every
non-null block is free.

``usage`` is the fraction of non-null blocks not in the free queue.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import defines, rule

CHAPTER = "block_pool"
POOL = "vllm/v1/core/block_pool.py"
UTILS = "vllm/v1/core/kv_cache_utils.py"

KV_POOL_001 = rule(
    "KV-POOL-001",
    "Block 0 is the null block and never enters the free queue",
    """At construction block 0 is popped from the free queue and marked null; it is
    never put back, so it is never handed out by an allocation.""",
    source=f"{POOL} BlockPool.__init__ (null_block = free_block_queue.popleft())",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_POOL_002 = rule(
    "KV-POOL-002",
    "The null block is immune",
    """The null block is never hashed or cached and never freed into the free queue: touch
    and free skip it. That its reference count stays 0 is KV-POOL-017.""",
    source=f"{POOL} BlockPool.touch, free_blocks, cache_full_blocks (skip is_null)",
    chapter=CHAPTER,
    needs=("free_queue",),
    judged_by=("manager",),
)
KV_POOL_003 = rule(
    "KV-POOL-003",
    "The initial free queue is 1..num_blocks-1",
    "A new pool's free queue holds blocks 1, 2, ..., num_blocks - 1 in that order.",
    source=f"{UTILS} FreeKVCacheBlockQueue.__init__",
    chapter=CHAPTER,
    needs=("exact_block_ids", "free_queue"),
    judged_by=("manager",),
)
KV_POOL_004 = rule(
    "KV-POOL-004",
    "Allocation pops from the front of the free queue",
    """Allocating n blocks returns the first n blocks of the free queue, in queue order,
    each with reference count 1. Asking for more blocks than are free is an error.""",
    source=f"{POOL} BlockPool.get_new_blocks; {UTILS} FreeKVCacheBlockQueue.popleft_n",
    chapter=CHAPTER,
    needs=("exact_block_ids",),
    judged_by=("manager",),
)
KV_POOL_005 = rule(
    "KV-POOL-005",
    "Allocating a cached block evicts its cache key",
    """When prefix caching is on, a block popped by an allocation loses its cache key:
    the key no longer maps to it and the block has no hash.""",
    source=f"{POOL} BlockPool.get_new_blocks / _maybe_evict_cached_block",
    chapter=CHAPTER,
    needs=("exact_block_ids", "cache_map"),
    judged_by=("manager",),
)
KV_POOL_006 = rule(
    "KV-POOL-006",
    "Freeing: unhashed blocks to the front, hashed blocks to the back",
    """free_blocks decrements each non-null block's count; the blocks that reach 0 are
    split, keeping the given order, into those without a cache key (or all of them when
    caching is off), prepended to the free queue, and those with one, appended.""",
    source=f"{POOL} BlockPool.free_blocks",
    chapter=CHAPTER,
    needs=("exact_block_ids", "free_queue"),
    judged_by=("manager",),
)
KV_POOL_007 = rule(
    "KV-POOL-007",
    "A request's blocks are freed in reverse order",
    """Freeing a request passes its block table to free_blocks tail first (leading null
    blocks dropped), so its tail blocks are evicted before its head blocks.""",
    source="vllm/v1/core/single_type_kv_cache_manager.py SingleTypeKVCacheManager.free",
    chapter=CHAPTER,
    needs=("exact_block_ids", "free_queue"),
    judged_by=("manager",),
)
KV_POOL_008 = rule(
    "KV-POOL-008",
    "Touch takes hit blocks out of the free queue",
    """Touching a block increments its count; a block whose count was 0 is removed from
    the free queue (the rest of the queue keeps its order). The null block is skipped.""",
    source=f"{POOL} BlockPool.touch",
    chapter=CHAPTER,
    needs=("free_queue", "ref_counts"),
    judged_by=("manager",),
)
KV_POOL_009 = rule(
    "KV-POOL-009",
    "No de-duplication; lookup returns the first cached block",
    """A cache key may map to several blocks (identical contents filled independently);
    caching never replaces an existing block. A lookup returns the earliest-cached block
    still under the key.""",
    source=f"{POOL} BlockHashToBlockMap (NOTE #1, get_one_block)",
    chapter=CHAPTER,
    needs=("exact_block_ids", "cache_map"),
    judged_by=("manager",),
)
KV_POOL_010 = rule(
    "KV-POOL-010",
    "A block is free iff its reference count is 0",
    """Every non-null block is in the free queue exactly when its reference count is 0;
    a referenced block is never handed out by an allocation.""",
    source=f"{POOL} BlockPool.get_new_blocks (assert ref_cnt == 0), touch, free_blocks",
    chapter=CHAPTER,
    needs=("free_queue", "ref_counts"),
    judged_by=("manager",),
)
KV_POOL_011 = rule(
    "KV-POOL-011",
    "Reference counts balance the block tables",
    """Each non-null block's reference count equals the number of times it appears in the
    block tables of live requests.""",
    source="vllm/v1/core/single_type_kv_cache_manager.py add_local_computed_blocks "
    "(touch paired with table append), free",
    chapter=CHAPTER,
    needs=("ref_counts",),
    judged_by=("manager",),
)
KV_POOL_012 = rule(
    "KV-POOL-012",
    "Free count and usage",
    """The number of free blocks is the length of the free queue; usage is
    1 - free / (num_blocks - 1).""",
    source=f"{POOL} BlockPool.get_num_free_blocks, get_usage",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_POOL_013 = rule(
    "KV-POOL-013",
    "evict_blocks drops cache keys only",
    """evict_blocks(ids) removes each listed block's cache key (if any); reference counts,
    block tables and the free queue are unchanged. Every id must be < num_blocks.""",
    source=f"{POOL} BlockPool.evict_blocks",
    chapter=CHAPTER,
    needs=("evict", "cache_map"),
    judged_by=("manager",),
)
KV_POOL_014 = rule(
    "KV-POOL-014",
    "reset_prefix_cache succeeds only on an idle pool",
    """reset_prefix_cache returns True and forgets every cache key iff every non-null
    block is free; otherwise it returns False and changes nothing.""",
    source=f"{POOL} BlockPool.reset_prefix_cache",
    chapter=CHAPTER,
    needs=("reset",),
    judged_by=("manager",),
)
KV_POOL_015 = rule(
    "KV-POOL-015",
    "The cache map and block hashes agree",
    """A block has cache key k iff the cache map lists it under k; a block is listed under
    at most one key (no partial-block entries in this chapter's scope); the null block is
    never listed.""",
    source=f"{POOL} _insert_block_hash, _remove_cached_block_hashes",
    chapter=CHAPTER,
    needs=("cache_map",),
    judged_by=("manager",),
)
KV_POOL_017 = rule(
    "KV-POOL-017",
    "The null block's reference count stays 0",
    """Nothing counts references to the null block: touch does not increment it for a null
    entry of a hit, free_blocks does not decrement it for a null entry of a table, so its
    count is 0 whatever the tables hold (split from KV-POOL-002, which keeps the null block
    out of the cache and the free queue).""",
    source=f"{POOL} BlockPool.touch, free_blocks (skip is_null)",
    chapter=CHAPTER,
    needs=("ref_counts",),
    judged_by=("manager",),
)
KV_POOL_016 = rule(
    "KV-POOL-016",
    "Freeing in append order: every released block to the back",
    """The refinement of KV-POOL-006 for an engine that declares the append free order
    (capability ``free_order="append"``): free_blocks decrements each non-null block's count
    and appends the blocks that reach 0 to the back of the free queue in the given order,
    hashed or not, caching on or off. vLLM did so before 0.24, which started reusing
    unhashed blocks first (last in, first out) for locality on the GPU.""",
    source=f"{POOL} BlockPool.free_blocks (vLLM 0.14-0.23: free_block_queue.append_n)",
    chapter=CHAPTER,
    needs=("exact_block_ids", "free_queue"),
    judged_by=("manager",),
)


@icontract.require(lambda queue, n: 0 <= n <= len(queue), enabled=ENABLED)
@icontract.ensure(lambda result, queue, n: result[0] + result[1] == queue and len(result[0]) == n, enabled=ENABLED)
@defines(KV_POOL_004)
def pop_front(queue: tuple[int, ...], n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Allocate ``n`` blocks: (the blocks handed out, the queue left behind)."""
    return queue[:n], queue[n:]


@icontract.require(lambda released, released_hashed: len(released) == len(released_hashed), enabled=ENABLED)
@icontract.ensure(lambda result, queue, released: len(result) == len(queue) + len(released), enabled=ENABLED)
@icontract.ensure(lambda result, queue, released, released_hashed:
                  result[:len(released) - sum(released_hashed)]
                  == tuple(b for b, h in zip(released, released_hashed) if not h), enabled=ENABLED)
@defines(KV_POOL_006)
def queue_after_release(
    queue: tuple[int, ...], released: tuple[int, ...], released_hashed: tuple[bool, ...]
) -> tuple[int, ...]:
    """The free queue after blocks whose count reached 0 are returned to it.

    ``released`` lists those blocks in the order they were freed; ``released_hashed``
    says which of them carry a cache key (all False when caching is off).
    """
    unhashed = tuple(b for b, h in zip(released, released_hashed) if not h)
    hashed = tuple(b for b, h in zip(released, released_hashed) if h)
    return unhashed + queue + hashed


@icontract.ensure(lambda result, queue, released: result == queue + released, enabled=ENABLED)
@defines(KV_POOL_016)
def queue_after_append(queue: tuple[int, ...], released: tuple[int, ...]) -> tuple[int, ...]:
    """The free queue after the blocks whose count reached 0 are returned to it in the
    append order: all of them at the back, in the order they were freed."""
    return queue + released


@icontract.ensure(lambda result, table: len(result) <= len(table), enabled=ENABLED)
@icontract.ensure(lambda result: 0 not in result, enabled=ENABLED)
@defines(KV_POOL_007)
def free_order(table: tuple[int, ...]) -> tuple[int, ...]:
    """The order a request's block table is handed to ``free_blocks``: tail first, nulls out."""
    return tuple(block_id for block_id in reversed(table) if block_id != 0)


@icontract.ensure(lambda result, touched: set(touched).isdisjoint(result), enabled=ENABLED)
@icontract.ensure(lambda result, queue: set(result) <= set(queue), enabled=ENABLED)
@defines(KV_POOL_008)
def queue_after_touch(queue: tuple[int, ...], touched: tuple[int, ...]) -> tuple[int, ...]:
    """The free queue after a hit touches ``touched``: those blocks leave it, order kept."""
    gone = set(touched)
    return tuple(b for b in queue if b not in gone)


@icontract.require(lambda ref_counts, in_free_queue: len(ref_counts) == len(in_free_queue), enabled=ENABLED)
@defines(KV_POOL_001, KV_POOL_010)
def free_iff_unreferenced(ref_counts: tuple[int, ...], in_free_queue: tuple[bool, ...]) -> bool:
    """Index 0 is the null block (never free); every other block is free iff its count is 0."""
    if not ref_counts:
        return True
    if in_free_queue[0]:
        return False
    return all((count == 0) == free for count, free in zip(ref_counts[1:], in_free_queue[1:]))


@defines(KV_POOL_017)
def null_count_untouched(ref_counts: tuple[int, ...]) -> bool:
    """The null block's (block 0's) reference count is 0; an empty pool has none to check."""
    return not ref_counts or ref_counts[0] == 0


@icontract.require(lambda ref_counts, table_occurrences: len(ref_counts) == len(table_occurrences), enabled=ENABLED)
@defines(KV_POOL_011)
def refcounts_balanced(ref_counts: tuple[int, ...], table_occurrences: tuple[int, ...]) -> bool:
    """Each non-null block's count equals its number of block-table occurrences (the null
    block's own count is KV-POOL-017's)."""
    return ref_counts[1:] == table_occurrences[1:]


@icontract.require(lambda num_blocks: num_blocks >= 2, enabled=ENABLED)
@icontract.require(lambda num_free, num_blocks: 0 <= num_free <= num_blocks - 1, enabled=ENABLED)
@icontract.ensure(lambda result: 0.0 <= result <= 1.0, enabled=ENABLED)
@defines(KV_POOL_012)
def usage(num_free: int, num_blocks: int) -> float:
    """Fraction of the non-null blocks that are not free."""
    return 1.0 - num_free / (num_blocks - 1)


@icontract.require(lambda num_blocks: num_blocks >= 2, enabled=ENABLED)
@defines(KV_POOL_014)
def can_reset_prefix_cache(num_free: int, num_blocks: int) -> bool:
    """A prefix-cache reset succeeds iff every non-null block is free."""
    return num_free == num_blocks - 1


@icontract.require(lambda cached_under_key: len(cached_under_key) > 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached_under_key: result == cached_under_key[0], enabled=ENABLED)
@defines(KV_POOL_009)
def lookup_block(cached_under_key: tuple[int, ...]) -> int:
    """Which block a lookup returns, given the blocks cached under a key in caching order."""
    return cached_under_key[0]
