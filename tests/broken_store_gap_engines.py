"""Deliberately broken external-store coordinators, one per rule of the external-store chapter
that moved off the gap list (spec/registry.py): KV-EXT-009, KV-EXT-010, KV-EXT-013 and
KV-EXT-014.

Each is one of vLLM 0.33.0's named differences, built from kvoracle's reference store
adapter over a coordinator that swaps in one broken piece -- which groups get the EAGLE drop,
how a single spec group is looked up -- and drops the reference's own postconditions, so that
the suite's checks, not the reference's contracts, must catch it. KV-EXT-010 needs partial
(hash-block) hits, which the reference does not model: :class:`PartialHashHits` adds them to
the reference adapter (the longest hash boundary every group can load), and the broken engine
replaces its lookup by #50359's.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from kvoracle.conformance.external_store import ReferenceExternalStore, StoreSetup
from kvoracle.reference.external_store import ExternalStoreCoordinator, Key
from kvoracle.spec import external_store as spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec.lifecycle import cdiv

Masks = tuple[tuple[bool, ...], ...]


class _UncheckedCoordinator(ExternalStoreCoordinator):
    """The reference store coordinator without its contracts."""

    find_longest_cache_hit = inspect.unwrap(ExternalStoreCoordinator.find_longest_cache_hit)
    load_mask = inspect.unwrap(ExternalStoreCoordinator.load_mask)
    store_mask = inspect.unwrap(ExternalStoreCoordinator.store_mask)
    lookup_mask = inspect.unwrap(ExternalStoreCoordinator.lookup_mask)


class _MarkedGroupsDrop(_UncheckedCoordinator):
    """Gives every marked group the EAGLE drop, EAGLE on or off (the store's drop)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        drop = spec.store_eagle_groups(config.flags, config.use_eagle)
        self.group_eagle = tuple(any(drop[g] for g in group.group_ids) for group in self.spec_groups)


class StoreDropsMarkedGroups(ReferenceExternalStore):
    """KV-EXT-009: the drop follows the is_eagle_group marks even with EAGLE off, in the hit
    and in the store and lookup masks."""

    name = "store-drops-marked-groups"
    coordinator_class = _MarkedGroupsDrop


class _DirectSingleSpecLookup(_UncheckedCoordinator):
    """Looks a single spec group up once at the bound, without the EAGLE look-ahead."""

    def find_longest_cache_hit(self, block_hashes, max_length, cached_block_pool):
        if len(self.spec_groups) > 1:
            return super().find_longest_cache_hit(block_hashes, max_length, cached_block_pool)
        (kind, size, param, eagle), = self.flat_groups()
        cached = self.existence_flags(block_hashes, cached_block_pool)[0]
        hit = hybrid_spec.group_hit_length(kind, cached, max_length, size, param, eagle, self.alignment)
        return self.load_mask(block_hashes, hit), hit


class NoLookAheadForOneSpecGroup(ReferenceExternalStore):
    """KV-EXT-013: KV-cache groups sharing one spec are looked up without the look-ahead
    the local loop gives an EAGLE group."""

    name = "no-look-ahead-for-one-spec-group"
    coordinator_class = _DirectSingleSpecLookup


class LoadsWindowOneWithoutTheDrop(ReferenceExternalStore):
    """KV-EXT-014: the lookup's masks are right (an EAGLE window of 1 reads nothing), but
    ``load_mask(hashes, L)`` is recomputed as if no group had the EAGLE drop, so such a
    group is asked for the block before L, which its lookup never checked."""

    name = "loads-window-one-without-the-drop"

    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> Masks:
        coordinator = self.coordinator
        assert coordinator is not None
        masks = []
        for g in range(len(coordinator.config.kv_cache_specs)):
            kind, size, param, _ = coordinator.flat_groups()[coordinator._group_of(g)]
            masks.append(spec.load_mask(kind, size, param, token_len))
        return tuple(masks)


class PartialHashHits(ReferenceExternalStore):
    """The reference adapter, plus partial hash hits (not broken: the baseline of
    :class:`TrimsToShorterHashBoundary`).

    In a partial-hash configuration (full attention and Mamba, blocks above the hash block)
    the hit is the longest hash boundary within the bound and the hashed tokens at which
    every chunk the groups load exists under the key it is fetched by (KV-EXT-002): every
    chunk of a full-attention group, the last of a Mamba group.
    """

    name = "partial-hash-hits"
    supports_partial_hash_hits = True

    def configure(self, setup: StoreSetup) -> None:
        self.setup = setup
        if not setup.partial:
            super().configure(setup)

    def lookup(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]
               ) -> tuple[Masks, int]:
        if not self.setup.partial:
            return super().lookup(block_hashes, max_length, exists)
        hit = self._longest(block_hashes, self._top(block_hashes, max_length), exists)
        return self.load_mask(block_hashes, hit), hit

    def _top(self, block_hashes: Sequence[bytes], max_length: int) -> int:
        """The longest hash boundary within the bound and the hashed tokens."""
        unit = self.setup.hash_block_size
        return min(max_length, len(block_hashes) * unit) // unit * unit

    def _longest(self, block_hashes: Sequence[bytes], top: int, exists: frozenset[Key],
                 kinds: tuple[str, ...] = (hybrid_spec.FULL, hybrid_spec.MAMBA)) -> int:
        """The longest hash boundary up to ``top`` at which the groups of ``kinds`` can load."""
        unit = self.setup.hash_block_size
        return next((length for length in range(top, 0, -unit)
                     if self._loadable(block_hashes, length, exists, kinds)), 0)

    def _loadable(self, block_hashes: Sequence[bytes], hit: int, exists: frozenset[Key],
                  kinds: tuple[str, ...] = (hybrid_spec.FULL, hybrid_spec.MAMBA)) -> bool:
        """Whether the groups of ``kinds`` hold every chunk they load for ``hit``."""
        unit = self.setup.hash_block_size
        return all((g, block_hashes[spec.chunk_key_index(i, size, unit, hit)]) in exists
                   for g, ((kind, size, _), mask) in enumerate(zip(self.setup.groups,
                                                                  self.load_mask(block_hashes, hit)))
                   if kind in kinds for i, wanted in enumerate(mask) if wanted)

    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> Masks:
        if not self.setup.partial:
            return super().load_mask(block_hashes, token_len)
        masks = []
        for kind, size, _ in self.setup.groups:
            count = cdiv(token_len, size)
            masks.append(tuple(kind == hybrid_spec.FULL or i == count - 1 for i in range(count)))
        return tuple(masks)


class TrimsToShorterHashBoundary(PartialHashHits):
    """KV-EXT-010 (vLLM #50359): the full-attention groups answer the longest hash boundary
    at which they hold their own chunks; the Mamba groups then trim it to the last boundary
    at which they hold a state, and the full-attention groups are not asked again whether
    they hold the chunk under that shorter boundary's key."""

    name = "trims-to-shorter-hash-boundary"

    def lookup(self, block_hashes: Sequence[bytes], max_length: int, exists: frozenset[Key]
               ) -> tuple[Masks, int]:
        if not self.setup.partial:
            return super().lookup(block_hashes, max_length, exists)
        full = self._longest(block_hashes, self._top(block_hashes, max_length), exists, (hybrid_spec.FULL,))
        hit = self._longest(block_hashes, full, exists, (hybrid_spec.MAMBA,))
        return self.load_mask(block_hashes, hit), hit


#: Each broken engine: (the suite, the rule it must be charged with).
EXPECTED = {
    "StoreDropsMarkedGroups": ("external-store", "KV-EXT-009"),
    "TrimsToShorterHashBoundary": ("external-store", "KV-EXT-010"),
    "NoLookAheadForOneSpecGroup": ("external-store", "KV-EXT-013"),
    "LoadsWindowOneWithoutTheDrop": ("external-store", "KV-EXT-014"),
}

#: The engine that passes a broken engine's fixed state (the reference unless named here).
BASELINES = {"TrimsToShorterHashBoundary": PartialHashHits}
