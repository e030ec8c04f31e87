"""Chapter 3 -- Full attention.

In a full-attention group every token attends to every earlier token, so a
cached prefix is usable only if *all* of it is cached. The longest cache hit
of a request is therefore the longest run of its block hashes, from the
first, whose cache keys are all present -- a missing block ends the run,
because every later hash chains over it and cannot be valid either.

The hit is bounded: it may cover at most ``max_length`` tokens, so at most
``max_length // block_size`` blocks are examined. It is block-aligned by
construction.

**EAGLE.** A speculative drafter such as EAGLE needs the hidden states of the
last tokens before the generation point, which only a recomputation gives.
With EAGLE on, the last matched block is dropped from a non-empty hit (one
block, not one per lookup pass; see the hybrid chapter for where that
matters).

**Alignment.** The hit length is rounded down to a multiple of
``alignment_tokens``; for a single group that is the block size, so rounding
changes nothing. (Fine-grained "partial" hits below the block size exist in
vLLM 0.33.0 only for hybrid models with Mamba groups; they are out of this
chapter's scope.)
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import defines, rule

CHAPTER = "full_attention"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"

KV_FULL_001 = rule(
    "KV-FULL-001",
    "The longest hit is the longest cached run from the start",
    """The hit is the longest run of consecutive block hashes, starting at block 0, whose
    cache keys are all cached, examining at most max_length // block_size blocks.""",
    source=f"{STKV} FullAttentionManager.find_longest_cache_hit (phase 1)",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_FULL_002 = rule(
    "KV-FULL-002",
    "Hit blocks are the blocks a lookup returns",
    """Hit block j is the block a lookup of block hash j returns (the first block cached
    under the key, KV-POOL-009).""",
    source=f"{STKV} FullAttentionManager.find_longest_cache_hit; block_pool.py get_cached_block",
    chapter=CHAPTER,
    needs=("exact_block_ids",),
    judged_by=("manager", "hybrid"),
)
KV_FULL_003 = rule(
    "KV-FULL-003",
    "EAGLE drops the last matched block once",
    """With EAGLE on, a non-empty hit loses its last block (hit length minus one block);
    an empty hit stays empty.""",
    source=f"{STKV} FullAttentionManager.find_longest_cache_hit (drop_eagle_block)",
    chapter=CHAPTER,
    needs=("eagle",),
    judged_by=("manager",),
)
KV_FULL_004 = rule(
    "KV-FULL-004",
    "The hit is aligned and bounded",
    """The hit length is a multiple of alignment_tokens (the block size for one group),
    at most max_length, and equals the number of hit blocks times the block size.""",
    source=f"{STKV} FullAttentionManager.find_longest_cache_hit (round down, trim)",
    chapter=CHAPTER,
    judged_by=("manager",),
)
KV_FULL_005 = rule(
    "KV-FULL-005",
    "The hit length is monotone",
    """For a fixed cache, raising max_length never shortens the hit, and caching more keys
    never shortens it.""",
    source="consequence of KV-FULL-001",
    chapter=CHAPTER,
    judged_by=("manager",),
)


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length, block_size: 0 <= result * block_size <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, cached: all(cached[:result]), enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size:
                  result == len(cached) or result == max_length // block_size
                  or not cached[result], enabled=ENABLED)
@defines(KV_FULL_001)
def longest_cached_run(cached: tuple[bool, ...], max_length: int, block_size: int) -> int:
    """Number of leading blocks hit, before the EAGLE drop.

    ``cached[j]`` says whether block hash ``j`` of the request is cached.
    """
    limit = min(len(cached), max_length // block_size)
    run = 0
    while run < limit and cached[run]:
        run += 1
    return run


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result % block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: 0 <= result <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, use_eagle:
                  use_eagle or result == longest_cached_run(cached, max_length, block_size)
                  * block_size, enabled=ENABLED)
@defines(KV_FULL_001, KV_FULL_003, KV_FULL_004)
def full_attention_hit_length(
    cached: tuple[bool, ...], max_length: int, block_size: int, use_eagle: bool
) -> int:
    """The full-attention hit length in tokens, after the EAGLE drop."""
    blocks = longest_cached_run(cached, max_length, block_size)
    if use_eagle and blocks > 0:
        blocks -= 1
    return blocks * block_size


@icontract.require(lambda alignment_tokens: alignment_tokens > 0, enabled=ENABLED)
@icontract.require(lambda hit_length: hit_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit_length, alignment_tokens:
                  result % alignment_tokens == 0 and 0 <= hit_length - result < alignment_tokens, enabled=ENABLED)
@defines(KV_FULL_004)
def align_hit(hit_length: int, alignment_tokens: int) -> int:
    """Round a hit length down to the alignment."""
    return hit_length - hit_length % alignment_tokens


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment, block_size: alignment > 0 and alignment % block_size == 0,
                   enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result % alignment == 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: 0 <= result <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, cached, block_size, drop_eagle:
                  all(cached[:result // block_size + (1 if drop_eagle and result > 0 else 0)]), enabled=ENABLED)
@defines(KV_FULL_001, KV_FULL_003, KV_FULL_004)
def aligned_hit_length(cached: tuple[bool, ...], max_length: int, block_size: int,
                       drop_eagle: bool, alignment: int) -> int:
    """The full-attention hit of one group inside a hybrid model, in tokens.

    The run is found in this group's block size; the EAGLE drop removes one block; the
    result is then rounded down to the alignment (the scheduler block size), which is a
    multiple of this group's block size.
    """
    length = longest_cached_run(cached, max_length, block_size) * block_size
    if drop_eagle and length > 0:
        length -= block_size
    return align_hit(length, alignment)
