"""With partial hash hits, MooncakeStoreCoordinator answers a hit that ends inside a
full-attention block, at a hash boundary where that group holds no object (vLLM #50359).

Two models, each a full-attention group and a Mamba group ("align") of equal block size,
partial hash hits on, EAGLE off:

* #50359's geometry: blocks of 32, hash block 16, an 80-token prompt; the store holds the
  full-attention keys at 32 and 64 tokens and the Mamba keys at 32 and 48.
* the smallest one: blocks of 2, hash block 1, a 2-token prompt; the store holds the
  full-attention key at 2 tokens and the Mamba key at 1.

For each, the script prints the hit, whether every group holds a key at the hit's end, and
(where the release has it) the key the connector's worker would fetch the full-attention
tail chunk by (MooncakeStoreWorker._tail_key_boundaries).

Exit status: 1 while a hit ends where a group holds no key, 0 when every hit ends on keys
of all groups, 2 where the release has no partial hash hits in the store coordinator.
"""

import inspect
import sys
from types import SimpleNamespace

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.coordinator import (
    ExternalCachedBlockPool,
    MooncakeStoreCoordinator,
)
from vllm.v1.core.kv_cache_utils import BlockHash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec

#: name: (block size, hash block size, prompt tokens, {group: token ends of the keys held})
CASES = {
    "#50359's geometry": (32, 16, 80, {0: (32, 64), 1: (32, 48)}),
    "smallest": (2, 1, 2, {0: (2,), 1: (1,)}),
}


def groups(block_size: int) -> list:
    return [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                                     dtype=torch.float32)),
        KVCacheGroupSpec(["mamba"], MambaSpec(block_size=block_size, shapes=((1,),), dtypes=(torch.float32,),
                                              mamba_cache_mode="align")),
    ]


def tail_keys(store, block_size: int, hash_block: int, hashes, hit: int, pool) -> str:
    """The token boundary of the key each group's tail chunk is fetched by, as the worker's
    lookup computes it (on a stand-in worker: the method reads only these attributes)."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker
    except ImportError as error:
        return f"the worker does not import here ({error})"
    find = getattr(MooncakeStoreWorker, "_tail_key_boundaries", None)
    if find is None:
        return "this release's worker has no tail-key lookup"
    stand_in = SimpleNamespace(hash_block_size=hash_block, coord=store, _kv_cache_groups=store.kv_cache_groups,
                               token_dbs=[SimpleNamespace(block_size=block_size)] * 2)
    try:
        found = find(stand_in, hashes, hit, pool)
    except AssertionError as error:
        return f"none ({error})"
    return ", ".join(f"group {b.group_id} at {b.num_tokens}" for b in found)


def main() -> int:
    if "enable_partial_hash_hits" not in inspect.signature(MooncakeStoreCoordinator).parameters:
        print("this release's MooncakeStoreCoordinator has no partial hash hits: not applicable")
        return 2
    unloadable = 0
    for name, (block_size, hash_block, tokens, held) in CASES.items():
        store = MooncakeStoreCoordinator(groups(block_size), block_size, hash_block, use_eagle=False,
                                         retention_interval=None, enable_partial_hash_hits=True)
        hashes = [BlockHash(i.to_bytes(4, "big")) for i in range(tokens // hash_block)]
        exists = {(g, bytes(hashes[end // hash_block - 1])) for g, ends in held.items() for end in ends}
        pool = ExternalCachedBlockPool(hash_block, exists)
        _, hit = store.find_longest_cache_hit(hashes, tokens, pool)
        # The longest hit at which every group holds a key (what #50359 asks for).
        expected = max((end for end in held[0] if all(end in ends for ends in held.values())), default=0)
        missing = [g for g in held if hit and (g, bytes(hashes[hit // hash_block - 1])) not in exists]
        print(f"{name}: blocks of {block_size}, hash block {hash_block}, {tokens} tokens, keys held {held}")
        print(f"  expected hit (keys of every group at its end): {expected}")
        print(f"  actual hit:                                    {hit}")
        if missing:
            unloadable += 1
            print(f"  no key at {hit} tokens in group(s) {missing}")
        print(f"  worker's tail-chunk keys: {tail_keys(store, block_size, hash_block, hashes, hit, pool)}")
    return 1 if unloadable else 0


if __name__ == "__main__":
    sys.exit(main())
