"""Meta-tests of the order of component evictions (chapter 14, KV-TREE-028 .. 030) without SGLang:
broken trees built on the reference, each ordering one component's evictions wrongly, are convicted of
the order rule they break on a written case the reference passes and by a bounded suite run; a
reference with segment recency passes every rule it is judged on; a tree with a state component and no
recency (tree_recency "none") is judged on every state rule but the order, which is not applicable."""

from __future__ import annotations

import pytest
from broken_tree_engines import BROKEN_ORDER, SegmentReference, StateOrderByPath, WindowOrderByPath, WindowReachShort
from tree_meta import outcomes, run

from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.prefix_tree import (
    MAMBA_RULES,
    EvictStates,
    EvictWindow,
    Peek,
    ReferencePrefixTree,
    Serve,
    TreeSetup,
)
from kvoracle.reference.prefix_tree import PrefixTree
from kvoracle.spec import prefix_tree as spec

#: Two prompts that share nothing, on pages of one token with room for eight.
PROMPTS = ((1, 2, 3, 4), (5, 6))

#: A written case per broken tree, and the engine that replays it clean.
CASES = {
    # Both prompts are stored, then a lookup of the first uses the window KV of its last page only: the
    # oldest window KV is the first prompt's first page's, not the second prompt's (stored later).
    WindowOrderByPath: (ReferencePrefixTree, [TreeSetup(1, 8, PROMPTS, window=1), Serve(1, 0), Serve(2, 1),
                                              Peek(3, 0), EvictWindow(1)]),
    # The first prompt is stored as segments [1, 2, 3] and [4] (a new run is capped at one window); the
    # lookup of it stamps both (W + P = 2 tokens back), so the second prompt's window KV is the oldest.
    WindowReachShort: (SegmentReference, [TreeSetup(1, 8, PROMPTS, window=1), Serve(1, 0), Serve(2, 1),
                                          Peek(3, 0), EvictWindow(1)]),
    # States after [1, 2], [1, 2, 3, 4] and [5, 6]; a lookup of the whole first prompt resumes from the
    # state after [1, 2, 3, 4] only, so the state after [1, 2] is still the oldest.
    StateOrderByPath: (ReferencePrefixTree, [TreeSetup(1, 8, PROMPTS, states=5), Serve(1, 0, 0, 2), Serve(2, 0),
                                             Serve(3, 1), Peek(4, 0), EvictStates(1)]),
}


def test_every_broken_order_has_a_written_case():
    assert set(CASES) == set(BROKEN_ORDER)


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_the_written_case_replays_clean(broken):
    clean, steps = CASES[broken]
    replay("prefix-tree", clean, steps)


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_broken_order_fails_its_written_case_on_its_rule(broken):
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", broken, CASES[broken][1])
    assert caught.value.rule_id == BROKEN_ORDER[broken]


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_ORDER.items()), ids=[b.name for b in BROKEN_ORDER])
def test_broken_order_is_convicted_of_its_rule(broken, rule_id):
    # An order fault shows only where the right lookups come before a small eviction: more examples than
    # the other meta-tests' 100.
    result = run(broken, max_examples=300, max_rounds=1)
    outcome = result.verdicts.outcomes[rule_id]
    assert outcome.outcome == "fail", (outcome.outcome, outcomes(result))
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", broken, outcome.counterexamples[0].steps)
    assert caught.value.rule_id == rule_id


def test_a_segment_reference_passes_every_rule_it_is_judged_on():
    result = run(SegmentReference, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable" and found.pop("KV-TREE-028") == "not-applicable"
    assert {found.pop(rule_id) for rule_id in MAMBA_RULES} == {"not-applicable"}  # a window component only
    assert set(found.values()) == {"pass"}, found
    assert result.verdicts.outcomes["KV-TREE-029"].checks > 0


def test_the_window_stamp_reaches_one_page_further_with_segments():
    """The difference KV-TREE-028 and 029 name: a lookup stamps W tokens' pages, or W + P tokens' segments."""
    stamped = {}
    for recency in spec.RECENCY_MODES:
        tree = PrefixTree(1, recency, window=1)
        tree.insert(0, (1, 2, 3), (10, 11, 12))
        tree.match(0, (1, 2, 3))
        stamped[recency] = sorted(len(key[1]) for key, page in tree.pages.items() if page.window_stamp == tree.clock)
    # Segment recency: [1, 2] and [3] are two segments (a new run is capped at one window), both reached.
    assert stamped == {"page": [3], "segment": [1, 2, 3]}


def test_a_lookup_stamps_only_the_state_it_resumes_from():
    tree = PrefixTree(1, states=True)
    tree.insert(0, (1, 2), (10, 11))
    tree.insert(0, (1, 2, 3), (10, 11, 12))
    tree.match(0, (1, 2, 3))
    assert [len(key[1]) for key, page in tree.pages.items() if page.state_stamp == tree.clock] == [3]
    assert tree.evict_states(1, set())[0] == [(0, (1, 2))]


class StatesInNoOrder(StateOrderByPath):
    """A tree with a state component that promises no eviction order (tree_recency "none"): its states go
    in the order of the pages' full-attention recency, which KV-TREE-030 would charge."""

    name = "states-in-no-order"

    def capabilities(self):
        return Capabilities(tree_recency="none")


#: The rules a tree without recency is never judged on: the order of its evictions, of whole pages
#: (KV-TREE-008/009), of window KV (028/029) and of states (030).
ORDER_RULES = ("KV-TREE-008", "KV-TREE-009", "KV-TREE-028", "KV-TREE-029", "KV-TREE-030")


def test_a_state_component_without_recency_is_judged_on_its_state_rules_but_not_their_order():
    result = run(StatesInNoOrder, max_examples=30, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    for rule_id in ORDER_RULES:
        outcome = result.verdicts.outcomes[rule_id]
        assert (outcome.outcome, outcome.not_applicable, outcome.checks) == (
            "not-applicable", "engine declares tree_recency='none'", 0), rule_id
    judged = [rule_id for rule_id in MAMBA_RULES if rule_id not in ORDER_RULES]
    assert {found[rule_id] for rule_id in judged} == {"pass"}, found
    unchecked = [rule_id for rule_id in judged if not result.verdicts.outcomes[rule_id].checks]
    assert not unchecked, unchecked


def test_the_order_of_a_state_component_without_recency_is_not_charged():
    # state-order-by-path's written case, which convicts it of KV-TREE-030 under page recency.
    replay("prefix-tree", StatesInNoOrder, CASES[StateOrderByPath][1])
