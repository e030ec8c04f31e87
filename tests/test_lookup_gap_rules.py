"""Meta-tests of KV-HYB-008 and KV-HYB-011, which left the gap list for the hybrid suite.

The suite judges them through two optional adapter operations, each behind a capability:
``uncached_common_prefix_tokens()`` (``uncached_prefix_tokens``, KV-HYB-008) and
``lookup_per_group()`` (``per_group_lookup``, KV-HYB-011). Each broken engine of
tests/broken_lookup_gap_engines.py breaks one of the rules; replayed on a small fixed state
it must be charged with that rule, where the reference passes. An adapter that claims neither
capability is not judged on them (and never asked), a model of one KV-cache group is never
asked for a per-group lookup, and the slow tests run the generated suite on each broken
engine: it must find the rule by itself. With vLLM 0.33 installed (.venv-vllm), vLLM's
answers on the fixed states are the spec's too.
"""

from __future__ import annotations

from collections.abc import Sequence

import broken_lookup_gap_engines
import pytest

from kvoracle.conformance.harness import RunOptions, run_suite
from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, ReferenceHybridLookup, Seed
from kvoracle.spec import get_rule
from kvoracle.spec import hybrid as spec
from kvoracle.spec.registry import NOT_YET_JUDGED

T, F = True, False
FULL, SWA = "full", "sliding_window"

STATES = {
    # Full attention then a window of 2 (one pass, KV-HYB-005): the full group answers 4 tokens,
    # the window group shrinks the candidate to 2. The longest candidate was 4: 2 uncached
    # tokens. Taken once per pass, after the window group, it is 2, and the count 0.
    "UncachedLongestAtPassEnd": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 2)), hash_block_size=1, num_blocks=200, use_eagle=False,
                    prompts=((1, 2, 3, 0, 2),)),
        Seed(0, 0, (T, T, T, T, T)), Seed(0, 1, (T, T, F, F, F)), LookUp(0)],
    # EAGLE, bound 5, the 6-token prompt cached in the full group and blocks 0..2 of the window-2
    # group: the hybrid hit is 2 tokens (the window's run with its peek block). Looked up alone,
    # the full group reads one block past the bound (6 tokens) and drops it: 5 tokens. Without
    # the margin it drops block 4 and hits 4.
    "PerGroupWithoutEagleMargin": [
        HybridSetup(groups=((FULL, 1, 0), (SWA, 1, 2)), hash_block_size=1, num_blocks=200, use_eagle=True,
                    prompts=((1, 2, 3, 0, 2, 1),)),
        Seed(0, 0, (T,) * 6), Seed(0, 1, (T, T, T, F, F, F)), LookUp(0)],
}
RULES = {"KV-HYB-008": "uncached_prefix_tokens", "KV-HYB-011": "per_group_lookup"}


def test_both_rules_left_the_gap_list_for_the_hybrid_suite() -> None:
    for rule_id, capability in RULES.items():
        rule = get_rule(rule_id)
        assert rule_id not in NOT_YET_JUDGED
        assert rule.judged_by == ("hybrid",) and rule.needs == (capability,)
    assert set(broken_lookup_gap_engines.EXPECTED.values()) == set(RULES)
    assert set(STATES) == set(broken_lookup_gap_engines.EXPECTED)


@pytest.mark.parametrize("engine", sorted(broken_lookup_gap_engines.EXPECTED))
def test_broken_engine_is_charged_with_its_rule(engine: str) -> None:
    with pytest.raises(RuleViolation) as caught:
        replay("hybrid", getattr(broken_lookup_gap_engines, engine), STATES[engine])
    assert caught.value.rule_id == broken_lookup_gap_engines.EXPECTED[engine], caught.value


@pytest.mark.parametrize("engine", sorted(broken_lookup_gap_engines.EXPECTED))
def test_the_reference_passes_each_state_and_is_judged_on_both_rules(engine: str) -> None:
    verdicts = replay("hybrid", "reference", STATES[engine])
    assert verdicts is not None
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    assert all(verdicts.outcomes[rule_id].checks > 0 for rule_id in RULES)


def _drive(adapter: object, steps: Sequence[object]) -> tuple:
    """Apply a fixed state's setup and seeds to ``adapter``; return its final lookup, uncached
    count and per-group lookup, and the spec's inputs for that lookup (from the reference)."""
    model = ReferenceHybridLookup()
    setup, *seeds, look = steps
    for side in (adapter, model):
        side.configure(setup.config())
        for seed in seeds:
            side.seed_cache(setup.prompts[seed.prompt], seed.group, seed.mask)
    prompt = setup.prompts[look.prompt]
    got = adapter.lookup(prompt, look.max_cache_hit_length)
    uncached = adapter.uncached_common_prefix_tokens()
    per_group = adapter.lookup_per_group(prompt, look.max_cache_hit_length)
    coordinator = model.coordinator
    hashes = model.hashes(prompt)
    flat = tuple(group.flat(setup.use_eagle) for group in coordinator.spec_groups)
    cached = tuple(coordinator._cached_flags(hashes, group) for group in coordinator.spec_groups)
    bound = len(prompt) - 1 if look.max_cache_hit_length is None else look.max_cache_hit_length
    inputs = (flat, cached, bound, len(hashes) * setup.hash_block_size, coordinator.config.scheduler_block_size)
    return got, uncached, per_group, inputs


def test_the_states_exercise_what_the_rules_state() -> None:
    """On its state, each rule's value is not the trivial one: uncached tokens, and a per-group
    hit longer than the hybrid hit that reaches the bound itself (only the EAGLE margin, reading
    past the bound, lets a dropping lookup do that). (No spec group of these states has two
    groups: per KV-cache group is per spec group.)"""
    got, uncached, _, inputs = _drive(ReferenceHybridLookup(), STATES["UncachedLongestAtPassEnd"])
    hit, _, want_uncached, _, _ = spec.fixed_point(*inputs)
    assert (got.num_tokens, uncached) == (hit, want_uncached) and uncached > 0
    got, _, per_group, inputs = _drive(ReferenceHybridLookup(), STATES["PerGroupWithoutEagleMargin"])
    assert per_group.num_tokens == spec.per_group_hits(*inputs)
    assert per_group.num_tokens[0] > got.num_tokens and per_group.num_tokens[0] == inputs[2]


class _ClaimsNeither(ReferenceHybridLookup):
    """The reference lookup without the two optional capabilities; asked for either
    observation, it fails (so that a run that asks cannot pass)."""

    name = "claims-neither"

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def uncached_common_prefix_tokens(self) -> int:
        raise AssertionError("asked for uncached_common_prefix_tokens() without the capability")

    def lookup_per_group(self, prompt_tokens, max_cache_hit_length=None):
        raise AssertionError("asked for lookup_per_group() without the capability")


def test_an_adapter_claiming_neither_capability_is_not_judged_on_the_rules() -> None:
    result = run_suite(_ClaimsNeither, RunOptions(max_examples=15, max_rounds=1, replay_dir=None), suite="hybrid")
    assert result.ok, [(o.rule_id, o.outcome) for o in result.verdicts.outcomes.values() if o.outcome == "fail"]
    for rule_id, capability in RULES.items():
        outcome = result.verdicts.outcomes[rule_id]
        assert outcome.outcome == "not-applicable" and outcome.checks == 0
        assert capability in outcome.not_applicable
    assert result.verdicts.outcomes["KV-HYB-003"].outcome == "pass"


class _PerGroupNeedsGroups(ReferenceHybridLookup):
    name = "per-group-needs-groups"

    def lookup_per_group(self, prompt_tokens, max_cache_hit_length=None):
        assert self.coordinator is not None
        if len(self.coordinator.config.kv_cache_specs) == 1:
            raise ValueError("no per-group lookup with one KV-cache group (as vLLM's unitary coordinator)")
        return super().lookup_per_group(prompt_tokens, max_cache_hit_length)


def test_one_kv_cache_group_is_asked_for_no_per_group_lookup() -> None:
    steps = [HybridSetup(groups=((SWA, 1, 2),), hash_block_size=1, num_blocks=50, use_eagle=False,
                         prompts=((1, 2, 3, 0, 2),)),
             Seed(0, 0, (T, T, F, T)), LookUp(0)]
    verdicts = replay("hybrid", _PerGroupNeedsGroups, steps)
    assert verdicts is not None and not any(o.failed_checks for o in verdicts.outcomes.values())
    assert verdicts.outcomes["KV-HYB-011"].checks == 0  # not asked
    assert verdicts.outcomes["KV-HYB-008"].checks == 1  # 0 uncached tokens: one group (KV-HYB-014)


@pytest.mark.parametrize("state", sorted(STATES))
def test_vllm_answers_the_spec_on_each_state(state: str) -> None:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed; run with .venv-vllm")
    if not str(vllm.__version__).startswith("0.33."):
        pytest.skip(f"the vLLM hybrid adapter supports vLLM 0.33.x, found {vllm.__version__}")
    from kvoracle.conformance.engines.vllm_hybrid import VllmHybridLookup

    got, uncached, per_group, inputs = _drive(VllmHybridLookup(), STATES[state])
    hit, _, want_uncached, _, _ = spec.fixed_point(*inputs)
    assert (got.num_tokens, uncached) == (hit, want_uncached)
    assert per_group.num_tokens == spec.per_group_hits(*inputs)
    verdicts = replay("hybrid", "vllm", STATES[state])
    assert verdicts is not None and not any(o.failed_checks for o in verdicts.outcomes.values())
    assert all(verdicts.outcomes[rule_id].checks > 0 for rule_id in RULES)


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(broken_lookup_gap_engines.EXPECTED))
def test_generated_suite_charges_the_rule(engine: str) -> None:
    rule_id = broken_lookup_gap_engines.EXPECTED[engine]
    result = run_suite(getattr(broken_lookup_gap_engines, engine),
                       RunOptions(max_examples=150, max_rounds=1, replay_dir=None), suite="hybrid")
    failed = [o.rule_id for o in result.verdicts.outcomes.values() if o.outcome == "fail"]
    assert failed == [rule_id], failed
