"""Broken hybrid lookups of partial-hit models (KV-MAMBA-019, KV-MAMBA-020), for
tests/test_hybrid_partial.py: the reference lookup adapter over a coordinator that gets one
fine-grained partial-hit behaviour wrong, without the reference's own postconditions on its
lookups (tests/broken_hybrid_engines.py's ``_Unchecked``), so that the hybrid suite's checks, not
the reference's contracts, must catch it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from broken_hybrid_engines import _Unchecked
from broken_partial_engines import IgnoresPartialEntries

from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
from kvoracle.spec import hybrid as spec


class _UncheckedPerGroup(_Unchecked):
    """Neither lookup checks its own postconditions; nor does seeding a partial entry, which a
    coordinator that does not look keys inside a block up still takes (vLLM's pool does)."""

    find_longest_cache_hit_per_group = inspect.unwrap(HybridCoordinator.find_longest_cache_hit_per_group)
    seed_partial_entry = inspect.unwrap(HybridCoordinator.seed_partial_entry)


# -- KV-MAMBA-019: partial hits left off -----------------------------------------------------------
class _ConfigWithoutPartialHits:
    """The model's config as a coordinator with partial hits off reads it: hits aligned to the
    scheduler block size, and no group fine-grained."""

    partial_hits = False

    def __init__(self, config: HybridConfig) -> None:
        self._config = config

    def __getattr__(self, name: str) -> object:
        return getattr(self._config, name)

    @property
    def hit_alignment(self) -> int:
        return self._config.scheduler_block_size


class _PartialHitsOff(_UncheckedPerGroup):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.config = _ConfigWithoutPartialHits(config)  # type: ignore[assignment]


class PartialHitsOff(ReferenceHybridLookup):
    """KV-MAMBA-019: every lookup aligned to the scheduler block size, each Mamba group looked up
    at its own block by its pages' positional keys, as with partial hits off."""

    name = "broken-partial-hits-off"
    coordinator_class = _PartialHitsOff


# -- KV-MAMBA-020: the keys inside a block ignored -------------------------------------------------
class _IgnoresKeysInsideBlock(IgnoresPartialEntries, _UncheckedPerGroup):
    pass


class IgnoresKeysInsideBlock(ReferenceHybridLookup):
    """KV-MAMBA-020: a fine-grained Mamba group's lookup reads only its pages' positional keys (the
    manager suite's broken coordinator, tests/broken_partial_engines.py), hits still aligned to the
    hash block."""

    name = "broken-ignores-keys-inside-block"
    coordinator_class = _IgnoresKeysInsideBlock


# -- KV-MAMBA-020: a null entry per hash unit ------------------------------------------------------
class _NullPerHashUnit(_UncheckedPerGroup):
    def _hit_blocks(self, block_hashes: Sequence[bytes], flat: tuple[spec.SpecGroup, ...],
                    entries: Sequence[tuple[int, int, bool]]) -> tuple[list[KVCacheBlock], ...]:
        blocks = list(super()._hit_blocks(block_hashes, flat, entries))
        for group, (num_units, _, _) in zip(self.spec_groups, entries):
            if self._fine(group) and num_units:
                for group_id in group.group_ids:
                    blocks[group_id] = [self.pool.null_block] * (num_units - 1) + blocks[group_id][-1:]
        return tuple(blocks)


class NullPerHashUnit(ReferenceHybridLookup):
    """KV-MAMBA-020: a fine-grained Mamba group's hit of L tokens is padded with a null entry per
    hash unit before it, L / h - 1 of them, instead of one per page, cdiv(L, B) - 1 (the finder's
    unit index taken for the page index)."""

    name = "broken-null-per-hash-unit"
    coordinator_class = _NullPerHashUnit


#: Broken adapter -> the rule the hybrid suite must convict it of.
EXPECTED = {
    "PartialHitsOff": "KV-MAMBA-019",
    "IgnoresKeysInsideBlock": "KV-MAMBA-020",
    "NullPerHashUnit": "KV-MAMBA-020",
}
