"""Meta-tests over vLLM: the suite must catch each broken vLLM engine, naming its rule.

``benchmarks/broken_vllm.py`` re-creates the meta-tests' broken engines
(``tests/broken_engines.py``) around vLLM 0.33's real ``KVCacheManager``. These
tests run ``benchmarks/bench_vllm.py`` in subprocesses, as ``test_meta.py`` runs
``kvoracle check``: with contracts off (``KVORACLE_CONTRACTS=0``, which this
interpreter may have imported kvoracle without), two at a time (the machine has
two cores).

* Every broken engine, seed 0, is run until the first failing check of its
  expected rule (``--stop detection``): that check must come, and it must be that
  rule. Shrinking, which takes most of a conviction's time, is left out to keep
  the test short.
* Two of them are run to a full conviction (``--stop conviction``): the runner
  must report the expected rule with a shrunk counterexample.
* Part b of the benchmark replays a small prefix of the Mooncake trace through
  the reference and vLLM adapters: both must make the same calls and report the
  same hits.

Skipped unless vLLM 0.33.x is installed (``scripts/install_vllm.sh``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    VLLM_VERSION = importlib.metadata.version("vllm")  # without paying vLLM's import time
except importlib.metadata.PackageNotFoundError:
    pytest.skip("vLLM is not installed; run scripts/install_vllm.sh and use .venv-vllm",
                allow_module_level=True)
if not VLLM_VERSION.startswith("0.33."):
    pytest.skip(f"the vLLM adapter supports vLLM 0.33.x, found {VLLM_VERSION}",
                allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "bench_vllm.py"
TRACE = REPO.parent / "shared" / "data" / "mooncake-fast25" / "conversation_trace.jsonl"
sys.path.insert(0, str(REPO / "benchmarks"))
import broken_vllm  # noqa: E402  (needs the path above; imports no vLLM)

#: The two engines run to a full conviction: the fastest to shrink on seed 0.
CONVICTED = ("HitOneBlockShort", "RaisesOnReset")


def _bench(*args: str) -> subprocess.Popen:
    env = {**os.environ, "KVORACLE_CONTRACTS": "0"}
    return subprocess.Popen([sys.executable, str(BENCH), "--json", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out)


#: The engines whose detection takes longest on seed 0 run in one process, the rest in another.
SLOW = ("ForgetsEvictableHits", "ForwardFree", "HitPastBound", "TouchLeavesHitsFree")


def _synthetic_trace(directory: Path) -> Path:
    """A Mooncake-format trace for machines without the shared one (a clean CI clone):
    ten conversations of six turns, each turn extending its conversation's hash ids, so
    later turns hit the earlier turns' blocks."""
    path = directory / "conversation_trace.jsonl"
    lines = []
    for turn in range(6):
        for conversation in range(10):
            hash_ids = [conversation * 100 + i for i in range(3 + 2 * turn)]
            lines.append(json.dumps({"timestamp": turn, "input_length": 512 * len(hash_ids),
                                     "output_length": 200, "hash_ids": hash_ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The benchmark runs, two at a time, balanced by their time on seed 0."""
    detect = ["--parts", "c", "--stop", "detection", "--seeds", "0", "--engines"]
    fast = [name for name in broken_vllm.EXPECTED if name not in SLOW]
    trace = TRACE if TRACE.is_file() else _synthetic_trace(tmp_path_factory.mktemp("trace"))
    slow = ["--parts", "bc", "--requests", "60", "--pool-blocks", "400", "--trace", str(trace),
            *detect[2:], *SLOW]
    slow_run = _bench(*slow)
    fast_detection = _result(_bench(*detect, *fast))
    conviction = _result(_bench("--parts", "c", "--stop", "conviction", "--seeds", "0",
                                "--engines", *CONVICTED))
    slow_detection = _result(slow_run)
    slow_detection["counterexamples"] += fast_detection["counterexamples"]
    return {"detection": slow_detection, "conviction": conviction}


@pytest.mark.parametrize("engine", sorted(broken_vllm.EXPECTED))
def test_broken_vllm_engine_fails_its_rule(runs: dict, engine: str) -> None:
    rows = [r for r in runs["detection"]["counterexamples"] if r["engine"] == engine]
    assert len(rows) == 1
    row = rows[0]
    assert row["expected"] == broken_vllm.EXPECTED[engine]
    assert row["detected"], (engine, row)
    # Rules that fail earlier are allowed (e.g. a hit past the bound also breaks EAGLE's
    # rules), but the expected one must be among the failures.
    assert row["expected"] in row["rules_detected"]


@pytest.mark.parametrize("engine", CONVICTED)
def test_broken_vllm_engine_is_convicted_with_a_shrunk_counterexample(runs: dict,
                                                                      engine: str) -> None:
    (row,) = [r for r in runs["conviction"]["counterexamples"] if r["engine"] == engine]
    assert row["convicted"], (engine, row)
    assert row["expected"] in row["rules_reported"]


def test_reference_and_vllm_replay_the_trace_with_the_same_hits(runs: dict) -> None:
    result = runs["detection"]["per_operation"]
    reference = result["reference"]
    assert reference["hit_tokens"] > 0  # the trace prefix shares prefixes: hits happen
    for name in ("vllm", "vllm-no-translation"):
        assert result[name]["calls"] == reference["calls"], name
        assert result[name]["hits"] == reference["hits"], name
        assert result[name]["hit_tokens"] == reference["hit_tokens"], name
        for outcome in ("finished", "dropped", "preempted"):
            assert result[name][outcome] == reference[outcome], (name, outcome)
    assert reference["finished"] + reference["dropped"] + reference["preempted"] == 60
