"""Meta-tests of the hybrid lookup suite: each broken hybrid lookup is convicted with its rule.

Each broken adapter (tests/broken_hybrid_engines.py) is replayed, through the suite's
own driver, on a small cache state where its bug shows (found by random search over
seeds and lookups), and must fail with its rule. The reference must pass the
generated suite. (Running the broken adapters through ``kvoracle check --suite
hybrid`` convicts them only for some seeds: the generator reaches these states too
rarely -- see docs/results.md.)
"""

from __future__ import annotations

import broken_hybrid_engines
import pytest

from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, Seed, hybrid_suite, replay_hybrid
from kvoracle.conformance.runner import RunOptions, run_suite
from kvoracle.conformance.verdicts import RuleViolation

T, F = True, False
STATES = {
    "EagleDropEveryPass": [
        HybridSetup(groups=(("mamba", 1, 0), ("sliding_window", 2, 4), ("sliding_window", 2, 1)),
                    hash_block_size=1, num_blocks=200, use_eagle=True, prompts=((0, 0, 0, 1, 3, 0, 1, 1),)),
        Seed(0, 0, (F, T, F, T, T, T, T, T)), Seed(0, 1, (T, T, T, F)), Seed(0, 2, (F, F, T, T)), LookUp(0)],
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
        replay_hybrid(getattr(broken_hybrid_engines, engine), steps)
    assert caught.value.rule_id == broken_hybrid_engines.EXPECTED[engine], caught.value
    assert caught.value.steps == steps


@pytest.mark.parametrize("engine", sorted(broken_hybrid_engines.EXPECTED))
def test_the_reference_passes_each_state(engine: str) -> None:
    verdicts = replay_hybrid("reference", STATES[engine])
    assert not any(o.failed_checks for o in verdicts.outcomes.values())


def test_reference_passes_the_generated_hybrid_suite() -> None:
    result = run_suite("reference", RunOptions(max_examples=40, replay_dir=None), suite=hybrid_suite())
    assert result.ok, [(o.rule_id, o.outcome) for o in result.verdicts.outcomes.values()
                       if o.outcome not in ("pass", "not-applicable")]


def test_hybrid_replay_file_is_a_runnable_pytest_module(tmp_path) -> None:
    """A hybrid counterexample is written with the suite's own template and replays."""
    from kvoracle.conformance.hybrid_lookup import write_hybrid_replay
    from kvoracle.conformance.verdicts import Counterexample

    steps = STATES["MambaEagleMargin"]
    example = Counterexample("KV-MAMBA-002", "mamba answered past the candidate", steps)
    path = write_hybrid_replay(tmp_path, "broken_hybrid_engines:MambaEagleMargin", example)
    assert path.name == "test_hybrid_kv_mamba_002_broken_hybrid_engines_mambaeaglemargin.py"
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert namespace["STEPS"] == steps
    with pytest.raises(RuleViolation, match="KV-MAMBA-002"):
        namespace[f"test_{path.stem[5:]}"]()
