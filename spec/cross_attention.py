"""Chapter 9 -- Cross attention.

In an encoder-decoder model the decoder's cross-attention layers attend to the
encoder's output, which is computed once per request. Their cache holds the
encoder tokens' KV: one static allocation of ``cdiv(num_encoder_tokens,
block_size)`` blocks made when the request is first scheduled, independent of
how many decoder tokens are computed.

The encoder output depends on the request's multimodal input, not on a token
prefix that other requests could share, so cross-attention blocks are never
prefix-cached: a lookup returns no blocks, nothing is ever cached, and the
group's blocks are freed with the request like any other.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .lifecycle import cdiv
from .registry import defines, rule

CHAPTER = "cross_attention"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"

KV_CROSS_001 = rule(
    "KV-CROSS-001",
    "Cross-attention blocks are sized by the encoder tokens",
    """A cross-attention group needs cdiv(num_encoder_tokens, block_size) blocks for a
    request, whatever the number of decoder tokens; blocks it already holds count against
    that number.""",
    source=f"{COORD} KVCacheCoordinator.get_num_blocks_to_allocate / allocate_new_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)
KV_CROSS_002 = rule(
    "KV-CROSS-002",
    "Cross attention is never prefix-cached",
    """A cross-attention lookup hits nothing, its blocks are never cached, and a request
    never adopts computed cross-attention blocks.""",
    source=f"{STKV} CrossAttentionManager.find_longest_cache_hit / cache_blocks",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups",),
)


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda num_encoder_tokens: num_encoder_tokens >= 0, enabled=ENABLED)
@icontract.require(lambda num_held_blocks: num_held_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_encoder_tokens, block_size, num_held_blocks:
                  result >= 0 and num_held_blocks + result >= cdiv(num_encoder_tokens, block_size),
                  enabled=ENABLED)
@defines(KV_CROSS_001)
def num_blocks_to_allocate(num_encoder_tokens: int, block_size: int, num_held_blocks: int) -> int:
    """New cross-attention blocks a request needs."""
    return max(cdiv(num_encoder_tokens, block_size) - num_held_blocks, 0)
