"""The hybrid coordinator's cache-hit lookup (spec chapter ``hybrid``).

A hybrid model's KV-cache groups share one block pool. This module builds the
spec groups (KV-HYB-002), reads which of a request's blocks each spec group
has cached, lets the spec's fixed point (:func:`kvoracle.spec.hybrid.fixed_point`)
decide the hit, and hands back each group's hit blocks: cached blocks where the
attention type reads them, the null block elsewhere (KV-HYB-013).

``seed_cache`` is the one way in which a lookup check fills the pool: it caches
chosen blocks of a prompt in one group and releases them, as a finished
request would have, so that they sit in the free queue as eviction candidates.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import icontract

from kvoracle.spec import hybrid as spec
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec.config import ConfigError
from kvoracle.spec.hashing import block_size_view_index
from kvoracle.spec.lifecycle import cdiv

from .block import KVCacheBlock
from .block_pool import BlockPool
from .contracts import ENABLED
from .kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)


def _lookup_kind(kv_spec: KVCacheSpec) -> str | None:
    """The spec's kind as the hybrid lookup knows it; None for groups it skips."""
    if isinstance(kv_spec, CrossAttentionSpec):
        return None  # KV-CROSS-002: never prefix-cached
    if isinstance(kv_spec, SinkFullAttentionSpec):
        return spec.FULL
    return kv_spec.kind if kv_spec.kind in spec.LOOKUP_KINDS else None


def _window_or_chunk(kv_spec: KVCacheSpec) -> int:
    if isinstance(kv_spec, SlidingWindowSpec):
        return kv_spec.sliding_window
    if isinstance(kv_spec, ChunkedLocalAttentionSpec):
        return kv_spec.attention_chunk_size
    return 0


@attrs.frozen
class HybridConfig:
    """Several KV-cache groups over one pool of ``num_blocks`` blocks.

    Construction validates the configuration and raises :class:`ConfigError` naming the
    rule and the parameter: KV-HYB-001 (block sizes), KV-CHUNK-003 (chunked local
    attention), KV-MAMBA-003 (Mamba block size).
    """

    kv_cache_specs: tuple[KVCacheSpec, ...]
    num_blocks: int
    max_model_len: int
    hash_block_size: int
    use_eagle: bool = False
    enable_caching: bool = True

    def __attrs_post_init__(self) -> None:
        if not self.kv_cache_specs:
            raise ConfigError("KV-HYB-001", "kv_cache_specs", "a hybrid model needs at least one group")
        if self.num_blocks < 2:
            raise ConfigError("KV-CFG-001", "num_blocks", f"need the null block and one more, got {self.num_blocks}")
        if self.max_model_len <= 0:
            raise ConfigError("KV-CFG-003", "max_model_len", f"must be positive, got {self.max_model_len}")
        if self.hash_block_size <= 0:
            raise ConfigError("KV-HYB-001", "hash_block_size", f"must be positive, got {self.hash_block_size}")
        alignment = self.scheduler_block_size
        for index, kv_spec in enumerate(self.kv_cache_specs):
            if isinstance(kv_spec, CrossAttentionSpec) and self.enable_caching:
                raise ConfigError("KV-HLC-007", f"kv_cache_specs[{index}]",
                                  "a cross-attention group needs enable_caching=False")
            if _lookup_kind(kv_spec) is not None and kv_spec.block_size % self.hash_block_size:
                raise ConfigError(
                    "KV-HYB-001", f"kv_cache_specs[{index}].block_size",
                    f"block size {kv_spec.block_size} is not a multiple of hash_block_size {self.hash_block_size}")
            if isinstance(kv_spec, ChunkedLocalAttentionSpec):
                if self.use_eagle:
                    raise ConfigError("KV-CHUNK-003", "use_eagle",
                                      "chunked local attention cannot be combined with EAGLE")
                if kv_spec.block_size != alignment:
                    raise ConfigError(
                        "KV-CHUNK-003", f"kv_cache_specs[{index}].block_size",
                        f"chunked local block size {kv_spec.block_size} must equal the scheduler block size "
                        f"{alignment}")
        self._check_partial_hits()

    def _check_partial_hits(self) -> None:
        """KV-MAMBA-003/KV-MAMBA-019: a Mamba block coarser than the hash block is accepted where it
        turns vLLM's partial hits on and every other group keeps the hash block (a coarser
        full-attention group would get sub-block hits and copies of its own, which kvoracle does
        not specify); anything else is rejected, naming the parameter."""
        if not self.enable_caching:
            return
        coarse = [i for i, s in enumerate(self.kv_cache_specs)
                  if isinstance(s, MambaSpec) and s.block_size != self.hash_block_size]
        if not coarse:
            return
        if not self.partial_hits:
            raise ConfigError(
                "KV-MAMBA-003", f"kv_cache_specs[{coarse[0]}].block_size",
                f"Mamba block size {self.kv_cache_specs[coarse[0]].block_size} is larger than hash_block_size "
                f"{self.hash_block_size}, but this model does not turn vLLM's partial hits on (KV-MAMBA-019: "
                "they need several groups, each full attention, Mamba or of the hash block size); such "
                "sub-block Mamba states are not specified")
        for index, kv_spec in enumerate(self.kv_cache_specs):
            if not isinstance(kv_spec, MambaSpec) and _lookup_kind(kv_spec) is not None \
                    and kv_spec.block_size != self.hash_block_size:
                raise ConfigError(
                    "KV-MAMBA-003", f"kv_cache_specs[{index}].block_size",
                    f"with partial hits on (a Mamba block of {self.kv_cache_specs[coarse[0]].block_size}), "
                    f"a {_lookup_kind(kv_spec)} group's block must be hash_block_size {self.hash_block_size}, "
                    f"not {kv_spec.block_size}: its own sub-block hits and copies are not specified")

    # The derived properties below are worked out once per configuration (attrs keeps a
    # cached_property of a slotted class in a slot of its own, outside the fields): the lookup
    # suite reads them for every group and block it judges, and working them out anew was about
    # a tenth of its run against vLLM.
    @functools.cached_property
    def partial_hits(self) -> bool:
        """KV-MAMBA-019: vLLM's fine-grained partial hits are on (an align-mode Mamba block
        coarser than the hash block, every other cacheable group able to follow)."""
        looked_up = [s for s in self.kv_cache_specs if _lookup_kind(s) is not None]
        if not self.enable_caching or not looked_up:
            return False
        return mamba_spec.partial_hits_enabled(tuple(_lookup_kind(s) for s in looked_up),  # type: ignore[misc]
                                               tuple(s.block_size for s in looked_up), self.hash_block_size)

    @functools.cached_property
    def hit_alignment(self) -> int:
        """KV-HYB-004/KV-MAMBA-019: what a hit of several groups aligns to: the scheduler block
        size, or the hash block with partial hits on."""
        if not self.partial_hits:
            return self.scheduler_block_size
        looked_up = [s for s in self.kv_cache_specs if _lookup_kind(s) is not None]
        return mamba_spec.hit_alignment(tuple(_lookup_kind(s) for s in looked_up),  # type: ignore[misc]
                                        tuple(s.block_size for s in looked_up), self.hash_block_size,
                                        self.scheduler_block_size)

    @functools.cached_property
    def scheduler_block_size(self) -> int:
        """KV-HYB-001: the LCM of the groups' block sizes, the hit alignment."""
        return spec.scheduler_block_size(tuple(s.block_size for s in self.kv_cache_specs))

    @property
    def shares_specs(self) -> bool:
        """KV-HYB-002: some groups that are looked up have equal specs, and form one spec group."""
        looked_up = [s for s in self.kv_cache_specs if _lookup_kind(s) is not None]
        return len(set(looked_up)) < len(looked_up)


@attrs.frozen
class SpecGroup:
    """Groups with one spec, looked up together (KV-HYB-002)."""

    kv_cache_spec: KVCacheSpec
    group_ids: tuple[int, ...]
    kind: str

    def flat(self, use_eagle: bool, unit: int = 0) -> spec.SpecGroup:
        """The spec's description of the group; ``unit`` > 0 for a Mamba group looked up at
        hash-block granularity (KV-MAMBA-020), which the loop sees as a group of that block."""
        eagle = use_eagle and self.kind != spec.CHUNKED_LOCAL
        return (self.kind, unit or self.kv_cache_spec.block_size, _window_or_chunk(self.kv_cache_spec), eagle)


def _hit_blocks_are_cached(coordinator: HybridCoordinator, block_hashes: Sequence[bytes],
                           result: tuple[tuple[list[KVCacheBlock], ...], int, int]) -> bool:
    """Every non-null hit entry is the block a lookup of its key returns (KV-FULL-002; a
    fine-grained Mamba group's page, the first block under one of the request's hash units,
    KV-MAMBA-020)."""
    for group_id, blocks in enumerate(result[0]):
        size = coordinator.config.kv_cache_specs[group_id].block_size
        for j, block in enumerate(blocks):
            if block.is_null:
                continue
            if coordinator.fine_grained(group_id):
                if not any(coordinator.pool._cached_block((unit, group_id)) is block for unit in block_hashes):
                    return False
                continue
            key = (coordinator.view_hash(block_hashes, size, j), group_id)
            if coordinator.pool._cached_block(key) is not block:
                return False
    return True


def _fine_hits_are_partial_hits(coordinator: HybridCoordinator, block_hashes: Sequence[bytes], bound: int,
                                result: tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]) -> bool:
    """KV-MAMBA-020: a fine-grained Mamba group looked up alone (no EAGLE margin, KV-MAMBA-002) hits
    the last cached hash boundary within the bound, in cdiv(L, B) entries whose last, the shared
    entry of a partial hit, is the only page."""
    for group in coordinator.spec_groups:
        if not coordinator._fine(group):
            continue
        size = group.kv_cache_spec.block_size
        hit = mamba_spec.partial_hit_length(coordinator._cached_flags(block_hashes, group), bound, size,
                                            coordinator.config.hash_block_size)
        for group_id in group.group_ids:
            blocks = result[0][group_id]
            if result[1][group_id] != hit or len(blocks) != cdiv(hit, size) \
                    or any(not block.is_null for block in blocks[:-1]):
                return False
            if hit and (blocks[-1].is_null or mamba_spec.shared_entry(hit, size) not in (-1, len(blocks) - 1)):
                return False
    return True


def _full_groups_trimmed(coordinator: HybridCoordinator,
                         result: tuple[tuple[list[KVCacheBlock], ...], int, int]) -> bool:
    """KV-HYB-006 / KV-HYB-013: every full-attention group holds exactly the final hit."""
    return all(
        len(result[0][g]) == cdiv(result[1], coordinator.config.kv_cache_specs[g].block_size)
        and not any(b.is_null for b in result[0][g])
        for group in coordinator.spec_groups if group.kind == spec.FULL for g in group.group_ids)


class HybridCoordinator:
    """Prefix-cache lookups across the groups of a hybrid model."""

    def __init__(self, config: HybridConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_blocks, enable_caching=config.enable_caching)
        groups: list[SpecGroup] = []
        for group_id, kv_spec in enumerate(config.kv_cache_specs):
            kind = _lookup_kind(kv_spec)
            if kind is None:
                continue
            for index, group in enumerate(groups):
                if group.kv_cache_spec == kv_spec:
                    groups[index] = attrs.evolve(group, group_ids=(*group.group_ids, group_id))
                    break
            else:
                groups.append(SpecGroup(kv_spec, (group_id,), kind))
        self.spec_groups = tuple(groups)

    # -- hashes ------------------------------------------------------------------------
    def view_hash(self, block_hashes: Sequence[bytes], block_size: int, index: int) -> bytes:
        """Block ``index`` of a group with ``block_size`` is keyed by this hash (KV-HASH-006)."""
        return block_hashes[block_size_view_index(index, block_size // self.config.hash_block_size)]

    def _num_view_blocks(self, block_hashes: Sequence[bytes], block_size: int) -> int:
        return len(block_hashes) * self.config.hash_block_size // block_size

    def _fine(self, group: SpecGroup) -> bool:
        """KV-MAMBA-020: a Mamba group coarser than the hash block, with partial hits on, is
        looked up at every hash boundary."""
        return (self.config.partial_hits and group.kind == spec.MAMBA
                and group.kv_cache_spec.block_size > self.config.hash_block_size)

    def fine_grained(self, group_id: int) -> bool:
        return any(group_id in group.group_ids and self._fine(group) for group in self.spec_groups)

    def _cached_flags(self, block_hashes: Sequence[bytes], group: SpecGroup) -> tuple[bool, ...]:
        """Which of the request's blocks every member group has cached (KV-HYB-002); for a
        fine-grained group, which hash units (a page's positional key or a partial entry)."""
        if self._fine(group):
            return tuple(all(self.pool._cached_block((unit, g)) is not None for g in group.group_ids)
                         for unit in block_hashes)
        size = group.kv_cache_spec.block_size
        return tuple(
            all(self.pool._cached_block((self.view_hash(block_hashes, size, j), g)) is not None
                for g in group.group_ids)
            for j in range(self._num_view_blocks(block_hashes, size)))

    # -- lookup ------------------------------------------------------------------------
    @icontract.require(lambda max_cache_hit_length: max_cache_hit_length >= 0, enabled=ENABLED)
    @icontract.ensure(lambda self, max_cache_hit_length, result:
                      0 <= result[1] <= max_cache_hit_length
                      and result[1] % self.config.hit_alignment == 0,
                      "KV-HYB-004/KV-MAMBA-019: the hit is aligned and within the bound", enabled=ENABLED)
    @icontract.ensure(lambda self, result: _full_groups_trimmed(self, result),
                      "KV-HYB-006: every full-attention group is trimmed to the hit", enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, result: _hit_blocks_are_cached(self, block_hashes, result),
                      "KV-FULL-002/KV-HYB-013: non-null hit entries are the cached blocks", enabled=ENABLED)
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_cache_hit_length: int
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        """``(hit blocks per group, hit length, uncached common prefix tokens)``."""
        flat, cached, num_hashed = self._lookup_inputs(block_hashes)
        if len(self.config.kv_cache_specs) == 1 and flat:
            # KV-HYB-014: one KV-cache group is looked up by its own finder, no margin.
            kind, size, param, eagle = flat[0]
            hit = spec.unitary_hit(kind, cached[0], max_cache_hit_length, size, param, eagle)
            entries = [(hit // size, max_cache_hit_length, eagle)]
            return self._hit_blocks(block_hashes, flat, entries), hit, 0
        hit, lengths, uncached, _, last_lookup = self.fixed_point(
            flat, cached, max_cache_hit_length, num_hashed, self.config.hit_alignment)
        entries = [(self.num_hit_blocks(index, hit, lengths), bound, drop)
                   for index, (bound, drop) in enumerate(last_lookup)]
        return self._hit_blocks(block_hashes, flat, entries), hit, uncached

    @icontract.require(lambda max_cache_hit_length: max_cache_hit_length >= 0, enabled=ENABLED)
    @icontract.ensure(lambda self, result: all(
        len(blocks) == cdiv(result[1][g], self.config.kv_cache_specs[g].block_size)
        and (self.fine_grained(g) or result[1][g] % self.config.kv_cache_specs[g].block_size == 0)
        for g, blocks in enumerate(result[0])),
        "KV-HYB-011/KV-MAMBA-020: each group's hit entries cover its own hit length (a fine-grained Mamba "
        "group's last page holds a hit that ends inside it)", enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, max_cache_hit_length, result: _fine_hits_are_partial_hits(
        self, block_hashes, max_cache_hit_length, result), "KV-MAMBA-020: a fine-grained group's own hit is the "
        "last cached hash boundary within the bound", enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, result: _hit_blocks_are_cached(self, block_hashes, result),
                      "KV-FULL-002/KV-HYB-013: non-null hit entries are the cached blocks", enabled=ENABLED)
    def find_longest_cache_hit_per_group(self, block_hashes: Sequence[bytes], max_cache_hit_length: int
                                         ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """Each spec group looked up alone (KV-HYB-011): ``(hit blocks, hit length)`` per group,
        aligned as the hybrid lookup is (KV-MAMBA-019: to the hash block with partial hits on)."""
        flat, cached, num_hashed = self._lookup_inputs(block_hashes)
        alignment = self.config.hit_alignment
        hits = spec.per_group_hits(flat, cached, max_cache_hit_length, num_hashed, alignment)
        entries = []
        for (kind, size, _, eagle), hit in zip(flat, hits):
            bound = max_cache_hit_length
            if eagle and spec.eagle_margin(kind, size):
                bound = min(max_cache_hit_length + spec.eagle_margin(kind, size), num_hashed)
            entries.append((hit // size, bound, eagle))
        lengths = [0] * len(self.config.kv_cache_specs)
        for group, hit in zip(self.spec_groups, hits):
            for group_id in group.group_ids:
                lengths[group_id] = hit
        return self._hit_blocks(block_hashes, flat, entries), tuple(lengths)

    def _lookup_inputs(self, block_hashes: Sequence[bytes]
                       ) -> tuple[tuple[spec.SpecGroup, ...], tuple[tuple[bool, ...], ...], int]:
        """The spec groups, their cached flags and the hashed tokens: the spec's inputs. A
        fine-grained Mamba group is one of block h, flagged per hash unit (KV-MAMBA-020:
        :func:`~kvoracle.spec.mamba.partial_hit_length` is KV-MAMBA-001's finder over units)."""
        unit = self.config.hash_block_size
        flat = tuple(group.flat(self.config.use_eagle, unit if self._fine(group) else 0)
                     for group in self.spec_groups)
        cached = tuple(self._cached_flags(block_hashes, group) for group in self.spec_groups)
        return flat, cached, len(block_hashes) * self.config.hash_block_size

    def _hit_blocks(self, block_hashes: Sequence[bytes], flat: tuple[spec.SpecGroup, ...],
                    entries: Sequence[tuple[int, int, bool]]) -> tuple[list[KVCacheBlock], ...]:
        """Per group, ``num_blocks`` entries: nulls where the kind puts them (KV-HYB-013),
        then the cached blocks. ``entries[i]`` is (num_blocks, last bound, drop) of spec
        group ``i``."""
        blocks: list[list[KVCacheBlock]] = [[] for _ in self.config.kv_cache_specs]
        for group, (kind, size, param, _), (num_blocks, bound, drop) in zip(self.spec_groups, flat, entries):
            if self._fine(group):  # KV-MAMBA-020: nulls, then the page cached under the hit's unit
                hit, page_size = num_blocks * size, group.kv_cache_spec.block_size
                pages = cdiv(hit, page_size)
                nulls = spec.num_null_hit_blocks(kind, pages, bound, drop, page_size, param)
                for group_id in group.group_ids:
                    blocks[group_id] = [self.pool.null_block] * nulls + (
                        [self.pool._cached_block((block_hashes[hit // size - 1], group_id))] if hit else [])
                continue
            nulls = spec.num_null_hit_blocks(kind, num_blocks, bound, drop, size, param)
            for group_id in group.group_ids:
                blocks[group_id] = [self.pool.null_block] * nulls + [
                    self.pool._cached_block((self.view_hash(block_hashes, size, j), group_id))
                    for j in range(nulls, num_blocks)]
        return tuple(blocks)

    #: The loop that decides the hit: the spec's, step for step (KV-HYB-003 .. KV-HYB-009).
    fixed_point = staticmethod(spec.fixed_point)

    def num_hit_blocks(self, index: int, hit: int, lengths: tuple[int, ...]) -> int:
        """Entries of spec group ``index``'s hit: a full-attention group is trimmed to the
        final hit (KV-HYB-006), any other keeps what its last lookup answered."""
        kind, size = self.spec_groups[index].kind, self.spec_groups[index].kv_cache_spec.block_size
        if self._fine(self.spec_groups[index]):
            return lengths[index] // self.config.hash_block_size  # hash units (KV-MAMBA-020)
        return cdiv(hit, size) if kind == spec.FULL else lengths[index] // size

    # -- filling the cache -------------------------------------------------------------
    @icontract.require(lambda self, group_id: self.fine_grained(group_id),
                       "KV-MAMBA-020: partial entries exist only in a fine-grained Mamba group", enabled=ENABLED)
    @icontract.require(lambda self, block_hashes, num_tokens: 0 < num_tokens <= len(block_hashes)
                       * self.config.hash_block_size and num_tokens % self.config.hash_block_size == 0,
                       "a hash boundary of the prompt", enabled=ENABLED)
    @icontract.require(lambda self, group_id, num_tokens: mamba_spec.shared_entry(
        num_tokens, self.config.kv_cache_specs[group_id].block_size) >= 0,
        "KV-MAMBA-021: a partial entry ends inside a Mamba block", enabled=ENABLED)
    def seed_partial_entry(self, block_hashes: Sequence[bytes], group_id: int, num_tokens: int) -> int:
        """Leave a partial entry in ``group_id``: a page keyed at the prefix of ``num_tokens``
        tokens, which ends inside a Mamba block, then released (KV-MAMBA-021's tail of a producer
        that finished, or KV-MAMBA-024's copy once the copy has run, KV-MAMBA-025). Returns the
        page's block id."""
        page = self.pool.get_new_blocks(1)[0]
        self.pool.cache_block(page, (block_hashes[num_tokens // self.config.hash_block_size - 1], group_id))
        self.pool.free_blocks([page])
        return page.block_id

    def seed_cache(self, block_hashes: Sequence[bytes], group_id: int, mask: Sequence[bool]) -> list[int]:
        """Cache block ``j`` of the prompt in ``group_id`` for each ``mask[j]``, then release them.

        Allocates one block per position up to the last masked one (the positions
        not cached are freed uncached, as a request's unreachable blocks would be),
        caches the masked ones under their keys and frees the table tail first
        (KV-POOL-007). Returns the block ids cached, in position order.
        """
        size = self.config.kv_cache_specs[group_id].block_size
        if len(mask) > self._num_view_blocks(block_hashes, size):
            raise ValueError(f"mask covers {len(mask)} blocks but the prompt hashes only "
                             f"{self._num_view_blocks(block_hashes, size)} of group {group_id}")
        length = max((j + 1 for j, keep in enumerate(mask) if keep), default=0)
        if length == 0:
            return []
        table = self.pool.get_new_blocks(length)
        pairs = [(table[j], (self.view_hash(block_hashes, size, j), group_id))
                 for j in range(length) if mask[j]]
        self.pool.cache_blocks(pairs)
        self.pool.free_blocks(list(reversed(table)))
        return [block.block_id for block, _ in pairs]
