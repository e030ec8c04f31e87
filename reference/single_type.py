"""One KV-cache group's block tables: the single-type manager (spec chapter ``hybrid_lifecycle``).

A :class:`SingleTypeManager` holds, for one KV-cache group, every request's block table and
how many of its leading blocks are cached. The manager (:mod:`.manager`) runs each step of an
allocation over all its groups in KV-HLC-001's order; this module is one group's part of each
step: skipped blocks dropped (KV-SWA-007), the free blocks the group consumes counted
(KV-HLC-002), a hit adopted (KV-HLC-003), new blocks taken, reachable blocks cached
(KV-HLC-005) and the table freed tail first (KV-HLC-004). A model with one full-attention
group is the unitary case of the same code.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle
from kvoracle.spec import sliding_window as swa_spec

from .block import KVCacheBlock
from .block_pool import BlockPool
from .hybrid import HybridCoordinator
from .request import Request


class SingleTypeManager:
    """The block tables of one KV-cache group, of any attention kind.

    vLLM has one single-type manager class per attention kind; here one class serves every
    kind, and what differs between kinds is decided by the spec's functions of the kind
    (skipped tokens, reachable blocks, null placement).

    ``req_to_blocks`` maps a request to its table; a request is *tracked* once it is
    in ``num_cached_block`` (it adopted a hit or cached a block), which is what
    KV-HLC-002 distinguishes.
    """

    def __init__(self, group_id: int, kind: str, block_size: int, param: int, pool: BlockPool,
                 coordinator: HybridCoordinator, eagle: bool, num_speculative_blocks: int = 0) -> None:
        self.group_id = group_id
        self.kind = kind
        self.block_size = block_size
        self.param = param
        self.pool = pool
        self.coordinator = coordinator
        self.eagle = eagle
        #: A Mamba group's blocks for speculative decoding, beyond the request's slots (KV-HLC-008).
        self.num_speculative_blocks = num_speculative_blocks
        #: Whether a Mamba group frees its skipped blocks as if its drafts were rejected
        #: (KV-HLC-009, a declared refinement of KV-HLC-008).
        self.mamba_free_lag = False
        #: With one group vLLM's unitary coordinator hashes and aligns at the block size and
        #: caches every computed token; with several, hits align to the scheduler block size.
        self.several_groups = len(coordinator.config.kv_cache_specs) > 1
        self.alignment = coordinator.config.scheduler_block_size if self.several_groups else block_size
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return spec.skipped_tokens(self.kind, self.param, num_computed_tokens)

    def slots(self, num_tokens: int) -> int:
        """The slots this group allocates for ``num_tokens`` tokens (KV-HLC-008 for Mamba)."""
        if self.kind == hybrid_spec.MAMBA:
            return spec.mamba_slots(num_tokens, self.block_size, self.num_speculative_blocks)
        return num_tokens

    # -- the steps of one allocation (KV-HLC-001) --------------------------------------
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """KV-SWA-007: free the skipped blocks right to left, up to the first null."""
        if self.kind == hybrid_spec.MAMBA and self.mamba_free_lag:
            num_computed_tokens = spec.lagging_mamba_tokens(num_computed_tokens, self.num_speculative_blocks)
        skipped = self.skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        # vLLM reads the table through a defaultdict: a request with no table gets an
        # empty one here, which is invisible (empty tables are not reported).
        table = self.req_to_blocks.setdefault(request_id, [])
        indices = swa_spec.blocks_to_free(tuple(b.is_null for b in table), skipped // self.block_size)
        freed = [table[i] for i in indices]
        for i in indices:
            table[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)

    def blocks_to_allocate(self, request_id: str, num_tokens: int, hits: Sequence[KVCacheBlock],
                           num_computed_tokens: int) -> int:
        """KV-HLC-002."""
        tracked = request_id in self.num_cached_block
        evictable = () if tracked else tuple(b.ref_cnt == 0 and not b.is_null for b in hits)
        return spec.group_blocks_to_allocate(
            self.slots(num_tokens), self.block_size, len(self.req_to_blocks.get(request_id, ())), evictable,
            self.skipped_tokens(num_computed_tokens), tracked)

    def adopt_hit(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int) -> None:
        """KV-HLC-003: nulls for the skipped positions, the later hits touched and appended."""
        if self.kind == spec.CROSS_ATTENTION:
            return  # KV-CROSS-002: nothing to adopt, and the request stays untracked
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, "hits are only adopted by a request without blocks"
        skipped_blocks = self.skipped_tokens(num_computed_tokens) // self.block_size
        kept = list(hits[skipped_blocks:])
        self.pool.touch(kept)  # KV-LIFE-006: before any group takes a new block
        table.extend([self.pool.null_block] * skipped_blocks + kept)
        self.num_cached_block[request_id] = len(table)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new = lifecycle.cdiv(self.slots(num_tokens), self.block_size) - len(table)
        if num_new <= 0:
            return []
        blocks = self.pool.get_new_blocks(num_new)
        table.extend(blocks)
        return blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """KV-HLC-005: cache the reachable non-null full blocks up to the cacheable tokens."""
        if self.several_groups:  # KV-HYB-010
            num_tokens = hybrid_spec.num_cacheable_tokens(num_tokens, self.alignment, self.eagle, self.block_size)
        self._cache_full_blocks(request, num_tokens)
        if self.kind == hybrid_spec.FULL and self.block_size != request.hash_block_size:
            self._register_partial_tail(request, num_tokens)

    def _register_partial_tail(self, request: Request, num_tokens: int) -> None:
        """KV-HLC-006: the block holding the prompt's last hash boundary gets a partial entry."""
        boundary = spec.partial_tail_boundary(request.num_prompt_tokens, len(request.block_hashes),
                                              request.hash_block_size, self.block_size, self.eagle)
        table = self.req_to_blocks.get(request.request_id, [])
        if boundary == 0 or boundary > num_tokens or boundary // self.block_size >= len(table):
            return
        key = (request.block_hashes[boundary // request.hash_block_size - 1], self.group_id)
        self.pool.register_partial(table[boundary // self.block_size], key)

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_hashed = len(request.block_hashes) * request.hash_block_size
        num_full = min(num_tokens, num_hashed) // self.block_size
        if num_cached >= num_full:
            return  # nothing new: the request stays untracked if it was
        table = self.req_to_blocks[request.request_id]
        indices = spec.blocks_to_cache(self.kind, self.param, num_cached, num_full, self.block_size,
                                       self.alignment, self.eagle, tuple(b.is_null for b in table))
        pairs = [(table[i], (self.coordinator.view_hash(request.block_hashes, self.block_size, i),
                             self.group_id)) for i in indices]
        if pairs:
            self.pool.cache_blocks(pairs)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        """KV-HLC-004: this group's table, tail first, without its leading nulls."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        order = spec.free_order((tuple(b.block_id for b in table),))
        self.pool.free_blocks([self.pool.blocks[block_id] for block_id in order])

    # -- cascade attention -------------------------------------------------------------
    def num_common_prefix_blocks(self, request_id: str) -> int:
        """KV-LIFE-011: leading blocks of the request's table that every request holding blocks
        in this group shares. Only full attention shares whole prefixes; other kinds answer 0."""
        if self.kind != hybrid_spec.FULL:
            return 0
        table = self.req_to_blocks.get(request_id, [])
        return lifecycle.num_common_prefix_blocks(tuple(block.ref_cnt for block in table),
                                                  len(self.req_to_blocks))
