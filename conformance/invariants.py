"""Invariants of any engine's observation, judged without the reference.

These hold after every step whatever happened before, so they also judge an
engine whose state has drifted from the reference's for a reason already
reported. Each reuses the spec's predicate for the rule it checks. They hold for a
model of one full-attention group (a ``ManagerConfig``) and of several groups (a
``HybridConfig``) alike. Where two rules state one fact the configuration picks the
rule: the null block in a one-group table or the free queue is KV-POOL-001's; in a
table of several groups, where windowed tables may start with null entries, it is
KV-HYB-013's (and the free queue's null block KV-POOL-002's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kvoracle.reference import HybridConfig, ManagerConfig, group_kinds, groups_config
from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as lifecycle_spec
from kvoracle.spec import lifecycle
from kvoracle.spec import mamba as mamba_spec

from .adapter import Observation
from .harness.verdicts import Verdicts

NULL_BLOCK_ID = 0
#: Kinds whose tables are bounded by max_model_len (a Mamba group's speculative blocks and a
#: cross-attention group's encoder blocks are not).
_TOKEN_TABLE_KINDS = (hybrid_spec.FULL, hybrid_spec.SLIDING_WINDOW, hybrid_spec.CHUNKED_LOCAL)


def in_any_table(tables: object) -> set[int]:
    return {b for entries in tables.values() for table in entries for b in table}  # type: ignore[attr-defined]


def check_all(verdicts: Verdicts, config: ManagerConfig | HybridConfig, observation: Observation,
              held: Mapping[int, int] | None = None) -> None:
    """``held``: references the caller knows pages hold outside the tables -- both pages of each
    copy queued and not yet taken (KV-MAMBA-025); an imbalance only there is that rule's."""
    check = verdicts.check
    groups = groups_config(config)
    kinds = group_kinds(config)
    sizes = [kv_spec.block_size for kv_spec in groups.kv_cache_specs]
    tables = observation.block_tables
    queue = observation.free_queue
    counts = observation.ref_counts
    num_blocks = groups.num_blocks

    if isinstance(config, ManagerConfig):
        null_free = NULL_BLOCK_ID not in in_any_table(tables) and (queue is None or NULL_BLOCK_ID not in queue)
        check("KV-POOL-001", null_free,
              lambda: "the null block is in a full-attention block table or the free queue")
    else:  # several groups: where a table may hold null entries
        # An align-mode Mamba table has nulls anywhere but at its end (KV-MAMBA-013), not KV-HYB-013's.
        speculative = {g: kv.num_speculative_blocks for g, kv in enumerate(groups.kv_cache_specs)
                       if getattr(kv, "mamba_cache_mode", None) == "align"}
        for rid, entries in tables.items():
            for g, (kind, table) in enumerate(zip(kinds, entries)):
                nulls = tuple(b == NULL_BLOCK_ID for b in table)
                if g in speculative:
                    check("KV-MAMBA-013", mamba_spec.align_table_ok(nulls, speculative[g]),
                          lambda rid=rid, g=g, table=table: f"Mamba table of {rid} (align mode, "
                          f"{speculative[g]} speculative pages) is {list(table)}: its last "
                          f"{1 + speculative[g]} entries must not be null")
                    continue
                check("KV-HYB-013", lifecycle_spec.table_nulls_ok(kind, nulls),
                      lambda rid=rid, kind=kind, table=table: f"{kind} table of {rid} is {list(table)}: "
                      "null entries (id 0) only as a prefix of a windowed table, none elsewhere")
    in_tables = Counter(b for entries in tables.values() for table in entries for b in table
                        if b != NULL_BLOCK_ID)
    if counts is not None:
        check("KV-POOL-017", pool_spec.null_count_untouched(tuple(counts)),
              lambda: f"null block ref count {counts[0]}")
        extra = held or {}
        occurrences = tuple(in_tables.get(i, 0) + extra.get(i, 0) for i in range(num_blocks))
        off = {i for i, c in enumerate(counts) if i and i < num_blocks and c != occurrences[i]}
        check("KV-MAMBA-025" if off and off <= set(extra) else "KV-POOL-011",
              len(counts) == num_blocks and pool_spec.refcounts_balanced(tuple(counts), occurrences),
              lambda: f"{len(counts)} reference counts for {num_blocks} blocks" if len(counts) != num_blocks
              else "ref counts " + str({i: (c, occurrences[i]) for i, c in enumerate(counts)
                                        if i and c != occurrences[i]}) + " (count, table occurrences"
              + (" and queued copies" if extra else "") + ")")
    if queue is not None:
        check("KV-POOL-002", NULL_BLOCK_ID not in queue, lambda: f"the null block is in the free queue {queue}")
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
    too_long = [(rid, g) for rid, entries in tables.items() for g, table in enumerate(entries)
                if g < len(kinds) and kinds[g] in _TOKEN_TABLE_KINDS
                and len(table) > lifecycle.cdiv(groups.max_model_len, sizes[g])]
    check("KV-LIFE-015", not too_long,
          lambda: f"tables longer than max_model_len needs (request, group): {too_long}; {dict(tables)}")
    for rule_id, ok, message in observation.data_checks or ():  # KV-DATA, judged by the adapter
        check(rule_id, ok, message)

    cached = observation.cached
    if cached is None:
        return
    cross = {g for g, kind in enumerate(kinds) if kind == lifecycle_spec.CROSS_ATTENTION}
    if cross:  # before the caching rules: a cached cross-attention block is this rule's
        keys = [key for key in cached if key[1] in cross]
        check("KV-CROSS-002", not keys, lambda: f"cross-attention blocks are cached under {len(keys)} keys: "
              f"{[(k.hex()[:8] if isinstance(k, bytes) else k, g, cached[(k, g)]) for k, g in keys]}")
    listed = Counter(b for blocks in cached.values() for b in blocks)
    check("KV-POOL-015", all(n == 1 for n in listed.values()) and NULL_BLOCK_ID not in listed
          and all(blocks for blocks in cached.values()),
          lambda: f"a block is under two keys, the null block is cached, or a key is empty: "
                  f"{dict(listed)}")
    check("KV-HASH-005", all(isinstance(group, int) and 0 <= group < len(kinds) for _, group in cached),
          "a cache key names no group of the model")
    check("KV-LIFE-012", groups.enable_caching or not cached,
          lambda: f"{len(cached)} keys cached with prefix caching off")
