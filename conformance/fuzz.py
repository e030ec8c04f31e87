"""Fuzzing for hours, on several cores and machines: the suites as HypoFuzz targets.

``kvoracle check`` is a measurement of minutes with a fixed budget. ``kvoracle fuzz``
hands the same machines to HypoFuzz (PyPI ``hypofuzz``, the ``kvoracle[fuzz]`` extra),
which runs them for as long as it is let, in ``-n`` processes, choosing between the
suites by the coverage each still gains, and shows its dashboard on request. Every
failure a fuzzing process finds is shrunk and stored in the example database, under the
key ``kvoracle check`` replays from (:func:`~.harness.machine.examples_key`): after (or
during) fuzzing, ``kvoracle check --database`` on the same database convicts each stored
failure in its replay round and names its rule, with a replay file, as for any failure.
Processes on other machines share the work through a Redis database
(``--database redis://...``).

The targets are written as a small pytest module that HypoFuzz's workers collect; the
engine, the suites and the database reach them through the environment
(``KVORACLE_FUZZ_ENGINE``, ``_SUITES``, ``_STEPS``, ``_STEP_TIMEOUT``, ``_STATS`` and
``KVORACLE_DATABASE``), which each worker inherits. A worker counts its examples in a
stats file per process (``--stats-dir``), from which ``kvoracle fuzz`` reports examples
per second at its end.

HypoFuzz's verdict is not kvoracle's. Its coverage tracing slows engine code many times
over, so an engine call can outlast the step timeout under the fuzzer and be stored as a
hang that is none (the default timeout is therefore 120 s of engine time, not 10). Every
stored failure is judged again by ``kvoracle check``'s replay round, outside the fuzzer:
one that no longer fails there is dropped, and only one that does becomes a verdict.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

TARGETS_MODULE = '''"""kvoracle's suites as HypoFuzz targets (written by `kvoracle fuzz`)."""
from kvoracle.conformance.fuzz import fuzz_targets

globals().update(fuzz_targets())
'''


class _Stats:
    """Counts one process's examples into ``<dir>/<pid>.json`` (rewritten at most once a second).

    HypoFuzz's hub imports the targets (so makes this object) and then forks its workers, which
    inherit it: each worker starts counting afresh under its own pid at its first example (with
    the hub's pid, the workers wrote one file over each other and -n 2 read as one process)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid = 0  # no process's yet: set at the first example

    def __call__(self) -> None:
        if self.pid != os.getpid():
            self.pid = os.getpid()
            self.path = self.directory / f"{self.pid}.json"
            self.started = time.time()
            self.examples = 0
            self.written = 0.0
        self.examples += 1
        now = time.time()
        if now - self.written >= 1.0:
            self.written = now
            partial = self.path.with_suffix(".partial")
            partial.write_text(json.dumps({"examples": self.examples, "started": self.started, "last": now}))
            partial.replace(self.path)


def fuzz_targets(**arguments: object) -> dict[str, type]:
    """``{test name: TestCase}`` of :func:`fuzz_machines`: what HypoFuzz's workers collect."""
    return {name: machine.TestCase for name, machine in fuzz_machines(**arguments).items()}  # type: ignore[arg-type]


def fuzz_machines(engine: str | None = None, suites: Sequence[str] | None = None, database: str | None = None,
                  step_count: int | None = None, step_timeout: float | None = None) -> dict[str, type]:
    """``{test name: bound machine}`` for each suite the engine has an adapter for, bound to
    the example database, which also becomes Hypothesis' default (HypoFuzz fuzzes only tests
    whose database is the default one). Arguments left out come from the environment."""
    from hypothesis import HealthCheck, settings

    from . import suites as _builtin  # noqa: F401  (registers the built-in suites)
    from .harness.calls import EngineCaller
    from .harness.database import ENVIRONMENT as DATABASE_VARIABLE
    from .harness.database import open_database
    from .harness.engines import EngineLoadError, engine_factory
    from .harness.machine import machine_for
    from .harness.runner import load_suite_engine
    from .harness.suites import get_suite, registered_suites

    engine = engine or os.environ.get("KVORACLE_FUZZ_ENGINE", "reference")
    names = list(suites or [s for s in os.environ.get("KVORACLE_FUZZ_SUITES", "").split(",") if s]
                 or [s.name for s in registered_suites()])
    database = database or os.environ.get(DATABASE_VARIABLE)
    if not database or database.lower() == "none":
        raise ValueError("fuzzing needs an example database (where its failures are kept)")
    step_count = step_count or int(os.environ.get("KVORACLE_FUZZ_STEPS", "40"))
    if step_timeout is None:
        step_timeout = float(os.environ.get("KVORACLE_FUZZ_STEP_TIMEOUT", "120"))
    step_timeout = step_timeout or None  # 0: no limit
    stats_dir = os.environ.get("KVORACLE_FUZZ_STATS")
    on_example = _Stats(Path(stats_dir)) if stats_dir else None

    examples = open_database(database)
    quiet = [check for check in HealthCheck if check is not HealthCheck.nested_given]
    # derandomize=False: HypoFuzz skips derandomized tests, and a CI machine (CI=true) loads
    # Hypothesis' "ci" profile, which derandomizes every test that does not say otherwise.
    settings.register_profile("kvoracle-fuzz", database=examples, deadline=None, derandomize=False,
                              suppress_health_check=quiet, stateful_step_count=step_count)
    settings.load_profile("kvoracle-fuzz")
    targets: dict[str, type] = {}
    for name in names:
        suite = get_suite(name)
        try:
            caller = EngineCaller(step_timeout, returns=suite.returns)
            try:
                load_suite_engine(engine, suite, caller)
            finally:
                caller.close()
        except EngineLoadError:
            if suites or os.environ.get("KVORACLE_FUZZ_SUITES"):
                raise
            continue  # every suite by default: those the engine has an adapter for
        machine = machine_for(suite, engine_factory(engine, suite), step_timeout, step_count=step_count,
                              database=examples, on_example=on_example)
        # HypoFuzz skips a test that suppresses the nested-given check (kvoracle suppresses all).
        machine.TestCase.settings = settings(machine.TestCase.settings, suppress_health_check=quiet,
                                             derandomize=False)
        targets["Test_" + (suite.alias or suite.name).replace("-", "_")] = machine
    return targets


def read_stats(directory: Path) -> list[dict]:
    """Each fuzzing process's counts, as its workers last wrote them."""
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]
