"""Meta-tests of the hybrid lookup suite: each broken hybrid lookup is convicted with its rule.

Each broken adapter (tests/broken_hybrid_engines.py) is replayed, through the suite's
own driver, on a small cache state where its bug shows (found by random search over
seeds and lookups), and must fail with its rule. The reference must pass the
generated suite. (Running the broken adapters through ``kvoracle check --suite
hybrid`` convicted them only for some seeds before the generator was biased towards
these states; the slow tests at the end run the CLI on each -- see docs/results.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import broken_hybrid_engines
import pytest

from kvoracle.conformance.harness.replay import replay, write_replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.harness.verdicts import Counterexample, RuleViolation
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, Seed

TESTS = Path(__file__).parent
T, F = True, False
STATES = {
    # vLLM #32802 as its issue tells it: full attention and a window of 8, block 4, EAGLE,
    # 10 blocks cached in both groups: the hit spirals to 0 instead of 36.
    "EagleDropEveryPass": [
        HybridSetup(groups=(("full", 4, 0), ("sliding_window", 4, 8)), hash_block_size=4, num_blocks=200,
                    use_eagle=True, prompts=(tuple(i % 4 for i in range(41)),)),
        Seed(0, 0, (T,) * 10), Seed(0, 1, (T,) * 10), LookUp(0)],
    "TrimFirstFullOnly": [
        HybridSetup(groups=(("full", 1, 0), ("full", 2, 0), ("sliding_window", 1, 3)), hash_block_size=1,
                    num_blocks=200, use_eagle=False, prompts=((2, 1, 3, 1, 0, 2, 1, 3, 2, 1, 0, 0),)),
        Seed(0, 0, (T, T, F, F, T, T, F, T, F, T, T, T)), Seed(0, 1, (T, T, T, T, T, T)),
        Seed(0, 2, (F, T, T, F, F, F, T, F, F, T, T, F)), LookUp(0)],
    "MambaEagleMargin": [
        HybridSetup(groups=(("mamba", 1, 0), ("sliding_window", 1, 2)), hash_block_size=1, num_blocks=200,
                    use_eagle=True, prompts=((1, 3, 1, 0, 1, 0, 1, 3),)),
        Seed(0, 0, (T,) * 8), Seed(0, 1, (T, T, F, T, T, T, T, T)), LookUp(0)],
    "SwaWindowNotMinusOne": [
        HybridSetup(groups=(("sliding_window", 1, 3), ("full", 2, 0)), hash_block_size=1, num_blocks=200,
                    use_eagle=False, prompts=((2, 2, 0, 3, 0, 2, 0, 3),)),
        Seed(0, 0, (F, F, T, T, F, T, T, F)), Seed(0, 1, (T, T, F, F)), LookUp(0)],
}


@pytest.mark.parametrize("engine", sorted(broken_hybrid_engines.EXPECTED))
def test_broken_hybrid_lookup_is_convicted_with_its_rule(engine: str) -> None:
    steps = STATES[engine]
    with pytest.raises(RuleViolation) as caught:
        replay("hybrid", getattr(broken_hybrid_engines, engine), steps)
    assert caught.value.rule_id == broken_hybrid_engines.EXPECTED[engine], caught.value
    assert caught.value.steps == steps


@pytest.mark.parametrize("engine", sorted(broken_hybrid_engines.EXPECTED))
def test_the_reference_passes_each_state(engine: str) -> None:
    verdicts = replay("hybrid", "reference", STATES[engine])
    assert not any(o.failed_checks for o in verdicts.outcomes.values())


def test_reference_passes_the_generated_hybrid_suite() -> None:
    # (80: the draws moved when partial-hit models joined; 40 and 60 left rules unexercised at seed 0.)
    result = run_suite("reference", RunOptions(max_examples=80, replay_dir=None), suite="hybrid")
    assert result.ok, [(o.rule_id, o.outcome) for o in result.verdicts.outcomes.values()
                       if o.outcome not in ("pass", "not-applicable")]


def test_hybrid_replay_file_is_a_runnable_pytest_module(tmp_path) -> None:
    """A hybrid counterexample is written with the suite's own template and replays."""
    steps = STATES["MambaEagleMargin"]
    example = Counterexample("KV-MAMBA-002", "mamba answered past the candidate", steps)
    path = write_replay(tmp_path, get_suite("hybrid"), "broken_hybrid_engines:MambaEagleMargin", example)
    assert path.name == "test_hybrid_kv_mamba_002_broken_hybrid_engines_mambaeaglemargin.py"
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert namespace["STEPS"] == steps
    with pytest.raises(RuleViolation, match="KV-MAMBA-002"):
        namespace[f"test_{path.stem[5:]}"]()


# -- the generated suite, through the CLI ------------------------------------------------------
#: Seed and budget of the CLI runs below: each broken adapter is convicted of its rule
#: within these (contracts off, as an engine author's run of a foreign engine would judge it).
#: Not every seed finds every adapter within this budget (docs/results.md): the seeds are
#: fixed ones that do, so that a weaker generator shows here as a failure.
#: (Seeds 9 and 2 since partial-hit models joined the generation and moved the draws of models with a
#: Mamba group: seed 0 then found neither the wide window nor the forgotten trim in a round.)
#: (Since the window masks with a short run after a hole moved the draws: MambaEagleMargin seed 1,
#: as seeds 1 and 2 convict it, 0 and 3 do not; TrimFirstFullOnly seed 0, as 0 and 1 do, 2 and 3 not.)
#: (Since the suite has two parts, EAGLE on and off, and draws full attention with a window of one:
#: SwaWindowNotMinusOne seed 2; a fail-fast run convicts it on seeds 1-3, not on 0, 4 or 9.)
CLI_SEEDS = {"EagleDropEveryPass": "1", "MambaEagleMargin": "1", "SwaWindowNotMinusOne": "2"}
CLI_MAX_EXAMPLES = "150"
CLI_MAX_ROUNDS = "4"


@pytest.fixture(scope="module")
def hybrid_cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``kvoracle check --suite hybrid`` on every broken adapter, two at a time (two cores)."""
    root = tmp_path_factory.mktemp("hybrid-meta")
    env = {**os.environ, "KVORACLE_CONTRACTS": "0"}
    results: dict[str, dict] = {}
    engines = sorted(broken_hybrid_engines.EXPECTED)
    for batch in (engines[:2], engines[2:]):
        running = {}
        for engine in batch:
            report, replays = root / f"{engine}.json", root / f"replays-{engine}"
            command = [sys.executable, "-m", "kvoracle", "check", "--suite", "hybrid",
                       "--engine", f"broken_hybrid_engines:{engine}", "--seed", CLI_SEEDS.get(engine, "0"),
                       "--max-examples", CLI_MAX_EXAMPLES, "--max-rounds", CLI_MAX_ROUNDS,
                       "--json", str(report), "--replay-dir", str(replays)]
            running[engine] = (subprocess.Popen(command, cwd=TESTS, env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True), report)
        for engine, (process, report) in running.items():
            output, _ = process.communicate(timeout=600)
            assert report.exists(), f"{engine}: no JSON report\n{output}"
            data = json.loads(report.read_text())
            results[engine] = {"returncode": process.returncode, "output": output, "report": data,
                               "rules": {r["id"]: r for r in data["rules"]}}
    return results


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(broken_hybrid_engines.EXPECTED))
def test_generated_hybrid_suite_convicts_broken_lookup(hybrid_cli_runs: dict, engine: str) -> None:
    """The generated suite finds each broken adapter by itself, with its rule, and the
    replay file it writes fails with that rule."""
    run = hybrid_cli_runs[engine]
    expected_rule = broken_hybrid_engines.EXPECTED[engine]
    rule = run["rules"][expected_rule]
    assert run["returncode"] == 1, run["output"]
    assert run["report"]["internal_errors"] == []
    assert rule["outcome"] == "fail", (expected_rule, rule["outcome"], run["output"])
    assert rule["counterexamples"], f"{expected_rule} failed without a counterexample\n{run['output']}"
    example = rule["counterexamples"][0]
    assert example["suite"] == "hybrid"
    assert example["steps"][0].startswith("HybridSetup(")
    path = Path(example["replay"])
    assert path.exists()
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    with pytest.raises(RuleViolation) as caught:
        namespace[f"test_{path.stem[5:]}"]()
    assert caught.value.rule_id == expected_rule, caught.value
