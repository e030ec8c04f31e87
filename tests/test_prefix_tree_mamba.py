"""Meta-tests of the state component (chapter 14, KV-TREE-022 .. 027: a hybrid model's recurrent
layers, SGLang's Mamba) without SGLang: broken trees built on the reference, each with one fault in
its states, are convicted of the state rule they break by a bounded suite run and on a written case
that the reference passes."""

from __future__ import annotations

import pytest
from broken_tree_engines import (
    BROKEN_STATE,
    InsertLeavesNoState,
    StateBlindMatch,
    StateEvictionIgnoresLocks,
    StateMatchGivesUp,
    StatesEvictOne,
    StateSlotsLeak,
)
from tree_meta import assert_convicted

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.prefix_tree import Arrive, EvictStates, Peek, ReferencePrefixTree, Serve, TreeSetup

PROMPT = (1, 2, 3, 4)


def _setup() -> TreeSetup:
    """Pages of one token, room for eight, one prompt of four tokens, five state slots."""
    return TreeSetup(1, 8, (PROMPT,), states=5)


#: A written case per broken tree: the reference replays it clean, the broken tree fails it on its rule.
CASES = {
    # The prompt is stored with a state after [1, 2, 3, 4] only; [1, 2] is held without one: no hit.
    StateBlindMatch: [_setup(), Serve(1, 0), Peek(2, 0, 0, 2)],
    # States after [1, 2] and [1, 2, 3, 4]; a lookup of [1, 2, 3] holds three pages and hits two.
    StateMatchGivesUp: [_setup(), Serve(1, 0, 0, 2), Serve(2, 0), Peek(3, 0, 0, 3)],
    # Two states held, none locked, two asked for.
    StatesEvictOne: [_setup(), Serve(1, 0, 0, 2), Serve(2, 0), EvictStates(2)],
    # A request locks the whole prompt: the one state is its path's end, nothing is evictable.
    StateEvictionIgnoresLocks: [_setup(), Serve(1, 0), Arrive(2, 0), EvictStates(1)],
    # The first insertion of the prompt leaves its state after [1, 2, 3, 4].
    InsertLeavesNoState: [_setup(), Serve(1, 0)],
    # One state goes; its slot must be free afterwards.
    StateSlotsLeak: [_setup(), Serve(1, 0), EvictStates(1)],
}


def test_every_broken_state_tree_has_a_written_case():
    assert set(CASES) == set(BROKEN_STATE)


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_the_written_case_replays_clean_on_the_reference(broken):
    replay("prefix-tree", ReferencePrefixTree, CASES[broken])


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_broken_state_tree_fails_its_written_case_on_its_rule(broken):
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", broken, CASES[broken])
    assert caught.value.rule_id == BROKEN_STATE[broken]


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_STATE.items()), ids=[b.name for b in BROKEN_STATE])
def test_broken_state_tree_is_convicted_of_its_rule(broken, rule_id):
    assert_convicted(broken, rule_id)


def test_a_tree_takes_a_window_or_states_not_both():
    from kvoracle.reference.prefix_tree import PrefixTree
    from kvoracle.spec.config import ConfigError

    with pytest.raises(ConfigError, match="KV-TREE-022"):
        PrefixTree(1, window=2, states=True)
