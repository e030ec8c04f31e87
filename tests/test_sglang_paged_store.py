"""SGLang 0.5.23's real radix caches in the paged KV store (conformance/engines/prefix_tree_store.py), run by
``make test-sglang`` in .venv-sglang; skipped where SGLang is not installed.

The model runner writes through SGLang's own slot indices: the plain ``RadixCache`` and the
``UnifiedRadixCache`` (FULL component, Python and Rust tree cores) pass every rule with the data
rules KV-DATA-001 .. 004 judged; SGLang caches with one fault patched in are convicted of the data
rule they break, with replays that keep failing.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.sglang_import import SGLangUnavailable, import_sglang
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES

try:
    API = import_sglang()
except SGLangUnavailable as missing:
    pytest.skip(f"SGLang is not installed here ({missing}); make test-sglang installs it", allow_module_level=True)

from broken_sglang_engines import BROKEN_IN_STORE, in_store
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.prefix_tree_store import (
    PagedSGLangRadixCache,
    PagedSGLangUnified,
    PagedSGLangUnifiedRust,
)
from kvoracle.conformance.prefix_tree import TreeSetup
from kvoracle.spec import data_integrity as data_spec

DATA_RULES = ("KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004")


@pytest.mark.parametrize("engine", [PagedSGLangRadixCache, PagedSGLangUnified, PagedSGLangUnifiedRust],
                         ids=lambda engine: engine.name)
def test_the_real_cache_in_the_store_passes_with_data_checks(engine):
    result = run(engine, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable"
    # No window nor state component: the window and state rules (KV-TREE-016 .. 027) do not apply.
    assert {found.pop(rule_id) for rule_id in (*WINDOW_RULES, *MAMBA_RULES)} == {"not-applicable"}, found
    assert set(found.values()) == {"pass"}, found
    for rule_id in DATA_RULES:
        outcome = result.verdicts.outcomes[rule_id]
        assert outcome.outcome == "pass" and outcome.checks > 0, (rule_id, outcome.outcome, outcome.checks)


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_IN_STORE.items()), ids=[b.name for b in BROKEN_IN_STORE])
def test_broken_sglang_cache_in_the_store_is_convicted_of_its_data_rule(broken, rule_id):
    assert_convicted(in_store(broken), rule_id)


def test_the_runner_writes_through_sglangs_indices_and_never_its_padding_slot():
    """SGLang's allocators keep slot 0 (page 0) for padded tokens: no request's row holds it, so the
    store's slot 0 stays unwritten; a hit reads back the prefix written through the first row."""
    for page_size in (1, 2):
        store = PagedSGLangRadixCache()
        store.configure(TreeSetup(page_size, 4, ()))
        hit, _ = store.match(1, 0, (5, 6, 7, 8))
        assert hit == 0
        store.lock(1)
        row = store.alloc(4)
        assert 0 not in row
        store.forward(1, 0, (5, 6, 7, 8), row, 0)
        assert store.insert(1, 0, (5, 6, 7, 8), row) == 0
        store.unlock(1)
        assert store.match(2, 0, (5, 6, 7, 8, 9)) == (4, tuple(row))
        view = store.observe()
        assert [check for check in view.data_checks if not check[1]] == []
        assert {rule_id for rule_id, _, _ in view.data_checks} >= {"KV-DATA-001", "KV-DATA-002", "KV-DATA-004"}
        assert int(store.store.values[0][0, 0]) == data_spec.UNWRITTEN
