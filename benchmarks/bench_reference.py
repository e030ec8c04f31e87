#!/usr/bin/env python
"""Throughput of the reference KV-cache manager, with contracts on and off.

A benchmark script, not a test: it prints figures and asserts nothing about speed.

The unit is the *block operation*: one block handled by the block pool.

* ``pool`` workload -- a loop over :class:`BlockPool` alone: ``get_new_blocks``,
  ``cache_block``, ``free_blocks``, ``touch`` (prefix hits on free cached blocks)
  and ``evict_blocks``; every block passed to or returned by one of those calls
  counts as one operation.
* ``manager`` workload -- a closed-loop, scheduler-like replay of the Mooncake
  FAST'25 conversation trace through :class:`KVCacheManager`:
  ``get_computed_blocks`` -> ``allocate_slots`` -> advance ``num_computed_tokens``
  -> a few decode steps (``append_output_token_ids`` + ``allocate_slots(req, 1)``)
  -> ``free``. Operations = blocks allocated + hit blocks touched + blocks freed
  + blocks cached. Each trace hash id (a 512-token block in the trace) becomes one
  ``--block-size``-token block, lengths are scaled by the same factor and prompts
  are capped at ``--max-prompt-tokens``.

``KVORACLE_CONTRACTS`` is read when ``kvoracle.reference`` is imported, so each
mode runs in its own interpreter::

    python benchmarks/bench_reference.py                 # both modes, comparison table
    python benchmarks/bench_reference.py --mode off --json   # one mode, JSON on stdout

Every workload stops early when it exceeds ``--budget`` seconds (contracts on is
orders of magnitude slower); the figures then cover the work done so far and the
output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "mooncake-fast25" / "conversation_trace.jsonl"
TRACE_BLOCK_TOKENS = 512  # the block size the Mooncake trace's hash ids stand for
TARGET_OPS_PER_S = 20_000  # contracts off, on a 2-core machine (reported, never asserted)


# -- helpers -------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Budget:
    """Wall-clock budget of one workload; ``over()`` is cheap enough to call per step."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds
        self.hit = False

    def over(self) -> bool:
        if time.perf_counter() > self.deadline:
            self.hit = True
        return self.hit


# -- workload (a): the block pool alone ----------------------------------------------------
def bench_pool(num_blocks: int, batch: int, rounds: int, budget_s: float) -> dict:
    """Allocate / cache / free / touch (hits) / free / evict, ``rounds`` times.

    Each round allocates ``batch`` blocks from the front of the free queue (once the
    queue has cycled those are cached free blocks, which ``get_new_blocks`` evicts),
    caches each under a fresh key, frees them (tail first, as a request's table is
    freed), then looks up every other key cached ``lag`` rounds earlier and touches the
    blocks still cached under them -- prefix hits taken out of the middle of the
    free queue -- frees those again, and finally evicts ``batch // 8`` block ids
    (a rotating window; only cached ones lose their key).
    """
    from kvoracle.reference import BlockPool

    pool = BlockPool(num_blocks, enable_caching=True)
    lag = max(1, (num_blocks // batch) // 2)  # half a queue back: most still cached
    history: deque[list[bytes]] = deque(maxlen=lag)
    counts = dict.fromkeys(
        ("get_new_blocks", "cache_block", "free_blocks", "touch", "evict_blocks"), 0)
    hit_lookups = hits = 0
    next_key = 0
    evict_cursor = 1
    num_evict = max(1, batch // 8)
    budget = _Budget(budget_s)
    done = 0
    start = time.perf_counter()
    for _ in range(rounds):
        if budget.over():
            break
        blocks = pool.get_new_blocks(batch)
        counts["get_new_blocks"] += len(blocks)
        keys = []
        for block in blocks:
            key = next_key.to_bytes(8, "little")
            next_key += 1
            pool.cache_block(block, (key, 0))
            keys.append(key)
        counts["cache_block"] += len(blocks)
        pool.free_blocks(blocks[::-1])
        counts["free_blocks"] += len(blocks)

        if len(history) == lag:
            old_keys = history[0][::2]
            hit_lookups += len(old_keys)
            touched = [b for b in (pool.get_cached_block((k, 0)) for k in old_keys)
                       if b is not None]
            hits += len(touched)
            pool.touch(touched)
            counts["touch"] += len(touched)
            pool.free_blocks(touched[::-1])
            counts["free_blocks"] += len(touched)
        history.append(keys)

        evict = [(evict_cursor + i - 1) % (num_blocks - 1) + 1 for i in range(num_evict)]
        evict_cursor = evict[-1] % (num_blocks - 1) + 1
        pool.evict_blocks(evict)
        counts["evict_blocks"] += len(evict)
        done += 1
    wall = time.perf_counter() - start
    ops = sum(counts.values())
    return {
        "num_blocks": num_blocks,
        "batch": batch,
        "rounds_requested": rounds,
        "rounds_done": done,
        "budget_hit": budget.hit,
        "block_ops": ops,
        "ops_by_call": counts,
        "touch_hit_rate": hits / hit_lookups if hit_lookups else 0.0,
        "wall_s": wall,
        "block_ops_per_s": ops / wall if wall > 0 else 0.0,
    }


# -- workload (b): the manager under a scheduler-like loop -------------------------------
def load_trace(path: Path, num_requests: int, block_size: int, max_prompt_tokens: int,
               max_decode_tokens: int) -> list[tuple[tuple[int, ...], int]]:
    """(prompt token ids, decode steps) for the first ``num_requests`` trace lines.

    Hash id ``h`` becomes the block of tokens ``h * block_size + j`` (j < block_size),
    so equal hash-id prefixes give equal token prefixes and equal block hashes.
    """
    out = []
    with path.open() as trace:
        for line in trace:
            if len(out) >= num_requests:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            length = min(_cdiv(rec["input_length"] * block_size, TRACE_BLOCK_TOKENS),
                         len(rec["hash_ids"]) * block_size, max_prompt_tokens)
            tokens: list[int] = []
            for h in rec["hash_ids"]:
                if len(tokens) >= length:
                    break
                tokens.extend(range(h * block_size, (h + 1) * block_size))
            del tokens[length:]
            if not tokens:
                continue
            decode = max(1, min(_cdiv(rec["output_length"] * block_size, TRACE_BLOCK_TOKENS),
                                max_decode_tokens))
            out.append((tuple(tokens), decode))
    return out


def ideal_hit_rate(prompts: list[tuple[int, ...]], block_size: int) -> float:
    """Hit tokens / prompt tokens with an unbounded cache and no concurrency effects."""
    nodes: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent prefix, block) -> prefix
    hit = total = 0
    for tokens in prompts:
        total += len(tokens)
        max_blocks = (len(tokens) - 1) // block_size  # the last token is always recomputed
        parent, run, counting = -1, 0, True
        for i in range(len(tokens) // block_size):
            key = (parent, tokens[i * block_size:(i + 1) * block_size])
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = len(nodes)
                counting = False
            elif counting and i < max_blocks:
                run += 1
            parent = node
        hit += run * block_size
    return hit / total if total else 0.0


def bench_manager(workload: list[tuple[tuple[int, ...], int]], num_blocks: int,
                  block_size: int, max_model_len: int, max_running: int,
                  budget_s: float) -> dict:
    from kvoracle.reference import KVCacheManager, ManagerConfig, Request

    manager = KVCacheManager(ManagerConfig(num_blocks, block_size, max_model_len,
                                           hash_block_size=block_size, enable_caching=True,
                                           use_eagle=False))
    t0 = time.perf_counter()
    waiting = deque(
        (Request(f"req-{i}", tokens, block_size), decode)
        for i, (tokens, decode) in enumerate(workload))
    build_s = time.perf_counter() - t0

    allocated = touched = freed = cached = 0
    lookups = prompt_tokens = hit_tokens = 0
    finished = dropped = preempted = steps = decode_tokens = 0
    out_token = 1 << 40  # output tokens never collide with trace tokens
    # running entries: [request, decode steps left, blocks held, blocks cached]
    running: list[list] = []
    budget = _Budget(budget_s)
    start = time.perf_counter()
    while (waiting or running) and not budget.over():
        steps += 1
        # Admit waiting requests (prefill), in arrival order, while the batch has room.
        while waiting and len(running) < max_running and not budget.over():
            request, decode = waiting.popleft()
            computed, num_hit = manager.get_computed_blocks(request)
            lookups += 1
            prompt_tokens += request.num_tokens
            hit_tokens += num_hit
            num_new = request.num_tokens - num_hit
            new = manager.allocate_slots(request, num_new, num_hit, computed)
            if new is None:  # pool short: drop the request and stop admitting this step
                manager.free(request)
                dropped += 1
                break
            num_hit_blocks = len(computed.blocks[0])
            num_new_blocks = len(new.blocks[0])
            touched += num_hit_blocks
            allocated += num_new_blocks
            request.num_computed_tokens += num_hit + num_new
            # KV-LIFE-007: every full block of the computed tokens is now cached.
            num_cached = min(request.num_computed_tokens,
                             len(request.block_hashes) * block_size) // block_size
            cached += max(0, num_cached - num_hit_blocks)
            running.append([request, decode, num_hit_blocks + num_new_blocks,
                            max(num_cached, num_hit_blocks)])
        # One decode step for every running request.
        still_running = []
        for index, entry in enumerate(running):
            if budget.over():  # stop mid-step: the rest stay running, unfreed
                still_running.extend(running[index:])
                break
            request = entry[0]
            request.append_output_token_ids((out_token,))
            out_token += 1
            new = manager.allocate_slots(request, 1)
            if new is None:  # pool short: preempt (free and drop)
                manager.free(request)
                freed += entry[2]
                preempted += 1
                continue
            request.num_computed_tokens += 1
            decode_tokens += 1
            allocated += len(new.blocks[0])
            entry[2] += len(new.blocks[0])
            num_cached = min(request.num_computed_tokens,
                             len(request.block_hashes) * block_size) // block_size
            if num_cached > entry[3]:
                cached += num_cached - entry[3]
                entry[3] = num_cached
            entry[1] -= 1
            if entry[1] == 0:
                manager.free(request)
                freed += entry[2]
                finished += 1
            else:
                still_running.append(entry)
        running = still_running
    wall = time.perf_counter() - start
    ops = allocated + touched + freed + cached
    return {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "max_running": max_running,
        "requests_requested": len(workload),
        "requests_finished": finished,
        "requests_dropped": dropped,
        "requests_preempted": preempted,
        "requests_unfinished": len(waiting) + len(running),
        "scheduler_steps": steps,
        "decode_tokens": decode_tokens,
        "budget_hit": budget.hit,
        "block_ops": ops,
        "ops_by_kind": {"allocated": allocated, "touched": touched, "freed": freed,
                        "cached": cached},
        "prefix_hit_rate": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        "prompt_tokens": prompt_tokens,
        "hit_tokens": hit_tokens,
        "request_build_s": build_s,
        "wall_s": wall,
        "block_ops_per_s": ops / wall if wall > 0 else 0.0,
        "requests_per_s": finished / wall if wall > 0 else 0.0,
    }


# -- one mode, in this interpreter -------------------------------------------------------
def run_mode(args: argparse.Namespace) -> dict:
    os.environ["KVORACLE_CONTRACTS"] = "1" if args.mode == "on" else "0"
    import kvoracle.reference as reference  # the switch is read here, at first import

    if reference.CONTRACTS_ENABLED is not (args.mode == "on"):
        raise SystemExit(f"kvoracle.reference was imported before --mode {args.mode} took "
                         "effect; run this script in a fresh interpreter")
    workload = load_trace(args.trace, args.requests, args.block_size, args.max_prompt_tokens,
                          args.max_decode_tokens)
    max_model_len = args.max_prompt_tokens + args.max_decode_tokens
    result = {
        "mode": args.mode,
        "contracts_enabled": reference.CONTRACTS_ENABLED,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "trace": str(args.trace),
        "ideal_hit_rate": ideal_hit_rate([t for t, _ in workload], args.block_size),
    }
    result["pool"] = bench_pool(args.pool_blocks, args.pool_batch, args.pool_rounds,
                                args.budget)
    result["manager"] = bench_manager(workload, args.pool_blocks, args.block_size,
                                      max_model_len, args.max_running, args.budget)
    return result


def print_mode(res: dict) -> None:
    pool, mgr = res["pool"], res["manager"]
    print(f"contracts {res['mode']}: python {res['python']}, {res['cpu_count']} CPUs")
    print(f"  pool:    {pool['block_ops_per_s']:>12,.0f} block ops/s  "
          f"({pool['block_ops']:,} ops, {pool['rounds_done']}/{pool['rounds_requested']} rounds,"
          f" {pool['wall_s']:.2f} s{', budget hit' if pool['budget_hit'] else ''})")
    print(f"  manager: {mgr['block_ops_per_s']:>12,.0f} block ops/s, "
          f"{mgr['requests_per_s']:,.1f} requests/s, prefix hit rate "
          f"{mgr['prefix_hit_rate']:.1%} (ideal {res['ideal_hit_rate']:.1%}), "
          f"{mgr['wall_s']:.2f} s{', budget hit' if mgr['budget_hit'] else ''}")


# -- the parent: both modes in subprocesses, then a comparison ---------------------------
def _child(mode: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--mode", mode, "--json",
           "--requests", str(args.requests), "--pool-blocks", str(args.pool_blocks),
           "--pool-batch", str(args.pool_batch), "--pool-rounds", str(args.pool_rounds),
           "--block-size", str(args.block_size),
           "--max-prompt-tokens", str(args.max_prompt_tokens),
           "--max-decode-tokens", str(args.max_decode_tokens),
           "--max-running", str(args.max_running), "--budget", str(args.budget),
           "--trace", str(args.trace)]
    env = dict(os.environ, KVORACLE_CONTRACTS="1" if mode == "on" else "0")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"--mode {mode} failed with exit status {proc.returncode}")
    res = json.loads(proc.stdout)
    res["process_s"] = time.perf_counter() - t0
    return res


def _fmt(value: float, kind: str) -> str:
    if kind == "rate":
        return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "s":
        return f"{value:.2f}"
    return f"{value:,}"


def print_table(off: dict, on: dict) -> None:
    rows = [
        ("pool     block ops/s", ("pool", "block_ops_per_s"), "rate"),
        ("pool     block ops", ("pool", "block_ops"), "int"),
        ("pool     wall s", ("pool", "wall_s"), "s"),
        ("manager  block ops/s", ("manager", "block_ops_per_s"), "rate"),
        ("manager  requests/s", ("manager", "requests_per_s"), "rate"),
        ("manager  block ops", ("manager", "block_ops"), "int"),
        ("manager  requests finished", ("manager", "requests_finished"), "int"),
        ("manager  dropped+preempted", None, "int"),
        ("manager  prefix hit rate", ("manager", "prefix_hit_rate"), "pct"),
        ("manager  wall s", ("manager", "wall_s"), "s"),
        ("process wall s (incl. startup)", ("process_s",), "s"),
    ]

    def get(res: dict, path: tuple[str, ...] | None):
        if path is None:
            return res["manager"]["requests_dropped"] + res["manager"]["requests_preempted"]
        for part in path:
            res = res[part]
        return res

    width = 32
    print(f"{'metric':<{width}} {'contracts off':>15} {'contracts on':>15} {'off/on':>9}")
    print("-" * (width + 42))
    for label, path, kind in rows:
        a, b = get(off, path), get(on, path)
        ratio = f"{a / b:,.1f}x" if kind == "rate" and b else ""
        print(f"{label:<{width}} {_fmt(a, kind):>15} {_fmt(b, kind):>15} {ratio:>9}")
    print(f"ideal prefix hit rate (unbounded cache, same requests): {off['ideal_hit_rate']:.1%}")
    for res in (off, on):
        for name in ("pool", "manager"):
            if res[name]["budget_hit"]:
                print(f"note: contracts {res['mode']}: the {name} workload stopped at the "
                      f"--budget of the run; its figures cover the work done until then")
    if on["manager"]["budget_hit"]:
        print("note: with contracts on every pool/manager call checks invariants over all "
              f"{on['pool']['num_blocks']:,} blocks, so the on figures fall as --pool-blocks "
              "grows; a smaller pool (e.g. --pool-blocks 1000 --max-running 16) lets "
              "contracts-on requests finish within the budget")
    ops = min(off["pool"]["block_ops_per_s"], off["manager"]["block_ops_per_s"])
    verdict = "met" if ops >= TARGET_OPS_PER_S else "NOT met"
    print(f"\ntarget (reported, not asserted): contracts off >= {TARGET_OPS_PER_S:,} block ops/s "
          f"on a 2-core machine; slower workload measured {ops:,.0f} block ops/s -> {verdict} "
          f"(this machine: {off['cpu_count']} CPUs)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=("on", "off", "both"), default="both",
                   help="contracts on, off, or both (each in a subprocess) with a comparison")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--requests", type=int, default=2000,
                   help="trace requests replayed by the manager workload")
    p.add_argument("--pool-blocks", type=int, default=10_000,
                   help="blocks in the pool (both workloads)")
    p.add_argument("--pool-batch", type=int, default=64,
                   help="blocks allocated per round of the pool workload")
    p.add_argument("--pool-rounds", type=int, default=5000,
                   help="rounds of the pool workload")
    p.add_argument("--block-size", type=int, default=16,
                   help="tokens per block; each trace hash id becomes one block")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="prompt length cap")
    p.add_argument("--max-decode-tokens", type=int, default=16,
                   help="cap on decode steps per request (trace output length, scaled)")
    p.add_argument("--max-running", type=int, default=64,
                   help="requests running at once in the scheduler loop")
    p.add_argument("--budget", type=float, default=12.0,
                   help="seconds after which a workload stops early (per workload and mode)")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                   help="Mooncake conversation trace (JSON lines)")
    args = p.parse_args(argv)
    for name in ("requests", "pool_batch", "pool_rounds", "block_size", "max_prompt_tokens",
                 "max_decode_tokens", "max_running"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.pool_blocks < args.pool_batch + 1:
        p.error("--pool-blocks must exceed --pool-batch")
    if not args.trace.is_file():
        p.error(f"trace not found: {args.trace}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode != "both":
        res = run_mode(args)
        if args.json:
            json.dump(res, sys.stdout, indent=2)
            print()
        else:
            print_mode(res)
        return 0
    off = _child("off", args)
    on = _child("on", args)
    if args.json:
        json.dump({"off": off, "on": on}, sys.stdout, indent=2)
        print()
    else:
        for res in (off, on):
            print_mode(res)
        print()
        print_table(off, on)
    return 0


if __name__ == "__main__":
    sys.exit(main())
