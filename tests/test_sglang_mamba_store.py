"""SGLang 0.5.23's UnifiedRadixCache with its FULL and MAMBA components in the paged KV store
(conformance/engines/prefix_tree_store.py): the recurrent layers' states written into the state slots
SGLang gives an insertion and read back from the slot a hit's copy-on-write names, judged by KV-DATA-007
(run by ``make test-sglang`` in .venv-sglang; skipped where SGLang is not installed).

The real cache, over either tree core, passes every rule it is judged on with KV-DATA-001 .. 004 and 007
and the state rules checked; caches whose state data goes wrong while the tree, its states' places and
every count stay right -- a copy-on-write that names an earlier prefix's state slot, a state eviction that
frees a slot the tree still holds -- pass their written case without the store and fail it, in the store,
on KV-DATA-007, and a search in the store convicts each of it.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.sglang_import import SGLangUnavailable, import_sglang

try:
    API = import_sglang()
except SGLangUnavailable as missing:
    pytest.skip(f"SGLang is not installed here ({missing}); make test-sglang installs it", allow_module_level=True)

from broken_sglang_engines import (
    BROKEN_MAMBA_IN_STORE,
    MambaCowFromTheStateAbove,
    MambaEvictFreesTheStateAbove,
    in_store,
)
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.prefix_tree_store import PagedSGLangUnifiedMamba, PagedSGLangUnifiedMambaRust
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES, EvictStates, Peek, Serve, TreeSetup
from kvoracle.spec import data_integrity as data_spec

DATA_RULES = ("KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004", "KV-DATA-007")
REAL = [PagedSGLangUnifiedMamba, PagedSGLangUnifiedMambaRust]
PROMPT = (1, 2, 3, 4)


@pytest.mark.parametrize("engine", REAL, ids=[e.name for e in REAL])
def test_the_real_mamba_cache_in_the_store_passes_with_state_data_checked(engine):
    result = run(engine, max_examples=100, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-008") == "not-applicable"
    assert {found.pop(rule_id) for rule_id in WINDOW_RULES} == {"not-applicable"}, found
    assert set(found.values()) == {"pass"}, found
    for rule_id in (*DATA_RULES, *MAMBA_RULES):
        outcome = result.verdicts.outcomes[rule_id]
        assert outcome.outcome == "pass" and outcome.checks > 0, (rule_id, outcome.outcome, outcome.checks)


#: A written case per broken cache: the real cache in the store replays it clean, the broken one passes it
#: without the store and fails it in the store on KV-DATA-007.
CASES = {
    # States after [1, 2] and [1, 2, 3, 4] (nodes [1, 2] and [3, 4]); a lookup of the whole prompt hits
    # it, and its copy-on-write must name the state after all four tokens.
    MambaCowFromTheStateAbove: [TreeSetup(1, 8, (PROMPT, (7, 8)), states=5), Serve(1, 0), Serve(2, 0, 0, 2),
                                Peek(3, 0)],
    # Two state slots: the prompt's state goes first (a leaf [3, 4] under [1, 2]), then the state after
    # [1, 2] is inserted at the split; the older, the leaf's, is evicted, and the broken cache frees the
    # slot of [1, 2] instead, which the next insertion (of [7, 8]) takes and the runner writes.
    MambaEvictFreesTheStateAbove: [TreeSetup(1, 8, (PROMPT, (7, 8)), states=2), Serve(1, 0), Serve(2, 0, 0, 2),
                                   EvictStates(1), Serve(3, 1)],
}


def test_every_broken_mamba_cache_in_the_store_has_a_written_case():
    assert set(CASES) == set(BROKEN_MAMBA_IN_STORE)


@pytest.mark.parametrize("engine", REAL, ids=[e.name for e in REAL])
@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_the_written_case_replays_clean_on_the_real_cache_in_the_store(broken, engine):
    replay("prefix-tree", engine, CASES[broken])


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_without_the_store_the_broken_cache_passes_its_written_case(broken):
    replay("prefix-tree", broken, CASES[broken])


@pytest.mark.parametrize("broken", list(CASES), ids=[b.name for b in CASES])
def test_in_the_store_the_broken_cache_fails_its_written_case_on_the_state_data_rule(broken):
    with pytest.raises(RuleViolation) as caught:
        replay("prefix-tree", in_store(broken), CASES[broken])
    assert caught.value.rule_id == BROKEN_MAMBA_IN_STORE[broken]


@pytest.mark.parametrize(("broken", "rule_id"), list(BROKEN_MAMBA_IN_STORE.items()),
                         ids=[b.name for b in BROKEN_MAMBA_IN_STORE])
def test_broken_mamba_cache_in_the_store_is_convicted_of_its_data_rule(broken, rule_id):
    assert_convicted(in_store(broken), rule_id)


@pytest.mark.parametrize("engine", REAL, ids=[e.name for e in REAL])
def test_a_hit_reads_back_the_state_the_insertion_wrote_into_sglangs_slot(engine):
    """The runner writes the state after the inserted key into the slot SGLang's Mamba allocator gives
    (1 .. states: never its padding slot 0), and a later hit's copy-on-write names that same slot."""
    for page_size in (1, 2):
        store = engine()
        store.configure(TreeSetup(page_size, 8, (), states=3))
        assert store.match(1, 0, PROMPT)[0] == 0
        store.lock(1)
        row = store.alloc(4)
        store.forward(1, 0, PROMPT, row, 0)
        store.insert(1, 0, PROMPT, row)
        store.unlock(1)
        assert store.match(2, 0, (*PROMPT, 9))[0] == 4
        slot = store.inner.state_slot(2)
        assert slot is not None and 1 <= slot <= 3
        want = data_spec.state_after(data_spec.prefix_seed(None), PROMPT, 0)
        assert int(store.store.values[store.state_group][slot, 0]) == want
        assert int(store.store.values[store.state_group][0, 0]) == data_spec.UNWRITTEN
        view = store.observe()
        assert [check for check in view.data_checks if not check[1]] == []
        assert [(page.tokens, page.state_slot) for page in view.pages if page.state] == [(PROMPT, slot)]
        assert ("KV-DATA-007", True, "") in view.data_checks
