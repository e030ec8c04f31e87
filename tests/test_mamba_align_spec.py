"""Chapter 8's align mode (Mamba with prefix caching): the spec's functions, the reference
against them, and the reference against vLLM 0.33.0's real ``MambaManager``.

The property tests run anywhere. The differential tests drive the reference and vLLM's
``KVCacheManager`` through the same random steps and compare tables, allocations, ref counts,
the free queue and the cache map after every step; they are skipped (with the reason) unless
vLLM 0.33.x is importable -- run them with ``.venv-vllm/bin/pytest tests/test_mamba_align_spec.py``
(``make test-vllm`` does). The CrossHair test checks the chapter's contracts in a subprocess
with the per-condition budget of ``scripts/crosshair_spec.sh``.
"""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from align_table import AlignTable
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvoracle.reference import KVCacheManager
from kvoracle.reference.hybrid import HybridConfig
from kvoracle.reference.kv_cache_spec import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from kvoracle.reference.request import Request
from kvoracle.spec import get_rule, kv_cache_spec, mamba
from kvoracle.spec.config import ConfigError
from kvoracle.spec.lifecycle import cdiv
from kvoracle.spec.mamba import NEW, NULL

REPO = Path(__file__).resolve().parents[1]


# -- the spec's functions ------------------------------------------------------------------------
def test_the_chapter_registers_its_align_rules() -> None:
    ids = [f"KV-MAMBA-{n:03d}" for n in range(4, 18)]
    assert all(get_rule(rule_id).chapter == "mamba" for rule_id in ids)
    assert all(get_rule(rule_id).definitions for rule_id in ids), "every align rule is stated by a function"
    assert get_rule("KV-MAMBA-003").kind == "validation" and get_rule("KV-MAMBA-016").spec_only


def test_layout_worked_examples() -> None:
    """Tables vLLM 0.33.0 builds (block size 4), entry by entry."""
    # First allocation of 10 tokens, one speculative page: nulls, the running page, the draft page.
    assert mamba.align_layout(0, 10, 4, 1, False, False) == (NULL, NULL, NEW, NEW)
    # The same with a checkpoint: entry 1 is kept for it.
    assert mamba.align_layout(0, 10, 4, 1, True, False) == (NULL, NEW, NEW, NEW)
    # A running request [n, n, b, s] growing to 17 tokens: the draft page s becomes the running
    # page at entry 4 (moved, not replaced), one new draft page after it.
    assert mamba.align_layout(4, 17, 4, 1, False, True) == (0, 1, 2, NULL, 3, NEW)
    # Growing to 16 tokens the draft page stays where it is and is the running page.
    assert mamba.align_layout(4, 16, 4, 1, False, True) == (0, 1, 2, 3, NEW)
    # Two draft pages, a long chunk and a checkpoint: both move, the first becomes the checkpoint.
    assert mamba.align_layout(4, 24, 4, 2, True, True) == (0, 1, NULL, NULL, 2, 3, NEW, NEW)
    # A table long enough is left alone.
    assert mamba.align_layout(5, 9, 4, 1, False, True) == (0, 1, 2, 3, 4)


@settings(max_examples=300, deadline=None)
@given(num_held=st.integers(0, 8), num_tokens=st.integers(1, 40), block_size=st.sampled_from([1, 2, 4]),
       speculative=st.integers(0, 3), checkpoint=st.booleans(), allocated=st.booleans(),
       hit=st.integers(0, 6), evictable=st.booleans())
def test_the_need_is_what_the_layout_takes(num_held: int, num_tokens: int, block_size: int, speculative: int,
                                           checkpoint: bool, allocated: bool, hit: int, evictable: bool) -> None:
    """KV-MAMBA-007/008: the need counts exactly the layout's new blocks, never below zero."""
    assume(not allocated or num_held > speculative)
    assume(not checkpoint or cdiv(num_tokens, block_size) >= 2)
    hits = 0 if num_held else hit
    need = mamba.align_need(num_tokens, block_size, speculative, hits, num_held, allocated, checkpoint,
                            int(evictable and hits > 0), False, 100)
    layout = mamba.align_layout(num_held + hits, num_tokens, block_size, speculative, checkpoint, allocated)
    assert need - int(evictable and hits > 0) == layout.count(NEW) >= 0
    assert mamba.align_need(num_tokens, block_size, speculative, hits, num_held, allocated, checkpoint, 0, True,
                            100) == (101 if hits else layout.count(NEW))


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 40), length=st.integers(1, 30), alignment=st.sampled_from([1, 2, 4, 8]),
       block_size=st.sampled_from([1, 2, 4]), checkpoint_alignment=st.sampled_from([0, 1, 2, 4]),
       eagle=st.booleans())
def test_checkpoints_lie_inside_prefill_chunks(start: int, length: int, alignment: int, block_size: int,
                                                checkpoint_alignment: int, eagle: bool) -> None:
    """KV-MAMBA-006: a checkpoint sits strictly inside its chunk, on the alignment, in the page
    before the running one, and a decode step (one token) never reserves one."""
    alignment = math.lcm(alignment, block_size)
    end = start + length
    position = mamba.reserved_checkpoint(True, checkpoint_alignment, start, end, alignment, block_size, block_size,
                                         eagle, (), False, 0)
    if position:
        assert start < position < end and position % alignment == 0 and checkpoint_alignment
        assert mamba.checkpoint_index(end, block_size) == mamba.running_index(end, block_size) - 1 >= 0
    if length == 1:
        assert position == 0
    assert mamba.reserved_checkpoint(False, checkpoint_alignment, start, end, alignment, block_size, block_size,
                                     eagle, (), False, 0) == 0


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 40), length=st.integers(1, 30), alignment=st.sampled_from([1, 2, 4, 8]),
       block_size=st.sampled_from([1, 2, 4]), checkpoint_alignment=st.sampled_from([0, 1, 2, 4]),
       eagle=st.booleans(), is_null=st.lists(st.booleans(), max_size=12).map(tuple), allocated=st.booleans())
def test_the_manager_reserves_only_what_the_backend_exports(start: int, length: int, alignment: int,
                                                             block_size: int, checkpoint_alignment: int,
                                                             eagle: bool, is_null: tuple[bool, ...],
                                                             allocated: bool) -> None:
    """KV-MAMBA-006: the manager's checkpoint is the backend's, where its entry is free; with an
    empty table (nothing held, every entry past the end) it always is."""
    alignment = math.lcm(alignment, block_size)
    end = start + length
    exported = mamba.exported_checkpoint(True, checkpoint_alignment, start, end, alignment, block_size, block_size,
                                         eagle)
    reserved = mamba.reserved_checkpoint(True, checkpoint_alignment, start, end, alignment, block_size, block_size,
                                         eagle, is_null, allocated, 1)
    assert reserved in (0, exported)
    assert mamba.reserved_checkpoint(True, checkpoint_alignment, start, end, alignment, block_size, block_size,
                                     eagle, (), False, 0) == exported


@settings(max_examples=300, deadline=None)
@given(is_null=st.lists(st.booleans(), max_size=12).map(tuple), retired=st.integers(0, 12),
       processed=st.integers(0, 50), block_size=st.sampled_from([1, 2, 4]))
def test_freeing_leaves_nothing_before_the_last_processed_page(is_null: tuple[bool, ...], retired: int,
                                                                processed: int, block_size: int) -> None:
    """KV-MAMBA-010: given every entry before the retired mark is null (the mark's invariant),
    after freeing every entry before the last processed token's page is null."""
    retired = min(retired, len(is_null))
    is_null = (True,) * retired + is_null[retired:]
    freed = mamba.align_blocks_to_free(is_null, retired, processed, block_size)
    after = tuple(null or i in freed for i, null in enumerate(is_null))
    mark = mamba.retired_after(retired, processed, block_size, len(is_null))
    assert all(after[:mark])
    assert all(after[:min(max(processed - 1, 0) // block_size, len(is_null))])


# A request's life through the spec's functions alone: its table, which state each page
# holds, and which prefix each page is keyed at -- the model behind KV-MAMBA-014/015/016.
def _life(chunks: Sequence[int], block_size: int, speculative: int, alignment: int, eagle: bool,
          checkpoint_alignment: int) -> tuple[dict[int, int], dict[int, int], int]:
    """Run ``chunks`` (token counts) through one align-mode group; returns (page -> state,
    page -> key tokens, most pages held at once). Pages are numbered as they are taken."""
    manager = AlignTable(block_size, speculative, alignment, checkpoint_alignment, eagle)
    key: dict[int, int] = {}
    state: dict[int, int] = {}
    num_cached = computed = most = 0
    for chunk in chunks:
        end = computed + chunk
        position = manager.allocate(computed, end)
        table = manager.entries
        # The step's forward pass, then its caching (both before the next step).
        for index, tokens in mamba.states_written(end, block_size, position):
            state[table[index]] = tokens
        cacheable = end if alignment == block_size else (
            end // alignment * alignment + (block_size if eagle and end >= alignment else 0))
        cacheable = min(cacheable, end)  # a step caches at most the tokens it computed
        num_full = cacheable // block_size
        for index in range(num_cached, min(num_full, len(table))):
            if table[index] >= 0:
                key[table[index]] = (index + 1) * block_size
        num_cached = max(num_cached, num_full)
        checkpoint = mamba.checkpoint_index(end, block_size)
        page = table[checkpoint] if position else -1
        if mamba.checkpoint_key_tokens(position, checkpoint, tuple(p < 0 for p in table),
                                       key.get(page) == position, end):
            key[page] = position
        most = max(most, sum(1 for page in table if page >= 0))
        computed = end
    return state, key, most


@st.composite
def _lives(draw: st.DrawFn, keep_states: bool) -> tuple:
    block_size = draw(st.sampled_from([1, 2, 4]))
    alignment = block_size * draw(st.sampled_from([1, 1, 2]))
    speculative = draw(st.integers(0, 2))
    eagle = draw(st.booleans())
    checkpoint_alignment = draw(st.sampled_from([0, 0, 1, block_size]))
    prompt = draw(st.integers(1, 30))
    chunks: list[int] = []
    done = 0
    while done < prompt:
        if keep_states:  # KV-MAMBA-016: end on a block boundary, or at the prompt's end
            boundary = (done // block_size + 1) * block_size
            choices = [e for e in range(boundary, prompt, block_size)] + [prompt]
            if done % block_size:
                choices = [min(boundary, prompt)]
            end = draw(st.sampled_from(choices))
        else:
            end = draw(st.integers(done + 1, prompt))
        chunks.append(end - done)
        done = end
    chunks += [1] * draw(st.integers(0, 6))  # decode steps, without drafts
    life = {"chunks": chunks, "block_size": block_size, "speculative": speculative, "alignment": alignment,
            "eagle": eagle, "checkpoint_alignment": checkpoint_alignment}
    return life, prompt


@settings(max_examples=300, deadline=None)
@given(case=_lives(keep_states=True))
def test_cached_pages_hold_their_states_when_chunks_keep_states(case: tuple) -> None:
    """KV-MAMBA-015 from KV-MAMBA-014/011 under KV-MAMBA-016: every page keyed at a prefix
    holds the state after exactly that prefix."""
    life, prompt = case
    for start, end in _spans(life["chunks"]):
        assert mamba.chunk_keeps_states(start, end, prompt, life["block_size"])
    state, key, _ = _life(**life)
    assert all(state.get(page) == tokens for page, tokens in key.items()), (state, key)


def _spans(chunks: Sequence[int]) -> list[tuple[int, int]]:
    spans, done = [], 0
    for chunk in chunks:
        spans.append((done, done + chunk))
        done += chunk
    return spans


def test_a_chunk_past_a_boundary_from_inside_a_block_caches_a_wrong_state() -> None:
    """Why KV-MAMBA-016 exists: a prefill chunk ending at 10 (block 4), then one to 16. The
    page that held the state after 10 tokens is cached under the prefix of 12."""
    assert not mamba.chunk_keeps_states(0, 10, 22, 4) and not mamba.chunk_keeps_states(10, 16, 22, 4)
    state, key, _ = _life([10, 6], 4, 0, 4, False, 0)
    wrong = {page: (tokens, state[page]) for page, tokens in key.items() if state[page] != tokens}
    assert wrong == {0: (12, 10)}


@settings(max_examples=300, deadline=None)
@given(case=_lives(keep_states=False))
def test_a_request_holds_no_more_pages_than_the_spec_sizes(case: tuple) -> None:
    """KV-MAMBA-004 to 010 against KV-SPEC's page count of an align-mode Mamba layer: a request
    whose steps commit what they schedule never holds more than 2 + s + checkpoint pages."""
    life, _ = case
    _, _, most = _life(**life)
    assert most <= kv_cache_spec.mamba_max_pages(True, life["speculative"], int(bool(life["checkpoint_alignment"])))


def test_table_shape_predicate() -> None:
    assert mamba.align_table_ok((True, False, True, False, False), 1)
    assert not mamba.align_table_ok((True, False, False, True, False), 1)
    assert mamba.align_table_ok((), 2) and mamba.align_free_order((0, 5, 0, 7, 9)) == (9, 7, 5)


# -- the reference -------------------------------------------------------------------------------
def _prompt(length: int, variant: int = 0) -> tuple[int, ...]:
    return tuple((7 * i + 3 + (variant if i >= length // 2 else 0)) % 11 for i in range(length))


def test_reference_rejects_modes_against_the_caching_switch() -> None:
    with pytest.raises(ConfigError, match=r"KV-MAMBA-003: kv_cache_specs\[1\]\.mamba_cache_mode"):
        KVCacheManager(HybridConfig((FullAttentionSpec(2), MambaSpec(2, mamba_cache_mode="none")), 20, 64, 2))
    with pytest.raises(ConfigError, match=r"KV-MAMBA-003: kv_cache_specs\[0\]\.mamba_cache_mode"):
        KVCacheManager(HybridConfig((MambaSpec(2),), 20, 64, 2, enable_caching=False))
    # A Mamba block coarser than the hash block: partial hits (KV-MAMBA-019) where every other group
    # keeps the hash block, rejected where they stay off or a coarser full-attention group would get
    # sub-block hits of its own.
    assert HybridConfig((FullAttentionSpec(4), MambaSpec(8)), 20, 64, 4).partial_hits
    with pytest.raises(ConfigError, match=r"KV-MAMBA-003: kv_cache_specs\[1\]\.block_size"):
        HybridConfig((SlidingWindowSpec(8, sliding_window=4), MambaSpec(8)), 20, 64, 4)
    with pytest.raises(ConfigError, match=r"KV-MAMBA-003: kv_cache_specs\[0\]\.block_size"):
        HybridConfig((FullAttentionSpec(8), MambaSpec(16)), 20, 64, 4)
    KVCacheManager(HybridConfig((FullAttentionSpec(2), MambaSpec(2)), 20, 64, 2))  # align mode: accepted


def test_reference_worked_example_hybrid_checkpoint() -> None:
    """Full attention (block 8) and Mamba (block 4, one draft page, checkpoints): the tables
    vLLM 0.33.0 builds for chunks of 14, 2 and 8 tokens (checked against vLLM below)."""
    specs = (FullAttentionSpec(8), MambaSpec(4, num_speculative_blocks=1, num_prefill_checkpoint_blocks=1,
                                             prefill_checkpoint_alignment=4))
    manager = KVCacheManager(HybridConfig(specs, 40, 256, 4))
    request = Request("a", tuple(range(100, 130)), 4)
    results = []
    for chunk in (14, 2, 8):
        results.append(manager.allocate_slots(request, chunk).get_block_ids())
        request.num_computed_tokens += chunk
        results.append(manager.get_block_ids("a"))
    assert results == [((1, 2), (0, 0, 3, 4, 5)), ((1, 2), (0, 0, 3, 4, 5)),
                       ((), ()), ((1, 2), (0, 0, 0, 4, 5)),
                       ((6,), (5, 7)), ((1, 2, 6), (0, 0, 0, 4, 0, 5, 7))]
    # The checkpoint page 3 (entry 2) was keyed at 8 tokens, the state it holds; entry 3 at 16.
    keys = {block.block_id: key for key, blocks in manager.pool.cached.items() for block in blocks.values()
            if key[1] == 1}
    assert keys[3][0] == request.block_hashes[1] and keys[4][0] == request.block_hashes[3]


def test_reference_defers_a_hit_on_a_state_cached_this_step() -> None:
    """KV-MAMBA-009: the state page of 8 tokens is cached in this step; a second request
    hitting it is refused until the scheduler starts a new step."""
    manager = KVCacheManager(HybridConfig((MambaSpec(4),), 20, 64, 4))
    first = Request("a", _prompt(9), 4)
    manager.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    second = Request("b", _prompt(12), 4)
    blocks, hit = manager.get_computed_blocks(second)
    assert hit == 8
    assert manager.allocate_slots(second, 4, hit, blocks) is None
    manager.new_step_starts()
    assert manager.allocate_slots(second, 4, hit, blocks) is not None
    assert manager.get_block_ids("b") == ((0, 1, 2),)  # the hit page 1 shared, then its own page


def test_reference_need_is_never_negative() -> None:
    """KV-MAMBA-008 on the case of docs/findings/mamba-negative-need.md: after rejected drafts
    the Mamba table is longer than the step needs, and a look-ahead that grows makes full
    attention need 3 blocks with 2 free: the allocation fails (vLLM raises instead)."""
    manager = KVCacheManager(HybridConfig((FullAttentionSpec(4), MambaSpec(4)), 9, 64, 4))
    request = Request("a", tuple(range(100, 108)), 4)
    manager.allocate_slots(request, 8)
    request.num_computed_tokens = 8
    request.append_output_token_ids([1])
    manager.allocate_slots(request, 9)  # one token and eight drafts
    request.num_computed_tokens = 9  # every draft rejected
    request.append_output_token_ids([2])
    assert manager.allocate_slots(request, 1, num_lookahead_tokens=20) is None
    assert manager.get_block_ids("a") == ((1, 2, 4, 5, 6), (0, 0, 0, 0, 7))
    assert manager.pool.num_free_blocks() == 2


# A small lockstep driver: the reference alone, or the reference and vLLM side by side.
class _Lockstep:
    def __init__(self, specs: tuple[KVCacheSpec, ...], num_blocks: int, hash_block_size: int, eagle: bool,
                 vllm_side: Any = None) -> None:
        self.config = HybridConfig(specs, num_blocks, 64, hash_block_size, use_eagle=eagle)
        self.ref = KVCacheManager(self.config)
        self.vllm = vllm_side.manager(self.config) if vllm_side else None
        self.side = vllm_side
        self.requests: dict[str, tuple[Request, Any]] = {}
        self.running: set[str] = set()
        self.prefixes: dict[bytes, tuple[int, ...]] = {}

    def add(self, request_id: str, prompt: tuple[int, ...]) -> None:
        other = self.side.request(request_id, prompt) if self.vllm else None
        self.requests[request_id] = (Request(request_id, prompt, self.config.hash_block_size), other)
        self._learn(request_id)

    def _learn(self, request_id: str) -> None:
        ref, other = self.requests[request_id]
        h = self.config.hash_block_size
        for request in (ref, other):
            if request is not None:
                tokens = tuple(request.all_token_ids)
                for i, block_hash in enumerate(request.block_hashes):
                    self.prefixes[bytes(block_hash)] = tokens[:(i + 1) * h]

    def schedule(self, request_id: str, chunk: int, drafts: int, lookahead: int) -> str:
        """One allocation; returns 'ok', 'full' or 'vllm-raised'."""
        ref, other = self.requests[request_id]
        hit, blocks, other_blocks = 0, None, None
        if request_id not in self.running:
            blocks, hit = self.ref.get_computed_blocks(ref)
            if self.vllm:
                other_blocks, other_hit, _ = self.vllm.get_computed_blocks(other)
                assert other_hit == hit and _ids(other_blocks.blocks) == blocks.get_block_ids()
        chunk = max(1, min(chunk, ref.num_tokens - ref.num_computed_tokens - hit))
        new = chunk + (drafts if ref.num_computed_tokens + hit + chunk == ref.num_tokens else 0)
        result = self.ref.allocate_slots(ref, new, hit, blocks if hit else None, num_lookahead_tokens=lookahead)
        if self.vllm:
            try:
                theirs = self.vllm.allocate_slots(other, new, hit, other_blocks if hit else None,
                                                  num_lookahead_tokens=lookahead)
            except ValueError as error:  # KV-MAMBA-008: the need went negative
                assert "Cannot get" in str(error) and result is None, error
                return "vllm-raised"
            except AssertionError:  # KV-MAMBA-017: a checkpoint past the committed tokens
                assert result is not None and self._checkpoint_past_hashes(ref), "vLLM asserted elsewhere"
                return "vllm-raised"
            assert (theirs is None) == (result is None)
            if result is not None:
                assert _ids(theirs.blocks) == result.get_block_ids()
        if result is None:
            return "full"
        self.running.add(request_id)
        ref.num_computed_tokens += hit + chunk
        if other is not None:
            other.status = self.side.RUNNING
            other.num_computed_tokens += hit + chunk
        if ref.num_computed_tokens == ref.num_tokens:  # decoding appends the sampled token
            token = (ref.num_tokens * 5) % 11
            ref.append_output_token_ids([token])
            if other is not None:
                other.append_output_token_ids([token])
            self._learn(request_id)
        return "ok"

    def _checkpoint_past_hashes(self, request: Request) -> bool:
        hashed = len(request.block_hashes) * request.hash_block_size
        return any(group.checkpoints.get(request.request_id, (0, 0))[0] > hashed for group in self.ref.groups)

    def free(self, request_id: str, preempt: bool) -> None:
        ref, other = self.requests[request_id]
        self.ref.free(ref)
        if self.vllm:
            self.vllm.free(other)
        self.running.discard(request_id)
        if preempt:
            ref.num_computed_tokens = 0
            if other is not None:
                self.side.preempt(other)
        else:
            del self.requests[request_id]

    def new_step(self) -> None:
        self.ref.new_step_starts()
        if self.vllm:
            self.vllm.new_step_starts()

    def check(self) -> None:
        """The reference's own invariants; with vLLM, everything observable compared."""
        for group in self.ref.groups:
            for table in group.req_to_blocks.values():
                if group.align:
                    assert mamba.align_table_ok(tuple(b.is_null for b in table), group.num_speculative_blocks)
        if not self.vllm:
            return
        pool = self.vllm.block_pool
        for request_id in self.requests:
            assert self.ref.get_block_ids(request_id) == _ids(self.vllm.coordinator.get_blocks(request_id)), \
                request_id
        assert self.ref.pool.ref_counts() == tuple(b.ref_cnt for b in pool.blocks)
        assert self.ref.pool.free_queue.block_ids() == tuple(
            b.block_id for b in pool.free_block_queue.get_all_free_blocks())
        assert self._reference_cache() == self._vllm_cache()

    def _reference_cache(self) -> dict:
        return {(self.prefixes[key[0]], key[1]): tuple(blocks) for key, blocks in self.ref.pool.cached.items()}

    def _vllm_cache(self) -> dict:
        sizes = [s.block_size for s in self.config.kv_cache_specs]
        cache = {}
        for key, blocks in self.vllm.block_pool.cached_block_hash_to_block._cache.items():
            prefix = self.prefixes[bytes(self.side.utils.get_block_hash(key))]
            group = self.side.utils.get_group_id(key)
            if len(prefix) % sizes[group]:
                continue  # a full-attention partial tail entry (KV-HLC-006), not in the cache map
            ids = (blocks.block_id,) if hasattr(blocks, "block_id") else tuple(blocks)
            cache[(prefix, group)] = ids
        return cache


def _ids(groups: Sequence[Sequence[Any]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(b.block_id for b in group) for group in groups)


@st.composite
def _align_configs(draw: st.DrawFn) -> tuple:
    block = draw(st.sampled_from([1, 2, 4]))
    mamba_spec = MambaSpec(block, num_speculative_blocks=draw(st.integers(0, 2)),
                           num_prefill_checkpoint_blocks=draw(st.integers(0, 1)),
                           prefill_checkpoint_alignment=draw(st.sampled_from([None, 1, block])))
    shape = draw(st.sampled_from(["mamba", "full+mamba", "full+swa+mamba"]))
    if shape == "mamba":
        specs: tuple[KVCacheSpec, ...] = (mamba_spec,)
    else:
        full = FullAttentionSpec(block * draw(st.sampled_from([1, 2])))
        specs = (full, mamba_spec) if shape == "full+mamba" else (
            full, SlidingWindowSpec(block, sliding_window=draw(st.integers(1, 6))), mamba_spec)
    eagle = len(specs) > 1 and draw(st.booleans())
    per_request = sum(cdiv(64, s.block_size) for s in specs)
    num_blocks = draw(st.integers(6, per_request))
    return specs, num_blocks, block, eagle


def _steps(rng: random.Random, count: int) -> list[tuple]:
    steps: list[tuple] = []
    for _ in range(count):
        roll = rng.random()
        request_id = f"r{rng.randrange(3)}"
        if roll < 0.55:
            steps.append(("schedule", request_id, rng.choice([1, 2, 3, 4, 5, 8, 13]),
                          rng.choice([0, 0, 0, 1, 3]), rng.choice([0, 0, 2, 6])))
        elif roll < 0.65:
            steps.append(("free", request_id, rng.random() < 0.5))
        elif roll < 0.8:
            steps.append(("new_step",))
        else:
            steps.append(("add", request_id, rng.randrange(4), rng.randrange(6, 30)))
    return steps


def _run(driver: _Lockstep, steps: list[tuple]) -> list[str]:
    outcomes = []
    for step in steps:
        if step[0] == "add":
            if step[1] not in driver.requests:
                driver.add(step[1], _prompt(step[3], step[2]))
        elif step[0] == "schedule":
            if step[1] in driver.requests:
                outcome = driver.schedule(*step[1:])
                outcomes.append(outcome)
                if outcome == "vllm-raised":
                    return outcomes
        elif step[0] == "free":
            if step[1] in driver.requests:
                driver.free(step[1], step[2])
        else:
            driver.new_step()
        driver.check()
    return outcomes


@settings(max_examples=60, deadline=None)
@given(config=_align_configs(), seed=st.integers(0, 2**32 - 1))
def test_reference_runs_align_groups_within_its_contracts(config: tuple, seed: int) -> None:
    """Random lives of align-mode groups: the reference's contracts (which call the spec's
    functions) hold at every step, and its tables keep KV-MAMBA-013's shape."""
    specs, num_blocks, block, eagle = config
    driver = _Lockstep(specs, num_blocks, block, eagle)
    _run(driver, _steps(random.Random(seed), 40))


# -- vLLM 0.33.0 ---------------------------------------------------------------------------------
class _VllmSide:
    """vLLM's KVCacheManager over the vLLM twins of kvoracle's specs (checkpoint alignment included)."""

    def __init__(self) -> None:
        from kvoracle.conformance.engines.vllm import _load_vllm

        self.v = _load_vllm()
        import torch
        from vllm.v1.kv_cache_interface import MambaSpec as VllmMamba
        from vllm.v1.kv_cache_interface import SlidingWindowSpec as VllmSlidingWindow

        self.torch, self.VllmMamba, self.VllmSlidingWindow = torch, VllmMamba, VllmSlidingWindow
        self.utils = self.v.utils
        self.RUNNING = self.v.RequestStatus.RUNNING
        self.hasher: Any = None

    def spec(self, kv_spec: KVCacheSpec) -> Any:
        common = {"block_size": kv_spec.block_size}
        if isinstance(kv_spec, MambaSpec):
            return self.VllmMamba(**common, shapes=((1,),), dtypes=(self.torch.float32,), mamba_cache_mode="align",
                                  num_speculative_blocks=kv_spec.num_speculative_blocks,
                                  num_prefill_checkpoint_blocks=kv_spec.num_prefill_checkpoint_blocks,
                                  prefill_checkpoint_alignment=kv_spec.prefill_checkpoint_alignment)
        attention = {**common, "num_kv_heads": 1, "head_size": 1, "dtype": self.torch.float32}
        if isinstance(kv_spec, SlidingWindowSpec):
            return self.VllmSlidingWindow(**attention, sliding_window=kv_spec.sliding_window)
        return self.v.FullAttentionSpec(**attention)

    def manager(self, config: HybridConfig) -> Any:
        from kvoracle.conformance.engines.vllm import new_manager

        self.utils.init_none_hash(self.v.sha256)
        groups = [self.v.KVCacheGroupSpec([f"model.layers.{g}.attn"], self.spec(s))
                  for g, s in enumerate(config.kv_cache_specs)]
        self.hasher = self.utils.get_request_block_hasher(config.hash_block_size, self.v.sha256)
        return new_manager(self.v, groups, config.num_blocks, max_model_len=config.max_model_len,
                           scheduler_block_size=config.scheduler_block_size,
                           hash_block_size=config.hash_block_size, enable_caching=True,
                           use_eagle=config.use_eagle)

    def request(self, request_id: str, prompt: tuple[int, ...]) -> Any:
        from kvoracle.conformance.engines.vllm import new_request

        return new_request(self.v, request_id, prompt, 64, self.hasher)

    def preempt(self, request: Any) -> None:
        request.status = self.v.RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1


@pytest.fixture(scope="module")
def vllm_side() -> _VllmSide:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed; run scripts/install_vllm.sh and use "
                                              ".venv-vllm (make test-vllm runs this file there)")
    if not str(vllm.__version__).startswith("0.33."):
        pytest.skip(f"the align chapter models vLLM 0.33.x, found {vllm.__version__}")
    return _VllmSide()


def test_vllm_builds_the_worked_example_tables(vllm_side: _VllmSide) -> None:
    specs = (FullAttentionSpec(8), MambaSpec(4, num_speculative_blocks=1, num_prefill_checkpoint_blocks=1,
                                             prefill_checkpoint_alignment=4))
    driver = _Lockstep(specs, 40, 4, False, vllm_side)
    driver.add("a", tuple(range(100, 130)))
    for chunk in (14, 2, 8):
        assert driver.schedule("a", chunk, 0, 0) == "ok"
        driver.check()
    assert driver.ref.get_block_ids("a") == ((1, 2, 6), (0, 0, 0, 4, 0, 5, 7))


def test_vllm_defers_a_hit_cached_this_step(vllm_side: _VllmSide) -> None:
    driver = _Lockstep((MambaSpec(4),), 20, 4, False, vllm_side)
    driver.add("a", _prompt(9))
    assert driver.schedule("a", 8, 0, 0) == "ok"
    driver.add("b", _prompt(12))
    assert driver.schedule("b", 4, 0, 0) == "full"  # KV-MAMBA-009, in both
    driver.new_step()
    assert driver.schedule("b", 4, 0, 0) == "ok"
    driver.check()


def test_vllm_need_goes_negative_and_allocate_slots_raises(vllm_side: _VllmSide) -> None:
    """docs/findings/mamba-negative-need.md: where the reference returns None (KV-MAMBA-008),
    vLLM 0.33.0 passes its capacity check on a negative Mamba need and raises."""
    driver = _Lockstep((FullAttentionSpec(4), MambaSpec(4)), 9, 4, False, vllm_side)
    driver.add("a", tuple(range(100, 108)))
    assert driver.schedule("a", 8, 0, 0) == "ok"
    assert driver.schedule("a", 1, 8, 0) == "ok"  # one token and eight drafts, then all rejected
    mamba_manager = driver.vllm.coordinator.single_type_managers[1]
    assert mamba_manager.get_num_blocks_to_allocate("a", 10, [], 9, 9, 10) == -2
    assert driver.schedule("a", 1, 0, 20) == "vllm-raised"


@settings(max_examples=150, deadline=None)
@given(config=_align_configs(), seed=st.integers(0, 2**32 - 1))
def test_reference_agrees_with_vllm_step_by_step(vllm_side: _VllmSide, config: tuple, seed: int) -> None:
    """The reference and vLLM 0.33.0 through the same random steps (chunked prefills, decodes
    with drafts that are rejected, look-ahead, hits, new steps, preemption, frees): the same
    hits, allocations, tables, ref counts, free queue and cache map after every step; where
    vLLM raises it is the negative need of KV-MAMBA-008 and the reference refused."""
    specs, num_blocks, block, eagle = config
    driver = _Lockstep(specs, num_blocks, block, eagle, vllm_side)
    _run(driver, _steps(random.Random(seed), 40))


# -- CrossHair -----------------------------------------------------------------------------------
ALIGN_FUNCTIONS = ("align_layout", "align_need", "align_blocks_to_free", "reserved_checkpoint")


@pytest.mark.slow
def test_crosshair_passes_the_align_functions() -> None:
    """The align functions' contracts, checked as ``scripts/crosshair_spec.sh`` checks every chapter
    (4 s CPU per condition): no counterexample, and each of them analysed. The whole chapter is
    ``make test``'s CrossHair stage; this test names the functions so that a contract CrossHair
    cannot analyse (and silently skips) fails here."""
    pytest.importorskip("crosshair", reason="crosshair-tool is not installed in this environment")
    command = [sys.executable, "-m", "crosshair", "check", "--analysis_kind=icontract",
               "--per_condition_timeout=4", "--extra_plugin=scripts/crosshair_icontract_plugin.py",
               "--report_all", *(f"kvoracle.spec.mamba.{name}" for name in ALIGN_FUNCTIONS)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False,
                          env={**os.environ, "KVORACLE_CONTRACTS": "1"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    source = (REPO / "spec" / "mamba.py").read_text().splitlines()
    analysed = {int(m[1]) for m in re.finditer(r"mamba\.py:(\d+): info", output)}
    functions = {name for line in analysed for name in re.findall(r"def (\w+)", "\n".join(
        source[line - 1:line + 40]))[:1]}
    assert set(ALIGN_FUNCTIONS) <= functions, output


@given(start=st.integers(0, 40), length=st.integers(0, 30), prefill_end=st.integers(0, 60),
       block_size=st.sampled_from([1, 2, 3, 4, 8]))
def test_the_scheduler_cuts_a_chunk_to_keep_states(start: int, length: int, prefill_end: int, block_size: int) -> None:
    """KV-MAMBA-016: the chunk the scheduler keeps obeys the rule, is the wanted one when that
    obeys it already, and otherwise the longest that does (nothing, where no boundary lies inside)."""
    end = mamba.aligned_chunk_end(start, start + length, prefill_end, block_size)
    assert start <= end <= start + length and mamba.chunk_keeps_states(start, end, prefill_end, block_size)
    if mamba.chunk_keeps_states(start, start + length, prefill_end, block_size):
        assert end == start + length
    else:
        longer = [e for e in range(end + 1, start + length + 1) if mamba.chunk_keeps_states(start, e, prefill_end,
                                                                                              block_size)]
        assert not longer, longer  # the longest chunk within the wish that obeys it
