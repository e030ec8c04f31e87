"""`kvoracle fuzz` (conformance/fuzz.py): the suites as HypoFuzz targets that share their
failures with `kvoracle check` through the example database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypofuzz", reason="HypoFuzz (kvoracle[fuzz])")

from hypothesis import Phase, settings

from kvoracle.conformance.fuzz import TARGETS_MODULE, fuzz_machines
from kvoracle.conformance.harness.database import open_database
from kvoracle.conformance.harness.machine import examples_key
from kvoracle.conformance.harness.verdicts import RuleViolation

TESTS = Path(__file__).parent
# CI=true: Hypothesis then loads its "ci" profile (derandomize=True), which HypoFuzz refuses
# to fuzz; the fuzz targets must not inherit it (CI machines set the variable).
ENV = {k: v for k, v in os.environ.items() if k != "KVORACLE_DATABASE"} | {
    "KVORACLE_CONTRACTS": "0", "PYTHONPATH": str(TESTS), "CI": "true"}


def _command(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvoracle", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def default_profile():
    """fuzz_machines makes its database Hypothesis' default; put the default back after.
    Hypothesis' "ci" profile (derandomize=True, what a CI machine loads) is the one in force
    meanwhile: the targets must still be fuzzable under it."""
    before = settings.default
    settings.load_profile("ci")
    yield
    settings.register_profile("kvoracle-tests-restore", before)
    settings.load_profile("kvoracle-tests-restore")


def test_hypofuzz_collects_every_suite_the_engine_has(tmp_path: Path, default_profile: None) -> None:
    """HypoFuzz fuzzes only Hypothesis tests whose database is the default one and that keep
    the nested-given health check: each suite of the reference engine is collected, none skipped."""
    from hypofuzz.collection import collect_tests

    module = tmp_path / "test_kvoracle_fuzz.py"
    module.write_text(TARGETS_MODULE)
    environment = {"KVORACLE_DATABASE": str(tmp_path / "db"), "KVORACLE_FUZZ_ENGINE": "reference",
                   "KVORACLE_FUZZ_SUITES": "lockstep,hybrid,external-store"}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        collected = collect_tests([str(module), "-p", "no:cacheprovider", "-q"])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    names = sorted(target.nodeid.split("::")[1] for target in collected.fuzz_targets)
    assert names == ["Test_external_store", "Test_hybrid", "Test_lockstep"], collected.not_collected


def test_a_failure_a_fuzz_target_stores_is_replayed_by_check(tmp_path: Path, default_profile: None) -> None:
    database = str(tmp_path / "db")
    machine = fuzz_machines(engine="broken_engines:ForwardFree", suites=["lockstep"], database=database,
                            step_timeout=10)["Test_lockstep"]
    test = machine.TestCase("runTest")
    # No shrinking: Hypothesis stores a failure when it finds it, and shrinking it is what took
    # this test minutes (227 s in CI); check replays whatever is stored.
    test.settings = settings(test.settings, max_examples=200, phases=[p for p in Phase if p != Phase.shrink])
    with pytest.raises(RuleViolation) as failed:
        test.runTest()
    assert failed.value.rule_id == "KV-POOL-007"
    assert list(open_database(database).fetch(examples_key(machine))), "stored under check's key"
    done = _command("check", "--engine", "broken_engines:ForwardFree", "--suite", "lockstep", "--no-replay",
                    "--max-examples", "20", "--max-rounds", "1", "--database", database, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    replayed = done.stdout.split("the failures stored in", 1)[1].split(" round ", 1)[0]
    assert "failure: KV-POOL-007" in replayed, done.stdout


def test_fuzz_runs_hypofuzz_for_its_duration_and_reports(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    # No step timeout: the reference never hangs, and under HypoFuzz's tracing on a loaded
    # machine a slow call must not be stored as a hang here.
    done = _command("fuzz", "--engine", "reference", "--suite", "lockstep", "-n", "1", "--duration", "30",
                    "--step-timeout", "0", "--database", str(tmp_path / "db"), "--stats-dir", str(stats),
                    cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "in 1 process(es) with HypoFuzz" in done.stdout
    assert "examples in" in done.stdout and "lockstep: 0 failing example(s) stored" in done.stdout, done.stdout


@pytest.mark.parametrize("args, message", [
    (["--database", "none"], "--database must name one"),
    (["--engine", "no_such_module:Engine"], "no_such_module"),
    (["--database", "redis://127.0.0.1:1/0"], "redis://127.0.0.1:1"),
])
def test_fuzz_refuses_what_cannot_run(tmp_path: Path, args: list[str], message: str) -> None:
    done = _command("fuzz", "--duration", "5", *(["--database", str(tmp_path / "db")] if "--database" not in args
                                                 else []), *args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr


def test_a_hypofuzz_run_that_ends_by_itself_early_is_started_again(tmp_path: Path) -> None:
    """HypoFuzz's hub ends a run (status 0) when no worker has finished a first batch of 100
    examples in its first minute -- a slow engine, a busy machine. run_hypofuzz starts it
    again until the deadline while a suite has no stored failure, and not once they all
    have. A stand-in command that ends by itself at once plays HypoFuzz here."""
    import time

    from kvoracle.conformance.cli import run_hypofuzz

    marks = tmp_path / "runs"
    command = [sys.executable, "-c", f"open({str(marks)!r}, 'a').write('run\\n')"]
    said: list[str] = []
    stopped, interrupted, _ = run_hypofuzz(command, cwd=str(tmp_path), env=dict(os.environ),
                                                deadline=time.monotonic() + 3, finished=lambda: False,
                                                say=said.append, min_run_s=0)
    runs = marks.read_text().count("run")
    # Stopped at the deadline (the status is then that of the SIGINT it got, and not judged).
    assert stopped and not interrupted and runs >= 2 and len(said) >= runs - 1, (runs, said)
    assert "starting it again" in said[0]
    marks.unlink()
    said.clear()
    run_hypofuzz(command, cwd=str(tmp_path), env=dict(os.environ), deadline=time.monotonic() + 3,
                 finished=lambda: True, say=said.append, min_run_s=0)
    assert marks.read_text().count("run") == 1 and not said  # every suite failed: done
    marks.unlink()
    # A run that ends sooner than min_run_s is not started again (it would spin).
    run_hypofuzz(command, cwd=str(tmp_path), env=dict(os.environ), deadline=time.monotonic() + 3,
                 finished=lambda: False, say=said.append, min_run_s=60)
    assert marks.read_text().count("run") == 1 and not said


def _count_examples(stats: object, count: int) -> None:
    for _ in range(count):
        stats()  # type: ignore[operator]
    stats.written = 0.0  # type: ignore[attr-defined]  # write the last count now
    stats()  # type: ignore[operator]


def test_each_forked_worker_counts_its_own_examples(tmp_path: Path) -> None:
    """HypoFuzz's hub makes the targets, then forks its workers: each must count into a file of
    its own (with one shared file, two workers read as one process)."""
    import multiprocessing

    from kvoracle.conformance.fuzz import _Stats, read_stats

    stats = _Stats(tmp_path)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_examples, args=(stats, count)) for count in (3, 7)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(c["examples"] for c in read_stats(tmp_path)) == [4, 8]
