"""Deliberately broken hybrid lookups for the two lookup rules that left the gap list.

KV-HYB-008 (the uncached common prefix tokens) and KV-HYB-011 (per-group lookups) are
judged by the hybrid suite through optional adapter operations. Each engine here is the
reference adapter over a coordinator with one broken piece, and without the reference's
own postconditions on the broken operation, so that the suite's checks, not the
reference's contracts, must catch it (as tests/broken_hybrid_engines.py does). The
meta-tests (tests/test_lookup_gap_rules.py) require the suite to charge each with its rule.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import partial

from broken_loop import broken_fixed_point

from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.hybrid import HybridCoordinator
from kvoracle.spec import hybrid as spec


# -- KV-HYB-008: the longest candidate taken at the end of each pass ---------------------------
class _LongestAtPassEnd(HybridCoordinator):
    """The loop of the spec, except that it records the longest candidate once per pass, after
    every spec group has answered, instead of after each group's lookup. A group that answers
    a long candidate which a later group of the same pass shrinks is then never counted, and the
    uncached common prefix tokens come out too small. The hit is unchanged."""

    find_longest_cache_hit = inspect.unwrap(HybridCoordinator.find_longest_cache_hit)

    fixed_point = staticmethod(partial(broken_fixed_point, longest_per_pass=True))


class UncachedLongestAtPassEnd(ReferenceHybridLookup):
    name = "broken-uncached-longest-at-pass-end"
    coordinator_class = _LongestAtPassEnd


# -- KV-HYB-011: the per-group lookup without the EAGLE margin ---------------------------------
class _PerGroupNoMargin(HybridCoordinator):
    """Per-group lookups with the EAGLE drop but without its margin: each EAGLE group is looked
    up at max_cache_hit_length and drops its last block there, so where the block past the
    bound is cached its hit is one block short of the spec's."""

    def find_longest_cache_hit_per_group(self, block_hashes: Sequence[bytes], max_cache_hit_length: int
                                         ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        flat, cached, _ = self._lookup_inputs(block_hashes)
        alignment = self.config.scheduler_block_size
        entries, lengths = [], [0] * len(self.config.kv_cache_specs)
        for group, (kind, size, param, eagle), flags in zip(self.spec_groups, flat, cached):
            hit = spec.group_hit_length(kind, flags, max_cache_hit_length, size, param, eagle, alignment)
            entries.append((hit // size, max_cache_hit_length, eagle))
            for group_id in group.group_ids:
                lengths[group_id] = hit
        return self._hit_blocks(block_hashes, flat, entries), tuple(lengths)


class PerGroupWithoutEagleMargin(ReferenceHybridLookup):
    name = "broken-per-group-without-eagle-margin"
    coordinator_class = _PerGroupNoMargin


#: Broken engine -> the rule the hybrid suite must charge it with.
EXPECTED = {
    "UncachedLongestAtPassEnd": "KV-HYB-008",
    "PerGroupWithoutEagleMargin": "KV-HYB-011",
}
