"""KV-MAMBA-019 .. KV-MAMBA-025: vLLM 0.33.0's fine-grained partial Mamba hits, stated by the
chapter's functions (the reference implements them, tests/test_mamba_partial_reference.py; the manager
suite judges them).

The properties run each function under its icontract conditions over random arguments; the
worked examples follow one producer and one consumer of a partial tail through the functions
alone (docs/chapters/mamba.md tells the same story).
"""

from __future__ import annotations

import math

import icontract
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvoracle.spec import contracts, get_rule, mamba
from kvoracle.spec.mamba import COPY, MOVED_ENTRY, NO_COPY, PRIVATE_COPY, SOURCE
from kvoracle.spec.registry import NOT_YET_JUDGED

RULES = [f"KV-MAMBA-0{n}" for n in range(19, 26)]
KINDS = st.sampled_from(("full", "sliding_window", "chunked_local", "mamba"))


def test_the_manager_suite_judges_the_rules() -> None:
    for rule_id in RULES:
        rule = get_rule(rule_id)
        # (What a lookup shows, the alignment and the hit, the hybrid lookup suite judges too.)
        suites = ("manager", "hybrid") if rule_id in ("KV-MAMBA-019", "KV-MAMBA-020") else ("manager",)
        assert rule.chapter == "mamba" and rule.judged_by == suites and rule.spec_only is None
        assert "mamba_partial_hits" in rule.needs and rule.definitions, rule_id
        assert rule_id not in NOT_YET_JUDGED, rule_id
    assert "KV-MAMBA-019 to" in get_rule("KV-MAMBA-003").text


@given(st.lists(st.tuples(KINDS, st.integers(1, 4)), min_size=1, max_size=4), st.integers(1, 4))
def test_when_partial_hits_are_on(groups: list[tuple[str, int]], hash_block_size: int) -> None:
    kinds = tuple(kind for kind, _ in groups)
    sizes = tuple(multiple * hash_block_size for _, multiple in groups)
    on = mamba.partial_hits_enabled(kinds, sizes, hash_block_size)
    lcm = 1
    for size in sizes:
        lcm = lcm * size // math.gcd(lcm, size)
    assert mamba.hit_alignment(kinds, sizes, hash_block_size, lcm) == (hash_block_size if on else lcm)
    # KV-MAMBA-003's configurations never turn them on.
    flat = tuple(hash_block_size if kind == "mamba" else size for kind, size in zip(kinds, sizes))
    assert not mamba.partial_hits_enabled(kinds, flat, hash_block_size)


@given(st.lists(st.booleans(), max_size=24), st.integers(0, 100), st.integers(2, 4), st.integers(1, 4))
def test_the_partial_hit(cached: list[bool], max_length: int, units: int, hash_block_size: int) -> None:
    block_size = units * hash_block_size
    hit = mamba.partial_hit_length(tuple(cached), max_length, block_size, hash_block_size)
    entry = mamba.shared_entry(hit, block_size)
    assert (entry >= 0) == (hit % block_size != 0)
    if entry >= 0:
        assert entry == -(-hit // block_size) - 1  # the hit's last entry


def test_the_producer_and_the_consumer() -> None:
    """B = 16, h = 4: A's 22-token prompt registers a partial tail at 20, moves it to a copy on
    its next step; C (30 tokens, sharing 20) resumes inside that copy with a private one."""
    assert mamba.tail_entry(20, 22, 4, 16, False, False, (True, False), (0, 0)) == 1
    assert mamba.tail_entry(20, 22, 4, 16, False, True, (True, False), (0, 0)) == -1  # a checkpoint step
    assert mamba.tail_entry(20, 22, 4, 16, False, False, (True, False), (0, 20)) == -1  # keyed already
    assert mamba.tail_entry(16, 22, 4, 16, False, False, (False,), (0,)) == -1  # not the boundary
    producer = mamba.copy_action(False, True, True)
    assert producer == MOVED_ENTRY and mamba.copy_pages(producer) == (SOURCE, COPY)
    assert mamba.copy_need(22, 16, 0, 0, 2, True, False, 0, False, 32, producer) == 1
    assert mamba.copy_ref_counts(producer, 1, False) == (2, 1)
    assert mamba.copy_ref_counts(producer, 1, True) == (1, 0)
    cached = (False, False, False, False, True, False, False)
    assert mamba.partial_hit_length(cached, 29, 16, 4) == 20 and mamba.shared_entry(20, 16) == 1
    consumer = mamba.copy_action(True, False, False)
    assert consumer == PRIVATE_COPY and mamba.copy_pages(consumer) == (COPY, SOURCE)
    assert mamba.copy_need(28, 16, 0, 2, 0, False, False, 1, False, 32, consumer) == 2
    assert mamba.copy_need(28, 16, 0, 2, 0, False, False, 1, True, 32, consumer) == 33  # deferred
    assert mamba.copy_ref_counts(consumer, 0, False) == (1, 2)
    assert mamba.copy_ref_counts(consumer, 0, True) == (0, 1)


@given(st.integers(0, 64), st.integers(1, 64), st.integers(1, 4), st.integers(2, 4), st.booleans(), st.booleans(),
       st.lists(st.tuples(st.booleans(), st.integers(0, 64)), max_size=6))
def test_the_tail_entry(num_tokens: int, num_prompt_tokens: int, hash_block_size: int, units: int,
                        drop_eagle: bool, checkpoint_due: bool, entries: list[tuple[bool, int]]) -> None:
    block_size = units * hash_block_size
    is_null = tuple(null for null, _ in entries)
    keyed = tuple(tokens for _, tokens in entries)
    index = mamba.tail_entry(num_tokens, num_prompt_tokens, hash_block_size, block_size, drop_eagle,
                             checkpoint_due, is_null, keyed)
    assert index == -1 or 0 <= index < len(is_null)


@given(st.integers(1, 16), st.integers(1, 64), st.integers(1, 4), st.integers(2, 4), st.booleans())
def test_a_checkpoint_inside_a_block(units: int, num_prompt_tokens: int, hash_block_size: int, per_block: int,
                                     drop_eagle: bool) -> None:
    mamba.checkpoint_keeps_key(units * hash_block_size, num_prompt_tokens, hash_block_size,
                               per_block * hash_block_size, drop_eagle)


@given(st.booleans(), st.booleans(), st.integers(1, 40), st.integers(1, 8), st.integers(0, 2), st.integers(0, 4),
       st.integers(0, 6), st.booleans(), st.booleans(), st.integers(0, 5), st.booleans())
def test_the_copy(partial_hit: bool, tail_pending: bool, num_tokens: int, block_size: int, num_speculative_blocks: int,
                  num_hit_blocks: int, num_held: int, checkpoint: bool, deferred: bool, sharers: int,
                  released: bool) -> None:
    allocated = tail_pending or (not partial_hit and num_held > num_speculative_blocks)
    if allocated:
        num_held = max(num_held, num_speculative_blocks + 1)
        num_hit_blocks = 0
    elif num_hit_blocks:
        num_held = 0
    if partial_hit and (allocated or not num_hit_blocks):
        partial_hit = False
    if checkpoint and -(-num_tokens // block_size) < 2:
        checkpoint = False
    action = mamba.copy_action(partial_hit, tail_pending, allocated)
    evictable = min(num_hit_blocks, 1)
    need = mamba.copy_need(num_tokens, block_size, num_speculative_blocks, num_hit_blocks, num_held, allocated,
                           checkpoint, evictable, deferred, 64, action)
    assert need >= 0
    if action != NO_COPY:
        written, keyed = mamba.copy_pages(action)
        assert written != keyed
        table_refs = sharers + (1 if action == MOVED_ENTRY else 0)
        source, copy = mamba.copy_ref_counts(action, table_refs, released)
        held = 0 if released else 1
        assert (source, copy) == (table_refs + held, (1 if written == COPY else 0) + held)


# -- the scheduler's stop at the prompt's last hash boundary (KV-MAMBA-021) ----------------------
def test_tail_chunk_end_stops_at_the_last_hash_boundary() -> None:
    # A 22-token prompt, h = 4, B = 16, no EAGLE: its last hash boundary is 20.
    def end(start=0, stop=22, exported=False, last_cacheable=16, drop_eagle=False):
        return mamba.tail_chunk_end(start, stop, 22, 4, 16, drop_eagle, exported, last_cacheable)

    assert end() == 20  # the chunk passes 20 strictly inside: it stops there
    assert end(exported=True) == 22  # the backend exports 20 as the chunk's checkpoint
    assert end(stop=20) == 20 and end(start=20) == 22  # the chunk only reaches 20, or starts there
    assert end(last_cacheable=20) == 22  # 20 is a block boundary the scheduler caches at anyway
    # With EAGLE's drop the boundary is one hash block earlier, 16: a block boundary, so no stop at
    # it unless the last block boundary the scheduler caches at lies before it.
    assert end(drop_eagle=True) == 22 and end(drop_eagle=True, last_cacheable=0) == 16


@given(st.integers(0, 40), st.integers(0, 40), st.integers(1, 40), st.sampled_from([1, 2, 4]),
       st.sampled_from([2, 4]), st.booleans(), st.booleans(), st.integers(0, 40))
def test_tail_chunk_end_is_the_end_or_the_boundary(start, length, prompt, h, scale, drop_eagle, exported,
                                                   last_cacheable) -> None:
    end = mamba.tail_chunk_end(start, start + length, prompt, h, h * scale, drop_eagle, exported, last_cacheable)
    assert end in (start + length, mamba.checkpoint_position(prompt, h, drop_eagle))


# -- where a partial hit's state lives, and the runner's copies (KV-MAMBA-026) -------------------
def test_kv_mamba_026_is_judged_through_a_paged_store() -> None:
    rule = get_rule("KV-MAMBA-026")
    assert rule.chapter == "mamba" and rule.judged_by == ("manager",) and rule.spec_only is None
    assert {"kv_data", "mamba_partial_hits"} <= set(rule.needs) and rule.definitions
    assert "KV-MAMBA-026" in get_rule("KV-MAMBA-014").text


def test_the_consumer_reads_its_copy() -> None:
    """C resumes after A's 20-token partial tail (B = 16): its first step reads entry 1, where its
    table holds the private copy; once running, it reads where the runner recorded its state."""
    assert mamba.start_entry(-1, 20, 16) == mamba.shared_entry(20, 16) == 1
    assert mamba.start_entry(-1, 0, 16) == -1 and mamba.start_entry(-1, 32, 16) == 1
    assert mamba.start_entry(4, 23, 16) == 4
    # The producer's page 5 holds the state after 20 (say 7); its copy 9 gets it before the step
    # overwrites page 5, and a consumer's copy 3 of the same page too.
    assert mamba.states_after_copies((0, 0, 0, 0, 0, 7, 0, 0, 0, 0), ((5, 9), (5, 3))) == \
        (0, 0, 0, 7, 0, 7, 0, 0, 0, 7)


@given(st.integers(-1, 12), st.integers(0, 80), st.integers(1, 16))
def test_start_entry(remembered: int, num_computed: int, block_size: int) -> None:
    entry = mamba.start_entry(remembered, num_computed, block_size)
    assert entry >= -1


@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.data())
def test_states_after_copies(states: list[int], data: st.DataObject) -> None:
    pages = list(range(len(states)))
    copies = data.draw(st.lists(st.sampled_from(pages), unique=True, max_size=len(states) // 2), label="copies")
    sources = [page for page in pages if page not in copies]
    pairs = tuple((data.draw(st.sampled_from(sources), label="source"), copy) for copy in copies)
    after = mamba.states_after_copies(tuple(states), pairs)
    # (The contracts say the same; these hold with contracts off too.)
    assert all(after[copy] == states[source] for source, copy in pairs)
    assert all(after[page] == states[page] for page in sources)


def test_a_chained_copy_is_not_one_step() -> None:
    """A copy page that is another copy's source needs two steps' copies: the precondition says so."""
    if not contracts.ENABLED:
        pytest.skip("contracts switched off with KVORACLE_CONTRACTS=0")
    with pytest.raises(icontract.ViolationError):
        mamba.states_after_copies((1, 2, 3), ((0, 1), (1, 2)))
