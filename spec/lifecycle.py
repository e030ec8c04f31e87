"""Chapter 4 -- Manager lifecycle (``KVCacheManager`` over one full-attention group).

The scheduler drives the manager through a request's life:

1. **Lookup.** A waiting request asks ``get_computed_blocks`` for its longest
   prefix-cache hit. The hit may cover at most ``num_tokens - 1`` tokens: when
   the whole prompt is cached the last token must still be computed, because
   its logits are needed to sample the next token. With caching off (or a
   request that must not read the cache) the hit is empty.
2. **Allocation.** ``allocate_slots(request, num_new_tokens,
   num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
   delay_cache_blocks)`` gives the request slots for everything computed so
   far, the hit, the new tokens and any lookahead (speculative) tokens --
   ``min(computed + hit + new + lookahead, max_model_len)`` tokens, that is
   ``cdiv(that, block_size)`` blocks. Blocks already held and hit blocks count
   towards it. A hit block with reference count 0 sits in the free queue, so
   touching it consumes a free block: such blocks are counted as blocks to
   allocate. If more blocks are needed than are free, the call returns
   ``None`` and changes nothing. Otherwise it touches the hit blocks, appends
   them to the request's block table, appends freshly allocated blocks, and
   caches every block that is now full -- but only up to
   ``min(computed + hit + new, num_tokens)`` tokens, so draft and lookahead
   tokens (which may be rejected) are never cached -- unless the caller asked
   to delay caching (a KV transfer still in flight).
3. **Progress.** The scheduler advances ``num_computed_tokens`` by the tokens
   it ran; decoding appends sampled tokens, extending the request's block
   hashes (chapter 1).
4. **Free.** A finished or preempted request's blocks are released in reverse
   order (KV-POOL-007); a preempted request starts over with a new lookup.

Block tables are append-only for full attention: once a block id is in a
request's table, it stays at that position until the request is freed.

``get_num_common_prefix_blocks`` once fed cascade attention: the number of
leading blocks of a running request that every request holding blocks
shares. vLLM 0.33.0 removed cascade attention and the method returns 0 for
every group; both behaviours are rules here, and an engine declares which it
implements.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import defines, rule

CHAPTER = "lifecycle"
MANAGER = "vllm/v1/core/kv_cache_manager.py"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"

KV_LIFE_001 = rule(
    "KV-LIFE-001",
    "A lookup hit covers at most num_tokens - 1 tokens",
    """get_computed_blocks bounds the hit by max_cache_hit_length, which defaults to
    num_tokens - 1 so the last token is always recomputed. (vLLM 0.33.0 returns a third
    value, the shared-prefix boundary, which is 0 for a single group; the seed returned
    two values.)""",
    source=f"{MANAGER} KVCacheManager.get_computed_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_002 = rule(
    "KV-LIFE-002",
    "No hit without prefix caching",
    "With prefix caching off, get_computed_blocks returns no blocks and 0 tokens.",
    source=f"{MANAGER} prefix_cache_lookup_enabled; kv_cache_coordinator.py "
    "KVCacheCoordinatorNoPrefixCache.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_003 = rule(
    "KV-LIFE-003",
    "Blocks to allocate",
    """allocate_slots needs max(cdiv(slots, block_size) - held - hit_blocks, 0) +
    evictable_hits blocks, where slots = min(computed + hit + new + lookahead,
    max_model_len) and evictable_hits counts the hit blocks with reference count 0. It
    succeeds iff that number is at most the number of free blocks.""",
    source=f"{MANAGER} allocate_slots; {STKV} SingleTypeKVCacheManager.get_num_blocks_to_allocate",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_004 = rule(
    "KV-LIFE-004",
    "A failed allocation changes nothing",
    """When allocate_slots returns None, the pool, the cache map, every block table and every
    reference count are as before the call (for full attention nothing is skipped, so
    nothing is freed either).""",
    source=f"{MANAGER} allocate_slots (\"Cannot allocate new blocks\" returns before any "
    "mutation)",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_005 = rule(
    "KV-LIFE-005",
    "A successful allocation: hits first, then new blocks",
    """After a successful allocate_slots the request's table is its previous table, then
    the hit blocks in order, then the newly allocated blocks, for a total of
    max(previous + hit blocks, cdiv(slots, block_size)) blocks; the call returns the
    newly allocated blocks.""",
    source=f"{MANAGER} allocate_slots; kv_cache_coordinator.py allocate_new_computed_blocks, "
    "allocate_new_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_006 = rule(
    "KV-LIFE-006",
    "Hits are touched before new blocks are allocated",
    """The hit blocks are touched (taken out of the free queue) before new blocks are
    popped, so an allocation never hands out one of its own request's hit blocks.""",
    source="vllm/v1/core/kv_cache_coordinator.py allocate_new_computed_blocks "
    "(two-phase, issue #33775)",
    chapter=CHAPTER,
    needs=("exact_block_ids",),
    judged_by=("manager",),
)
KV_LIFE_007 = rule(
    "KV-LIFE-007",
    "Only committed tokens are cached",
    """allocate_slots caches the request's blocks up to the first min(cache_tokens,
    hashed_tokens) // block_size, where cache_tokens = min(computed + hit + new,
    num_tokens): lookahead and draft tokens are never cached. Blocks already counted as
    cached -- hits, and blocks cached by an earlier call even if evict_blocks has since
    dropped their key -- are not cached again.""",
    source=f"{MANAGER} allocate_slots (num_tokens_to_cache); {STKV} cache_blocks",
    chapter=CHAPTER,
    needs=("cache_map",),
    judged_by=("manager",),
)
KV_LIFE_008 = rule(
    "KV-LIFE-008",
    "delay_cache_blocks caches nothing",
    "With delay_cache_blocks, allocate_slots allocates but caches no block.",
    source=f"{MANAGER} allocate_slots (P/D: delay caching blocks)",
    chapter=CHAPTER,
    needs=("delay_cache", "cache_map"),
    judged_by=("manager",),
)
KV_LIFE_009 = rule(
    "KV-LIFE-009",
    "free releases every block and forgets the request",
    """free(request) passes the request's table to free_blocks in reverse order and
    forgets the request; freeing a request that holds no blocks is a no-op.""",
    source=f"{STKV} SingleTypeKVCacheManager.free / pop_blocks_for_free",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_010 = rule(
    "KV-LIFE-010",
    "Common prefix blocks are always 0 in vLLM 0.33.0",
    """get_num_common_prefix_blocks returns 0 for every group: cascade attention was removed
    and the method is kept only for out-of-tree schedulers. The seed version counted
    shared leading blocks (KV-LIFE-011).""",
    source=f"{MANAGER} KVCacheManager.get_num_common_prefix_blocks (0.33.0)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("manager",),
)
KV_LIFE_011 = rule(
    "KV-LIFE-011",
    "Common prefix blocks (cascade attention)",
    """For an engine with cascade attention, the number of common prefix blocks is the
    length of the longest run of leading blocks of the running request whose reference
    count equals the number of requests holding blocks. With prefix caching off no block is
    shared, and the count is 0 in every group (the coordinator without prefix caching).""",
    source="seed 001/002 FullAttentionManager.get_num_common_prefix_blocks; "
           "seed 000 KVCacheCoordinatorNoPrefixCache.get_num_common_prefix_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_012 = rule(
    "KV-LIFE-012",
    "Caching off caches nothing",
    """With prefix caching off no block ever gets a cache key, and every freed block goes
    to the front of the free queue.""",
    source="vllm/v1/core/kv_cache_coordinator.py KVCacheCoordinatorNoPrefixCache; "
    "block_pool.py free_blocks",
    chapter=CHAPTER,
    needs=("caching_off", "cache_map"),
    judged_by=("manager",),
)
KV_LIFE_013 = rule(
    "KV-LIFE-013",
    "An allocation with nothing to compute or adopt is rejected",
    """allocate_slots raises ValueError when num_new_tokens is 0 and no computed tokens
    (prefix-cache hit or external) are adopted. (The seed rejected every
    num_new_tokens == 0; vLLM 0.33.0 allows it when hit tokens are adopted.)""",
    source=f"{MANAGER} allocate_slots (first statement)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("manager",),
)
KV_LIFE_014 = rule(
    "KV-LIFE-014",
    "Full-attention block tables are append-only",
    """While a request lives, every block id in its full-attention table stays at its
    position; tables only grow.""",
    source="vllm/v1/core/block_pool.py BlockHashToBlockMap NOTE #1",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_LIFE_015 = rule(
    "KV-LIFE-015",
    "Slots are capped at max_model_len",
    """A request never holds more than cdiv(max_model_len, block_size) blocks; lookahead
    slots beyond max_model_len are not allocated.""",
    source=f"{MANAGER} allocate_slots (num_tokens_need_slot = min(..., max_model_len))",
    chapter=CHAPTER,
    judged_by=("manager",),
)

KV_LIFE_016 = rule(
    "KV-LIFE-016",
    "Lookups, arrivals and token appends leave the pool alone",
    """get_computed_blocks, the arrival of a request and appending tokens to a request
    change no reference count, no block table, no cache key and not the free queue: only
    allocate_slots, free, evict_blocks and reset_prefix_cache do.""",
    source=f"{MANAGER} get_computed_blocks (a pure lookup; touch happens in allocate_slots)",
    chapter=CHAPTER,
    judged_by=("manager",),
)


@icontract.require(lambda num_tokens: num_tokens >= 1, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens: result == num_tokens - 1, enabled=ENABLED)
@defines(KV_LIFE_001)
def max_cache_hit_length(num_tokens: int) -> int:
    """The default bound of a lookup: the last token is always recomputed."""
    return num_tokens - 1


@icontract.require(lambda a, b: a >= 0 and b > 0, enabled=ENABLED)
@icontract.ensure(lambda result, a, b: (result - 1) * b < a <= result * b or (a == 0 == result), enabled=ENABLED)
def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


@icontract.require(lambda num_computed, num_new_computed, num_new, num_lookahead:
                   min(num_computed, num_new_computed, num_new, num_lookahead) >= 0, enabled=ENABLED)
@icontract.require(lambda max_model_len: max_model_len > 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_model_len: 0 <= result <= max_model_len, enabled=ENABLED)
@defines(KV_LIFE_003, KV_LIFE_015)
def num_slots(num_computed: int, num_new_computed: int, num_new: int, num_lookahead: int,
              max_model_len: int) -> int:
    """Token slots a request needs after this allocation."""
    return min(num_computed + num_new_computed + num_new + num_lookahead, max_model_len)


@icontract.require(lambda slots, block_size, num_held, num_hit_blocks, num_evictable_hits:
                   slots >= 0 and block_size > 0 and num_held >= 0
                   and 0 <= num_evictable_hits <= num_hit_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, num_evictable_hits: result >= num_evictable_hits, enabled=ENABLED)
@icontract.ensure(lambda result, slots, block_size, num_held, num_hit_blocks, num_evictable_hits:
                  result - num_evictable_hits + num_held + num_hit_blocks
                  >= cdiv(slots, block_size), enabled=ENABLED)
@defines(KV_LIFE_003)
def num_blocks_to_allocate(slots: int, block_size: int, num_held: int, num_hit_blocks: int,
                           num_evictable_hits: int) -> int:
    """Free blocks an allocation consumes: new blocks plus hit blocks taken off the queue."""
    return max(cdiv(slots, block_size) - num_held - num_hit_blocks, 0) + num_evictable_hits


@icontract.require(lambda num_computed, num_new_computed, num_new, num_tokens:
                   min(num_computed, num_new_computed, num_new, num_tokens) >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens: result <= num_tokens, enabled=ENABLED)
@defines(KV_LIFE_007)
def num_tokens_to_cache(num_computed: int, num_new_computed: int, num_new: int,
                        num_tokens: int) -> int:
    """Tokens whose blocks may be cached: never past the request's committed tokens."""
    return min(num_computed + num_new_computed + num_new, num_tokens)


@icontract.require(lambda tokens_to_cache, num_hashes, hash_block_size, block_size:
                   tokens_to_cache >= 0 and num_hashes >= 0 and hash_block_size > 0
                   and block_size > 0 and block_size % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, tokens_to_cache, block_size: result * block_size <= tokens_to_cache, enabled=ENABLED)
@defines(KV_LIFE_007)
def num_full_blocks_to_cache(tokens_to_cache: int, num_hashes: int, hash_block_size: int,
                             block_size: int) -> int:
    """How many leading blocks of the request are cached after an allocation."""
    return min(tokens_to_cache, num_hashes * hash_block_size) // block_size


@icontract.require(lambda num_requests_holding: num_requests_holding >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, ref_counts: 0 <= result <= len(ref_counts), enabled=ENABLED)
@icontract.ensure(lambda result, ref_counts, num_requests_holding:
                  all(c == num_requests_holding for c in ref_counts[:result]), enabled=ENABLED)
@defines(KV_LIFE_011)
def num_common_prefix_blocks(ref_counts: tuple[int, ...], num_requests_holding: int) -> int:
    """Leading blocks of a running request (their counts, in table order) shared by all."""
    run = 0
    while run < len(ref_counts) and ref_counts[run] == num_requests_holding:
        run += 1
    return run


@defines(KV_LIFE_013)
def allocation_is_empty(num_new_tokens: int, num_new_computed_tokens: int,
                        num_external_computed_tokens: int = 0) -> bool:
    """Whether an allocate_slots call has nothing to compute or adopt (and must be rejected)."""
    return num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0
