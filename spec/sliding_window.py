"""Chapter 6 -- Sliding-window attention.

In a sliding-window layer a token attends to itself and the ``window - 1``
tokens before it. To resume a request after a prefix of ``L`` blocks, only the
KV of the last ``window - 1`` tokens before the resume point is needed: the
last ``cdiv(window - 1, block_size)`` blocks before block ``L``. The blocks
further left are never read again; a hit puts the *null block* in their
places.

**The hit.** Scanning right to left from the last block within
``max_length``, the hit ends at the first point where enough contiguous blocks
are cached. If no such run exists anywhere, a run of cached blocks that starts
at block 0 is still a hit: the window then reaches back to the start of the
sequence, and the whole (short) prefix is cached. A hit of ``L`` blocks is
reported as ``L`` entries: nulls, then the contiguous run.

Declaratively (KV-SWA-002): a length of ``L`` blocks is *accepted* when
``L == 0``, or the blocks ``max(0, L - need) .. L - 1`` are all cached and
``L * block_size`` is a multiple of the alignment; the hit is the greatest
accepted ``L`` not beyond ``max_length``.

**The degenerate window 1** (KV-SWA-003). With ``window == 1`` a token attends
only to itself, so ``need == 0`` and -- naturally -- every length would be a
hit made only of null blocks. vLLM's scan instead counts a run only when it
sees a cached block, so it still needs the *last* block before the resume
point cached. kvoracle follows the engine: ``need`` is at least 1 for the
acceptance test.

**EAGLE** (KV-SWA-004). With EAGLE the run must be one block longer, and the
last matched block is dropped: the hit ``F`` needs blocks ``F - need .. F``
cached (the block *at* ``F`` is the "peek" block that is recomputed).

**Alignment** (KV-SWA-005). In a hybrid model the hit must be a multiple of
the scheduler block size, which may span several of this group's blocks. The
right end of a run may only sit on an aligned boundary; a short run from the
start is rounded down. With EAGLE in that situation vLLM rounds down a second
time after the drop, which loses one more alignment unit than necessary
(KV-SWA-010, a named difference from the declarative optimum).

**Skipped tokens and freeing** (KV-SWA-006, KV-SWA-007). After ``n`` computed
tokens, the first ``max(0, n - window + 1)`` tokens are outside every future
window. Their whole blocks are freed right to left -- stopping at the first
null block, which marks where an earlier call stopped -- and replaced by the
null block. vLLM 0.33.0 does this *before* it checks whether an allocation
fits, so a failed allocation may still have freed blocks (KV-SWA-008).
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .lifecycle import cdiv
from .registry import defines, rule

CHAPTER = "sliding_window"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"
MGR = "vllm/v1/core/kv_cache_manager.py"

KV_SWA_001 = rule(
    "KV-SWA-001",
    "A hit needs cdiv(window - 1, block_size) contiguous blocks",
    """The number of contiguous cached blocks a sliding-window hit needs before its end is
    cdiv(window - 1, block_size): the window includes the token being computed, so only
    window - 1 earlier tokens must be resident. (Not cdiv(window, block_size).)""",
    source=f"{STKV} SlidingWindowManager._contiguous_blocks_for_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_SWA_002 = rule(
    "KV-SWA-002",
    "The hit is the greatest accepted length, with nulls before the run",
    """A length of L blocks is accepted when L == 0 or blocks max(0, L - need) .. L - 1 are
    cached and L * block_size is a multiple of the alignment. The hit is the greatest
    accepted L <= max_length // block_size; its entries before L - need are the null
    block and the rest are the blocks a lookup returns.""",
    source=f"{STKV} SlidingWindowManager.find_longest_cache_hit (right-to-left scan)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_SWA_003 = rule(
    "KV-SWA-003",
    "Window 1 still needs the last block before the hit cached",
    """With sliding_window == 1, cdiv(0, block_size) == 0 blocks are needed, yet the scan
    only ends at a cached block: a non-empty hit of L blocks needs block L - 1 cached. The
    natural reading (any length is a hit of null blocks) is not what vLLM does; kvoracle
    specifies the engine's behaviour: need is at least 1.""",
    source=f"{STKV} SlidingWindowManager.find_longest_cache_hit (match only inside `if cached`)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_SWA_004 = rule(
    "KV-SWA-004",
    "EAGLE needs one more contiguous block, then drops it",
    """With the EAGLE drop the scan needs need + 1 contiguous blocks and then removes the
    last matched block: a hit of F blocks needs blocks F - need .. F cached.""",
    source=f"{STKV} SlidingWindowManager._contiguous_blocks_for_hit / find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_SWA_005 = rule(
    "KV-SWA-005",
    "A run may only end on an aligned boundary",
    """When block_size differs from the alignment, a cached block can end a run only if
    the run's length after the EAGLE drop is a multiple of the alignment; a run from block
    0 shorter than need is rounded down to the alignment.""",
    source=f"{STKV} SlidingWindowManager.find_longest_cache_hit (post_pop_blocks check)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_SWA_006 = rule(
    "KV-SWA-006",
    "Skipped tokens are those before the window",
    """After n computed tokens, get_num_skipped_tokens(n) == max(0, n - window + 1): the
    tokens no future token's window reaches.""",
    source=f"{STKV} SlidingWindowManager.get_num_skipped_tokens",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups", "skipped_tokens"),
)
KV_SWA_007 = rule(
    "KV-SWA-007",
    "Skipped blocks are freed right to left up to the first null",
    """remove_skipped_blocks frees the request's whole skipped blocks (skipped_tokens //
    block_size, capped at the table length) from the right, stops at the first null block,
    frees the collected blocks in that order, and puts the null block in their places.""",
    source=f"{STKV} SingleTypeKVCacheManager.remove_skipped_blocks / _remove_blocks_in_range",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_SWA_008 = rule(
    "KV-SWA-008",
    "Skipped blocks are freed before the capacity check",
    """allocate_slots frees the blocks outside the window before it checks that the pool can
    serve the allocation, so an allocation that returns None may still have freed blocks.
    This relaxes KV-LIFE-004 (a failed allocation changes nothing) for sliding-window and
    chunked-local groups.""",
    source=f"{MGR} KVCacheManager.allocate_slots (remove_skipped_blocks before the check)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_SWA_009 = rule(
    "KV-SWA-009",
    "A new request's skipped hit blocks become nulls and are not touched",
    """When a request adopts a hit, the first skipped_tokens(num_computed) // block_size
    entries are replaced by the null block and are neither touched nor counted as evictable;
    the allocation needs cdiv(num_tokens, block_size) - max(skipped blocks, held blocks) new
    blocks.""",
    source=f"{STKV} SingleTypeKVCacheManager.get_num_blocks_to_allocate / add_local_computed_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_SWA_010 = rule(
    "KV-SWA-010",
    "EAGLE with a short run in a finer-grained group loses one more alignment unit",
    """When no run of need + 1 blocks exists, the block size is finer than the alignment and
    the EAGLE drop applies, vLLM aligns the initial run, drops a block, then aligns again:
    the hit can be one alignment unit shorter than the greatest length whose blocks are all
    cached. kvoracle specifies the engine's (conservative) answer and names the difference.""",
    source=f"{STKV} SlidingWindowManager.find_longest_cache_hit (re-align after eagle pop)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("hybrid",),
)
KV_SWA_011 = rule(
    "KV-SWA-011",
    "In a hybrid model only reachable blocks are cached",
    """When the alignment spans per_segment = alignment // block_size blocks and need <
    per_segment, cache_blocks caches only block i with i >= shift and (i - shift) %
    per_segment >= per_segment - need (shift is 1 with EAGLE): the tail of each aligned
    segment that some aligned hit could read. Otherwise every full block is cached.""",
    source=f"{STKV} SlidingWindowManager.reachable_block_mask (retention_interval None)",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)


KV_SWA_012 = rule(
    "KV-SWA-012",
    "In a hybrid model every reachable block is cached",
    """The other half of KV-SWA-011: cache_blocks never leaves out a block that KV-SWA-011
    names reachable. With EAGLE the reachable tail of each aligned segment is shifted by
    one block and one block longer (the peek block the EAGLE lookup reads past the hit); a
    mask without the shift caches too few blocks for any EAGLE hit, and the prefix cache of
    such a model never hits (vLLM 0.22, issue #44082).""",
    source=f"{STKV} SlidingWindowManager.reachable_block_mask (vLLM 0.23; 0.22's _cache_block_mask "
           "has no EAGLE shift)",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)


@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, window, block_size, eagle:
                  (result - int(eagle)) * block_size >= window - 1
                  and (result - int(eagle) - 1) * block_size < max(window - 1, 1), enabled=ENABLED)
@defines(KV_SWA_001, KV_SWA_004)
def contiguous_blocks_needed(window: int, block_size: int, eagle: bool) -> int:
    """Blocks a hit needs before its end (plus EAGLE's peek block)."""
    return cdiv(window - 1, block_size) + (1 if eagle else 0)


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment: alignment > 0, enabled=ENABLED)
@icontract.require(lambda num_blocks: num_blocks >= 0, enabled=ENABLED)
@icontract.require(lambda need: need >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached, num_blocks: not result or num_blocks == 0 or cached[num_blocks - 1],
                  enabled=ENABLED)
@defines(KV_SWA_002, KV_SWA_003, KV_SWA_005)
def accepts(cached: tuple[bool, ...], num_blocks: int, need: int, block_size: int,
            alignment: int) -> bool:
    """Whether a hit of ``num_blocks`` blocks is acceptable (without the EAGLE drop)."""
    if num_blocks == 0:
        return True
    if num_blocks > len(cached) or (num_blocks * block_size) % alignment:
        return False
    need = max(need, 1)  # KV-SWA-003
    return all(cached[max(0, num_blocks - need):num_blocks])


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment: alignment > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: 0 <= result <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result % block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, alignment, window, drop_eagle:
                  drop_eagle or accepts(cached, result // block_size,
                                        contiguous_blocks_needed(window, block_size, False),
                                        block_size, alignment), enabled=ENABLED)
@defines(KV_SWA_002, KV_SWA_003, KV_SWA_004, KV_SWA_005, KV_SWA_010)
def hit_length(cached: tuple[bool, ...], max_length: int, block_size: int, window: int,
               drop_eagle: bool, alignment: int) -> int:
    """The sliding-window hit in tokens, as vLLM 0.33.0's right-to-left scan finds it.

    ``cached[j]`` says whether block ``j`` (in this group's block size) is cached.
    """
    need = contiguous_blocks_needed(window, block_size, drop_eagle)
    max_blocks = min(max_length // block_size, len(cached))
    run = 0
    found = -1
    for i in range(max_blocks - 1, -1, -1):
        if not cached[i]:
            run = 0
            continue
        if run == 0 and block_size != alignment:
            kept = i if drop_eagle else i + 1
            if (kept * block_size) % alignment:
                continue  # KV-SWA-005: a run may not end here
        run += 1
        if run >= need:
            found = i + run
            break
    if found >= 0:
        blocks = found
    else:
        blocks = run  # a run from block 0, shorter than need
        while block_size != alignment and (blocks * block_size) % alignment:
            blocks -= 1
    if drop_eagle and blocks > 0:
        blocks -= 1  # KV-SWA-004
        while block_size != alignment and (blocks * block_size) % alignment:
            blocks -= 1  # KV-SWA-010
    return blocks * block_size


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment: alignment > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result % block_size == 0, enabled=ENABLED)
@defines(KV_SWA_002, KV_SWA_004)
def greatest_accepted(cached: tuple[bool, ...], max_length: int, block_size: int, window: int,
                      drop_eagle: bool, alignment: int) -> int:
    """The declarative optimum: the greatest accepted length (KV-SWA-002), in tokens.

    With the EAGLE drop a hit of ``F`` blocks also needs block ``F`` cached (the peek
    block), within ``max_length``.
    """
    need = contiguous_blocks_needed(window, block_size, False)
    max_blocks = min(max_length // block_size, len(cached))
    for blocks in range(max_blocks, -1, -1):
        if drop_eagle:
            if blocks == 0:
                return 0
            peek_ok = blocks < max_blocks and cached[blocks]
            window_ok = all(cached[max(0, blocks - need):blocks])
            if peek_ok and window_ok and (blocks * block_size) % alignment == 0:
                return blocks * block_size
        elif accepts(cached, blocks, need, block_size, alignment):
            return blocks * block_size
    return 0


@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda num_computed_tokens: num_computed_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens: 0 <= result <= num_computed_tokens, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens, window:
                  result == 0 or num_computed_tokens - result == window - 1, enabled=ENABLED)
@defines(KV_SWA_006)
def num_skipped_tokens(num_computed_tokens: int, window: int) -> int:
    """Tokens before every future window."""
    return max(0, num_computed_tokens - window + 1)


@icontract.require(lambda num_skipped_blocks: num_skipped_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, is_null: all(not is_null[i] for i in result), enabled=ENABLED)
@icontract.ensure(lambda result: list(result) == sorted(set(result), reverse=True), enabled=ENABLED)
@icontract.ensure(lambda result, num_skipped_blocks, is_null:
                  all(i < min(num_skipped_blocks, len(is_null)) for i in result), enabled=ENABLED)
@defines(KV_SWA_007)
def blocks_to_free(is_null: tuple[bool, ...], num_skipped_blocks: int) -> tuple[int, ...]:
    """Table indices remove_skipped_blocks frees, in the order it frees them."""
    last = min(num_skipped_blocks, len(is_null))
    freed: list[int] = []
    for i in range(last - 1, -1, -1):
        if is_null[i]:
            break
        freed.append(i)
    return tuple(freed)


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment, block_size: alignment > 0 and alignment % block_size == 0,
                   enabled=ENABLED)
@icontract.require(lambda need: need >= 0, enabled=ENABLED)
@icontract.require(lambda block_index: block_index >= 0, enabled=ENABLED)
@defines(KV_SWA_011, KV_SWA_012)
def block_is_reachable(block_index: int, need: int, block_size: int, alignment: int,
                       eagle: bool) -> bool:
    """Whether a hybrid sliding-window group caches block ``block_index`` when it fills.

    ``need`` includes EAGLE's peek block (:func:`contiguous_blocks_needed`).
    """
    per_segment = alignment // block_size
    if need >= per_segment:
        return True
    shift = 1 if eagle else 0
    return block_index >= shift and (block_index - shift) % per_segment >= per_segment - need


@icontract.require(lambda num_tokens, num_held_blocks, num_hit_blocks, num_skipped_tokens:
                   min(num_tokens, num_held_blocks, num_hit_blocks, num_skipped_tokens) >= 0, enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result: result >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size, num_held_blocks, num_hit_blocks, num_skipped_tokens:
                  result + max(num_skipped_tokens // block_size, num_held_blocks + num_hit_blocks)
                  >= cdiv(num_tokens, block_size), enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size, num_held_blocks, num_hit_blocks, num_skipped_tokens:
                  num_skipped_tokens > 0 or result == max(
                      cdiv(num_tokens, block_size) - num_held_blocks - num_hit_blocks, 0), enabled=ENABLED)
@defines(KV_SWA_009)
def num_new_blocks(num_tokens: int, block_size: int, num_held_blocks: int, num_hit_blocks: int,
                   num_skipped_tokens: int) -> int:
    """New blocks a request needs for ``num_tokens`` slots when its first
    ``num_skipped_tokens`` tokens lie outside the window: skipped positions get the null
    block, so they need no new block even where no hit covers them."""
    return max(cdiv(num_tokens, block_size) - max(num_skipped_tokens // block_size,
                                                  num_held_blocks + num_hit_blocks), 0)
