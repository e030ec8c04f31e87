"""Deliberately broken engines for the paged KV store and the tensor pool.

Each re-creates one plausible bug; ``EXPECTED`` maps each to the rule the suite must
convict it of. Two of them break only the *data*: the block ids, tables, counts and
cache map they show are right (or the engine claims no exact ids), so only the
KV-DATA checks of the paged store can see them.
"""

from __future__ import annotations

import attrs

from kvoracle.conformance.adapter import Lookup
from kvoracle.conformance.engines.gpu import GpuEngine, PagedStoreWrapper, TorchEngine
from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.gpu import PagedKVStore, TorchBlockPool, TorchKVCacheManager, torch
from kvoracle.reference import KVCacheBlocks


# -- 1. the model runner's slot mapping counts offsets from the step's first token -----------
class _ChunkOffsetStore(PagedKVStore):
    """Slot of position p = table[p // block_size], offset (p - first) % block_size: right
    whenever a step starts on a block boundary, wrong -- overwriting earlier tokens of the
    block -- whenever a chunk starts mid-block."""

    def _slots(self, group, table, positions):
        slots, has_slot = super()._slots(group, table, positions)
        if positions.numel():
            size = self.block_sizes[group]
            slots = slots - positions % size + (positions - positions[0]) % size  # bug
        return slots, has_slot


class StoreWritesAtChunkOffsets(GpuEngine):
    name = "broken-store-chunk-offsets"

    def configure(self, config) -> None:
        super().configure(config)
        self.store = _ChunkOffsetStore(config.num_blocks, (config.block_size,), self.device)


# -- 2. a lookup returns the hit blocks in reverse order (contents of another prefix) --------
class _ReversedHits(ReferenceEngine):
    """A black-box engine (no exact ids claimed) whose hit lists its blocks back to front."""

    name = "reversed-hits"

    def capabilities(self):
        return attrs.evolve(super().capabilities(), exact_block_ids=False)

    def lookup(self, request_id, max_cache_hit_length=None):
        hit = super().lookup(request_id, max_cache_hit_length)
        blocks = self.last_hit[request_id]
        flipped = KVCacheBlocks(tuple(tuple(reversed(group)) for group in blocks.blocks))  # bug
        self.last_hit[request_id] = flipped  # allocate adopts the blocks in this order
        return Lookup(flipped.get_block_ids(), hit.num_tokens)


class HitBlocksOutOfOrder(PagedStoreWrapper):
    name = "broken-hit-blocks-out-of-order"

    def __init__(self) -> None:
        super().__init__(_ReversedHits(), torch.device("cpu"))


# -- 3. the tensor pool reuses a cached block without evicting its key -----------------------
class _KeepsKeysPool(TorchBlockPool):
    def allocate(self, n: int) -> torch.Tensor:
        if not 0 <= n <= self.num_free_blocks():
            raise ValueError("cannot allocate")
        ids = self._pop_front(n)  # bug: no _drop_keys, the stale key still finds the block
        self._ref_cnt.scatter_(0, ids, self._constant(n, 1))
        return ids

    def cache(self, block_ids, key_ids) -> None:
        # Re-caching a block that kept its old key simply overwrites the key.
        self.block_key[self._ids(block_ids)] = 0
        super().cache(block_ids, key_ids)


class _KeepsKeysEngine(TorchEngine):
    def make_manager(self, config) -> TorchKVCacheManager:
        pool = _KeepsKeysPool(config.num_blocks, config.enable_caching, self.device)
        return TorchKVCacheManager(
            config.num_blocks, config.block_size, config.max_model_len,
            hash_block_size=config.hash_block_size, enable_caching=config.enable_caching,
            use_eagle=config.use_eagle, pool=pool)


class AllocatorKeepsKeys(PagedStoreWrapper):
    name = "broken-allocator-keeps-keys"

    def __init__(self) -> None:
        super().__init__(_KeepsKeysEngine(torch.device("cpu")), torch.device("cpu"))


#: Engine class name -> the rule the suite must report as failing.
EXPECTED = {
    "StoreWritesAtChunkOffsets": "KV-DATA-003",
    "HitBlocksOutOfOrder": "KV-DATA-001",
    "AllocatorKeepsKeys": "KV-POOL-005",
}
