"""Reports: the per-rule verdict table and the machine-readable JSON report.

One ``kvoracle check`` runs one or more suites. A rule judged by several suites gets
one row: its verdict is the worst of its suites' (a failure anywhere is a failure),
and the row says what each suite found.

The JSON report (:func:`to_json`) names its format and the format's version: a reader
checks ``format == "kvoracle-report"`` and the integer ``format_version``. The version
is raised when a reader written for the previous version could misread a report: a field
removed or renamed, a field's type or meaning changed, a value added to a closed set (an
outcome). Adding a field raises nothing, so a reader ignores fields it does not know. The
JSON Schema of the reports this kvoracle writes is ``kvoracle.conformance.reports``'
``report.schema.json`` (:mod:`kvoracle.conformance.reports.schema`).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from kvoracle import __version__
from kvoracle.spec import all_rules, get_rule

from .database import shown
from .runner import CheckResult, RunResult
from .verdicts import (
    ERROR,
    EXPECTED_FAIL,
    FAIL,
    GOOD_OUTCOMES,
    NOT_APPLICABLE,
    PASS,
    UNEXERCISED,
    UNEXPECTED_PASS,
    Counterexample,
    RuleOutcome,
)

#: What the JSON report says it is, and the major version of that format (see above).
REPORT_FORMAT = "kvoracle-report"
REPORT_FORMAT_VERSION = 1

_MARKS = {PASS: "PASS", FAIL: "FAIL", ERROR: "ERROR", EXPECTED_FAIL: "XFAIL",
          UNEXPECTED_PASS: "XPASS", NOT_APPLICABLE: "n/a", UNEXERCISED: "UNEXERCISED"}
#: Worst first: a rule's combined verdict is the first of these any suite gave it.
SEVERITY = (FAIL, ERROR, UNEXPECTED_PASS, UNEXERCISED, EXPECTED_FAIL, PASS, NOT_APPLICABLE)


def _judging(result: CheckResult, rule_id: str) -> list[tuple[RunResult, RuleOutcome]]:
    """The runs that judge ``rule_id`` (applicable there), or every run if none does."""
    pairs = [(run, run.verdicts.outcomes[rule_id]) for run in result.runs]
    judged = [(run, o) for run, o in pairs if o.outcome != NOT_APPLICABLE]
    return judged or pairs


def combined_outcome(result: CheckResult, rule_id: str) -> str:
    outcomes = {o.outcome for _, o in _judging(result, rule_id)}
    return next(s for s in SEVERITY if s in outcomes)


def examples_of(outcome: RuleOutcome) -> list[Counterexample]:
    return outcome.counterexamples + outcome.errors


def _unjudged_reason(result: CheckResult, rule_id: str) -> str:
    """Why no suite of this check judged ``rule_id``."""
    rule = get_rule(rule_id)
    if rule.spec_only:
        return "spec only: " + rule.spec_only
    if rule.judged_by:
        return f"judged by {', '.join(rule.judged_by)}, not run here"
    return "not yet judged by any suite"


def _detail(result: CheckResult, rule_id: str) -> str:
    judging = _judging(result, rule_id)
    outcome = next((o for _, o in judging if examples_of(o)), judging[0][1])
    if outcome.not_applicable is not None:
        if not any(run.suite in get_rule(rule_id).judged_by for run, _ in judging):
            return _unjudged_reason(result, rule_id)
        return outcome.not_applicable
    if outcome.expected is not None:
        return "expected: " + outcome.expected
    examples = examples_of(outcome)
    if examples:
        example = examples[0]
        flags = "".join(f" [{flag}]" for flag, on in (("flaky", example.flaky),
                                                       ("not shrunk", not example.shrunk)) if on)
        where = f" [replay: {example.replay_path}]" if example.replay_path else ""
        return f"{example.message[:140]}{flags}{where}"
    if outcome.failed_checks:
        return f"{outcome.failed_checks} failed checks"
    return ""


def summary(result: CheckResult) -> dict[str, int]:
    counts = dict.fromkeys(SEVERITY, 0)
    for rule in all_rules():
        counts[combined_outcome(result, rule.id)] += 1
    return counts


def format_table(result: CheckResult) -> str:
    """The verdict table printed by ``kvoracle check``."""
    rows = []
    several = len(result.runs) > 1
    for rule in all_rules():
        judging = _judging(result, rule.id)
        verdict = _MARKS[combined_outcome(result, rule.id)]
        checks = sum(o.checks for _, o in judging)
        suites = " ".join(f"{run.suite}:{_MARKS[o.outcome]}" for run, o in judging
                          if o.outcome != NOT_APPLICABLE) if several else ""
        rows.append((rule.id, rule.title[:52], verdict, str(checks), suites, _detail(result, rule.id)))
    header = ("rule", "title", "verdict", "checks", "suites" if several else "")
    widths = [max(len(row[i]) for row in [*rows, header]) for i in range(5)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  detail"]
    lines.append("-" * (sum(widths) + 10 + 6))
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5])
    lines.append("")
    lines.append(", ".join(f"{n} {_MARKS[name]}" for name, n in summary(result).items() if n))
    for run in result.runs:
        label = f"{run.suite} ({run.part} part)" if run.part else run.suite
        lines.append(f"{label}: engine {run.engine_name} {run.engine_version}; {run.examples} examples "
                     f"in {run.rounds} round(s), {run.duration_s:.1f} s; seed {run.options.seed}"
                     + (f"; INCOMPLETE: {run.incomplete}" if run.incomplete else ""))
        for error in run.internal_errors:
            lines.append(f"INTERNAL ERROR (a kvoracle bug, please report): {error}")
    for name, reason in result.unsupported.items():
        lines.append(f"{name}: not run ({reason})")
    for name in result.not_run:
        lines.append(f"{name}: not run (--fail-fast: an earlier suite failed)")
    if result.incomplete:
        lines.append(f"INCOMPLETE: {result.incomplete}; the verdicts above are those so far")
    lines.append("RESULT: " + result_word(result))
    return "\n".join(lines)


def result_word(result: CheckResult) -> str:
    """The check's overall result: ``OK``, ``INCOMPLETE`` or ``NOT CONFORMING``."""
    if result.ok:
        return "OK"
    # A cut-short run convicts only on what it found: a rule it had not reached yet is no failure.
    convicted = any(run.internal_errors or any(o.outcome not in (*GOOD_OUTCOMES, UNEXERCISED)
                                               for o in run.verdicts.outcomes.values()) for run in result.runs)
    return "INCOMPLETE" if result.incomplete and not convicted else "NOT CONFORMING"


def format_example(example: Counterexample, before: str = "", after: str = "") -> str:
    """One counterexample as text: ``{before}{kind}{after}{flags}: message``, then its numbered
    steps and the command that replays it."""
    kind = "engine error" if example.engine_error else "counterexample"
    flags = "".join(f" ({flag})" for flag, on in (("flaky", example.flaky), ("not shrunk", not example.shrunk))
                    if on)
    lines = [f"{before}{kind}{after}{flags}: {example.message}"]
    lines += [f"  {i:>3}. {step!r}" for i, step in enumerate(example.steps, 1)]
    if example.replay_path:
        lines.append(f"  replay: pytest {example.replay_path}")
    return "\n".join(lines)


def format_counterexamples(result: CheckResult) -> str:
    """Each failing rule's shrunk step list."""
    return "\n\n".join(format_example(example, f"{rule_id} ", f" ({run.suite} suite)")
                        for run in result.runs for rule_id, outcome in run.verdicts.outcomes.items()
                        for example in examples_of(outcome))


def _example_json(example: Counterexample) -> dict:
    return {"suite": example.suite, "message": example.message, "engine_error": example.engine_error,
            "flaky": example.flaky, "shrunk": example.shrunk,
            "steps": [repr(s) for s in example.steps], "replay": example.replay_path, "picture": example.picture}


def seconds(value: float | None) -> float | None:
    """A time as reports give it: to the millisecond, or ``None``."""
    return None if value is None else round(value, 3)


def _timing(outcome: RuleOutcome) -> dict:
    return {"first_failure_s": seconds(outcome.first_failure_s), "conviction_s": seconds(outcome.conviction_s)}


def _run_json(run: RunResult) -> dict:
    return {
        "suite": run.suite, "part": run.part or None, "engine": {"name": run.engine_name, "version": run.engine_version,
                                       "spec": run.engine_spec},
        "examples": run.examples, "rounds": run.rounds, "duration_s": round(run.duration_s, 3),
        "summary": run.verdicts.summary(), "internal_errors": run.internal_errors,
        "complete": run.incomplete is None, "incomplete_reason": run.incomplete, "ok": run.ok,
        "rules": {rule_id: {"outcome": o.outcome, "checks": o.checks, "failed_checks": o.failed_checks,
                            **_timing(o)}
                  for rule_id, o in run.verdicts.outcomes.items() if o.outcome != NOT_APPLICABLE},
    }


def to_json(result: CheckResult) -> dict:
    rules = []
    for rule in all_rules():
        judging = _judging(result, rule.id)
        outcome = judging[0][1]
        rules.append({
            "id": rule.id, "title": get_rule(rule.id).title, "kind": rule.kind, "chapter": rule.chapter,
            "outcome": combined_outcome(result, rule.id), "checks": sum(o.checks for _, o in judging),
            "failed_checks": sum(o.failed_checks for _, o in judging),
            "suites": {run.suite: o.outcome for run, o in judging if o.outcome != NOT_APPLICABLE},
            # The same per suite run (a part of a suite is a run of its own), with its times.
            "runs": [{"suite": run.suite, "part": run.part or None, "outcome": o.outcome, "checks": o.checks,
                      "failed_checks": o.failed_checks, **_timing(o)}
                     for run, o in judging if o.outcome != NOT_APPLICABLE],
            "reason": _detail(result, rule.id) if outcome.not_applicable else outcome.expected,
            "counterexamples": [_example_json(e) for _, o in judging for e in examples_of(o)],
        })
    first = result.runs[0] if result.runs else None
    return {
        "format": REPORT_FORMAT,
        "format_version": REPORT_FORMAT_VERSION,
        "kvoracle_version": __version__,
        "python": platform.python_version(),
        "engine": {"name": first.engine_name, "version": first.engine_version, "spec": result.engine}
        if first else {"spec": result.engine},
        "seed": result.options.seed,
        "options": {"max_examples": result.options.max_examples, "step_count": result.options.step_count,
                    "step_timeout": result.options.step_timeout,
                    "timeout_clock": result.options.timeout_clock, "max_rounds": result.options.max_rounds,
                    "fail_fast": result.options.fail_fast, "shrink_calls": result.options.shrink_calls,
                    "search_calls": result.options.search_calls, "contracts": result.options.contracts,
                    "database": None if result.options.database is None else shown(result.options.database)},
        "suites": [_run_json(run) for run in result.runs],
        "unsupported_suites": result.unsupported,
        "not_run_suites": result.not_run,
        "examples": sum(run.examples for run in result.runs),
        "rounds": sum(run.rounds for run in result.runs),
        "duration_s": round(sum(run.duration_s for run in result.runs), 3),
        "summary": summary(result),
        "internal_errors": [e for run in result.runs for e in run.internal_errors],
        "complete": result.incomplete is None,
        "incomplete_reason": result.incomplete,
        "ok": result.ok,
        "rules": rules,
    }


def write_json(result: CheckResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")
