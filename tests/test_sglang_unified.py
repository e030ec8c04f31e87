"""SGLang 0.5.23's UnifiedRadixCache (FULL component) in the prefix-tree suite (run by ``make
test-sglang`` in .venv-sglang; skipped where SGLang is not installed).

The real unified cache passes every rule it is judged on, over the Python tree core
(``sglang-unified``) and the bundled Rust one (``sglang-unified-rust``), with the segment
recency it declares; declared to keep page recency it is convicted of KV-TREE-008, and broken
unified caches made by patching one method of SGLang's real classes (or choosing its ``mru``
policy) are convicted of the rule they break, their counterexamples failing again on replay.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.sglang_import import SGLangUnavailable, import_sglang
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES

try:
    API = import_sglang()
except SGLangUnavailable as missing:
    pytest.skip(f"SGLang is not installed here ({missing}); make test-sglang installs it", allow_module_level=True)

from broken_sglang_engines import BROKEN_UNIFIED
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.sglang_unified import SGLangUnifiedRadixCache, SGLangUnifiedRustCore
from kvoracle.conformance.prefix_tree import TreeSetup

CORES = [SGLangUnifiedRadixCache, SGLangUnifiedRustCore]


@pytest.mark.parametrize("engine", CORES, ids=[core.name for core in CORES])
def test_the_real_unified_cache_passes_every_rule_it_is_judged_on(engine):
    result = run(engine, max_examples=200, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable"
    # No window nor state component: the window and state rules (KV-TREE-016 .. 027) do not apply.
    assert {found.pop(rule_id) for rule_id in (*WINDOW_RULES, *MAMBA_RULES)} == {"not-applicable"}, found
    assert set(found.values()) == {"pass"}, found
    unexercised = [rule_id for rule_id in found if not result.verdicts.outcomes[rule_id].checks]
    assert not unexercised, unexercised


@pytest.mark.parametrize("engine", CORES, ids=[core.name for core in CORES])
def test_the_unified_cache_keeps_recency_per_segment(engine):
    """A lookup that ends inside a stored segment refreshes the rest of it (KV-TREE-009)."""
    cache = engine()
    cache.configure(TreeSetup(1, 8, ()))
    for handle, tokens in ((1, (1, 2)), (2, (9,))):
        cache.match(handle, 0, tokens)
        assert cache.insert(handle, 0, tokens, cache.alloc(len(tokens))) == 0
    assert cache.match(3, 0, (1,))[0] == 1
    assert cache.evict(1) == 1
    assert sorted(page.tokens for page in cache.observe().pages) == [(1,), (1, 2)]  # [9] went, not [1, 2]


@pytest.mark.parametrize("engine", CORES, ids=[core.name for core in CORES])
def test_insert_frees_the_duplicates_itself(engine):
    """Given the held length (prev_prefix_len), the unified insert frees the request's slots of
    the tokens it finds held past it; the adapter then drops the scheduler's free of them."""
    cache = engine()
    cache.configure(TreeSetup(2, 8, ()))
    tokens = (1, 2, 3, 4)
    first, second = cache.alloc(4), cache.alloc(4)
    for handle in (1, 2):
        assert cache.match(handle, 0, tokens)[0] == 0
    assert cache.insert(1, 0, tokens, first) == 0
    free = cache.observe().free_slots
    assert cache.insert(2, 0, tokens, second) == 4
    assert cache.observe().free_slots == free + 4
    cache.free(second)  # the driver's free of the duplicates: already done
    assert cache.observe().free_slots == free + 4


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_UNIFIED.items()), ids=[b.name for b in BROKEN_UNIFIED])
def test_broken_unified_cache_is_convicted_of_its_rule(broken, rule_id):
    assert_convicted(broken, rule_id)


def test_the_unified_tree_keeps_its_own_logical_clock():
    """The unified tree stamps recency from a counter, not the machine's clock: each read is one
    more than the last, whatever the time."""
    from sglang.srt.mem_cache.unified_cache.components import base

    first = base.get_and_increase_time_counter()
    assert base.get_and_increase_time_counter() == first + 1.0


def test_each_core_is_the_one_named():
    for engine, core in ((SGLangUnifiedRadixCache, "UnifiedTreeCore"), (SGLangUnifiedRustCore, "RustUnifiedTreeCore")):
        cache = engine()
        cache.configure(TreeSetup(1, 4, ()))
        assert type(cache.cache.tree_core).__name__ == core
        assert cache.cache.tree_components == (cache.full,)
