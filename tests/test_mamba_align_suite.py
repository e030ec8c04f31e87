"""Meta-tests of the manager suite's align-mode Mamba judging (chapter 8): each broken engine of
tests/broken_align_engines.py gets one align-mode behaviour wrong, and the suite must charge it to
the rule it breaks -- on a fixed case (the suite's own shrunk counterexample, kept here), and by
finding it in a run of its own.
"""

from __future__ import annotations

import broken_align_engines as broken
import pytest
from broken_groups import groups_engine
from searches import rules_found, search

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.manager.align import align_table_rule
from kvoracle.conformance.steps import AddRequest, AppendTokens, ConfigureGroups, Free, Schedule

MAMBA, FULL = "mamba", "full"
ALONE = ConfigureGroups(((MAMBA, 1, 0),), 1, 2, 4)
SPECULATIVE = ConfigureGroups(((MAMBA, 1, 1),), 1, 3, 4)
CHECKPOINTS = ConfigureGroups(((MAMBA, 1, 0),), 1, 4, 4, mamba_checkpoint_blocks=1, mamba_checkpoint_alignment=1)

CASES = {
    "returns only new blocks": (broken.ReturnsOnlyNewBlocks, "KV-MAMBA-004", [
        ALONE, AddRequest("r0", (0, 0)), Schedule("r0", 2)]),
    "swaps a moved page": (broken.SwapsMovedPage, "KV-MAMBA-005", [
        ConfigureGroups(((MAMBA, 1, 1), (FULL, 1, 0), (FULL, 1, 0), (FULL, 1, 0)), 1, 13, 4, use_eagle=True),
        AddRequest("r0", (0, 0, 0)), Schedule("r0", 1), Schedule("r0", 2)]),
    "reserves no checkpoint": (broken.NoCheckpoint, "KV-MAMBA-006", [
        CHECKPOINTS, AddRequest("r0", (0, 0)), Schedule("r0", 2)]),
    "needs one more": (broken.NeedsOneMore, "KV-MAMBA-007", [ALONE, AddRequest("r0", (0,)), Schedule("r0", 1)]),
    # docs/findings/mamba-negative-need.md: eight rejected drafts, then a look-ahead of 20.
    "negative need": (broken.NegativeNeed, "KV-MAMBA-008", [
        ConfigureGroups(((FULL, 4, 0), (MAMBA, 4, 0)), 4, 9, 64), AddRequest("a", tuple(range(100, 108))),
        Schedule("a", 8), AppendTokens("a", (1,)), Schedule("a", 1, 8), AppendTokens("a", (2,)),
        Schedule("a", 1, 0, 20)]),
    "never defers": (broken.NeverDefers, "KV-MAMBA-009", [
        ConfigureGroups(((MAMBA, 1, 0),), 1, 4, 4), AddRequest("r0", (0, 0)), Schedule("r0", 1),
        Schedule("r0", 1), AddRequest("r1", (0, 0)), Schedule("r1", 1)]),
    "never retires": (broken.NeverRetires, "KV-MAMBA-010", [
        ConfigureGroups(((MAMBA, 1, 0),), 1, 3, 5, mamba_checkpoint_blocks=1, mamba_checkpoint_alignment=1),
        AddRequest("r0", (0, 0)), Schedule("r0", 2), AppendTokens("r0", (0,)), Schedule("r0", 1, 1)]),
    "caches no state": (broken.CachesNoState, "KV-MAMBA-011", [ALONE, AddRequest("r0", (0,)), Schedule("r0", 1)]),
    "frees head first": (broken.FreesHeadFirst, "KV-MAMBA-012", [
        SPECULATIVE, AddRequest("r0", (0,)), Schedule("r0", 1), Free("r0")]),
    "drops its last speculative page": (broken.DropsLastSpeculativePage, "KV-MAMBA-013", [
        SPECULATIVE, AddRequest("r0", (0,)), Schedule("r0", 1)]),
    "asserts on a draft checkpoint": (broken.AssertsOnDraftCheckpoint, "KV-MAMBA-017", [
        CHECKPOINTS, AddRequest("r0", (0,)), Schedule("r0", 1), AppendTokens("r0", (0,)), Schedule("r0", 1, 2)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_engine_is_convicted_on_its_case(name: str) -> None:
    groups_class, rule_id, steps = CASES[name]
    replay("hybrid-lifecycle", ReferenceEngine, steps)  # the reference passes the case
    with pytest.raises(RuleViolation) as failure:
        replay("hybrid-lifecycle", groups_engine(groups_class, need_contracts=False), steps)
    assert failure.value.rule_id == rule_id, failure.value.message


# Every case is searched for, the negative need too: it needs rejected drafts, another group and
# a look-ahead the pool falls short of by no more than the Mamba table shrank, which the
# reject_drafts rule sets up by crowding the pool (seed 0 convicts it in about 25 s of CPU).
#
# A broken engine that also breaks another rule first, in some models, is searched past its first
# failure (see tests/searches.py), and that other rule must be among those charged too:
# ``caches no state`` skips the partial tail's key as well, and where partial hits are on a prompt's
# first state is often its partial tail (KV-MAMBA-021).
ALSO_BREAKS = {"caches no state": "KV-MAMBA-021"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_engine_is_found_by_the_suite(name: str, tmp_path) -> None:
    groups_class, rule_id, _ = CASES[name]
    engine = groups_engine(groups_class, need_contracts=False)
    failed = rules_found(search(engine, "hybrid-lifecycle", tmp_path, fail_fast=name not in ALSO_BREAKS))
    assert rule_id in failed, failed
    assert failed <= {rule_id, ALSO_BREAKS.get(name, rule_id)}, failed


def test_table_rule_order() -> None:
    """A missing checkpoint page comes before what it also changes; then freed, moved, layout, ids."""
    old = (1, 2)
    assert align_table_rule(old, (1, 3, 4), (1, 0, 3), 1) == "KV-MAMBA-006"
    assert align_table_rule(old, (0, 2, 3), (1, 2, 3), None) == "KV-MAMBA-010"
    assert align_table_rule(old, (0, 3, 2), (0, 2, 3), None) == "KV-MAMBA-005"
    assert align_table_rule((), (0, 1), (1, 2), None) == "KV-MAMBA-004"
    assert align_table_rule((), (0, 1), (0, 2), None) == "KV-POOL-004"
