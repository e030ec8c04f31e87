"""Chapter 1 -- Block hashing.

Prefix caching finds reusable KV blocks by *content*, not by request: every
full block of a request's tokens gets a hash, and a block cached under that
hash can serve any later request whose tokens produce the same hash.

The hashes are *chained*. The hash of block ``i`` covers the hash of block
``i - 1`` (its parent), the block's own tokens, and the block's extra keys
(a LoRA adapter name, a cache salt, ...). The first block's parent is a fixed
seed value, ``NONE_HASH``. Because of the chain, a hash identifies the whole
prefix up to the end of its block, not just one block's tokens: two requests
share hash ``i`` exactly when their first ``(i + 1) * hash_block_size`` tokens
and extra keys agree.

Only full blocks are hashed. A request of ``n`` tokens has
``n // hash_block_size`` hashes, computed incrementally: appending tokens adds
hashes at the end and never changes an existing one.

A cached block is found under a *cache key*, the pair (hash, KV-cache group
id): the same tokens cached by two groups (say, a full-attention group and a
sliding-window group) are two different keys.

Hashes are computed at ``hash_block_size`` granularity. A group whose block
size is ``k * hash_block_size`` sees them through a *block-size view*: its
block ``j`` is identified by hash unit ``(j + 1) * k - 1``, the last hash unit
inside the block, which already covers the whole prefix.

kvoracle's reference hashes with SHA-256 over a canonical encoding. Engines
may use any collision-resistant function; conformance compares cache keys by
the prefixes they identify, never by hash bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import icontract

from .contracts import ENABLED
from .registry import defines, rule

CHAPTER = "hashing"
VLLM_UTILS = "vllm/v1/core/kv_cache_utils.py"

KV_HASH_001 = rule(
    "KV-HASH-001",
    "Block hashes are chained from NONE_HASH",
    """The hash of full block i is H(parent, tokens_i, extra_keys_i) where parent is
    the hash of block i-1, and NONE_HASH (a fixed seed) for block 0.""",
    source=f"{VLLM_UTILS} hash_block_tokens, init_none_hash, get_request_block_hasher",
    chapter=CHAPTER,
    needs=("request_hashes",),
    judged_by=("manager",),
)
KV_HASH_002 = rule(
    "KV-HASH-002",
    "Only full blocks are hashed",
    """A request of n tokens has exactly n // hash_block_size block hashes; a
    partially filled block has none.""",
    source=f"{VLLM_UTILS} get_request_block_hasher (\"We only hash full blocks\")",
    chapter=CHAPTER,
    needs=("request_hashes",),
    judged_by=("manager",),
)
KV_HASH_003 = rule(
    "KV-HASH-003",
    "Hashes are extended incrementally and never rewritten",
    """Appending tokens to a request appends hashes for the blocks that became full;
    every earlier hash stays the same.""",
    source="vllm/v1/request.py Request.append_output_token_ids / update_block_hashes",
    chapter=CHAPTER,
    needs=("request_hashes",),
    judged_by=("manager",),
)
KV_HASH_004 = rule(
    "KV-HASH-004",
    "A hash identifies the whole prefix",
    """Hash i of two requests is equal iff their first (i+1)*hash_block_size tokens are
    equal and their extra keys for blocks 0..i are equal.""",
    source=f"{VLLM_UTILS} hash_block_tokens (parent hash is part of the hashed tuple)",
    chapter=CHAPTER,
    needs=("request_hashes",),
    judged_by=("manager",),
)
KV_HASH_005 = rule(
    "KV-HASH-005",
    "Cache keys are (hash, group id)",
    """A cached block is found under the pair (block hash, KV-cache group id); equal
    hashes in different groups are different keys.""",
    source=f"{VLLM_UTILS} make_block_hash_with_group_id; block_pool.py get_cached_block",
    chapter=CHAPTER,
    needs=("cache_map",),
    judged_by=("manager",),
)
KV_HASH_006 = rule(
    "KV-HASH-006",
    "Block-size view of the hash list",
    """For a group with block_size = k * hash_block_size, block j is identified by hash
    unit (j+1)*k - 1 and the view has len(hashes) // k entries.""",
    source=f"{VLLM_UTILS} BlockHashListWithBlockSize",
    chapter=CHAPTER,
    needs=("hash_block_views",),
    judged_by=("manager",),
)
KV_HASH_007 = rule(
    "KV-HASH-007",
    "Extra keys: the cache salt covers the first block, a LoRA adapter every block",
    """A non-empty cache salt enters only block 0's hash (and so, by chaining, every later
    hash); an empty salt is no salt. A LoRA adapter enters every block's hash (vLLM 0.33.0
    keys it by name and path; kvoracle's requests carry one name per adapter). Requests
    with different salts never share a hash.""",
    source=f"{VLLM_UTILS} generate_block_hash_extra_keys (salt only when start_token_idx == 0 "
    "and the salt is truthy), _gen_lora_extra_hash_keys",
    chapter=CHAPTER,
    needs=("request_hashes", "cache_salt"),
    judged_by=("manager",),
)

#: The parent of block 0: a fixed seed, so independent processes agree on hashes.
NONE_HASH: bytes = hashlib.sha256(b"kvoracle-none-hash").digest()


@defines(KV_HASH_001, KV_HASH_004)
def hash_block(parent: bytes, tokens: tuple[int, ...], extra_keys: tuple[str, ...]) -> bytes:
    """The chained hash of one full block (SHA-256 over a canonical encoding)."""
    payload = repr((tokens, extra_keys)).encode()
    return hashlib.sha256(parent + payload).digest()


@defines(KV_HASH_007)
def block_extra_keys(block_index: int, cache_salt: str | None, lora_name: str | None
                     ) -> tuple[str, ...]:
    """Extra keys of block ``block_index``: the LoRA name on every block, the salt on block 0."""
    keys: tuple[str, ...] = ()
    if lora_name is not None:
        keys += ("lora:" + lora_name,)
    if cache_salt and block_index == 0:  # "" is no salt, as in vLLM 0.33.0
        keys += ("salt:" + cache_salt,)
    return keys


@icontract.require(lambda hash_block_size: hash_block_size > 0, enabled=ENABLED)
@icontract.require(lambda num_tokens: num_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, hash_block_size:
                  result * hash_block_size <= num_tokens < (result + 1) * hash_block_size, enabled=ENABLED)
@defines(KV_HASH_002)
def num_block_hashes(num_tokens: int, hash_block_size: int) -> int:
    """How many hashes a request of ``num_tokens`` tokens has: one per full block."""
    return num_tokens // hash_block_size


@defines(KV_HASH_001, KV_HASH_002, KV_HASH_003)
def extend_block_hashes(
    hashes: tuple[bytes, ...],
    tokens: tuple[int, ...],
    hash_block_size: int,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> tuple[bytes, ...]:
    """``hashes`` extended with the hashes of every block of ``tokens`` that became full.

    ``hashes`` must be the hashes of a prefix of ``tokens``; they are kept as they are.
    """
    parent = hashes[-1] if hashes else NONE_HASH
    return tuple(hashes) + hash_blocks(
        parent, tokens, len(hashes), num_block_hashes(len(tokens), hash_block_size),
        hash_block_size, cache_salt, lora_name)


def hash_blocks(
    parent: bytes,
    tokens: Sequence[int],
    start: int,
    stop: int,
    hash_block_size: int,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> tuple[bytes, ...]:
    """The chained hashes of full blocks ``start .. stop - 1`` of ``tokens``.

    ``parent`` is the hash of block ``start - 1`` (``NONE_HASH`` when ``start`` is 0).
    The loop of :func:`extend_block_hashes`, which a request uses to hash only the
    blocks that became full since its last hash (KV-HASH-003).
    """
    out: list[bytes] = []
    for index in range(start, stop):
        first = index * hash_block_size
        block_tokens = tuple(tokens[first:first + hash_block_size])
        parent = hash_block(parent, block_tokens, block_extra_keys(index, cache_salt, lora_name))
        out.append(parent)
    return tuple(out)


@icontract.require(lambda scale: scale > 0, enabled=ENABLED)
@icontract.require(lambda block_index: block_index >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, block_index, scale:
                  block_index * scale <= result < (block_index + 1) * scale, enabled=ENABLED)
@defines(KV_HASH_006)
def block_size_view_index(block_index: int, scale: int) -> int:
    """The hash unit that identifies block ``block_index`` of a group ``scale`` times coarser."""
    return (block_index + 1) * scale - 1


@icontract.require(lambda scale: scale > 0, enabled=ENABLED)
@icontract.require(lambda num_hashes: num_hashes >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_hashes, scale:
                  result == 0 or block_size_view_index(result - 1, scale) < num_hashes, enabled=ENABLED)
@icontract.ensure(lambda result, num_hashes, scale: block_size_view_index(result, scale) >= num_hashes, enabled=ENABLED)
@defines(KV_HASH_006)
def block_size_view_length(num_hashes: int, scale: int) -> int:
    """How many coarse blocks a list of ``num_hashes`` fine hashes identifies."""
    return num_hashes // scale


@icontract.require(lambda hash_block_size: hash_block_size > 0, enabled=ENABLED)
@defines(KV_HASH_004)
def prefixes_share_hash(
    tokens_a: tuple[int, ...], tokens_b: tuple[int, ...], index: int, hash_block_size: int
) -> bool:
    """Whether two salt-free requests have the same hash at ``index`` (both must have it)."""
    end = (index + 1) * hash_block_size
    return len(tokens_a) >= end and len(tokens_b) >= end and tokens_a[:end] == tokens_b[:end]
