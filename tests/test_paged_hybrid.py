"""The paged KV store around hybrid engines: one tensor per KV-cache group (KV-DATA).

The hybrid lifecycle suite judges the KV-DATA rules for an engine in a paged store
(``--engine paged-reference`` / ``paged-vllm``). Each group holds its own data and is
judged only on the positions it still relies on (``first_relied_position``,
KV-DATA-006): a sliding-window or chunked-local group owes nothing before its window.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoracle.conformance.engines.paged_store import PagedReferenceEngine, _Group
from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.suites import capabilities_of, get_suite
from kvoracle.conformance.harness.verdicts import RuleViolation, Verdicts
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Schedule
from kvoracle.gpu import torch
from kvoracle.reference import KVCacheManager
from kvoracle.spec import all_rules

GOOD = {"pass", "not-applicable"}
#: The data-integrity chapter's rules (KV-DATA).
#: The data rules the manager suite judges (KV-DATA-007, a tree's state slots, is the prefix-tree suite's).
DATA_RULES = tuple(rule.id for rule in all_rules()
                   if rule.chapter == "data_integrity" and "manager" in rule.judged_by)
#: The align-mode Mamba state pages' rules, judged in the same store (tests/test_paged_mamba.py).
MAMBA_STATE_RULES = ("KV-MAMBA-014", "KV-MAMBA-015")

#: Full attention (block 2) beside a sliding window of 3 tokens (block 4): two tables.
TWO_GROUPS = ConfigureGroups((("full", 2, 0), ("sliding_window", 4, 3)), hash_block_size=2,
                            num_blocks=24, max_model_len=24)


class OneTableForAllGroups(PagedReferenceEngine):
    """A model runner that writes every group's KV through the first group's block table."""

    name = "broken-one-table-for-all-groups"

    def _write_tables(self, request_id: str) -> list[torch.Tensor]:
        tables = super()._write_tables(request_id)
        return [tables[0]] * len(tables)


def _lifecycle_verdicts(adapter: object) -> Verdicts:
    """The verdicts a hybrid-lifecycle run of ``adapter`` starts from."""
    scope = set(get_suite("hybrid-lifecycle").scope())
    return Verdicts(capabilities_of(adapter), scope=lambda rule: rule.id in scope,
                    out_of_scope="not judged by the hybrid-lifecycle suite")


def test_the_data_rules_are_judged_only_for_an_engine_that_keeps_a_store() -> None:
    assert DATA_RULES
    assert set(DATA_RULES) <= set(get_suite("hybrid-lifecycle").scope())
    with_store = _lifecycle_verdicts(PagedReferenceEngine())
    without = _lifecycle_verdicts(ReferenceEngine())
    for rule_id in DATA_RULES:
        assert with_store.outcomes[rule_id].not_applicable is None
        assert without.outcomes[rule_id].not_applicable is not None


def test_paged_reference_passes_the_hybrid_lifecycle_suite_with_every_data_rule() -> None:
    # Partial Mamba hits included: the store's runner copies their shared pages, and the partial-hit
    # rules are reached too (seed 0: 39 of the 175 examples run drew a partial-hit model; KV-MAMBA-014 and
    # -015 were checked 5,131 and 2,787 times on them, KV-MAMBA-026 235 times).
    result = run_suite(PagedReferenceEngine, RunOptions(max_examples=150, replay_dir=None),
                       suite="hybrid-lifecycle")
    outcomes = result.verdicts.outcomes
    assert result.ok, [(rule_id, o.outcome) for rule_id, o in outcomes.items()
                       if o.outcome not in GOOD]
    partial = [rule.id for rule in all_rules() if "mamba_partial_hits" in rule.needs]
    assert "KV-MAMBA-026" in partial
    for rule_id in (*DATA_RULES, *MAMBA_STATE_RULES, *partial):
        assert outcomes[rule_id].checks > 0, rule_id


def test_a_windowed_group_is_judged_on_its_window_only() -> None:
    """A sliding window (3 tokens, block size 2) gives up the blocks behind it, and the
    same request's next step reuses one and overwrites what it held: no data rule breaks,
    because the group no longer relies on those positions."""
    setup = ConfigureGroups((("full", 8, 0), ("sliding_window", 2, 3)), hash_block_size=2,
                           num_blocks=12, max_model_len=24, enable_caching=False)
    engine = PagedReferenceEngine()
    engine.configure(setup.config())
    engine.add_request("r0", (0, 1, 2, 3) * 4)
    assert engine.allocate("r0", 8, 0) == ((1,), (2, 3, 4, 5))
    engine.advance("r0", 8)
    assert engine.allocate("r0", 1, 0) == ((4,), (3,))  # blocks 2, 3, 4 were given up
    engine.advance("r0", 1)
    checks = engine.observe().data_checks
    assert engine.observe().block_tables["r0"][1] == (0, 0, 0, 5, 3)
    values = engine.tracked["r0"].values
    group_1_block_3 = engine.store.blocks(1, torch.tensor([3], device=engine.store.device))[0].tolist()
    assert group_1_block_3 == [values[8], values[3]]  # position 8 over r0's own position 2
    assert not [c for c in checks if not c[1]]
    assert {"KV-DATA-003", "KV-DATA-006"} <= {rule for rule, ok, _ in checks if ok}


def test_writes_through_another_groups_table_are_caught_on_a_fixed_case() -> None:
    steps = [TWO_GROUPS, AddRequest("r0", (0, 1, 2, 3, 0, 1, 2, 3, 1, 1)), Schedule("r0", 10)]
    replay("hybrid-lifecycle", PagedReferenceEngine, steps)
    with pytest.raises(RuleViolation) as caught:
        replay("hybrid-lifecycle", OneTableForAllGroups, steps)
    assert caught.value.rule_id == "KV-DATA-003"
    assert "group 1" in caught.value.message


@pytest.mark.slow
def test_writes_through_another_groups_table_are_found_by_the_suite(tmp_path: Path) -> None:
    result = run_suite(OneTableForAllGroups, RunOptions(max_examples=150, max_rounds=1,
                                                        replay_dir=tmp_path), suite="hybrid-lifecycle")
    failed = {rule_id for rule_id, o in result.verdicts.outcomes.items()
              if o.outcome in ("fail", "error")}
    # Only the store's rules: the manager's own behaviour is right. A group written through another
    # group's table leaves its own blocks unwritten; where the first failing example's first look
    # is at a block the group has just cached, that block's contents are the rule (KV-DATA-004:
    # seed 0's draws since align-mode groups joined, a full and two chunked-local groups). In an
    # align-mode model the runner's state pages are written through the wrong table too, which
    # KV-MAMBA-014 charges (a state page null or past the end in the table used) -- beside a data rule.
    data_rules = {"KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004"}
    assert failed & data_rules and failed <= data_rules | {"KV-MAMBA-014"}, failed
    assert list(tmp_path.glob("*.py")), "no replay file was written"


@pytest.mark.parametrize(("table", "first", "stop", "ok"), [
    ((5, 6, 7), 0, 6, True),
    ((0, 6, 7), 2, 6, True),     # the null block lies before the window
    ((0, 6, 7), 1, 6, False),    # position 1 is relied on, and in the null block
    ((5, 0, 7), 4, 6, True),
    ((5, 6), 2, 5, False),       # position 4 is past the table's end
])
def test_relied_positions_must_lie_in_real_blocks(table: tuple[int, ...], first: int, stop: int,
                                                  ok: bool) -> None:
    store = PagedReferenceEngine()
    store.groups = (_Group("sliding_window", 2, 3),)
    rule_id, passed, message = store._null_in_reach(0, torch.tensor(table, device=store.device), first, stop)
    assert rule_id == "KV-DATA-006" and passed == ok
    assert ok or "group 0" in message


def test_the_reference_hybrid_manager_is_what_the_paged_reference_wraps() -> None:
    engine = PagedReferenceEngine()
    engine.configure(TWO_GROUPS.config())
    assert isinstance(engine.inner.manager, KVCacheManager)
    assert [g.kind for g in engine.groups] == ["full", "sliding_window"]
    assert engine.store is not None and engine.store.block_sizes == (2, 4)
