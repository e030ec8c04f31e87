"""Chapter 10 -- The hybrid coordinator: one cache hit over several attention types.

A hybrid model has several KV-cache groups of different attention types
(full, sliding window, chunked local, Mamba), possibly with different block
sizes. A prefix-cache hit must be usable by *every* group at once, so the
request's hit length is a length that all groups accept.

**Configuration** (KV-HYB-001). The scheduler block size is the least common
multiple of the groups' block sizes; the hash block size divides every
group's block size. A group with block size ``b`` sees the request's hashes
through the *block size view*: its block ``j`` is keyed by request hash
``(j + 1) * b / hash_block_size - 1`` (KV-HASH-006). Hits are multiples of
the scheduler block size, the *alignment*.

**Spec groups** (KV-HYB-002). Groups with equal specs are looked up together:
a key hits only when it is cached in every member group. Spec groups that use
full attention are consulted first, because their left-to-right scan gives the
tightest first bound.

**What the answer is** (KV-HYB-003). Each attention type defines which
lengths it *accepts* (KV-FULL-001, KV-SWA-002, KV-CHUNK-001, KV-MAMBA-001,
with the EAGLE peek block where it applies). The hybrid hit is the greatest
``L <= max_cache_hit_length``, a multiple of the alignment, that every spec
group accepts. :func:`declarative_hit` states exactly that, by brute force.

**How it is computed** (KV-HYB-004 .. KV-HYB-008). vLLM reaches the answer by
an iterative fixed point: starting from ``max_cache_hit_length``, each spec
group in turn answers the longest hit it accepts not beyond the current
candidate, and the candidate becomes that answer; if a pass shrank the
candidate, another pass follows. The candidate never grows (KV-HYB-004), so
the loop ends after at most ``max / alignment + 1`` passes. With exactly two
spec groups, the first one full attention, one pass suffices (KV-HYB-005):
full attention accepts every shorter aligned length. A full-attention group
is looked up once; later passes only trim it, and at the end *every*
full-attention spec group is trimmed to the final length (KV-HYB-006). With
EAGLE, a group is looked up one block past the candidate and drops that block
-- once per candidate length, not on every pass (KV-HYB-007; vLLM issue
#32802, where dropping on every pass spiralled the hit down to 0). A Mamba
group gets no such margin (KV-MAMBA-002). The difference between the longest
intermediate candidate and the final hit is reported as
``num_uncached_common_prefix_tokens`` (KV-HYB-008).

:func:`fixed_point` is that loop over flat arguments, step for step, and
:func:`group_hit_length` the per-type finders it calls. The loop returns the
declarative answer whenever each finder answers "the greatest length I accept
within the bound"; where a vLLM finder is more conservative than that
(KV-SWA-010) or the EAGLE bookkeeping lets a shrunken candidate through
unchecked (KV-HYB-009), the difference is a named rule.

**Caching** (KV-HYB-010). A hybrid request caches only what an aligned hit
could read: the computed tokens rounded down to the alignment, plus, in an
EAGLE group, one more block (its peek block), never beyond the computed tokens.
"""

from __future__ import annotations

import math

import icontract

from . import chunked_local, mamba, sliding_window
from .contracts import ENABLED
from .full_attention import aligned_hit_length as full_hit_length
from .registry import INPUT_VALIDATION, defines, rule

CHAPTER = "hybrid"
COORD = "vllm/v1/core/kv_cache_coordinator.py"

#: Attention kinds the hybrid lookup knows. ("sink_full" is looked up as full attention.)
FULL = "full"
SLIDING_WINDOW = "sliding_window"
CHUNKED_LOCAL = "chunked_local"
MAMBA = "mamba"
LOOKUP_KINDS = (FULL, SLIDING_WINDOW, CHUNKED_LOCAL, MAMBA)

#: One spec group, flat: (kind, block_size, window or chunk size (0 if none), eagle).
SpecGroup = tuple[str, int, int, bool]

KV_HYB_001 = rule(
    "KV-HYB-001",
    "The scheduler block size is the LCM of the group block sizes",
    """In a hybrid model the scheduler block size (the hit alignment) is the least common
    multiple of every group's block size, and the hash block size divides every group's
    block size. Other values are rejected with a ConfigError naming this rule.""",
    source=f"{COORD} KVCacheCoordinator.__init__ / HybridKVCacheCoordinator.__init__ (asserts); "
           "vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_HYB_002 = rule(
    "KV-HYB-002",
    "Equal specs form one spec group; full attention is looked up first",
    """Groups with equal specs are looked up together (a key hits only if cached in every
    member group) and report the same hit. Spec groups are ordered full attention first,
    otherwise in group order. A model of several groups sharing specs is a valid model: an
    engine that refuses to configure it fails this rule (the manager suite's check).""",
    source=f"{COORD} HybridKVCacheCoordinator.verify_and_split_kv_cache_groups; "
           "vllm/v1/core/block_pool.py BlockPool.get_cached_block",
    chapter=CHAPTER,
    judged_by=("hybrid", "manager"),
)
KV_HYB_003 = rule(
    "KV-HYB-003",
    "The hybrid hit is the greatest length every group accepts",
    """The hit length is the greatest L <= max_cache_hit_length, a multiple of the
    scheduler block size, that every spec group accepts (with its EAGLE peek block where
    the drop applies), except where KV-SWA-010 or KV-HYB-009 name a more conservative
    engine answer.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (docstring: fixed point)",
    chapter=CHAPTER,
    judged_by=("hybrid", "manager"),
)
KV_HYB_004 = rule(
    "KV-HYB-004",
    "The candidate length only decreases, and the loop terminates",
    """Every spec group answers at most the current candidate (after its own EAGLE drop),
    so the candidate never increases; a pass that does not shrink it ends the loop.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (while loop)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_HYB_005 = rule(
    "KV-HYB-005",
    "One full-attention and one other spec group need a single pass",
    """With exactly two spec groups, the first full attention, the loop stops after one
    pass; the answer equals the full fixed point because full attention accepts every
    shorter aligned length.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (is_simple_hybrid)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_HYB_006 = rule(
    "KV-HYB-006",
    "Every full-attention group is truncated to the final hit",
    """After the loop, the hit blocks of every full-attention spec group (not only the
    first) are cut to cdiv(hit_length, block_size) blocks.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (truncate every full group)",
    chapter=CHAPTER,
    judged_by=("hybrid", "manager"),
)
KV_HYB_007 = rule(
    "KV-HYB-007",
    "EAGLE looks one block further and drops at most once per candidate",
    """An EAGLE spec group other than Mamba is looked up with bound min(candidate +
    block_size, hashed tokens) and drops its last block; it is marked verified and not
    dropped again until a non-EAGLE lookup shrinks the candidate (issue #32802). The seed
    bounded the look-ahead by max_cache_hit_length (as vLLM 0.20 to 0.31 do); vLLM 0.32 and
    later by the hashed tokens.
    An answer that is exactly the loop dropping on every lookup is KV-HYB-015 instead.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (eagle_verified, eagle_margin)",
    chapter=CHAPTER,
    judged_by=("hybrid", "manager", "external-store"),
)
KV_HYB_008 = rule(
    "KV-HYB-008",
    "Uncached common prefix tokens",
    """num_uncached_common_prefix_tokens is the longest candidate any spec group answered
    during the loop minus the final hit length. A model with one KV-cache group has no loop
    (KV-HYB-014) and reports 0.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (longest_hit_length); "
           "UnitaryKVCacheCoordinator.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
    needs=("uncached_prefix_tokens",),
)
KV_HYB_009 = rule(
    "KV-HYB-009",
    "A verified EAGLE group is not re-verified after another EAGLE group shrinks",
    """The verified set is cleared only when a lookup without the drop shrinks the
    candidate. If one EAGLE group shrinks it, a previously verified EAGLE group whose
    acceptance is not downward closed (sliding window) is re-checked without its peek block,
    so the result may lack that group's peek block. kvoracle specifies the engine's answer
    and names the difference from KV-HYB-003.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (eagle_verified.clear())",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("hybrid",),
)
KV_HYB_010 = rule(
    "KV-HYB-010",
    "A hybrid request caches only aligned prefixes plus the EAGLE peek block",
    """cache_blocks caches, in each group, the computed tokens rounded down to the scheduler
    block size; an EAGLE group also caches one more of its blocks, bounded by the computed
    tokens, when that rounded length is positive.""",
    source=f"{COORD} HybridKVCacheCoordinator.get_num_cacheable_tokens; KVCacheCoordinator.cache_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HYB_011 = rule(
    "KV-HYB-011",
    "Per-group lookups evaluate each spec group alone",
    """find_longest_cache_hit_per_group looks each spec group up independently at
    max_cache_hit_length, with its EAGLE drop and margin, and reports each group's own hit.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit_per_group",
    chapter=CHAPTER,
    judged_by=("hybrid",),
    needs=("per_group_lookup",),
)
KV_HYB_012 = rule(
    "KV-HYB-012",
    "Blocks to allocate are summed over the groups",
    """The blocks an allocation needs are the sum over groups of each group's need (a
    cross-attention group sized by the encoder tokens, KV-CROSS-001); the allocation fails
    if the sum exceeds the free blocks.""",
    source=f"{COORD} KVCacheCoordinator.get_num_blocks_to_allocate",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HYB_013 = rule(
    "KV-HYB-013",
    "Null blocks appear only where the attention type puts them",
    """A full-attention hit or table has no null block; a sliding-window or chunked-local
    table has nulls only in a prefix (the skipped blocks); a Mamba hit is nulls then one
    block. The null block is never freed, touched or counted (KV-POOL-002).""",
    source="vllm/v1/core/single_type_kv_cache_manager.py (per-type find_longest_cache_hit)",
    chapter=CHAPTER,
    judged_by=("hybrid", "manager"),
)

KV_HYB_014 = rule(
    "KV-HYB-014",
    "A model with one KV-cache group uses that group's own lookup",
    """With exactly one KV-cache group vLLM uses the unitary coordinator: the group's finder
    is called once at max_cache_hit_length with the group's block size as the alignment and
    the EAGLE drop, without the hybrid loop's look-ahead margin. Where blocks past the bound
    are cached, an EAGLE hit is then one block shorter than the hybrid loop would answer.""",
    source=f"{COORD} UnitaryKVCacheCoordinator.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_HYB_015 = rule(
    "KV-HYB-015",
    "The EAGLE drop does not spiral",
    """A lookup of an EAGLE group drops one block from a candidate the loop has not
    verified; the loop never drops again from what a drop left. A coordinator that drops
    on every pass of the fixed-point loop, with no look-ahead to make up for it, shrinks the
    candidate by a block per pass while every group still accepts, down to 0 (vLLM issue
    #32802: releases 0.14.0 to 0.19.1; 0.15.1 stopped it only for one full-attention and one
    other spec group, 0.20.0 for all). The hybrid suite charges an EAGLE hit to this rule
    when the engine's whole answer is exactly that loop's (``fixed_point(..., redrop=True)``)
    and differs from the spec's.""",
    source=f"{COORD} HybridKVCacheCoordinator.find_longest_cache_hit (eagle_verified); "
           "https://github.com/vllm-project/vllm/issues/32802",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)


@icontract.require(lambda block_sizes: len(block_sizes) > 0 and all(b > 0 for b in block_sizes),
                   enabled=ENABLED)
@icontract.ensure(lambda result, block_sizes: all(result % b == 0 for b in block_sizes), enabled=ENABLED)
@icontract.ensure(lambda result, block_sizes: result <= math.prod(block_sizes), enabled=ENABLED)
@defines(KV_HYB_001)
def scheduler_block_size(block_sizes: tuple[int, ...]) -> int:
    """The hit alignment of a hybrid model: the LCM of its groups' block sizes."""
    result = 1
    for size in block_sizes:
        result = result * size // math.gcd(result, size)
    return result


def _param_ok(kind: str, param: int) -> bool:
    """A window or chunk size is positive where the kind has one."""
    return param > 0 or kind not in (SLIDING_WINDOW, CHUNKED_LOCAL)


def _is_full(kind: str) -> bool:
    return kind == FULL


@defines(KV_HYB_002)
def lookup_order(kinds: tuple[str, ...]) -> tuple[int, ...]:
    """The order in which spec groups are consulted: full attention first, stable."""
    return tuple(sorted(range(len(kinds)), key=lambda i: not _is_full(kinds[i])))


@icontract.require(lambda kinds: all(kind in LOOKUP_KINDS for kind in kinds), enabled=ENABLED)
@icontract.ensure(lambda result, kinds: not result or (len(kinds) == 2 and FULL in kinds), enabled=ENABLED)
@icontract.ensure(lambda result, kinds: result or len(kinds) != 2 or FULL not in kinds, enabled=ENABLED)
@defines(KV_HYB_005)
def single_pass(kinds: tuple[str, ...]) -> bool:
    """Whether the loop stops after its first pass: exactly two spec groups, the first one
    consulted (:func:`lookup_order`) full attention."""
    return len(kinds) == 2 and _is_full(kinds[lookup_order(kinds)[0]])


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.require(lambda kind: kind in LOOKUP_KINDS, enabled=ENABLED)
@icontract.require(lambda kind, param: _param_ok(kind, param), enabled=ENABLED)
@icontract.require(lambda block_size, alignment: alignment > 0 and alignment % block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result % block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, kind, max_length, block_size, drop_eagle:
                  result <= max_length, enabled=ENABLED)
@defines(KV_HYB_003, KV_HYB_007)
def group_hit_length(kind: str, cached: tuple[bool, ...], max_length: int, block_size: int,
                     param: int, drop_eagle: bool, alignment: int) -> int:
    """One spec group's answer to a lookup bounded by ``max_length`` tokens."""
    if kind == FULL:
        return full_hit_length(cached, max_length, block_size, drop_eagle, alignment)
    if kind == SLIDING_WINDOW:
        return sliding_window.hit_length(cached, max_length, block_size, param, drop_eagle, alignment)
    if kind == CHUNKED_LOCAL:
        return chunked_local.hit_length(cached, max_length, block_size, param)
    return mamba.hit_length(cached, max_length, block_size, alignment)


@defines(KV_HYB_007, KV_HYB_003)
def eagle_margin(kind: str, block_size: int) -> int:
    """How far past the candidate an EAGLE group is looked up (KV-MAMBA-002: 0 for Mamba)."""
    return 0 if kind == MAMBA else block_size


@icontract.require(lambda length: length >= 0, enabled=ENABLED)
@icontract.require(lambda kind, param: kind in LOOKUP_KINDS and _param_ok(kind, param), enabled=ENABLED)
@icontract.require(lambda block_size, alignment: block_size > 0 and alignment > 0 and alignment % block_size == 0,
                   enabled=ENABLED)
@defines(KV_HYB_003, sliding_window.KV_SWA_002, chunked_local.KV_CHUNK_001, mamba.KV_MAMBA_001)
def group_accepts(kind: str, cached: tuple[bool, ...], length: int, block_size: int, param: int,
                  eagle: bool, alignment: int) -> bool:
    """Whether a spec group accepts a hit of ``length`` tokens (a multiple of the alignment).

    With ``eagle`` (and not Mamba) the group also needs its peek block: block
    ``length / block_size`` must be cached.
    """
    if length % alignment:
        return False
    if length == 0:
        return True
    blocks = length // block_size
    if blocks > len(cached):
        return False
    peek_ok = not eagle or kind == MAMBA or (blocks < len(cached) and cached[blocks])
    if kind == FULL:
        return peek_ok and all(cached[:blocks])
    if kind == SLIDING_WINDOW:
        need = sliding_window.contiguous_blocks_needed(param, block_size, False)
        if eagle:
            # The peek block already makes the scan's run non-empty (KV-SWA-003 is moot).
            return peek_ok and all(cached[max(0, blocks - need):blocks])
        return sliding_window.accepts(cached, blocks, need, block_size, alignment)
    if kind == CHUNKED_LOCAL:
        first = chunked_local.num_null_blocks(length, block_size, param)
        return peek_ok and all(cached[first:blocks])
    return bool(cached[blocks - 1])


def _check_groups(groups: tuple[SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                  alignment: int) -> bool:
    return (len(groups) == len(cached) > 0 and alignment > 0
            and all(kind in LOOKUP_KINDS and size > 0 and alignment % size == 0 and _param_ok(kind, param)
                    # KV-CHUNK-003: chunked local has the alignment's block size and no EAGLE
                    and (kind != CHUNKED_LOCAL or (size == alignment and not eagle))
                    for kind, size, param, eagle in groups))


@icontract.require(lambda groups, cached, alignment: _check_groups(groups, cached, alignment), enabled=ENABLED)
@icontract.require(lambda max_cache_hit_length: max_cache_hit_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, alignment, max_cache_hit_length:
                  result % alignment == 0 and 0 <= result <= max_cache_hit_length, enabled=ENABLED)
@defines(KV_HYB_003)
def declarative_hit(groups: tuple[SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                    max_cache_hit_length: int, alignment: int) -> int:
    """The greatest aligned length within the bound that every spec group accepts."""
    length = max_cache_hit_length - max_cache_hit_length % alignment
    while length > 0:
        if all(group_accepts(kind, flags, length, size, param, eagle, alignment)
               for (kind, size, param, eagle), flags in zip(groups, cached)):
            return length
        length -= alignment
    return 0


@icontract.require(lambda groups, cached, alignment: _check_groups(groups, cached, alignment), enabled=ENABLED)
@icontract.require(lambda max_cache_hit_length: max_cache_hit_length >= 0, enabled=ENABLED)
@icontract.require(lambda num_hashed_tokens: num_hashed_tokens >= 0, enabled=ENABLED)
@icontract.require(lambda groups, cached, num_hashed_tokens: all(
    len(flags) == num_hashed_tokens // size for (_, size, _, _), flags in zip(groups, cached)),
    "each group's flags cover exactly the hashed tokens", enabled=ENABLED)
# (A Mamba look-ahead, the bug of issue #43559, may end past the bound and past what the
# other groups hold.)
@icontract.ensure(lambda result, max_cache_hit_length, mamba_margin:
                  mamba_margin or 0 <= result[0] <= max_cache_hit_length, enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result[0] % alignment == 0, enabled=ENABLED)
@icontract.ensure(lambda result, mamba_margin: mamba_margin or all(length >= result[0] for length in result[1]),
                  enabled=ENABLED)
@icontract.ensure(lambda result: result[2] >= 0, enabled=ENABLED)
@icontract.ensure(lambda groups, cached, max_cache_hit_length, alignment, result:
                  any(eagle for _, _, _, eagle in groups)
                  or result[0] == declarative_hit(groups, cached, max_cache_hit_length, alignment),
                  "KV-HYB-003: without EAGLE the loop returns the declarative hit", enabled=ENABLED)
@icontract.ensure(lambda groups, cached, max_cache_hit_length, alignment, ideal, result:
                  not ideal or any(kind == SLIDING_WINDOW and param == 1 for kind, _, param, _ in groups)
                  or result[0] == declarative_hit(groups, cached, max_cache_hit_length, alignment),
                  "KV-HYB-003: the ideal loop returns the declarative hit (windows > 1)", enabled=ENABLED)
@defines(KV_HYB_002, KV_HYB_004, KV_HYB_005, KV_HYB_006, KV_HYB_007, KV_HYB_008, KV_HYB_009, KV_HYB_015)
def fixed_point(groups: tuple[SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                max_cache_hit_length: int, num_hashed_tokens: int, alignment: int,
                ideal: bool = False, *, one_pass: bool = True, redrop: bool = False,
                margin_cap: str = "hashed", mamba_margin: bool = False
                ) -> tuple[int, tuple[int, ...], int, int, tuple[tuple[int, bool], ...]]:
    """vLLM 0.33.0's fixed-point loop over flat arguments.

    With ``ideal`` the two named engine differences are removed: sliding-window
    groups answer the greatest accepted length (no KV-SWA-010) and any shrink of the
    candidate re-arms every other group's EAGLE drop (no KV-HYB-009). The ideal loop
    returns :func:`declarative_hit` exactly when no sliding window is 1 (KV-SWA-003);
    the tests check both statements. With ``one_pass=False`` the loop runs to its fixed
    point even where KV-HYB-005 stops it after one pass: the answer of a coordinator that
    misses the shortcut, which differs only with EAGLE and a window of 1 (the hybrid suite
    names such an answer KV-HYB-005). With ``redrop`` the loop is the one KV-HYB-015
    forbids: every lookup of an EAGLE group drops, with no look-ahead margin, and the loop
    runs to its fixed point (the coordinator of vLLM issue #32802). With ``margin_cap=
    "max_length"`` the look-ahead is capped by ``max_cache_hit_length`` instead of the hashed
    tokens, as the seed and vLLM 0.20 to 0.31 do (an EAGLE hit at the bound then
    loses its last block); the hybrid suite names such an answer KV-HYB-007. With
    ``mamba_margin`` a Mamba group is looked up one block past the candidate too, although
    its finder never drops, so the candidate can grow past what full attention holds (vLLM
    0.20 to 0.25, issue #43559); the hybrid suite names such an answer KV-MAMBA-002.

    ``groups[g]`` describes spec group ``g`` (already merged, KV-HYB-002) and
    ``cached[g]`` which of its blocks are cached in every member group. Returns
    ``(hit_length, per-group hit lengths before the final trim, uncached common prefix
    tokens, group lookups made, per-group (bound, drop) of its last lookup)``. The
    per-group lengths are what each group's hit blocks cover before KV-HYB-006 trims the
    full-attention ones; the last lookup's bound and drop fix where a group's null
    blocks are (KV-HYB-013).
    """
    order = lookup_order(tuple(kind for kind, _, _, _ in groups))
    simple = one_pass and not redrop and single_pass(tuple(kind for kind, _, _, _ in groups))
    hit_length = max_cache_hit_length
    looked_up = [False] * len(groups)
    group_length = [0] * len(groups)
    last_lookup = [(0, False)] * len(groups)
    longest = 0
    verified: set[int] = set()
    lookups = 0
    while True:
        candidate = hit_length
        for g in order:
            kind, size, param, eagle = groups[g]
            if _is_full(kind) and looked_up[g]:
                candidate = min(candidate, group_length[g])  # KV-HYB-006: trim only
                continue
            drop = eagle and (redrop or g not in verified)
            bound = candidate
            margin = size if mamba_margin and kind == MAMBA else eagle_margin(kind, size)
            if drop and margin and not redrop:
                cap = max_cache_hit_length if margin_cap == "max_length" else num_hashed_tokens
                bound = min(candidate + margin, cap)
            if ideal and kind == SLIDING_WINDOW:
                answer = sliding_window.greatest_accepted(cached[g], bound, size, param, drop, alignment)
            else:
                answer = group_hit_length(kind, cached[g], bound, size, param, drop, alignment)
            lookups += 1
            last_lookup[g] = (bound, drop)
            if ideal and answer < candidate:
                verified = {g} if drop else set()
            elif drop:
                verified.add(g)
            elif answer < candidate:
                verified.clear()  # KV-HYB-009: only a non-EAGLE shrink clears
            candidate = answer
            looked_up[g] = True
            group_length[g] = answer
            longest = max(longest, candidate)
        if candidate >= hit_length:
            break
        hit_length = candidate
        if simple:
            break  # KV-HYB-005
    return hit_length, tuple(group_length), longest - hit_length, lookups, tuple(last_lookup)


@icontract.require(lambda kind, param: kind in LOOKUP_KINDS and _param_ok(kind, param), enabled=ENABLED)
@icontract.require(lambda num_blocks, bound: num_blocks >= 0 and bound >= 0, enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_blocks: 0 <= result <= num_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind != FULL or result == 0, enabled=ENABLED)
@defines(KV_HYB_013)
def num_null_hit_blocks(kind: str, num_blocks: int, bound: int, drop_eagle: bool, block_size: int,
                        param: int) -> int:
    """How many leading entries of a group's ``num_blocks``-block hit are the null block.

    ``bound`` and ``drop_eagle`` are those of the group's last lookup. The rest of the
    hit entries are cached blocks.
    """
    if kind == FULL or num_blocks == 0:
        return 0
    if kind == SLIDING_WINDOW:
        run = max(sliding_window.contiguous_blocks_needed(param, block_size, drop_eagle), 1)
        return max(0, num_blocks + (1 if drop_eagle else 0) - run)
    if kind == CHUNKED_LOCAL:
        return min(chunked_local.num_null_blocks(bound, block_size, param), num_blocks)
    return num_blocks - 1


@icontract.require(lambda num_computed_tokens: num_computed_tokens >= 0, enabled=ENABLED)
@icontract.require(lambda block_size, alignment: block_size > 0 and alignment > 0 and alignment % block_size == 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens: 0 <= result <= num_computed_tokens, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens, alignment:
                  result >= num_computed_tokens - num_computed_tokens % alignment, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens, alignment, eagle, block_size:
                  result - (num_computed_tokens - num_computed_tokens % alignment)
                  <= (block_size if eagle else 0), enabled=ENABLED)
@defines(KV_HYB_010)
def num_cacheable_tokens(num_computed_tokens: int, alignment: int, eagle: bool, block_size: int) -> int:
    """Tokens a hybrid group caches after ``num_computed_tokens``: the aligned prefix, plus
    an EAGLE group's peek block when that prefix is not empty."""
    aligned = num_computed_tokens - num_computed_tokens % alignment
    if eagle and aligned > 0:
        return min(num_computed_tokens, aligned + block_size)
    return aligned


@icontract.require(lambda groups, cached, alignment: _check_groups(groups, cached, alignment), enabled=ENABLED)
@icontract.require(lambda max_cache_hit_length, num_hashed_tokens:
                   max_cache_hit_length >= 0 and num_hashed_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, groups: len(result) == len(groups), enabled=ENABLED)
@icontract.ensure(lambda result, max_cache_hit_length, alignment:
                  all(0 <= length <= max_cache_hit_length and length % alignment == 0 for length in result),
                  enabled=ENABLED)
@defines(KV_HYB_011, KV_HYB_007)
def per_group_hits(groups: tuple[SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                   max_cache_hit_length: int, num_hashed_tokens: int, alignment: int) -> tuple[int, ...]:
    """Each spec group's own hit, looked up alone at ``max_cache_hit_length`` (with its
    EAGLE margin and drop), as find_longest_cache_hit_per_group reports it."""
    out = []
    for (kind, size, param, eagle), flags in zip(groups, cached):
        bound = max_cache_hit_length
        if eagle and eagle_margin(kind, size):
            bound = min(max_cache_hit_length + eagle_margin(kind, size), num_hashed_tokens)
        out.append(group_hit_length(kind, flags, bound, size, param, eagle, alignment))
    return tuple(out)


@icontract.require(lambda kind: kind in LOOKUP_KINDS, enabled=ENABLED)
@icontract.require(lambda kind, param: _param_ok(kind, param), enabled=ENABLED)
@icontract.require(lambda block_size, max_cache_hit_length: block_size > 0 and max_cache_hit_length >= 0,
                   enabled=ENABLED)
@icontract.require(lambda kind, eagle: kind != CHUNKED_LOCAL or not eagle, "KV-CHUNK-003", enabled=ENABLED)
@icontract.ensure(lambda result, block_size, max_cache_hit_length:
                  result % block_size == 0 and 0 <= result <= max_cache_hit_length, enabled=ENABLED)
# (Not for a chunk that is no multiple of the block size: there the null blocks end before the
# chunk start, a second lookup at that shorter hit finds an earlier chunk start, and the loop
# goes on where the unitary coordinator stops -- CrossHair: chunk 3, block 4, bound 8.)
@icontract.ensure(lambda result, kind, cached, max_cache_hit_length, block_size, param, eagle:
                  eagle or (kind == CHUNKED_LOCAL and param % block_size != 0)
                  or result == fixed_point(((kind, block_size, param, eagle),), (cached,),
                                           max_cache_hit_length, len(cached) * block_size, block_size)[0],
                  "without EAGLE the unitary lookup is the one-group fixed point", enabled=ENABLED)
@defines(KV_HYB_014)
def unitary_hit(kind: str, cached: tuple[bool, ...], max_cache_hit_length: int, block_size: int,
                param: int, eagle: bool) -> int:
    """The hit of a model with a single KV-cache group (no EAGLE margin)."""
    return group_hit_length(kind, cached, max_cache_hit_length, block_size, param, eagle, block_size)
