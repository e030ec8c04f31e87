"""What the prefix-tree meta-tests share (tests/test_prefix_tree.py on reference-based trees,
tests/test_sglang_adapter.py on SGLang's real cache): a bounded run of the suite, its verdicts on
chapter 14's rules, and the check that a broken engine is convicted of its rule with a replay
that keeps failing."""

from __future__ import annotations

import pytest

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, RunResult, run_suite
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.spec import all_rules

OPTIONS = dict(max_examples=100, step_count=40, seed=0, max_rounds=2, replay_dir=None)
TREE_RULES = [rule.id for rule in all_rules() if rule.area == "TREE" and rule.judged_by]


def run(factory, **overrides) -> RunResult:
    return run_suite(factory, RunOptions(**{**OPTIONS, **overrides}), suite="prefix-tree")


def outcomes(result: RunResult) -> dict[str, str]:
    return {rule_id: result.verdicts.outcomes[rule_id].outcome for rule_id in TREE_RULES}


def assert_convicted(broken, rule_id: str) -> None:
    """The suite convicts ``broken`` of ``rule_id`` ("error": an engine that checks itself named
    the rule), and its counterexample replays to the same rule."""
    result = run(broken)
    outcome = result.verdicts.outcomes[rule_id]  # a chapter 14 rule, or a data rule (a paged store)
    assert outcome.outcome in ("fail", "error"), (outcome.outcome, outcomes(result))
    example = (outcome.counterexamples or outcome.errors)[0]
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", broken, example.steps)
    assert caught.value.rule_id == rule_id
