"""Meta-tests of the external-store rules that left the gap list: each broken store coordinator
is charged with its rule.

The external-store suite judges KV-EXT-009, KV-EXT-010, KV-EXT-013 and KV-EXT-014 since they moved off
``NOT_YET_JUDGED`` (spec/registry.py). Each broken engine of tests/broken_store_gap_engines.py
shows one of them; replayed on a small fixed state it must fail with that rule, where the
baseline (the reference, or for partial hash hits the reference adapter extended with them)
passes and judges the rule. The slow test runs the generated suite on the broken engines: it
must find each rule by itself.
"""

from __future__ import annotations

import broken_store_gap_engines
import pytest

from kvoracle.conformance.external_store import LookUp, Put, ReferenceExternalStore, Store, StoreSetup
from kvoracle.conformance.harness import RunOptions, run_suite
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.spec import get_rule
from kvoracle.spec.registry import NOT_YET_JUDGED

F = False
FULL, SWA, MAMBA = "full", "sliding_window", "mamba"

STATES = {
    # Full attention marked as an EAGLE group, EAGLE off, window 3: 6 of 8 blocks stored in
    # both groups. The local coordinator drops nothing: bound 7 hits 6 tokens. With the
    # marked group's drop the full group is looked up one block further and loses its last
    # cached block: 5.
    "StoreDropsMarkedGroups": [
        StoreSetup(((FULL, 1, 0), (SWA, 1, 3)), 1, False, (True, F), ((0, 1, 2, 3, 0, 1, 2, 3),)),
        Put(0, 0, (0, 1, 2, 3, 4, 5)), Put(0, 1, (0, 1, 2, 3, 4, 5)), LookUp(0, 7)],
    # vLLM #50359's geometry, scaled down: full attention (block 2) and Mamba (block 2), hash
    # block 1. Prompt 1: the full group holds keys at 2, 3 and 4 tokens, Mamba at 3; a hit of
    # 3 ends inside the full group's second block and is loadable. Prompt 0: the full group
    # holds keys at 2 and 4 tokens, Mamba at 2 and 3. The full group holds 4 tokens, Mamba
    # trims that to 3, where the full group has no key: the broken store answers 3 and asks
    # for chunk 1 under the missing key. Every group can load 2.
    "TrimsToShorterHashBoundary": [
        StoreSetup(((FULL, 2, 0), (MAMBA, 2, 0)), 1, False, (F, F), ((0, 1, 2, 3, 0, 1), (3, 1, 2, 3, 0, 1)),
                   partial=True),
        Put(1, 0, (1, 2, 3)), Put(1, 1, (2,)), LookUp(1, 5),
        Put(0, 0, (1, 3)), Put(0, 1, (1, 2)), LookUp(0, 5)],
    # Three full-attention groups of one spec, EAGLE, a 2-token prompt fully stored, bound 1:
    # the local loop looks the group up at 2 tokens and drops the peek block (hit 1); the
    # direct lookup at 1 drops the only block (hit 0).
    "NoLookAheadForOneSpecGroup": [
        StoreSetup(((FULL, 1, 0),) * 3, 1, True, (F, F, F), ((2, 3),)),
        Store(0, 2), LookUp(0, None)],
    # Full attention and a window of 1 (block 2), EAGLE: every full-attention block stored, the
    # window group only its block 2. Bound 7: the full group holds 6 tokens; the window group
    # checks its peek block 2 and drops it, hit 4, reading no window block. The broken
    # load_mask asks for the window group's block 1, which the store lacks.
    "LoadsWindowOneWithoutTheDrop": [
        StoreSetup(((FULL, 1, 0), (SWA, 2, 1)), 1, True, (F, F), ((0,) * 8,)),
        Put(0, 0, tuple(range(8))), Put(0, 1, (5,)), LookUp(0, 7)],
}

#: The broken engines the generated suite must convict within one round of 150 examples.
GENERATED = ["StoreDropsMarkedGroups", "TrimsToShorterHashBoundary", "NoLookAheadForOneSpecGroup",
             "LoadsWindowOneWithoutTheDrop"]
#: Seeds other than 0, where seed 0's round meets no example of the engine's bug. None now: since the
#: store suite's re-verified windows take their gap two times in three, seeds 0, 2 and 3 convict the
#: partial hit trimmed to a shorter hash boundary and seed 1 (pinned here before) does not.
SEEDS: dict[str, int] = {}


def _baseline(engine: str):
    return broken_store_gap_engines.BASELINES.get(engine, ReferenceExternalStore)


def test_every_rule_off_the_gap_list_has_a_broken_engine() -> None:
    rules = {rule_id for _, rule_id in broken_store_gap_engines.EXPECTED.values()}
    assert rules == {"KV-EXT-009", "KV-EXT-010", "KV-EXT-013", "KV-EXT-014"}
    for engine, (suite, rule_id) in broken_store_gap_engines.EXPECTED.items():
        assert rule_id not in NOT_YET_JUDGED, rule_id
        assert suite in get_rule(rule_id).judged_by, (engine, rule_id)
    assert set(STATES) == set(broken_store_gap_engines.EXPECTED)


@pytest.mark.parametrize("engine", sorted(broken_store_gap_engines.EXPECTED))
def test_broken_engine_is_charged_with_its_rule(engine: str) -> None:
    suite, rule_id = broken_store_gap_engines.EXPECTED[engine]
    with pytest.raises(RuleViolation) as caught:
        replay(suite, getattr(broken_store_gap_engines, engine), STATES[engine])
    assert caught.value.rule_id == rule_id, caught.value


@pytest.mark.parametrize("engine", sorted(broken_store_gap_engines.EXPECTED))
def test_the_baseline_passes_each_state_and_judges_the_rule(engine: str) -> None:
    suite, rule_id = broken_store_gap_engines.EXPECTED[engine]
    verdicts = replay(suite, _baseline(engine), STATES[engine])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    assert verdicts.outcomes[rule_id].checks > 0, rule_id


def test_the_reference_is_not_judged_on_partial_hash_hits() -> None:
    result = run_suite(ReferenceExternalStore, RunOptions(max_examples=5, max_rounds=1, replay_dir=None),
                       suite="external-store")
    assert result.verdicts.outcomes["KV-EXT-010"].outcome == "not-applicable"


@pytest.mark.slow
@pytest.mark.parametrize("engine", GENERATED)
def test_generated_suite_charges_the_rule(engine: str) -> None:
    suite, rule_id = broken_store_gap_engines.EXPECTED[engine]
    result = run_suite(getattr(broken_store_gap_engines, engine),
                       RunOptions(max_examples=150, max_rounds=1, replay_dir=None, seed=SEEDS.get(engine, 0)),
                       suite=suite)
    outcome = result.verdicts.outcomes[rule_id]
    assert outcome.outcome == "fail", (rule_id, outcome.outcome, [
        (o.rule_id, o.outcome) for o in result.verdicts.outcomes.values() if o.outcome == "fail"])
