"""When every KV-cache group shares one spec, MooncakeStoreCoordinator looks that spec group up
once at the bound with the EAGLE drop, without the look-ahead block that vLLM's
HybridKVCacheCoordinator gives an EAGLE group; with a bound below the hashed tokens it
answers one block less.

Model: three full-attention groups with equal specs (block 1), hash block 1, EAGLE on (no
group marked, so all drop). The store holds both blocks of a 2-token prompt in every group.

It also prints what the connector itself asks: its worker looks a prompt up with the bound
``align_lookup_length(num_tokens)``, which covers every hashed token.

Exit status: 1 while the two coordinators disagree at bound 1, 0 when they agree, 2 where
the release's HybridKVCacheCoordinator refuses a model with one spec group.
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
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

NUM_TOKENS = 2
BOUND = NUM_TOKENS - 1


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def main() -> int:
    spec = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i in range(3)]
    hashes = [BlockHash(bytes([i]) * 4) for i in range(NUM_TOKENS)]
    exists = {(g, bytes(h)) for g in range(3) for h in hashes}

    config = KVCacheConfig(num_blocks=len(exists) + 2, kv_cache_tensors=[], kv_cache_groups=kv_groups)
    try:
        local = build(HybridKVCacheCoordinator, config, max_model_len=1024, max_in_flight_tokens=1024,
                      use_eagle=True, enable_caching=True, enable_kv_cache_events=False,
                      dcp_world_size=1, pcp_world_size=1, scheduler_block_size=1, hash_block_size=1,
                      allow_partial_hash_hits=False)
    except AssertionError as refusal:
        print(f"HybridKVCacheCoordinator refuses this model here ({refusal}): not applicable")
        return 2
    pool = local.block_pool
    for group_id, block_hash in sorted(exists):
        block = pool.get_new_blocks(1)[0]
        key = make_block_hash_with_group_id(BlockHash(block_hash), group_id)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    local_hit = local.find_longest_cache_hit(hashes, BOUND)[1]

    store = build(MooncakeStoreCoordinator, kv_groups, 1, 1, use_eagle=True, retention_interval=None,
                  enable_partial_hash_hits=False)
    external = ExternalCachedBlockPool(1, exists)
    store_hit = store.find_longest_cache_hit(hashes, BOUND, external)[1]
    connector_bound = store.align_lookup_length(NUM_TOKENS)
    connector_hit = store.find_longest_cache_hit(hashes, connector_bound, external)[1]

    print(f"bound {BOUND}: HybridKVCacheCoordinator hit (expected): {local_hit}")
    print(f"bound {BOUND}: MooncakeStoreCoordinator hit (actual):   {store_hit}")
    print(f"the connector's bound {connector_bound}: MooncakeStoreCoordinator hit: {connector_hit}")
    if store_hit != local_hit:
        print("DIFFERENT: the store's one-spec-group lookup has no EAGLE look-ahead")
        return 1
    print("same answer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
