"""The Mamba state pages of the paged store (KV-MAMBA-014/015): a state per page, written as
vLLM's model runner writes it, and judged where a hit reads it and while a page stays cached.

Broken model runners -- one writing a step's state a page late, one ignoring the state the
previous step left, one never writing the checkpoint -- are convicted under their rule on fixed
cases and found by the suite on its own; the reference in the store passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoracle.conformance.engines.paged_mamba import AlignGroup, MambaStatePages, RunnerState
from kvoracle.conformance.engines.paged_store import PagedReferenceEngine
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, Free, NewStep, Schedule
from kvoracle.spec import data_integrity as data_spec

#: An align-mode Mamba group alone: a page per two tokens, no speculative pages.
MAMBA_ALONE = ConfigureGroups((("mamba", 2, 0),), hash_block_size=2, num_blocks=12, max_model_len=16,
                              enable_caching=True)
#: Beside full attention with blocks of 4: hits align to 4, and a prefill checkpoint is exported.
MAMBA_WITH_CHECKPOINT = ConfigureGroups((("mamba", 2, 0), ("full", 4, 0)), hash_block_size=2, num_blocks=16,
                                        max_model_len=16, enable_caching=True, mamba_checkpoint_blocks=1,
                                        mamba_checkpoint_alignment=1)
PROMPT = (0, 1, 2, 3, 1)

#: A request prefilled in two chunks, then another one hitting its state after 4 tokens.
TWO_CHUNKS_THEN_A_HIT = [
    MAMBA_ALONE, AddRequest("r0", PROMPT), Schedule("r0", 2), Schedule("r0", 2), Schedule("r0", 1), Free("r0"),
    NewStep(), AddRequest("r1", (*PROMPT[:4], 2, 2)), Schedule("r1", 2)]
#: One chunk of 10 tokens: the running page (state after 10) and a checkpoint at 8, entry 3.
ONE_CHUNK_WITH_A_CHECKPOINT = [MAMBA_WITH_CHECKPOINT, AddRequest("r0", (0, 1, 2, 3, 0, 1, 2, 3, 3, 3)),
                               Schedule("r0", 10)]


class OnePageLate(MambaStatePages):
    """Writes each state into the entry after the one it belongs to."""

    def _targets(self, group: AlignGroup, committed: int, checkpoint: int) -> tuple[tuple[int, int], ...]:
        return tuple((index + 1, count) for index, count in super()._targets(group, committed, checkpoint))


class StartsFromScratch(MambaStatePages):
    """Ignores the state the previous step left: every step starts from the empty state."""

    def _source(self, runner: RunnerState, group: AlignGroup, start: int) -> int:
        return -1


class NoCheckpoint(MambaStatePages):
    """Never writes the prefill checkpoint the backend exports."""

    def _targets(self, group: AlignGroup, committed: int, checkpoint: int) -> tuple[tuple[int, int], ...]:
        return super()._targets(group, committed, 0)


def _engine(pages: type[MambaStatePages]) -> type[PagedReferenceEngine]:
    return type(f"Broken{pages.__name__}", (PagedReferenceEngine,),
                {"mamba_pages_class": pages, "name": f"broken-mamba-runner-{pages.__name__}"})


BROKEN = [(OnePageLate, "KV-MAMBA-014", TWO_CHUNKS_THEN_A_HIT),
          (StartsFromScratch, "KV-MAMBA-015", TWO_CHUNKS_THEN_A_HIT),
          (NoCheckpoint, "KV-MAMBA-015", ONE_CHUNK_WITH_A_CHECKPOINT)]


def test_states_are_written_where_the_keys_say_and_a_hit_reads_them() -> None:
    engine = PagedReferenceEngine()
    for steps in (TWO_CHUNKS_THEN_A_HIT, ONE_CHUNK_WITH_A_CHECKPOINT):
        replay("hybrid-lifecycle", PagedReferenceEngine, steps)
    engine.configure(MAMBA_WITH_CHECKPOINT.config())
    engine.add_request("r0", ONE_CHUNK_WITH_A_CHECKPOINT[1].prompt)
    assert engine.lookup("r0").num_tokens == 0
    assert engine.allocate("r0", 10, 0) is not None
    engine.advance("r0", 10)
    values = engine.tracked["r0"].values
    table = engine.observe().block_tables["r0"][0]
    assert engine.store is not None
    pages = {index: int(engine.store.values[0][block, 0]) for index, block in enumerate(table) if block}
    assert pages == {3: values[7], 4: values[9]}  # the checkpoint (state after 8) and the running page
    checks = engine.observe().data_checks or ()
    assert not [c for c in checks if not c[1]]
    assert {"KV-MAMBA-014", "KV-MAMBA-015"} <= {rule for rule, ok, _ in checks if ok}


def test_a_hit_is_judged_on_the_state_it_offers() -> None:
    engine = PagedReferenceEngine()
    engine.configure(MAMBA_ALONE.config())
    engine.add_request("r0", PROMPT)
    engine.allocate("r0", 4, 0)
    engine.advance("r0", 4)
    engine.free("r0")
    engine.new_step()
    engine.add_request("r1", (*PROMPT[:4], 2, 2))
    assert engine.lookup("r1").num_tokens == 4
    assert ("KV-MAMBA-015", True, "") in engine.tracked["r1"].lookup_check
    assert engine.store is not None
    engine.store.values[0][:] = data_spec.UNWRITTEN  # the state pages lose their states
    engine.lookup("r1")
    failed = [c for c in engine.tracked["r1"].lookup_check if not c[1]]
    assert failed and failed[0][0] == "KV-MAMBA-015" and "never written" in failed[0][2]


@pytest.mark.parametrize(("pages", "rule_id", "steps"), BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_broken_runners_are_convicted_on_a_fixed_case(pages: type[MambaStatePages], rule_id: str,
                                                      steps: list[object]) -> None:
    with pytest.raises(RuleViolation) as caught:
        replay("hybrid-lifecycle", _engine(pages), steps)
    assert caught.value.rule_id == rule_id, caught.value


@pytest.mark.slow
@pytest.mark.parametrize(("pages", "rule_id"), [(p, r) for p, r, _ in BROKEN], ids=[b[0].__name__ for b in BROKEN])
def test_broken_runners_are_found_by_the_suite(pages: type[MambaStatePages], rule_id: str, tmp_path: Path) -> None:
    result = run_suite(_engine(pages), RunOptions(max_examples=150, max_rounds=1, replay_dir=tmp_path),
                       suite="hybrid-lifecycle")
    failed = {r for r, o in result.verdicts.outcomes.items() if o.outcome in ("fail", "error")}
    assert failed == {rule_id}, failed
    assert list(tmp_path.glob("*.py")), "no replay file was written"
