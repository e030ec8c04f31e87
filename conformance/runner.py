"""Running the conformance suite against one engine and collecting per-rule verdicts.

A run is a sequence of *rounds*. Each round runs the lockstep machine under
Hypothesis; when a rule fails, Hypothesis shrinks the failing example, the
counterexample (its step list) is recorded and written as a replay file, the
rule is *suppressed* (its later failures are counted but no longer stop an
example) and the next round looks for failures of the other rules. The run
ends when a round finds nothing new or after ``max_rounds`` rounds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity
from hypothesis.errors import HypothesisException
from hypothesis.stateful import get_state_machine_test

from .adapter import EngineAdapter

if sys.version_info < (3, 11):  # Hypothesis brings the backport there
    from exceptiongroup import BaseExceptionGroup
from .engines import engine_spec_of, load_engine
from .lockstep import Quarantine
from .machine import make_machine
from .replay import write_replay
from .verdicts import Counterexample, RuleViolation, Verdicts, lockstep_verdicts


@attrs.define
class RunOptions:
    max_examples: int = 150
    step_count: int = 40
    seed: int = 0
    step_timeout: float | None = 10.0
    max_rounds: int = 12
    replay_dir: Path | None = Path("kvoracle-replays")


@attrs.frozen
class Suite:
    """What a run drives: how an engine is loaded, judged and replayed.

    The default is the lockstep suite; other suites (the hybrid lookup suite,
    :mod:`.hybrid_lookup`) reuse the rounds, suppression and replay files below.
    """

    load: Callable[[str], Callable[[], Any]] = load_engine
    make_verdicts: Callable[[Any, dict[str, str] | None], Verdicts] = \
        lambda probe, expectations: lockstep_verdicts(probe.capabilities(), expectations)
    make_machine: Callable[..., type] = make_machine
    write_replay: Callable[[Path, str, Counterexample], Path] = write_replay


LOCKSTEP = Suite()


@attrs.define
class RunResult:
    engine_name: str
    engine_version: str
    engine_spec: str
    options: RunOptions
    verdicts: Verdicts
    rounds: int
    examples: int
    duration_s: float
    internal_errors: list[str] = attrs.Factory(list)

    @property
    def ok(self) -> bool:
        return self.verdicts.ok() and not self.internal_errors


def _split_failures(error: BaseException) -> tuple[list[RuleViolation], list[BaseException]]:
    """The rule violations in what a round raised (one, or a group of several bugs), and the rest."""
    if isinstance(error, RuleViolation):
        return [error], []
    if isinstance(error, BaseExceptionGroup):
        violations: list[RuleViolation] = []
        others: list[BaseException] = []
        for inner in error.exceptions:
            found, rest = _split_failures(inner)
            violations += found
            others += rest
        return violations, others
    return [], [error]


def run_suite(engine: str | Callable[[], EngineAdapter], options: RunOptions | None = None,
              progress: Callable[[str], None] | None = None,
              expectations: dict[str, str] | None = None, suite: Suite = LOCKSTEP) -> RunResult:
    """Run every applicable rule against ``engine``; never raises for engine failures."""
    options = options or RunOptions()
    say = progress or (lambda message: None)
    factory = suite.load(engine) if isinstance(engine, str) else engine
    spec = engine if isinstance(engine, str) else engine_spec_of(engine)
    probe = factory()
    verdicts = suite.make_verdicts(probe, expectations)
    quarantine = Quarantine()
    examples = 0

    def count_example() -> None:
        nonlocal examples
        examples += 1
        if examples % 50 == 0:
            checks = sum(o.checks for o in verdicts.outcomes.values())
            say(f"  ... {examples} examples, {checks} checks")

    started = time.perf_counter()
    internal_errors: list[str] = []
    rounds = 0
    for round_index in range(options.max_rounds):
        rounds += 1
        machine = suite.make_machine(factory, verdicts, quarantine, options.step_timeout,
                               on_example=count_example)
        settings = hypothesis.settings(
            max_examples=options.max_examples, stateful_step_count=options.step_count,
            deadline=None, database=None, suppress_health_check=list(HealthCheck),
            # Several bugs per round, each shrunk on its own: with a single bug, Hypothesis
            # lets the shrinker slip from one failure to any smaller one, so a rule whose
            # failures also break a later check was reported under that other rule.
            verbosity=Verbosity.quiet, report_multiple_bugs=True,
            phases=(Phase.explicit, Phase.generate, Phase.shrink))
        test = hypothesis.seed(options.seed + round_index)(
            get_state_machine_test(machine, settings=settings))
        say(f"round {rounds}: up to {options.max_examples} examples of up to "
            f"{options.step_count} steps (seed {options.seed + round_index})")
        recorded_before = {rule for rule in verdicts.suppressed}
        try:
            test()
        except (HypothesisException, Exception) as error:
            violations, others = _split_failures(error)
            for violation in violations:
                example = Counterexample(violation.rule_id, violation.message,
                                         list(violation.steps), violation.is_engine_error)
                verdicts.record(example)
                kind = "engine error" if example.engine_error else "failure"
                say(f"  {kind}: {violation.rule_id} -- {violation.message}")
                say(f"  shrunk to {len(example.steps)} steps")
            for other in others:  # kvoracle's own bug, or Flaky
                internal_errors.append(f"{type(other).__name__}: {other}")
                say(f"  internal error: {type(other).__name__}: {other}")
            if others:
                break
            continue
        hangs = verdicts.suppressed - recorded_before
        for rule_id in sorted(hangs):
            say(f"  engine error: {rule_id} -- {verdicts.outcomes[rule_id].errors[0].message}")
        if hangs:
            continue
        say("  no new failure")
        break
    for example in verdicts.unrecorded_failures():
        verdicts.record(example)
    if options.replay_dir is not None:
        for outcome in verdicts.outcomes.values():
            for example in outcome.counterexamples + outcome.errors:
                if example.replay_path is None:
                    example.replay_path = str(suite.write_replay(options.replay_dir, spec, example))
    return RunResult(
        engine_name=getattr(probe, "name", type(probe).__name__),
        engine_version=str(probe.version()) if hasattr(probe, "version") else "unknown",
        engine_spec=spec, options=options, verdicts=verdicts, rounds=rounds,
        examples=examples, duration_s=time.perf_counter() - started,
        internal_errors=internal_errors)

