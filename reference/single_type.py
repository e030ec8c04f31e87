"""One KV-cache group's block tables: the single-type manager (spec chapters ``hybrid_lifecycle``
and ``mamba``).

A :class:`SingleTypeManager` holds, for one KV-cache group, every request's block table and
how many of its leading blocks are cached. The manager (:mod:`.manager`) runs each step of an
allocation over all its groups in KV-HLC-001's order; this module is one group's part of each
step: skipped blocks dropped (KV-SWA-007), the free blocks the group consumes counted
(KV-HLC-002), a hit adopted (KV-HLC-003), new blocks taken, reachable blocks cached
(KV-HLC-005) and the table freed tail first (KV-HLC-004). A model with one full-attention
group is the unitary case of the same code.

A Mamba group with prefix caching (vLLM's "align" mode, chapter 8) keeps a few state pages
at positions of a mostly null table; its steps are the chapter's: states retired
(KV-MAMBA-010), the need (KV-MAMBA-007 to KV-MAMBA-009), a checkpoint reserved
(KV-MAMBA-006), the table grown with its speculative pages moved (KV-MAMBA-004,
KV-MAMBA-005), pages cached (KV-MAMBA-011) and freed (KV-MAMBA-012).
"""

from __future__ import annotations

from collections.abc import Sequence

import icontract

from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec import sliding_window as swa_spec

from .block import CacheKey, KVCacheBlock
from .block_pool import BlockPool
from .contracts import ENABLED
from .hybrid import HybridCoordinator
from .request import Request


def _align_layout_taken(group: SingleTypeManager, request_id: str, old: tuple[int, ...], main_tokens: int,
                        checkpoint: bool, allocated: bool, copy_entry: int, result: list[KVCacheBlock]) -> bool:
    """KV-MAMBA-004/KV-MAMBA-005: the table is the spec's layout of the old one, and the
    allocation returns its new tail; KV-MAMBA-023: a consumer's copy (``copy_entry`` >= 0 on a
    first allocation) stands in the shared entry and is returned first."""
    table = group.req_to_blocks.get(request_id, [])
    layout = list(mamba_spec.align_layout(len(old), main_tokens, group.block_size, group.num_speculative_blocks,
                                          checkpoint, allocated))
    private = copy_entry >= 0 and not allocated
    if private:
        layout[copy_entry] = mamba_spec.NEW
    if len(layout) != len(table):
        return False
    for entry, block in zip(layout, table):
        if entry == mamba_spec.NULL and not block.is_null:
            return False
        if entry >= 0 and block.block_id != old[entry]:
            return False
        if entry == mamba_spec.NEW and (block.is_null or block.block_id in old):
            return False
    grew = len(layout) > len(old) or checkpoint or copy_entry >= 0
    tail = [b.block_id for b in table[len(old):]] if grew else []
    return [b.block_id for b in result] == ([table[copy_entry].block_id] if private else []) + tail


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
                 coordinator: HybridCoordinator, eagle: bool, num_speculative_blocks: int = 0, *,
                 mamba_cache_mode: str = "none", num_prefill_checkpoint_blocks: int = 0,
                 prefill_checkpoint_alignment: int = 0) -> None:
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
        self.alignment = coordinator.config.hit_alignment if self.several_groups else block_size
        #: vLLM's fine-grained partial hits are on for the model (KV-MAMBA-019): hits align to the
        #: hash block and the tokens a group caches are not rounded down.
        self.partial_hits = coordinator.config.partial_hits
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        #: A Mamba group with prefix caching: vLLM's "align" mode (chapter 8).
        self.align = kind == hybrid_spec.MAMBA and mamba_cache_mode == "align"
        #: Whether a prefill chunk may reserve a checkpoint page, and at which granularity the
        #: backend exports one (0: none) (KV-MAMBA-006).
        self.has_checkpoint_blocks = self.align and num_prefill_checkpoint_blocks > 0
        self.prefill_checkpoint_alignment = prefill_checkpoint_alignment
        #: Align-mode bookkeeping per request: whether it has allocated in this group
        #: (KV-MAMBA-005), the entry of its running state at the table's last growth and how
        #: far its states are retired (KV-MAMBA-010), the checkpoint of its current step
        #: (position, entry; KV-MAMBA-006).
        self.allocated: set[str] = set()
        self.last_state_index: dict[str, int] = {}
        self.num_retired: dict[str, int] = {}
        self.checkpoints: dict[str, tuple[int, int]] = {}
        #: Keys this group cached since the scheduler's last new step (KV-MAMBA-009).
        self.cached_this_step: set[CacheKey] = set()
        #: An align-mode group whose block is coarser than the hash block, partial hits on
        #: (KV-MAMBA-020 .. KV-MAMBA-025).
        self.fine = self.align and self.partial_hits and block_size > coordinator.config.hash_block_size
        #: Requests with a copy due at their next allocation: (entry, the shared page) -- a
        #: consumer's partial hit (KV-MAMBA-023) or a producer's partial tail (KV-MAMBA-024).
        self.copy_due: dict[str, tuple[int, KVCacheBlock]] = {}
        #: Copies queued for the runner, (source, copy), each page held one reference more until
        #: the scheduler takes them (KV-MAMBA-025).
        self.pending_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []

    @property
    def cache_alignment(self) -> int:
        """The alignment :func:`~kvoracle.spec.hybrid_lifecycle.blocks_to_cache` reads a sliding
        window's reach with; a fine-grained Mamba group, whose block is coarser than the hash
        block it aligns to, passes its own block (the function reads it for windows only)."""
        return self.block_size if self.fine else self.alignment

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
        if self.align:
            self._retire_states(request_id, num_computed_tokens)
            return
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
                           num_computed_tokens: int, main_tokens: int | None = None) -> int:
        """KV-HLC-002 (KV-MAMBA-007 in align mode, for ``main_tokens`` main tokens)."""
        if self.align:
            return self._align_need(request_id, hits, num_computed_tokens,
                                    num_tokens if main_tokens is None else main_tokens)
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
        entry = mamba_spec.shared_entry(num_computed_tokens, self.block_size) if self.fine and kept else -1
        if entry >= 0:  # KV-MAMBA-023: a partial hit; its entry is not cached, and a copy is due
            self.copy_due[request_id] = (entry, table[entry])
            self.num_cached_block[request_id] = entry

    def allocate_new_blocks(self, request_id: str, num_tokens: int, main_tokens: int | None = None
                            ) -> list[KVCacheBlock]:
        if self.align:
            return self._align_allocate(request_id, num_tokens if main_tokens is None else main_tokens)
        table = self.req_to_blocks.setdefault(request_id, [])
        num_new = lifecycle.cdiv(self.slots(num_tokens), self.block_size) - len(table)
        if num_new <= 0:
            return []
        blocks = self.pool.get_new_blocks(num_new)
        table.extend(blocks)
        return blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """KV-HLC-005: cache the reachable non-null full blocks up to the cacheable tokens."""
        if self.several_groups and not self.partial_hits:  # KV-HYB-010 (KV-MAMBA-019: no rounding)
            num_tokens = hybrid_spec.num_cacheable_tokens(num_tokens, self.alignment, self.eagle, self.block_size)
        if self.align:
            self._align_cache(request, num_tokens)
            return
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
                                       self.cache_alignment, self.eagle, tuple(b.is_null for b in table))
        pairs = [(table[i], (self.coordinator.view_hash(request.block_hashes, self.block_size, i),
                             self.group_id)) for i in indices]
        if self.align:  # KV-MAMBA-011: a checkpoint page keyed earlier is keyed at its position now
            for block, key in pairs:
                if block.cache_key is not None:
                    self.pool.rekey(block, key)
            pairs = [(block, key) for block, key in pairs if block.cache_key != key]
        if pairs:
            self.pool.cache_blocks(pairs)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        """KV-HLC-004: this group's table, tail first, without its leading nulls (KV-MAMBA-012:
        an align-mode table without any of its nulls)."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        ids = tuple(b.block_id for b in table)
        if self.align:
            # (KV-MAMBA-024: a producer freed before its copy releases its page with the tail key.)
            for bookkeeping in (self.last_state_index, self.num_retired, self.checkpoints, self.copy_due):
                bookkeeping.pop(request_id, None)
            self.allocated.discard(request_id)
            order = mamba_spec.align_free_order(ids)
        else:
            order = spec.free_order((ids,))
        self.pool.free_blocks([self.pool.blocks[block_id] for block_id in order])

    def new_step_starts(self) -> None:
        """KV-MAMBA-009: a new scheduler step; pages cached before it may be hits now."""
        self.cached_this_step.clear()

    # -- Mamba with prefix caching ("align" mode, chapter 8) ---------------------------
    def _retire_states(self, request_id: str, processed: int) -> None:
        """KV-MAMBA-010: free the states before the last processed token's page."""
        table = self.req_to_blocks.get(request_id)
        if table is None:
            return
        retired = self.num_retired.get(request_id, 0)
        indices = mamba_spec.align_blocks_to_free(tuple(b.is_null for b in table), retired, processed,
                                                  self.block_size)
        freed = [table[i] for i in indices]
        for i in indices:
            table[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)
        self.num_retired[request_id] = mamba_spec.retired_after(retired, processed, self.block_size, len(table))
        last = self.last_state_index.get(request_id, -1)
        if mamba_spec.frees_last_state(last, processed, self.block_size, tuple(b.is_null for b in table)):
            self.pool.free_blocks([table[last]])
            table[last] = self.pool.null_block

    def checkpoint_of(self, request_id: str, num_computed_tokens: int, main_tokens: int) -> int:
        """KV-MAMBA-006: the checkpoint position this step reserves a page for, or 0."""
        table = self.req_to_blocks.get(request_id, [])
        return mamba_spec.reserved_checkpoint(
            self.has_checkpoint_blocks, self.prefill_checkpoint_alignment, num_computed_tokens, main_tokens,
            self.alignment, self.coordinator.config.hash_block_size, self.block_size,
            self.coordinator.config.use_eagle, tuple(b.is_null for b in table), request_id in self.allocated,
            self.num_speculative_blocks)

    def plan_checkpoint(self, request_id: str, num_computed_tokens: int, main_tokens: int) -> None:
        """Record the step's checkpoint (before the step adopts a hit, as the need saw it)."""
        position = self.checkpoint_of(request_id, num_computed_tokens, main_tokens)
        if position:
            self.checkpoints[request_id] = (position, mamba_spec.checkpoint_index(main_tokens, self.block_size))
        else:
            self.checkpoints.pop(request_id, None)

    def _align_need(self, request_id: str, hits: Sequence[KVCacheBlock], num_computed_tokens: int,
                    main_tokens: int) -> int:
        """KV-MAMBA-007/KV-MAMBA-008/KV-MAMBA-009: the blocks this group takes from the pool."""
        table = self.req_to_blocks.get(request_id, [])
        deferred = bool(hits) and hits[-1].cache_key is not None and hits[-1].cache_key in self.cached_this_step
        evictable = sum(b.ref_cnt == 0 and not b.is_null for b in hits)
        checkpoint = self.checkpoint_of(request_id, num_computed_tokens, main_tokens) > 0
        allocated = request_id in self.allocated
        if not self.fine:
            return mamba_spec.align_need(main_tokens, self.block_size, self.num_speculative_blocks, len(hits),
                                         len(table), allocated, checkpoint, evictable, deferred,
                                         self.pool.num_blocks)
        # KV-MAMBA-022: a consumer's partial hit or a producer's pending tail takes one page more.
        partial_hit = bool(hits) and mamba_spec.shared_entry(num_computed_tokens, self.block_size) >= 0
        action = mamba_spec.copy_action(partial_hit, request_id in self.copy_due and allocated, allocated)
        return mamba_spec.copy_need(main_tokens, self.block_size, self.num_speculative_blocks, len(hits),
                                    len(table), allocated, checkpoint, evictable, deferred, self.pool.num_blocks,
                                    action)

    @icontract.snapshot(lambda self, request_id: tuple(b.block_id for b in self.req_to_blocks.get(request_id, ())),
                        name="table", enabled=ENABLED)
    @icontract.snapshot(lambda self, request_id: (request_id in self.checkpoints, request_id in self.allocated,
                                                  self.copy_due.get(request_id, (-1, None))[0]),
                        name="flags", enabled=ENABLED)
    @icontract.ensure(lambda self, request_id, main_tokens, result, OLD: _align_layout_taken(
        self, request_id, OLD.table, main_tokens, OLD.flags[0], OLD.flags[1], OLD.flags[2], result),
        "KV-MAMBA-004/KV-MAMBA-005: the table grows to the running and speculative pages, moving them",
        enabled=ENABLED)
    @icontract.ensure(lambda self, request_id: mamba_spec.align_table_ok(
        tuple(b.is_null for b in self.req_to_blocks[request_id]), self.num_speculative_blocks),
        "KV-MAMBA-013: the running and speculative pages end the table", enabled=ENABLED)
    def _align_allocate(self, request_id: str, main_tokens: int) -> list[KVCacheBlock]:
        """KV-MAMBA-004/KV-MAMBA-005: grow the table to ``main_tokens`` main tokens."""
        table = self.req_to_blocks.setdefault(request_id, [])
        checkpoint = request_id in self.checkpoints
        allocated = request_id in self.allocated
        self.allocated.add(request_id)
        due = self.copy_due.pop(request_id, None)
        old = list(table)
        layout = mamba_spec.align_layout(len(old), main_tokens, self.block_size, self.num_speculative_blocks,
                                         checkpoint, allocated)
        if len(layout) == len(old) and not checkpoint and due is None:
            return []  # long enough already (KV-MAMBA-022: never with a copy due)
        if allocated:
            self.last_state_index[request_id] = len(old) - 1 - self.num_speculative_blocks
        elif old:
            self.last_state_index[request_id] = len(old) - 1  # the adopted hit's state page
        # The copy is the first block taken from the pool (KV-MAMBA-023, KV-MAMBA-024).
        taken = self.pool.get_new_blocks(layout.count(mamba_spec.NEW) + (due is not None))
        new = iter(taken[due is not None:])
        table[:] = [old[entry] if entry >= 0 else self.pool.null_block if entry == mamba_spec.NULL else next(new)
                    for entry in layout]
        returned = table[len(old):]
        if due is not None:
            returned = self._copy(request_id, due, taken[0], allocated) + returned
        return returned

    @icontract.ensure(lambda self, request_id, due, copy, allocated: allocated or (
        self.req_to_blocks[request_id][due[0]] is copy and self.last_state_index.get(request_id) == due[0]),
        "KV-MAMBA-026: a consumer's copy stands in the entry its first step reads the state from (the hit's "
        "last entry, recorded as its last state)", enabled=ENABLED)
    def _copy(self, request_id: str, due: tuple[int, KVCacheBlock], copy: KVCacheBlock, allocated: bool
              ) -> list[KVCacheBlock]:
        """Queue the copy of a shared page (KV-MAMBA-023, KV-MAMBA-024), both pages held one reference
        more until it is taken (KV-MAMBA-025). Returns what the allocation returns of it."""
        entry, source = due
        table = self.req_to_blocks[request_id]
        written, keyed = mamba_spec.copy_pages(mamba_spec.copy_action(not allocated, allocated, allocated))
        self.pending_copies.append((source, copy))
        if written == mamba_spec.COPY:
            # A consumer: its table takes the copy; the shared page keeps the hit's reference.
            table[entry] = copy
            self.pool.touch([copy])
            return [copy]
        # A producer keeps writing its page: the cache entry moves to the copy, whose state is
        # only there once the copy has run (a hit on it waits for the next step, KV-MAMBA-009).
        assert keyed == mamba_spec.COPY and table[entry] is source
        self.pool.move_key(source, copy)
        self.pool.touch([source])
        if copy.cache_key is not None:
            self.cached_this_step.add(copy.cache_key)
        return []

    def take_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """KV-MAMBA-025: the queued copies, in order; the caller releases their retention."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def _align_cache(self, request: Request, num_tokens: int) -> None:
        """KV-MAMBA-011: full pages at their positions, then the step's checkpoint at its own;
        the keys cached are remembered for the step (KV-MAMBA-009)."""
        request_id = request.request_id
        before = self.num_cached_block.get(request_id, 0)
        self._cache_full_blocks(request, num_tokens)
        table = self.req_to_blocks.get(request_id, [])
        position, index = self.checkpoints.get(request_id, (0, -1))
        h = request.hash_block_size
        drop_eagle = self.coordinator.config.use_eagle
        if position and position <= len(request.block_hashes) * h:  # else KV-MAMBA-017
            # (The key of the prefix of ``position`` tokens: a page's positional key where the
            # position ends a block.)
            key = (request.block_hashes[position // h - 1], self.group_id)
            keyed = 0 <= index < len(table) and table[index].cache_key == key
            hashed = len(request.block_hashes) * h
            if self.fine and not mamba_spec.checkpoint_keeps_key(position, request.num_prompt_tokens, h,
                                                                 self.block_size, drop_eagle):
                # KV-MAMBA-021: a transient state inside a block; its page keeps no key.
                if 0 <= index < len(table) and table[index].cache_key is not None:
                    self.pool.evict_blocks([table[index].block_id])
            elif mamba_spec.checkpoint_key_tokens(position, index, tuple(b.is_null for b in table), keyed, hashed):
                self.pool.rekey(table[index], key)
                self.cached_this_step.add(key)
        elif self.fine and request_id not in self.checkpoints:
            self._register_tail(request, num_tokens)
        after = self.num_cached_block.get(request_id, 0)
        for block in table[before:after]:
            if not block.is_null and block.cache_key is not None:
                self.cached_this_step.add(block.cache_key)

    def _register_tail(self, request: Request, num_tokens: int) -> None:
        """KV-MAMBA-021: key the page holding the prompt's last hash boundary at that boundary; a
        partial tail makes the request its producer (a copy is due, KV-MAMBA-024)."""
        table = self.req_to_blocks.get(request.request_id, [])
        h = request.hash_block_size
        tokens_of = {unit: (i + 1) * h for i, unit in enumerate(request.block_hashes)}
        keyed = tuple(tokens_of.get(b.cache_key[0], 0) if b.cache_key is not None else 0 for b in table)
        entry = mamba_spec.tail_entry(num_tokens, request.num_prompt_tokens, h, self.block_size,
                                      self.coordinator.config.use_eagle, False, tuple(b.is_null for b in table),
                                      keyed)
        if entry < 0:
            return
        # vLLM would keep a key for more tokens beside the new one; the page holding the boundary's
        # state never carries one (its block is not full, and no checkpoint was reserved this step).
        assert keyed[entry] < num_tokens, "a tail page keyed past the boundary"
        key = (request.block_hashes[num_tokens // h - 1], self.group_id)
        self.pool.rekey(table[entry], key)
        self.cached_this_step.add(key)
        if mamba_spec.shared_entry(num_tokens, self.block_size) >= 0:
            self.copy_due[request.request_id] = (entry, table[entry])
            self.num_cached_block[request.request_id] = entry

    # -- cascade attention -------------------------------------------------------------
    def num_common_prefix_blocks(self, request_id: str) -> int:
        """KV-LIFE-011: leading blocks of the request's table that every request holding blocks
        in this group shares. Only full attention shares whole prefixes; other kinds answer 0."""
        if self.kind != hybrid_spec.FULL:
            return 0
        table = self.req_to_blocks.get(request_id, [])
        return lifecycle.num_common_prefix_blocks(tuple(block.ref_cnt for block in table),
                                                  len(self.req_to_blocks))
