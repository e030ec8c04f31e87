"""SGLang 0.5.23's UnifiedRadixCache with its FULL and SWA components in the paged KV store
(conformance/engines/prefix_tree_store.py): the window layers' KV written and read through SGLang's
own full-to-window slot mapping. Run by ``make test-sglang`` in .venv-sglang; skipped where SGLang
is not installed.

The real cache, over either tree core, passes every rule it is judged on with the data rules
KV-DATA-001 .. 004 and the window rules checked; a cache whose tombstone re-fill hands a locked
node the inserter's window slots in the wrong order -- the tree, its sizes and its balance all
right, only the mapping the model runner reads through wrong -- is convicted by the data rules,
on a written case the same cache passes without the store.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.sglang_import import SGLangUnavailable, import_sglang

try:
    API = import_sglang()
except SGLangUnavailable as missing:
    pytest.skip(f"SGLang is not installed here ({missing}); make test-sglang installs it", allow_module_level=True)

from broken_sglang_engines import _PatchedSWA, in_store
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.prefix_tree_store import PagedSGLangUnifiedSWA, PagedSGLangUnifiedSWARust
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES, Arrive, EvictWindow, Peek, Serve, TreeSetup

DATA_RULES = ("KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004")
REAL = [PagedSGLangUnifiedSWA, PagedSGLangUnifiedSWARust]


@pytest.mark.parametrize("engine", REAL, ids=[e.name for e in REAL])
def test_the_real_swa_cache_in_the_store_passes_with_window_data_checked(engine):
    result = run(engine, max_examples=150, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable"
    assert found.pop("KV-TREE-028") == "not-applicable"  # segment recency: its window KV's order is KV-TREE-029
    assert {found.pop(rule_id) for rule_id in MAMBA_RULES} == {"not-applicable"}, found
    assert set(found.values()) == {"pass"}, found
    for rule_id in (*DATA_RULES, *(r for r in WINDOW_RULES if r != "KV-TREE-028")):
        outcome = result.verdicts.outcomes[rule_id]
        assert outcome.outcome == "pass" and outcome.checks > 0, (rule_id, outcome.outcome, outcome.checks)


def _set_swa_reversed(self, kept_full, incoming_full):
    """``_set_swa`` that maps the kept full slots to the incoming window slots in reverse order."""
    allocator = self.cache.token_to_kv_pool_allocator
    swa_value = allocator.translate_loc_from_full_to_swa(incoming_full)
    allocator.clear_full_to_swa_mapping(incoming_full)
    allocator.set_full_to_swa_mapping(kept_full, swa_value.flip(0))
    return swa_value


class SWARefillMapsReversed(_PatchedSWA):
    """Re-filling a tombstone points the node's full slots at the inserter's window slots in
    reverse order: the node records the right window value and every count balances, but the
    model runner, which reads a window layer's KV through the mapping, reads other tokens' KV."""

    name = "sglang-swa-refill-maps-reversed"
    swa_methods = (("_set_swa", _set_swa_reversed),)


PROMPT = (1, 2, 3, 4)
#: A request locks the prompt (its window: the node [4]); window eviction tombstones [1, 2, 3];
#: a request of [1, 2] inserts over it and, the node being locked, hands it its window slots;
#: a lookup of [1, 2] then reads the window KV of [1, 2] through the mapping.
REFILL_CASE = [TreeSetup(1, 8, (PROMPT,), 1), Serve(1, 0), Arrive(2, 0), EvictWindow(2), Serve(3, 0, 0, 2),
               Peek(4, 0, 0, 2)]


def test_the_refill_case_replays_clean_on_the_real_cache_in_the_store():
    replay("prefix-tree", PagedSGLangUnifiedSWA, REFILL_CASE)


def test_without_the_store_the_reversed_mapping_passes_the_refill_case():
    replay("prefix-tree", SWARefillMapsReversed, REFILL_CASE)


def test_in_the_store_the_reversed_mapping_fails_the_refill_case_on_a_data_rule():
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", in_store(SWARefillMapsReversed), REFILL_CASE)
    assert caught.value.rule_id in DATA_RULES


def test_the_reversed_mapping_in_the_store_is_convicted():
    assert_convicted(in_store(SWARefillMapsReversed), "KV-DATA-004")
