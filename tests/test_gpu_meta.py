"""Meta-tests for the paged KV store: the suite must convict each broken engine of its rule.

As in ``test_meta.py``, each engine of ``broken_gpu_engines.py`` runs through the real
``kvoracle check`` in a subprocess with contracts off; the runs start together and each
test reads its JSON report. One round per run: each engine has one bug, and the first
rule it is convicted of is the one that must be named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import broken_gpu_engines
import pytest

TESTS = Path(__file__).parent
MAX_EXAMPLES = "150"


@pytest.fixture(scope="module")
def gpu_meta_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("gpu-meta")
    env = {**os.environ, "KVORACLE_CONTRACTS": "0", "KVORACLE_DEVICE": "cpu"}
    running = {}
    for engine in broken_gpu_engines.EXPECTED:
        report, replays = root / f"{engine}.json", root / f"replays-{engine}"
        command = [sys.executable, "-m", "kvoracle", "check", "--suite", "lockstep", "--engine",
                   f"broken_gpu_engines:{engine}", "--max-examples", MAX_EXAMPLES, "--seed", "0",
                   "--max-rounds", "1", "--step-timeout", "5", "--json", str(report),
                   "--replay-dir", str(replays)]
        running[engine] = (subprocess.Popen(command, cwd=TESTS, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True), report)
    results = {}
    for engine, (process, report) in running.items():
        output, _ = process.communicate(timeout=900)
        assert report.exists(), f"{engine}: no JSON report\n{output}"
        data = json.loads(report.read_text())
        results[engine] = {"returncode": process.returncode, "output": output, "report": data,
                           "rules": {r["id"]: r for r in data["rules"]}}
    return results


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(broken_gpu_engines.EXPECTED))
def test_broken_gpu_engine_is_caught_with_its_rule(gpu_meta_runs: dict, engine: str) -> None:
    run = gpu_meta_runs[engine]
    expected_rule = broken_gpu_engines.EXPECTED[engine]
    rule = run["rules"][expected_rule]
    assert run["returncode"] == 1, run["output"]
    assert run["report"]["internal_errors"] == []
    assert rule["outcome"] == "fail", (expected_rule, rule["outcome"], run["output"])
    example = rule["counterexamples"][0]
    assert example["steps"][0].startswith("Configure(")
    assert Path(example["replay"]).exists()
    # The bug is the only thing wrong: every other applicable rule passed or went unexercised.
    others = {r["id"]: r["outcome"] for r in run["report"]["rules"] if r["id"] != expected_rule}
    assert not {r: o for r, o in others.items() if o in ("fail", "error")}, others


@pytest.mark.slow
def test_data_only_bugs_are_invisible_to_the_structural_rules(gpu_meta_runs: dict) -> None:
    """The chunk-offset store keeps every id, count and key right: only KV-DATA sees it."""
    rules = gpu_meta_runs["StoreWritesAtChunkOffsets"]["rules"]
    for rule_id in ("KV-POOL-004", "KV-POOL-011", "KV-LIFE-005", "KV-FULL-002"):
        assert rules[rule_id]["outcome"] == "pass", rule_id
    # The out-of-order hit claims no exact ids, so the id rules that would catch it do not apply.
    rules = gpu_meta_runs["HitBlocksOutOfOrder"]["rules"]
    assert rules["KV-FULL-002"]["outcome"] == "not-applicable"
    assert rules["KV-FULL-001"]["outcome"] == "pass"
