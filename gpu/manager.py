"""A full-attention KV-cache manager over :class:`TorchBlockPool` (one KV-cache group).

The manager layer of chapters ``full_attention`` and ``lifecycle`` -- block tables,
prefix-cache hits, ``allocate_slots`` and caching of full blocks -- written
against the tensor pool. Block tables are 1-D int64 tensors on the pool's
device; the block counts it needs come from the spec's pure functions
(:mod:`kvoracle.spec.lifecycle`), the hashes from :mod:`kvoracle.spec.hashing`.
It does not share code with :mod:`kvoracle.reference`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvoracle.spec import hashing, lifecycle

from .allocator import TorchBlockPool

#: The group id of the one full-attention group.
GROUP = 0


class TorchRequest:
    """What the manager knows of a request: its tokens, hashes and key ids."""

    __slots__ = ("block_key_ids", "cache_salt", "hashes", "num_computed_tokens", "request_id",
                 "tokens")

    def __init__(self, request_id: str, prompt: Sequence[int], cache_salt: str | None) -> None:
        if not prompt:
            raise ValueError("KV-CFG-005: a request needs at least one prompt token")
        self.request_id = request_id
        self.tokens: list[int] = list(prompt)
        self.cache_salt = cache_salt
        #: kvoracle's chained hashes, one per full hash block (KV-HASH-001/002).
        self.hashes: tuple[bytes, ...] = ()
        #: The pool's key id of each full block (block-size view of the hashes, KV-HASH-006).
        self.block_key_ids: list[int] = []
        self.num_computed_tokens = 0


class TorchKVCacheManager:
    """``get_computed_blocks`` / ``allocate_slots`` / ``free`` over a tensor block pool."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 hash_block_size: int | None = None, enable_caching: bool = True,
                 use_eagle: bool = False, device: torch.device | str | None = None,
                 pool: TorchBlockPool | None = None) -> None:
        self.block_size = block_size
        self.hash_block_size = hash_block_size or block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.pool = pool if pool is not None else TorchBlockPool(num_blocks, enable_caching,
                                                                 device)
        self.device = self.pool.device
        self.requests: dict[str, TorchRequest] = {}
        #: Request id -> block table (int64 tensor); only requests holding blocks.
        self.tables: dict[str, torch.Tensor] = {}
        #: Request id -> how many leading blocks of its table are cached already.
        self.num_cached_blocks: dict[str, int] = {}

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> TorchRequest:
        request = TorchRequest(request_id, prompt, cache_salt)
        self.requests[request_id] = request
        self._rehash(request)
        return request

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        request = self.requests[request_id]
        request.tokens.extend(tokens)
        self._rehash(request)

    def _rehash(self, request: TorchRequest) -> None:
        """Hash the blocks that became full (KV-HASH-003: earlier hashes are kept)."""
        request.hashes = hashing.extend_block_hashes(
            request.hashes, tuple(request.tokens), self.hash_block_size, request.cache_salt)
        scale = self.block_size // self.hash_block_size
        for index in range(len(request.block_key_ids), len(request.hashes) // scale):
            block_hash = request.hashes[hashing.block_size_view_index(index, scale)]
            request.block_key_ids.append(self.pool.key_id((block_hash, GROUP)))

    def forget(self, request_id: str) -> None:
        """Drop a finished request (after :meth:`free`)."""
        self.requests.pop(request_id, None)

    # -- lookup --------------------------------------------------------------------------
    def get_computed_blocks(self, request_id: str, max_cache_hit_length: int | None = None
                            ) -> tuple[torch.Tensor, int]:
        """KV-FULL-001..004: the longest run of cached leading blocks, as (blocks, tokens)."""
        request = self.requests[request_id]
        none = torch.empty(0, dtype=torch.int64, device=self.device)
        if not self.enable_caching:
            return none, 0  # KV-LIFE-002
        if max_cache_hit_length is None:
            max_cache_hit_length = lifecycle.max_cache_hit_length(len(request.tokens))
        if max_cache_hit_length < 0:
            raise ValueError("KV-CFG-005: max_cache_hit_length must be >= 0")
        wanted = request.block_key_ids[:max_cache_hit_length // self.block_size]
        if not wanted:
            return none, 0
        found = self.pool.lookup(wanted)
        misses = (found < 0).nonzero()
        run = int(misses[0]) if misses.numel() else found.numel()  # a miss ends the run
        if self.use_eagle and run:
            run -= 1  # KV-FULL-003
        return found[:run], run * self.block_size

    # -- allocation ----------------------------------------------------------------------
    def allocate_slots(self, request_id: str, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, hit: torch.Tensor | None = None,
                       num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False
                       ) -> torch.Tensor | None:
        """Slots for a hit, new tokens and lookahead tokens; ``None`` when the pool is short."""
        for name, value in (("num_new_tokens", num_new_tokens),
                            ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens)):
            if value < 0:
                raise ValueError(f"KV-CFG-005: {name} must be >= 0, got {value}")
        if lifecycle.allocation_is_empty(num_new_tokens, num_new_computed_tokens):
            raise ValueError("KV-LIFE-013: num_new_tokens must be > 0 when no computed "
                             "tokens are adopted")
        request = self.requests[request_id]
        hit = hit if hit is not None and num_new_computed_tokens else \
            torch.empty(0, dtype=torch.int64, device=self.device)
        table = self.tables.get(request_id)
        if table is not None and hit.numel():
            raise ValueError("a running request cannot adopt new prefix-cache hits")
        held = 0 if table is None else table.numel()
        slots = lifecycle.num_slots(request.num_computed_tokens, num_new_computed_tokens,
                                    num_new_tokens, num_lookahead_tokens, self.max_model_len)
        evictable = self.pool.num_free_among(hit)  # free hits leave the queue when touched
        needed = lifecycle.num_blocks_to_allocate(slots, self.block_size, held, hit.numel(),
                                                  evictable)
        if needed > self.pool.num_free_blocks():
            return None  # KV-LIFE-003/004: nothing changed

        if hit.numel():
            self.pool.touch(hit)  # KV-LIFE-006: before any new block is popped
            table = hit.clone()
            self.num_cached_blocks[request_id] = hit.numel()
        elif table is None:
            table = torch.empty(0, dtype=torch.int64, device=self.device)
        num_new_blocks = lifecycle.cdiv(slots, self.block_size) - table.numel()
        new = self.pool.allocate(max(num_new_blocks, 0))
        self.tables[request_id] = torch.cat([table, new]) if new.numel() else table

        if not delay_cache_blocks and self.enable_caching:  # KV-LIFE-008/012
            self._cache_full_blocks(request, lifecycle.num_tokens_to_cache(
                request.num_computed_tokens, num_new_computed_tokens, num_new_tokens,
                len(request.tokens)))
        return new

    def _cache_full_blocks(self, request: TorchRequest, num_tokens: int) -> None:
        """KV-LIFE-007: cache every full block up to ``num_tokens`` tokens, in one batch."""
        first = self.num_cached_blocks.get(request.request_id, 0)
        num_full = lifecycle.num_full_blocks_to_cache(
            num_tokens, len(request.hashes), self.hash_block_size, self.block_size)
        if first >= num_full:
            return
        table = self.tables[request.request_id]
        last = min(num_full, table.numel())
        blocks = table[first:last]
        keys = torch.tensor(request.block_key_ids[first:last], dtype=torch.int64,
                            device=self.device)
        real = blocks != 0  # KV-POOL-002: a null block is never cached
        self.pool.cache(blocks[real], keys[real])
        self.num_cached_blocks[request.request_id] = num_full

    # -- release -------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """KV-POOL-007 / KV-LIFE-009: release the table tail first and forget the table."""
        table = self.tables.pop(request_id, None)
        self.num_cached_blocks.pop(request_id, None)
        if table is not None and table.numel():
            self.pool.free(table.flip(0))  # null blocks are skipped by the pool

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        self.pool.evict(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- queries -------------------------------------------------------------------------
    def block_table(self, request_id: str) -> torch.Tensor:
        table = self.tables.get(request_id)
        return table if table is not None else torch.empty(0, dtype=torch.int64,
                                                           device=self.device)
