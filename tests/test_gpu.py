"""kvoracle.gpu: the tensor block pool against the reference pool, the paged store, the adapters.

Everything runs on CPU torch; the tests marked ``cuda`` repeat the essentials on a CUDA
device and are skipped where there is none. ``torch`` comes from :mod:`kvoracle.gpu`, which
imports it without the warning a CPU build without numpy prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoracle.conformance.adapter import EngineAdapter, Lookup
from kvoracle.conformance.engines.gpu import (
    GpuEngine,
    PagedReferenceEngine,
    PagedStoreWrapper,
    TorchEngine,
)
from kvoracle.conformance.harness.engines import builtin_engines, engine_factory
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.suites import get_suite
from kvoracle.conformance.manager.machine import GROUPS_ONLY
from kvoracle.gpu import DEVICE_ENV, PagedKVStore, TorchBlockPool, default_device, torch
from kvoracle.reference import BlockPool, ManagerConfig
from kvoracle.spec import data_integrity as data_spec
from kvoracle.spec import get_rule

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
GOOD = {"pass", "not-applicable"}
KV_DATA = ("KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004", "KV-DATA-005", "KV-DATA-006")


# -- the tensor pool follows the reference pool, operation by operation -----------------------
def _state(pool) -> tuple:
    if isinstance(pool, TorchBlockPool):
        return (tuple(pool.free_queue().tolist()), tuple(pool.ref_cnt.tolist()),
                pool.cached_map(), pool.num_free_blocks())
    return (pool.free_queue.block_ids(), pool.ref_counts(),
            {key: tuple(blocks) for key, blocks in pool.cached.items()}, pool.num_free_blocks())


class _Pair:
    """The reference pool and the tensor pool, driven by the same operations."""

    def __init__(self, num_blocks: int, caching: bool, device: torch.device = CPU) -> None:
        self.ref = BlockPool(num_blocks, enable_caching=caching)
        self.gpu = TorchBlockPool(num_blocks, caching, device)
        self.held: list[int] = []

    def allocate(self, n: int) -> None:
        ids = [b.block_id for b in self.ref.get_new_blocks(n)]
        assert self.gpu.allocate(n).tolist() == ids
        self.held += ids

    def free(self, ids: list[int]) -> None:
        self.ref.free_blocks([self.ref.blocks[i] for i in ids])
        self.gpu.free(ids)
        for i in ids:
            if i != 0:  # the null block is never held (touch does not count it either)
                self.held.remove(i)

    def touch(self, ids: list[int]) -> None:
        self.ref.touch([self.ref.blocks[i] for i in ids])
        self.gpu.touch(ids)
        self.held += [i for i in ids if i != 0]

    def cache(self, pairs: list[tuple[int, bytes]]) -> None:
        self.ref.cache_blocks([(self.ref.blocks[i], (h, 0)) for i, h in pairs])
        self.gpu.cache([i for i, _ in pairs], [self.gpu.key_id((h, 0)) for _, h in pairs])

    def check(self) -> None:
        assert _state(self.gpu) == _state(self.ref)

    def apply(self, op: str, seed: int) -> None:
        """One operation of ``OPS``, its arguments derived from ``seed``, on both pools."""
        num_blocks, held = self.gpu.num_blocks, self.held
        if op == "alloc":
            self.allocate(seed % (self.gpu.num_free_blocks() + 1))
        elif op == "free" and held:
            # Any sub-multiset of the held references, in any order (repeats included).
            picks = [held[(seed >> (3 * k)) % len(held)] for k in range(1 + seed % 4)]
            picks = [b for b in dict.fromkeys(picks)]  # at most the references held
            extra = [b for b in picks if held.count(b) > 1][:1]
            self.free(picks + extra)
        elif op == "touch":
            self.touch([(seed >> (5 * k)) % num_blocks for k in range(1 + seed % 3)])
        elif op == "cache" and self.gpu.enable_caching:
            uncached = [b for b in dict.fromkeys(held) if self.ref.blocks[b].cache_key is None]
            self.cache([(b, HASHES[(seed + b) % len(HASHES)]) for b in uncached[:1 + seed % 3]])
        elif op == "evict":
            ids = [(seed >> (4 * k)) % num_blocks for k in range(seed % 3)]
            self.ref.evict_blocks(ids)
            self.gpu.evict(ids)
        elif op == "reset":
            assert self.gpu.reset_prefix_cache() == self.ref.reset_prefix_cache()

    def check_lookups(self) -> None:
        """Every key of ``HASHES`` finds the same block in both pools (-1: none)."""
        keys = [(h, 0) for h in HASHES]
        expected = [getattr(self.ref.get_cached_block(key), "block_id", -1) for key in keys]
        found = self.gpu.lookup([self.gpu.key_id(key) for key in keys]).tolist() \
            if self.gpu.enable_caching else [-1] * len(keys)
        assert found == expected


OPS = st.lists(st.tuples(st.sampled_from(["alloc", "free", "touch", "cache", "evict", "reset"]),
                         st.integers(0, 10 ** 6)), max_size=60)
HASHES = [bytes([i]) * 8 for i in range(1, 5)]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(num_blocks=st.integers(2, 24), caching=st.booleans(), ops=OPS)
def test_tensor_pool_matches_the_reference_pool(num_blocks: int, caching: bool,
                                                ops: list[tuple[str, int]]) -> None:
    pair = _Pair(num_blocks, caching)
    pair.check()
    for op, seed in ops:
        pair.apply(op, seed)
        pair.check()
        pair.check_lookups()


@pytest.mark.parametrize("merge_min, dead_slack", [(10 ** 9, 10 ** 9), (1, 0)],
                         ids=["delta-and-dead-entries", "frequent-merges"])
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(num_blocks=st.integers(2, 24), ops=OPS)
def test_lookups_match_the_reference_through_the_index_delta_and_dead_entries(
        merge_min: int, dead_slack: int, num_blocks: int, ops: list[tuple[str, int]]) -> None:
    """The same operations, comparing only lookups after each one (``cached_map`` merges
    the index, so it is compared once, at the end): with merges put off, lookups search
    the delta and skip dead entries; with merges as early as the thresholds allow, mostly the
    base."""
    pair = _Pair(num_blocks, caching=True)
    pair.gpu.MERGE_MIN, pair.gpu.DEAD_SLACK = merge_min, dead_slack
    for op, seed in ops:
        pair.apply(op, seed)
        pair.check_lookups()
    pair.check()


@pytest.mark.parametrize("merge_min, dead_slack", [(10 ** 9, 10 ** 9), (1, 0), (2, 1)])
def test_a_lookup_skips_dead_entries_to_the_earliest_block_still_cached(
        merge_min: int, dead_slack: int) -> None:
    """Several blocks under one key (KV-POOL-009), the earliest ones' keys dropped, one block
    cached again under the same key: each lookup returns the earliest block still cached."""
    pair = _Pair(8, caching=True)
    pair.gpu.MERGE_MIN, pair.gpu.DEAD_SLACK = merge_min, dead_slack
    key = (HASHES[0], 0)
    key_id = pair.gpu.key_id(key)

    def expect(block_id: int) -> None:
        assert getattr(pair.ref.get_cached_block(key), "block_id", -1) == block_id
        assert pair.gpu.lookup([key_id]).tolist() == [block_id]

    pair.allocate(4)  # blocks 1..4
    pair.cache([(1, HASHES[0]), (2, HASHES[0]), (3, HASHES[0])])
    expect(1)
    for evicted, then in (([1], 2), ([2], 3), ([3], -1)):
        pair.ref.evict_blocks(evicted)
        pair.gpu.evict(evicted)
        expect(then)
    pair.cache([(4, HASHES[0])])
    expect(4)
    pair.cache([(1, HASHES[0])])  # block 1 again, under its old key, after block 4
    expect(4)
    pair.ref.evict_blocks([4])
    pair.gpu.evict([4])
    expect(1)
    pair.check()


def test_a_long_run_compacts_the_queue_and_keeps_lru_order() -> None:
    """Many touches (holes) and frees at both ends force recentering; order stays exact."""
    pair = _Pair(50, caching=True)
    for round_ in range(40):
        pair.allocate(min(7, pair.gpu.num_free_blocks()))
        table = pair.held[-7:]
        pair.cache([(b, bytes([round_ % 251 + 1, k % 251 + 1]) * 4) for k, b in enumerate(table)
                    if pair.ref.blocks[b].cache_key is None])
        pair.free(list(reversed(table)))
        queue = pair.gpu.free_queue().tolist()
        pair.touch(queue[1::3])
        pair.check()
        pair.free([b for b in queue[1::3]])
        pair.check()


def test_occurrence_marks_survive_the_stamp_wrap_and_the_null_block_stays_pinned() -> None:
    """Batches with repeated ids and null blocks, across the int32 stamp overflow (where the
    scratch is cleared once), keep the tensor pool equal to the reference pool."""
    pair = _Pair(12, caching=True)
    pair.gpu._stamp_base = 2 ** 31 - 1 - 20  # the next few batches cross the limit
    for round_ in range(6):
        pair.allocate(4)
        table = pair.held[-4:]
        pair.cache([(b, bytes([round_ + 1, k + 1]) * 4) for k, b in enumerate(table[:2])])
        pair.touch([0, table[0], 0, table[1]])  # a second reference each, and two null ids
        pair.free([table[1], 0, *reversed(table), table[0], 0])  # repeats reach 0 at the last
        pair.check()
        assert pair.gpu.ref_counts()[0] == 0 and 0 not in pair.gpu.free_queue().tolist()
    assert pair.gpu._stamp_base < 2 ** 31 - 1 - 20  # the wrap happened


def test_a_refused_free_leaves_the_pool_as_it_was() -> None:
    pool = TorchBlockPool(6, True, CPU)
    held = pool.allocate(3).tolist()
    before = (pool.ref_counts().tolist(), pool.free_queue().tolist())
    with pytest.raises(ValueError, match="KV-POOL-011"):
        pool.free([held[0], 0, held[1], held[1]])
    assert (pool.ref_counts().tolist(), pool.free_queue().tolist()) == before
    assert pool.num_free_among([0, *held, 4, 5]) == 2  # the null block is never free


def test_allocating_more_than_is_free_is_an_error() -> None:
    pool = TorchBlockPool(4, True, CPU)
    with pytest.raises(ValueError, match="KV-POOL-004"):
        pool.allocate(4)
    pool.allocate(3)
    with pytest.raises(ValueError, match="KV-POOL-011"):
        pool.free([1, 1])


def test_key_ids_of_colliding_hashes_stay_distinct() -> None:
    """Two keys whose first 8 bytes agree get different ids, and lookups tell them apart."""
    pool = TorchBlockPool(6, True, CPU)
    first, second = b"12345678" + b"a" * 24, b"12345678" + b"b" * 24
    ids = [pool.key_id((first, 0)), pool.key_id((second, 0)), pool.key_id((first, 1))]
    assert len(set(ids)) == 3 and pool.key_id((first, 0)) == ids[0]
    blocks = pool.allocate(2)
    pool.cache(blocks, ids[:2])
    assert pool.lookup(ids).tolist() == [*blocks.tolist(), -1]
    assert pool.cached_map() == {(first, 0): (1,), (second, 0): (2,)}


def test_state_is_a_few_tensors_of_per_block_words() -> None:
    pool = TorchBlockPool(10_000, True, CPU)
    assert 20 <= pool.state_bytes() / 10_000 <= 48
    fresh = pool.state_bytes()
    blocks = pool.allocate(1_000)
    pool.cache(blocks, list(range(1, 1_001)))
    assert pool.state_bytes() - fresh == 1_000 * 24  # the key index: key id, block, stamp


# -- devices ---------------------------------------------------------------------------------
def test_the_device_is_cpu_without_cuda_and_the_environment_overrides_it(monkeypatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device().type == expected
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert default_device() == CPU
    assert GpuEngine().device == CPU
    assert TorchBlockPool(3, True).ref_cnt.device == CPU


@pytest.mark.cuda
@needs_cuda
def test_tensor_pool_on_cuda_matches_the_reference_pool() -> None:
    pair = _Pair(64, True, torch.device("cuda"))
    pair.allocate(20)
    pair.cache([(b, bytes([b]) * 8) for b in pair.held[:10]])
    pair.free(list(reversed(pair.held[:10])))
    pair.touch([3, 5, 7])
    pair.allocate(30)
    pair.check()
    assert pair.gpu.ref_cnt.device.type == "cuda"


@pytest.mark.cuda
@needs_cuda
def test_gpu_engine_conforms_on_cuda(tmp_path: Path) -> None:
    result = run_suite(lambda: GpuEngine("cuda"), RunOptions(max_examples=40, replay_dir=tmp_path))
    outcomes = {rule: o.outcome for rule, o in result.verdicts.outcomes.items()}
    assert not [r for r, o in outcomes.items() if o in ("fail", "error")], outcomes
    assert all(outcomes[r] == "pass" for r in KV_DATA)


# -- the paged store -------------------------------------------------------------------------
def test_store_writes_through_the_table_and_stamps_only_changed_slots() -> None:
    store = PagedKVStore(5, (2,), CPU)
    table = torch.tensor([3, 1])
    positions = torch.arange(3)
    epoch = store.write(0, table, positions, torch.tensor([11, 12, 13]))
    assert store.values[0].tolist() == [[0, 0], [13, 0], [0, 0], [11, 12], [0, 0]]
    again = store.write(0, table, torch.arange(4), torch.tensor([11, 12, 13, 14]))
    values, epochs = store.read(0, table, torch.arange(5))
    assert values.tolist() == [11, 12, 13, 14, data_spec.UNWRITTEN]  # position 4: no slot
    assert epochs.tolist()[:4] == [epoch, epoch, epoch, again]  # unchanged slots keep theirs
    assert epochs.tolist()[4] > again


# -- the spec's value function and classification --------------------------------------------
def test_slot_values_chain_over_the_prefix_and_never_look_unwritten() -> None:
    values = data_spec.extend_prefix_values((), (1, 2, 3))
    assert data_spec.extend_prefix_values(values[:1], (1, 2, 3)) == values
    assert data_spec.UNWRITTEN not in values
    other = data_spec.extend_prefix_values((), (0, 2, 3))
    assert all(a != b for a, b in zip(values, other))  # a different first token changes all
    assert data_spec.extend_prefix_values((), (1, 2), "") == data_spec.extend_prefix_values(
        (), (1, 2), None) != data_spec.extend_prefix_values((), (1, 2), "salt")
    assert all(-(1 << 63) <= v < (1 << 63) for v in values)


@pytest.mark.parametrize(("actual", "written_at", "since", "from_hit", "rule_id"), [
    (7, 9, 3, True, None),
    (5, 9, 3, True, "KV-DATA-003"),
    (5, 2, 3, False, "KV-DATA-003"),
    (0, 2, 3, True, "KV-DATA-002"),
    (5, 2, 3, True, "KV-DATA-001"),
])
def test_a_wrong_slot_is_charged_to_the_rule_that_explains_it(actual, written_at, since,
                                                               from_hit, rule_id) -> None:
    assert data_spec.slot_violation(7, actual, written_at, since, from_hit) == rule_id


def test_the_chapter_registers_its_rules() -> None:
    assert get_rule("KV-DATA-001").title == \
        "A hit only returns blocks whose contents are the request's prefix"
    assert {get_rule(r).chapter for r in KV_DATA} == {"data_integrity"}


# -- the adapters ----------------------------------------------------------------------------
def _serve(engine: EngineAdapter, request_id: str, prompt: tuple[int, ...]) -> Lookup:
    engine.add_request(request_id, prompt)
    hit = engine.lookup(request_id)
    assert engine.allocate(request_id, len(prompt) - hit.num_tokens, hit.num_tokens) is not None
    engine.advance(request_id, len(prompt) - hit.num_tokens)
    return hit


def _failures(engine: EngineAdapter) -> list[tuple[str, bool, str]]:
    return [c for c in engine.observe().data_checks or () if not c[1]]


def test_adapters_satisfy_the_protocol_and_gpu_is_built_in() -> None:
    assert isinstance(GpuEngine(), EngineAdapter)
    assert isinstance(TorchEngine(), EngineAdapter)
    assert engine_factory("gpu", get_suite("lockstep")) is GpuEngine
    assert builtin_engines()["gpu"] == ["manager"]
    caps = GpuEngine().capabilities()
    assert caps.kv_data and caps.exact_block_ids and caps.free_queue and caps.cache_map
    assert not TorchEngine().capabilities().kv_data


@pytest.mark.parametrize("factory", [GpuEngine, PagedReferenceEngine])
def test_a_hit_reads_back_the_prefix_and_wrong_data_is_named(factory) -> None:
    engine = factory()
    engine.configure(ManagerConfig(num_blocks=8, block_size=2, max_model_len=16))
    _serve(engine, "a", (1, 2, 3, 4, 5))
    hit = _serve(engine, "b", (1, 2, 3, 4, 9))
    assert hit.num_tokens == 4
    checks = engine.observe().data_checks
    assert {rule for rule, ok, _ in checks if ok} == set(KV_DATA)
    assert not _failures(engine)
    # A write into a block b holds (here: the store itself is tampered with) is an overwrite.
    store = engine.store
    on = {"device": store.device}  # the store's device: CUDA where there is one
    store.write(0, torch.tensor([1], **on), torch.tensor([0], **on), torch.tensor([12345], **on))
    assert [c[0] for c in _failures(engine)] == ["KV-DATA-003", "KV-DATA-003", "KV-DATA-004"]
    # A lookup reading a block with another prefix's data is a bad hit.
    engine.add_request("c", (1, 2, 3, 4, 7))
    engine.lookup("c")
    assert "KV-DATA-001" in [c[0] for c in _failures(engine)]


def test_the_null_block_is_watched() -> None:
    engine = GpuEngine()
    engine.configure(ManagerConfig(num_blocks=4, block_size=2, max_model_len=8))
    on = {"device": engine.store.device}
    engine.store.write(0, torch.tensor([0], **on), torch.tensor([1], **on), torch.tensor([5], **on))
    assert [c[0] for c in _failures(engine)] == ["KV-DATA-005"]


def test_the_wrapper_works_around_any_adapter_and_keeps_its_capabilities() -> None:
    from broken_engines import RelabelledBlocks

    engine = PagedStoreWrapper(RelabelledBlocks())
    assert engine.name == "relabelled-blocks+paged-store"
    caps = engine.capabilities()
    assert caps.kv_data and not caps.exact_block_ids
    engine.configure(ManagerConfig(num_blocks=8, block_size=2, max_model_len=16))
    _serve(engine, "a", (1, 2, 3, 4, 5))
    assert _serve(engine, "b", (1, 2, 3, 4, 9)).num_tokens == 4
    assert not _failures(engine)


# -- conformance -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 3])
def test_gpu_engine_conforms(tmp_path: Path, seed: int) -> None:
    result = run_suite("gpu", RunOptions(max_examples=120, seed=seed, replay_dir=tmp_path))
    outcomes = {rule: o.outcome for rule, o in result.verdicts.outcomes.items()}
    assert result.internal_errors == []
    assert not [r for r, o in outcomes.items() if o in ("fail", "error")], outcomes
    reference = run_suite("reference", RunOptions(max_examples=5, seed=seed, replay_dir=None))
    # Every rule the reference can be judged on, the gpu engine is judged on too -- and more --
    # but for models of several groups, which the single-group torch engine does not claim.
    for rule_id, outcome in reference.verdicts.outcomes.items():
        if outcome.not_applicable is None and rule_id not in GROUPS_ONLY:
            assert result.verdicts.outcomes[rule_id].not_applicable is None, rule_id
        elif outcome.not_applicable is None:  # not applicable for what the torch engine does not claim
            reason = result.verdicts.outcomes[rule_id].not_applicable or ""
            assert reason.startswith("engine does not claim "), (rule_id, reason)
            assert set(reason.removeprefix("engine does not claim ").split(", ")) <= {
                "kv_cache_groups", *get_rule(rule_id).needs}, (rule_id, reason)
    for rule_id in (*KV_DATA, "KV-POOL-004", "KV-POOL-006", "KV-POOL-007", "KV-POOL-008",
                    "KV-POOL-009", "KV-FULL-002", "KV-LIFE-003"):
        assert outcomes[rule_id] == "pass", (rule_id, outcomes[rule_id])
    assert not list(tmp_path.iterdir())


def test_kvoracle_check_engine_gpu_on_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "KVORACLE_CONTRACTS": "0", DEVICE_ENV: "cpu"}
    done = subprocess.run([sys.executable, "-m", "kvoracle", "check", "--engine", "gpu", "--suite", "lockstep",
                           "--max-examples", "60", "--seed", "5", "--no-replay"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert "engine gpu" in done.stdout, done.stdout + done.stderr
    for rule_id in KV_DATA:
        line = next(line for line in done.stdout.splitlines() if line.startswith(rule_id))
        assert "PASS" in line, line
    assert " FAIL " not in done.stdout and " ERROR " not in done.stdout


def test_the_allocator_benchmark_runs_and_prints_every_workload() -> None:
    """A smoke run of benchmarks/bench_allocator.py (its figures are printed, not asserted)."""
    script = Path(__file__).parent.parent / "benchmarks" / "bench_allocator.py"
    run = subprocess.run([sys.executable, str(script), "--pools", "300", "--batches", "1", "32",
                          "--budget", "0.01", "--impls", "reference", "torch-cpu"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "lookup/s" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines()
            if line.startswith(("reference ", "torch-cpu "))]
    assert len(rows) == 4 and all(len(row) == 7 for row in rows), run.stdout
    assert all(float(figure.replace(",", "")) > 0 for row in rows for figure in row[3:])
