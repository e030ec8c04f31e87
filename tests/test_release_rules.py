"""The rules that older vLLM releases showed to need precision of their own (issue 14).

Each broken engine below re-creates, on kvoracle's reference, the behaviour of a vLLM
release, and each test replays a state where it shows and requires the rule the suite
must charge: the null block's count (KV-POOL-017, not KV-POOL-002), cascade blocks with
caching off (KV-LIFE-011), a refused model of shared specs (KV-HYB-002), a refused EAGLE
window finer than the alignment (KV-SWA-010), a look-ahead capped at the bound
(KV-HYB-007, where the spiral's loop gives the same answer), and a Mamba look-ahead whose
hit outgrows full attention (KV-MAMBA-002, not KV-HYB-006). Each state also passes on the
reference, so the state, not the rule, is what the test varies.
"""

from __future__ import annotations

from functools import partial

import attrs
import pytest
from broken_groups import groups_engine
from broken_hybrid_engines import MambaEagleMargin, _Unchecked
from broken_loop import broken_fixed_point
from broken_store_gap_engines import _MarkedGroupsDrop, _UncheckedCoordinator
from test_hybrid_lifecycle import PartialTailAtPromptEnd

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.external_store import LookUp as StoreLookUp
from kvoracle.conformance.external_store import Put, ReferenceExternalStore, Store, StoreSetup
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, ReferenceHybridLookup, Seed
from kvoracle.conformance.steps import (
    AddRequest,
    AppendTokens,
    CommonPrefix,
    Configure,
    ConfigureGroups,
    Evict,
    Free,
    Schedule,
)
from kvoracle.reference import ManagerConfig
from kvoracle.spec import hybrid as spec

T = True


# -- the engines -------------------------------------------------------------------------------
class NullCountDrifts(ReferenceEngine):
    """Reports the null block's count one below 0 per null entry it freed (vLLM 0.14 - 0.32)."""

    name = "broken-null-count-drifts"

    def configure(self, config) -> None:
        super().configure(config)
        self.drift = 0

    def free(self, request_id: str, preempted: bool = False) -> None:
        tables = self.observe().block_tables.get(request_id, ())
        self.drift -= sum(1 for table in tables for block in table if block == 0)
        super().free(request_id, preempted)

    def observe(self):
        observation = super().observe()
        counts = list(observation.ref_counts)
        counts[0] += self.drift
        return attrs.evolve(observation, ref_counts=tuple(counts))


class CascadeWithCachingOff(ReferenceEngine):
    """Counts cascade common-prefix blocks with prefix caching off too."""

    name = "broken-cascade-caching-off"

    def __init__(self) -> None:
        super().__init__(common_prefix="cascade")

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        return tuple(group.num_common_prefix_blocks(request_id) for group in self.manager.groups)


class RefusesSharedSpecs(ReferenceHybridLookup):
    """Refuses a model whose groups share specs (vLLM before 0.29)."""

    name = "broken-refuses-shared-specs"

    def configure(self, config) -> None:
        if config.shares_specs:
            raise AssertionError("HybridKVCacheCoordinator requires at least two attention groups.")
        super().configure(config)


class RefusesFineEagleWindow(ReferenceHybridLookup):
    """Cannot look up an EAGLE window whose block is finer than the alignment (vLLM < 0.19.1)."""

    name = "broken-refuses-fine-eagle-window"

    def lookup(self, prompt_tokens, max_cache_hit_length=None):
        config = self.coordinator.config
        if config.use_eagle and any(group.kind == spec.SLIDING_WINDOW
                                    and group.kv_cache_spec.block_size != config.scheduler_block_size
                                    for group in self.coordinator.spec_groups):
            raise AssertionError("aligned_length is not compatible with eagle now")
        return super().lookup(prompt_tokens, max_cache_hit_length)


class _CappedLookAhead(_Unchecked):
    fixed_point = staticmethod(partial(broken_fixed_point, margin_cap_at_bound=True))


class LookAheadCappedAtBound(ReferenceHybridLookup):
    """The EAGLE look-ahead stops at max_cache_hit_length (vLLM 0.20 - 0.31)."""

    name = "broken-look-ahead-capped-at-bound"
    coordinator_class = _CappedLookAhead


class ManagerLookAheadCappedAtBound(ReferenceEngine):
    """The manager of vLLM 0.20 - 0.31: its EAGLE look-ahead stops at max_cache_hit_length."""

    name = "broken-manager-look-ahead-capped-at-bound"

    def make_manager(self, config):
        manager = super().make_manager(config)
        if hasattr(manager, "coordinator"):
            manager.coordinator.__class__ = _CappedLookAhead
        return manager


class _CappedStoreLoop(_UncheckedCoordinator):
    def local_loop(self, block_hashes, max_length, pool):
        result = spec.fixed_point(self.flat_groups(), self.existence_flags(block_hashes, pool), max_length,
                                  len(block_hashes) * self.config.hash_block_size, self.alignment,
                                  margin_cap="max_length")
        return result[0], result[4]

    def find_longest_cache_hit(self, block_hashes, max_length, cached_block_pool):
        hit, last = self.local_loop(block_hashes, max_length, cached_block_pool)
        masks = tuple(list(self.group_load_mask(g, hit, last[self._group_of(g)][1])) if self._has_group(g) else []
                      for g in range(len(self.config.kv_cache_specs)))
        self._answered[(tuple(bytes(h) for h in block_hashes), hit)] = masks
        return masks, hit


class StoreLookAheadCappedAtBound(ReferenceExternalStore):
    """The Mooncake store coordinator of vLLM 0.28 - 0.31: its loop's look-ahead stops at the bound."""

    name = "broken-store-look-ahead-capped-at-bound"
    coordinator_class = _CappedStoreLoop


class _MarkedDropCapped(_MarkedGroupsDrop, _CappedStoreLoop):
    pass


class StoreDropsMarkedGroupsCapped(ReferenceExternalStore):
    """The Mooncake store of vLLM 0.26 - 0.31: the EAGLE drop in marked groups with EAGLE off
    (KV-EXT-009), in a loop whose look-ahead stops at the bound."""

    name = "broken-store-marked-drop-capped"
    coordinator_class = _MarkedDropCapped


# -- the states --------------------------------------------------------------------------------
WINDOW_OF_1 = ConfigureGroups((("sliding_window", 1, 1),), 1, 2, 4, enable_caching=False)
SHARED = HybridSetup(groups=(("full", 1, 0), ("full", 1, 0)), hash_block_size=1, num_blocks=9,
                     use_eagle=False, prompts=((0, 0),))
FINE_WINDOW = HybridSetup(groups=(("full", 4, 0), ("full", 8, 0), ("sliding_window", 4, 1)), hash_block_size=4,
                          num_blocks=37, use_eagle=True, prompts=((0,) * 24,))
EAGLE_AT_BOUND = HybridSetup(groups=(("full", 1, 0), ("sliding_window", 1, 1)), hash_block_size=1, num_blocks=9,
                             use_eagle=True, prompts=((0, 0),))
MAMBA_AND_FULL = HybridSetup(groups=(("full", 4, 0), ("mamba", 4, 0)), hash_block_size=4, num_blocks=60,
                             use_eagle=True, prompts=(tuple(i % 3 for i in range(33)),))

CASES = {
    "null count": ("manager", NullCountDrifts, "KV-POOL-017", [
        WINDOW_OF_1, AddRequest("r0", (0, 0)), Schedule("r0", 1), Schedule("r0", 1), Free("r0")]),
    "cascade, caching off": ("manager", CascadeWithCachingOff, "KV-LIFE-011", [
        Configure(ManagerConfig(num_blocks=2, block_size=1, max_model_len=2, hash_block_size=1,
                                enable_caching=False)),
        AddRequest("r0", (0,)), Schedule("r0", 1), CommonPrefix("r0")]),
    "shared specs refused": ("hybrid", RefusesSharedSpecs, "KV-HYB-002", [SHARED, LookUp(0)]),
    "fine EAGLE window refused": ("hybrid", RefusesFineEagleWindow, "KV-SWA-010", [
        FINE_WINDOW, Seed(0, 0, (T,) * 6), Seed(0, 1, (T,) * 3), Seed(0, 2, (T,) * 6), LookUp(0)]),
    # Hit 0 where the spec says 1; the spiral's loop answers 0 too, so the capped look-ahead
    # must win the tie (KV-HYB-007, not KV-HYB-015).
    "look-ahead capped at the bound": ("hybrid", LookAheadCappedAtBound, "KV-HYB-007", [
        EAGLE_AT_BOUND, Seed(0, 0, (T, T)), Seed(0, 1, (T, T)), LookUp(0)]),
    # vLLM 0.27.1's shrunk counterexample in the manager suite: hit 0 where the spec says 1.
    "look-ahead capped at the bound, manager": ("manager", ManagerLookAheadCappedAtBound, "KV-HYB-007", [
        ConfigureGroups((("full", 1, 0), ("sliding_window", 1, 1)), 1, 4, 4, use_eagle=True),
        AddRequest("r0", (0, 0)), Schedule("r0", 1), Schedule("r0", 1), AddRequest("r1", (0, 0)),
        Schedule("r1", 1)]),
    # vLLM 0.28.0's shrunk counterexample in the external-store suite (charged to KV-EXT-001).
    "look-ahead capped at the bound, store": ("external-store", StoreLookAheadCappedAtBound, "KV-HYB-007", [
        StoreSetup(groups=(("full", 1, 0), ("full", 1, 0), ("sliding_window", 1, 1)), hash_block_size=1,
                   use_eagle=True, eagle_groups=(False, False, False), prompts=((0, 0),), partial=False),
        Store(prompt=0, aligned_len=2), StoreLookUp(prompt=0, max_length=None)]),
    # vLLM 0.26.0 - 0.29.0's shrunk counterexample (charged to KV-EXT-001 before): hit 0, the
    # local loop's 2.
    "marked drop, capped look-ahead, store": ("external-store", StoreDropsMarkedGroupsCapped, "KV-EXT-009", [
        StoreSetup(groups=(("chunked_local", 1, 1), ("sliding_window", 1, 1)), hash_block_size=1,
                   use_eagle=False, eagle_groups=(False, True), prompts=((0, 0, 0),), partial=False),
        Put(prompt=0, group=0, hash_indices=()), Put(prompt=0, group=1, hash_indices=(1, 2)),
        StoreLookUp(prompt=0, max_length=None)]),
    # vLLM 0.27.1's shrunk counterexample (charged to KV-HLC-004 before the suite named it).
    "partial tail at the prompt end": ("manager", groups_engine(PartialTailAtPromptEnd), "KV-HLC-006", [
        ConfigureGroups((("full", 1, 0), ("full", 1, 0), ("full", 2, 0)), 1, 9, 8), AddRequest("r0", (0,)),
        Schedule("r0", 1), AppendTokens("r0", (0,)), Schedule("r0", 1), Evict((3,)), AppendTokens("r0", (0,)),
        Schedule("r0", 1), Free("r0")]),
    # vLLM 0.26.0's: the queue the other free order leaves too (charged to KV-POOL-006 then).
    "partial tail at the prompt end, not the free order": (
        "manager", groups_engine(PartialTailAtPromptEnd), "KV-HLC-006", [
        ConfigureGroups((("full", 2, 0), ("full", 1, 0), ("sliding_window", 1, 1)), 1, 8, 8), AddRequest("r0", (0,)),
        Schedule("r0", 1), AppendTokens("r0", (0, 0)), Schedule("r0", 2), Evict((1,)), AppendTokens("r0", (0,)),
        Schedule("r0", 1), AppendTokens("r0", (0,)), Schedule("r0", 1), Free("r0")]),
    # vLLM #43559's state: hit 32 while full attention holds 28 tokens.
    "Mamba look-ahead": ("hybrid", MambaEagleMargin, "KV-MAMBA-002", [
        MAMBA_AND_FULL, Seed(0, 0, (T,) * 8), Seed(0, 1, (T,) * 8), LookUp(0)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_passes_the_state(name: str) -> None:
    suite, _, _, steps = CASES[name]
    reference = ReferenceEngine(common_prefix="cascade") if "cascade" in name else None
    verdicts = replay(suite, (lambda: reference) if reference else "reference", steps)
    assert not any(o.failed_checks or o.counterexamples for o in verdicts.outcomes.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_release_behaviour_is_charged_to_its_rule(name: str) -> None:
    suite, engine, rule_id, steps = CASES[name]
    with pytest.raises(RuleViolation) as caught:
        replay(suite, engine, steps)
    assert caught.value.rule_id == rule_id, caught.value


def test_a_refused_shared_spec_model_is_charged_to_kv_hyb_002_in_the_manager_suite_too() -> None:
    class ManagerRefusesSharedSpecs(ReferenceEngine):
        name = "broken-manager-refuses-shared-specs"

        def configure(self, config) -> None:
            if getattr(config, "shares_specs", False):
                raise AssertionError("HybridKVCacheCoordinator requires at least two attention groups.")
            super().configure(config)

    steps = [ConfigureGroups((("full", 1, 0), ("full", 1, 0)), 1, 4, 4)]
    assert replay("manager", ReferenceEngine, steps).outcomes["KV-HYB-002"].checks == 1
    with pytest.raises(RuleViolation) as caught:
        replay("manager", ManagerRefusesSharedSpecs, steps)
    assert caught.value.rule_id == "KV-HYB-002"


# -- the Mamba free lag (KV-HLC-009, a declared refinement of KV-HLC-008) ----------------------
class _LaggingMamba(ReferenceEngine):
    """Frees a Mamba group's skipped blocks num_speculative_blocks tokens late (vLLM 0.17 - 0.25)."""

    def configure(self, config) -> None:
        super().configure(config)
        for group in getattr(self.manager, "groups", ()):
            group.mamba_free_lag = True


class LagsWithoutSaying(_LaggingMamba):
    name = "broken-mamba-lags-undeclared"


class LagsAndSaysSo(_LaggingMamba):
    name = "reference-mamba-lag"

    def __init__(self) -> None:
        super().__init__(mamba_free_lag=True)


class SaysLagsButDoesNot(ReferenceEngine):
    name = "broken-mamba-lag-claimed"

    def __init__(self) -> None:
        super().__init__(mamba_free_lag=True)

    def configure(self, config) -> None:
        super().configure(config)
        for group in getattr(self.manager, "groups", ()):
            group.mamba_free_lag = False


#: vLLM 0.22.0's shrunk counterexample: a Mamba group with one speculative block, caching off;
#: the third allocation frees the state block at 2 computed tokens where the lag frees none.
MAMBA_LAG = [ConfigureGroups((("mamba", 1, 1), ("full", 1, 0)), 1, 9, 4, enable_caching=False),
             AddRequest("r0", (0,)), Schedule("r0", 1), AppendTokens("r0", (0, 0)), Schedule("r0", 1),
             Schedule("r0", 1)]


@pytest.mark.parametrize(("engine", "rule_id"), [(LagsWithoutSaying, "KV-HLC-008"),
                                                 (SaysLagsButDoesNot, "KV-HLC-009")])
def test_a_mamba_group_freeing_otherwise_than_declared_is_charged_to_the_declared_rule(engine, rule_id) -> None:
    replay("manager", "reference", MAMBA_LAG)
    with pytest.raises(RuleViolation) as caught:
        replay("manager", engine, MAMBA_LAG)
    assert caught.value.rule_id == rule_id, caught.value


def test_a_declared_mamba_lag_is_judged_in_lockstep() -> None:
    verdicts = replay("manager", LagsAndSaysSo, MAMBA_LAG)
    assert not any(o.failed_checks for o in verdicts.outcomes.values())
    assert verdicts.outcomes["KV-HLC-009"].checks > 0
    assert verdicts.outcomes["KV-HLC-008"].not_applicable == "engine declares mamba_free_lag=True"
