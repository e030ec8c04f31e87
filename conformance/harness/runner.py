"""Running suites against one engine and collecting per-rule verdicts.

A suite's run is a sequence of *rounds*. Each round runs the suite's machine under
Hypothesis; when rules fail, Hypothesis shrinks each failing example, the
counterexamples are recorded (and written as replay files), their rules are
*suppressed* (a later failure ends an example quietly) and the next round looks for
failures of the other rules. The run ends when a round finds nothing new or after
``max_rounds`` rounds. The runner knows no particular suite: everything
suite-specific comes from the :class:`~.suites.SuiteDef`.

An interrupted run (Ctrl-C) is not lost: the verdicts so far are returned, marked
incomplete, and the caller reports them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity
from hypothesis.errors import Flaky, HypothesisException
from hypothesis.stateful import get_state_machine_test

from .calls import CLOCKS, EngineCaller, EngineError, Trail
from .database import open_database, shown
from .determinism import CountingClocks, independent_of_hashing, independent_of_imports, independent_of_time
from .engines import EngineLoadError, engine_factory, engine_spec_of
from .machine import bind_machine, examples_key
from .replay import confirm_replay, picture_replay, write_replay
from .shrinking import CONTRACT_MODES, DEFAULT_CONTRACTS, contracts_checked_where
from .suites import SuiteDef, capabilities_of, get_suite
from .verdicts import Counterexample, RuleViolation, Verdicts

if sys.version_info < (3, 11):  # Hypothesis brings the backport there
    from exceptiongroup import BaseExceptionGroup


def default_hypothesis_dir() -> Path:
    """Where Hypothesis keeps its files unless asked otherwise: the user's cache, never the
    current directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvoracle" / "hypothesis"


#: Test calls Hypothesis may spend shrinking one round's failures, by default, with or without
#: fail-fast. Most of a shrink's gain comes in its first hundred or so calls: over vLLM 0.33.0's
#: source mutants on seed 1 (81 convicted under both), 150 calls instead of 500 halved the median
#: time to conviction (6.0 s to 3.1 s of CPU) and the counterexamples came out no longer (6 steps
#: median, 611 in all against 808); docs/results.md, issue 18's fifth part.
DEFAULT_SHRINK_CALLS = 150

#: Test calls a round goes on drawing after its first failing example, looking for other rules'
#: failures before it shrinks (Hypothesis' own limit is ten seconds of wall time, about a hundred
#: calls of the manager suite against vLLM here). A rule a round does not reach is still searched
#: for: the next round draws again with the convicted rules suppressed. Without the limit a round
#: searched on to twice the call of its last new failure: over the nine slowest of vLLM 0.33.0's
#: source mutants on seeds 0 to 9, 100 calls took the calls to conviction from 24,501 to 22,634,
#: those over 500 from 8 to 3 (docs/results.md, issue 18's fourteenth part).
DEFAULT_SEARCH_CALLS = 100


def search_calls_option(given: int | None) -> int | None:
    """``RunOptions.search_calls`` for a command-line value: absent, the default; 0, ``None``
    (Hypothesis' own count); any other value as given (a negative one fails ``problems()``)."""
    if given is None:
        return DEFAULT_SEARCH_CALLS
    return given or None


@attrs.define
class RunOptions:
    max_examples: int = 150
    step_count: int = 40
    seed: int = 0
    #: Seconds of engine time one engine call may take before it counts as a hang; None: no limit.
    step_timeout: float | None = 10.0
    #: "engine": wall time less time spent waiting for a CPU (load-independent); "wall".
    timeout_clock: str = "engine"
    max_rounds: int = 12
    replay_dir: Path | None = Path("kvoracle-replays")
    #: Hypothesis' own directory (``None``: :func:`default_hypothesis_dir`).
    hypothesis_dir: Path | None = None
    #: End at the first conviction (a rule that fails or errs, or kvoracle's own error): Hypothesis
    #: shrinks the first failing example it finds instead of looking on for others, and no later
    #: round or suite runs. A round that found only expected failures is searched again from its
    #: seed, those failures now ending their examples quietly.
    fail_fast: bool = False
    #: Test calls Hypothesis may spend shrinking the failures one round found: a count, not a
    #: time, so that a counterexample is the same on any machine and no shrink runs for minutes.
    shrink_calls: int = DEFAULT_SHRINK_CALLS
    #: Test calls a round goes on searching for other failures after its first failing example,
    #: before it shrinks them: a count, as ``shrink_calls``. ``None``: Hypothesis' own count alone
    #: (until twice the call of the last new failure, or 1,000 calls after the first).
    search_calls: int | None = DEFAULT_SEARCH_CALLS
    #: The example database (:mod:`.database`): a directory or a ``redis://`` URL whose stored
    #: failures are replayed before anything new is drawn, and where new ones are saved;
    #: ``None``: none (the examples depend on the seed alone).
    database: str | None = None
    #: After the rounds, replay each counterexample once to draw a picture of its failing step
    #: (:mod:`.picture`; the HTML report shows it).
    pictures: bool = False
    #: Where kvoracle's own contracts are checked (:mod:`.shrinking`): ``"reported"``, on the
    #: replay of each counterexample before it is reported; ``"drawing"``, on every example drawn too.
    contracts: str = DEFAULT_CONTRACTS

    def problems(self) -> list[str]:
        """What is wrong with these options (``kvoracle check`` refuses them before running)."""
        found = []
        for name in ("max_examples", "step_count", "max_rounds", "shrink_calls"):
            if getattr(self, name) < 1:
                found.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.search_calls is not None and self.search_calls < 1:
            found.append(f"search_calls must be >= 1 (or no limit), got {self.search_calls}")
        if self.step_timeout is not None and not self.step_timeout > 0:
            found.append(f"step_timeout must be positive (or no limit), got {self.step_timeout}")
        if self.timeout_clock not in CLOCKS:
            found.append(f"timeout_clock must be one of {CLOCKS}, got {self.timeout_clock!r}")
        if self.seed < 0:
            found.append(f"seed must be >= 0, got {self.seed}")
        if self.contracts not in CONTRACT_MODES:
            found.append(f"contracts must be one of {CONTRACT_MODES}, got {self.contracts!r}")
        return found


class SuiteLoadError(EngineLoadError):
    """The engine cannot be run in a suite: not loadable, or its adapter lacks operations."""


@attrs.define
class RunResult:
    """One suite's verdicts for one engine."""

    suite: str
    engine_name: str
    engine_version: str
    engine_spec: str
    options: RunOptions
    verdicts: Verdicts
    rounds: int = 0
    examples: int = 0
    duration_s: float = 0.0
    internal_errors: list[str] = attrs.Factory(list)
    #: Why the run stopped before its end (interrupted, the process crashed); None if complete.
    incomplete: str | None = None
    #: The alias the run was asked for by, when it ran a part of ``suite`` (else "").
    part: str = ""
    #: Engine operations whose calls never answered: their threads were abandoned and may
    #: still be running (a pure-Python loop holds the GIL of this process for good).
    abandoned: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdicts.ok() and not self.internal_errors and self.incomplete is None

    @property
    def convicted(self) -> bool:
        """A rule failed or erred, or kvoracle erred: what ends a fail-fast run."""
        return self.verdicts.convicted() or bool(self.internal_errors)


def _split_failures(error: BaseException, flaky: bool = False
                    ) -> tuple[list[tuple[RuleViolation, bool]], list[BaseException]]:
    """The rule violations in what a round raised (one, or a group of several bugs, each with
    whether Hypothesis found it flaky), and the rest."""
    if isinstance(error, RuleViolation):
        return [(error, flaky)], []
    if isinstance(error, BaseExceptionGroup):
        flaky = flaky or isinstance(error, Flaky)
        violations: list[tuple[RuleViolation, bool]] = []
        others: list[BaseException] = []
        for inner in error.exceptions:
            found, rest = _split_failures(inner, flaky)
            violations += found
            others += rest
        return violations, others
    return [], [error]


def load_suite_engine(engine: str | Callable[[], Any], suite: SuiteDef, caller: EngineCaller
                      ) -> tuple[Callable[[], Any], Any]:
    """The adapter factory for ``suite`` and a probe adapter built with it.

    Raises :class:`SuiteLoadError` naming what is wrong: nothing loadable, an adapter whose
    constructor fails, or one that lacks the suite's operations.
    """
    factory = engine_factory(engine, suite) if isinstance(engine, str) else engine
    name = engine if isinstance(engine, str) else engine_spec_of(engine, suite)
    try:
        probe = caller.construct(factory, loading=True)
    except EngineError as error:
        raise SuiteLoadError(f"engine {name!r}: building its {suite.name} adapter failed: {error.detail}"
                             ) from None
    missing = suite.missing_operations(probe)
    if missing:
        raise SuiteLoadError(f"engine {name!r} is not a {suite.name} adapter: it lacks "
                             f"{', '.join(missing)}")
    try:
        capabilities_of(probe)
    except Exception as error:
        raise SuiteLoadError(f"engine {name!r}: {error}") from None
    try:
        suite.machine_options(probe)
    except ValueError as error:
        raise SuiteLoadError(f"engine {name!r} cannot run {suite.alias or suite.name}: {error}") from None
    return factory, probe


#: Called with a run's result as it goes (``done`` at its end): a supervised worker's checkpoints.
Checkpoint = Callable[..., None]


class RunObserver:
    """Told how a run goes, while it goes: ``kvoracle check``'s live display
    (:mod:`kvoracle.conformance.reports.progress`) is one. Every method here does nothing; an
    observer overrides those it shows. It only observes: the runner reads nothing back, and an
    observer that raises is dropped for the rest of the run (one line says so), so no observer
    changes a verdict or an example count. ``suite`` is the name the run was asked for: a
    part's alias (``lockstep``), else the suite's name."""

    def suite_started(self, suite: str, label: str, engine: str) -> None:
        """A suite run begins, its engine loaded; ``label`` names it as the report does."""

    def round_started(self, suite: str, round_number: int, replaying: bool, max_examples: int,
                      seed: int) -> None:
        """Round ``round_number`` (from 1) begins: replaying the example database's stored
        failures, or drawing up to ``max_examples`` examples from ``seed``."""

    def example_started(self, suite: str, in_round: int, in_all: int) -> None:
        """An example begins (a test call: drawn, replayed or tried while shrinking); how many
        have begun in this round and in the suite run, this one included."""

    def failure_seen(self, suite: str, rule_id: str) -> None:
        """``rule_id`` failed in an example for the first time in this suite run. Its round goes
        on looking for other failures for a while, then shrinks."""

    def rule_failed(self, suite: str, rule_id: str, engine_error: bool) -> None:
        """``rule_id`` is convicted: its counterexample (shrunk, or as it was) is recorded."""

    def drawing(self, suite: str, count: int) -> None:
        """The rounds are over; ``count`` counterexamples are replayed for their pictures."""

    def suite_finished(self, suite: str, result: RunResult) -> None:
        """The suite run is over (complete or not, ``result.incomplete`` says)."""


class _Notify:
    """Calls an observer's methods; drops it at its first exception."""

    def __init__(self, observer: RunObserver | None, say: Callable[[str], None]) -> None:
        self.observer, self.say = observer, say

    def __call__(self, method: str, *args: Any) -> None:
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception as error:
            self.observer = None
            self.say(f"  progress display dropped ({type(error).__name__}: {error}); the run goes on")


def run_suite(engine: str | Callable[[], Any], options: RunOptions | None = None,
              progress: Callable[[str], None] | None = None,
              expectations: dict[str, str] | None = None, suite: str | SuiteDef = "manager",
              trail: Trail | None = None, checkpoint: Checkpoint | None = None, *,
              observer: RunObserver | None = None) -> RunResult:
    """Run every rule ``suite`` judges against ``engine``; never raises for engine failures.

    Raises :class:`SuiteLoadError` (or :class:`~.engines.EngineLoadError`) before running
    when the engine cannot be run in the suite. ``trail`` and ``checkpoint`` let a
    supervising process recover the run if the engine kills this one (:mod:`.supervisor`);
    ``observer`` is told how the run goes (:class:`RunObserver`).
    """
    options = options or RunOptions()
    problems = options.problems()
    if problems:
        raise ValueError("; ".join(problems))
    suite = get_suite(suite) if isinstance(suite, str) else suite
    say = progress or (lambda message: None)
    hypothesis.configuration.set_hypothesis_home_dir(options.hypothesis_dir or default_hypothesis_dir())
    caller = EngineCaller(options.step_timeout, returns=suite.returns, clock=options.timeout_clock, trail=trail)
    note = checkpoint or (lambda result, done=False: None)
    notify = _Notify(observer, say)
    try:
        factory, probe = load_suite_engine(engine, suite, caller)
        spec = engine if isinstance(engine, str) else engine_spec_of(engine, suite)
        scope = set(suite.scope())
        verdicts = Verdicts(capabilities_of(probe), expectations, scope=lambda rule: rule.id in scope,
                            out_of_scope=f"not judged by {suite.label}")
        for rule_id, reason in suite.exclusions(probe).items():
            if rule_id in scope:
                verdicts.exclude(rule_id, reason)
        result = RunResult(suite.name, str(getattr(probe, "name", type(probe).__name__)),
                           _version(probe), spec, options, verdicts, part=suite.alias)
        note(result)
        label = f"{result.suite} ({result.part} part)" if result.part else result.suite
        notify("suite_started", suite.alias or suite.name, label, spec)
        _rounds(result, suite, factory, probe, caller, say, note, notify)
        result.abandoned = tuple(sorted(caller.quarantine.hung))
    finally:
        caller.close()
    if options.replay_dir is not None:
        for outcome in verdicts.outcomes.values():
            for example in outcome.counterexamples + outcome.errors:
                if example.replay_path is None:
                    example.replay_path = str(write_replay(options.replay_dir, suite, spec, example, options))
    note(result, done=True)
    if options.pictures and result.incomplete is None:
        # Drawn once the verdicts are checkpointed: an engine that kills the process while being
        # replayed for its pictures costs the pictures, never the verdicts.
        _draw_pictures(result, suite, factory, dict(caller.quarantine.hung), say, notify)
        note(result, done=True)
    notify("suite_finished", suite.alias or suite.name, result)
    return result


def _draw_pictures(result: RunResult, suite: SuiteDef, factory: Callable[[], Any], hung: dict[str, str],
                   say: Callable[[str], None], notify: _Notify) -> None:
    """Each counterexample's picture at its failing step (:func:`~.replay.picture_replay`): one
    replay each, whose outcome changes no verdict. Ctrl-C stops it, the run marked incomplete."""
    examples = [example for outcome in result.verdicts.outcomes.values()
                for example in outcome.counterexamples + outcome.errors if example.picture is None]
    if not examples:
        return
    say(f"  drawing {len(examples)} counterexample(s) at their failing steps")
    notify("drawing", suite.alias or suite.name, len(examples))
    try:
        for example in examples:
            example.picture = picture_replay(suite, factory, example, result.options.step_timeout,
                                             result.options.timeout_clock, hung)
    except KeyboardInterrupt:
        result.incomplete = "interrupted (SIGINT) while drawing its counterexamples' pictures"
        say("  interrupted: the verdicts are reported, marked incomplete")


def _version(probe: Any) -> str:
    try:
        return str(probe.version()) if callable(getattr(probe, "version", None)) else "unknown"
    except Exception as error:  # an adapter's version() is engine code too
        return f"unknown ({type(error).__name__}: {error})"


def _rounds(result: RunResult, suite: SuiteDef, factory: Callable[[], Any], probe: Any,
            caller: EngineCaller, say: Callable[[str], None], note: Checkpoint, notify: _Notify) -> None:
    options, verdicts = result.options, result.verdicts
    name = suite.alias or suite.name
    round_began = seen = 0  # the examples before this round; the rules in verdicts.seen_failing told of
    told: set[str] = set()  # the convicted rules told of

    def tell_failures() -> None:
        nonlocal seen
        if len(verdicts.seen_failing) != seen:  # it only grows
            for rule_id in list(verdicts.seen_failing)[seen:]:
                notify("failure_seen", name, rule_id)
            seen = len(verdicts.seen_failing)
        for rule_id in sorted(verdicts.suppressed - told):
            told.add(rule_id)
            notify("rule_failed", name, rule_id, not verdicts.outcomes[rule_id].counterexamples)
    if options.step_timeout is not None and options.timeout_clock == "engine" \
            and not caller.measures_engine_time:
        say("  note: no per-thread scheduler statistics here; step timeouts are wall time")

    clock = CountingClocks(options.shrink_calls, options.search_calls)

    def count_example() -> None:
        clock.tick()
        note(result)
        result.examples += 1
        if notify.observer is not None:
            tell_failures()
            notify("example_started", name, result.examples - round_began, result.examples)
        if result.examples % 50 == 0:
            checks = sum(o.checks for o in verdicts.outcomes.values())
            say(f"  ... {result.examples} examples, {checks} checks")

    started = time.perf_counter()
    extra = suite.machine_options(probe)
    max_examples = options.max_examples * len(extra.get("parts", (None,)))
    database = open_database(options.database) if options.database is not None else None
    # With a database holding failures for this suite and engine, a replay round comes first:
    # it replays them (and drops those that no longer fail: nothing is suppressed yet), then
    # the search rounds draw from the seed, the rules already convicted suppressed as after
    # any round.
    replay_first = database is not None and any(
        True for _ in database.fetch(examples_key(bind_machine(suite, factory, verdicts, caller, **extra))))
    seed = options.seed
    try:
        for round_index in range(-1 if replay_first else 0, options.max_rounds):
            replaying = round_index < 0
            result.rounds += 1
            machine = bind_machine(suite, factory, verdicts, caller, count_example, record_hangs=True, **extra)
            settings = hypothesis.settings(
                max_examples=max_examples, stateful_step_count=options.step_count,
                deadline=None, database=database, suppress_health_check=list(HealthCheck),
                # The seed decides what is drawn, whatever profile is loaded (CI=true loads
                # Hypothesis' derandomizing "ci" profile; hypothesis.seed() wins over it anyway).
                derandomize=False,
                # Several bugs per round, each shrunk on its own: with a single bug, Hypothesis
                # lets the shrinker slip from one failure to any smaller one, so a rule whose
                # failures also break a later check was reported under that other rule.
                # (With fail_fast the first failing example is shrunk at once; the rule it
                # ends under is still one it really fails.)
                verbosity=Verbosity.quiet, report_multiple_bugs=not options.fail_fast,
                phases=(Phase.reuse, Phase.shrink) if replaying else (Phase.explicit, Phase.generate, Phase.shrink))
            test = hypothesis.seed(seed)(get_state_machine_test(machine, settings=settings))
            if database is not None:
                # hypothesis.seed() turns the database off (a seed is for reproducing); a run
                # keeps both: the replay round reads it, every round saves what it shrinks.
                test._hypothesis_internal_use_settings = settings  # type: ignore[attr-defined]
            if replaying:
                say(f"{suite.name} round {result.rounds}: the failures stored in {shown(options.database)}")
            else:
                say(f"{suite.name} round {result.rounds}: up to {max_examples} examples of up to "
                    f"{options.step_count} steps (seed {seed})")
            recorded_before = set(verdicts.suppressed)
            seen_before = set(verdicts.first_seen)
            round_began = result.examples
            notify("round_started", name, result.rounds, replaying, max_examples, seed)
            try:
                with independent_of_imports(), independent_of_time(clock), independent_of_hashing(), \
                        contracts_checked_where(options.contracts):
                    test()
            except (HypothesisException, Exception) as error:
                recorded = _record_round_failures(error, verdicts, seen_before, result, say)
                tell_failures()
                if not recorded:
                    break
                note(result)
            else:
                tell_failures()
                # A round that raised nothing may still have recorded hangs (never shrunk).
                hangs = verdicts.suppressed - recorded_before
                for rule_id in sorted(hangs):
                    say(f"  engine error: {rule_id} -- {verdicts.outcomes[rule_id].errors[0].message}")
                if not hangs:
                    say("  no stored failure fails now" if replaying else "  no new failure")
                    if not replaying:
                        break
            if options.fail_fast and result.convicted:
                say("  fail-fast: no further round")
                break
            if options.fail_fast and verdicts.suppressed - recorded_before:
                # Only expected failures so far. A fail-fast round ends at its first failing
                # example, so the round's seed was searched no further than that: the next round
                # draws from it again, the expected ones now ending their examples quietly, as a
                # round without fail-fast would have searched on past them.
                continue
            if not replaying:
                seed += 1
    except KeyboardInterrupt:
        result.incomplete = "interrupted (SIGINT) during round " + str(result.rounds)
        say("  interrupted: the verdicts so far are reported, marked incomplete")
    finally:
        result.duration_s = time.perf_counter() - started
    # A rule whose failure was seen only on examples drawn with kvoracle's contracts off, and that
    # no report shows (see below), is judged on its first example replayed with them on.
    _confirm_unreported(result, suite, factory, caller, say)
    # A rule whose failure no reported counterexample shows (the shrink of its example slipped
    # to another rule's smaller one, or the run was cut short) is convicted on the example it was
    # first seen in.
    for example in verdicts.unrecorded_failures():
        verdicts.record(example)
        say(f"  {'engine error' if example.engine_error else 'failure'}: {example.rule_id} -- {example.message}")
        say(f"  not shrunk: {len(example.steps)} steps (the example it was first seen in)")
    tell_failures()


def _confirm_unreported(result: RunResult, suite: SuiteDef, factory: Callable[[], Any], caller: EngineCaller,
                        say: Callable[[str], None]) -> None:
    """Replay, with kvoracle's contracts on, the first example of each rule that failed only while
    drawn with them off: a failure again confirms it (convicted below on that example); steps
    that no longer fail it are the engine's flakiness; a contract that breaks is kvoracle's bug."""
    verdicts, options = result.verdicts, result.options
    for example in verdicts.unconfirmed_failures():
        if result.incomplete is not None:  # interrupted: no engine call more, but nothing unsaid
            say(f"  not confirmed (the run was cut short): {example.rule_id} -- {example.message}")
            continue
        try:
            why_not = confirm_replay(suite, factory, example, options.step_timeout, options.timeout_clock,
                                     dict(caller.quarantine.hung))
        except Exception as broken:  # a contract of kvoracle's, or another bug of kvoracle's: never the engine's
            result.internal_errors.append(f"{type(broken).__name__}: {broken}")
            say(f"  internal error: {type(broken).__name__}: {broken}")
            continue
        if why_not is None:
            verdicts.confirm(example)
        else:
            verdicts.record(attrs.evolve(example, flaky=True, shrunk=False,
                                         message=f"{example.message} ({why_not})"))
            say(f"  failure (flaky): {example.rule_id} -- {example.message} ({why_not})")


def _record_round_failures(error: BaseException, verdicts: Verdicts, seen_before: set[str],
                           result: RunResult, say: Callable[[str], None]) -> bool:
    """Record what a round raised; ``False`` when it was kvoracle's own bug (the run stops)."""
    violations, others = _split_failures(error)
    # Hypothesis could not replay an example the engine failed in (the engine answers the same
    # steps differently): that is the engine's flakiness, charged to the rules its failures were
    # seen under -- never a kvoracle bug.
    engine_flaky = any(isinstance(other, Flaky) for other in others) and (
        any(v.is_engine_error for v, _ in violations)
        or any(verdicts.first_seen[r].engine_error for r in set(verdicts.first_seen) - seen_before))
    for violation, flaky in violations:
        flaky = flaky or (engine_flaky and violation.is_engine_error)
        example = Counterexample(violation.rule_id, violation.message, list(violation.steps),
                                 violation.is_engine_error, suite=result.suite, flaky=flaky,
                                 shrunk=not flaky)
        verdicts.record(example)
        kind = "engine error" if example.engine_error else "failure"
        say(f"  {kind}{' (flaky)' if flaky else ''}: {violation.rule_id} -- {violation.message}")
        say(f"  {'shrunk to' if example.shrunk else 'not shrunk:'} {len(example.steps)} steps")
    internal = []
    if verdicts.broken_contracts and not any(type(other).__name__ == "ViolationError" for other in others):
        # A contract of kvoracle's broke on an example Hypothesis then reported as something else
        # (inconsistent data generation: the contract held there while the shrink ran without it).
        internal.append(f"{verdicts.broken_contracts[-1]} (reported by Hypothesis as "
                        f"{', '.join(type(other).__name__ for other in others) or 'nothing'})")
        result.internal_errors.append(internal[-1])
        say(f"  internal error: {internal[-1]}")
    verdicts.broken_contracts.clear()
    for other in others:
        if engine_flaky and isinstance(other, Flaky):
            for rule_id in sorted(set(verdicts.first_seen) - seen_before - verdicts.suppressed):
                example = verdicts.first_seen[rule_id]
                if example.engine_error:
                    verdicts.record(attrs.evolve(example, flaky=True, shrunk=False))
                    say(f"  engine error (flaky): {rule_id} -- {example.message}")
            continue
        internal.append(other)
        result.internal_errors.append(f"{type(other).__name__}: {other}")
        say(f"  internal error: {type(other).__name__}: {other}")
    return not internal


@attrs.define
class CheckResult:
    """Every suite run of one ``kvoracle check``."""

    engine: str
    options: RunOptions
    runs: list[RunResult] = attrs.Factory(list)
    #: Suites asked for that the engine has no adapter for, with the reason.
    unsupported: dict[str, str] = attrs.Factory(dict)
    incomplete: str | None = None
    #: Suites not run here because an engine call of an earlier suite never answered and may
    #: still be running in this process: a fresh process should run them (``fresh_after_hang``).
    handed_on: list[str] = attrs.Factory(list)
    #: Suites not run because an earlier one failed under ``fail_fast``.
    not_run: list[str] = attrs.Factory(list)

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(run.ok for run in self.runs) and self.incomplete is None


def run_suites(engine: str | Callable[[], Any], suites: Sequence[str | SuiteDef], options: RunOptions,
               progress: Callable[[str], None] | None = None,
               expectations: Callable[[SuiteDef, Any], dict[str, str] | None] | None = None,
               explicit: bool = False, trail: Trail | None = None,
               checkpoint: Checkpoint | None = None, fresh_after_hang: bool = False, *,
               observer: RunObserver | None = None, resumed: bool = False) -> CheckResult:
    """Run each of ``suites`` the engine has an adapter for.

    ``expectations(suite, probe)`` gives a suite's expected failures. With ``explicit``
    (the user named the suites) a suite the engine cannot run in is an error
    (:class:`SuiteLoadError`); otherwise it is skipped and listed in ``unsupported``, and
    only an engine that supports none of them is an error -- unless the run is ``resumed`` (a
    new worker for the suites left after another's death, which ran some already). With
    ``fresh_after_hang`` (the supervised worker) the suites after one whose engine call never answered are not run
    here but listed in ``handed_on``: the abandoned call may still hold this process's CPU
    and GIL, and would slow every later engine call. ``observer`` is told how each suite
    run goes (:class:`RunObserver`).
    """
    say = progress or (lambda message: None)
    check = CheckResult(engine if isinstance(engine, str) else engine_spec_of(engine), options)
    plans = []
    for item in suites:
        suite = get_suite(item) if isinstance(item, str) else item
        caller = EngineCaller(options.step_timeout, returns=suite.returns, clock=options.timeout_clock)
        try:
            _, probe = load_suite_engine(engine, suite, caller)
        except EngineLoadError as error:
            if explicit:
                raise
            check.unsupported[suite.name] = str(error)
            continue
        finally:
            caller.close()
        plans.append((suite, expectations(suite, probe) if expectations else None))
    if not plans and not resumed:
        raise SuiteLoadError("no suite can run this engine:\n  " + "\n  ".join(check.unsupported.values()))
    for index, (suite, expected) in enumerate(plans):
        result = run_suite(engine, options, say, expected, suite, trail, checkpoint, observer=observer)
        check.runs.append(result)
        if result.incomplete is not None:
            check.incomplete = f"{suite.name}: {result.incomplete}"
            break
        if options.fail_fast and result.convicted and index + 1 < len(plans):
            check.not_run = [later.alias or later.name for later, _ in plans[index + 1:]]
            say(f"fail-fast: not running {', '.join(check.not_run)}")
            break
        if fresh_after_hang and result.abandoned and index + 1 < len(plans):
            check.handed_on = [later.name for later, _ in plans[index + 1:]]
            break
    return check
