"""The zoo's bookkeeping (benchmarks/zoo.py) on made-up release reports: a bug must be
convicted on the releases that had it and on no other, and any other failure is named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import zoo

from kvoracle.spec import get_rule


def _report(version: str, convicted: set[str]) -> dict:
    suites: dict = {}
    for bug in zoo.ZOO:
        suite = suites.setdefault(bug.suite, {"run_s": 1.0, "failing": [], "expected_fail": [],
                                              "unclassified": {}, "rules": {}})
        outcome = "fail" if bug.rule in convicted else "pass"
        suite["rules"][bug.rule] = {"outcome": outcome, "convicted_s": 2.5 if outcome == "fail" else None,
                                    "counterexample": None}
    return {"vllm": version, "seed": 0, "max_examples": 150, "suites": suites}


def test_every_entry_names_a_rule_and_a_release_range() -> None:
    assert len({bug.key for bug in zoo.ZOO}) == len(zoo.ZOO)
    for bug in zoo.ZOO:
        assert bug.suite in get_rule(bug.rule).judged_by, bug
        assert zoo._version_in(bug.fixed_in, bug.releases) is False, bug
        assert bug.source.startswith("https://github.com/vllm-project/vllm/blob/v"), bug


def test_a_bug_is_convicted_where_it_shipped_and_clean_after_its_fix() -> None:
    spiral = next(bug for bug in zoo.ZOO if bug.key == "vllm-32802")
    assert zoo.verdict_of(spiral, _report("0.14.1", {"KV-HYB-015"})) == (True, "convicted in 2.5 s")
    assert zoo.verdict_of(spiral, _report("0.14.1", set())) == (False, "MISSED (pass)")
    assert zoo.verdict_of(spiral, _report("0.28.0", set())) == (True, "clean")
    assert zoo.verdict_of(spiral, _report("0.28.0", {"KV-HYB-015"})) == (False, "CHARGED (fail)")


def test_the_summary_is_one_row_per_bug_and_fails_on_a_miss() -> None:
    good = [_report(release, {bug.rule for bug in zoo.ZOO if zoo._version_in(release, bug.releases)})
            for release in ("0.33.0", "0.14.1")]
    table, ok = zoo.summarize(good)
    assert ok
    lines = table.splitlines()
    assert lines[0].endswith("| 0.14.1 | 0.33.0 |")  # releases in order
    assert len(lines) == 3 + len(zoo.ZOO)
    assert lines[-1] == "| unclassified | | | none | none |"
    _, ok = zoo.summarize([_report("0.14.1", set())])
    assert not ok
    _, ok = zoo.summarize([_report("0.33.0", set())])  # its align-mode Mamba bugs missed
    assert not ok
    # Any other failure of a release fails the summary too.
    stray = _report("0.33.0", set())
    stray["suites"]["hybrid"]["unclassified"] = {"KV-HYB-013": None}
    table, ok = zoo.summarize([stray])
    assert not ok and table.splitlines()[-1] == "| unclassified | | | KV-HYB-013 |"


def test_a_suite_the_release_cannot_run_gives_no_verdict() -> None:
    report = _report("0.22.0", set())
    report["suites"]["manager"] = {"unsupported": "no such operation", "failing": [], "unclassified": {},
                                   "expected_fail": [], "rules": {}}
    bug = next(bug for bug in zoo.ZOO if bug.suite == "manager")
    assert zoo.verdict_of(bug, report) == (True, "suite unsupported")


@pytest.mark.parametrize("version", ["0.14.1", "0.28.0", "0.33.0"])
def test_releases_in_a_range_are_read_as_versions(version: str) -> None:
    assert zoo._version_in(version, "<0.33") is (version != "0.33.0")
