"""Invariants of any engine's observation, judged without the reference.

These hold after every step whatever happened before, so they also judge an
engine whose state has drifted from the reference's for a reason already
reported. Each reuses the spec's predicate for the rule it checks.
"""

from __future__ import annotations

from collections import Counter

from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import lifecycle

from .adapter import EngineConfig, Observation
from .harness.verdicts import Verdicts


def check_all(verdicts: Verdicts, config: EngineConfig, observation: Observation) -> None:
    check = verdicts.check
    tables = observation.block_tables
    in_tables = Counter(b for groups in tables.values() for group in groups for b in group)
    queue = observation.free_queue
    counts = observation.ref_counts
    num_blocks = config.num_blocks

    check("KV-POOL-001", in_tables[0] == 0 and (queue is None or 0 not in queue),
          lambda: "the null block is in a full-attention block table or the free queue")
    if counts is not None:
        check("KV-POOL-002", len(counts) == num_blocks and counts[0] == 0,
              lambda: f"null block ref count {counts[0] if counts else None}")
        occurrences = tuple(in_tables.get(i, 0) for i in range(num_blocks))
        check("KV-POOL-011", pool_spec.refcounts_balanced(tuple(counts), occurrences),
              lambda: "ref counts " + str({i: (c, occurrences[i]) for i, c in enumerate(counts)
                                           if i and c != occurrences[i]})
              + " (count, table occurrences)")
    if queue is not None:
        check("KV-POOL-012", observation.num_free_blocks == len(queue),
              lambda: f"{observation.num_free_blocks} free blocks but a queue of {len(queue)}")
        check("KV-POOL-010", len(set(queue)) == len(queue),
              lambda: f"a block is twice in the free queue {queue}")
        if counts is not None:
            in_queue = [False] * num_blocks
            for block_id in queue:
                if 0 <= block_id < num_blocks:
                    in_queue[block_id] = True
            check("KV-POOL-010", pool_spec.free_iff_unreferenced(tuple(counts), tuple(in_queue)),
                  lambda: "blocks free with a reference or referenced yet free: " + str(
                      [i for i in range(1, num_blocks) if (counts[i] == 0) != in_queue[i]]))
    if 0 <= observation.num_free_blocks <= num_blocks - 1:
        check("KV-POOL-012", abs(observation.usage - pool_spec.usage(
            observation.num_free_blocks, num_blocks)) < 1e-9,
            lambda: f"usage {observation.usage} with {observation.num_free_blocks} free "
                    f"of {num_blocks - 1}")
    else:
        check("KV-POOL-012", False, lambda: f"{observation.num_free_blocks} free blocks "
                                            f"in a pool of {num_blocks}")
    max_blocks = lifecycle.cdiv(config.max_model_len, config.block_size)
    check("KV-LIFE-015", all(len(g) <= max_blocks for groups in tables.values() for g in groups),
          lambda: f"a table is longer than {max_blocks} blocks: {dict(tables)}")
    for rule_id, ok, message in observation.data_checks or ():  # KV-DATA, judged by the adapter
        check(rule_id, ok, message)

    cached = observation.cached
    if cached is None:
        return
    listed = Counter(b for blocks in cached.values() for b in blocks)
    check("KV-POOL-015", all(n == 1 for n in listed.values()) and 0 not in listed
          and all(blocks for blocks in cached.values()),
          lambda: f"a block is under two keys, the null block is cached, or a key is empty: "
                  f"{dict(listed)}")
    check("KV-HASH-005", all(group == 0 for _, group in cached), "a cache key names no group")
    check("KV-LIFE-012", config.enable_caching or not cached,
          lambda: f"{len(cached)} keys cached with prefix caching off")
