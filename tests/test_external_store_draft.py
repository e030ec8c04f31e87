"""The external-store suite's draft-group layouts: a KV-cache group after the target's groups,
sharing one target group's spec and carrying the EAGLE mark, in a model of several spec groups.

Only there does it show which member of a spec group a store coordinator reads the mark
from (the mutant ``store.split.loses-later-eagle-mark`` reads the first member's alone). The
vLLM checks are skipped without vLLM 0.33.x (``scripts/install_vllm.sh``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, find, settings
from store_mutant_replays import needs_vllm_033, passes_then_convicts

from kvoracle.conformance.external_store import LookUp, Store, StoreSetup, store_setups


def _later_member_marked(setup: StoreSetup) -> bool:
    """Some spec group's mark is on a member other than its first."""
    first: dict[tuple, bool] = {}
    for group, mark in zip(setup.groups, setup.eagle_groups):
        first.setdefault(group, mark)
        if mark and not first[group]:
            return True
    return False


def _draft_layout(setup: StoreSetup) -> bool:
    """The last group is a copy of an earlier one and carries the EAGLE mark."""
    return setup.eagle_groups[-1] and setup.groups[-1] in setup.groups[:-1]


def test_generation_reaches_a_later_marked_member_with_eagle_and_several_spec_groups():
    # find raises NoSuchExample where 2,000 draws never give the draft layout with its mark on a
    # later member. (Asked for the layout itself: a shrunk example of any later marked member may be
    # another layout, depending on what the generator draws first.)
    found = find(store_setups(),
                 lambda s: s.use_eagle and not s.partial and len(set(s.groups)) > 1 and _draft_layout(s)
                 and _later_member_marked(s),
                 settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)))
    first = found.groups.index(found.groups[-1])
    assert not found.eagle_groups[first]  # the copied spec group's first member is unmarked


#: Full attention, an EAGLE-less window of 1 and a draft group sharing the full-attention spec:
#: the local coordinator drops the EAGLE block in the full-attention spec group only, so the
#: window of 1 stores nothing (KV-EXT-011); given the drop, it would store every block.
DRAFT = StoreSetup((("full", 4, 0), ("sliding_window", 4, 1), ("full", 4, 0)), 4, True, (False, False, True),
                   (tuple(range(4)) * 5,))
STEPS = [DRAFT, Store(0, 16), LookUp(0, None)]


@needs_vllm_033
def test_vllm_passes_a_draft_layout_and_its_first_member_mutant_is_convicted():
    caught = passes_then_convicts("store.split.loses-later-eagle-mark", STEPS)
    assert caught.rule_id == "KV-EXT-005"
    assert "want ['xxxx', '....', 'xxxx']" in caught.message
