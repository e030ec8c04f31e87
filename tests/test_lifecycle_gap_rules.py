"""Meta-tests of KV-SWA-006, KV-CHUNK-002 and KV-HASH-006, judged by the manager suite's groups part.

The two skip-count rules need the optional adapter operation ``skipped_tokens`` (capability
``skipped_tokens``); KV-HASH-006 needs ``hash_block_views``. Each broken engine of
tests/broken_lifecycle_gap_engines.py breaks one of them; replayed on a small fixed step list
it must be charged with exactly that rule, where the reference passes. An engine that does
not claim the capabilities is never asked and never charged: the rules are not applicable.
The slow test runs the generated suite on each broken engine: it must find the rule by itself,
and no other.
"""

from __future__ import annotations

import broken_lifecycle_gap_engines as broken
import pytest

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness import RunOptions, run_suite
from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Schedule
from kvoracle.spec import get_rule
from kvoracle.spec.registry import CAPABILITIES, NOT_YET_JUDGED

FULL, SWA, CHUNK = "full", "sliding_window", "chunked_local"
PROMPT = (1, 2, 3, 4, 5, 6, 7, 8, 9)

STEPS = {
    # Window 2: after 4 computed tokens the next token's window is tokens 3..4, so 3 tokens are
    # skipped; the broken group counts 2. Both free block 0 only (blocks of 2): the tables agree,
    # only the reported count tells them apart.
    "SwaSkipsOneTokenShort": [
        ConfigureGroups(((FULL, 2, 0), (SWA, 2, 2)), hash_block_size=2, num_blocks=40, max_model_len=32),
        AddRequest("r0", PROMPT), Schedule("r0", 4), Schedule("r0", 4)],
    # Chunk 4: after 4 computed tokens the next token starts chunk 1, so chunk 0 is skipped;
    # the broken group counts from the chunk of token 3 and skips nothing.
    "ChunkSkipsBeforeLastToken": [
        ConfigureGroups(((FULL, 2, 0), (CHUNK, 2, 4)), hash_block_size=2, num_blocks=40, max_model_len=32),
        AddRequest("r0", PROMPT), Schedule("r0", 4), Schedule("r0", 4)],
    # Full attention in blocks of 4 over hash blocks of 2: the 8 aligned tokens cache blocks 0
    # and 1 under units 1 and 3; the broken view names them by units 0 and 2.
    "CoarseBlockUnderFirstUnit": [
        ConfigureGroups(((FULL, 4, 0), (SWA, 2, 4)), hash_block_size=2, num_blocks=40, max_model_len=32),
        AddRequest("r0", PROMPT), Schedule("r0", 9)],
}


class ClaimsNeither(ReferenceEngine):
    """The reference without the optional operation (it raises if asked) and without the
    capabilities KV-SWA-006, KV-CHUNK-002 and KV-HASH-006 need."""

    name = "reference-without-skips-or-views"

    def capabilities(self) -> Capabilities:
        return Capabilities(common_prefix=self.common_prefix, kv_cache_groups=True)

    def skipped_tokens(self, num_computed_tokens: int) -> tuple[int, ...]:
        raise AssertionError("skipped_tokens asked of an engine that does not claim it")


class BrokenSkipsUnclaimed(broken.SwaSkipsOneTokenShort):
    """The window that skips one token too few, without claiming ``skipped_tokens``."""

    def capabilities(self) -> Capabilities:
        return Capabilities(common_prefix=self.common_prefix, kv_cache_groups=True, hash_block_views=True)


def test_the_rules_left_the_gap_list() -> None:
    assert "skipped_tokens" in CAPABILITIES
    assert set(broken.EXPECTED.values()) == {"KV-SWA-006", "KV-CHUNK-002", "KV-HASH-006"}
    assert set(STEPS) == set(broken.EXPECTED)
    for rule_id in broken.EXPECTED.values():
        assert rule_id not in NOT_YET_JUDGED
        assert get_rule(rule_id).judged_by == ("manager",)
    assert get_rule("KV-SWA-006").needs == ("kv_cache_groups", "skipped_tokens")
    assert get_rule("KV-CHUNK-002").needs == ("kv_cache_groups", "skipped_tokens")
    assert get_rule("KV-HASH-006").needs == ("hash_block_views",)


@pytest.mark.parametrize("engine", sorted(broken.EXPECTED))
def test_broken_engine_is_charged_with_its_rule(engine: str) -> None:
    with pytest.raises(RuleViolation) as caught:
        replay("manager", getattr(broken, engine), STEPS[engine])
    assert caught.value.rule_id == broken.EXPECTED[engine], caught.value


@pytest.mark.parametrize("engine", sorted(broken.EXPECTED))
def test_the_reference_passes_each_step_list(engine: str) -> None:
    verdicts = replay("manager", "reference", STEPS[engine])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    assert verdicts.outcomes[broken.EXPECTED[engine]].outcome == "pass"


def test_the_paged_store_passes_the_operation_through() -> None:
    pytest.importorskip("torch")
    from kvoracle.conformance.engines.paged_store import PagedStoreWrapper

    steps = STEPS["SwaSkipsOneTokenShort"]
    verdicts = replay("manager", "paged-reference", steps)
    assert verdicts is not None and verdicts.outcomes["KV-SWA-006"].outcome == "pass"
    with pytest.raises(RuleViolation) as caught:
        replay("manager", lambda: PagedStoreWrapper(broken.SwaSkipsOneTokenShort()), steps)
    assert caught.value.rule_id == "KV-SWA-006", caught.value


@pytest.mark.parametrize("engine", sorted(broken.EXPECTED))
def test_an_engine_without_the_capabilities_is_not_judged(engine: str) -> None:
    verdicts = replay("manager", ClaimsNeither, STEPS[engine])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    outcome = verdicts.outcomes[broken.EXPECTED[engine]]
    assert outcome.outcome == "not-applicable" and outcome.checks == 0
    assert "does not claim" in outcome.not_applicable


def test_an_unclaimed_wrong_count_is_not_charged_to_its_rule() -> None:
    # Without the report the suite still sees whatever the count changes in the tables; here
    # (one block freed either way) nothing, and KV-SWA-006 is not applicable.
    verdicts = replay("manager", BrokenSkipsUnclaimed, STEPS["SwaSkipsOneTokenShort"])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    assert verdicts.outcomes["KV-SWA-006"].outcome == "not-applicable"


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(broken.EXPECTED))
def test_generated_suite_charges_the_rule(engine: str) -> None:
    rule_id = broken.EXPECTED[engine]
    result = run_suite(getattr(broken, engine), RunOptions(max_examples=150, max_rounds=1, replay_dir=None),
                       suite="hybrid-lifecycle")
    failed = [o.rule_id for o in result.verdicts.outcomes.values() if o.outcome == "fail"]
    assert failed == [rule_id], (rule_id, failed)
