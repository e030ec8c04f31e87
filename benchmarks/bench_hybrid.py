#!/usr/bin/env python
"""Cost of a hybrid cache-hit lookup against the number of groups and the prompt length.

A benchmark script, not a test: it prints figures and asserts nothing about speed.

For each (groups, prompt tokens) cell it builds a reference
:class:`~kvoracle.reference.hybrid.HybridCoordinator` with contracts off, seeds the
cache with one prompt in every group (a random 90 % of the blocks, so the fixed point
has to shrink the candidate a few times), then times ``find_longest_cache_hit`` on that
prompt. It prints lookups/second and microseconds per (group x block): if the fixed
point stays O(groups x blocks) per lookup, that last column stays roughly flat as the
cells grow. The issue's headline figure is the 4-group, 4,096-token cell.

    python benchmarks/bench_hybrid.py            # the table
    python benchmarks/bench_hybrid.py --json     # one JSON object per cell
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

os.environ.setdefault("KVORACLE_CONTRACTS", "0")  # must precede the kvoracle imports

from kvoracle.reference.hybrid import HybridConfig, HybridCoordinator
from kvoracle.reference.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvoracle.spec.hashing import NONE_HASH, hash_blocks

HASH_BLOCK_SIZE = 16


def group_specs(num_groups: int) -> tuple[KVCacheSpec, ...]:
    """Full attention first, then sliding windows of growing size, then Mamba."""
    pool: list[KVCacheSpec] = [
        FullAttentionSpec(32),
        SlidingWindowSpec(16, sliding_window=128),
        MambaSpec(HASH_BLOCK_SIZE),
        SlidingWindowSpec(32, sliding_window=512),
    ]
    return tuple(pool[:num_groups])


def measure(num_groups: int, prompt_tokens: int, use_eagle: bool, budget: float, seed: int) -> dict:
    rng = random.Random(seed)
    specs = group_specs(num_groups)
    blocks_needed = sum(prompt_tokens // s.block_size for s in specs) + 2
    coordinator = HybridCoordinator(HybridConfig(
        specs, num_blocks=blocks_needed, max_model_len=prompt_tokens + 1,
        hash_block_size=HASH_BLOCK_SIZE, use_eagle=use_eagle))
    tokens = [rng.randrange(50_000) for _ in range(prompt_tokens + 1)]
    hashes = hash_blocks(NONE_HASH, tokens, 0, len(tokens) // HASH_BLOCK_SIZE, HASH_BLOCK_SIZE)
    for group_id, kv_spec in enumerate(specs):
        num_blocks = prompt_tokens // kv_spec.block_size
        coordinator.seed_cache(hashes, group_id, [rng.random() < 0.9 for _ in range(num_blocks)])
    lookups = 0
    hit = 0
    start = time.perf_counter()
    while True:
        _, hit, _ = coordinator.find_longest_cache_hit(hashes, prompt_tokens)
        lookups += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget and lookups >= 3:
            break
    group_blocks = sum(prompt_tokens // s.block_size for s in specs)
    return {
        "groups": num_groups,
        "prompt_tokens": prompt_tokens,
        "eagle": use_eagle,
        "lookups": lookups,
        "seconds": elapsed,
        "lookups_per_second": lookups / elapsed,
        "us_per_group_block": elapsed / lookups / group_blocks * 1e6,
        "hit_tokens": hit,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per cell (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object per cell")
    args = parser.parse_args(argv)
    cells = [(g, n) for g in (1, 2, 4) for n in (512, 1024, 4096)]
    if not args.json:
        print(f"reference hybrid lookup, contracts off; python {platform.python_version()}, "
              f"{platform.machine()}, {os.cpu_count()} CPUs")
        print(f"{'groups':>6} {'tokens':>6} {'eagle':>5} {'lookups/s':>10} {'us/(group*block)':>17} {'hit':>5}")
    for eagle in (False, True):
        for groups, tokens in cells:
            row = measure(groups, tokens, eagle, args.budget, args.seed)
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{groups:>6} {tokens:>6} {eagle!s:>5} {row['lookups_per_second']:>10.1f} "
                      f"{row['us_per_group_block']:>17.3f} {row['hit_tokens']:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
