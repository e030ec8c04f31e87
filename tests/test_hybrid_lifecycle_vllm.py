"""vLLM 0.33.0's real KVCacheManager over hybrid configurations, in the hybrid lifecycle suite."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm.sh)")

import sys
from pathlib import Path

from kvoracle.conformance.harness.expectations import version_in_range
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, RunResult, run_suite
from kvoracle.conformance.harness.verdicts import GOOD_OUTCOMES
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Free, NewStep, Schedule, TakeCopies
from kvoracle.spec import all_rules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import zoo


def _known_bugs(version: str) -> set[str]:
    """The rules of the manager suite that the zoo's bugs of this release break (for 0.33.0:
    the two align-mode Mamba bugs, KV-MAMBA-008 and KV-MAMBA-017)."""
    return {bug.rule for bug in zoo.ZOO if bug.suite == "manager" and version_in_range(version, bug.releases)}


def _unexplained(result: RunResult) -> list[tuple[str, str, list[str]]]:
    """Every rule that is neither passed nor one of the release's known bugs, with its messages.

    A known bug may or may not be reached in a bounded run (the zoo row, 400 examples, must
    convict it); any other failure, error or unexercised rule is a new difference."""
    known = _known_bugs(result.engine_version)
    run_faults = [("run", "internal error", [repr(error) for error in result.internal_errors])
                  ] if result.internal_errors else []
    if result.incomplete is not None:
        run_faults.append(("run", "incomplete", [str(result.incomplete)]))
    return run_faults + [(o.rule_id, o.outcome, [c.message for c in [*o.counterexamples, *o.errors]])
            for o in result.verdicts.outcomes.values()
            if o.outcome not in GOOD_OUTCOMES and o.rule_id not in known]


def test_partial_tail_entry_orders_the_free_queue_as_specified() -> None:
    """KV-HLC-006: the case the suite found before the reference modelled partial entries."""
    replay("hybrid-lifecycle", "vllm", [
        ConfigureGroups((("full", 1, 0), ("full", 2, 0)), 1, 6, 8, use_eagle=True),
        AddRequest("r0", (0, 0, 0)), Schedule("r0", 3), Free("r0")])


def test_sliding_window_lifecycle_matches() -> None:
    replay("hybrid-lifecycle", "vllm", [
        ConfigureGroups((("full", 2, 0), ("sliding_window", 1, 2)), 1, 40, 32),
        AddRequest("a", (1, 2, 3, 0, 1, 2, 3)), Schedule("a", 3), Schedule("a", 4), Free("a"),
        AddRequest("b", (1, 2, 3, 0, 1, 2, 3, 3)), Schedule("b", 8), Free("b", preempted=True)])


#: Examples per seed: since the one-group part's crowding rule (ac4d30d) moved every part's draws,
#: seed 2 exercises KV-MAMBA-023 (a write to a shared page) within 300 examples, not 200.
BOUNDED_EXAMPLES = {0: 200, 2: 300}


@pytest.mark.parametrize("seed", sorted(BOUNDED_EXAMPLES))
def test_bounded_suite_fails_only_on_the_known_bugs(seed: int) -> None:
    result = run_suite("vllm", RunOptions(max_examples=BOUNDED_EXAMPLES[seed], seed=seed, replay_dir=None),
                       suite="hybrid-lifecycle")
    assert not _unexplained(result), _unexplained(result)


def test_vllm_in_a_paged_store_keeps_every_groups_data() -> None:
    """KV-DATA-001..006 around vLLM's hybrid manager: one store tensor per group, a state per
    align-mode Mamba page (KV-MAMBA-014/015); every other rule passes too, but for the release's
    known bugs."""
    pytest.importorskip("torch", reason="the paged store needs torch")
    data_rules = [rule.id for rule in all_rules()
                  if rule.chapter == "data_integrity" and "manager" in rule.judged_by]
    result = run_suite("paged-vllm", RunOptions(max_examples=150, seed=1, replay_dir=None),
                       suite="hybrid-lifecycle")
    outcomes = result.verdicts.outcomes
    assert not _unexplained(result), _unexplained(result)
    assert data_rules and all(outcomes[rule_id].checks > 0 for rule_id in data_rules)
    assert outcomes["KV-MAMBA-014"].checks > 0 and outcomes["KV-MAMBA-015"].checks > 0  # the state pages


def test_partial_hits_producer_and_consumer_match() -> None:
    """KV-MAMBA-019 .. KV-MAMBA-025 on vLLM 0.33.0: the meta-tests' fixed cases (a producer whose
    tail moves to a copy, a consumer resuming inside it, and the producer's step one page short),
    every partial-hit rule exercised and passed. B = 16, h = 4: a 22-token prompt's first chunk
    stops at its last hash boundary, 20."""
    prompt = tuple(range(22))

    def model(num_blocks: int) -> ConfigureGroups:
        return ConfigureGroups((("full", 4, 0), ("mamba", 16, 0)), 4, num_blocks, 64)

    produce = [AddRequest("a", prompt), Schedule("a", 22), TakeCopies(), NewStep(), Schedule("a", 22), TakeCopies()]
    consume = [model(60), *produce, NewStep(), AddRequest("c", (*prompt[:20], 1, 1, 1)), Schedule("c", 3),
               TakeCopies()]
    tight = [model(8), *produce]  # one page short of the producer's second step with its copy
    rules = [f"KV-MAMBA-0{n}" for n in range(19, 26)]
    checks = dict.fromkeys(rules, 0)
    for steps in (consume, tight):
        verdicts = replay("hybrid-lifecycle", "vllm", steps)
        assert verdicts is not None
        for rule_id in rules:
            assert not verdicts.outcomes[rule_id].failed_checks, rule_id
            checks[rule_id] += verdicts.outcomes[rule_id].checks
    assert all(checks.values()), checks


def test_partial_hits_in_a_paged_store() -> None:
    """vLLM 0.33.0 in the paged store on the partial-hit cases of tests/test_paged_mamba_partial.py:
    the store's runner makes the copies vLLM's manager queued (its single-type managers' pending
    copies) before each step's forward, and the states pass KV-MAMBA-014/015 and KV-MAMBA-026."""
    pytest.importorskip("torch", reason="the paged store needs torch")
    import test_paged_mamba_partial as partial

    for steps in (partial.CONSUME, partial.AFTER_A_FREED_PRODUCER):
        verdicts = replay("hybrid-lifecycle", "paged-vllm", steps)
        assert verdicts is not None
        for rule_id in partial.STATE_RULES:
            outcome = verdicts.outcomes[rule_id]
            assert outcome.checks > 0 and not outcome.failed_checks, rule_id
