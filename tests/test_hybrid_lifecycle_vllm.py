"""vLLM 0.33.0's real KVCacheManager over hybrid configurations, in the hybrid lifecycle suite."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm.sh)")

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Free, Schedule
from kvoracle.spec import all_rules


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


@pytest.mark.parametrize("seed", [0, 2])
def test_bounded_suite_passes(seed: int) -> None:
    result = run_suite("vllm", RunOptions(max_examples=200, seed=seed, replay_dir=None), suite="hybrid-lifecycle")
    assert result.ok, [(o.rule_id, o.outcome, [c.message for c in o.counterexamples])
                       for o in result.verdicts.outcomes.values() if o.outcome not in ("pass", "not-applicable")]


def test_vllm_in_a_paged_store_keeps_every_groups_data() -> None:
    """KV-DATA-001..006 around vLLM's hybrid manager: one store tensor per group."""
    pytest.importorskip("torch", reason="the paged store needs torch")
    data_rules = [rule.id for rule in all_rules() if rule.chapter == "data_integrity"]
    result = run_suite("paged-vllm", RunOptions(max_examples=150, seed=1, replay_dir=None),
                       suite="hybrid-lifecycle")
    outcomes = result.verdicts.outcomes
    assert result.ok, [(o.rule_id, o.outcome, [c.message for c in o.counterexamples])
                       for o in outcomes.values() if o.outcome not in ("pass", "not-applicable")]
    assert data_rules and all(outcomes[rule_id].checks > 0 for rule_id in data_rules)
