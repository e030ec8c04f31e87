"""KVCacheManager.allocate_slots raises instead of returning None: after rejected draft tokens
an align-mode Mamba group reports a negative number of blocks to allocate, which hides another
group's need from the capacity check.

Model: a full-attention group and a Mamba group in "align" mode (prefix caching on), block 4,
hash block 4, a pool of 9 blocks (8 usable). One request: an 8-token prompt, then a decode step
scheduling one token and 8 draft tokens, all drafts rejected, then a decode step of one token
with 20 look-ahead slots. Full attention needs 3 more blocks; 2 are free (after the Mamba state
page of 4 tokens is freed, as allocate_slots does first).

Exit status: 1 while allocate_slots raises (or the Mamba need is negative), 0 when it returns
None with a non-negative need, 2 where the release lacks the align mode's classes.
"""

import inspect
import logging
import sys

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request, RequestStatus

BLOCK = 4


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def main() -> int:
    logging.disable(logging.WARNING)
    if "mamba_cache_mode" not in inspect.signature(MambaSpec).parameters:
        print("this release has no Mamba cache modes")
        return 2
    kv_cache_utils.init_none_hash(sha256)
    groups = [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                     dtype=torch.float32)),
        KVCacheGroupSpec(["mamba"], MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,),
                                              mamba_cache_mode="align")),
    ]
    config = build(KVCacheConfig, num_blocks=9, kv_cache_tensors=[], kv_cache_groups=groups)
    manager = build(KVCacheManager, config, max_model_len=64, scheduler_block_size=BLOCK,
                    hash_block_size=BLOCK, enable_caching=True)
    request = build(Request, "r", list(range(100, 108)), sampling_params=SamplingParams(max_tokens=64),
                    pooling_params=None, eos_token_id=None,
                    block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256))

    manager.allocate_slots(request, 8)  # the prompt
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 8
    request.append_output_token_ids([1])
    manager.allocate_slots(request, 9)  # one token and 8 draft tokens
    request.num_computed_tokens = 9  # every draft rejected
    request.append_output_token_ids([2])

    mamba = manager.coordinator.single_type_managers[1]
    manager.remove_skipped_blocks(request.request_id, 9)  # as allocate_slots does first
    need = build(mamba.get_num_blocks_to_allocate, request_id=request.request_id, num_tokens=10,
                 new_computed_blocks=[], total_computed_tokens=9, num_local_computed_tokens=9,
                 num_tokens_main_model=10)
    print(f"Mamba group's blocks to allocate for 10 tokens: {need}")
    print(f"free blocks: {manager.block_pool.get_num_free_blocks()}; full attention needs 3")
    try:
        result = manager.allocate_slots(request, 1, num_lookahead_tokens=20)
    except ValueError as error:
        print(f"allocate_slots raised ValueError: {error}")
        return 1
    print(f"allocate_slots returned {'None' if result is None else 'blocks'}")
    return 1 if need < 0 else 0


if __name__ == "__main__":
    sys.exit(main())
