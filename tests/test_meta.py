"""Meta-tests: the suite must catch each deliberately broken engine, naming the rule.

Each broken engine runs through the real ``kvoracle check`` command in a
subprocess, as an engine author would run it, with contracts off
(``KVORACLE_CONTRACTS=0``) so that the engine cannot report on itself: only
kvoracle's observations can convict it. The runs start together in one
fixture (the machine has two cores) and each test reads its JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import broken_engines
import pytest

TESTS = Path(__file__).parent
KVORACLE = [sys.executable, "-m", "kvoracle"]
MAX_EXAMPLES = "150"


def _check_command(engine: str, report: Path, replays: Path) -> list[str]:
    return [*KVORACLE, "check", "--suite", "lockstep", "--engine", f"broken_engines:{engine}",
            "--max-examples", MAX_EXAMPLES, "--seed", "0", "--step-timeout", "2",
            "--json", str(report), "--replay-dir", str(replays)]


@pytest.fixture(scope="module")
def meta_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Run every broken engine (and one correct, relabelled one) concurrently."""
    root = tmp_path_factory.mktemp("meta")
    env = {**os.environ, "KVORACLE_CONTRACTS": "0"}
    engines = [*broken_engines.EXPECTED, "RelabelledBlocks"]
    running = {}
    for engine in engines:
        report = root / f"{engine}.json"
        replays = root / f"replays-{engine}"
        process = subprocess.Popen(_check_command(engine, report, replays), cwd=TESTS, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        running[engine] = (process, report, replays)
    results = {}
    for engine, (process, report, replays) in running.items():
        output, _ = process.communicate(timeout=900)
        assert report.exists(), f"{engine}: no JSON report\n{output}"
        data = json.loads(report.read_text())
        results[engine] = {"returncode": process.returncode, "output": output, "report": data,
                           "rules": {r["id"]: r for r in data["rules"]}, "replays": replays}
    return results


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(broken_engines.EXPECTED))
def test_broken_engine_is_caught_with_its_rule(meta_runs: dict, engine: str) -> None:
    run = meta_runs[engine]
    expected_rule = broken_engines.EXPECTED[engine]
    rule = run["rules"][expected_rule]
    assert run["returncode"] == 1, run["output"]
    assert not run["report"]["ok"]
    assert run["report"]["internal_errors"] == []
    assert rule["outcome"] in ("fail", "error"), (expected_rule, rule["outcome"], run["output"])
    assert rule["counterexamples"], f"{expected_rule} failed without a counterexample"
    example = rule["counterexamples"][0]
    assert example["steps"][0].startswith("Configure(")
    assert Path(example["replay"]).exists()
    assert expected_rule in run["output"]


@pytest.mark.slow
def test_engine_errors_are_reported_and_the_run_goes_on(meta_runs: dict) -> None:
    for engine, rule_id in (("HangsOnEvict", "KV-POOL-013"), ("RaisesOnReset", "KV-POOL-014")):
        run = meta_runs[engine]
        assert run["rules"][rule_id]["outcome"] == "error"
        # Everything else was still judged: the other rules passed.
        others = [r for r in run["report"]["rules"]
                  if r["id"] != rule_id and r["outcome"] not in ("not-applicable",)]
        assert others and all(r["outcome"] == "pass" for r in others), [
            (r["id"], r["outcome"]) for r in others if r["outcome"] != "pass"]


@pytest.mark.slow
def test_a_correct_engine_with_other_block_ids_passes(meta_runs: dict) -> None:
    run = meta_runs["RelabelledBlocks"]
    assert run["returncode"] == 0, run["output"]
    rules = run["rules"]
    assert rules["KV-POOL-004"]["outcome"] == "not-applicable"  # claims no exact ids
    assert rules["KV-FULL-001"]["outcome"] == "pass"
    assert rules["KV-POOL-011"]["outcome"] == "pass"


@pytest.mark.slow
def test_replay_file_reproduces_the_counterexample(meta_runs: dict) -> None:
    run = meta_runs["ForwardFree"]
    replay = Path(run["rules"]["KV-POOL-007"]["counterexamples"][0]["replay"])
    env = {**os.environ, "KVORACLE_CONTRACTS": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(replay)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=replay.parent)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "KV-POOL-007" in done.stdout
