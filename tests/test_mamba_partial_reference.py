"""KV-MAMBA-019 .. KV-MAMBA-025 in the reference manager: a producer and a consumer of a partial
tail (B = 16, h = 4, a full-attention group of the hash block), step by step, each observation
held to the chapter's functions rather than to numbers written down here.
"""

from __future__ import annotations

import pytest

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.reference.hybrid import HybridConfig
from kvoracle.reference.kv_cache_spec import FullAttentionSpec, MambaSpec
from kvoracle.spec import mamba
from kvoracle.spec.config import ConfigError
from kvoracle.spec.lifecycle import cdiv

B, H = 16, 4
MAMBA = 1  # the Mamba group's index


def _engine(num_speculative_blocks: int = 0) -> ReferenceEngine:
    engine = ReferenceEngine()
    engine.configure(HybridConfig((FullAttentionSpec(H), MambaSpec(B, num_speculative_blocks=num_speculative_blocks)),
                                  60, 64, H))
    return engine


def _take(engine: ReferenceEngine) -> tuple[tuple[int, int], ...]:
    """The scheduler's end of a step: the queued copies, their held pages released (KV-MAMBA-025)."""
    return tuple(engine.manager.take_kv_cache_block_copies())


def _step(engine: ReferenceEngine, request_id: str, new: int, hit: int = 0) -> tuple[int, ...]:
    allocated = engine.allocate(request_id, new, hit)
    assert allocated is not None
    engine.advance(request_id, new)
    return allocated[MAMBA]


def _keyed(engine: ReferenceEngine, prompt: tuple[int, ...], tokens: int) -> tuple[int, ...]:
    """The Mamba blocks cached under the key of the prompt's first ``tokens`` tokens."""
    request = engine.requests.get("probe")
    if request is None:
        engine.add_request("probe", prompt)
        request = engine.requests["probe"]
    return engine.observe().cached.get((request.block_hashes[tokens // H - 1], MAMBA), ())


def test_the_configuration_turns_partial_hits_on() -> None:
    config = HybridConfig((FullAttentionSpec(H), MambaSpec(B)), 60, 64, H)
    assert config.partial_hits and config.hit_alignment == mamba.hit_alignment(("full", "mamba"), (H, B), H, B)
    with pytest.raises(ConfigError, match="KV-MAMBA-003"):  # one group: no partial hits
        HybridConfig((MambaSpec(B),), 60, 64, H)


def test_a_producer_moves_its_tail_and_a_consumer_copies_it() -> None:
    engine = _engine()
    prompt = tuple(range(22))
    boundary = mamba.checkpoint_position(len(prompt), H, False)
    engine.add_request("a", prompt)
    _step(engine, "a", 16)
    _take(engine)
    engine.new_step()
    _step(engine, "a", boundary - 16)  # the chunk that ends at the prompt's last hash boundary
    table = engine.observe().block_tables["a"][MAMBA]
    entry = mamba.tail_entry(boundary, len(prompt), H, B, False, False, tuple(b == 0 for b in table),
                             (0,) * len(table))
    assert entry == mamba.shared_entry(boundary, B) and _keyed(engine, prompt, boundary) == (table[entry],)
    assert _take(engine) == ()
    engine.new_step()

    # KV-MAMBA-024: the producer's next step keeps its page; the key moves to a fresh copy.
    refs_before = engine.observe().ref_counts
    free_before = engine.observe().num_free_blocks
    _step(engine, "a", len(prompt) - boundary)
    after = engine.observe()
    copy = _keyed(engine, prompt, boundary)
    assert len(copy) == 1 and copy[0] not in after.block_tables["a"][MAMBA]
    assert after.block_tables["a"][MAMBA][entry] == table[entry]
    assert after.ref_counts[table[entry]] == mamba.copy_ref_counts(mamba.MOVED_ENTRY, 1, False)[0]
    assert after.ref_counts[copy[0]] == mamba.copy_ref_counts(mamba.MOVED_ENTRY, 1, False)[1]
    assert refs_before[copy[0]] == 0 and free_before - after.num_free_blocks >= 1
    assert _take(engine) == ((table[entry], copy[0]),)
    released = engine.observe()
    assert (released.ref_counts[table[entry]], released.ref_counts[copy[0]]) == mamba.copy_ref_counts(
        mamba.MOVED_ENTRY, 1, True)
    assert copy[0] in released.free_queue  # cached, waiting for a consumer
    engine.new_step()

    # KV-MAMBA-020/023: a request sharing the boundary hits inside the block and gets a private copy.
    other = prompt[:boundary] + (9,) * 10
    engine.add_request("c", other)
    hit = engine.lookup("c")
    assert hit.num_tokens == boundary and hit.block_ids[MAMBA] == (0,) * (cdiv(boundary, B) - 1) + copy
    returned = _step(engine, "c", 4, boundary)
    mine = engine.observe()
    private = mine.block_tables["c"][MAMBA][mamba.shared_entry(boundary, B)]
    assert returned[0] == private and private not in copy
    assert mine.ref_counts[copy[0]] == mamba.copy_ref_counts(mamba.PRIVATE_COPY, 0, False)[0]
    assert mine.ref_counts[private] == mamba.copy_ref_counts(mamba.PRIVATE_COPY, 0, False)[1]
    assert _take(engine) == ((copy[0], private),)
    assert engine.observe().ref_counts[private] == mamba.copy_ref_counts(mamba.PRIVATE_COPY, 0, True)[1]
    assert _keyed(engine, prompt, boundary) == copy  # the cache keeps the shared page


def test_a_copy_due_needs_one_page_more() -> None:
    """KV-MAMBA-022: the producer's next step needs the copy beside what KV-MAMBA-007 counts."""
    prompt = tuple(range(22))
    boundary = mamba.checkpoint_position(len(prompt), H, False)
    engine = _engine()
    engine.add_request("a", prompt)
    _step(engine, "a", boundary)
    _take(engine)
    engine.new_step()
    manager = engine.manager
    group = manager.groups[MAMBA]
    tokens = len(prompt)
    with_copy = manager.num_blocks_to_allocate("a", tokens, boundary, None, 0, tokens)
    due = group.copy_due.pop("a")
    without = manager.num_blocks_to_allocate("a", tokens, boundary, None, 0, tokens)
    group.copy_due["a"] = due
    assert with_copy == without + 1
    assert engine.allocate("a", tokens - boundary, 0) is not None
    assert "a" not in group.copy_due  # the copy is made once
