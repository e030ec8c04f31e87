"""The ``kvoracle`` command.

``kvoracle check``  run the conformance suites against an engine and print the verdicts
``kvoracle rules``  list the specification's rules

Exit status of ``check``: 0 every applicable rule passed; 1 the engine does not conform
(or kvoracle hit a bug of its own); 2 bad options or an engine that cannot be run; 130
interrupted (the verdicts so far are still printed and written, marked incomplete).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from kvoracle import __version__
from kvoracle.spec import all_rules

EXIT_OK, EXIT_NOT_CONFORMING, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Options that cannot work, found before anything runs."""


def _probe_file(path: Path, what: str) -> None:
    """Fail now, not after the run, if ``path`` cannot be written."""
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be written: {error.strerror or error}") from None
    if not existed:
        path.unlink()


def _probe_dir(path: Path, what: str) -> None:
    probe = path / f".kvoracle-probe-{uuid.uuid4().hex}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be written: {error.strerror or error}") from None


#: RunOptions fields by the flag that sets them.
_FLAGS = {"max_examples": "--max-examples", "step_count": "--steps", "seed": "--seed",
          "step_timeout": "--step-timeout", "timeout_clock": "--timeout-clock", "max_rounds": "--max-rounds",
          "shrink_calls": "--shrink-calls", "search_calls": "--search-calls", "contracts": "--contracts"}


def _options(args: argparse.Namespace):
    from .harness.runner import DEFAULT_SHRINK_CALLS, RunOptions, search_calls_option

    options = RunOptions(
        max_examples=args.max_examples, step_count=args.steps, seed=args.seed,
        step_timeout=None if args.step_timeout == 0 else args.step_timeout,
        timeout_clock=args.timeout_clock, max_rounds=args.max_rounds,
        replay_dir=None if args.no_replay else Path(args.replay_dir),
        hypothesis_dir=Path(args.hypothesis_dir) if args.hypothesis_dir else None,
        fail_fast=args.fail_fast, database=_database(args),
        shrink_calls=DEFAULT_SHRINK_CALLS if args.shrink_calls is None else args.shrink_calls,
        search_calls=search_calls_option(args.search_calls), contracts=args.contracts)
    problems = [_FLAGS.get(p.split()[0], p.split()[0]) + " " + p.split(" ", 1)[1] for p in options.problems()]
    if args.step_timeout < 0:
        problems = [p for p in problems if not p.startswith("--step-timeout")]
        problems.append(f"--step-timeout must be positive, or 0 for no limit; got {args.step_timeout:g}")
    if args.search_calls is not None and args.search_calls < 0:
        problems = [p for p in problems if not p.startswith("--search-calls")]
        problems.append(f"--search-calls must be positive, or 0 for Hypothesis' own count; got {args.search_calls}")
    if problems:
        raise UsageError("; ".join(problems))
    if args.json:
        _probe_file(Path(args.json), "--json")
    if args.html:
        _probe_file(Path(args.html), "--html")
        options.pictures = True  # the page shows each counterexample's failing step
    if args.junit:
        _probe_file(Path(args.junit), "--junit")
    if options.replay_dir is not None:
        _probe_dir(options.replay_dir, "--replay-dir")
    if options.hypothesis_dir is not None:
        _probe_dir(options.hypothesis_dir, "--hypothesis-dir")
    if options.database is not None:
        from .harness.database import DatabaseError, open_database
        try:
            open_database(options.database, check=True)
        except DatabaseError as error:
            raise UsageError(f"--database: {error}") from None
    return options


def _database(args: argparse.Namespace) -> str | None:
    from .harness.database import chosen_database
    from .harness.runner import default_hypothesis_dir

    if args.no_database:
        return None
    return chosen_database(args.database, Path(args.hypothesis_dir) if args.hypothesis_dir
                           else default_hypothesis_dir())


def _expectations(files: list[str]) -> Callable:
    from .harness.expectations import ExpectationsError, expectations_for, load_expectations

    paths = [Path(f) for f in files]
    for path in paths:  # malformed files are refused before the run
        if not path.is_file():
            raise UsageError(f"--expectations {path}: no such file")
        try:
            load_expectations(path, "0")
        except ExpectationsError as error:
            raise UsageError(str(error)) from None
    return lambda suite, probe: expectations_for(probe, suite.name, paths)


def _interrupt_once() -> None:
    """``kill`` ends a run like Ctrl-C does, with the verdicts so far reported; a second signal
    (Ctrl-C reaches a supervised worker from the terminal and from its supervisor) is ignored
    while they are."""
    names = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])

    def handler(signum: int, frame: object) -> None:
        for name in names:
            signal.signal(name, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")
    for name in names:
        signal.signal(name, handler)


def _say(message: str) -> None:
    print(message, flush=True)


def _display_wanted(args: argparse.Namespace, quiet: bool = False) -> bool:
    """Whether the run shows the live progress display: ``--progress``/``--no-progress``, else
    when stdout is a terminal that can redraw (rich's judgement: not ``TERM=dumb``) and rich, an
    optional extra, is installed. Without rich, ``--progress`` says so once (unless ``quiet``)."""
    if args.progress is False:
        return False
    try:
        from rich.console import Console
    except ImportError:
        if args.progress and not quiet:
            print("note: --progress needs rich (pip install 'kvoracle[report]'); plain progress lines instead",
                  file=sys.stderr, flush=True)
        return False
    if args.progress:
        return True
    try:
        terminal = sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
    return terminal and Console(file=sys.stdout).is_interactive


@contextlib.contextmanager
def _progress(args: argparse.Namespace) -> Iterator[tuple[Callable[[str], None], object]]:
    """Where the run's progress goes while it runs: a progress-line printer, and the observer
    (the live display) or ``None``. The display stops before the report is printed."""
    if not _display_wanted(args):
        yield _say, None
        return
    from .reports.progress import LiveProgress
    with LiveProgress() as display:
        yield display.say, display


def _say_after_display(message: str) -> None:
    """The supervisor's lines after a worker that showed the display died mid-frame."""
    from .reports.progress import end_of_display
    end_of_display()
    _say(message)


def _check(args: argparse.Namespace) -> int:
    from .harness.engines import EngineLoadError
    from .harness.expectations import ExpectationsError
    from .harness.runner import run_suites
    from .harness.supervisor import WorkerUsageError, supervise, worker_command

    try:
        options = _options(args)
        expectations = _expectations(args.expectations)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.worker_state:
        return _work(args, options, expectations)
    suites = args.suite or [suite.name for suite in _registered()]
    label = "" if args.suite is None else f" ({', '.join(args.suite)})"
    print(f"kvoracle {__version__}: checking engine {args.engine!r}{label}", flush=True)
    try:
        if args.in_process:
            _interrupt_once()
            with _progress(args) as (say, observer):
                result = run_suites(args.engine, suites, options, progress=say, expectations=expectations,
                                    explicit=args.suite is not None, observer=observer)
        else:
            # The worker shows the display, on the stdout it inherits.
            say = _say_after_display if _display_wanted(args, quiet=True) else _say
            with tempfile.TemporaryDirectory(prefix="kvoracle-") as state:
                result = supervise(worker_command(args.argv, Path(state)), args.engine, suites, options,
                                   Path(state), say)
    except (EngineLoadError, ExpectationsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except WorkerUsageError:
        return EXIT_USAGE  # the worker printed why
    except KeyboardInterrupt:
        print("interrupted before any suite started", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report(args, result)


def _work(args: argparse.Namespace, options, expectations) -> int:
    """The supervised worker: run the suites, leaving checkpoints and a trail in ``--worker-state``."""
    from .harness.engines import EngineLoadError
    from .harness.expectations import ExpectationsError
    from .harness.runner import run_suites
    from .harness.supervisor import Checkpoints, FileTrail

    directory = Path(args.worker_state)
    trail = FileTrail(directory / "trail")
    summary: dict[str, object] = {}
    _interrupt_once()
    try:
        with _progress(args) as (say, observer):
            result = run_suites(args.engine, args.worker_suites.split(","), options, progress=say,
                                expectations=expectations, explicit=args.suite is not None, trail=trail,
                                checkpoint=Checkpoints(directory), fresh_after_hang=True, observer=observer,
                                resumed=args.worker_resumed)
        summary = {"unsupported": result.unsupported, "incomplete": result.incomplete,
                   "handed_on": result.handed_on, "not_run": result.not_run}
    except (EngineLoadError, ExpectationsError) as error:
        print(f"error: {error}", file=sys.stderr)
        summary = {"usage_error": str(error)}
    except KeyboardInterrupt:
        summary = {"incomplete": "interrupted (SIGINT) before a suite started"}
    finally:
        trail.close()
    (directory / "summary.json").write_text(json.dumps(summary))
    return EXIT_USAGE if "usage_error" in summary else EXIT_OK


def _report(args: argparse.Namespace, result) -> int:
    from .harness.report import format_counterexamples, format_table, write_json

    print()
    print(format_table(result))
    counterexamples = format_counterexamples(result)
    if counterexamples:
        print()
        print(counterexamples)
    if args.json:
        write_json(result, Path(args.json))
        print(f"\nJSON report: {args.json}")
    if args.html:
        from .reports.html import write_html
        write_html(result, Path(args.html))
        print(f"HTML report: {args.html}")
    if args.junit:
        from .reports.junit import write_junit
        write_junit(result, Path(args.junit))
        print(f"JUnit XML report: {args.junit}")
    if result.incomplete is not None and result.incomplete.split(": ", 1)[-1].startswith("interrupted"):
        return EXIT_INTERRUPTED
    return EXIT_OK if result.ok else EXIT_NOT_CONFORMING


def _fuzz(args: argparse.Namespace) -> int:
    """``kvoracle fuzz``: HypoFuzz over the suites' machines until interrupted or ``--duration``."""
    from .fuzz import TARGETS_MODULE, fuzz_machines, read_stats
    from .harness.database import DatabaseError, open_database, shown
    from .harness.engines import EngineLoadError
    from .harness.machine import examples_key

    try:
        import hypofuzz  # noqa: F401
    except ImportError:
        print("error: kvoracle fuzz runs HypoFuzz: pip install 'kvoracle[fuzz]'", file=sys.stderr)
        return EXIT_USAGE
    database = _database(args)
    if database is None:
        print("error: kvoracle fuzz keeps its failures in an example database: --database must name one",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        open_database(database, check=True)
        machines = fuzz_machines(engine=args.engine, suites=args.suite, database=database, step_count=args.steps,
                                 step_timeout=args.step_timeout)
    except (DatabaseError, EngineLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if not machines:
        print(f"error: engine {args.engine!r} has an adapter for none of the suites", file=sys.stderr)
        return EXIT_USAGE
    suites = [machine.suite.alias or machine.suite.name for machine in machines.values()]
    with tempfile.TemporaryDirectory(prefix="kvoracle-fuzz-") as work:
        module = Path(work) / "test_kvoracle_fuzz.py"
        module.write_text(TARGETS_MODULE)
        stats = Path(args.stats_dir) if args.stats_dir else Path(work) / "stats"
        stats.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KVORACLE_DATABASE": database, "KVORACLE_FUZZ_ENGINE": args.engine,
               "KVORACLE_FUZZ_SUITES": ",".join(suites), "KVORACLE_FUZZ_STEPS": str(args.steps),
               "KVORACLE_FUZZ_STEP_TIMEOUT": str(args.step_timeout), "KVORACLE_FUZZ_STATS": str(stats)}
        dashboard = ["--dashboard", "--port", str(args.port)] if args.dashboard else ["--no-dashboard"]
        command = [sys.executable, "-c", "import hypofuzz.entrypoint; from hypothesis.extra.cli import main; main()",
                   "fuzz", "--numprocesses", str(args.processes), *dashboard, "--",
                   str(module), "-p", "no:cacheprovider", "-q"]
        print(f"kvoracle {__version__}: fuzzing engine {args.engine!r} ({', '.join(suites)}) in "
              f"{args.processes} process(es) with HypoFuzz; failures go to {shown(database)}", flush=True)
        started = time.monotonic()

        def stored_failures() -> dict[str, int]:
            """Each suite's failing examples in the database."""
            return {name: sum(1 for _ in open_database(database).fetch(examples_key(machine)))
                    for name, machine in machines.items()}

        run = run_hypofuzz(command, cwd=work, env=env,
                           deadline=None if args.duration is None else started + args.duration,
                           finished=lambda: all(stored_failures().values()),
                           say=lambda line: print(line, flush=True))
        stopped, interrupted, returncode = run
        elapsed = time.monotonic() - started
        counts = read_stats(stats)
    examples = sum(c["examples"] for c in counts)
    print(f"\n{examples} examples in {elapsed:.0f} s over {len(counts)} process(es): "
          f"{examples / elapsed:.1f} examples/s" + "".join(
              f"\n  process {i}: {c['examples']} examples, "
              f"{c['examples'] / max(c['last'] - c['started'], 1e-9):.1f}/s" for i, c in enumerate(counts, 1)))
    stored = stored_failures()
    for name, machine in machines.items():
        print(f"{machine.suite.alias or machine.suite.name}: {stored[name]} failing example(s) stored")
    if any(stored.values()):
        # HypoFuzz's verdict is not kvoracle's: check replays each one outside the fuzzer (a hang
        # charged under its tracing may not be one) and names the rule of each that still fails.
        print(f"judge them: kvoracle check --engine {args.engine} --database {shown(database)}")
    if interrupted:
        return EXIT_INTERRUPTED
    if not stopped and returncode != 0:
        print(f"error: HypoFuzz ended by itself with status {returncode}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


#: A HypoFuzz run that ends by itself sooner than this is not started again (it would spin).
HYPOFUZZ_MIN_RUN_S = 30.0


def run_hypofuzz(command: list[str], *, cwd: str, env: dict[str, str], deadline: float | None,
                 finished: Callable[[], bool], say: Callable[[str], None],
                 min_run_s: float = HYPOFUZZ_MIN_RUN_S) -> tuple[bool, bool, int]:
    """Run HypoFuzz's command until ``deadline`` (``time.monotonic()``; None: until Ctrl-C):
    ``(stopped at the deadline, interrupted, the last exit status)``.

    HypoFuzz's hub ends a run with status 0 when, at its check a minute in, no worker has
    reported a first batch of 100 examples -- which a slow engine, or a busy machine, does
    not reach -- and says it "found a failing input for every test". When it ends that way
    while some suite has no stored failure (``finished()`` is false), it is started again: the
    example database keeps what it found."""
    while True:
        began = time.monotonic()
        process = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)
        stopped = interrupted = False
        try:
            process.wait(timeout=None if deadline is None else max(deadline - began, 0.0))
        except subprocess.TimeoutExpired:
            stopped = True
        except KeyboardInterrupt:
            interrupted = True
        if process.poll() is None:  # HypoFuzz stops its workers on SIGINT (a shrink in flight is lost)
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # any worker left behind
        ran = time.monotonic() - began
        if stopped or interrupted or process.returncode != 0 or ran < min_run_s or finished():
            return stopped, interrupted, process.returncode
        say(f"HypoFuzz ended by itself after {ran:.0f} s with a suite still without a stored failure (its "
            f"hub stops when no worker has run a first batch of 100 examples within a minute: a slow "
            f"engine or a busy machine); starting it again, the example database keeps what it found")


def _rules(args: argparse.Namespace) -> int:
    rules = all_rules()
    if args.markdown:
        from .rules_doc import rules_markdown
        print(rules_markdown())
        return 0
    for rule in rules:
        kind = "" if rule.kind == "normative" else f" [{rule.kind}]"
        print(f"{rule.id}  {rule.title}{kind}")
        if args.verbose:
            print(f"    {rule.text}\n    source: {rule.source}")
    print(f"\n{len(rules)} rules")
    return 0


def _registered():
    """Every registered suite, the built-in ones first in their order."""
    from .harness.suites import registered_suites
    from .suites import BUILTIN
    return sorted(registered_suites(), key=lambda s: BUILTIN.index(s.name) if s.name in BUILTIN else len(BUILTIN))


def build_parser() -> argparse.ArgumentParser:
    from .harness.engines import builtin_engines

    parser = argparse.ArgumentParser(prog="kvoracle", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvoracle {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    from .harness.suites import get_suite, suite_aliases

    suites = _registered()
    engines = builtin_engines()
    check = commands.add_parser(
        "check", help="run the conformance suites against an engine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the conformance suites against an engine and print a verdict per rule.",
        epilog="suites:\n" + "\n".join(f"  {s.name:<18} {s.title}" for s in suites)
        + "".join(f"\n  {alias:<18} {get_suite(alias).title}" for alias in sorted(suite_aliases()))
        + "\n\nbuilt-in engines (and the suites they have adapters for):\n"
        + "\n".join(f"  {name:<18} {', '.join(names)}" for name, names in engines.items())
        + "\n\nexit status: 0 conforming, 1 not conforming, 2 bad options or engine, 130 interrupted")
    check.add_argument("--engine", default="reference",
                       help="a built-in engine (below) or module:Class (default: reference)")
    check.add_argument("--suite", action="append", choices=[s.name for s in suites] + sorted(suite_aliases()),
                       help="a suite to run (repeatable); default: every suite the engine has an adapter for")
    check.add_argument("--max-examples", type=int, default=150,
                       help="Hypothesis examples per round and suite part (default 150)")
    check.add_argument("--steps", type=int, default=40, help="steps per example (default 40)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--max-rounds", type=int, default=12,
                       help="rounds after failures, one new failing rule each (default 12)")
    check.add_argument("--step-timeout", type=float, default=10.0,
                       help="seconds of engine time one engine call may take before it counts as a hang; "
                            "0 = no limit (default 10)")
    check.add_argument("--timeout-clock", choices=("engine", "wall"), default="engine",
                       help="engine: wall time less time spent waiting for a CPU, so that load on the machine "
                            "never counts (default); wall: plain wall time")
    check.add_argument("--fail-fast", action="store_true",
                       help="stop at the first conviction (a rule that fails or errs; an expected failure "
                            "is searched past): shrink its example at once, run no further round or suite (for CI)")
    check.add_argument("--shrink-calls", type=int, default=None,
                       help="test calls Hypothesis may spend shrinking one round's failures: a count, so a "
                            "counterexample is the same on any machine (default 150)")
    check.add_argument("--search-calls", type=int, default=None,
                       help="test calls a round goes on drawing after its first failing example, looking for "
                            "other rules' failures before it shrinks (later rounds search on for the rest); "
                            "0 = Hypothesis' own count: until twice the call of the last new failure, at most "
                            "1,000 after the first (default 100)")
    check.add_argument("--contracts", choices=("reported", "drawing"), default="reported",
                       help="where kvoracle checks its own reference's contracts (a broken one is kvoracle's bug, "
                            "never the engine's): reported = on the replay of each counterexample before it is "
                            "charged to the engine (default; about a quarter less time); drawing = on every "
                            "example drawn as well")
    check.add_argument("--json", metavar="FILE", help="also write a JSON report")
    check.add_argument("--html", metavar="FILE",
                       help="also write an HTML report, with a picture of each failure: the reference's and the "
                            "engine's block tables side by side at the failing step, the differing cells marked")
    check.add_argument("--junit", metavar="FILE",
                       help="also write a JUnit XML report for CI systems (a test case per rule)")
    check.add_argument("--replay-dir", default="kvoracle-replays",
                       help="where counterexamples are written as pytest files")
    check.add_argument("--no-replay", action="store_true", help="do not write replay files")
    check.add_argument("--expectations", metavar="FILE", action="append", default=[],
                       help="a TOML file of expected failures ([[expect]] rule/versions/reason), added to the "
                            "engine's packaged one (repeatable)")
    check.add_argument("--hypothesis-dir", metavar="DIR",
                       help="Hypothesis' own directory (default: ~/.cache/kvoracle/hypothesis, never the "
                            "current directory)")
    check.add_argument("--database", metavar="DIR|URL",
                       help="the example database: failures stored there are replayed first, new ones saved; a "
                            "directory or a redis:// URL (default: $KVORACLE_DATABASE, else examples/ in the "
                            "Hypothesis directory; 'none' for no database)")
    check.add_argument("--no-database", action="store_true",
                       help="no example database: the examples depend on the seed alone")
    check.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="a live display of the run (rich): per suite its round and phase, examples run, "
                            "rules failed so far, time; default: on when stdout is a terminal that can redraw "
                            "(not TERM=dumb) and rich is installed (kvoracle[report]); NO_COLOR: no colours")
    check.add_argument("--in-process", action="store_true",
                       help="run the engine in this process (no supervisor: an engine that kills its process "
                            "then takes the report with it)")
    check.add_argument("--worker-state", help=argparse.SUPPRESS)
    check.add_argument("--worker-suites", help=argparse.SUPPRESS)
    check.add_argument("--worker-resumed", action="store_true", help=argparse.SUPPRESS)
    check.set_defaults(run=_check)

    fuzz = commands.add_parser(
        "fuzz", help="fuzz the suites with HypoFuzz for as long as it runs (kvoracle[fuzz])",
        description="Run the suites' machines under HypoFuzz in several processes until interrupted (or "
                    "--duration), keeping every failure in the example database; `kvoracle check` with the same "
                    "database then replays them first and names their rules.")
    fuzz.add_argument("--engine", default="reference", help="a built-in engine or module:Class (default: reference)")
    fuzz.add_argument("--suite", action="append", choices=[s.name for s in suites] + sorted(suite_aliases()),
                      help="a suite to fuzz (repeatable); default: every suite the engine has an adapter for")
    fuzz.add_argument("-n", "--processes", type=int, default=1, help="fuzzing processes (default 1)")
    fuzz.add_argument("--database", metavar="DIR|URL",
                      help="the example database shared with `kvoracle check` (default as there)")
    fuzz.add_argument("--hypothesis-dir", metavar="DIR", help="Hypothesis' own directory (default as for check)")
    fuzz.add_argument("--steps", type=int, default=40, help="steps per example (default 40)")
    fuzz.add_argument("--step-timeout", type=float, default=120.0,
                      help="seconds of engine time one engine call may take before it counts as a hang; 0 = no "
                           "limit (default 120: HypoFuzz's coverage tracing slows engine code many times over)")
    fuzz.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (default: never)")
    fuzz.add_argument("--dashboard", action="store_true", help="serve HypoFuzz's live dashboard (on --port)")
    fuzz.add_argument("--port", type=int, default=9999, help="the dashboard's port (default 9999)")
    fuzz.add_argument("--stats-dir", metavar="DIR", help="keep each process's example counts here")
    fuzz.set_defaults(run=_fuzz, no_database=False)

    rules = commands.add_parser("rules", help="list the specification's rules")
    rules.add_argument("-v", "--verbose", action="store_true", help="print text and source")
    rules.add_argument("--markdown", action="store_true", help="print the docs' rule table")
    rules.set_defaults(run=_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
