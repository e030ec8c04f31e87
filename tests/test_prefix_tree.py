"""The prefix-tree suite (chapter 14) without SGLang: the reference passes it, broken prefix
trees built on the reference are convicted of the rule they break, their counterexamples keep
failing on replay, and bad input is refused naming the rule and the parameter."""

from __future__ import annotations

import pytest
from broken_tree_engines import BROKEN
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.harness.engines import builtin_engines, engine_factory
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.harness.verdicts import applicability
from kvoracle.conformance.prefix_tree import (
    Arrive,
    Compute,
    Evict,
    Finish,
    Peek,
    ReferencePrefixTree,
    Serve,
    TreeSetup,
)
from kvoracle.reference.prefix_tree import PageAllocator, PrefixTree
from kvoracle.spec import ConfigError


def test_reference_passes_every_rule_it_is_judged_on():
    result = run(ReferencePrefixTree, max_rounds=1)
    assert result.ok, outcomes(result)
    found = outcomes(result)
    assert found.pop("KV-TREE-009") == "not-applicable"  # the reference declares page recency
    assert found.pop("KV-TREE-029") == "not-applicable"  # ... and so its window KV's order is KV-TREE-028
    assert set(found.values()) == {"pass"}, found


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN.items()), ids=[b.name for b in BROKEN])
def test_broken_tree_is_convicted_of_its_rule(broken, rule_id):
    assert_convicted(broken, rule_id)


def test_a_written_case_replays_clean_on_the_reference():
    steps = [TreeSetup(2, 4, ((1, 2, 3, 4, 5), (1, 2, 9, 9))), Serve(1, 0), Arrive(2, 1), Compute(2),
             Peek(3, 0, 1), Evict(2), Finish(2), Peek(4, 1)]
    replay("prefix-tree", ReferencePrefixTree, steps)


def test_segment_and_page_recency_evict_differently():
    """The difference KV-TREE-008 and KV-TREE-009 name: a lookup ending inside a segment."""
    removed = {}
    for recency in ("page", "segment"):
        tree = PrefixTree(1, recency)
        tree.insert(0, (1, 2), (10, 11))
        tree.insert(0, (9,), (12,))
        tree.match(0, (1,))
        removed[recency] = tree.evict(1)
    assert removed == {"page": [(0, (1, 2))], "segment": [(0, (9,))]}


def test_segment_recency_evicts_whole_segments():
    tree = PrefixTree(1, "segment")
    tree.insert(0, (1, 2, 3), (10, 11, 12))
    assert tree.evict(1) == [(0, (1, 2, 3)), (0, (1, 2)), (0, (1,))]
    page = PrefixTree(1, "page")
    page.insert(0, (1, 2, 3), (10, 11, 12))
    assert page.evict(1) == [(0, (1, 2, 3))]


def test_recency_is_a_mode_capability():
    assert applicability("KV-TREE-009", Capabilities()) == "engine declares tree_recency='page'"
    assert applicability("KV-TREE-008", Capabilities(tree_recency="segment")) is not None
    assert applicability("KV-TREE-008", Capabilities(tree_recency="none")) is not None
    with pytest.raises(ValueError, match="tree_recency"):
        Capabilities(tree_recency="lru")


@pytest.mark.parametrize(("build", "parameter"), [
    (lambda: PrefixTree(0), "page_size"),
    (lambda: PageAllocator(0, 2), "num_pages"),
    (lambda: PageAllocator(4, 2).alloc(3), "num_tokens"),
    (lambda: PrefixTree(2, "sometimes"), "recency"),
])
def test_bad_input_is_refused_naming_the_rule_and_parameter(build, parameter):
    with pytest.raises(ConfigError) as refused:
        build()
    assert refused.value.parameter == parameter
    assert refused.value.rule_id.startswith("KV-TREE-")


def test_engines_are_registered_and_sglang_is_imported_lazily():
    engines = get_suite("prefix-tree").engines
    assert set(engines) == {"reference", "sglang", "sglang-unified", "sglang-unified-rust", "paged-reference",
                            "paged-sglang", "paged-sglang-unified", "paged-sglang-unified-rust", "sglang-unified-swa",
                            "sglang-unified-swa-rust", "paged-sglang-unified-swa", "paged-sglang-unified-swa-rust",
                            "sglang-unified-mamba", "sglang-unified-mamba-rust", "paged-sglang-unified-mamba",
                            "paged-sglang-unified-mamba-rust"}
    assert builtin_engines()["paged-reference"] == ["manager", "prefix-tree"]
    assert engine_factory("reference", get_suite("prefix-tree")) is ReferencePrefixTree
    assert "prefix-tree" in builtin_engines()["sglang"]
    # The adapter's module imports without SGLang; building the adapter is what needs it.
    factory = engine_factory("sglang", get_suite("prefix-tree"))
    assert factory.__name__ == "SGLangRadixCache"
