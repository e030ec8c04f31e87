"""What the meta-tests' suite searches share: a run of one suite against a broken engine that asks
whether the suite *finds* the bug and charges it to the rule the bug breaks.

Such a run ends at the first failure (``fail_fast``) and barely shrinks it (``shrink_calls``):
the searches test generation and charging, and before they did so most of their time went into
shrinking counterexamples nobody read (``needs no copy``: 287 s in CI, 27 s of it to the first
failure). Shrinking, and replays that keep failing, have tests of their own (tests/test_harness.py,
tests/test_conformance.py). A search that must look past a first failure charged to another rule
the same fault breaks runs without ``fail_fast`` (``fail_fast=False``)."""

from __future__ import annotations

from pathlib import Path

from kvoracle.conformance.harness.runner import RunOptions, RunResult, run_suite

#: Test calls a search may spend shrinking: one, so that a found failure ends the run at once.
SEARCH_SHRINK_CALLS = 1


def search(engine: object, suite: str, replay_dir: Path | None, **options: object) -> RunResult:
    """One search of ``suite`` for ``engine``'s bug (150 examples unless told otherwise)."""
    settings = {"max_examples": 150, "fail_fast": True, "shrink_calls": SEARCH_SHRINK_CALLS,
                "replay_dir": replay_dir, **options}
    return run_suite(engine, RunOptions(**settings), suite=suite)


def rules_found(result: RunResult) -> set[str]:
    """The rules a run charged with a counterexample or an error."""
    return {o.rule_id for o in result.verdicts.outcomes.values() if o.counterexamples or o.errors}
