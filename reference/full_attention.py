"""The full-attention single-type manager (spec chapters ``full_attention`` and ``lifecycle``)."""

from __future__ import annotations

from collections.abc import Sequence

import icontract

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import full_attention as spec
from kvoracle.spec import lifecycle

from .block import CacheKey, KVCacheBlock
from .block_pool import BlockPool, _is_first_cached
from .contracts import ENABLED
from .request import Request


# The lookups below go through the pool's non-public ``_cached_block``, which icontract
# does not wrap: a lookup changes nothing, so checking the pool's O(num_blocks) class
# invariants around each one (and again inside these postconditions) only costs time.
# KV-POOL-009, the contract of the public ``get_cached_block``, is checked on the hit
# blocks by a postcondition of ``find_longest_cache_hit``.
def _cached_flags(pool: BlockPool, hashes: Sequence[bytes], group_id: int) -> tuple[bool, ...]:
    return tuple(pool._cached_block((h, group_id)) is not None for h in hashes)


class FullAttentionManager:
    """Block tables of one full-attention group.

    ``req_to_blocks`` maps a request id to its block table;
    ``num_cached_block`` how many leading blocks of it are already cached.
    """

    def __init__(self, block_size: int, pool: BlockPool, group_id: int = 0) -> None:
        self.block_size = block_size
        self.pool = pool
        self.group_id = group_id
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- lookup ----------------------------------------------------------------------
    @icontract.ensure(lambda self, block_hashes, max_length, use_eagle, result:
                      result[1] == spec.full_attention_hit_length(
                          _cached_flags(self.pool, block_hashes, self.group_id),
                          max_length, self.block_size, use_eagle),
                      "KV-FULL-001/KV-FULL-003: hit = longest cached run, minus EAGLE's block",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, result: result[1] == len(result[0]) * self.block_size,
                      "KV-FULL-004: the hit length is the number of hit blocks times block size",
                      enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, result: all(
        block is self.pool._cached_block((h, self.group_id))
        for block, h in zip(result[0], block_hashes)),
        "KV-FULL-002: hit blocks are the blocks a lookup returns", enabled=ENABLED)
    @icontract.ensure(lambda self, block_hashes, result: all(
        _is_first_cached(self.pool, (h, self.group_id), block)
        for block, h in zip(result[0], block_hashes)),
        "KV-POOL-009: a lookup returns the first block cached under the key", enabled=ENABLED)
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               use_eagle: bool) -> tuple[list[KVCacheBlock], int]:
        hit: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            block = self.pool._cached_block((block_hash, self.group_id))
            if block is None:
                break  # KV-FULL-001: a miss ends the run (the chain cannot resume)
            hit.append(block)
        if use_eagle and hit:
            hit.pop()  # KV-FULL-003
        return hit, len(hit) * self.block_size

    # -- allocation ------------------------------------------------------------------
    def num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                               new_computed_blocks: Sequence[KVCacheBlock]) -> int:
        """KV-LIFE-003: free blocks this allocation consumes."""
        num_evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return lifecycle.num_blocks_to_allocate(
            num_tokens, self.block_size, len(self.req_to_blocks.get(request_id, ())),
            len(new_computed_blocks), num_evictable)

    def add_computed_blocks(self, request_id: str,
                            new_computed_blocks: Sequence[KVCacheBlock]) -> None:
        """Touch the hit blocks and put them at the head of a new request's table."""
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, "hits are only added to a request without blocks"
        self.pool.touch(new_computed_blocks)  # KV-LIFE-006: before any new block is popped
        table.extend(new_computed_blocks)
        # The hits are cached already: never cache them again.
        self.num_cached_block[request_id] = len(table)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new = lifecycle.cdiv(num_tokens, self.block_size) - len(table)
        if num_new <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(num_new)
        table.extend(new_blocks)
        return new_blocks

    # -- caching ---------------------------------------------------------------------
    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """KV-LIFE-007: cache every full block up to ``num_tokens`` tokens."""
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = lifecycle.num_full_blocks_to_cache(
            num_tokens, len(request.block_hashes), request.hash_block_size, self.block_size)
        if num_cached >= num_full:
            return
        table = self.req_to_blocks[request.request_id]
        scale = self.block_size // request.hash_block_size
        pairs: list[tuple[KVCacheBlock, CacheKey]] = []
        for index in range(num_cached, min(num_full, len(table))):
            block = table[index]
            if block.is_null:
                continue  # KV-POOL-002
            block_hash = request.block_hashes[(index + 1) * scale - 1]  # KV-HASH-006
            pairs.append((block, (block_hash, self.group_id)))
        if pairs:
            # One pool operation for the whole run (same per-block contracts, one
            # invariant check around the batch).
            self.pool.cache_blocks(pairs)
        self.num_cached_block[request.request_id] = num_full

    # -- free ------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """KV-LIFE-009 / KV-POOL-007: release the table tail first and forget the request."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        order = pool_spec.free_order(tuple(block.block_id for block in table))
        self.pool.free_blocks([self.pool.blocks[block_id] for block_id in order])

    # -- cascade attention -----------------------------------------------------------
    def num_common_prefix_blocks(self, request_id: str) -> int:
        """KV-LIFE-011: leading blocks every request holding blocks shares."""
        table = self.req_to_blocks.get(request_id, [])
        return lifecycle.num_common_prefix_blocks(
            tuple(block.ref_cnt for block in table), len(self.req_to_blocks))
