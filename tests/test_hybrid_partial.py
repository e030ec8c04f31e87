"""Meta-tests of the hybrid lookup suite's partial-hit judging (KV-MAMBA-019, KV-MAMBA-020): each
broken lookup of tests/broken_hybrid_partial_engines.py gets one fine-grained partial-hit behaviour
wrong, and the suite must charge it to the rule it breaks -- on a fixed case, and by finding it in a
run of its own.

The fixed cases share one model: full attention and a Mamba group of 4 hash blocks (h = 1), a
13-token prompt, every full-attention block cached and the Mamba pages of 4 and 8 tokens, so the
positional keys alone give a hit of 8.

As everywhere in the suite, a wrong answer is charged to a named rule only where it has that rule's
signature alone. A lookup that reads only the Mamba pages' positional keys (KV-MAMBA-020) and one
with partial hits off (KV-MAMBA-019) often give the same hybrid hit -- both end it on a Mamba block
-- and such an answer is charged to the general rule (KV-HYB-003) unless the lookup's uncached
count, or a per-group lookup, tells them apart.
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
#: The same at a bound of 11: still 10. Positional keys alone give 8 with the full-attention
#: group's candidate at 11 (3 uncached tokens), partial hits off 8 with it at 8 (none).
TAIL_BOUNDED = [*SEEDED, SeedTail(0, 1, 10), LookUp(0, 11)]
#: Full attention cached for 9 tokens only: the hybrid hit is 8 whatever the Mamba keys, but the Mamba
#: group's own hit is the partial entry's 10 (the full-attention group's own: 9, or 8 with partial
#: hits off).
BEYOND_THE_HIT = [SEEDED[0], Seed(0, 0, (T,) * 9), SEEDED[2], SeedTail(0, 1, 10), LookUp(0)]

CASES = {
    "PartialHitsOff": BOUNDED,
    "IgnoresKeysInsideBlock": TAIL_BOUNDED,
    "NullPerHashUnit": TAIL,
}
#: Seeds other than 0, with why: the one-round search does not convict every broken lookup on every
#: seed (a failure partial hits left off gives too is KV-HYB-011, charged to neither rule). Since every
#: seeded prompt is looked up after an example's last step, measured: the null per hash unit is
#: convicted on seeds 0-3 (all tried), the lookup with partial hits off on 1-3 (KV-HYB-011 on 0), and
#: the lookup ignoring the keys inside a block fails on 12 seeds of 0-12 (none on 9), charged
#: KV-MAMBA-020 on 3, 6, 7, 10 and 12 (KV-HYB-011 on 0-2, 4, 5; KV-HYB-003 on 8; KV-HYB-007 on 11).
#: Since the suite has two parts (EAGLE on and off): charged KV-MAMBA-020 on 1, 5, 6 and 7 of 0-7
#: (KV-HYB-007 on 0, 3 and 4; KV-HYB-011 on 2).
SEARCH_SEEDS = {"IgnoresKeysInsideBlock": 1, "PartialHitsOff": 1}


def test_the_cases_exercise_the_partial_rules_on_the_reference() -> None:
    for steps in (BOUNDED, TAIL, TAIL_BOUNDED, BEYOND_THE_HIT):
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


def test_a_lookup_ignoring_the_keys_inside_a_block_is_convicted_by_its_own_lookup_per_group() -> None:
    """The hybrid hit and the uncached count are right; the Mamba group's own hit is 8, not 10."""
    with pytest.raises(RuleViolation) as failure:
        replay("hybrid", broken.IgnoresKeysInsideBlock, BEYOND_THE_HIT)
    assert failure.value.rule_id == "KV-MAMBA-020", failure.value.message
    assert "per-group lookup" in failure.value.message


@pytest.mark.parametrize("name", ["IgnoresKeysInsideBlock", "PartialHitsOff"])
def test_an_answer_both_partial_signatures_give_is_the_general_rules(name: str) -> None:
    """On TAIL both broken lookups answer 8 with 4 uncached tokens (the full-attention group's
    candidate, 12, is a Mamba block's end): either bug explains it, so neither rule is charged."""
    with pytest.raises(RuleViolation) as failure:
        replay("hybrid", getattr(broken, name), TAIL)
    assert failure.value.rule_id == "KV-HYB-003", failure.value.message
    assert "could be KV-MAMBA-020 or KV-MAMBA-019" in failure.value.message


@pytest.mark.parametrize("name", sorted(broken.EXPECTED))
def test_broken_lookup_is_found_by_the_suite(name: str, tmp_path) -> None:
    failed = rules_found(search(getattr(broken, name), "hybrid", tmp_path, seed=SEARCH_SEEDS.get(name, 0)))
    assert broken.EXPECTED[name] in failed, failed
