"""Reports people and CI systems read: JUnit XML, the versioned JSON report and its schema, and
the per-rule times (to detection, to conviction) both carry.

Real runs, kept small: the reference engine in two suites (with one rule listed as an
expected failure, so that it comes out as an unexpected pass), a broken engine in process
(a failure with a shrunk counterexample and a replay file) and the same broken engine
through ``kvoracle check`` itself, supervised, with its rule listed as expected to fail.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvoracle.conformance  # noqa: F401 - registers the built-in suites
from kvoracle.conformance.cli import main
from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.harness.records import StepText, run_from_record, run_to_record
from kvoracle.conformance.harness.report import REPORT_FORMAT, REPORT_FORMAT_VERSION, to_json
from kvoracle.conformance.harness.runner import CheckResult, RunOptions, RunResult, run_suites
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.harness.verdicts import (
    ERROR,
    EXPECTED_FAIL,
    FAIL,
    NOT_APPLICABLE,
    OUTCOMES,
    PASS,
    UNEXERCISED,
    UNEXPECTED_PASS,
    Counterexample,
    Verdicts,
)
from kvoracle.conformance.reports import schema as report_schema
from kvoracle.conformance.reports.junit import junit_xml
from kvoracle.spec import get_rule
from kvoracle.spec.registry import RULE_KINDS

TESTS = Path(__file__).parent
#: How each verdict shows in JUnit: the child element of its <testcase> (None: a plain pass).
JUNIT_ELEMENT = {PASS: None, FAIL: "failure", UNEXPECTED_PASS: "failure", UNEXERCISED: "failure",
                 ERROR: "error", EXPECTED_FAIL: "skipped", NOT_APPLICABLE: "skipped"}
#: A rule of the hybrid suite the reference passes, listed as failing: an unexpected pass.
LISTED = "KV-SWA-001"


def _options(tmp: Path, max_examples: int) -> RunOptions:
    return RunOptions(max_examples=max_examples, step_count=20, max_rounds=3, seed=0,
                      replay_dir=tmp / "replays", hypothesis_dir=tmp / "hypothesis")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> CheckResult:
    tmp = tmp_path_factory.mktemp("reference")
    return run_suites("reference", ["hybrid", "external-store"], _options(tmp, 20), explicit=True,
                      expectations=lambda suite, probe: {LISTED: "listed to test strict xfail"}
                      if suite.name == "hybrid" else None)


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory) -> CheckResult:
    sys.path.insert(0, str(TESTS))
    try:
        return run_suites("broken_engines:ForwardFree", ["lockstep"],
                          _options(tmp_path_factory.mktemp("broken"), 30), explicit=True)
    finally:
        sys.path.remove(str(TESTS))


@pytest.fixture(scope="module")
def command_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``kvoracle check --json --junit`` on a broken engine, supervised (the default), with the
    rule it breaks listed as an expected failure."""
    tmp = tmp_path_factory.mktemp("command")
    expectations = tmp / "expect.toml"
    expectations.write_text('[[expect]]\nrule = "KV-POOL-007"\nversions = ">=0"\n'
                            'reason = "frees head first, on purpose"\n')
    report, junit = tmp / "out" / "report.json", tmp / "out" / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "kvoracle", "check", "--suite", "lockstep", "--engine", "broken_engines:ForwardFree",
         "--max-examples", "30", "--steps", "20", "--max-rounds", "3", "--seed", "0",
         "--expectations", str(expectations), "--json", str(report), "--junit", str(junit),
         "--replay-dir", str(tmp / "replays"), "--hypothesis-dir", str(tmp / "hypothesis")],
        cwd=TESTS, capture_output=True, text=True, timeout=600,
        env={**os.environ, "KVORACLE_CONTRACTS": "0"})
    assert report.exists() and junit.exists(), done.stdout + done.stderr
    return {"returncode": done.returncode, "output": done.stdout + done.stderr,
            "report": json.loads(report.read_text()), "junit": junit.read_text(encoding="utf-8")}


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``kvoracle check --json --junit`` on an engine that kills its process (SIGSEGV)."""
    tmp = tmp_path_factory.mktemp("crash")
    report, junit = tmp / "report.json", tmp / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "kvoracle", "check", "--suite", "lockstep", "--engine",
         "faulty_engines:SegfaultsOnReset", "--max-examples", "20", "--steps", "20", "--seed", "0",
         "--json", str(report), "--junit", str(junit), "--replay-dir", str(tmp / "replays"),
         "--hypothesis-dir", str(tmp / "hypothesis")],
        cwd=TESTS, capture_output=True, text=True, timeout=600, env={**os.environ, "KVORACLE_CONTRACTS": "0"})
    assert report.exists() and junit.exists(), done.stdout + done.stderr
    return {"returncode": done.returncode, "output": done.stdout + done.stderr,
            "report": json.loads(report.read_text()), "junit": junit.read_text(encoding="utf-8")}


def _rule(report: dict, rule_id: str) -> dict:
    return next(rule for rule in report["rules"] if rule["id"] == rule_id)


def _verdict_of(case: ET.Element) -> str | None:
    """The JUnit element a test case carries (failure, error, skipped), or None."""
    found = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
    assert len(found) <= 1, ET.tostring(case)
    return found[0] if found else None


def _check_junit_against(result: CheckResult, document: str) -> ET.Element:
    """Parse ``document`` back and require its counts and elements to agree with ``result``'s verdicts."""
    root = ET.fromstring(document)
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [run.part or run.suite for run in result.runs]
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for run, suite in zip(result.runs, suites):
        scope = get_suite(run.part or run.suite).scope()
        cases = [c for c in suite.findall("testcase") if c.get("name") != "kvoracle run"]
        assert [c.get("name").split(" ", 1)[0] for c in cases] == list(scope)
        expected = dict.fromkeys(totals, 0)
        for rule_id, case in zip(scope, cases):
            outcome = run.verdicts.outcomes[rule_id]
            assert case.get("name") == f"{rule_id} {get_rule(rule_id).title}"
            assert case.get("classname") == f"{run.part or run.suite}.{get_rule(rule_id).chapter}"
            assert _verdict_of(case) == JUNIT_ELEMENT[outcome.outcome], (rule_id, outcome.outcome)
            assert float(case.get("time")) >= 0
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            assert props["outcome"] == outcome.outcome and int(props["checks"]) == outcome.checks
            expected["tests"] += 1
            tag = JUNIT_ELEMENT[outcome.outcome]
            if tag is not None:
                expected[{"failure": "failures", "error": "errors", "skipped": "skipped"}[tag]] += 1
        if run.internal_errors or run.incomplete:
            expected["tests"] += 1
            expected["errors"] += 1
        for name, count in expected.items():
            assert int(suite.get(name)) == count, (run.suite, name)
            totals[name] += count
        assert float(suite.get("time")) == pytest.approx(run.duration_s, abs=1e-3)
    for name, count in totals.items():
        assert int(root.get(name)) == count, name
    return root


# -- the JSON report and its schema ---------------------------------------------------------------
def test_schema_is_valid_draft_2020_12_and_agrees_with_the_code() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = report_schema.load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["format"] == {"const": REPORT_FORMAT}
    assert schema["properties"]["format_version"] == {"const": REPORT_FORMAT_VERSION}
    assert tuple(schema["$defs"]["outcome"]["enum"]) == OUTCOMES
    assert tuple(schema["$defs"]["rule"]["properties"]["kind"]["enum"]) == RULE_KINDS
    assert set(schema["$defs"]["summary"]["required"]) == set(OUTCOMES)


def test_real_reports_match_the_schema(reference_run: CheckResult, broken_run: CheckResult,
                                       command_run: dict) -> None:
    pytest.importorskip("jsonschema")
    reports = [to_json(reference_run), to_json(broken_run), command_run["report"]]
    for report in reports:
        report = json.loads(json.dumps(report))  # as a reader gets it
        report_schema.validate_report(report)
        assert report["format"] == "kvoracle-report" and report["format_version"] == 1
    # The reports hold what makes the schema's checks mean something: counterexamples, several
    # suites, the outcomes of interest.
    assert [s["suite"] for s in reports[0]["suites"]] == ["hybrid", "external-store"]
    assert _rule(reports[0], LISTED)["outcome"] == UNEXPECTED_PASS
    assert _rule(reports[1], "KV-POOL-007")["outcome"] == FAIL
    assert _rule(reports[1], "KV-POOL-007")["counterexamples"]
    assert _rule(reports[2], "KV-POOL-007")["outcome"] == EXPECTED_FAIL
    assert _rule(reports[2], "KV-POOL-007")["counterexamples"]


@pytest.mark.parametrize("damage", ["no format_version", "format_version 2", "format_version '1'",
                                    "no rules", "rule without outcome", "unknown outcome",
                                    "counterexample without steps", "unknown top-level field",
                                    "negative conviction", "wrong format", "picture without panels",
                                    "picture as text"])
def test_schema_rejects_a_damaged_report(broken_run: CheckResult, damage: str) -> None:
    pytest.importorskip("jsonschema")
    report = json.loads(json.dumps(to_json(broken_run)))
    report_schema.validate_report(copy.deepcopy(report))  # intact, it passes
    rule = _rule(report, "KV-POOL-007")
    if damage == "no format_version":
        del report["format_version"]
    elif damage == "format_version 2":
        report["format_version"] = 2
    elif damage == "format_version '1'":
        report["format_version"] = "1"
    elif damage == "no rules":
        del report["rules"]
    elif damage == "rule without outcome":
        del rule["outcome"]
    elif damage == "unknown outcome":
        rule["outcome"] = "passed"
    elif damage == "counterexample without steps":
        del rule["counterexamples"][0]["steps"]
    elif damage == "unknown top-level field":
        report["verdict"] = "ok"
    elif damage == "negative conviction":
        rule["runs"][0]["conviction_s"] = -1.0
    elif damage == "wrong format":
        report["format"] = "junit"
    elif damage == "picture without panels":
        rule["counterexamples"][0]["picture"] = {"suite": "manager", "rule": "KV-POOL-007", "step": 3}
    elif damage == "picture as text":
        rule["counterexamples"][0]["picture"] = "block tables"
    with pytest.raises(report_schema.InvalidReport) as raised:
        report_schema.validate_report(report)
    assert raised.value.errors


def test_validate_report_names_the_extra_without_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema now raises ImportError
    with pytest.raises(ImportError, match=r"kvoracle\[report\]"):
        report_schema.validate_report({})
    assert report_schema.load_schema()["properties"]["format_version"]["const"] == 1  # needs no jsonschema


# -- timing ---------------------------------------------------------------------------------------
def test_a_failure_drawn_without_contracts_is_detected_when_drawn_and_counted_when_confirmed() -> None:
    """A check failing while kvoracle's contracts are off and Hypothesis draws (not shrinks) is not
    counted, but its time is the rule's detection once a failure with them on confirms the rule."""
    from kvoracle.spec.contracts import can_suspend, suspended

    if not can_suspend():
        pytest.skip("this icontract has no in-progress guard to suspend the checks with")
    verdicts = Verdicts(Capabilities())
    rule = "KV-POOL-007"
    outcome = verdicts.outcomes[rule]
    with suspended(), pytest.raises(AssertionError):
        verdicts.check(rule, False, "drawn")
    assert outcome.failed_checks == 0 and outcome.first_failure_s is None
    drawn = verdicts.provisional_failures[rule]
    assert drawn is not None and list(verdicts.seen_failing) == [rule]
    time.sleep(0.01)
    with pytest.raises(AssertionError):
        verdicts.check(rule, False, "replayed")
    assert outcome.failed_checks == 1 and outcome.first_failure_s == drawn
    verdicts.record(Counterexample(rule, "replayed", []))
    assert outcome.conviction_s >= drawn + 0.01


def test_failed_check_and_record_set_the_times_once() -> None:
    verdicts = Verdicts(Capabilities())
    rule = "KV-POOL-007"
    outcome = verdicts.outcomes[rule]
    verdicts.check(rule, True)
    assert outcome.first_failure_s is None and outcome.conviction_s is None
    time.sleep(0.01)
    with pytest.raises(AssertionError):
        verdicts.check(rule, False, "first")
    detected = outcome.first_failure_s
    assert detected is not None and detected >= 0.01
    time.sleep(0.01)
    with pytest.raises(AssertionError):
        verdicts.check(rule, False, "again")
    assert outcome.first_failure_s == detected  # the first failure only
    verdicts.record(Counterexample(rule, "first", []))
    assert outcome.conviction_s is not None and outcome.conviction_s >= detected + 0.01
    convicted = outcome.conviction_s
    verdicts.record(Counterexample(rule, "second", []))
    assert outcome.conviction_s == convicted
    # An engine error recorded without a failed check (a hang) is detected when convicted.
    verdicts.record(Counterexample("KV-POOL-013", "hung", [], engine_error=True, shrunk=False))
    hang = verdicts.outcomes["KV-POOL-013"]
    assert hang.first_failure_s == hang.conviction_s is not None
    # Verdicts not timed (the supervisor's, rebuilt from a record) invent no times.
    untimed = Verdicts(Capabilities())
    untimed.started = None
    untimed.record(Counterexample(rule, "died", [], engine_error=True, shrunk=False))
    assert untimed.outcomes[rule].first_failure_s is None and untimed.outcomes[rule].conviction_s is None


def test_a_real_run_times_detection_and_conviction(broken_run: CheckResult) -> None:
    run = broken_run.runs[0]
    outcome = run.verdicts.outcomes["KV-POOL-007"]
    assert outcome.outcome == FAIL
    assert 0 <= outcome.first_failure_s <= outcome.conviction_s
    # The verdicts' clock starts a moment before the rounds' (whose span duration_s is).
    assert outcome.conviction_s <= run.duration_s + 1.0
    passed = run.verdicts.outcomes["KV-POOL-011"]
    assert passed.outcome == PASS and passed.first_failure_s is None and passed.conviction_s is None
    rule = _rule(to_json(broken_run), "KV-POOL-007")
    assert rule["runs"] == [{"suite": "manager", "part": "lockstep", "outcome": FAIL, "checks": outcome.checks,
                             "failed_checks": outcome.failed_checks,
                             "first_failure_s": round(outcome.first_failure_s, 3),
                             "conviction_s": round(outcome.conviction_s, 3)}]
    in_suite = to_json(broken_run)["suites"][0]["rules"]["KV-POOL-007"]
    assert in_suite["conviction_s"] == round(outcome.conviction_s, 3)


def test_times_survive_the_supervisors_records(broken_run: CheckResult, command_run: dict) -> None:
    run = broken_run.runs[0]
    back = run_from_record(json.loads(json.dumps(run_to_record(run))))
    for rule_id, outcome in run.verdicts.outcomes.items():
        again = back.verdicts.outcomes[rule_id]
        assert (again.first_failure_s, again.conviction_s) == (outcome.first_failure_s, outcome.conviction_s)
    assert back.verdicts.started is None
    # The supervised command's report has them: they crossed the worker's checkpoint.
    runs = _rule(command_run["report"], "KV-POOL-007")["runs"]
    assert len(runs) == 1 and runs[0]["first_failure_s"] is not None
    assert 0 <= runs[0]["first_failure_s"] <= runs[0]["conviction_s"]


def test_a_run_whose_engine_died_is_reported_untimed_where_the_supervisor_charged_it(crash_run: dict) -> None:
    pytest.importorskip("jsonschema")
    report = crash_run["report"]
    assert crash_run["returncode"] == 1, crash_run["output"]
    report_schema.validate_report(report)
    assert not report["complete"] and "SIGSEGV" in report["incomplete_reason"]
    rule = _rule(report, "KV-POOL-014")
    assert rule["outcome"] == ERROR and "the process died (SIGSEGV)" in rule["counterexamples"][0]["message"]
    # The supervisor charged the death after the worker's clock was gone: no invented times.
    assert [(r["first_failure_s"], r["conviction_s"]) for r in rule["runs"]] == [(None, None)]
    root = ET.fromstring(crash_run["junit"])
    cases = {c.get("name").split(" ", 1)[0]: c for c in root.iter("testcase")}
    assert "the process died (SIGSEGV)" in cases["KV-POOL-014"].find("error").get("message")
    run_case = cases["kvoracle"]
    assert run_case.find("error").get("type") == "incomplete" and "SIGSEGV" in run_case.find("error").get("message")
    assert int(root.get("errors")) == 2
    assert int(root.get("tests")) == len(get_suite("lockstep").scope()) + 1


# -- JUnit ----------------------------------------------------------------------------------------
def test_junit_of_real_runs_agrees_with_their_verdicts(reference_run: CheckResult, broken_run: CheckResult) -> None:
    _check_junit_against(reference_run, junit_xml(reference_run))
    root = _check_junit_against(broken_run, junit_xml(broken_run))
    case = next(c for c in root.iter("testcase") if c.get("name").startswith("KV-POOL-007 "))
    failure = case.find("failure")
    outcome = broken_run.runs[0].verdicts.outcomes["KV-POOL-007"]
    example = outcome.counterexamples[0]
    assert failure.get("type") == FAIL and failure.get("message") == example.message
    assert failure.text.splitlines()[1].strip().startswith("1. Configure(")
    assert len([line for line in failure.text.splitlines() if line.strip()[:1].isdigit()]) == len(example.steps)
    assert f"replay: pytest {example.replay_path}" in failure.text and Path(example.replay_path).exists()
    assert float(case.get("time")) == pytest.approx(outcome.conviction_s, abs=1e-3)
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(props["first_failure_s"]) == pytest.approx(outcome.first_failure_s, abs=1e-3)
    passed = next(c for c in root.iter("testcase") if c.get("name").startswith("KV-POOL-011 "))
    assert float(passed.get("time")) == pytest.approx(broken_run.runs[0].duration_s, abs=1e-3)
    root = ET.fromstring(junit_xml(reference_run))
    listed = next(c for c in root.iter("testcase") if c.get("name").startswith(LISTED + " "))
    assert listed.find("failure").get("type") == UNEXPECTED_PASS


def test_command_writes_junit_with_the_expected_failure_skipped(command_run: dict) -> None:
    assert command_run["returncode"] == 0, command_run["output"]
    assert "JUnit XML report:" in command_run["output"]
    root = ET.fromstring(command_run["junit"])
    report = command_run["report"]
    in_run = report["suites"][0]["rules"]
    cases = root.find("testsuite").findall("testcase")
    # Every applicable rule of the JSON report is a test case, with the same verdict.
    for rule_id, data in in_run.items():
        case = next(c for c in cases if c.get("name").split(" ", 1)[0] == rule_id)
        assert _verdict_of(case) == JUNIT_ELEMENT[data["outcome"]]
    case = next(c for c in cases if c.get("name").startswith("KV-POOL-007 "))
    skipped = case.find("skipped")
    assert skipped.get("type") == EXPECTED_FAIL
    assert skipped.get("message") == "expected failure: frees head first, on purpose"
    assert "Free(" in skipped.text and "replay: pytest" in skipped.text
    assert int(root.get("skipped")) == sum(1 for c in cases if _verdict_of(c) == "skipped")
    assert int(root.get("failures")) == int(root.get("errors")) == 0


def test_junit_maps_every_outcome_and_keeps_the_xml_well_formed() -> None:
    scope = set(get_suite("hybrid").scope())
    verdicts = Verdicts(Capabilities(), scope=lambda rule: rule.id in scope, out_of_scope="not judged")
    applicable = [r for r in get_suite("hybrid").scope() if verdicts.applicable(r)]
    passed, failed, errored, xfailed, xpassed, unexercised = applicable[:6]
    outcomes = verdicts.outcomes
    for rule_id in applicable[:6]:
        outcomes[rule_id].checks = 3
    outcomes[unexercised].checks = 0
    outcomes[failed].failed_checks = 1
    outcomes[failed].counterexamples.append(Counterexample(
        failed, "hit \x00\x1b[31m <&> wrong", [StepText("Configure(x=1)"), StepText("LookUp(y=2)")],
        replay_path="r/test_x.py", suite="hybrid"))
    outcomes[failed].first_failure_s, outcomes[failed].conviction_s = 0.25, 1.5
    outcomes[errored].errors.append(Counterexample(errored, "KeyError: 'b'", ["Configure(x=1)"],
                                                   engine_error=True, suite="hybrid"))
    outcomes[xfailed].expected = "known"
    outcomes[xfailed].failed_checks = 2
    outcomes[xfailed].counterexamples.append(Counterexample(xfailed, "off by one", ["Configure(x=1)"]))
    outcomes[xpassed].expected = "was broken"
    run = RunResult("hybrid", "eng", "1.0", "pkg:Eng", RunOptions(), verdicts, rounds=1, examples=9,
                    duration_s=2.5, internal_errors=["ZeroDivisionError: oops"])
    result = CheckResult("pkg:Eng", RunOptions(), runs=[run])
    assert {outcomes[r].outcome for r in applicable[:6]} == {PASS, FAIL, ERROR, EXPECTED_FAIL, UNEXPECTED_PASS,
                                                            UNEXERCISED}
    document = junit_xml(result)
    root = _check_junit_against(result, document)
    cases = {c.get("name").split(" ", 1)[0]: c for c in root.iter("testcase")}
    failure = cases[failed].find("failure")
    assert failure.get("message") == "hit \\x00\\x1b[31m <&> wrong"  # control characters escaped, text kept
    assert "replay: pytest r/test_x.py" in failure.text and "2. LookUp(y=2)" in failure.text
    assert cases[failed].get("time") == "1.500"
    assert cases[passed].get("time") == "2.500"
    assert cases[errored].find("error").get("message") == "KeyError: 'b'"
    assert cases[xfailed].find("skipped").get("message") == "expected failure: known"
    assert cases[xpassed].find("failure").get("type") == UNEXPECTED_PASS
    assert cases[unexercised].find("failure").get("type") == UNEXERCISED
    not_applicable = next(r for r in get_suite("hybrid").scope() if not verdicts.applicable(r))
    assert cases[not_applicable].find("skipped").get("message") == outcomes[not_applicable].not_applicable
    assert cases[not_applicable].get("time") == "0.000"
    internal = cases["kvoracle"]
    assert internal.get("name") == "kvoracle run" and "ZeroDivisionError" in internal.find("error").get("message")
    assert root.find("testsuite").get("errors") == "2"


def test_junit_file_is_refused_up_front_when_it_cannot_be_written(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    code = main(["check", "--engine", "reference", "--junit", str(tmp_path), "--no-replay",
                 "--hypothesis-dir", str(tmp_path / "h")])
    assert code == 2
    assert f"--junit {tmp_path} is a directory" in capsys.readouterr().err
