"""SGLang 0.5.23's real radix cache in the prefix-tree suite (run by ``make test-sglang`` in
.venv-sglang; skipped where SGLang is not installed).

The real cache passes every rule it is judged on with the segment recency it declares, and
is convicted of KV-TREE-008 when declared to keep page recency (the difference the chapter
names); broken caches made by patching one method of SGLang's real classes at run time are
convicted of the rule they break, and their counterexamples keep failing on replay.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.sglang_import import SGLangUnavailable, import_sglang
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES

try:
    API = import_sglang()
except SGLangUnavailable as missing:
    pytest.skip(f"SGLang is not installed here ({missing}); make test-sglang installs it", allow_module_level=True)

from broken_sglang_engines import BROKEN
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.sglang import SGLangRadixCache, namespace_of
from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.prefix_tree import TreeSetup


class PageRecencyClaimed(SGLangRadixCache):
    """The real cache, declared to stamp recency per page."""

    name = "sglang-page-recency"

    def capabilities(self):
        return Capabilities(tree_recency="page")


def test_the_real_cache_passes_with_segment_recency():
    result = run(SGLangRadixCache, max_rounds=2)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable"
    # No window nor state component: the window and state rules (KV-TREE-016 .. 027) do not apply.
    assert {found.pop(rule_id) for rule_id in (*WINDOW_RULES, *MAMBA_RULES)} == {"not-applicable"}, found
    assert set(found.values()) == {"pass"}, found


def test_the_real_cache_keeps_recency_per_segment():
    """A lookup that ends inside a stored segment refreshes the rest of it (KV-TREE-009)."""
    cache = SGLangRadixCache()
    cache.configure(TreeSetup(1, 8, ()))
    for handle, tokens in ((1, (1, 2)), (2, (9,))):
        slots = cache.alloc(len(tokens))
        assert cache.insert(handle, 0, tokens, slots) == 0
    assert cache.match(3, 0, (1,))[0] == 1
    assert cache.evict(1) == 1
    assert sorted(page.tokens for page in cache.observe().pages) == [(1,), (1, 2)]  # [9] went, not [1, 2]


def test_declaring_page_recency_is_convicted_of_kv_tree_008():
    result = run(PageRecencyClaimed)
    assert outcomes(result)["KV-TREE-008"] == "fail", outcomes(result)


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN.items()), ids=[b.name for b in BROKEN])
def test_broken_sglang_cache_is_convicted_of_its_rule(broken, rule_id):
    assert_convicted(broken, rule_id)


def test_the_clock_is_logical_and_the_stub_refuses_use():
    api = import_sglang()
    before = api.clock.ticks
    assert api.radix_cache_module.time.monotonic() == before + 1
    if api.torchvision_stubbed:
        import torchvision.transforms as transforms

        with pytest.raises(ImportError, match="stub"):
            transforms.Resize(4)


def test_namespaces_map_to_extra_keys_and_back():
    assert namespace_of(None) == 0 and namespace_of("ns2") == 2
    with pytest.raises(ValueError, match="extra_key"):
        namespace_of("lora-a")
