"""MooncakeStoreCoordinator drops the EAGLE block in a group marked ``is_eagle_group``
although ``use_eagle=False``; vLLM's HybridKVCacheCoordinator over the same blocks does not.

Model: a full-attention group (block 1) marked as the EAGLE group and a sliding window of 3
(block 1); hash block 1; EAGLE block dropping off. The store holds the first 6 blocks of an
8-token prompt for both groups. Lookup bound: 7 tokens.

Exit status: 1 while the two coordinators disagree, 0 when they agree.
"""

import inspect
import sys

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

HASH_BLOCK = 1
SCHEDULER_BLOCK = 1
PROMPT_BLOCKS = 8
STORED_BLOCKS = 6
BOUND = 7


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def groups(mark_full_attention: bool) -> list:
    layer = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    return [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=1, **layer),
                         is_eagle_group=mark_full_attention),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=1, sliding_window=3, **layer)),
    ]


def store_hit(kv_groups, hashes, exists) -> int:
    store = build(MooncakeStoreCoordinator, kv_groups, SCHEDULER_BLOCK, HASH_BLOCK,
                  use_eagle=False, retention_interval=None, enable_partial_hash_hits=False)
    _, hit = store.find_longest_cache_hit(hashes, BOUND, ExternalCachedBlockPool(HASH_BLOCK, exists))
    return hit


def local_hit(kv_groups, hashes, exists) -> int:
    """vLLM's own HybridKVCacheCoordinator over a block pool caching exactly ``exists``."""
    config = KVCacheConfig(num_blocks=len(exists) + 2, kv_cache_tensors=[], kv_cache_groups=kv_groups)
    local = build(HybridKVCacheCoordinator, config, max_model_len=1024, max_in_flight_tokens=1024,
                  use_eagle=False, enable_caching=True, enable_kv_cache_events=False,
                  dcp_world_size=1, pcp_world_size=1, scheduler_block_size=SCHEDULER_BLOCK,
                  hash_block_size=HASH_BLOCK, allow_partial_hash_hits=False)
    pool = local.block_pool
    for group_id, block_hash in sorted(exists):
        block = pool.get_new_blocks(1)[0]
        key = make_block_hash_with_group_id(BlockHash(block_hash), group_id)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    return local.find_longest_cache_hit(hashes, BOUND)[1]


def main() -> int:
    hashes = [BlockHash(bytes([i]) * 4) for i in range(PROMPT_BLOCKS)]
    exists = {(g, bytes(h)) for g in (0, 1) for h in hashes[:STORED_BLOCKS]}
    marked = groups(mark_full_attention=True)
    local = local_hit(marked, hashes, exists)
    store = store_hit(marked, hashes, exists)
    unmarked = store_hit(groups(mark_full_attention=False), hashes, exists)
    print(f"HybridKVCacheCoordinator hit (expected):      {local}")
    print(f"MooncakeStoreCoordinator hit (actual):        {store}")
    print(f"MooncakeStoreCoordinator hit, group unmarked: {unmarked}")
    if store != local:
        print("DIFFERENT: the store drops the EAGLE block in the marked group with use_eagle=False")
        return 1
    print("same answer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
