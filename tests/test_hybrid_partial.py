"""Meta-tests of the hybrid lookup suite's partial-hit judging (KV-MAMBA-019, KV-MAMBA-020): each
broken lookup of tests/broken_hybrid_partial_engines.py gets one fine-grained partial-hit behaviour
wrong, and the suite must charge it to the rule it breaks -- on a fixed case, and by finding it in a
run of its own.

The fixed cases share one model: full attention and a Mamba group of 4 hash blocks (h = 1), a
13-token prompt, every full-attention block cached and the Mamba pages of 4 and 8 tokens, so the
positional keys alone give a hit of 8.
"""

from __future__ import annotations

import broken_hybrid_partial_engines as broken
import pytest
from searches import rules_found, search

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, ReferenceHybridLookup, Seed, SeedTail

T = True
PROMPT = (0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0)
SEEDED = [HybridSetup(groups=(("full", 1, 0), ("mamba", 4, 0)), hash_block_size=1, num_blocks=40, use_eagle=False,
                      prompts=(PROMPT,)),
          Seed(0, 0, (T,) * 12), Seed(0, 1, (T, T))]
#: A bound inside a Mamba block: the full-attention group's own hit is 11 there (aligned to the hash
#: block), 8 with partial hits off; the hybrid hit is 8 either way.
BOUNDED = [*SEEDED, LookUp(0, 11)]
#: A partial entry at 10 tokens: the hit is 10, two null pages and the entry's page.
TAIL = [*SEEDED, SeedTail(0, 1, 10), LookUp(0)]

CASES = {
    "PartialHitsOff": BOUNDED,
    "IgnoresKeysInsideBlock": TAIL,
    "NullPerHashUnit": TAIL,
}


def test_the_cases_exercise_the_partial_rules_on_the_reference() -> None:
    for steps in (BOUNDED, TAIL):
        verdicts = replay("hybrid", ReferenceHybridLookup, steps)
        for rule_id in ("KV-MAMBA-019", "KV-MAMBA-020"):
            outcome = verdicts.outcomes[rule_id]
            assert outcome.checks > 0 and not outcome.failed_checks, (rule_id, steps[-1])


def test_the_tail_case_hits_inside_the_block() -> None:
    adapter = ReferenceHybridLookup()
    adapter.configure(TAIL[0].config())
    for step in TAIL[1:-1]:
        if isinstance(step, Seed):
            adapter.seed_cache(PROMPT, step.group, step.mask)
        else:
            adapter.seed_partial_entry(PROMPT, step.group, step.num_tokens)
    hit = adapter.lookup(PROMPT)
    assert hit.num_tokens == 10
    assert hit.block_ids[1][:2] == (0, 0) and len(hit.block_ids[1]) == 3 and hit.block_ids[1][2] != 0
    per_group = adapter.lookup_per_group(PROMPT, 11)
    assert per_group.num_tokens == (11, 10)


@pytest.mark.parametrize("name", sorted(broken.EXPECTED))
def test_broken_lookup_is_convicted_on_its_case(name: str) -> None:
    with pytest.raises(RuleViolation) as failure:
        replay("hybrid", getattr(broken, name), CASES[name])
    assert failure.value.rule_id == broken.EXPECTED[name], failure.value.message


@pytest.mark.parametrize("name", sorted(broken.EXPECTED))
def test_broken_lookup_is_found_by_the_suite(name: str, tmp_path) -> None:
    failed = rules_found(search(getattr(broken, name), "hybrid", tmp_path))
    assert broken.EXPECTED[name] in failed, failed
