"""Properties of chapter 14's functions (spec/prefix_tree.py), each against a statement of its own
or a worked example; the functions' contracts are armed while they run."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoracle.spec import prefix_tree as spec

PAGE = st.integers(1, 4)
#: No deadline: the functions' contracts run armed, and a busy machine must not fail a property.
UNTIMED = settings(deadline=None)


@UNTIMED
@given(st.integers(-2, 12), st.integers(0, 12), st.integers(0, 12), PAGE)
def test_an_aligned_hit_is_a_whole_page_prefix_with_a_slot_per_token(hit, slots, tokens, page) -> None:
    assert spec.is_aligned_hit(hit, slots, tokens, page) == (0 <= hit <= tokens and hit % page == 0 and slots == hit)


@UNTIMED
@given(st.lists(st.booleans(), max_size=8).map(tuple), st.integers(0, 40), PAGE)
def test_the_longest_held_prefix_is_the_first_run_of_held_pages(held, tokens, page) -> None:
    pages = min(len(held), tokens // page)
    run = next((j for j in range(pages) if not held[j]), pages)
    assert spec.longest_held_prefix(held, tokens, page) == run * page


def test_misread_and_foreign_positions() -> None:
    tokens = (5, 6, 7)
    right = ((1, (5,)), (1, (5, 6)), (1, (5, 6, 7)))
    assert spec.misread_positions(right, 1, tokens) == ()
    assert spec.misread_positions(((1, (5,)), (2, (5, 6)), (1, (5, 9))), 1, tokens) == (1, 2)
    assert spec.foreign_positions((1, 2, 1, 3), 1) == (1, 3)
    assert spec.foreign_positions((), 1) == ()


@st.composite
def _forests(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[int, ...], tuple[int, ...]]:
    size = draw(st.integers(0, 7))
    parents = tuple(draw(st.integers(-1, i - 1)) for i in range(size))
    held = tuple(draw(st.booleans()) for _ in range(size))
    stamps = tuple(draw(st.integers(0, 5)) for _ in range(size))
    locks = tuple(draw(st.sampled_from([0, 0, 0, 1])) for _ in range(size))
    return parents, held, stamps, locks


@UNTIMED
@given(_forests())
def test_prefix_closed_means_no_held_page_under_a_missing_one(forest) -> None:
    parents, held, _, _ = forest
    orphan = any(h and p >= 0 and not held[p] for p, h in zip(parents, held))
    assert spec.is_prefix_closed(parents, held) == (not orphan)


@UNTIMED
@given(_forests())
def test_the_lru_order_removes_exactly_the_pages_without_locks_below(forest) -> None:
    parents, _, stamps, locks = forest
    order = spec.lru_leaf_order(parents, stamps, locks)

    def locked_below(i: int) -> bool:
        return locks[i] > 0 or any(parents[c] == i and locked_below(c) for c in range(len(parents)))

    assert set(order) == {i for i in range(len(parents)) if not locked_below(i)}
    assert spec.removes_an_lru_prefix(order[:2][::-1], order)
    if len(order) > 1:
        assert not spec.removes_an_lru_prefix((order[1],), order)


def test_lru_order_worked_example() -> None:
    # 0 -> 1 -> 2 and 0 -> 3; page 2 is the oldest leaf, then 1 becomes a leaf older than 3.
    assert spec.lru_leaf_order((-1, 0, 1, 0), (9, 2, 1, 5), (0, 0, 0, 0)) == (2, 1, 3, 0)
    assert spec.lru_leaf_order((-1, 0, 1, 0), (9, 2, 1, 5), (0, 0, 1, 0)) == (3,)


@UNTIMED
@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))
def test_eviction_promise(asked, evictable, removed, reported) -> None:
    assert spec.evicted_enough(asked, evictable, removed, reported) == (
        min(asked, evictable) <= removed <= evictable and reported == removed)


@UNTIMED
@given(st.lists(st.integers(0, 3), max_size=6).map(tuple))
def test_no_locked_page_is_evicted(locks) -> None:
    assert spec.evicts_no_locked_page(locks) == (sum(locks) == 0)


@UNTIMED
@given(st.integers(0, 6), st.integers(0, 6), st.sampled_from(spec.RECENCY_MODES))
def test_pages_stamped(hit, after, recency) -> None:
    stamped = spec.pages_stamped(hit, after, recency)
    assert stamped == (hit + after if recency == spec.SEGMENT_RECENCY and hit else hit)


@UNTIMED
@given(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 30))
def test_capacity_balances(free, cached, requests, capacity) -> None:
    assert spec.capacity_balances(free, cached, requests, capacity) == (free + cached + requests == capacity)


@UNTIMED
@given(st.dictionaries(st.tuples(st.integers(0, 2), st.integers(0, 3)), st.tuples(st.integers(0, 9)), max_size=5),
       st.randoms(use_true_random=False))
def test_same_content_ignores_order_and_catches_any_change(pages, random) -> None:
    listing = tuple(pages.items())
    shuffled = list(listing)
    random.shuffle(shuffled)
    assert spec.same_content(listing, tuple(shuffled))
    if listing:
        key, slots = listing[0]
        assert not spec.same_content(listing, (*listing, (key, slots)))  # a page listed twice
        assert not spec.same_content(listing, listing[1:])  # a page missing
        assert not spec.same_content(listing, ((key, (slots[0] + 1,)), *listing[1:]))  # moved slots


@UNTIMED
@given(st.lists(st.integers(0, 3), max_size=6).map(tuple), PAGE)
def test_cache_sizes_split_by_lock(locks, page) -> None:
    evictable, protected = spec.cache_sizes(locks, page)
    assert protected == page * sum(1 for c in locks if c) and evictable == page * sum(1 for c in locks if not c)


@UNTIMED
@given(st.lists(st.integers(0, 3), max_size=6).map(tuple), st.integers(0, 30), PAGE)
def test_a_lock_counts_once_on_each_page_of_its_path(counts, hit, page) -> None:
    after = spec.locked_counts(counts, hit, page)
    assert after == tuple((counts[j] if j < len(counts) else 0) + 1 for j in range(hit // page))


def test_first_invalid_tree_parameter() -> None:
    for page_size, num_pages in itertools.product((-1, 0, 1, 4), (-1, 0, 1, 8)):
        want = "page_size" if page_size < 1 else "num_pages" if num_pages < 1 else ""
        assert spec.first_invalid_tree_parameter(page_size, num_pages) == want


# -- a window component (KV-TREE-016 .. 021) -------------------------------------------------------
WINDOW = st.integers(1, 9)


@UNTIMED
@given(WINDOW, PAGE)
def test_window_pages_is_the_pages_a_window_overlaps(window, page) -> None:
    pages = spec.window_pages(window, page)
    # A page-aligned end: the window's first token lies in the pages-th page back, never earlier.
    assert (pages - 1) * page < window <= pages * page


@UNTIMED
@given(st.lists(st.booleans(), max_size=8).map(tuple), WINDOW, PAGE, st.data())
def test_window_hit_ok_reads_the_last_window_tokens_pages(windowed, window, page, data) -> None:
    pages = data.draw(st.integers(0, len(windowed)))
    ok = spec.window_hit_ok(windowed, pages * page, window, page)
    # Token by token: every token among the last min(h, window) lies in a page holding window KV.
    hit = pages * page
    tokens_ok = all(windowed[t // page] for t in range(max(0, hit - window), hit))
    assert ok == tokens_ok


@UNTIMED
@given(st.lists(st.booleans(), max_size=8).map(tuple), WINDOW, PAGE, st.data())
def test_longest_windowed_hit_is_the_greatest_usable_length(windowed, window, page, data) -> None:
    held = data.draw(st.integers(0, len(windowed))) * page
    hit = spec.longest_windowed_hit(windowed, held, window, page)
    usable = [h for h in range(0, held + 1, page) if spec.window_hit_ok(windowed, h, window, page)]
    assert hit == max(usable)
    if all(windowed[:held // page]):
        assert hit == held  # no window KV missing: KV-TREE-003's hit


def test_longest_windowed_hit_examples() -> None:
    # Window 2, page 2: page 1 lacks its window KV, so a hit may end after page 0 or after page 3.
    assert spec.longest_windowed_hit((True, False, True, True), 8, 2, 2) == 8
    assert spec.longest_windowed_hit((True, False, True, False), 6, 2, 2) == 6
    assert spec.longest_windowed_hit((True, False, False), 6, 3, 2) == 2
    assert spec.longest_windowed_hit((False, False), 4, 1, 2) == 0


@UNTIMED
@given(st.integers(0, 10), WINDOW, PAGE)
def test_window_locked_pages_are_the_hits_last_pages(pages, window, page) -> None:
    locked = spec.window_locked_pages(pages * page, window, page)
    assert locked == tuple(range(pages - len(locked), pages))
    assert len(locked) == min(pages, spec.window_pages(window, page))


@UNTIMED
@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))
def test_window_eviction_ok(asked, evictable, dropped) -> None:
    ok = spec.window_eviction_ok(asked, evictable, dropped, dropped, 0, 0)
    assert ok == (min(asked, evictable) <= dropped <= evictable)
    assert not spec.window_eviction_ok(asked, evictable, dropped, dropped + 1, 0, 0)  # misreported
    assert not spec.window_eviction_ok(asked, evictable, dropped, dropped, 1, 0)  # a locked window dropped
    assert not spec.window_eviction_ok(asked, evictable, dropped, dropped, 0, 1)  # an inner page removed


@UNTIMED
@given(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9))
def test_window_slots_balance(free, windowed, requests, account) -> None:
    capacity = free + windowed + requests
    assert spec.window_slots_balance(free, windowed, requests, capacity, account) == (account == windowed)
    assert not spec.window_slots_balance(free, windowed, requests, capacity + 1, windowed)


# -- a state component (KV-TREE-022 .. 027) --------------------------------------------------------
STATES = st.lists(st.booleans(), max_size=8).map(tuple)


@UNTIMED
@given(STATES, PAGE, st.data())
def test_a_state_hit_ends_at_a_page_holding_a_state(states, page, data) -> None:
    pages = data.draw(st.integers(0, len(states)))
    assert spec.state_hit_ok(states, pages * page, page) == (pages == 0 or states[pages - 1])


@UNTIMED
@given(STATES, PAGE, st.data())
def test_longest_state_hit_is_the_last_state_within_the_held_prefix(states, page, data) -> None:
    held = data.draw(st.integers(0, len(states))) * page
    hit = spec.longest_state_hit(states, held, page)
    assert hit == max(h for h in range(0, held + 1, page) if spec.state_hit_ok(states, h, page))
    if held and states[held // page - 1]:
        assert hit == held  # the held prefix ends at a state: KV-TREE-003's hit


def test_longest_state_hit_examples() -> None:
    # Pages of 2: states after pages 0 and 2; a held prefix of four pages hits three of them.
    assert spec.longest_state_hit((True, False, True, False), 8, 2) == 6
    assert spec.longest_state_hit((True, False, True, False), 4, 2) == 2
    assert spec.longest_state_hit((False, False), 4, 2) == 0


@UNTIMED
@given(st.integers(0, 10), PAGE)
def test_a_lock_protects_its_paths_last_state_only(pages, page) -> None:
    assert spec.state_locked_pages(pages * page, page) == ((pages - 1,) if pages else ())


def test_state_removals_ok_examples() -> None:
    # A chain 0 <- 1 <- 2, a state on page 2 only: dropping it may take the stateless pages above it.
    parents, states = (-1, 0, 1), (False, False, True)
    assert spec.state_removals_ok(parents, states, (2,), (2,))
    assert spec.state_removals_ok(parents, states, (1, 2), (2,))
    assert not spec.state_removals_ok(parents, states, (1,), ())  # a stateless leaf with no dropped state below
    assert not spec.state_removals_ok(parents, (False, True, True), (1, 2), (2,))  # page 1's state, not dropped
    assert spec.state_removals_ok(parents, states, (), ())


@UNTIMED
@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))
def test_state_eviction_ok(asked, evictable, dropped) -> None:
    ok = spec.state_eviction_ok(asked, evictable, dropped, dropped, 0, 0, 0)
    assert ok == (min(asked, evictable) <= dropped <= evictable)
    assert not spec.state_eviction_ok(asked, evictable, dropped, dropped + 1, 0, 0, 0)  # misreported
    assert not spec.state_eviction_ok(asked, evictable, dropped, dropped, 1, 0, 0)  # a locked state dropped
    assert not spec.state_eviction_ok(asked, evictable, dropped, dropped, 0, 1, 0)  # an inner page removed
    assert not spec.state_eviction_ok(asked, evictable, dropped, dropped, 0, 0, 1)  # a stray page removed


@UNTIMED
@given(st.integers(0, 12), PAGE, st.booleans())
def test_an_insertion_leaves_a_state_at_its_last_full_page(tokens, page, had) -> None:
    assert spec.insertion_leaves_state(tokens, page) == (tokens >= page)
    assert spec.insertion_adopts_state(had) == (not had)


@UNTIMED
@given(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.integers(0, 9))
def test_state_slots_balance(free, held, requests, ends) -> None:
    capacity = free + held + requests
    protected = min(ends, held)
    assert spec.state_slots_balance(free, held, requests, capacity, held - protected, protected, protected)
    assert not spec.state_slots_balance(free, held, requests, capacity + 1, held - protected, protected, protected)
    assert not spec.state_slots_balance(free, held, requests, capacity, held - protected + 1, protected, protected)
    assert spec.state_slots_balance(free, held, requests, capacity, held - protected, protected,
                                    ends) == (protected == ends)


# -- the order of a component's evictions (KV-TREE-028 .. 030) -------------------------------------
def test_window_refresh_reach_is_one_page_longer_for_segments() -> None:
    assert spec.window_refresh_reach(5, 2, spec.PAGE_RECENCY) == 5
    assert spec.window_refresh_reach(5, 2, spec.SEGMENT_RECENCY) == 7


@UNTIMED
@given(st.lists(st.integers(1, 5), max_size=6).map(tuple), st.integers(0, 20))
def test_segments_reached_is_the_shortest_run_covering_the_reach(lengths, reach) -> None:
    covering = [k for k in range(len(lengths) + 1) if sum(lengths[:k]) >= reach]
    assert spec.segments_reached(lengths, reach) == (covering[0] if covering else len(lengths))


def test_segments_reached_examples() -> None:
    assert spec.segments_reached((2, 2, 2), 3) == 2  # the second segment starts inside the reach
    assert spec.segments_reached((2, 2, 2), 4) == 2  # two segments cover it exactly
    assert spec.segments_reached((2, 2, 2), 0) == 0
    assert spec.segments_reached((2, 2), 9) == 2  # a path shorter than the reach: all of it


@UNTIMED
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.booleans()), max_size=6))
def test_component_lru_order_is_the_candidates_oldest_first(pages) -> None:
    stamps, depths, candidates = (tuple(column) for column in zip(*pages, strict=True)) if pages else ((), (), ())
    order = spec.component_lru_order(stamps, depths, candidates)
    assert sorted(order) == [i for i, c in enumerate(candidates) if c]
    # Every candidate comes before each one with a later stamp, or an equal stamp and a deeper page.
    for a, b in itertools.permutations(order, 2):
        if (stamps[a], depths[a]) < (stamps[b], depths[b]):
            assert order.index(a) < order.index(b)


def test_component_lru_order_example() -> None:
    # Page 2 is no candidate; pages 0 and 3 share the oldest stamp, page 3 nearer the root.
    assert spec.component_lru_order((1, 5, 0, 1), (3, 1, 1, 2), (True, True, False, True)) == (3, 0, 1)


@UNTIMED
@given(st.permutations(range(5)), st.integers(0, 5), st.randoms())
def test_drops_an_order_prefix(order, count, random) -> None:
    order = tuple(order)
    prefix = list(order[:count])
    random.shuffle(prefix)
    assert spec.drops_an_order_prefix(tuple(prefix), order)  # in any order
    if 0 < count < len(order):
        skipped = [*prefix[:-1], order[count]]  # one page past the prefix instead of one in it
        assert not spec.drops_an_order_prefix(tuple(skipped), order)
    if count:
        assert not spec.drops_an_order_prefix((*prefix, prefix[0]), order)  # a page dropped twice
