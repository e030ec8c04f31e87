"""Example databases (conformance/harness/database.py): a failure found once is replayed
first by every later run against the same engine -- in another process, or through a
shared Redis server on another machine -- and one that no longer fails is dropped."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broken_engines import ForwardFree

import kvoracle.conformance.suites  # noqa: F401  (registers the built-in suites)
from kvoracle.conformance.harness import Capabilities, EngineCaller, Verdicts, bind_machine, get_suite
from kvoracle.conformance.harness.database import DatabaseError, chosen_database, open_database
from kvoracle.conformance.harness.machine import examples_key
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.reference import SingleTypeManager

TESTS = Path(__file__).parent
KVORACLE = [sys.executable, "-m", "kvoracle"]
#: Without the conftest's "none": these tests choose their database themselves.
ENV = {k: v for k, v in os.environ.items() if k != "KVORACLE_DATABASE"} | {"KVORACLE_CONTRACTS": "0"}


def _run(database: str | None, engine=ForwardFree, seed: int = 0):
    said: list[str] = []
    result = run_suite(engine, RunOptions(max_examples=60, seed=seed, replay_dir=None, database=database),
                       progress=said.append, suite="lockstep")
    failing = {r for r, o in result.verdicts.outcomes.items() if o.outcome == "fail"}
    return result, failing, said


def _stored(database: str, engine) -> list[bytes]:
    """The examples stored for ``engine`` in the lockstep suite, under the key every run uses."""
    machine = bind_machine(get_suite("lockstep"), engine, Verdicts(Capabilities()), EngineCaller())
    return list(open_database(database).fetch(examples_key(machine)))


class SometimesForwardFree(ForwardFree):
    """ForwardFree's bug while ``broken`` is set, the reference's behaviour after (the engine
    "fixed" between two runs, under one engine spec)."""

    broken = True

    def make_manager(self, config):
        self.group_class = ForwardFree.group_class if SometimesForwardFree.broken else SingleTypeManager
        return super().make_manager(config)


def test_a_stored_failure_is_replayed_first_and_convicts_again(tmp_path: Path) -> None:
    database = str(tmp_path / "examples")
    first, failing, said = _run(database)
    assert failing == {"KV-POOL-007"}
    assert not any("stored" in line for line in said)
    assert _stored(database, ForwardFree), "the shrunk failure was saved"
    again, failing_again, said_again = _run(database)
    assert failing_again == {"KV-POOL-007"}
    assert said_again[0].endswith(f"the failures stored in {database}"), said_again
    assert "failure: KV-POOL-007" in said_again[1]
    # The replay round runs the stored examples only: conviction without the search.
    assert again.examples < first.examples
    example = again.verdicts.outcomes["KV-POOL-007"].counterexamples[0]
    assert example.steps == first.verdicts.outcomes["KV-POOL-007"].counterexamples[0].steps


def test_a_stored_failure_that_no_longer_fails_is_dropped(tmp_path: Path) -> None:
    database = str(tmp_path / "examples")
    SometimesForwardFree.broken = True
    try:
        _, failing, _ = _run(database, SometimesForwardFree)
        assert failing == {"KV-POOL-007"}
        stored = _stored(database, SometimesForwardFree)
        assert stored
        SometimesForwardFree.broken = False
        fixed, failing, said = _run(database, SometimesForwardFree)
    finally:
        SometimesForwardFree.broken = True
    assert failing == set() and fixed.ok
    assert "no stored failure fails now" in said[1]
    # Hypothesis drops the primary entries that replayed as passes (the key's secondary
    # entries, non-minimal shrink steps, may stay).
    assert not set(stored) & set(_stored(database, SometimesForwardFree))


def test_a_database_of_other_engines_changes_nothing(tmp_path: Path) -> None:
    database = str(tmp_path / "examples")
    _run(database)  # ForwardFree's failure stored
    alone, failing_alone, _ = _run(None, SometimesForwardFree)
    beside, failing_beside, said = _run(database, SometimesForwardFree)
    assert failing_alone == failing_beside == {"KV-POOL-007"}
    assert not any("stored" in line for line in said)
    assert alone.examples == beside.examples
    assert (alone.verdicts.outcomes["KV-POOL-007"].counterexamples[0].steps
            == beside.verdicts.outcomes["KV-POOL-007"].counterexamples[0].steps)


def test_the_default_database_is_in_the_hypothesis_directory_never_the_current_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVORACLE_DATABASE", raising=False)
    assert chosen_database(None, tmp_path) == str(tmp_path / "examples")
    assert chosen_database("redis://db:6379/0", tmp_path) == "redis://db:6379/0"
    monkeypatch.setenv("KVORACLE_DATABASE", "/shared/examples")
    assert chosen_database(None, tmp_path) == "/shared/examples"
    assert chosen_database("mine", tmp_path) == "mine"
    monkeypatch.setenv("KVORACLE_DATABASE", "none")
    assert chosen_database(None, tmp_path) is None
    assert chosen_database("NONE", tmp_path) is None


def test_a_database_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    with pytest.raises(DatabaseError, match="not a directory"):
        open_database(str(file))
    with pytest.raises(DatabaseError, match=r"redis://127\.0\.0\.1:1"):
        open_database("redis://127.0.0.1:1/0", check=True)


def _check(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*KVORACLE, "check", *args], cwd=cwd, env=env or ENV, capture_output=True, text=True,
                          timeout=600)


def test_the_command_replays_from_its_default_database_and_refuses_a_bad_one(tmp_path: Path) -> None:
    hypothesis_dir = tmp_path / "hyp"
    common = ["--engine", "broken_engines:ForwardFree", "--suite", "lockstep", "--max-examples", "60",
              "--no-replay", "--hypothesis-dir", str(hypothesis_dir), "--in-process"]
    env = ENV | {"PYTHONPATH": str(TESTS)}
    first = _check(*common, cwd=tmp_path, env=env)
    assert first.returncode == 1 and "KV-POOL-007" in first.stdout, first.stdout + first.stderr
    assert any((hypothesis_dir / "examples").iterdir())
    assert not (tmp_path / ".hypothesis").exists()
    second = _check(*common, "--json", str(tmp_path / "r.json"), cwd=tmp_path, env=env)
    assert second.returncode == 1 and "the failures stored in" in second.stdout, second.stdout
    assert json.loads((tmp_path / "r.json").read_text())["options"]["database"] == str(hypothesis_dir / "examples")
    none = _check(*common, "--no-database", cwd=tmp_path, env=env)
    assert none.returncode == 1 and "the failures stored in" not in none.stdout
    bad = _check(*common, "--database", str(tmp_path / "r.json"), cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "--database" in bad.stderr and "not a directory" in bad.stderr, bad.stderr


@pytest.fixture
def redis_url(tmp_path: Path):
    """A real Redis server on a free loopback port (Debian's redis-server: `make test` installs it)."""
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("KVORACLE_NO_REDIS") == "1":
            pytest.skip("KVORACLE_NO_REDIS=1: no redis-server here")
        pytest.fail("redis-server is not installed (make test installs it; KVORACLE_NO_REDIS=1 to skip)")
    pytest.importorskip("redis", reason="the redis package (kvoracle[fuzz])")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                open_database(url, check=True)
                break
            except DatabaseError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not answer")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_two_processes_share_failures_through_redis(tmp_path: Path, redis_url: str) -> None:
    common = ["--engine", "broken_engines:ForwardFree", "--suite", "lockstep", "--max-examples", "60",
              "--no-replay", "--database", redis_url]
    env = ENV | {"PYTHONPATH": str(TESTS)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    finder = _check(*common, "--hypothesis-dir", str(tmp_path / "a"), cwd=tmp_path / "a", env=env)
    assert finder.returncode == 1 and "the failures stored in" not in finder.stdout, finder.stdout
    other = _check(*common, "--hypothesis-dir", str(tmp_path / "b"), cwd=tmp_path / "b", env=env)
    assert other.returncode == 1, other.stdout + other.stderr
    assert f"the failures stored in {redis_url}" in other.stdout
    assert "failure: KV-POOL-007" in other.stdout.split("the failures stored in", 1)[1]
