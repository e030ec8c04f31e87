"""Chapter 11 -- The hybrid lifecycle: allocating, caching and freeing across groups.

Chapter 4 follows one request through one full-attention group. A hybrid model
runs the same lifecycle over several groups that share one block pool; this
chapter says what changes when some groups attend to a window (sliding window,
chunked local attention) and some to a fixed encoder input (cross attention).

**One allocation, every group** (KV-HLC-001). ``allocate_slots`` works in this
order: each group first drops the blocks its window no longer reaches
(KV-SWA-007) -- before the capacity check, so a failed allocation may still
have freed them (KV-SWA-008); then the groups' needs are summed (KV-HYB-012)
and compared with the free blocks; then every group adopts its share of the
prefix-cache hit before any group takes a new block (as KV-LIFE-006 demands
for one group); then the groups take their new blocks in group order; then
each group caches what it may.

**A group's need** (KV-HLC-002). A group the request already holds blocks in
(one it has cached in, or adopted a hit in) needs ``cdiv(slots, block_size)``
minus what it holds. A group seen for the first time also counts the window:
its first ``skipped_tokens // block_size`` positions will be the null block,
so they need no block, and hit blocks among them are not taken off the free
queue.

**Adopting a hit** (KV-HLC-003). A new request's table in a windowed group is
``skipped`` null blocks, then the hit blocks past them. When the window has
moved past the whole hit the table is longer than the hit: all nulls.

**Caching** (KV-HLC-005). A group caches its full blocks up to the tokens it
may cache (KV-HYB-010, the aligned prefix plus an EAGLE group's peek block),
skipping null blocks and, in a sliding-window group, blocks no aligned hit could
read (KV-SWA-011).

**Freeing** (KV-HLC-004). ``free`` releases the groups one after another in
group order, each group's table tail first, without its leading nulls: the
last group's head block becomes the free queue's tail, the most recently
used end.

**Null blocks in tables** (KV-HYB-013). A full-attention or cross-attention
table never holds the null block; a windowed table holds it only as a prefix.

**Mamba without prefix caching** (KV-HLC-008). A Mamba group in vLLM's "none"
mode is allocated like a windowed group whose window is the last computed
token: the state of every earlier token is skipped, so its blocks are freed and
become nulls, and the need counts ``num_speculative_blocks`` blocks more for
speculative decoding. With a block size of at least the model length that is
one state block per request (plus the speculative ones). With prefix caching on
vLLM uses its "align" mode, chapter 8's (KV-MAMBA-004 to KV-MAMBA-017): state pages
at positions of a table whose other entries are null, freed and cached by rules of
their own, and a need that ignores the window of KV-HLC-002.

Two behaviours of vLLM 0.33.0 are outside what kvoracle specifies and are
named: a full-attention group whose block size exceeds the hash block size
also registers a *partial* tail entry (KV-HLC-006), and cross-attention groups
only work with prefix caching off (KV-HLC-007).
"""

from __future__ import annotations

import icontract

from . import lifecycle
from .contracts import ENABLED
from .hybrid import CHUNKED_LOCAL, FULL, MAMBA, SLIDING_WINDOW
from .lifecycle import cdiv
from .registry import INPUT_VALIDATION, defines, rule
from .sliding_window import block_is_reachable

CHAPTER = "hybrid_lifecycle"
MGR = "vllm/v1/core/kv_cache_manager.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"

#: Cross attention: a group sized by the encoder input (KV-CROSS-001), never cached.
CROSS_ATTENTION = "cross_attention"
#: Kinds a hybrid lifecycle may hold (Mamba without prefix caching as KV-HLC-008 says; with
#: it, in "align" mode, its table, need and caching follow chapter 8, KV-MAMBA-004 on).
LIFECYCLE_KINDS = (FULL, SLIDING_WINDOW, CHUNKED_LOCAL, CROSS_ATTENTION, MAMBA)
#: Kinds whose tables hold nulls for tokens outside the attention window.
WINDOWED_KINDS = (SLIDING_WINDOW, CHUNKED_LOCAL, MAMBA)
#: Windowed kinds whose window is a parameter (a Mamba group's is always one token).
SIZED_WINDOW_KINDS = (SLIDING_WINDOW, CHUNKED_LOCAL)

KV_HLC_001 = rule(
    "KV-HLC-001",
    "A hybrid allocation: free skipped, check the sum, adopt all hits, then allocate",
    """allocate_slots removes every group's skipped blocks at the request's computed tokens,
    then fails (returns None) iff the groups' summed need exceeds the free blocks; otherwise
    every group adopts its hit blocks before any group takes a new block, the groups take
    their new blocks in group order, and then each group caches its blocks.""",
    source=f"{MGR} KVCacheManager.allocate_slots; {COORD} allocate_new_computed_blocks (two phases)",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_002 = rule(
    "KV-HLC-002",
    "A group's need counts its window only for a request it does not track yet",
    """For a request the group tracks (it has cached for it or adopted a hit), the need is
    max(cdiv(slots, block_size) - held, 0). Otherwise it is max(cdiv(slots, block_size) -
    max(skipped // block_size, held + hits), 0) plus the hit blocks past the skipped ones that
    sit in the free queue (ref count 0, not null).""",
    source=f"{STKV} SingleTypeKVCacheManager.get_num_blocks_to_allocate",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_003 = rule(
    "KV-HLC-003",
    "An adopted hit is padded with nulls for the skipped positions",
    """A new request's table in a group is the null block for each of the first
    skipped // block_size positions, followed by the hit blocks after them; only those
    are touched, and the group then tracks the request with all of them counted as cached.""",
    source=f"{STKV} SingleTypeKVCacheManager.add_local_computed_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_004 = rule(
    "KV-HLC-004",
    "A hybrid request is freed group by group, each table tail first",
    """free releases each group's table in group order, one pool release per group, each
    table reversed and without its leading null blocks (the pool then orders each release
    by KV-POOL-006).""",
    source=f"{COORD} KVCacheCoordinator.free; {STKV} SingleTypeKVCacheManager.pop_blocks_for_free",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_005 = rule(
    "KV-HLC-005",
    "A group caches its reachable, non-null full blocks",
    """After an allocation a group has cached, under its keys, every block from its first
    uncached one up to min(cacheable tokens, hashed tokens) // block_size, except null
    blocks and, in a sliding-window group, blocks no aligned hit can read (KV-SWA-011). With
    one group the alignment is the block size, so a sliding-window group caches every full
    block -- except with window 1 and no EAGLE, where no hit can read any block.""",
    source=f"{STKV} SingleTypeKVCacheManager.cache_blocks; {COORD} KVCacheCoordinator.cache_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_006 = rule(
    "KV-HLC-006",
    "vLLM also registers a partial tail entry that whole-block lookups never read",
    """A full-attention group whose block size exceeds the hash block size also registers,
    after caching, the block holding the prompt's last hash boundary (the prompt with EAGLE,
    one token less without, in whole hash blocks) under that boundary's hash, when the
    boundary lies inside a block, within the tokens cached, and in the table. Whole-block
    lookups never read such an entry, so hits are unaffected; but a block with only a
    partial entry counts as cached when freed (appended to the free queue, KV-POOL-006),
    until it is reused or cached whole. kvoracle specifies that effect and not the entries
    themselves: the vLLM adapter leaves them out of the cache map it reports.""",
    source=f"{STKV} FullAttentionManager.cache_blocks / _cache_partial_tail_block",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_008 = rule(
    "KV-HLC-008",
    "Without prefix caching a Mamba group keeps the last computed token's state",
    """With prefix caching off (vLLM's "none" mode) a Mamba group skips every computed token
    but the last (skipped tokens = computed - 1): those blocks are freed right to left and
    replaced by the null block as in a sliding-window group (KV-SWA-007), and the group's
    need and allocation cover num_speculative_blocks * block_size slots beyond the request's
    own. Nothing is cached.""",
    source=f"{STKV} MambaManager.get_num_skipped_tokens / get_num_blocks_to_allocate / allocate_new_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HLC_007 = rule(
    "KV-HLC-007",
    "Cross-attention groups require prefix caching off",
    """vLLM 0.33.0's cross-attention manager refuses to cache (it raises), so a configuration
    with a cross-attention group and prefix caching on is rejected.""",
    source=f"{STKV} CrossAttentionManager.cache_blocks",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)

KV_HLC_009 = rule(
    "KV-HLC-009",
    "A Mamba group may free its skipped blocks as if its drafts were rejected",
    """The refinement of KV-HLC-008 for an engine that declares it (capability
    ``mamba_free_lag``): before a Mamba group without prefix caching frees its skipped
    blocks, it takes num_speculative_blocks off the computed tokens (never below 0), as if
    that many draft tokens were rejected, so each block is freed that many tokens later;
    the count of blocks an allocation needs still reads the skipped tokens of the computed
    tokens themselves (KV-HLC-002). Everything else is KV-HLC-008. vLLM 0.17 to 0.25 did so
    on purpose under asynchronous scheduling; 0.26 frees at the tokens it has processed.""",
    source=f"{STKV} MambaManager.remove_skipped_blocks (vLLM 0.17-0.25: num_computed_tokens - "
           "num_speculative_blocks)",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)


def _kind_ok(kind: str) -> bool:
    return kind in LIFECYCLE_KINDS


@icontract.require(lambda kind: _kind_ok(kind), enabled=ENABLED)
@icontract.require(lambda kind, param: param > 0 or kind not in SIZED_WINDOW_KINDS, enabled=ENABLED)
@icontract.require(lambda num_computed_tokens: num_computed_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens: 0 <= result <= num_computed_tokens, enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind in WINDOWED_KINDS or result == 0, enabled=ENABLED)
@icontract.ensure(lambda result, kind, num_computed_tokens: kind != MAMBA or result == num_computed_tokens
                  - min(num_computed_tokens, 1), "a Mamba group keeps one token's state", enabled=ENABLED)
@defines(KV_HLC_002, KV_HLC_008)
def skipped_tokens(kind: str, param: int, num_computed_tokens: int) -> int:
    """Tokens before every future window of a group (KV-SWA-006, KV-CHUNK-002, KV-HLC-008)."""
    if kind == SLIDING_WINDOW:
        return max(0, num_computed_tokens - param + 1)
    if kind == CHUNKED_LOCAL:
        return num_computed_tokens // param * param
    if kind == MAMBA:
        return max(0, num_computed_tokens - 1)
    return 0


@icontract.require(lambda num_computed_tokens, num_speculative_blocks:
                   num_computed_tokens >= 0 and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens: 0 <= result <= num_computed_tokens,
                  "KV-HLC-009: a lagging group frees at no more than the computed tokens", enabled=ENABLED)
@defines(KV_HLC_009)
def lagging_mamba_tokens(num_computed_tokens: int, num_speculative_blocks: int) -> int:
    """The computed tokens a lagging Mamba group frees its skipped blocks at (KV-HLC-009)."""
    return max(0, num_computed_tokens - num_speculative_blocks)


@icontract.require(lambda slots, block_size, num_speculative_blocks:
                   slots >= 0 and block_size > 0 and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, slots: result >= slots, enabled=ENABLED)
@icontract.ensure(lambda result, slots, block_size, num_speculative_blocks:
                  cdiv(result, block_size) == cdiv(slots, block_size) + num_speculative_blocks,
                  "exactly num_speculative_blocks more blocks", enabled=ENABLED)
@defines(KV_HLC_008)
def mamba_slots(slots: int, block_size: int, num_speculative_blocks: int) -> int:
    """The slots a Mamba group without prefix caching allocates for ``slots`` tokens."""
    return slots + block_size * num_speculative_blocks


@icontract.require(lambda slots, block_size, num_held, num_skipped_tokens:
                   slots >= 0 and block_size > 0 and num_held >= 0 and num_skipped_tokens >= 0,
                   enabled=ENABLED)
@icontract.require(lambda tracked, hit_evictable: not (tracked and hit_evictable),
                   "a tracked request adopts no new hit", enabled=ENABLED)
@icontract.ensure(lambda result: result >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, slots, block_size, num_held, hit_evictable, num_skipped_tokens, tracked:
                  tracked or num_skipped_tokens >= block_size or result == lifecycle.num_blocks_to_allocate(
                      slots, block_size, num_held, len(hit_evictable), sum(hit_evictable)),
                  "without skipped blocks the need is the single-group need (KV-LIFE-003)", enabled=ENABLED)
@defines(KV_HLC_002)
def group_blocks_to_allocate(slots: int, block_size: int, num_held: int,
                             hit_evictable: tuple[bool, ...], num_skipped_tokens: int,
                             tracked: bool) -> int:
    """Free blocks one group consumes: new blocks, plus hit blocks it takes off the queue.

    ``hit_evictable[j]`` says whether hit block ``j`` is in the free queue (ref count 0 and
    not the null block).
    """
    required = cdiv(slots, block_size)
    if tracked:
        return max(required - num_held, 0)
    skipped_blocks = num_skipped_tokens // block_size
    new = max(required - max(skipped_blocks, num_held + len(hit_evictable)), 0)
    first_kept = max(0, skipped_blocks - num_held)
    return new + sum(hit_evictable[first_kept:])


@icontract.require(lambda num_skipped_blocks: num_skipped_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit_ids, num_skipped_blocks:
                  len(result) == max(len(hit_ids), num_skipped_blocks), enabled=ENABLED)
@icontract.ensure(lambda result, num_skipped_blocks, null_id:
                  all(b == null_id for b in result[:num_skipped_blocks]), enabled=ENABLED)
@icontract.ensure(lambda result, hit_ids, num_skipped_blocks:
                  result[num_skipped_blocks:] == hit_ids[num_skipped_blocks:], enabled=ENABLED)
@defines(KV_HLC_003)
def adopted_table(hit_ids: tuple[int, ...], num_skipped_blocks: int, null_id: int = 0) -> tuple[int, ...]:
    """A new request's table after adopting ``hit_ids`` with ``num_skipped_blocks`` skipped."""
    return (null_id,) * num_skipped_blocks + hit_ids[num_skipped_blocks:]


@icontract.require(lambda tables, null_id: all(null_id not in t[_null_head(t, null_id):] for t in tables),
                   "nulls only as a prefix of each table (KV-HYB-013)", enabled=ENABLED)
@icontract.ensure(lambda result, tables, null_id:
                  sorted(result) == sorted(b for t in tables for b in t if b != null_id),
                  "every non-null entry is released once", enabled=ENABLED)
@defines(KV_HLC_004)
def free_order(tables: tuple[tuple[int, ...], ...], null_id: int = 0) -> tuple[int, ...]:
    """The order ``free`` hands a hybrid request's blocks to the pool."""
    order: list[int] = []
    for table in tables:
        order.extend(reversed(table[_null_head(table, null_id):]))
    return tuple(order)


def _null_head(table: tuple[int, ...], null_id: int) -> int:
    """How many leading entries of ``table`` are the null block."""
    count = 0
    while count < len(table) and table[count] == null_id:
        count += 1
    return count


@icontract.require(lambda kind: _kind_ok(kind), enabled=ENABLED)
@defines(KV_HLC_003, KV_HLC_004)
def table_nulls_ok(kind: str, is_null: tuple[bool, ...]) -> bool:
    """KV-HYB-013 for tables: no null in a full or cross-attention table, nulls only as a
    prefix of a windowed one."""
    if kind not in WINDOWED_KINDS:
        return not any(is_null)
    head = 0
    while head < len(is_null) and is_null[head]:
        head += 1
    return not any(is_null[head:])


@icontract.require(lambda kind: _kind_ok(kind), enabled=ENABLED)
@icontract.require(lambda start: start >= 0, enabled=ENABLED)
@icontract.require(lambda block_size, alignment: block_size > 0 and alignment > 0
                   and alignment % block_size == 0, enabled=ENABLED)
@icontract.require(lambda kind, param: param > 0 or kind not in SIZED_WINDOW_KINDS, enabled=ENABLED)
@icontract.ensure(lambda result, start, end, is_null:
                  all(start <= i < min(end, len(is_null)) and not is_null[i] for i in result), enabled=ENABLED)
@icontract.ensure(lambda result: list(result) == sorted(set(result)), enabled=ENABLED)
@icontract.ensure(lambda result, kind, start, end, is_null:
                  kind == SLIDING_WINDOW
                  or len(result) == sum(1 for i in range(start, min(end, len(is_null))) if not is_null[i]),
                  "outside a sliding-window group every non-null full block is cached", enabled=ENABLED)
@defines(KV_HLC_005)
def blocks_to_cache(kind: str, param: int, start: int, end: int, block_size: int, alignment: int,
                    eagle: bool, is_null: tuple[bool, ...]) -> tuple[int, ...]:
    """Table indices a group caches when its full blocks ``start .. end - 1`` are committed.

    ``is_null[i]`` says whether table entry ``i`` is the null block; ``eagle`` whether the
    group drops EAGLE's block.
    """
    indices = []
    for index in range(start, min(end, len(is_null))):
        if is_null[index]:
            continue
        if kind == SLIDING_WINDOW:
            need = cdiv(param - 1, block_size) + (1 if eagle else 0)
            if not block_is_reachable(index, need, block_size, alignment, eagle):
                continue
        indices.append(index)
    return tuple(indices)


@icontract.require(lambda num_prompt_tokens, num_hashes, hash_block_size, block_size:
                   num_prompt_tokens > 0 and num_hashes >= 0 and hash_block_size > 0
                   and block_size > 0 and block_size % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hash_block_size, block_size:
                  result == 0 or (result % hash_block_size == 0 and result % block_size != 0), enabled=ENABLED)
@icontract.ensure(lambda result, num_prompt_tokens: result <= num_prompt_tokens, enabled=ENABLED)
@defines(KV_HLC_006)
def partial_tail_boundary(num_prompt_tokens: int, num_hashes: int, hash_block_size: int, block_size: int,
                          eagle: bool) -> int:
    """The token count of a prompt's partial tail entry, or 0 when it has none (its last
    hash boundary is a whole number of blocks)."""
    limit = num_prompt_tokens if eagle else num_prompt_tokens - 1
    boundary = min(limit // hash_block_size, num_hashes) * hash_block_size
    return 0 if boundary % block_size == 0 else boundary
