"""The external-store suite against the store coordinator's two EAGLE re-check mutants.

``store.hit.mamba-eagle-margin`` looks a Mamba group up with the attention groups' EAGLE
look-ahead; it shows only with EAGLE on and every group at the Mamba block (a Mamba state one
block past the verified hit is then an aligned boundary), with Mamba states in the store.
``store.hit.keeps-eagle-verified`` does not look an EAGLE sliding window up again with its drop
after a later group shrank the hit; it shows where the window lacks the block at the shrunk
hit (its peek block) but holds the blocks after it. Both replays below are short step sequences
the unmutated vLLM 0.33.0 store passes and the mutants fail. The vLLM checks are skipped
without vLLM 0.33.x (``scripts/install_vllm.sh``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, settings
from store_mutant_replays import needs_vllm_033, passes_then_convicts

from kvoracle.conformance.external_store import LookUp, Put, StoreSetup, store_setups


def test_generation_reaches_eagle_with_every_group_at_the_mamba_block():
    found = find(store_setups(),
                 lambda s: s.use_eagle and len(set(s.groups)) > 1 and any(k == "mamba" for k, _, _ in s.groups)
                 and all(size == s.hash_block_size for _, size, _ in s.groups),
                 settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)))
    assert found.scheduler_block_size == found.hash_block_size


def _marked_window_before_a_wider_unmarked_one(setup: StoreSetup) -> bool:
    windows = [(g, param) for g, (kind, _, param) in enumerate(setup.groups) if kind == "sliding_window"]
    return any(setup.eagle_groups[g] and not setup.eagle_groups[h] and wide > narrow
               for g, narrow in windows for h, wide in windows if h > g)


def test_generation_reaches_a_marked_window_before_a_wider_unmarked_one():
    # The re-verified window layout of store_setups: the wider window, without the drop, shrinks the
    # hit after the marked window accepted it, so the marked one is looked up again with its drop.
    # The check is find's: it raises NoSuchExample where 2,000 draws never give the layout.
    find(store_setups(),
         lambda s: s.use_eagle and all(size == s.hash_block_size for _, size, _ in s.groups)
         and _marked_window_before_a_wider_unmarked_one(s),
         settings=settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck)))


#: Full attention and Mamba at one token a block, EAGLE on and no group marked (every group
#: gets the drop): full attention verifies 3 of the 4 stored tokens; a Mamba lookup widened by
#: the look-ahead takes the state at 4, past the hit.
MAMBA = StoreSetup((("full", 1, 0), ("mamba", 1, 0)), 1, True, (False, False), (tuple(range(4)),))
MAMBA_STEPS = [MAMBA, Put(0, 0, (0, 1, 2, 3)), Put(0, 1, (0, 1, 2, 3)), LookUp(0, None)]

#: An EAGLE window of 1 and a window of 2, both missing the block at 4 of 6 tokens (bound 5):
#: the window of 1 verifies 5 with its peek block, the window of 2 shrinks the hit to 4, and the
#: window of 1 looked up again with its drop finds no peek block at 4 (the hit is 3); without
#: the drop it keeps 4.
WINDOWS = StoreSetup((("sliding_window", 1, 1), ("sliding_window", 1, 2)), 1, True, (True, False),
                     (tuple(range(6)),))
WINDOWS_STEPS = [WINDOWS, Put(0, 0, (0, 1, 2, 3, 5)), Put(0, 1, (0, 1, 2, 3, 5)), LookUp(0, None)]


@needs_vllm_033
@pytest.mark.parametrize(("key", "steps", "rule", "says"), [
    ("store.hit.mamba-eagle-margin", MAMBA_STEPS, "KV-EXT-003", "masks of lengths [3, 4]"),
    ("store.hit.keeps-eagle-verified", WINDOWS_STEPS, "KV-EXT-001", "hit 4; the local hybrid loop over the store's "
                                                                    "keys answers 3"),
])
def test_vllm_passes_and_the_eagle_recheck_mutant_is_convicted(key, steps, rule, says):
    caught = passes_then_convicts(key, steps)
    assert caught.rule_id == rule
    assert says in caught.message
