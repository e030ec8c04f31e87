"""An external KV store's cache-hit coordinator (spec chapter ``external_store``).

:class:`ExternalCachedBlockPool` is the store as the coordinator sees it: a set
of ``(group_id, hash)`` keys that exist. :class:`ExternalStoreCoordinator`
answers, over such a pool, the hit and each group's load mask
(``find_longest_cache_hit``), the receiving side's load masks for a known hit
(``load_mask``), and which chunks a request writes (``store_mask``) or looks up
(``lookup_mask``). The hit is the local hybrid loop's
(:func:`kvoracle.spec.hybrid.fixed_point`) over the pool's existence flags
(KV-EXT-001); the masks come from the chapter's predicates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import icontract

from kvoracle.spec import external_store as spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec.config import ConfigError
from kvoracle.spec.lifecycle import cdiv

from .contracts import ENABLED
from .hybrid import HybridConfig, HybridCoordinator
from .kv_cache_spec import KVCacheSpec

#: A store key: (KV-cache group id, block hash).
Key = tuple[int, bytes]


@attrs.frozen
class ExternalCachedBlockPool:
    """The keys an external store holds; a key hits in a spec group only if every member
    group holds it (KV-HYB-002)."""

    hash_block_size: int
    exists: frozenset[Key] = attrs.field(factory=frozenset, converter=frozenset)

    def contains(self, group_id: int, block_hash: bytes) -> bool:
        return (group_id, bytes(block_hash)) in self.exists

    def has_all(self, block_hash: bytes, group_ids: Iterable[int]) -> bool:
        return all(self.contains(g, block_hash) for g in group_ids)


@attrs.frozen
class ExternalStoreConfig:
    """A hybrid model's groups as the store coordinator is given them.

    ``eagle_groups[g]`` marks group ``g`` as an EAGLE (draft) group; ``use_eagle`` is
    whether EAGLE block dropping is on. Validation is the hybrid chapter's (KV-HYB-001,
    KV-CHUNK-003, KV-MAMBA-003).
    """

    kv_cache_specs: tuple[KVCacheSpec, ...]
    hash_block_size: int
    use_eagle: bool = False
    eagle_groups: tuple[bool, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.eagle_groups and len(self.eagle_groups) != len(self.kv_cache_specs):
            raise ConfigError("KV-EXT-001", "eagle_groups",
                              f"{len(self.eagle_groups)} flags for {len(self.kv_cache_specs)} groups")
        self.hybrid_config()  # validates

    def hybrid_config(self) -> HybridConfig:
        return HybridConfig(self.kv_cache_specs, 2, 1 << 20, self.hash_block_size, self.use_eagle)

    @property
    def flags(self) -> tuple[bool, ...]:
        return self.eagle_groups or tuple(False for _ in self.kv_cache_specs)

    @property
    def scheduler_block_size(self) -> int:
        return self.hybrid_config().scheduler_block_size


def _masks_cover_hit(coordinator: ExternalStoreCoordinator, block_hashes: Sequence[bytes], max_length: int,
                     pool: ExternalCachedBlockPool, masks: tuple[list[bool], ...], hit: int) -> bool:
    """KV-EXT-003: each group's mask is the spec's load mask at the hit, with the drop of the
    group's last lookup in the local loop (KV-HYB-013)."""
    _, last = coordinator.local_loop(block_hashes, max_length, pool)
    return all(tuple(masks[g]) == coordinator.group_load_mask(g, hit, last[coordinator._group_of(g)][1])
               for g in range(len(coordinator.config.kv_cache_specs)) if coordinator._has_group(g))


def _reads_no_block_at_end(group: hybrid_spec.SpecGroup) -> bool:
    """KV-EXT-004's exceptions: a chunked local group (on a chunk boundary) and an EAGLE
    window of 1 (KV-EXT-014) may leave a hit's last block unloaded."""
    kind, _, param, eagle = group
    return kind == hybrid_spec.CHUNKED_LOCAL or spec.reads_no_block(kind, param, eagle)


class ExternalStoreCoordinator:
    """The store side's cache-hit answers over an :class:`ExternalCachedBlockPool`."""

    def __init__(self, config: ExternalStoreConfig) -> None:
        self.config = config
        # The local coordinator fixes the spec groups and the block-size views (KV-HYB-002,
        # KV-HASH-006); its pool is never used.
        self.local = HybridCoordinator(config.hybrid_config())
        self.spec_groups = self.local.spec_groups
        drop = spec.local_eagle_groups(config.flags, config.use_eagle)
        self.group_eagle = tuple(any(drop[g] for g in group.group_ids) for group in self.spec_groups)
        #: The masks of the hits answered, by (prompt hashes, hit): ``load_mask`` gives a hit's
        #: receiving side the masks of the lookup that answered it (KV-EXT-003).
        self._answered: dict[tuple[tuple[bytes, ...], int], tuple[list[bool], ...]] = {}

    @property
    def alignment(self) -> int:
        return self.config.scheduler_block_size

    def _group_of(self, group_id: int) -> int:
        return next(i for i, group in enumerate(self.spec_groups) if group_id in group.group_ids)

    def flat_groups(self) -> tuple[hybrid_spec.SpecGroup, ...]:
        """The spec groups, flat, with the local coordinator's EAGLE drop (KV-EXT-001)."""
        return tuple((kind, size, param, eagle and kind != hybrid_spec.CHUNKED_LOCAL)
                     for (kind, size, param, _), eagle in zip(
                         (group.flat(False) for group in self.spec_groups), self.group_eagle))

    def existence_flags(self, block_hashes: Sequence[bytes], pool: ExternalCachedBlockPool
                        ) -> tuple[tuple[bool, ...], ...]:
        """Per spec group, which of the prompt's view blocks every member group holds."""
        out = []
        for group in self.spec_groups:
            size = group.kv_cache_spec.block_size
            count = len(block_hashes) * self.config.hash_block_size // size
            out.append(tuple(pool.has_all(self.local.view_hash(block_hashes, size, j), group.group_ids)
                             for j in range(count)))
        return tuple(out)

    def chunk_present(self, block_hashes: Sequence[bytes], pool: ExternalCachedBlockPool, group_id: int,
                      hit: int) -> tuple[bool, ...]:
        """KV-EXT-002: whether the key each chunk of ``group_id``'s hit is fetched under exists."""
        size = self.config.kv_cache_specs[group_id].block_size
        return tuple(pool.contains(group_id, block_hashes[
            spec.chunk_key_index(i, size, self.config.hash_block_size, hit)]) for i in range(cdiv(hit, size)))

    def group_load_mask(self, group_id: int, hit: int, dropped: bool | None = None) -> tuple[bool, ...]:
        """The spec's load mask of ``group_id`` at ``hit`` (empty for a group never looked up).
        ``dropped``: whether the group's last lookup applied the EAGLE drop (default: the
        group has the local coordinator's drop)."""
        if not self._has_group(group_id):
            return ()
        kind, size, param, eagle = self.flat_groups()[self._group_of(group_id)]
        return spec.load_mask(kind, size, param, hit, eagle if dropped is None else dropped)

    def local_loop(self, block_hashes: Sequence[bytes], max_length: int, pool: ExternalCachedBlockPool
                   ) -> tuple[int, tuple[tuple[int, bool], ...]]:
        """The local hybrid loop over the store's flags: the hit and each spec group's last
        lookup ``(bound, drop)`` (KV-EXT-001, KV-HYB-013)."""
        result = hybrid_spec.fixed_point(self.flat_groups(), self.existence_flags(block_hashes, pool), max_length,
                                         len(block_hashes) * self.config.hash_block_size, self.alignment)
        return result[0], result[4]

    @icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
    @icontract.ensure(lambda self, max_length, result: 0 <= result[1] <= max_length
                      and result[1] % self.alignment == 0, "KV-EXT-001: an aligned hit within the bound",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, max_length, cached_block_pool, result:
                      _masks_cover_hit(self, block_hashes, max_length, cached_block_pool, result[0], result[1]),
                      "KV-EXT-003: the masks are the groups' load masks at the hit", enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, cached_block_pool, result: all(
        spec.is_loadable(tuple(mask), self.chunk_present(block_hashes, cached_block_pool, g, result[1]))
        for g, mask in enumerate(result[0])), "KV-EXT-002: every chunk asked for exists", enabled=ENABLED)
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               cached_block_pool: ExternalCachedBlockPool) -> tuple[tuple[list[bool], ...], int]:
        """``(per-group load masks, hit length)``: each group's non-null hit entries after its
        last lookup in the local loop (an EAGLE window of 1 whose last lookup dropped its
        peek block reads none, KV-EXT-014)."""
        cached = self.existence_flags(block_hashes, cached_block_pool)
        hit = spec.external_hit(self.flat_groups(), cached, max_length,
                                len(block_hashes) * self.config.hash_block_size, self.alignment)
        _, last = self.local_loop(block_hashes, max_length, cached_block_pool)
        masks = tuple(list(self.group_load_mask(g, hit, last[self._group_of(g)][1])) if self._has_group(g) else []
                      for g in range(len(self.config.kv_cache_specs)))
        self._answered[(tuple(bytes(h) for h in block_hashes), hit)] = masks
        return masks, hit

    @icontract.require(lambda self, token_len: token_len >= 0 and token_len % self.alignment == 0,
                       enabled=ENABLED)
    @icontract.ensure(lambda self, token_len, result: all(
        len(mask) * self.config.kv_cache_specs[g].block_size == token_len
        and (token_len == 0 or mask[-1] or _reads_no_block_at_end(self.flat_groups()[self._group_of(g)]))
        for g, mask in enumerate(result) if self._has_group(g)),
        "KV-EXT-004: the masks cover the whole (already pruned) hit", enabled=ENABLED)
    def load_mask(self, block_hashes: Sequence[bytes], token_len: int) -> tuple[list[bool], ...]:
        """Per-group load masks for a known hit of ``token_len`` tokens: those of the lookup
        that answered it (KV-EXT-003), with no EAGLE drop applied again (KV-EXT-004). For a
        hit this coordinator did not answer, the masks after a single pass of the loop."""
        answered = self._answered.get((tuple(bytes(h) for h in block_hashes), token_len))
        if answered is not None:
            return tuple(list(mask) for mask in answered)
        return tuple(list(self.group_load_mask(g, token_len)) if self._has_group(g) else []
                     for g in range(len(self.config.kv_cache_specs)))

    def _has_group(self, group_id: int) -> bool:
        return any(group_id in group.group_ids for group in self.spec_groups)

    def _group_mask(self, group_id: int, aligned_len: int, start_token: int, lookup: bool) -> list[bool]:
        kind, size, param, eagle = self.flat_groups()[self._group_of(group_id)]
        end = aligned_len // size
        start = min(end, cdiv(start_token, size))
        if lookup:
            return list(spec.lookup_mask(kind, size, param, eagle, self.alignment, end)[start:])
        return list(spec.store_mask(kind, size, param, eagle, self.alignment, start, end))

    @icontract.require(lambda self, aligned_token_len: aligned_token_len >= 0
                       and aligned_token_len % self.alignment == 0, enabled=ENABLED)
    @icontract.ensure(lambda self, result: all(
        not any(mask) for g, mask in enumerate(result)
        if self._has_group(g) and self.flat_groups()[self._group_of(g)][0] == hybrid_spec.MAMBA),
        "KV-EXT-008: no Mamba chunk is stored", enabled=ENABLED)
    def store_mask(self, aligned_token_len: int, start_token: int = 0) -> tuple[list[bool], ...]:
        """Per group, which chunks after ``start_token`` of the first ``aligned_token_len``
        tokens a request writes (KV-EXT-005)."""
        return tuple(self._group_mask(g, aligned_token_len, start_token, False) if self._has_group(g) else []
                     for g in range(len(self.config.kv_cache_specs)))

    @icontract.require(lambda self, aligned_token_len: aligned_token_len >= 0
                       and aligned_token_len % self.alignment == 0, enabled=ENABLED)
    def lookup_mask(self, aligned_token_len: int) -> tuple[list[bool], ...]:
        """Per group, which chunks are looked up as aligned hit boundaries (KV-EXT-007)."""
        return tuple(self._group_mask(g, aligned_token_len, 0, True) if self._has_group(g) else []
                     for g in range(len(self.config.kv_cache_specs)))

    def store_keys(self, block_hashes: Sequence[bytes], masks: Sequence[Sequence[bool]],
                   start_token: int = 0) -> set[Key]:
        """The keys a request writes for per-group masks of chunks after ``start_token``."""
        keys: set[Key] = set()
        for group_id, mask in enumerate(masks):
            size = self.config.kv_cache_specs[group_id].block_size
            first = cdiv(start_token, size)
            for offset, keep in enumerate(mask):
                if keep:
                    keys.add((group_id, bytes(self.local.view_hash(block_hashes, size, first + offset))))
        return keys
