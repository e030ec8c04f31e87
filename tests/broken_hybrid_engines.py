"""Deliberately broken hybrid lookups: each re-creates one known bug of a hybrid coordinator.

The meta-tests (tests/test_hybrid_meta.py) run ``kvoracle check --suite hybrid``
against each and require the named rule to fail. Each is the reference adapter
whose coordinator computes the hit with a patched copy of the spec's fixed-point
loop (:func:`kvoracle.spec.hybrid.fixed_point`) -- the spec and reference modules
themselves are left alone, since the suite runs the correct reference in the same
process.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup
from kvoracle.reference.block import KVCacheBlock
from kvoracle.reference.hybrid import HybridCoordinator
from kvoracle.spec import hybrid as spec
from kvoracle.spec.lifecycle import cdiv


def patched_fixed_point(groups, cached, max_cache_hit_length, num_hashed_tokens, alignment, *,
                        drop_every_pass=False, mamba_margin=False):
    """A copy of vLLM 0.33.0's loop (the spec's ``fixed_point``) with one bug switched on.

    ``drop_every_pass``: an EAGLE group drops its peek block on every pass, as before the
    fix of vLLM #32802 (the hit spirals down). ``mamba_margin``: a Mamba group is looked up
    one block past the candidate like the other EAGLE groups (#43559).
    """
    order = spec.lookup_order(tuple(kind for kind, _, _, _ in groups))
    simple = len(groups) == 2 and groups[order[0]][0] == spec.FULL
    hit_length = max_cache_hit_length
    looked_up = [False] * len(groups)
    group_length = [0] * len(groups)
    last_lookup = [(0, False)] * len(groups)
    verified: set[int] = set()
    while True:
        candidate = hit_length
        for g in order:
            kind, size, param, eagle = groups[g]
            if kind == spec.FULL and looked_up[g]:
                candidate = min(candidate, group_length[g])
                continue
            drop = eagle and (drop_every_pass or g not in verified)
            margin = size if (mamba_margin or kind != spec.MAMBA) else 0
            bound = min(candidate + margin, num_hashed_tokens) if drop else candidate
            answer = spec.group_hit_length(kind, cached[g], bound, size, param, drop, alignment)
            last_lookup[g] = (bound, drop)
            if drop:
                verified.add(g)
            elif answer < candidate:
                verified.clear()
            candidate = answer
            looked_up[g] = True
            group_length[g] = answer
        if candidate >= hit_length:
            break
        hit_length = candidate
        if simple:
            break
    return hit_length, tuple(group_length), 0, 0, tuple(last_lookup)


class _PatchedCoordinator(HybridCoordinator):
    """The reference coordinator with the loop and the final trim replaceable."""

    def loop(self, flat, cached, bound, num_hashed, alignment):
        return spec.fixed_point(flat, cached, bound, num_hashed, alignment)

    def full_entries(self, index_among_full: int, hit: int, length: int, size: int) -> int:
        return cdiv(hit, size)  # KV-HYB-006: every full group is trimmed to the hit

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_cache_hit_length: int
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        flat = tuple(group.flat(self.config.use_eagle) for group in self.spec_groups)
        cached = tuple(self._cached_flags(block_hashes, group) for group in self.spec_groups)
        num_hashed = len(block_hashes) * self.config.hash_block_size
        hit, lengths, uncached, _, last_lookup = self.loop(
            flat, cached, max_cache_hit_length, num_hashed, self.config.scheduler_block_size)
        blocks: list[list[KVCacheBlock]] = [[] for _ in self.config.kv_cache_specs]
        full_seen = 0
        for group, (kind, size, param, _), length, (bound, drop) in zip(
                self.spec_groups, flat, lengths, last_lookup):
            if kind == spec.FULL:
                num_blocks = self.full_entries(full_seen, hit, length, size)
                full_seen += 1
            else:
                num_blocks = length // size
            nulls = spec.num_null_hit_blocks(kind, num_blocks, bound, drop, size, param)
            for group_id in group.group_ids:
                blocks[group_id] = [self.pool.null_block] * nulls + [
                    self.pool._cached_block((self.view_hash(block_hashes, size, j), group_id))
                    for j in range(nulls, num_blocks)]
        return tuple(blocks), hit, uncached


# -- (i) the EAGLE drop on every pass (vLLM #32802) ------------------------------------------------
class _DropEveryPass(_PatchedCoordinator):
    def loop(self, flat, cached, bound, num_hashed, alignment):
        return patched_fixed_point(flat, cached, bound, num_hashed, alignment, drop_every_pass=True)


class EagleDropEveryPass(ReferenceHybridLookup):
    name = "broken-eagle-drop-every-pass"
    coordinator_class = _DropEveryPass


# -- (ii) only the first full-attention spec group is trimmed to the final hit ---------------------
class _TrimFirstFullOnly(_PatchedCoordinator):
    def full_entries(self, index_among_full: int, hit: int, length: int, size: int) -> int:
        return cdiv(hit, size) if index_among_full == 0 else length // size


class TrimFirstFullOnly(ReferenceHybridLookup):
    name = "broken-trim-first-full-only"
    coordinator_class = _TrimFirstFullOnly


# -- (iii) a Mamba group gets the EAGLE margin (#43559) ---------------------------------------------
class _MambaMargin(_PatchedCoordinator):
    def loop(self, flat, cached, bound, num_hashed, alignment):
        return patched_fixed_point(flat, cached, bound, num_hashed, alignment, mamba_margin=True)


class MambaEagleMargin(ReferenceHybridLookup):
    name = "broken-mamba-eagle-margin"
    coordinator_class = _MambaMargin


# -- (iv) a sliding-window scan needing cdiv(window, block_size) blocks -----------------------------
class _WideWindow(_PatchedCoordinator):
    def loop(self, flat, cached, bound, num_hashed, alignment):
        # cdiv((window + 1) - 1, b) == cdiv(window, b): the off-by-one of KV-SWA-001.
        wide = tuple((k, s, p + 1 if k == spec.SLIDING_WINDOW else p, e) for k, s, p, e in flat)
        return spec.fixed_point(wide, cached, bound, num_hashed, alignment)


class SwaWindowNotMinusOne(ReferenceHybridLookup):
    name = "broken-swa-cdiv-window"
    coordinator_class = _WideWindow


#: Broken adapter -> the rule the hybrid suite must convict it of.
EXPECTED = {
    "EagleDropEveryPass": "KV-HYB-007",
    "TrimFirstFullOnly": "KV-HYB-006",
    "MambaEagleMargin": "KV-MAMBA-002",
    "SwaWindowNotMinusOne": "KV-SWA-001",
}
