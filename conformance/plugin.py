"""The pytest plugin: run kvoracle's conformance suite inside an engine's own test run.

``pytest --kvoracle-engine=module:Class`` adds one test item per rule, named by
its ID (``kvoracle::KV-POOL-007``). The suite runs once, on the first item; each
item then passes, fails (showing the counterexample and its replay file), is
skipped with the reason when the rule is not applicable, or fails as
unexercised. Options mirror ``kvoracle check``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvoracle", "kvoracle conformance suite")
    group.addoption("--kvoracle-engine", default=None, metavar="ENGINE",
                    help="run the conformance suite against ENGINE ('reference' or module:Class)")
    group.addoption("--kvoracle-max-examples", type=int, default=150,
                    help="Hypothesis examples per round (default 150)")
    group.addoption("--kvoracle-seed", type=int, default=0, help="random seed (default 0)")
    group.addoption("--kvoracle-replay-dir", default="kvoracle-replays",
                    help="where counterexamples are written as pytest files")


class _SuiteRun:
    """Runs the suite once per session, on demand."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.result = None

    def get(self):
        if self.result is None:
            from .runner import RunOptions, run_suite
            options = RunOptions(max_examples=self.config.getoption("kvoracle_max_examples"),
                                 seed=self.config.getoption("kvoracle_seed"),
                                 replay_dir=Path(self.config.getoption("kvoracle_replay_dir")))
            self.result = run_suite(self.config.getoption("kvoracle_engine"), options)
        return self.result


class KvoracleRuleItem(pytest.Item):
    """One rule's verdict, as a test."""

    def __init__(self, *, rule_id: str, suite: _SuiteRun, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rule_id = rule_id
        self.suite = suite

    def runtest(self) -> None:
        from .report import format_counterexamples
        from .verdicts import ERROR, EXPECTED_FAIL, FAIL, NOT_APPLICABLE, UNEXERCISED, UNEXPECTED_PASS

        result = self.suite.get()
        if result.internal_errors:
            raise RuntimeError("kvoracle internal error: " + "; ".join(result.internal_errors))
        outcome = result.verdicts.outcomes[self.rule_id]
        verdict = outcome.outcome
        if verdict == NOT_APPLICABLE:
            pytest.skip(f"{self.rule_id} not applicable: {outcome.not_applicable}")
        if verdict == EXPECTED_FAIL:
            pytest.xfail(f"{self.rule_id}: {outcome.expected}")
        if verdict in (FAIL, ERROR):
            examples = outcome.counterexamples + outcome.errors
            detail = format_counterexamples(result) if examples else \
                f"{outcome.failed_checks} failed checks"
            pytest.fail(f"{self.rule_id} {verdict}:\n{detail}", pytrace=False)
        if verdict == UNEXPECTED_PASS:
            pytest.fail(f"{self.rule_id} passed but is listed as an expected failure "
                        f"({outcome.expected})", pytrace=False)
        if verdict == UNEXERCISED:
            pytest.fail(f"{self.rule_id} was never exercised; raise --kvoracle-max-examples",
                        pytrace=False)

    def reportinfo(self):
        return Path("kvoracle"), None, f"kvoracle::{self.rule_id}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if not config.getoption("kvoracle_engine"):
        return
    from kvoracle.spec import all_rules

    suite = _SuiteRun(config)
    for rule in all_rules():
        items.append(KvoracleRuleItem.from_parent(session, name=f"kvoracle::{rule.id}",
                                                  rule_id=rule.id, suite=suite))
