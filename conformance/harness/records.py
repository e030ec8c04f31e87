"""A suite run as plain data: written by a worker process, read back by its supervisor.

A record holds everything a report needs -- per-rule outcomes with their reasons and
counterexamples -- with each step kept as the text of its ``repr`` (the Python
expression that rebuilds it), so the reader needs none of the suite's classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from .capabilities import Capabilities
from .runner import RunOptions, RunResult
from .verdicts import Counterexample, RuleOutcome, Verdicts


class StepText(str):
    """A step read back from a record: its ``repr`` is the expression it was written as."""

    def __repr__(self) -> str:
        return str(self)


def _example(example: Counterexample) -> dict[str, Any]:
    return {"rule_id": example.rule_id, "message": example.message, "steps": [repr(s) for s in example.steps],
            "engine_error": example.engine_error, "replay_path": example.replay_path, "suite": example.suite,
            "flaky": example.flaky, "shrunk": example.shrunk, "picture": example.picture}


def _example_from(data: dict[str, Any]) -> Counterexample:
    return Counterexample(**{**data, "steps": [StepText(s) for s in data["steps"]]})


def run_to_record(run: RunResult) -> dict[str, Any]:
    options = attrs.asdict(run.options)
    for name in ("replay_dir", "hypothesis_dir"):
        options[name] = None if options[name] is None else str(options[name])
    return {
        "suite": run.suite, "part": run.part, "engine_name": run.engine_name, "engine_version": run.engine_version,
        "engine_spec": run.engine_spec, "options": options, "rounds": run.rounds, "examples": run.examples,
        "duration_s": run.duration_s, "internal_errors": run.internal_errors, "incomplete": run.incomplete,
        "capabilities": attrs.asdict(run.verdicts.capabilities),
        "outcomes": [{"rule_id": o.rule_id, "not_applicable": o.not_applicable, "checks": o.checks,
                      "failed_checks": o.failed_checks, "expected": o.expected,
                      "first_failure_s": o.first_failure_s, "conviction_s": o.conviction_s,
                      "counterexamples": [_example(e) for e in o.counterexamples],
                      "errors": [_example(e) for e in o.errors]} for o in run.verdicts.outcomes.values()],
    }


def run_from_record(data: dict[str, Any]) -> RunResult:
    verdicts = Verdicts(Capabilities(**data["capabilities"]))
    verdicts.started = None  # the worker's clock: times are read back, never taken here
    for item in data["outcomes"]:
        verdicts.outcomes[item["rule_id"]] = RuleOutcome(
            item["rule_id"], not_applicable=item["not_applicable"], checks=item["checks"],
            failed_checks=item["failed_checks"], expected=item["expected"],
            first_failure_s=item.get("first_failure_s"), conviction_s=item.get("conviction_s"),
            counterexamples=[_example_from(e) for e in item["counterexamples"]],
            errors=[_example_from(e) for e in item["errors"]])
    options = dict(data["options"])
    for name in ("replay_dir", "hypothesis_dir"):
        options[name] = None if options[name] is None else Path(options[name])
    return RunResult(data["suite"], data["engine_name"], data["engine_version"], data["engine_spec"],
                     RunOptions(**options), verdicts, data["rounds"], data["examples"], data["duration_s"],
                     list(data["internal_errors"]), data["incomplete"], data.get("part", ""))
