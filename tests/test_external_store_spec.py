"""Property tests of the external-store chapter's functions (spec/external_store.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoracle.spec import external_store as ext
from kvoracle.spec import hybrid

SETTINGS = settings(max_examples=150, deadline=None)
flags = st.lists(st.booleans(), min_size=1, max_size=6).map(tuple)


@SETTINGS
@given(flags, st.booleans())
def test_local_eagle_groups_follow_the_local_coordinator(marks, use_eagle):
    got = ext.local_eagle_groups(marks, use_eagle)
    if not use_eagle:
        assert not any(got)
    elif any(marks):
        assert got == marks
    else:
        assert all(got)
    # KV-EXT-009: the store drops in marked groups even with EAGLE off.
    store = ext.store_eagle_groups(marks, use_eagle)
    assert store == (marks if any(marks) else tuple(use_eagle for _ in marks))


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 8), st.data())
def test_chunk_key_index_is_the_hash_ending_the_chunk_or_the_hit(hash_size, per, chunk, data):
    size = hash_size * per
    hit = hash_size * data.draw(st.integers(chunk * per + 1, chunk * per + 3 * per))
    index = ext.chunk_key_index(chunk, size, hash_size, hit)
    assert (index + 1) * hash_size == min((chunk + 1) * size, hit)


@SETTINGS
@given(st.sampled_from(hybrid.LOOKUP_KINDS), st.integers(1, 4), st.integers(1, 9), st.integers(0, 8), st.booleans())
def test_load_mask_is_the_non_null_entries_of_the_hit(kind, size, param, blocks, eagle):
    mask = ext.load_mask(kind, size, param, blocks * size, eagle)
    nulls = hybrid.num_null_hit_blocks(kind, blocks, blocks * size, eagle, size, param)
    assert mask == tuple(j >= nulls for j in range(blocks))
    if not ext.reads_no_block(kind, param, eagle):  # the drop changes the null entries of a window of 1 only
        assert mask == ext.load_mask(kind, size, param, blocks * size)
    assert ext.is_loadable(mask, tuple(True for _ in mask))
    if any(mask):
        assert not ext.is_loadable(mask, tuple(False for _ in mask))


@SETTINGS
@given(st.sampled_from(hybrid.LOOKUP_KINDS), st.integers(1, 3), st.integers(1, 4), st.integers(1, 9),
       st.booleans(), st.integers(0, 12))
def test_store_mask_is_reachability_without_mamba(kind, size, per, param, eagle, end):
    alignment = size * per
    stored = ext.store_mask(kind, size, param, eagle, alignment, 0, end)
    looked = ext.lookup_mask(kind, size, param, eagle, alignment, end)
    assert stored == (tuple(False for _ in looked) if kind == hybrid.MAMBA else looked)
    assert ext.store_mask(kind, size, param, eagle, alignment, min(2, end), end) == stored[min(2, end):]
    if ext.store_fast_path((kind,), (size,), alignment) and kind != hybrid.MAMBA and not (
            kind == hybrid.SLIDING_WINDOW and param == 1 and not eagle):
        assert all(stored)


@st.composite
def window_configs(draw):
    """Full attention and sliding windows (> 1), no EAGLE: KV-EXT-006's scope."""
    size = draw(st.sampled_from([1, 2]))
    groups = [("full", size, 0, False)]
    for _ in range(draw(st.integers(1, 2))):
        groups.append(("sliding_window", size * draw(st.sampled_from([1, 2])), draw(st.integers(2, 7)), False))
    alignment = hybrid.scheduler_block_size(tuple(g[1] for g in groups))
    aligned = alignment * draw(st.integers(0, 3))
    return tuple(groups), alignment, aligned


@SETTINGS
@given(window_configs())
def test_what_store_mask_keeps_is_sufficient(config):
    groups, alignment, aligned = config
    stored = tuple(ext.store_mask(kind, size, param, eagle, alignment, 0, aligned // size)
                   for kind, size, param, eagle in groups)
    assert ext.store_is_sufficient(groups, stored, aligned, alignment)
    hit = ext.external_hit(groups, stored, aligned, aligned, alignment)
    assert hit == aligned


def test_dropping_a_needed_chunk_is_insufficient():
    groups = (("full", 2, 0, False), ("sliding_window", 1, 3, False))
    stored = ((True, True), (True, True, True, True))
    assert ext.store_is_sufficient(groups, stored, 4, 2)
    assert not ext.store_is_sufficient(groups, ((True, False), stored[1]), 4, 2)


def test_kv_ext_012_example():
    groups = (("sliding_window", 1, 1, True), ("sliding_window", 2, 1, True))
    stored = tuple(ext.store_mask(k, s, p, e, 2, 0, 4 // s) for k, s, p, e in groups)
    assert not ext.store_is_sufficient(groups, stored, 4, 2)


def test_an_eagle_window_of_one_loads_nothing():
    # KV-EXT-014: the lookup checked only the peek block past the hit and dropped it; without
    # the drop the scan would need the block before the hit (KV-SWA-003).
    assert ext.load_mask(hybrid.SLIDING_WINDOW, 2, 1, 8, eagle=True) == (False,) * 4
    assert ext.load_mask(hybrid.SLIDING_WINDOW, 2, 1, 8) == (False, False, False, True)
    assert ext.reads_no_block(hybrid.SLIDING_WINDOW, 1, True)
    assert not ext.reads_no_block(hybrid.SLIDING_WINDOW, 2, True)
    assert not ext.reads_no_block(hybrid.SLIDING_WINDOW, 1, False)
