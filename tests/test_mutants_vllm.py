"""vLLM's source mutants (issue 18): each applies to the installed release, and the suites
convict a sample of them, under the rule that names what the edit breaks.

The whole kill rate (every mutant, any seeds) is a benchmark, ``benchmarks/kill_rate.py``,
with its figures in docs/results.md; here two mutants of different areas run to a
conviction under ``--fail-fast`` in a child process, as the benchmark runs them.

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
    VLLM_VERSION = importlib.metadata.version("vllm")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("vLLM is not installed; run scripts/install_vllm.sh and use .venv-vllm",
                allow_module_level=True)
if not VLLM_VERSION.startswith("0.33."):
    pytest.skip(f"the mutants are written against vLLM 0.33.x, found {VLLM_VERSION}", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import kill_rate  # noqa: E402  (needs the path above)
from mutants_vllm import AREAS, MUTANTS  # noqa: E402
from mutation import KINDS, applied  # noqa: E402

#: Mutants run to a conviction here, with the rule that must convict each on seed 0.
SAMPLE = {"pool.free.unhashed-to-tail": "KV-POOL-006", "pool.free.no-decref": "KV-POOL-011"}


def test_every_mutant_applies_to_the_installed_release_and_is_put_back() -> None:
    assert kill_rate._check_all() == 0
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.touch
    with applied(MUTANTS["pool.touch.double-ref"]):
        assert BlockPool.touch is not original
    assert BlockPool.touch is original


def test_the_catalogue_spreads_over_every_area_and_kind() -> None:
    assert len(MUTANTS) >= 60
    prefixes = {key.split(".")[0] for key in MUTANTS}
    assert {"pool", "queue", "store"} <= prefixes, prefixes
    assert {m.target.split(":")[0].rsplit(".", 1)[-1] for m in MUTANTS.values()} >= {
        "block_pool", "kv_cache_utils", "single_type_kv_cache_manager", "kv_cache_coordinator",
        "kv_cache_manager", "coordinator"}
    assert {m.kind for m in MUTANTS.values()} == set(KINDS)
    assert set(AREAS) == {"pool", "single_type", "coordinator", "store"}


def test_a_sample_of_mutants_is_convicted_under_its_rule(tmp_path: Path) -> None:
    report = tmp_path / "kill.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kill_rate.py"), "--mutants", *SAMPLE,
                           "--seeds", "0", "--no-baseline", "--fail-fast", "--json", str(report)],
                          cwd=REPO, env={**os.environ, "KVORACLE_CONTRACTS": "0"}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {row["mutant"]: row for row in json.loads(report.read_text())["rows"]}
    assert {key: rows[key]["rule"] for key in SAMPLE} == SAMPLE
    assert all(rows[key]["killed"] and rows[key]["suite"] == "manager" for key in SAMPLE)
    # Each failure was seen (time to detection) before it was shrunk and reported (conviction).
    assert all(rows[key]["detected_rule"] and rows[key]["detected_cpu_s"] <= rows[key]["convicted_cpu_s"]
               for key in SAMPLE), rows


def test_the_zoo_s_bugs_of_the_release_are_no_kills() -> None:
    """A real bug of the installed release fails on the unmutated engine too, on the seeds that
    reach it: it never counts as a mutant's kill (0.33.0: the two align-mode Mamba bugs)."""
    known = kill_rate.known_bugs()
    if VLLM_VERSION == "0.33.0":
        assert known == {"manager": {"KV-MAMBA-008", "KV-MAMBA-017"}}
    assert all(rule.startswith("KV-") for rules in known.values() for rule in rules)
