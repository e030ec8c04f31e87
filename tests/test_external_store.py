"""The external-store suite: the reference passes it, and broken store coordinators are
convicted of the rule they break (meta-tests)."""

from __future__ import annotations

import pytest

from kvoracle.conformance.external_store import (
    LookUp,
    Put,
    ReferenceExternalStore,
    Store,
    StoreSetup,
)
from kvoracle.conformance.harness.engines import builtin_engines, engine_factory
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.reference.external_store import ExternalCachedBlockPool

OPTIONS = dict(max_examples=150, step_count=25, seed=0, max_rounds=3, replay_dir=None)


def run(factory, **overrides):
    return run_suite(factory, RunOptions(**{**OPTIONS, **overrides}), suite="external-store")


def outcome(result, rule_id):
    return result.verdicts.outcomes[rule_id].outcome


def test_reference_passes_every_rule_in_scope():
    result = run(ReferenceExternalStore)
    assert result.ok, {r: o.outcome for r, o in result.verdicts.outcomes.items() if r.startswith("KV-EXT")}
    for rule_id in ("KV-EXT-001", "KV-EXT-002", "KV-EXT-003", "KV-EXT-004", "KV-EXT-005", "KV-EXT-006",
                    "KV-EXT-007", "KV-EXT-008"):
        assert outcome(result, rule_id) == "pass", rule_id


# -- broken coordinators (adapters, so that the reference's own contracts stay out of it) ----
class UnloadableHit(ReferenceExternalStore):
    """#50359's shape: answers the first spec group's own longest hit, without checking that
    the other groups hold the chunks it then asks them to load."""

    name = "unloadable-hit"

    def lookup(self, block_hashes, max_length, exists):
        masks, hit = super().lookup(block_hashes, max_length, exists)
        coordinator = self.coordinator
        size = coordinator.spec_groups[0].kv_cache_spec.block_size
        pool = ExternalCachedBlockPool(coordinator.config.hash_block_size, exists)
        first = coordinator.existence_flags(block_hashes, pool)[0]
        run = 0
        while run < len(first) and first[run] and (run + 1) * size <= max_length:
            run += 1
        longer = run * size // coordinator.alignment * coordinator.alignment
        return (self.load_mask(block_hashes, longer), longer) if longer > hit else (masks, hit)


class EagleDroppedTwice(ReferenceExternalStore):
    """load_mask applies the EAGLE drop again to the already pruned hit (PR #43516)."""

    name = "eagle-dropped-twice"

    def load_mask(self, block_hashes, token_len):
        masks = super().load_mask(block_hashes, token_len)
        if not any(self.coordinator.group_eagle) or token_len == 0:
            return masks
        return tuple(mask[:-1] for mask in masks)


class StoreDropsAChunk(ReferenceExternalStore):
    """store_mask forgets the last chunk of every full-attention group."""

    name = "store-drops-a-chunk"

    def store_mask(self, aligned_len, start_token=0):
        kinds = [s.kind for s in self.coordinator.config.kv_cache_specs]
        return tuple((*mask[:-1], False) if mask and kind == "full" else mask
                     for mask, kind in zip(super().store_mask(aligned_len, start_token), kinds))


@pytest.mark.parametrize(("broken", "rule_id"), [
    (UnloadableHit, "KV-EXT-002"),
    (EagleDroppedTwice, "KV-EXT-004"),
    (StoreDropsAChunk, "KV-EXT-005"),
])
def test_broken_coordinator_is_convicted(broken, rule_id):
    result = run(broken, max_rounds=3)
    assert outcome(result, rule_id) == "fail", {r: o.outcome for r, o in result.verdicts.outcomes.items()
                                                if r.startswith("KV-EXT")}
    example = result.verdicts.outcomes[rule_id].counterexamples[0]
    with pytest.raises(RuleViolation) as caught:
        replay("external-store", broken, example.steps)
    assert caught.value.rule_id == rule_id


def test_replay_of_a_fixed_case_passes():
    setup = StoreSetup((("full", 2, 0), ("sliding_window", 1, 2)), 1, False, (False, False),
                       ((0, 1, 2, 3, 0, 1),))
    replay("external-store", ReferenceExternalStore, [setup, Store(0, 4), Put(0, 0, (5,)), LookUp(0, None)])


def test_engines_are_registered():
    engines = get_suite("external-store").engines
    assert set(engines) == {"reference", "vllm"}
    assert engine_factory("reference", get_suite("external-store")) is ReferenceExternalStore
    assert all("external-store" in builtin_engines()[name] for name in engines)


class AnswersOffTheHashBoundary(ReferenceExternalStore):
    """A store coordinator whose hit ends one token past what it found, where the hash block is
    longer than a token (elsewhere it answers right: one token more would still be on a hash
    boundary, and the hit's first failed check would be another's)."""

    def lookup(self, block_hashes, max_length, exists):
        masks, hit = super().lookup(block_hashes, max_length, exists)
        off = hit and self.coordinator.config.hash_block_size > 1
        return masks, hit + 1 if off else hit


def test_a_hit_off_the_hash_boundary_is_the_engine_s_wrong_answer_not_a_judge_error():
    """Before, such a hit was charged to whichever later check it broke first (here the masks'
    lengths, KV-EXT-003), and where the masks fitted it the judge read its chunk keys and broke its
    own contract (chunk_key_index takes whole hash blocks): a judge error for the engine's bug."""
    result = run(AnswersOffTheHashBoundary, max_rounds=1, fail_fast=True)
    assert result.internal_errors == [] and not result.verdicts.broken_contracts, result.internal_errors
    assert outcome(result, "KV-EXT-001") == "fail"
    assert "not a multiple of the hash block" in result.verdicts.outcomes["KV-EXT-001"].counterexamples[0].message
