"""Chapter 7 -- Chunked local attention.

Chunked local attention cuts the sequence into chunks of
``attention_chunk_size`` tokens; a token attends only to the earlier tokens of
its own chunk. Resuming after ``L`` tokens therefore needs the KV of the
current chunk's tokens before ``L`` and nothing before the chunk start.

**The hit** (KV-CHUNK-001). For a lookup bounded by ``max_length`` tokens the
current chunk starts at ``floor(max_length / chunk) * chunk``; every block
before it is outside the window, counts as computed, and is the null block.
From the chunk start the hit extends over consecutive cached blocks, at most
to ``max_length // block_size`` blocks. Two worked examples (chunk 8, block 4):

* ``max_length = 15``: tokens 0..7 are in an earlier chunk, so blocks 0 and 1
  are null; block 2 (tokens 8..11) is looked up. Hit: ``[null, null, b2]`` if
  it is cached, else ``[null, null]``.
* ``max_length = 16``: tokens 0..15 all lie before the chunk that token 16
  starts, so the hit is four null blocks, 16 tokens, with no lookup at all.

**Skipped tokens** (KV-CHUNK-002): after ``n`` computed tokens, the whole
chunks before the current one, ``floor(n / chunk) * chunk`` tokens; their
blocks are freed like a sliding window's (KV-SWA-007).

**Restrictions** (KV-CHUNK-003): vLLM 0.33.0 rejects EAGLE with chunked local
attention and requires its block size to equal the hit alignment (no
different block sizes in the hybrid model).
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import INPUT_VALIDATION, defines, rule

CHAPTER = "chunked_local"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"

KV_CHUNK_001 = rule(
    "KV-CHUNK-001",
    "The hit is null blocks before the chunk start, then cached blocks",
    """With start = floor(max_length / chunk) * chunk (0 when max_length is 0), the hit has
    start // block_size null blocks followed by the longest run of cached blocks from block
    start // block_size, up to max_length // block_size blocks in all.""",
    source=f"{STKV} ChunkedLocalAttentionManager.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_CHUNK_002 = rule(
    "KV-CHUNK-002",
    "Skipped tokens are the whole chunks before the current one",
    """After n computed tokens get_num_skipped_tokens(n) == floor(n / chunk) * chunk.""",
    source=f"{STKV} ChunkedLocalAttentionManager.get_num_skipped_tokens",
    chapter=CHAPTER,
    judged_by=("manager",),
    needs=("kv_cache_groups", "skipped_tokens"),
)
KV_CHUNK_003 = rule(
    "KV-CHUNK-003",
    "No EAGLE, and the block size equals the alignment",
    """A chunked-local group cannot be combined with EAGLE, and its block size must equal
    the cache-hit alignment (the scheduler block size in a hybrid model). kvoracle rejects
    such configurations with a ConfigError naming this rule.""",
    source=f"{STKV} ChunkedLocalAttentionManager.find_longest_cache_hit (asserts)",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)


@icontract.require(lambda chunk: chunk > 0, enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length, block_size, chunk:
                  result == (max_length // chunk * chunk) // block_size, enabled=ENABLED)
@defines(KV_CHUNK_001)
def num_null_blocks(max_length: int, block_size: int, chunk: int) -> int:
    """Null blocks at the head of a hit bounded by ``max_length``."""
    start = max_length // chunk * chunk if max_length > 0 else 0
    return start // block_size


@icontract.require(lambda chunk: chunk > 0, enabled=ENABLED)
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result % block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length, block_size, chunk:
                  result >= num_null_blocks(max_length, block_size, chunk) * block_size, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: result <= max(max_length, 0), enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, chunk: all(
    cached[j] for j in range(num_null_blocks(max_length, block_size, chunk),
                             min(result // block_size, len(cached)))), enabled=ENABLED)
@defines(KV_CHUNK_001)
def hit_length(cached: tuple[bool, ...], max_length: int, block_size: int, chunk: int) -> int:
    """The chunked-local hit in tokens."""
    max_blocks = max_length // block_size
    blocks = num_null_blocks(max_length, block_size, chunk)
    while blocks < max_blocks and blocks < len(cached) and cached[blocks]:
        blocks += 1
    return blocks * block_size


@icontract.require(lambda chunk: chunk > 0, enabled=ENABLED)
@icontract.require(lambda num_computed_tokens: num_computed_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_computed_tokens, chunk:
                  result % chunk == 0 and 0 <= num_computed_tokens - result < chunk, enabled=ENABLED)
@defines(KV_CHUNK_002)
def num_skipped_tokens(num_computed_tokens: int, chunk: int) -> int:
    """Tokens in the chunks before the current one."""
    return num_computed_tokens // chunk * chunk
