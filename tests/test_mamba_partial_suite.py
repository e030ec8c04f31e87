"""Meta-tests of the manager suite's partial-hit judging (KV-MAMBA-019 .. KV-MAMBA-025): each broken
engine of tests/broken_partial_engines.py gets one partial-hit behaviour wrong, and the suite must
charge it to the rule it breaks -- on a fixed case, and by finding it in a run of its own.

The fixed cases follow one producer: B = 16, h = 4, a 22-token prompt whose last hash boundary 20
lies inside the second Mamba block. The scheduler stops its first chunk there (the partial tail),
its next step moves the tail's key to a copy, and a request sharing those 20 tokens resumes inside
the block with a private copy.
"""

from __future__ import annotations

import broken_partial_engines as broken
import pytest
from broken_groups import groups_engine
from searches import rules_found, search

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.steps import AddRequest, ConfigureGroups, NewStep, Schedule, TakeCopies

PROMPT = tuple(range(22))


def _model(num_blocks: int = 60) -> ConfigureGroups:
    return ConfigureGroups((("full", 4, 0), ("mamba", 16, 0)), 4, num_blocks, 64)


PRODUCE = [_model(), AddRequest("a", PROMPT), Schedule("a", 22)]
MOVE = [*PRODUCE, TakeCopies(), NewStep(), Schedule("a", 22), TakeCopies()]
CONSUME = [*MOVE, NewStep(), AddRequest("c", (*PROMPT[:20], 1, 1, 1)), Schedule("c", 3), TakeCopies()]
# One page short of the producer's next step with its copy: 5 + 1 blocks after the first chunk.
TIGHT = [_model(8), AddRequest("a", PROMPT), Schedule("a", 22), TakeCopies(), NewStep(), Schedule("a", 22)]

CASES = {
    "rounds what it caches": (groups_engine(broken.RoundsWhatItCaches), "KV-MAMBA-019", PRODUCE),
    "ignores partial entries": (broken.IgnoresPartialEntriesEngine, "KV-MAMBA-020", CONSUME),
    "registers no tail": (groups_engine(broken.RegistersNoTail), "KV-MAMBA-021", PRODUCE),
    "needs no copy": (groups_engine(broken.NeedsNoCopy, need_contracts=False), "KV-MAMBA-022", TIGHT),
    "writes the shared page": (groups_engine(broken.WritesTheSharedPage), "KV-MAMBA-023", CONSUME),
    "swaps its tail": (groups_engine(broken.SwapsItsTail), "KV-MAMBA-024", MOVE),
    "releases at once": (groups_engine(broken.ReleasesAtOnce, need_contracts=False), "KV-MAMBA-025", MOVE),
}


def test_the_cases_exercise_every_rule_on_the_reference() -> None:
    verdicts = replay("hybrid-lifecycle", ReferenceEngine, CONSUME)
    assert verdicts is not None
    for rule_id in ("KV-MAMBA-019", "KV-MAMBA-020", "KV-MAMBA-021", "KV-MAMBA-022", "KV-MAMBA-023",
                    "KV-MAMBA-024", "KV-MAMBA-025"):
        assert verdicts.outcomes[rule_id].checks > 0 and not verdicts.outcomes[rule_id].failed_checks, rule_id


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_engine_is_convicted_on_its_case(name: str) -> None:
    engine, rule_id, steps = CASES[name]
    replay("hybrid-lifecycle", ReferenceEngine, steps)  # the reference passes the case
    with pytest.raises(RuleViolation) as failure:
        replay("hybrid-lifecycle", engine, steps)
    assert failure.value.rule_id == rule_id, failure.value.message


#: Examples a case needs beyond 150 on seed 0: since the one-group part's crowding rule (ac4d30d)
#: moved every part's draws, a copy that is due shows within 300 examples, not 150.
EXAMPLES = {"needs no copy": 300}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_engine_is_found_by_the_suite(name: str, tmp_path) -> None:
    engine, rule_id, _ = CASES[name]
    failed = rules_found(search(engine, "hybrid-lifecycle", tmp_path, max_examples=EXAMPLES.get(name, 150)))
    assert rule_id in failed, failed
