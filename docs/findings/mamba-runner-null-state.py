"""After rejected draft tokens the model runner keeps a request's Mamba state in the null block:
it finds the state page by position, (seq_len - 1) // block_size, and the align-mode manager left
that entry null because the table is longer than the step needs.

Model: a full-attention group and a Mamba group in "align" mode (prefix caching on), block 4,
hash block 4, a pool of 20 blocks. One request: an 8-token prompt, then a decode step of one
token and 8 draft tokens, all rejected, then a decode step of one token without drafts. After
each allocation the script prints the Mamba table and the state pages the runner's
mamba_get_block_table_tensor (align mode, CPU path) gives the kernels.

Exit status: 1 while the runner's state page is the null block although the table holds a
running page, 0 when it is that page, 2 where the release lacks the align mode's classes or its
manager refuses the shorter step.
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
MAMBA_GROUP = 1


def build(cls, *args, **kwargs):
    """cls(*args, **kwargs) without the keywords this release does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def main() -> int:
    logging.disable(logging.WARNING)
    if "mamba_cache_mode" not in inspect.signature(MambaSpec).parameters:
        print("this release has no Mamba cache modes")
        return 2
    from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor

    kv_cache_utils.init_none_hash(sha256)
    mamba_spec = MambaSpec(block_size=BLOCK, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align")
    groups = [
        KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                     dtype=torch.float32)),
        KVCacheGroupSpec(["mamba"], mamba_spec),
    ]
    config = build(KVCacheConfig, num_blocks=20, kv_cache_tensors=[], kv_cache_groups=groups)
    manager = build(KVCacheManager, config, max_model_len=64, scheduler_block_size=BLOCK,
                    hash_block_size=BLOCK, enable_caching=True)
    request = build(Request, "r", list(range(100, 108)), sampling_params=SamplingParams(max_tokens=64),
                    pooling_params=None, eos_token_id=None,
                    block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, sha256))

    def show(step: str, seq_len: int) -> tuple[list[int], int]:
        table = list(manager.get_block_ids(request.request_id)[MAMBA_GROUP])
        padded = torch.tensor([table + [0] * (16 - len(table))], dtype=torch.int32)
        view = mamba_get_block_table_tensor(padded, torch.tensor([seq_len], dtype=torch.int32), mamba_spec,
                                            "align")
        state_page = int(view[0, 0])
        print(f"{step} (seq_len {seq_len}): Mamba table {table}, runner's state page {state_page}")
        return table, state_page

    manager.allocate_slots(request, 8)  # the prompt
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 8
    show("after the prompt", 8)
    request.append_output_token_ids([1])
    manager.allocate_slots(request, 9)  # one token and 8 draft tokens
    show("after one token and 8 drafts", 17)
    request.num_computed_tokens = 9  # every draft rejected
    request.append_output_token_ids([2])
    try:
        manager.allocate_slots(request, 1)  # one token, no drafts
    except AssertionError as error:  # releases before the table was left as it is
        print(f"allocate_slots failed an assertion before any runner saw the table: {error}")
        return 2
    table, state_page = show("after one token, the drafts rejected", 10)
    running = [block for block in table if block != 0][-1:]
    print(f"the table's running page: {running}")
    return 1 if state_page == 0 and running else 0


if __name__ == "__main__":
    sys.exit(main())
