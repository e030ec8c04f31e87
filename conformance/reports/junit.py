"""JUnit XML for CI systems: ``kvoracle check --junit FILE``.

One ``<testsuite>`` per suite run (a part of a suite, such as ``lockstep``, is a run of its
own), holding one ``<testcase>`` per rule the run judges: ``classname`` is the suite and
the rule's chapter (``manager.block_pool``), ``name`` the rule's ID and title. A verdict
becomes what a CI system shows:

==================  ========================================================================
``pass``            a plain test case
``fail``            ``<failure type="fail">``: the counterexample's message, and as text its
                    steps and the replay file (every counterexample the rule got)
``unexpected-pass`` ``<failure type="unexpected-pass">``: listed as failing, it passed
``unexercised``     ``<failure type="unexercised">``: applicable, never checked (as the pytest
                    plugin fails it: the verdict is not OK, the run did not reach the rule)
``error``           ``<error type="error">``: the engine raised, returned the wrong type, hung
                    or died, with its steps
``expected-fail``   ``<skipped type="expected-fail" message="expected failure: REASON">`` and
                    the counterexample as text, as pytest reports an xfail
``not-applicable``  ``<skipped type="not-applicable" message="REASON">``
==================  ========================================================================

A run that hit an error of kvoracle's own or was cut short gets one more test case,
``kvoracle run``, with an ``<error>``, so that CI shows the run as broken however its rules
came out.

A test case's ``time`` is how long the run spent on the rule: the seconds to its conviction
(its counterexample recorded) for a rule that failed, the whole run for a rule judged to
its end, 0 for one not applicable. The rules of a run are checked together, so their times
overlap; a ``<testsuite>``'s ``time`` is its run's. Each test case's ``<properties>`` give the
verdict, the checks and the times to detection and conviction.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from kvoracle import __version__
from kvoracle.spec import Rule, all_rules

from ..harness.report import examples_of, format_example, seconds
from ..harness.runner import CheckResult, RunResult
from ..harness.suites import get_suite
from ..harness.verdicts import (
    ERROR,
    EXPECTED_FAIL,
    FAIL,
    NOT_APPLICABLE,
    UNEXERCISED,
    UNEXPECTED_PASS,
    RuleOutcome,
)

#: Characters XML 1.0 cannot hold (an engine's message may carry any).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: object) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(value))


def _time(value: float | None) -> str:
    return f"{seconds(value or 0.0):.3f}"


def run_label(run: RunResult) -> str:
    """The run's name: its suite, or the part of it the run was asked for by."""
    return run.part or run.suite


def judged_rules(run: RunResult) -> list[Rule]:
    """The rules ``run``'s suite (or part) judges: its test cases."""
    try:
        scope = set(get_suite(run_label(run)).scope())
    except KeyError:  # a suite not registered in this process: the rules' own metadata says
        scope = {rule.id for rule in all_rules() if run.suite in rule.judged_by}
    return [rule for rule in all_rules() if rule.id in scope]


def _examples_text(outcome: RuleOutcome) -> str:
    blocks = [format_example(example) for example in examples_of(outcome)]
    if not blocks and outcome.failed_checks:
        blocks.append(f"{outcome.failed_checks} failed checks (no counterexample was kept)")
    return "\n\n".join(blocks)


def _first_message(outcome: RuleOutcome) -> str:
    examples = examples_of(outcome)
    return examples[0].message if examples else f"{outcome.failed_checks} failed checks"


def case_time(run: RunResult, outcome: RuleOutcome) -> float:
    """Seconds the run spent on the rule (see the module's description)."""
    if outcome.outcome == NOT_APPLICABLE:
        return 0.0
    for value in (outcome.conviction_s, outcome.first_failure_s):
        if value is not None:
            return value
    return run.duration_s


def _properties(parent: ET.Element, values: dict[str, object]) -> None:
    properties = ET.SubElement(parent, "properties")
    for name, value in values.items():
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=_text(value))


def _testcase(parent: ET.Element, run: RunResult, rule: Rule) -> str:
    """Add ``rule``'s test case; return its outcome."""
    outcome = run.verdicts.outcomes[rule.id]
    verdict = outcome.outcome
    case = ET.SubElement(parent, "testcase", classname=f"{run_label(run)}.{rule.chapter}",
                         name=_text(f"{rule.id} {rule.title}"), time=_time(case_time(run, outcome)))
    _properties(case, {"outcome": verdict, "checks": outcome.checks, "failed_checks": outcome.failed_checks,
                       "first_failure_s": seconds(outcome.first_failure_s),
                       "conviction_s": seconds(outcome.conviction_s)})
    if verdict in (FAIL, ERROR):
        tag = "failure" if verdict == FAIL else "error"
        element = ET.SubElement(case, tag, type=verdict, message=_text(_first_message(outcome)))
        element.text = _text(_examples_text(outcome))
    elif verdict == UNEXPECTED_PASS:
        ET.SubElement(case, "failure", type=verdict, message=_text(
            f"listed as an expected failure ({outcome.expected}), but passed {outcome.checks} checks"))
    elif verdict == UNEXERCISED:
        ET.SubElement(case, "failure", type=verdict, message=_text(
            f"applicable, but the {run_label(run)} run never reached a check of it"
            + (f" (listed as an expected failure: {outcome.expected})" if outcome.expected else "")))
    elif verdict == EXPECTED_FAIL:
        element = ET.SubElement(case, "skipped", type=verdict,
                                message=_text(f"expected failure: {outcome.expected}"))
        element.text = _text(_examples_text(outcome))
    elif verdict == NOT_APPLICABLE:
        ET.SubElement(case, "skipped", type=verdict, message=_text(outcome.not_applicable))
    return verdict


def _testsuite(parent: ET.Element, run: RunResult) -> dict[str, int]:
    suite = ET.SubElement(parent, "testsuite", name=run_label(run))
    _properties(suite, {"suite": run.suite, "part": run.part or None, "engine": run.engine_name,
                        "engine_version": run.engine_version, "engine_spec": run.engine_spec,
                        "seed": run.options.seed, "examples": run.examples, "rounds": run.rounds,
                        "incomplete": run.incomplete})
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for rule in judged_rules(run):
        verdict = _testcase(suite, run, rule)
        counts["tests"] += 1
        if verdict in (FAIL, UNEXPECTED_PASS, UNEXERCISED):
            counts["failures"] += 1
        elif verdict == ERROR:
            counts["errors"] += 1
        elif verdict in (EXPECTED_FAIL, NOT_APPLICABLE):
            counts["skipped"] += 1
    problems = [f"kvoracle internal error (a kvoracle bug, please report): {e}" for e in run.internal_errors]
    if run.incomplete is not None:
        problems.append(f"the run is incomplete: {run.incomplete}")
    if problems:
        case = ET.SubElement(suite, "testcase", classname=run_label(run), name="kvoracle run",
                             time=_time(run.duration_s))
        element = ET.SubElement(case, "error", type="internal-error" if run.internal_errors else "incomplete",
                                message=_text(problems[0]))
        element.text = _text("\n".join(problems))
        counts["tests"] += 1
        counts["errors"] += 1
    for name, value in {**counts, "time": _time(run.duration_s)}.items():
        suite.set(name, str(value))
    return counts


def to_junit(result: CheckResult) -> ET.Element:
    """The ``<testsuites>`` element of ``result``'s JUnit report."""
    root = ET.Element("testsuites", name=f"kvoracle {__version__}: {_text(result.engine)}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for run in result.runs:
        for name, count in _testsuite(root, run).items():
            totals[name] += count
    for name, value in {**totals, "time": _time(sum(run.duration_s for run in result.runs))}.items():
        root.set(name, str(value))
    return root


def junit_xml(result: CheckResult) -> str:
    """``result`` as a JUnit XML document."""
    root = to_junit(result)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(result: CheckResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(result), encoding="utf-8")
