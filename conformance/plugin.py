"""The pytest plugin: run kvoracle's conformance suites inside an engine's own test run.

``pytest --kvoracle-engine=module:Class`` adds one test item per rule each suite
judges, named ``kvoracle::<suite>::<rule id>``, for every suite the engine has an
adapter for (or those named with ``--kvoracle-suite``). Each suite runs once, when the
first of its items runs; each item then passes, fails (showing the counterexample
and its replay file), is skipped with the reason when the rule is not applicable,
xfails as an expected failure, or fails as unexercised. The options mirror
``kvoracle check``.

Under pytest-xdist a suite still runs once per test session, never once per worker:
the first worker to need a suite's verdicts runs it while holding a lock in a
directory shared by the session's workers, and the others read its report. An
item's node id is ``::kvoracle::<suite>::<rule id>``, so ``--dist loadscope`` sends each
suite's items to one worker and the suites run in parallel. (Items are also marked
``xdist_group(<suite>)`` for ``--dist loadgroup``, but pytest-xdist 3.8 cannot apply that
mark under pytest 9, whose node ids no longer come from the attribute it rewrites: there
the items are spread item by item, each suite still runs once, and a worker may wait for
another's run.)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

_OPTIONS = (
    ("engine", dict(default=None, metavar="ENGINE",
                    help="run the conformance suites against ENGINE (a built-in name or module:Class)")),
    ("suite", dict(action="append", default=None, metavar="SUITE",
                   help="a suite to run (repeatable); default: every suite the engine has an adapter for")),
    ("max-examples", dict(type=int, default=150, help="Hypothesis examples per round (default 150)")),
    ("steps", dict(type=int, default=40, help="steps per example (default 40)")),
    ("seed", dict(type=int, default=0, help="random seed (default 0)")),
    ("max-rounds", dict(type=int, default=12, help="rounds after failures (default 12)")),
    ("step-timeout", dict(type=float, default=10.0,
                          help="seconds of engine time per engine call before it counts as a hang; 0 = none")),
    ("timeout-clock", dict(default="engine", choices=("engine", "wall"), help="engine (default) or wall")),
    ("replay-dir", dict(default="kvoracle-replays", help="where counterexamples are written as pytest files")),
    ("expectations", dict(action="append", default=[], metavar="FILE",
                          help="a TOML file of expected failures, added to the engine's packaged one")),
    ("hypothesis-dir", dict(default=None, metavar="DIR",
                            help="Hypothesis' own directory (default: ~/.cache/kvoracle/hypothesis)")),
    ("shrink-calls", dict(type=int, default=None,
                          help="test calls Hypothesis may spend shrinking one round's failures (default 150)")),
    ("search-calls", dict(type=int, default=None,
                          help="test calls a round goes on drawing after its first failing example before it "
                               "shrinks; 0 = Hypothesis' own count (default 100)")),
    ("database", dict(default=None, metavar="DIR|URL",
                      help="the example database (a directory or a redis:// URL; 'none': no database); "
                           "default: $KVORACLE_DATABASE, else examples/ in the Hypothesis directory")),
    ("contracts", dict(default="reported", choices=("reported", "drawing"),
                       help="where kvoracle checks its reference's contracts: on reported counterexamples "
                            "(default) or on every example drawn as well")),
    ("fail-fast", dict(action="store_true", default=False,
                       help="stop at the first conviction (an expected failure is searched past): shrink its "
                            "example at once and run no further round")),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvoracle", "kvoracle conformance suites")
    for name, kwargs in _OPTIONS:
        group.addoption(f"--kvoracle-{name}", **kwargs)


def _option(config: pytest.Config, name: str) -> Any:
    return config.getoption("kvoracle_" + name.replace("-", "_"))


def _run_options(config: pytest.Config):
    from .harness.database import DatabaseError, chosen_database, open_database
    from .harness.runner import DEFAULT_SHRINK_CALLS, RunOptions, default_hypothesis_dir, search_calls_option

    timeout = _option(config, "step-timeout")
    options = RunOptions(
        max_examples=_option(config, "max-examples"), step_count=_option(config, "steps"),
        seed=_option(config, "seed"), step_timeout=None if timeout == 0 else timeout,
        timeout_clock=_option(config, "timeout-clock"), max_rounds=_option(config, "max-rounds"),
        replay_dir=Path(_option(config, "replay-dir")),
        hypothesis_dir=Path(_option(config, "hypothesis-dir")) if _option(config, "hypothesis-dir") else None,
        fail_fast=_option(config, "fail-fast"),
        shrink_calls=DEFAULT_SHRINK_CALLS if _option(config, "shrink-calls") is None
        else _option(config, "shrink-calls"),
        search_calls=search_calls_option(_option(config, "search-calls")),
        contracts=_option(config, "contracts"))
    options.database = chosen_database(_option(config, "database"),
                                       options.hypothesis_dir or default_hypothesis_dir())
    problems = options.problems() + ([f"step timeout must be >= 0, got {timeout}"] if timeout < 0 else [])
    if problems:
        raise pytest.UsageError("kvoracle: " + "; ".join(problems))
    if options.database is not None:
        try:
            open_database(options.database, check=True)
        except DatabaseError as error:
            raise pytest.UsageError(f"kvoracle: --kvoracle-database: {error}") from None
    return options


class _SuiteRuns:
    """Runs each suite at most once per test session and hands out its report."""

    def __init__(self, config: pytest.Config, engine: str) -> None:
        self.config = config
        self.engine = engine
        self.options = _run_options(config)
        self.expectations = [Path(p) for p in _option(config, "expectations")]
        self.reports: dict[str, dict] = {}
        worker = getattr(config, "workerinput", None)
        #: Shared by the session's xdist workers (the run's uid is the same in all of them).
        self.shared = Path(tempfile.gettempdir()) / f"kvoracle-pytest-{worker['testrunuid']}" if worker else None

    def report(self, suite: str) -> dict:
        if suite not in self.reports:
            self.reports[suite] = self._shared_run(suite) if self.shared else self._run(suite)
        return self.reports[suite]

    def _run(self, suite_name: str) -> dict:
        from .harness.expectations import expectations_for
        from .harness.report import to_json
        from .harness.runner import CheckResult, run_suites

        result: CheckResult = run_suites(
            self.engine, [suite_name], self.options, explicit=True,
            expectations=lambda suite, probe: expectations_for(probe, suite.name, self.expectations))
        return to_json(result)

    def _shared_run(self, suite: str) -> dict:
        import fcntl

        assert self.shared is not None
        self.shared.mkdir(parents=True, exist_ok=True)
        done = self.shared / f"{suite}.json"
        with (self.shared / f"{suite}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker runs the suite; the others wait for it
            if not done.exists():
                with (self.shared / "runs.log").open("a") as log:  # who ran what, for the curious
                    log.write(f"{suite} {os.getpid()}\n")
                report = self._run(suite)
                partial = done.with_suffix(".partial")
                partial.write_text(json.dumps(report))
                partial.replace(done)
        return json.loads(done.read_text())


class KvoracleRuleItem(pytest.Item):
    """One rule's verdict in one suite, as a test."""

    def __init__(self, *, suite: str, rule_id: str, runs: _SuiteRuns, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.suite = suite
        self.rule_id = rule_id
        self.runs = runs
        self.add_marker(pytest.mark.xdist_group(name=f"kvoracle-{suite}"))

    def runtest(self) -> None:
        report = self.runs.report(self.suite)
        if report["internal_errors"]:
            raise RuntimeError("kvoracle internal error: " + "; ".join(report["internal_errors"]))
        rule = next(r for r in report["rules"] if r["id"] == self.rule_id)
        verdict, reason = rule["outcome"], rule["reason"]
        if verdict == "not-applicable":
            pytest.skip(f"{self.rule_id} not applicable: {reason}")
        if verdict == "expected-fail":
            pytest.xfail(f"{self.rule_id}: {reason}")
        if verdict in ("fail", "error"):
            blocks = []
            for example in rule["counterexamples"]:
                kind = "engine error" if example["engine_error"] else "counterexample"
                lines = [f"{kind}: {example['message']}", *(f"  {i:>3}. {s}" for i, s in
                                                             enumerate(example["steps"], 1))]
                if example["replay"]:
                    lines.append(f"  replay: pytest {example['replay']}")
                blocks.append("\n".join(lines))
            detail = "\n\n".join(blocks) or f"{rule['failed_checks']} failed checks"
            pytest.fail(f"{self.rule_id} {verdict} in the {self.suite} suite:\n{detail}", pytrace=False)
        if verdict == "unexpected-pass":
            pytest.fail(f"{self.rule_id} passed but is listed as an expected failure ({reason})", pytrace=False)
        if verdict == "unexercised":
            pytest.fail(f"{self.rule_id} was never exercised by the {self.suite} suite; raise "
                        "--kvoracle-max-examples", pytrace=False)
        if not report["complete"]:
            pytest.fail(f"the {self.suite} run is incomplete: {report['incomplete_reason']}", pytrace=False)

    def reportinfo(self) -> tuple[Path, None, str]:
        return Path("kvoracle"), None, f"kvoracle::{self.suite}::{self.rule_id}"


# First, so that the rule items exist (with their xdist_group marks) before pytest-xdist's
# own hook turns each mark into the node-id suffix that ``--dist loadgroup`` schedules by.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    engine = _option(config, "engine")
    if not engine:
        return
    from . import suites as _builtin  # noqa: F401 - registers the built-in suites
    from .harness.calls import EngineCaller
    from .harness.engines import EngineLoadError
    from .harness.runner import load_suite_engine
    from .harness.suites import get_suite, registered_suites

    runs = _SuiteRuns(config, engine)
    requested = _option(config, "suite")
    try:
        chosen = [get_suite(name) for name in requested] if requested else registered_suites()
    except KeyError as error:
        raise pytest.UsageError(f"kvoracle: {error}") from None
    supported, reasons = [], []
    for suite in chosen:
        caller = EngineCaller(runs.options.step_timeout, returns=suite.returns)
        try:
            load_suite_engine(engine, suite, caller)
        except EngineLoadError as error:
            if requested:
                raise pytest.UsageError(f"kvoracle: {error}") from None
            reasons.append(str(error))
            continue
        finally:
            caller.close()
        supported.append(suite)
    if not supported:
        raise pytest.UsageError("kvoracle: no suite can run this engine: " + "; ".join(reasons))
    for suite in supported:
        for rule_id in suite.scope():
            items.append(KvoracleRuleItem.from_parent(session, name=f"kvoracle::{suite.name}::{rule_id}",
                                                      suite=suite.name, rule_id=rule_id, runs=runs))
