"""Reports: the per-rule verdict table and the machine-readable JSON report."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from kvoracle import __version__
from kvoracle.spec import get_rule

from .runner import RunResult

_MARKS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "expected-fail": "XFAIL",
          "unexpected-pass": "XPASS", "not-applicable": "n/a", "unexercised": "UNEXERCISED"}


def _detail(result: RunResult, rule_id: str) -> str:
    outcome = result.verdicts.outcomes[rule_id]
    if outcome.not_applicable is not None:
        return outcome.not_applicable
    if outcome.expected is not None:
        return "expected: " + outcome.expected
    examples = outcome.counterexamples or outcome.errors
    if examples:
        example = examples[0]
        where = f" [replay: {example.replay_path}]" if example.replay_path else ""
        return f"{example.message[:140]}{where}"
    if outcome.failed_checks:
        return f"{outcome.failed_checks} failed checks"
    return ""


def format_table(result: RunResult) -> str:
    """The verdict table printed by ``kvoracle check``."""
    rows = []
    for rule_id, outcome in result.verdicts.outcomes.items():
        rule = get_rule(rule_id)
        rows.append((rule_id, rule.title[:52], _MARKS[outcome.outcome],
                     str(outcome.checks), _detail(result, rule_id)))
    header = ("rule", "title", "verdict", "checks")
    widths = [max(len(row[i]) for row in [*rows, header]) for i in range(4)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  detail"]
    lines.append("-" * (sum(widths) + 8 + 6))
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    summary = result.verdicts.summary()
    lines.append("")
    lines.append(", ".join(f"{n} {name}" for name, n in summary.items() if n))
    lines.append(f"engine {result.engine_name} {result.engine_version}; {result.examples} "
                 f"examples in {result.rounds} round(s), {result.duration_s:.1f} s; seed "
                 f"{result.options.seed}")
    for error in result.internal_errors:
        lines.append(f"INTERNAL ERROR (a kvoracle bug, please report): {error}")
    lines.append("RESULT: " + ("OK" if result.ok else "NOT CONFORMING"))
    return "\n".join(lines)


def format_counterexamples(result: RunResult) -> str:
    """Each failing rule's shrunk step list."""
    blocks = []
    for rule_id, outcome in result.verdicts.outcomes.items():
        for example in outcome.counterexamples + outcome.errors:
            kind = "engine error" if example.engine_error else "counterexample"
            lines = [f"{rule_id} {kind}: {example.message}"]
            lines += [f"  {i:>3}. {step!r}" for i, step in enumerate(example.steps, 1)]
            if example.replay_path:
                lines.append(f"  replay: pytest {example.replay_path}")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def to_json(result: RunResult) -> dict:
    rules = []
    for rule_id, outcome in result.verdicts.outcomes.items():
        rule = get_rule(rule_id)
        rules.append({
            "id": rule_id, "title": rule.title, "kind": rule.kind, "chapter": rule.chapter,
            "outcome": outcome.outcome, "checks": outcome.checks,
            "failed_checks": outcome.failed_checks,
            "reason": outcome.not_applicable or outcome.expected,
            "counterexamples": [
                {"message": e.message, "engine_error": e.engine_error,
                 "steps": [repr(s) for s in e.steps], "replay": e.replay_path}
                for e in outcome.counterexamples + outcome.errors],
        })
    return {
        "kvoracle_version": __version__,
        "python": platform.python_version(),
        "engine": {"name": result.engine_name, "version": result.engine_version,
                   "spec": result.engine_spec},
        "seed": result.options.seed,
        "options": {"max_examples": result.options.max_examples,
                    "step_count": result.options.step_count,
                    "step_timeout": result.options.step_timeout,
                    "max_rounds": result.options.max_rounds},
        "examples": result.examples, "rounds": result.rounds,
        "duration_s": round(result.duration_s, 3),
        "summary": result.verdicts.summary(),
        "internal_errors": result.internal_errors,
        "ok": result.ok,
        "rules": rules,
    }


def write_json(result: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")

