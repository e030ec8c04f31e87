"""Batched block-pool throughput: reference vs vLLM's BlockPool vs the torch allocator.

Measures allocate / free / touch / lookup throughput in blocks (keys) per second at
several batch sizes and pool sizes, and the memory of allocator state per block. Figures
are printed, never asserted.

    python benchmarks/bench_allocator.py                     # every implementation found
    python benchmarks/bench_allocator.py --pools 10000 --batches 1 64 4096 --budget 0.5

Implementations, each skipped when it cannot be imported:

``reference``   kvoracle.reference.BlockPool, contracts off (KVORACLE_CONTRACTS=0 is set
                before kvoracle is imported);
``vllm``        vllm.v1.core.block_pool.BlockPool (run this script with the interpreter of
                a vLLM environment, e.g. .venv-vllm/bin/python);
``torch-cpu``   kvoracle.gpu.TorchBlockPool on the CPU;
``torch-cuda``  the same on CUDA, when a device is present.

Workloads, per (pool size N, batch b):

allocate  pop b blocks at a time from a fresh queue until fewer than b are free;
free      free b-block batches (each tail first, as a request frees its table) of an
          allocated pool, the queue growing at the front;
touch     touch b blocks at a time, picked at random among free blocks, so that each one
          leaves the middle of the queue (the costly case of a prefix hit);
lookup    with every block cached under its own key, look up b keys (half of them cached)
          right after the cache changed: before each batch one block is evicted and cached
          again under a new key (untimed), as a serving step caches and evicts between the
          lookups of the next step's requests.

Only the operations are timed. The Python pools take lists of their block objects, the
torch pool int64 id tensors already on its device, as each engine would hold them. Each
workload is repeated on the same pool (untimed resets in between) until ``--budget``
seconds of timed work are spent.
torch runs on one CPU thread unless ``--threads`` says otherwise: the Python pools use
one core, and a batch of a few thousand ids is too small to gain from more.
Memory: Python pools by tracemalloc around construction; the torch pool counts its
per-block tensors (``TorchBlockPool.state_bytes``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
import tracemalloc
from collections.abc import Callable

os.environ["KVORACLE_CONTRACTS"] = "0"  # before kvoracle is imported

from kvoracle.reference import BlockPool

try:
    from kvoracle.gpu import TorchBlockPool, torch
except ImportError:  # pragma: no cover - torch is optional for this script
    TorchBlockPool = None  # type: ignore[assignment,misc]
    torch = None  # type: ignore[assignment]


#: Batches prepared (untimed) per free / touch measurement: more than a budget uses.
MAX_BATCHES = 50_000


class PythonPool:
    """The reference's or vLLM's pool behind one interface (lists of block objects)."""

    def __init__(self, kind: str, num_blocks: int) -> None:
        self.kind = kind
        if kind == "reference":
            self.pool = BlockPool(num_blocks, enable_caching=True)
            self.allocate = self.pool.get_new_blocks
            self.free = self.pool.free_blocks
            self.touch = self.pool.touch
            self.num_free = self.pool.num_free_blocks
            self.lookup = lambda keys: [self.pool.get_cached_block((key, 0)) for key in keys]
        else:
            from vllm.v1.core.block_pool import BlockPool as VllmBlockPool

            self.pool = VllmBlockPool(num_blocks, enable_caching=True, hash_block_size=16)
            self.allocate = self.pool.get_new_blocks
            self.free = self.pool.free_blocks
            self.touch = self.pool.touch
            self.num_free = self.pool.get_num_free_blocks
            self.lookup = lambda keys: [self.pool.get_cached_block(key, [0]) for key in keys]

    def handles(self, ids: list[int]) -> list:
        return [self.pool.blocks[i] for i in ids]

    def reversed(self, handles: list) -> list:
        return handles[::-1]

    def keys(self, numbers: list[int]) -> list[bytes]:
        return [n.to_bytes(32, "little") for n in numbers]

    def cache(self, block_ids: list[int], keys: list[bytes]) -> None:
        """Cache blocks under keys (untimed set-up)."""
        if self.kind == "reference":
            self.pool.cache_blocks([(self.pool.blocks[b], (k, 0)) for b, k in zip(block_ids, keys)])
            return
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        for block_id, key in zip(block_ids, keys):  # what cache_full_blocks does per block
            block = self.pool.blocks[block_id]
            block.set_block_hash(make_block_hash_with_group_id(key, 0))
            self.pool.cached_block_hash_to_block.insert(block.block_hash, block)

    def evict(self, block_ids: list[int]) -> None:
        self.pool.evict_blocks(set(block_ids) if self.kind == "vllm" else block_ids)

    def sync(self) -> None:
        return None


class TensorPool:
    def __init__(self, device: str, num_blocks: int) -> None:
        self.pool = TorchBlockPool(num_blocks, True, device)
        self.device = self.pool.device
        self.allocate = self.pool.allocate
        self.free = self.pool.free
        self.touch = self.pool.touch
        self.num_free = self.pool.num_free_blocks

    def handles(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def reversed(self, handles: torch.Tensor) -> torch.Tensor:
        return handles.flip(0)

    def keys(self, numbers: list[int]) -> torch.Tensor:
        return torch.tensor(numbers, dtype=torch.int64, device=self.device)  # key ids

    def cache(self, block_ids: list[int], keys: torch.Tensor) -> None:
        self.pool.cache(self.handles(block_ids), keys)

    def evict(self, block_ids: list[int]) -> None:
        self.pool.evict(self.handles(block_ids))

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        return self.pool.lookup(keys)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _timed(pool, operation: Callable[[], object]) -> tuple[float, object]:
    pool.sync()
    start = time.perf_counter()
    result = operation()
    pool.sync()
    return time.perf_counter() - start, result


def bench_allocate(pool, batch: int, budget: float) -> float:
    spent, blocks = 0.0, 0
    while spent < budget:  # a fresh queue each pass, until the budget is spent
        held = []
        while pool.num_free() >= batch and spent < budget:
            elapsed, got = _timed(pool, lambda: pool.allocate(batch))
            spent += elapsed
            blocks += batch
            held.append(got)
        for got in held:  # untimed: back to an all-free pool
            pool.free(got)
    return blocks / spent


def bench_free(pool, batch: int, budget: float, num_blocks: int) -> float:
    spent, blocks = 0.0, 0
    while spent < budget:
        batches = [pool.reversed(pool.allocate(batch))
                   for _ in range(min((num_blocks - 1) // batch, MAX_BATCHES))]
        for tail_first in batches:
            if spent < budget:
                elapsed, _ = _timed(pool, lambda tail_first=tail_first: pool.free(tail_first))
                spent += elapsed
                blocks += batch
            else:
                pool.free(tail_first)
    return blocks / spent


def bench_touch(pool, batch: int, budget: float, num_blocks: int) -> float:
    spent, blocks, rounds = 0.0, 0, 0
    while spent < budget:
        order = list(range(1, num_blocks))
        random.Random(rounds).shuffle(order)
        rounds += 1
        batches = [pool.handles(order[i:i + batch])
                   for i in range(0, min(len(order) - batch + 1, MAX_BATCHES * batch), batch)]
        touched = []
        for handles in batches:
            if spent >= budget:
                break
            elapsed, _ = _timed(pool, lambda handles=handles: pool.touch(handles))
            spent += elapsed
            blocks += batch
            touched.append(handles)
        for handles in touched:  # untimed: every block free again
            pool.free(handles)
    return blocks / spent


def bench_lookup(kind: str, num_blocks: int, batch: int, budget: float) -> float:
    """Keys looked up per second, each batch right after one block was cached anew."""
    pool = make_pool(kind, num_blocks)  # a pool of its own: every block gets cached
    blocks = list(range(1, num_blocks))
    pool.cache(blocks, pool.keys(blocks))  # block b under key b
    rng = random.Random(num_blocks + batch)
    spent, looked_up, fresh = 0.0, 0, num_blocks
    while spent < budget:
        block = rng.randrange(1, num_blocks)  # untimed: the cache changes between steps
        pool.evict([block])
        pool.cache([block], pool.keys([fresh]))
        fresh += 1
        # Half hits, half keys never cached (or evicted).
        queries = pool.keys([rng.randrange(1, num_blocks) if i % 2 else num_blocks * 4 + i
                             for i in range(batch)])
        elapsed, _ = _timed(pool, lambda queries=queries, pool=pool: pool.lookup(queries))
        spent += elapsed
        looked_up += batch
    del pool
    gc.collect()  # untimed: a million cached Python blocks are not left to the next workload
    return looked_up / spent


def python_bytes_per_block(kind: str, num_blocks: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = PythonPool(kind, num_blocks)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del pool
    return (after - before) / num_blocks


def available(requested: list[str]) -> list[str]:
    found = []
    for kind in requested:
        if kind == "vllm":
            try:
                import vllm.v1.core.block_pool  # noqa: F401
            except ImportError:
                print("vllm: not importable here, skipped (run with a vLLM environment's python)")
                continue
        if kind.startswith("torch") and TorchBlockPool is None:
            print(f"{kind}: torch is not installed, skipped")
            continue
        if kind == "torch-cuda" and not torch.cuda.is_available():
            print("torch-cuda: no CUDA device, skipped")
            continue
        found.append(kind)
    return found


def make_pool(kind: str, num_blocks: int):
    if kind in ("reference", "vllm"):
        return PythonPool(kind, num_blocks)
    return TensorPool("cuda" if kind == "torch-cuda" else "cpu", num_blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 4096])
    parser.add_argument("--impls", nargs="+",
                        default=["reference", "vllm", "torch-cpu", "torch-cuda"])
    parser.add_argument("--budget", type=float, default=0.4,
                        help="seconds of timed work per measurement (default 0.4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, like the single-threaded Python "
                             "pools)")
    args = parser.parse_args(argv)
    if torch is not None:
        torch.set_num_threads(args.threads)
    impls = available(args.impls)
    if torch is not None:
        print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} CPU threads, CUDA {torch.cuda.is_available()}")
    results: dict[tuple[str, int, int], tuple[float, ...]] = {}
    print(f"\n{'implementation':<12} {'pool':>9} {'batch':>6} {'allocate/s':>13} "
          f"{'free/s':>13} {'touch/s':>13} {'lookup/s':>13}")
    for num_blocks in args.pools:
        for kind in impls:
            pool = make_pool(kind, num_blocks)
            for batch in args.batches:
                if batch > num_blocks - 1:
                    continue
                figures = (bench_allocate(pool, batch, args.budget),
                           bench_free(pool, batch, args.budget, num_blocks),
                           bench_touch(pool, batch, args.budget, num_blocks),
                           bench_lookup(kind, num_blocks, batch, args.budget))
                results[kind, num_blocks, batch] = figures
                print(f"{kind:<12} {num_blocks:>9,} {batch:>6} "
                      + " ".join(f"{f:>13,.0f}" for f in figures), flush=True)
            del pool
    print("\nallocator state per block (bytes)")
    for kind in impls:
        num_blocks = min(args.pools)
        if kind in ("reference", "vllm"):
            size = python_bytes_per_block(kind, num_blocks)
        else:
            size = make_pool(kind, num_blocks).pool.state_bytes() / num_blocks
        print(f"  {kind:<12} {size:8.1f}")
    if "vllm" in impls:
        print("\nspeed-up over vLLM's BlockPool (allocate / free / touch / lookup)")
        for kind in (k for k in impls if k.startswith("torch")):
            for (impl, num_blocks, batch), figures in results.items():
                base = results.get(("vllm", num_blocks, batch))
                if impl == kind and base:
                    ratios = " / ".join(f"{f / b:.1f}x" for f, b in zip(figures, base))
                    print(f"  {kind:<12} pool {num_blocks:>9,} batch {batch:>5}: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
