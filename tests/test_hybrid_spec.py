"""Properties of the attention-type chapters and of the hybrid fixed point (issue 3).

The central claims: the fixed-point loop returns the declarative hybrid hit
(KV-HYB-003) -- exactly without EAGLE, and with EAGLE once the two named engine
differences (KV-SWA-010, KV-HYB-009) are removed and no window is 1 (KV-SWA-003);
the candidate only decreases and the loop is bounded (KV-HYB-004); and each
per-type finder answers what its chapter says.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoracle.spec import chunked_local, cross_attention, hybrid, mamba, sliding_window
from kvoracle.spec.full_attention import aligned_hit_length

flags = st.lists(st.booleans(), max_size=12).map(tuple)


# ---------------------------------------------------------------- sliding window


def test_window_example_block_4_window_8() -> None:
    """Seed 002: block size 4, window 8 -> [NULL, NULL, b7, b8] (cdiv(7, 4) = 2 blocks)."""
    cached = (False, False, True, True)
    assert sliding_window.contiguous_blocks_needed(8, 4, False) == 2
    assert sliding_window.hit_length(cached, 16, 4, 8, False, 4) == 16


def test_window_needs_cdiv_window_minus_one() -> None:
    """KV-SWA-001: window 5, block 4 needs cdiv(4, 4) = 1 block, not cdiv(5, 4) = 2."""
    assert sliding_window.contiguous_blocks_needed(5, 4, False) == 1
    assert sliding_window.hit_length((False, False, True), 12, 4, 5, False, 4) == 12


def test_window_one_needs_the_last_block() -> None:
    """KV-SWA-003: window 1 needs 0 blocks naturally, but the scan needs the last one."""
    assert sliding_window.contiguous_blocks_needed(1, 4, False) == 0
    assert sliding_window.hit_length((True, True, False), 12, 4, 1, False, 4) == 8
    assert sliding_window.hit_length((False, False, False), 12, 4, 1, False, 4) == 0


@settings(max_examples=400)
@given(cached=flags, max_length=st.integers(0, 60), block_size=st.sampled_from([1, 2, 4]),
       scale=st.sampled_from([1, 2, 4]), window=st.integers(1, 14), eagle=st.booleans())
def test_window_scan_is_greatest_accepted_except_kv_swa_010(
        cached: tuple[bool, ...], max_length: int, block_size: int, scale: int, window: int,
        eagle: bool) -> None:
    alignment = block_size * scale
    scan = sliding_window.hit_length(cached, max_length, block_size, window, eagle, alignment)
    best = sliding_window.greatest_accepted(cached, max_length, block_size, window, eagle, alignment)
    if not eagle or scale == 1:
        assert scan == best
    else:  # KV-SWA-010: conservative, never longer, at most one alignment unit shorter
        assert best - alignment <= scan <= best


@given(computed=st.integers(0, 100), window=st.integers(1, 20))
def test_skipped_tokens_leave_window_minus_one(computed: int, window: int) -> None:
    skipped = sliding_window.num_skipped_tokens(computed, window)
    assert computed - skipped == min(computed, window - 1)


def test_blocks_freed_right_to_left_up_to_first_null() -> None:
    """KV-SWA-007: table [null, b1, b2, b3, b4], 4 skipped blocks -> frees 3, 2, 1."""
    assert sliding_window.blocks_to_free((True, False, False, False, False), 4) == (3, 2, 1)
    assert sliding_window.blocks_to_free((False, False), 5) == (1, 0)


def test_reachable_blocks_are_segment_tails() -> None:
    """KV-SWA-011: 4 blocks per aligned segment, need 1 -> only each segment's last block."""
    reachable = [sliding_window.block_is_reachable(i, 1, 4, 16, False) for i in range(8)]
    assert reachable == [False, False, False, True, False, False, False, True]
    with_eagle = [sliding_window.block_is_reachable(i, 2, 4, 16, True) for i in range(8)]
    assert with_eagle == [False, False, False, True, True, False, False, True]
    assert all(sliding_window.block_is_reachable(i, 4, 4, 16, False) for i in range(8))


# ---------------------------------------------------------------- chunked local


def test_chunked_local_seed_examples() -> None:
    """Seed 002, chunk 8, block 4: max 15 -> [null, null, b3?]; max 16 -> 4 nulls."""
    assert chunked_local.hit_length((True, True, True, True), 15, 4, 8) == 12
    assert chunked_local.hit_length((True, True, False, True), 15, 4, 8) == 8
    assert chunked_local.num_null_blocks(15, 4, 8) == 2
    assert chunked_local.hit_length((False, False, False, False), 16, 4, 8) == 16
    assert chunked_local.num_skipped_tokens(13, 8) == 8
    assert chunked_local.num_skipped_tokens(8, 8) == 8
    assert chunked_local.num_skipped_tokens(7, 8) == 0


# ---------------------------------------------------------------- mamba and cross attention


@given(cached=flags, max_length=st.integers(0, 40), block_size=st.sampled_from([1, 2]),
       scale=st.sampled_from([1, 2, 4]))
def test_mamba_takes_the_last_aligned_state(cached: tuple[bool, ...], max_length: int,
                                            block_size: int, scale: int) -> None:
    alignment = block_size * scale
    result = mamba.hit_length(cached, max_length, block_size, alignment)
    candidates = [(i + 1) * block_size for i in range(min(max_length // block_size, len(cached)))
                  if cached[i] and ((i + 1) * block_size) % alignment == 0]
    assert result == max(candidates, default=0)


def test_cross_attention_sized_by_encoder_tokens() -> None:
    assert cross_attention.num_blocks_to_allocate(17, 8, 0) == 3
    assert cross_attention.num_blocks_to_allocate(17, 8, 3) == 0


# ---------------------------------------------------------------- hybrid


@st.composite
def hybrid_lookups(draw: st.DrawFn, eagle: bool | None = None, min_window: int = 1):
    """Spec groups, their cached blocks, the bound and the hashed tokens, all consistent."""
    hash_block_size = draw(st.sampled_from([1, 2]))
    kinds = draw(st.lists(st.sampled_from(hybrid.LOOKUP_KINDS), min_size=1, max_size=4))
    use_eagle = draw(st.booleans()) if eagle is None else eagle
    sizes = [hash_block_size * (draw(st.sampled_from([1, 2, 4])) if kind in (hybrid.FULL, hybrid.SLIDING_WINDOW)
                                else 1) for kind in kinds]
    alignment = hybrid.scheduler_block_size(tuple(sizes))
    groups = []
    for kind, size in zip(kinds, sizes):
        if kind == hybrid.SLIDING_WINDOW:
            groups.append((kind, size, draw(st.integers(min_window, 12)), use_eagle))
        elif kind == hybrid.CHUNKED_LOCAL:  # KV-CHUNK-003: alignment-sized blocks, no EAGLE
            groups.append((kind, alignment, alignment * draw(st.integers(1, 3)), False))
        else:
            groups.append((kind, size, 0, use_eagle))
    num_tokens = draw(st.integers(0, 40))
    hashed = num_tokens // hash_block_size * hash_block_size
    density = draw(st.sampled_from([0.5, 0.8, 1.0]))
    cached = tuple(tuple(draw(st.booleans()) if density < 1 else True for _ in range(hashed // size))
                   for _, size, _, _ in groups)
    return tuple(groups), cached, max(num_tokens - 1, 0), hashed, alignment


@settings(max_examples=500)
@given(case=hybrid_lookups(eagle=False))
def test_fixed_point_is_the_declarative_hit_without_eagle(case) -> None:
    """KV-HYB-003/004/005: without EAGLE vLLM's loop returns the declarative answer."""
    groups, cached, bound, hashed, alignment = case
    hit, lengths, uncached, lookups, _ = hybrid.fixed_point(groups, cached, bound, hashed, alignment)
    assert hit == hybrid.declarative_hit(groups, cached, bound, alignment)
    assert lookups <= len(groups) * (bound // alignment + 2)
    assert uncached >= 0 and all(length >= hit for length in lengths)


@settings(max_examples=500)
@given(case=hybrid_lookups(eagle=True, min_window=2))
def test_ideal_fixed_point_is_the_declarative_hit_with_eagle(case) -> None:
    """KV-HYB-003/007: with EAGLE, minus KV-SWA-010 and KV-HYB-009, the loop is exact."""
    groups, cached, bound, hashed, alignment = case
    hit = hybrid.fixed_point(groups, cached, bound, hashed, alignment, ideal=True)[0]
    assert hit == hybrid.declarative_hit(groups, cached, bound, alignment)


def test_kv_hyb_009_lets_a_hit_through_without_a_peek_block() -> None:
    """Found by the property above: vLLM's loop can return more than every group accepts."""
    groups = (("sliding_window", 2, 5, True), ("mamba", 1, 0, True), ("sliding_window", 1, 2, True))
    cached = (
        (True, False, True, True, True, True, False, False, True, True, True, False, True, False, False, True),
        (False, True, True, False, True, True, True, True, True, True, True, True, True, True, False, True, True,
         True, False, True, True, False, False, True, True, True, True, True, True, True, False, False, False),
        (True, False, True, True, True, True, True, False, True, True, False, True, True, True, True, True, False,
         False, False, False, False, False, True, True, False, True, True, True, False, True, True, True, True),
    )
    engine = hybrid.fixed_point(groups, cached, 32, 33, 2)[0]
    ideal = hybrid.fixed_point(groups, cached, 32, 33, 2, ideal=True)[0]
    assert ideal == hybrid.declarative_hit(groups, cached, 32, 2) == 0
    assert engine == 10


@given(case=hybrid_lookups(), extra=st.integers(0, 16))
def test_declarative_hit_is_monotone_in_the_bound(case, extra: int) -> None:
    """KV-FULL-005 lifted to hybrids: a larger bound never shortens the declarative hit."""
    groups, cached, bound, _, alignment = case
    assert hybrid.declarative_hit(groups, cached, bound, alignment) <= \
        hybrid.declarative_hit(groups, cached, bound + extra, alignment)


def test_simple_hybrid_is_one_pass() -> None:
    """KV-HYB-005: full + sliding window -> at most one lookup each."""
    groups = (("sliding_window", 2, 3, False), ("full", 2, 0, False))
    cached = ((True, False, True, True, True, False), (True, True, True, True, True, True))
    hit, _, _, lookups, _ = hybrid.fixed_point(groups, cached, 11, 12, 2)
    assert lookups == 2
    assert hit == hybrid.declarative_hit(groups, cached, 11, 2) == 10


def test_eagle_drops_once_per_candidate_not_every_pass() -> None:
    """KV-HYB-007 / vLLM #32802: two sliding-window specs plus full attention, all cached.

    Dropping on every pass would shrink the hit by a block per pass down to 0; the loop
    drops once: the hit is one block (the alignment) short of the bound.
    """
    groups = (("full", 2, 0, True), ("sliding_window", 2, 3, True), ("sliding_window", 2, 5, True))
    cached = tuple((True,) * 10 for _ in groups)
    hit = hybrid.fixed_point(groups, cached, 19, 20, 2)[0]
    assert hit == 18 == hybrid.declarative_hit(groups, cached, 19, 2)


def test_full_attention_aligned_hit_drops_then_aligns() -> None:
    """A full group of block 2 under alignment 4: run 5 blocks, drop 1 -> 8 tokens."""
    assert aligned_hit_length((True,) * 5 + (False,), 12, 2, True, 4) == 8
    assert aligned_hit_length((True,) * 5 + (False,), 12, 2, False, 4) == 8
    assert aligned_hit_length((True,) * 6, 12, 2, False, 4) == 12


def test_scheduler_block_size_is_the_lcm() -> None:
    assert hybrid.scheduler_block_size((4, 6)) == 12
    assert hybrid.scheduler_block_size((16, 16, 32)) == 32
    assert hybrid.lookup_order(("mamba", "full", "sliding_window", "full")) == (1, 3, 0, 2)


@given(computed=st.integers(0, 200), block_size=st.sampled_from([1, 2, 4]), scale=st.sampled_from([1, 2, 4]),
       eagle=st.booleans())
def test_hybrid_caches_the_aligned_prefix_plus_the_peek_block(computed: int, block_size: int, scale: int,
                                                              eagle: bool) -> None:
    """KV-HYB-010: with 37 computed tokens, alignment 16, block 8: 32, or 37 with EAGLE."""
    alignment = block_size * scale
    cacheable = hybrid.num_cacheable_tokens(computed, alignment, eagle, block_size)
    aligned = computed // alignment * alignment
    assert cacheable == (min(computed, aligned + block_size) if eagle and aligned else aligned)
    assert hybrid.num_cacheable_tokens(37, 16, True, 8) == 37
    assert hybrid.num_cacheable_tokens(37, 16, False, 8) == 32


@settings(max_examples=300)
@given(case=hybrid_lookups(min_window=2))
def test_per_group_hits_are_each_group_alone(case) -> None:
    """KV-HYB-011: a spec group's per-group hit is its own answer at the unshrunk bound, so
    with one spec group it equals the fixed point's hit. (Windows > 1: a window-1 EAGLE group
    re-checked without its peek block can shrink again, KV-SWA-003.)"""
    groups, cached, bound, hashed, alignment = case
    hits = hybrid.per_group_hits(groups, cached, bound, hashed, alignment)
    if len(groups) == 1:
        assert hits[0] == hybrid.fixed_point(groups, cached, bound, hashed, alignment)[0]
    assert all(hit % alignment == 0 and hit <= bound for hit in hits)


@given(tokens=st.integers(0, 64), held=st.integers(0, 8), hits=st.integers(0, 8), skipped=st.integers(0, 64))
def test_skipped_blocks_need_no_new_block(tokens: int, held: int, hits: int, skipped: int) -> None:
    """KV-SWA-009: block 4, window 8, 20 computed tokens -> 13 skipped, 3 null blocks."""
    assert sliding_window.num_new_blocks(24, 4, 0, 5, sliding_window.num_skipped_tokens(20, 8)) == 1
    assert sliding_window.num_new_blocks(24, 4, 0, 0, sliding_window.num_skipped_tokens(20, 8)) == 3
    needed = sliding_window.num_new_blocks(tokens, 4, held, hits, skipped)
    assert needed == max(-(-tokens // 4) - max(skipped // 4, held + hits), 0)


def test_reference_per_group_lookup_reports_each_groups_own_hit() -> None:
    """KV-HYB-011 on the reference: full attention stops at its first miss, the window and
    Mamba groups reach past it; each group's entries cover its own length."""
    from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
    from kvoracle.reference.kv_cache_spec import FullAttentionSpec, MambaSpec, SlidingWindowSpec
    from kvoracle.spec.hashing import NONE_HASH, hash_blocks

    specs = (FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=8), MambaSpec(4))
    coordinator = HybridCoordinator(HybridConfig(specs, 100, 100, 4, use_eagle=True))
    hashes = hash_blocks(NONE_HASH, list(range(33)), 0, 8, 4)
    for group_id in range(3):
        coordinator.seed_cache(hashes, group_id, [True, True, False, True, True, True, True, True])
    blocks, lengths = coordinator.find_longest_cache_hit_per_group(hashes, 32)
    # Full: blocks 0-1 then a miss, minus EAGLE's block. Window (need 2 + peek): blocks 5-7
    # with 7 dropped. Mamba: the last state, block 7, no drop (KV-MAMBA-002).
    assert lengths == (4, 28, 32)
    assert [sum(not b.is_null for b in group) for group in blocks] == [1, 2, 1]
    _, hit, _ = coordinator.find_longest_cache_hit(hashes, 32)
    assert hit == 4


@given(st.lists(st.sampled_from(hybrid.LOOKUP_KINDS), min_size=1, max_size=4).map(tuple))
def test_single_pass_is_exactly_two_spec_groups_one_of_them_full_attention(kinds) -> None:
    """KV-HYB-005: the loop stops after its first pass only with two spec groups, one full."""
    assert hybrid.single_pass(kinds) == (len(kinds) == 2 and hybrid.FULL in kinds)
