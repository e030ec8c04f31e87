"""Meta-tests of the window component (chapter 14, KV-TREE-016 .. 021) without SGLang: broken
trees built on the reference, each with one fault in its window KV, are convicted of the window
rule they break by a bounded suite run and on a written case that the reference passes."""

from __future__ import annotations

import pytest
from broken_tree_engines import (
    BROKEN_WINDOW,
    InsertKeepsTombstones,
    RefillMovesLockedPages,
    WindowBlindMatch,
    WindowEvictionIgnoresLocks,
    WindowEvictsOnePage,
    WindowMatchGivesUp,
    WindowSlotsLeak,
)
from tree_meta import assert_convicted

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.prefix_tree import Arrive, EvictWindow, Peek, ReferencePrefixTree, Serve, TreeSetup

PROMPT = (1, 2, 3, 4)


def _setup(window: int) -> TreeSetup:
    """Pages of one token, room for eight, one prompt of four tokens, a window of ``window``."""
    return TreeSetup(1, 8, (PROMPT,), window)


#: A written case per broken tree: the reference replays it clean, the broken tree fails it on its rule.
CASES = {
    # Window eviction drops the window KV of [1] and [1, 2] (oldest first, shorter first); a
    # lookup of [1, 2] then has no page whose window KV is held at its end: no hit.
    WindowBlindMatch: [_setup(1), Serve(1, 0), EvictWindow(2), Peek(2, 0, 0, 2)],
    # [1] is refreshed, so window eviction drops [1, 2]'s window KV; a lookup of [1, 2] holds both
    # pages but may end only after [1], whose window KV is held: a hit of 1, not 0 and not 2.
    WindowMatchGivesUp: [_setup(1), Serve(1, 0), Peek(2, 0, 0, 1), EvictWindow(1), Peek(3, 0, 0, 2)],
    # Four window tokens are evictable, two are asked for.
    WindowEvictsOnePage: [_setup(1), Serve(1, 0), EvictWindow(2)],
    # A lock on [1, 2, 3] with a window of two tokens protects the window KV of [1, 2] and
    # [1, 2, 3]; evicting four window tokens may take the leaf and [1], nothing more.
    WindowEvictionIgnoresLocks: [_setup(2), Serve(1, 0), Arrive(2, 0, 0, 3), EvictWindow(4)],
    # After [1] and [1, 2] lose their window KV, a request of [1, 2] hits nothing, computes both
    # tokens and inserts them: both pages hold their window KV again.
    InsertKeepsTombstones: [_setup(1), Serve(1, 0), EvictWindow(2), Serve(2, 0, 0, 2)],
    # A request locks all four pages (its window: [1, 2, 3, 4]); [1] and [1, 2] lose their window
    # KV; a request of [1, 2] inserts over them: they are locked, so they keep their slots.
    RefillMovesLockedPages: [_setup(1), Serve(1, 0), Arrive(2, 0), EvictWindow(2), Serve(3, 0, 0, 2)],
    # One page's window KV goes; its window slot must be free afterwards.
    WindowSlotsLeak: [_setup(1), Serve(1, 0), EvictWindow(1)],
}


def test_every_broken_window_tree_has_a_written_case():
    assert set(CASES) == set(BROKEN_WINDOW)


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_the_written_case_replays_clean_on_the_reference(broken):
    replay("prefix-tree", ReferencePrefixTree, CASES[broken])


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_broken_window_tree_fails_its_written_case_on_its_rule(broken):
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", broken, CASES[broken])
    assert caught.value.rule_id == BROKEN_WINDOW[broken]


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_WINDOW.items()), ids=[b.name for b in BROKEN_WINDOW])
def test_broken_window_tree_is_convicted_of_its_rule(broken, rule_id):
    assert_convicted(broken, rule_id)
