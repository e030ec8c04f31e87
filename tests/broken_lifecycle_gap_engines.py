"""Deliberately broken engines for the three lifecycle rules that left the gap list.

KV-SWA-006, KV-CHUNK-002 and KV-HASH-006 are judged by the manager suite's groups part since
they moved off ``NOT_YET_JUDGED`` (spec/registry.py). Each engine here is the reference adapter
over a manager with one broken piece -- a sliding-window or chunked-local group's skip count,
or the coordinator's block-size view of the hash list -- and the meta-tests
(tests/test_lifecycle_gap_rules.py) require the suite to charge exactly that rule. The broken
pieces are used consistently by the rest of the manager (freeing, adoption, caching, lookups),
so the reference's own contracts, which call the same pieces, stay quiet: the suite's checks
must catch them.
"""

from __future__ import annotations

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.reference import KVCacheManager
from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
from kvoracle.reference.single_type import SingleTypeManager
from kvoracle.spec import hybrid as spec


# -- KV-SWA-006: a window that skips one token too few -----------------------------------------
class _SwaShortGroup(SingleTypeManager):
    """Counts ``n - window`` skipped tokens in a sliding-window group: the last token before the
    window is kept as if the window reached it."""

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        if self.kind == spec.SLIDING_WINDOW:
            return max(0, num_computed_tokens - self.param)
        return super().skipped_tokens(num_computed_tokens)


class _SwaShortManager(KVCacheManager):
    group_class = _SwaShortGroup


class SwaSkipsOneTokenShort(ReferenceEngine):
    name = "broken-swa-skips-one-token-short"

    def make_manager(self, config: HybridConfig) -> KVCacheManager:  # type: ignore[override]
        return _SwaShortManager(config)


# -- KV-CHUNK-002: the chunk of the last computed token ----------------------------------------
class _ChunkOfLastTokenGroup(SingleTypeManager):
    """Skips the chunks before the one holding the last computed token, ``(n - 1) // chunk *
    chunk``: at a chunk boundary it keeps the whole chunk the next token no longer attends to."""

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        if self.kind == spec.CHUNKED_LOCAL:
            return max(0, num_computed_tokens - 1) // self.param * self.param
        return super().skipped_tokens(num_computed_tokens)


class _ChunkOfLastTokenManager(KVCacheManager):
    group_class = _ChunkOfLastTokenGroup


class ChunkSkipsBeforeLastToken(ReferenceEngine):
    name = "broken-chunk-skips-before-last-token"

    def make_manager(self, config: HybridConfig) -> KVCacheManager:  # type: ignore[override]
        return _ChunkOfLastTokenManager(config)


# -- KV-HASH-006: a coarse block named by its first hash unit ----------------------------------
class _FirstUnitView(HybridCoordinator):
    """Names block ``j`` of a group with ``k`` hash blocks a block by unit ``j * k``, the first
    unit it covers, instead of the last, ``(j + 1) * k - 1``. Caching and lookups both use it."""

    def view_hash(self, block_hashes, block_size, index):  # type: ignore[no-untyped-def]
        return block_hashes[index * (block_size // self.config.hash_block_size)]


class _FirstUnitViewManager(KVCacheManager):
    coordinator_class = _FirstUnitView


class CoarseBlockUnderFirstUnit(ReferenceEngine):
    name = "broken-coarse-block-under-first-unit"

    def make_manager(self, config: HybridConfig) -> KVCacheManager:  # type: ignore[override]
        return _FirstUnitViewManager(config)


#: Broken engine -> the rule the manager suite must charge it with.
EXPECTED = {
    "SwaSkipsOneTokenShort": "KV-SWA-006",
    "ChunkSkipsBeforeLastToken": "KV-CHUNK-002",
    "CoarseBlockUnderFirstUnit": "KV-HASH-006",
}
