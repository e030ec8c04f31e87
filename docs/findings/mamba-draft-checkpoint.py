"""KVCacheManager.allocate_slots fails an assertion when a decode step with draft tokens
reserves a Mamba prefill checkpoint past the request's committed tokens.

Model: one Mamba group in "align" mode (prefix caching on) whose backend exports prefill
checkpoints (num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4), block 4, hash
block 4. One request: an 8-token prompt, then a decode step scheduling one token and 7 draft
tokens. The step reserves a checkpoint at 12 tokens; the request has hashes for 8.

Exit status: 1 while allocate_slots fails, 0 when it allocates, 2 where the release lacks
prefill checkpoints.
"""

import inspect
import logging
import sys

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request, RequestStatus

BLOCK = 4


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def main() -> int:
    logging.disable(logging.WARNING)
    if "prefill_checkpoint_alignment" not in inspect.signature(MambaSpec).parameters:
        print("this release has no Mamba prefill checkpoints")
        return 2
    kv_cache_utils.init_none_hash(sha256)
    spec = MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align",
                     num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4)
    config = build(KVCacheConfig, num_blocks=32, kv_cache_tensors=[],
                   kv_cache_groups=[KVCacheGroupSpec(["mamba"], spec)])
    manager = build(KVCacheManager, config, max_model_len=64, scheduler_block_size=BLOCK,
                    hash_block_size=BLOCK, enable_caching=True)
    request = build(Request, "r", list(range(100, 108)), sampling_params=SamplingParams(max_tokens=64),
                    pooling_params=None, eos_token_id=None,
                    block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256))

    manager.allocate_slots(request, 8)  # the prompt
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 8
    request.append_output_token_ids([1])
    print(f"hashed tokens: {len(request.block_hashes) * BLOCK}")
    try:
        manager.allocate_slots(request, 8)  # one token and 7 draft tokens
    except AssertionError:
        mamba = manager.coordinator.single_type_managers[0]
        print(f"allocate_slots failed an assertion; checkpoint reserved: {mamba._checkpoints.get('r')}")
        print(f"table after the failure: {[b.block_id for b in manager.coordinator.get_blocks('r')[0]]}")
        return 1
    print("allocate_slots allocated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
