"""Chapter 13 -- External KV stores: the Mooncake store coordinator.

An external KV store (vLLM's ``MooncakeStoreConnector``) keeps KV chunks
outside the GPU, keyed by ``(group_id, hash)``. A *chunk* of a group with
block size ``b`` is one of its blocks: chunk ``i`` holds tokens ``i * b ..
(i + 1) * b - 1`` and is keyed by the block's hash at that group's block-size
view (KV-HASH-006). What the store holds is therefore a plain *existence set*
of keys, and the store side of the connector answers three questions over it
for a hybrid model: how long a hit it can serve, which chunks each group must
load for that hit, and which chunks a finished request must write so that a
later request can hit them.

**The hit** (KV-EXT-001). The store must answer exactly what the local hybrid
coordinator (chapter ``hybrid``) would answer over a block pool holding
exactly the store's chunks: block ``j`` of a spec group counts as cached when
the key of block ``j`` is in the existence set for every member group. The
answer is :func:`kvoracle.spec.hybrid.fixed_point` over those flags, with the
EAGLE drop where the *local* coordinator applies it: only when EAGLE is on,
in the groups marked as EAGLE (draft) groups, or in every group when none is
marked (:func:`local_eagle_groups`).

**Loadability** (KV-EXT-002). Every chunk a load mask asks for must exist:
the worker fetches chunk ``i`` of group ``g`` for a hit of ``L`` tokens under
the key of the hash that ends the chunk, ``min((i + 1) * b, L) / hash_block_size
- 1``. For hits on block boundaries this is the chunk's own key. A hit that
ends *inside* a block (vLLM's fine-grained "partial hash" hits) needs the key
at the hit's end, which a store that holds only the longer block's key does
not have (vLLM issue #50359: a store holding full-attention keys at 32 and 64
tokens and Mamba keys at 32 and 48 answered 48, which it could not load; the
loadable answer was 32). Unlike the local pool, an external object is only
addressable at the boundary it was stored under.

**Load masks** (KV-EXT-003, KV-EXT-004). The load mask of a group at a hit of
``L`` tokens marks the chunks the group reads: every chunk for full attention,
the run before ``L`` for a sliding window (nulls before it), the last block for
Mamba, the blocks of the current chunk for chunked local attention -- the
non-null entries of the group's hit (KV-HYB-013). ``load_mask(hashes, L)``
recomputes them on the receiving side from ``L`` alone; ``L`` already is the
EAGLE-pruned hit, so the receiving side must not drop a block again (vLLM
issue #43516: the second drop left the last block of every hit unloaded).

**Storing** (KV-EXT-005, KV-EXT-006). ``store_mask(A)`` says which chunks of
the first ``A`` tokens (``A`` aligned) a request writes. A chunk is stored
exactly when some aligned hit could read it: every chunk of full and chunked
local attention; for a sliding window the tail of each aligned segment that a
hit ending on a segment boundary reads (KV-SWA-011, shifted by one block for an
EAGLE group, whose peek block is part of what the lookup reads). When every
spec group is full attention or has the scheduler block size, every chunk is
stored (the fast path: each segment is one block, so each block ends a hit).
A store holding exactly what ``store_mask(A)`` wrote must serve every aligned
bound ``L <= A`` exactly as a store holding every chunk would
(:func:`store_is_sufficient`). ``lookup_mask(A)`` is the same reachability
without Mamba's exclusion (KV-EXT-007).

**Named differences** (KV-EXT-008 .. KV-EXT-014). vLLM 0.33.0's store mask
never writes a Mamba chunk (Mamba state goes through a separate hand-off
path), so sufficiency holds only for configurations without Mamba. Its store
coordinator applies the EAGLE drop to every group marked as a draft group even
when EAGLE block dropping is off, where the local coordinator drops nothing.
With partial hash hits it answers hits it cannot load (#50359 above). And a
sliding window of 1 (without EAGLE) is never stored, although its hits still
need the last block before them (KV-EXT-011, after KV-SWA-003). With EAGLE, a
sliding window finer than the alignment is looked up more conservatively than
store_mask assumes (KV-EXT-012, after KV-SWA-010). And when every group shares
one spec, the store looks that spec group up without the EAGLE look-ahead the
local loop gives it, answering one block less (KV-EXT-013). With EAGLE, a window
of 1 verifies only its peek block, yet its load mask asks for the block before
the hit (KV-EXT-014).
"""

from __future__ import annotations

import icontract

from . import hybrid, sliding_window
from .contracts import ENABLED
from .registry import defines, rule

CHAPTER = "external_store"
STORE = "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/coordinator.py"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"

KV_EXT_001 = rule(
    "KV-EXT-001",
    "The external hit equals the local hybrid hit over the same blocks",
    """The hit length an external store coordinator answers for a prompt and bound equals
    what the local hybrid coordinator answers (KV-HYB-003 .. KV-HYB-009) over a pool that
    holds exactly the store's chunks: block j of a spec group is cached iff the key of its
    block-size view hash j exists for every member group. The local coordinator drops the
    EAGLE block only when EAGLE dropping is on, in the groups marked as EAGLE groups (all
    groups when none is marked).""",
    source=f"{STORE} MooncakeStoreCoordinator._find_hit_blocks (mirror of "
           "HybridKVCacheCoordinator.find_longest_cache_hit); ExternalCachedBlockPool.get_cached_block",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_002 = rule(
    "KV-EXT-002",
    "Every chunk a load mask asks for exists in the store",
    """For a hit of L tokens, chunk i of group g (block size b) that the load mask marks is
    fetched under the hash index min((i + 1) * b, L) / hash_block_size - 1; that key must
    be in the existence set. A hit ending inside a block needs the key at the hit's end
    (vLLM issue #50359).""",
    source=f"{STORE} MooncakeStoreCoordinator.find_longest_cache_hit (masks); "
           "vLLM PR #50359 (exact partial-hash hit boundaries)",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_003 = rule(
    "KV-EXT-003",
    "A load mask marks exactly the chunks the group's hit reads",
    """At a hit of L tokens (a multiple of the group's block size) the load mask of a group
    has L / block_size entries, False at the group's null entries (KV-HYB-013: none for
    full attention, the skipped head of a sliding window or chunked local hit, all but the
    last for Mamba, every entry for an EAGLE sliding window of 1 whose last lookup in the
    loop checked only the peek block and dropped it) and True elsewhere. load_mask(hashes,
    L) gives the masks of the lookup that answered L.""",
    source=f"{STORE} MooncakeStoreCoordinator.find_longest_cache_hit / load_mask",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_004 = rule(
    "KV-EXT-004",
    "load_mask never re-applies the EAGLE drop",
    """load_mask(hashes, L) receives the already pruned hit L and covers all of it: each
    group's mask has L / block_size entries and, for L > 0, its last entry is True (except
    where the group's hit reads no block: a chunked local hit on a chunk boundary, and an
    EAGLE sliding window of 1, KV-EXT-003). Dropping the EAGLE block again would leave the
    hit's last block unloaded (vLLM PR #43516).""",
    source=f"{STORE} MooncakeStoreCoordinator.load_mask (apply_eagle=False)",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_005 = rule(
    "KV-EXT-005",
    "store_mask stores a chunk iff some aligned hit could read it",
    """store_mask(A) marks chunk i of group g (i < A / block_size) iff an aligned hit could
    read it: every chunk of full and chunked local attention; for a sliding window the
    blocks block_is_reachable selects (KV-SWA-011, shift 1 for an EAGLE group). Fast path:
    when every spec group is full attention or has the scheduler block size, every chunk
    of every non-Mamba group is stored.""",
    source=f"{STORE} MooncakeStoreCoordinator.store_mask / _reachable_masks; "
           f"{STKV} SlidingWindowManager.reachable_block_mask",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_006 = rule(
    "KV-EXT-006",
    "What store_mask stored is sufficient for the hits it was stored for",
    """In a configuration without Mamba groups (KV-EXT-008), without a sliding window of 1
    outside EAGLE (KV-EXT-011) and without an EAGLE sliding window whose block is smaller
    than the scheduler block (KV-EXT-012), a store holding exactly the chunks
    store_mask(A) marks for a prompt answers, for every aligned bound L <= A, the same hit
    as a store holding every chunk of the prompt's first A tokens.""",
    source=f"{STORE} MooncakeStoreCoordinator.store_mask (docstring: so a future cache hit can "
           "consume it)",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_007 = rule(
    "KV-EXT-007",
    "lookup_mask marks the aligned hit boundaries of every group",
    """lookup_mask(A) is the dense reachability of KV-EXT-005 without excluding Mamba: every
    chunk of full, chunked local and Mamba groups, the reachable tail blocks of a sliding
    window. (vLLM 0.33.0 has lookup_mask; the seed coordinator did not.)""",
    source=f"{STORE} MooncakeStoreCoordinator.lookup_mask",
    chapter=CHAPTER,
    judged_by=("external-store",),
)
KV_EXT_008 = rule(
    "KV-EXT-008",
    "store_mask never writes a Mamba chunk",
    """vLLM 0.33.0's store_mask marks no chunk of a Mamba group: Mamba state is written only
    through the connector's pinned boundary hand-off, because an align-mode Mamba block
    table is not append-only. The seed's store_mask tiled a per-segment template that kept
    the last Mamba block of each segment. By the natural definition (KV-EXT-005) those
    chunks are reachable; kvoracle specifies the engine's answer, and KV-EXT-006 holds
    only without Mamba.""",
    source=f"{STORE} MooncakeStoreCoordinator.store_mask (exclude_mamba=True)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)
KV_EXT_009 = rule(
    "KV-EXT-009",
    "The store coordinator drops the EAGLE block in marked groups even with EAGLE off",
    """vLLM 0.33.0's store coordinator gives every group marked is_eagle_group the EAGLE drop
    whether or not use_eagle is set; the local coordinator drops only when EAGLE dropping is
    on (drop_eagle_group_ids is empty otherwise, e.g. with disable_eagle_block_drop or
    lookahead hashes). With marked groups and use_eagle False the store's hit can be shorter
    than the local hit, and its store_mask shifts sliding-window tails by one block. kvoracle
    keeps KV-EXT-001 (the local coordinator's drop).""",
    source=f"{STORE} MooncakeStoreCoordinator._verify_and_split_kv_cache_groups "
           "(StoreSpecGroup(..., g.is_eagle_group)); vllm/v1/core/kv_cache_coordinator.py "
           "KVCacheCoordinator.__init__ (drop_eagle_group_ids)",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)
KV_EXT_010 = rule(
    "KV-EXT-010",
    "With partial hash hits the store answers hits it cannot load",
    """With enable_partial_hash_hits, vLLM 0.33.0's store coordinator trims a full-attention
    group found at a longer block boundary to a shorter hash boundary that another group
    chose, exactly as the local coordinator does; locally the longer block serves the
    shorter hit, but the store holds no object under the shorter boundary's key, so the
    answer breaks KV-EXT-002 (vLLM issue #50359, fixed after 0.33.0 by revalidating the
    boundary). kvoracle keeps KV-EXT-002.""",
    source=f"{STORE} MooncakeStoreCoordinator._find_hit_blocks (curr_hit_length = min(...) for a "
           "looked-up full-attention group); vLLM PR #50359",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)

KV_EXT_011 = rule(
    "KV-EXT-011",
    "A sliding window of 1 is never stored",
    """With window 1 and no EAGLE a sliding-window hit needs zero blocks by
    cdiv(window - 1, block_size), so reachable_block_mask keeps no block of the group and
    store_mask writes none; yet the finder still needs the last block before the hit
    (KV-SWA-003). A store filled only through store_mask therefore never serves a hit to a
    configuration with such a group. By the natural definition (KV-EXT-005) the last block
    of each aligned segment is reachable; kvoracle specifies the engine's answer, and
    KV-EXT-006 holds only without such a group.""",
    source=f"{STKV} SlidingWindowManager.reachable_block_mask / _contiguous_blocks_for_hit; "
           f"{STORE} MooncakeStoreCoordinator.store_mask",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)
KV_EXT_012 = rule(
    "KV-EXT-012",
    "An EAGLE sliding window finer than the alignment can miss what store_mask kept",
    """store_mask keeps the sliding-window blocks the declarative acceptance reads
    (KV-SWA-011). With EAGLE and a window block size smaller than the scheduler block size,
    the engine's finder rounds down twice (KV-SWA-010) and the loop may need a block the
    mask skipped, so a store holding exactly store_mask(A) can answer a shorter hit than a
    fully stored prompt (example: windows of 1 with block sizes 1 and 2, EAGLE, A = 4: the
    bound 4 hits 0 instead of 2). kvoracle specifies the engine's masks and exempts these
    configurations from KV-EXT-006.""",
    source=f"{STKV} SlidingWindowManager.reachable_block_mask and find_longest_cache_hit; "
           f"{STORE} MooncakeStoreCoordinator.store_mask",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)
KV_EXT_013 = rule(
    "KV-EXT-013",
    "With one spec group the store skips the EAGLE look-ahead",
    """When all of a model's KV-cache groups share one spec (one spec group, several groups:
    e.g. a target and a draft group with equal specs), vLLM 0.33.0's store coordinator looks
    the spec group up directly at max_length and drops the EAGLE block, without the
    look-ahead of min(bound + block_size, hashed tokens) that the local
    HybridKVCacheCoordinator's loop gives it (KV-HYB-007). With a bound below the hashed
    tokens the store's hit is one block shorter than the local hit (example: three full
    attention groups of block 1, EAGLE, a 2-token prompt fully stored, bound 1: the store
    answers 0, the local coordinator 1). Where both answer the same hit, the store's masks
    keep the null entries of its one lookup with the drop, which the local loop's second
    lookup (without the drop) would not (an EAGLE window of 1, KV-EXT-003). kvoracle keeps
    KV-EXT-001 and KV-EXT-003. (With exactly one
    KV-cache group the local coordinator is the unitary one, which has no look-ahead
    either.)""",
    source=f"{STORE} MooncakeStoreCoordinator._find_hit_blocks (len(self.attention_groups) == 1 "
           "branch); vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator.find_longest_cache_hit "
           "(eagle_margin), get_kv_cache_coordinator",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)
KV_EXT_014 = rule(
    "KV-EXT-014",
    "With EAGLE, a window of 1 loads a block the lookup never checked",
    """With EAGLE a sliding window of 1 needs only its peek block at the hit end: the hit's
    entries of that group are all null and the lookup's mask is all False. load_mask(hashes,
    L), recomputed without the drop, marks the block before L (the scan needs one block,
    KV-SWA-003), which the lookup never checked and the store may not hold (KV-EXT-002).
    kvoracle keeps KV-EXT-003: the group loads nothing. The suite charges a load mask that
    marks exactly the block before L in such a group to this rule.""",
    source=f"{STORE} MooncakeStoreCoordinator.load_mask (apply_eagle=False) and find_longest_cache_hit; "
           f"{STKV} SlidingWindowManager._contiguous_blocks_for_hit",
    chapter=CHAPTER,
    kind="divergence",
    judged_by=("external-store",),
)

@icontract.require(lambda eagle_flags: len(eagle_flags) > 0, enabled=ENABLED)
@icontract.ensure(lambda result, eagle_flags: len(result) == len(eagle_flags), enabled=ENABLED)
@icontract.ensure(lambda result, use_eagle: use_eagle or not any(result), enabled=ENABLED)
@defines(KV_EXT_001)
def local_eagle_groups(eagle_flags: tuple[bool, ...], use_eagle: bool) -> tuple[bool, ...]:
    """Which groups the local coordinator gives the EAGLE drop: the marked ones (every group
    when none is marked), and none when EAGLE dropping is off."""
    if not use_eagle:
        return tuple(False for _ in eagle_flags)
    if not any(eagle_flags):
        return tuple(True for _ in eagle_flags)
    return tuple(eagle_flags)


@icontract.require(lambda eagle_flags: len(eagle_flags) > 0, enabled=ENABLED)
@icontract.ensure(lambda result, eagle_flags: len(result) == len(eagle_flags), enabled=ENABLED)
@icontract.ensure(lambda result, eagle_flags: all(r or not f for r, f in zip(result, eagle_flags)),
                  enabled=ENABLED)
@defines(KV_EXT_009)
def store_eagle_groups(eagle_flags: tuple[bool, ...], use_eagle: bool) -> tuple[bool, ...]:
    """Which groups vLLM 0.33.0's store coordinator gives the EAGLE drop: every marked group,
    and every group when none is marked and EAGLE is on."""
    if use_eagle and not any(eagle_flags):
        return tuple(True for _ in eagle_flags)
    return tuple(eagle_flags)


@icontract.require(lambda chunk: chunk >= 0, enabled=ENABLED)
@icontract.require(lambda block_size, hash_block_size:
                   hash_block_size > 0 and block_size > 0 and block_size % hash_block_size == 0,
                   enabled=ENABLED)
@icontract.require(lambda chunk, block_size, hit_length: 0 <= chunk * block_size < hit_length,
                   "the chunk lies in the hit", enabled=ENABLED)
@icontract.require(lambda hit_length, hash_block_size: hit_length % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result: result >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, chunk, block_size, hash_block_size:
                  result <= (chunk + 1) * (block_size // hash_block_size) - 1, enabled=ENABLED)
@icontract.ensure(lambda result, chunk, block_size, hash_block_size:
                  result >= chunk * (block_size // hash_block_size), enabled=ENABLED)
@defines(KV_EXT_002)
def chunk_key_index(chunk: int, block_size: int, hash_block_size: int, hit_length: int) -> int:
    """The request hash index under which chunk ``chunk`` of a group is fetched for a hit of
    ``hit_length`` tokens: the hash that ends the chunk, or ends the hit inside it."""
    return min((chunk + 1) * block_size, hit_length) // hash_block_size - 1


@defines(KV_EXT_014)
def reads_no_block(kind: str, param: int, eagle: bool) -> bool:
    """Whether a group's hits read no block at all: an EAGLE sliding window of 1, whose
    lookup checks only the peek block past the hit and drops it."""
    return kind == hybrid.SLIDING_WINDOW and param == 1 and eagle


@icontract.require(lambda kind, param: kind in hybrid.LOOKUP_KINDS and hybrid._param_ok(kind, param),
                   enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda hit_length, block_size: hit_length >= 0 and hit_length % block_size == 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, hit_length, block_size: len(result) == hit_length // block_size,
                  enabled=ENABLED)
@icontract.ensure(lambda result, kind, param, eagle:
                  len(result) == 0 or result[-1] or kind == hybrid.CHUNKED_LOCAL or reads_no_block(kind, param, eagle),
                  "KV-EXT-004: the last block is loaded (a chunked local hit on a chunk boundary and an EAGLE "
                  "window of 1 read none)", enabled=ENABLED)
@icontract.ensure(lambda result, kind, param, eagle: not reads_no_block(kind, param, eagle) or not any(result),
                  "KV-EXT-014: an EAGLE window of 1 loads nothing", enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind != hybrid.FULL or all(result), enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind != hybrid.MAMBA or sum(result) == min(len(result), 1),
                  enabled=ENABLED)
@defines(KV_EXT_003, KV_EXT_004, KV_EXT_014)
def load_mask(kind: str, block_size: int, param: int, hit_length: int, eagle: bool = False) -> tuple[bool, ...]:
    """The chunks a group loads for a hit of ``hit_length`` tokens: its non-null hit entries
    (KV-HYB-013) at that length as the group's lookup left them (``eagle``: the group has
    the local coordinator's EAGLE drop). The drop is not applied again, since the hit is
    already pruned (KV-EXT-004); only which entries the lookup left null depends on it,
    and only for a sliding window of 1 (KV-EXT-014)."""
    num_blocks = hit_length // block_size
    nulls = hybrid.num_null_hit_blocks(kind, num_blocks, hit_length, eagle, block_size, param)
    return tuple(j >= nulls for j in range(num_blocks))



@icontract.require(lambda mask, present: len(mask) <= len(present), enabled=ENABLED)
@icontract.ensure(lambda result, mask: result or any(mask), enabled=ENABLED)
@defines(KV_EXT_002)
def is_loadable(mask: tuple[bool, ...], present: tuple[bool, ...]) -> bool:
    """Whether every chunk ``mask`` asks for is present (``present[i]``: the key chunk ``i``
    is fetched under exists)."""
    return all(present[i] for i, wanted in enumerate(mask) if wanted)


@icontract.require(lambda kinds, block_sizes: len(kinds) == len(block_sizes) > 0, enabled=ENABLED)
@icontract.require(lambda block_sizes, alignment: alignment > 0 and all(
    b > 0 and alignment % b == 0 for b in block_sizes), enabled=ENABLED)
@icontract.ensure(lambda result, block_sizes, alignment: result or any(b != alignment for b in block_sizes),
                  enabled=ENABLED)
@defines(KV_EXT_005)
def store_fast_path(kinds: tuple[str, ...], block_sizes: tuple[int, ...], alignment: int) -> bool:
    """Whether every group is full attention or has the scheduler block size: then each
    block ends an aligned segment and every chunk is stored."""
    return all(kind == hybrid.FULL or size == alignment for kind, size in zip(kinds, block_sizes))


def _reachable(kind: str, block_index: int, block_size: int, param: int, eagle: bool,
               alignment: int) -> bool:
    if kind != hybrid.SLIDING_WINDOW:
        return True
    need = sliding_window.contiguous_blocks_needed(param, block_size, eagle)
    return sliding_window.block_is_reachable(block_index, need, block_size, alignment, eagle)


@icontract.require(lambda kind, param: kind in hybrid.LOOKUP_KINDS and hybrid._param_ok(kind, param),
                   enabled=ENABLED)
@icontract.require(lambda block_size, alignment: block_size > 0 and alignment % block_size == 0 < alignment,
                   enabled=ENABLED)
@icontract.require(lambda start_block, end_block: 0 <= start_block <= end_block, enabled=ENABLED)
@icontract.ensure(lambda result, start_block, end_block: len(result) == end_block - start_block,
                  enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind != hybrid.MAMBA or not any(result),
                  "KV-EXT-008: no Mamba chunk is stored", enabled=ENABLED)
@icontract.ensure(lambda result, kind, block_size, alignment, param, eagle:
                  kind == hybrid.MAMBA or block_size != alignment or all(result)
                  or (kind == hybrid.SLIDING_WINDOW and param == 1 and not eagle and not any(result)),
                  "KV-EXT-005: the fast path stores every chunk (KV-EXT-011: none for window 1)",
                  enabled=ENABLED)
@defines(KV_EXT_005, KV_EXT_008, KV_EXT_011)
def store_mask(kind: str, block_size: int, param: int, eagle: bool, alignment: int,
               start_block: int, end_block: int) -> tuple[bool, ...]:
    """Which of a group's chunks ``start_block .. end_block - 1`` a request writes."""
    if kind == hybrid.MAMBA:
        return tuple(False for _ in range(start_block, end_block))
    return tuple(_reachable(kind, i, block_size, param, eagle, alignment) for i in range(start_block, end_block))


@icontract.require(lambda kind, param: kind in hybrid.LOOKUP_KINDS and hybrid._param_ok(kind, param),
                   enabled=ENABLED)
@icontract.require(lambda block_size, alignment: block_size > 0 and alignment % block_size == 0 < alignment,
                   enabled=ENABLED)
@icontract.require(lambda num_blocks: num_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_blocks: len(result) == num_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind == hybrid.SLIDING_WINDOW or all(result), enabled=ENABLED)
@defines(KV_EXT_007)
def lookup_mask(kind: str, block_size: int, param: int, eagle: bool, alignment: int,
                num_blocks: int) -> tuple[bool, ...]:
    """Which of a group's first ``num_blocks`` chunks are looked up as hit boundaries."""
    return tuple(_reachable(kind, i, block_size, param, eagle, alignment) for i in range(num_blocks))


def _sufficient_args(groups: tuple[hybrid.SpecGroup, ...], stored: tuple[tuple[bool, ...], ...],
                     aligned_length: int, alignment: int) -> bool:
    return (hybrid._check_groups(groups, stored, alignment) and aligned_length >= 0
            and aligned_length % alignment == 0
            and all(len(flags) == aligned_length // size for (_, size, _, _), flags in zip(groups, stored)))


@icontract.require(lambda groups, stored, aligned_length, alignment:
                   _sufficient_args(groups, stored, aligned_length, alignment), enabled=ENABLED)
@defines(KV_EXT_006)
def store_is_sufficient(groups: tuple[hybrid.SpecGroup, ...], stored: tuple[tuple[bool, ...], ...],
                        aligned_length: int, alignment: int) -> bool:
    """Whether a store holding ``stored`` (per spec group, which of the prompt's first
    ``aligned_length`` tokens' chunks exist) answers every aligned bound ``L <=
    aligned_length`` as a store holding every chunk does."""
    everything = tuple(tuple(True for _ in flags) for flags in stored)
    for bound in range(0, aligned_length + 1, alignment):
        got = hybrid.fixed_point(groups, stored, bound, aligned_length, alignment)[0]
        want = hybrid.fixed_point(groups, everything, bound, aligned_length, alignment)[0]
        if got != want:
            return False
    return True


@icontract.require(lambda groups, cached, alignment: hybrid._check_groups(groups, cached, alignment),
                   enabled=ENABLED)
@icontract.require(lambda max_length, num_hashed_tokens: max_length >= 0 and num_hashed_tokens >= 0,
                   enabled=ENABLED)
@icontract.require(lambda groups, cached, num_hashed_tokens: all(
    len(flags) == num_hashed_tokens // size for (_, size, _, _), flags in zip(groups, cached)), enabled=ENABLED)
@icontract.ensure(lambda result, max_length, alignment: 0 <= result <= max_length and result % alignment == 0,
                  enabled=ENABLED)
@defines(KV_EXT_001)
def external_hit(groups: tuple[hybrid.SpecGroup, ...], cached: tuple[tuple[bool, ...], ...],
                 max_length: int, num_hashed_tokens: int, alignment: int) -> int:
    """The hit an external store answers: the local hybrid loop over the store's flags
    (``groups`` carry the local coordinator's EAGLE drop, :func:`local_eagle_groups`)."""
    return hybrid.fixed_point(groups, cached, max_length, num_hashed_tokens, alignment)[0]
