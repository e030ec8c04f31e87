"""With EAGLE, MooncakeStoreCoordinator.load_mask asks a sliding window of 1 to load the block
before the hit, which the lookup never checked and store_mask never wrote.

Model: full attention (block 2) and a sliding window of 1 (block 1), hash block 1, scheduler
block 2, EAGLE on (no group marked, so all drop). A first request of 8 tokens is written as
store_mask(8) says; a second request repeats those 8 tokens and adds one.

The connector's worker looks the second request up at align_lookup_length(9) = 8 tokens and
then fetches, for each group, the chunks load_mask(hashes, hit) marks. vLLM's own
HybridKVCacheCoordinator over the same blocks leaves every entry of the window group's hit
null: locally that group reads no block.

Where the release has it, the script also runs the worker's tail-key lookup
(MooncakeStoreWorker._tail_key_boundaries, part of the worker's lookup since vLLM 0.29) on
the hit; without partial hash hits it asserts that every group holds the key at the hit's
end.

Exit status: 1 while load_mask marks a chunk whose key the store does not hold, 0 otherwise.
"""

import inspect
import sys
from types import SimpleNamespace

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import (
    ExternalCachedBlockPool,
    MooncakeStoreCoordinator,
)
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

STORED_TOKENS = 8
NUM_TOKENS = 9
BLOCK_SIZES = (2, 1)


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def chunks(mask) -> list[int]:
    return [i for i, wanted in enumerate(mask) if wanted]


def worker_tail_keys(store, hashes, hit: int, pool) -> str:
    """The worker's tail-key lookup on a stand-in worker (the method reads only these attributes)."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker
    except ImportError as error:
        return f"the worker does not import here ({error})"
    find = getattr(MooncakeStoreWorker, "_tail_key_boundaries", None)
    if find is None:
        return "this release's worker has no tail-key lookup"
    stand_in = SimpleNamespace(hash_block_size=1, coord=store, _kv_cache_groups=store.kv_cache_groups,
                               token_dbs=[SimpleNamespace(block_size=size) for size in BLOCK_SIZES])
    try:
        found = find(stand_in, hashes, hit, pool)
    except AssertionError:
        return "AssertionError (a group holds no key at the hit's end)"
    return ", ".join(f"group {b.group_id} at {b.num_tokens}" for b in found)


def main() -> int:
    layer = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    kv_groups = [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=2, **layer)),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=1, sliding_window=1, **layer)),
    ]
    hashes = [BlockHash(bytes([i]) * 4) for i in range(NUM_TOKENS)]  # hash block 1: one per token
    store = build(MooncakeStoreCoordinator, kv_groups, 2, 1, use_eagle=True, retention_interval=None,
                  enable_partial_hash_hits=False)

    # The first request writes the chunks store_mask(8) marks; chunk i of a group with block
    # size b is keyed by the hash that ends it.
    stored = [list(range(STORED_TOKENS // size)) if mask is None else chunks(mask)
              for mask, size in zip(store.store_mask(STORED_TOKENS), BLOCK_SIZES)]
    exists = {(g, bytes(hashes[(i + 1) * size - 1]))
              for g, size in enumerate(BLOCK_SIZES) for i in stored[g]}

    bound = store.align_lookup_length(NUM_TOKENS)
    external = ExternalCachedBlockPool(1, exists)
    masks, hit = store.find_longest_cache_hit(hashes, bound, external)
    loads = store.load_mask(hashes, hit)
    missing = [(g, i) for g, (mask, size) in enumerate(zip(loads, BLOCK_SIZES)) for i in chunks(mask)
               if (g, bytes(hashes[(i + 1) * size - 1])) not in exists]

    config = KVCacheConfig(num_blocks=len(exists) + 2, kv_cache_tensors=[], kv_cache_groups=kv_groups)
    local = build(HybridKVCacheCoordinator, config, max_model_len=1024, max_in_flight_tokens=1024,
                  use_eagle=True, enable_caching=True, enable_kv_cache_events=False,
                  dcp_world_size=1, pcp_world_size=1, scheduler_block_size=2, hash_block_size=1,
                  allow_partial_hash_hits=False)
    pool = local.block_pool
    for group_id, block_hash in sorted(exists):
        block = pool.get_new_blocks(1)[0]
        key = make_block_hash_with_group_id(BlockHash(block_hash), group_id)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    local_blocks, local_hit = local.find_longest_cache_hit(hashes, NUM_TOKENS - 1)[:2]
    local_window = [i for i, block in enumerate(local_blocks[1]) if not block.is_null]

    print(f"window chunks store_mask({STORED_TOKENS}) writes: {stored[1]}")
    print(f"store hit {hit} (HybridKVCacheCoordinator: {local_hit}); lookup mask of the window: "
          f"{chunks(masks[1])}")
    print(f"window blocks the local hit reads (expected to load): {local_window}")
    print(f"window chunks load_mask marks (actual):               {chunks(loads[1])}")
    print(f"worker's tail-key lookup at the hit: {worker_tail_keys(store, hashes, hit, external)}")
    if missing:
        print(f"load_mask asks for (group, chunk) {missing}, whose keys the store does not hold")
        return 1
    print("every chunk load_mask marks is in the store")
    return 0


if __name__ == "__main__":
    sys.exit(main())
