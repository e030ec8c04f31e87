"""The hybrid lifecycle suite: an engine's hybrid allocations, caching and frees in lockstep.

The lookup suite (:mod:`.hybrid_lookup`) judges one answer. This suite follows
requests through a hybrid model's whole lifecycle (spec chapter
``hybrid_lifecycle``): a waiting request looks its hit up and adopts it, is
scheduled chunk by chunk and decodes, is preempted or finishes, while the window
of its sliding-window and chunked-local groups moves on and frees blocks; cached
blocks are evicted by a connector or the whole prefix cache is reset. A rule of
its own prefills prompts that end inside a coarse full-attention block and
finishes them at once, the case of vLLM's partial tail entries (KV-HLC-006). The
engine behind :class:`HybridLifecycleAdapter` and kvoracle's reference
(:class:`kvoracle.reference.hybrid_manager.HybridKVCacheManager`) apply the same
steps; after each step the driver compares what the operation returned, then the
two observations field by field (block tables per group, ref counts, free queue,
cache map), then checks the invariants any engine's observation must satisfy.

Configurations: 1 to 3 groups of full attention, sliding window (windows 1 to
12) and chunked local attention, block sizes multiples of the hash block size,
EAGLE on or off, a small pool; with prefix caching off, a cross-attention group
sized by the request's encoder tokens (KV-HLC-007), and Mamba groups in "none"
mode (KV-HLC-008), sometimes one block per request. Mamba with caching on is not
generated: its "align" allocation is not specified (KV-MAMBA-003).

Cross attention is never prefix-cached (KV-CROSS-002), and that rule comes before the
general ones that would also see it: a lookup's entries in a cross-attention group are
charged to it before the hit comparison; a cache key of a cross-attention group before
KV-POOL-015 and KV-LIFE-012 (caching off caches nothing); and a cross-attention block a
waiting request holds without its allocation having given it before the table
comparison.

An engine in a paged KV store (``--engine paged-reference`` or ``paged-vllm``,
:mod:`.engines.paged_store`) claims ``kv_data``: its observations carry the store's data
checks, one tensor per group, and the suite judges the KV-DATA rules too.

Run it with ``kvoracle check --suite hybrid-lifecycle [--engine reference|vllm|module:Class]``.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvoracle.reference.hybrid import HybridConfig
from kvoracle.reference.hybrid_manager import HybridKVCacheManager
from kvoracle.reference.kv_cache_spec import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec.lifecycle import cdiv

from .adapter import RETURNS, Lookup, Observation
from .engines.reference import ReferenceEngine
from .harness.driver import Driver
from .harness.machine import SuiteMachine
from .harness.suites import SuiteDef, register_suite
from .harness.verdicts import Verdicts
from .steps import Evict, ResetPrefixCache

NULL_BLOCK_ID = 0
TOKENS = st.integers(0, 3)
MAX_LIVE_REQUESTS = 4

#: One group, flat: (kind, block size, window or chunk size or a Mamba group's speculative
#: blocks, 0 if none).
GroupDesc = tuple[str, int, int]


@runtime_checkable
class HybridLifecycleAdapter(Protocol):
    """An engine's hybrid KV-cache manager behind engine-neutral operations."""

    name: str

    def version(self) -> str: ...

    def configure(self, config: HybridConfig) -> None:
        """Build a fresh engine (an empty pool) for ``config``."""

    def add_request(self, request_id: str, prompt: Sequence[int]) -> None: ...

    def lookup(self, request_id: str) -> Lookup:
        """``get_computed_blocks`` of a waiting request (null entries as block id 0);
        the adapter remembers the hit for :meth:`allocate`."""

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        """``allocate_slots``; a non-zero hit adopts the blocks of the last lookup and counts
        as computed. New block ids per group, or ``None`` when the pool is short."""

    def advance(self, request_id: str, num_tokens: int) -> None: ...

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None: ...

    def free(self, request_id: str, preempted: bool = False) -> None: ...

    def evict(self, block_ids: Sequence[int]) -> None:
        """``evict_blocks``: forget these blocks' cache keys (KV-POOL-013)."""

    def reset_prefix_cache(self) -> bool: ...

    def observe(self) -> Observation:
        """Tables of requests holding a block (per group), ref counts, the free queue and the
        cache map keyed by (kvoracle prefix hash, group id)."""


class ReferenceHybridLifecycle(ReferenceEngine):
    """kvoracle's reference hybrid manager behind :class:`HybridLifecycleAdapter`: the
    single-group reference adapter over :class:`HybridKVCacheManager` (requests, hits,
    scheduling bookkeeping and observation are the same)."""

    def make_manager(self, config: HybridConfig) -> HybridKVCacheManager:  # type: ignore[override]
        return HybridKVCacheManager(config)


# -- steps ---------------------------------------------------------------------------------
@attrs.frozen
class LifecycleSetup:
    """Configure both sides. Every request has ``num_encoder_tokens`` encoder tokens."""

    primary_rule = "KV-HLC-001"

    groups: tuple[GroupDesc, ...]
    hash_block_size: int
    num_blocks: int
    max_model_len: int
    use_eagle: bool = False
    enable_caching: bool = True
    num_encoder_tokens: int = 0

    def config(self) -> HybridConfig:
        return HybridConfig(tuple(_kv_spec(g) for g in self.groups), self.num_blocks, self.max_model_len,
                            self.hash_block_size, self.use_eagle, self.enable_caching)


@attrs.frozen
class Arrive:
    primary_rule = "KV-HLC-001"

    request_id: str
    prompt: tuple[int, ...]


@attrs.frozen
class Run:
    """Schedule ``num_new_tokens`` (a waiting request first looks up and adopts its hit)."""

    primary_rule = "KV-HLC-001"

    request_id: str
    num_new_tokens: int
    num_draft_tokens: int = 0
    num_lookahead_tokens: int = 0
    delay_cache_blocks: bool = False


@attrs.frozen
class Decode:
    primary_rule = "KV-HLC-001"

    request_id: str
    tokens: tuple[int, ...]


@attrs.frozen
class Release:
    primary_rule = "KV-LIFE-009"

    request_id: str
    preempted: bool = False


def _kv_spec(group: GroupDesc) -> KVCacheSpec:
    kind, size, param = group
    if kind == hybrid_spec.SLIDING_WINDOW:
        return SlidingWindowSpec(size, sliding_window=param)
    if kind == hybrid_spec.CHUNKED_LOCAL:
        return ChunkedLocalAttentionSpec(size, attention_chunk_size=param)
    if kind == spec.CROSS_ATTENTION:
        return CrossAttentionSpec(size)
    if kind == hybrid_spec.MAMBA:
        return MambaSpec(size, mamba_cache_mode="none", num_speculative_blocks=param)
    return FullAttentionSpec(size)


# -- judging -------------------------------------------------------------------------------
def _diff(label: str, expected: object, actual: object) -> str:
    return f"{label}: reference {expected!r}, engine {actual!r}"


def check_invariants(verdicts: Verdicts, setup: LifecycleSetup, observation: Observation) -> None:
    """What any hybrid engine's observation satisfies, judged without the reference."""
    check = verdicts.check
    num_blocks = setup.num_blocks
    kinds = [kind for kind, _, _ in setup.groups]
    for rid, groups in observation.block_tables.items():
        for kind, table in zip(kinds, groups):
            check("KV-HYB-013", spec.table_nulls_ok(kind, tuple(b == NULL_BLOCK_ID for b in table)),
                  lambda rid=rid, kind=kind, table=table: f"{kind} table of {rid} is {list(table)}: "
                  "null entries (id 0) only as a prefix of a windowed table, none elsewhere")
    counts, queue = observation.ref_counts, observation.free_queue
    in_tables = Counter(b for groups in observation.block_tables.values() for t in groups for b in t
                        if b != NULL_BLOCK_ID)
    if counts is not None:
        check("KV-POOL-002", len(counts) == num_blocks and counts[0] == 0,
              lambda: f"null block ref count {counts[0] if counts else None}")
        occurrences = tuple(in_tables.get(i, 0) for i in range(num_blocks))
        check("KV-POOL-011", pool_spec.refcounts_balanced(tuple(counts), occurrences),
              lambda: "ref counts " + str({i: (c, occurrences[i]) for i, c in enumerate(counts)
                                           if i and c != occurrences[i]}) + " (count, table occurrences)")
    if queue is not None:
        check("KV-POOL-002", NULL_BLOCK_ID not in queue, lambda: f"the null block is in the free queue {queue}")
        check("KV-POOL-012", observation.num_free_blocks == len(queue),
              lambda: f"{observation.num_free_blocks} free blocks but a queue of {len(queue)}")
        check("KV-POOL-010", len(set(queue)) == len(queue), lambda: f"a block is twice in the free queue {queue}")
    if observation.cached is not None:
        cross = {g for g, kind in enumerate(kinds) if kind == spec.CROSS_ATTENTION}
        if cross:  # before the caching rules: a cached cross-attention block is this rule's
            keys = [key for key in observation.cached if key[1] in cross]
            check("KV-CROSS-002", not keys,
                  lambda: f"cross-attention blocks are cached: {_short({k: observation.cached[k] for k in keys})}")
        listed = Counter(b for blocks in observation.cached.values() for b in blocks)
        check("KV-POOL-015", all(n == 1 for n in listed.values()) and NULL_BLOCK_ID not in listed,
              lambda: f"a block is under two keys or the null block is cached: {dict(listed)}")
        check("KV-LIFE-012", setup.enable_caching or not observation.cached,
              lambda: f"{len(observation.cached)} keys cached with prefix caching off")
    for rule_id, ok, message in observation.data_checks or ():  # KV-DATA, judged by the store
        check(rule_id, ok, message)


class LifecycleDriver(Driver):
    """Applies steps to the engine and the reference, and judges each one."""

    suite_name = "hybrid-lifecycle"
    fault_rule = "KV-HLC-001"

    def prepare(self) -> None:
        self.model = ReferenceHybridLifecycle()
        self.setup: LifecycleSetup | None = None
        #: Requests that have been allocated since they arrived or were preempted.
        self.running: set[str] = set()

    def _judge(self, rules: dict[str, str]) -> Observation:
        """Invariants of the engine's observation, then field-by-field comparison."""
        assert self.setup is not None
        expected = self.model.observe()
        actual: Observation = self.call("observe", rule="KV-HLC-001")  # type: ignore[assignment]
        check_invariants(self.verdicts, self.setup, actual)
        check = self.verdicts.check
        check(rules["tables"], dict(actual.block_tables) == dict(expected.block_tables),
              lambda: _diff("block tables", dict(expected.block_tables), dict(actual.block_tables)))
        check(rules["ref_counts"], actual.ref_counts == expected.ref_counts,
              lambda: _diff("ref counts", expected.ref_counts, actual.ref_counts))
        check(rules["free_queue"], actual.free_queue == expected.free_queue,
              lambda: _diff("free queue", expected.free_queue, actual.free_queue))
        check(rules["num_free"], actual.num_free_blocks == expected.num_free_blocks,
              lambda: _diff("free blocks", expected.num_free_blocks, actual.num_free_blocks))
        if actual.cached is not None:
            check(rules["cached"], dict(actual.cached) == dict(expected.cached or {}),
                  lambda: _diff("cache map", _short(expected.cached), _short(actual.cached)))
        return actual

    def _LifecycleSetup(self, step: LifecycleSetup) -> None:
        self.setup = step
        config = step.config()
        self.model.configure(config)
        self.new_engine()
        self.running = set()
        self.call("configure", config, rule="KV-HLC-001")
        self._judge(_rules("KV-POOL-012"))

    def _Arrive(self, step: Arrive) -> None:
        self.model.add_request(step.request_id, step.prompt)
        self.call("add_request", step.request_id, step.prompt, rule="KV-HLC-001")

    def _Decode(self, step: Decode) -> None:
        self.model.append_tokens(step.request_id, step.tokens)
        self.call("append_tokens", step.request_id, step.tokens, rule="KV-HLC-001")

    def _Release(self, step: Release) -> None:
        without_partial = self._queue_without_partial_entries(step)
        self.model.free(step.request_id, step.preempted)
        self.call("free", step.request_id, step.preempted, rule="KV-LIFE-009")
        self.running.discard(step.request_id)
        if without_partial is not None and without_partial != self.model.observe().free_queue:
            # A queue that differs exactly as if partial tail entries did not count as cached
            # is KV-HLC-006's difference, not a wrong free order.
            seen = self.call("observe", rule="KV-HLC-001").free_queue  # type: ignore[attr-defined]
            self.verdicts.check("KV-HLC-006", seen != without_partial, lambda: _diff(
                "free queue (the engine's is the one where blocks with only a partial tail entry "
                "count as uncached)", self.model.observe().free_queue, seen))
        actual = self._judge(_rules("KV-HLC-004", tables="KV-LIFE-009"))
        self.verdicts.check("KV-LIFE-009", step.request_id not in actual.block_tables,
                            lambda: f"{step.request_id} still holds {actual.block_tables[step.request_id]}")

    def _queue_without_partial_entries(self, step: Release) -> tuple[int, ...] | None:
        """The reference's free queue after ``step`` had partial tail entries not counted as
        cached (KV-HLC-006), or None when the request holds no block with only such an entry."""
        manager = self.model.manager
        partial = {b.block_id for group in manager.groups for b in group.req_to_blocks.get(step.request_id, ())
                   if b.partial_key is not None and b.cache_key is None}
        if not partial:
            return None
        other = copy.deepcopy(self.model)
        for block_id in partial:
            other.manager.pool.blocks[block_id].partial_key = None
        other.free(step.request_id, step.preempted)
        return other.observe().free_queue

    def _Evict(self, step: Evict) -> None:
        before = self.call("observe", rule="KV-HLC-001")
        self.model.evict(step.block_ids)
        self.call("evict", step.block_ids, rule="KV-POOL-013")
        actual = self._judge(_rules("KV-POOL-013"))
        check = self.verdicts.check
        check("KV-POOL-013", (actual.ref_counts, actual.free_queue, dict(actual.block_tables))
              == (before.ref_counts, before.free_queue, dict(before.block_tables)),  # type: ignore[attr-defined]
              "evict_blocks changed ref counts, tables or the free queue")
        if actual.cached is not None:
            left = {b for blocks in actual.cached.values() for b in blocks} & set(step.block_ids)
            check("KV-POOL-013", not left, lambda: f"blocks {sorted(left)} are still cached")

    def _ResetPrefixCache(self, step: ResetPrefixCache) -> None:
        assert self.setup is not None
        before: Observation = self.call("observe", rule="KV-HLC-001")  # type: ignore[assignment]
        expected = self.model.reset_prefix_cache()
        actual = self.call("reset_prefix_cache", rule="KV-POOL-014")
        check = self.verdicts.check
        check("KV-POOL-014", actual == pool_spec.can_reset_prefix_cache(before.num_free_blocks,
                                                                         self.setup.num_blocks), lambda: (
            f"reset returned {actual} with {before.num_free_blocks} of {self.setup.num_blocks - 1} blocks free"))
        check("KV-POOL-014", actual == expected, lambda: _diff("reset result", expected, actual))
        after = self._judge(_rules("KV-POOL-014"))
        if actual and after.cached is not None:
            check("KV-POOL-014", not after.cached, "cache keys survive a successful reset")

    def _Run(self, step: Run) -> None:
        assert self.setup is not None
        request = self.model.requests[step.request_id]
        waiting = step.request_id not in self.running
        hit = Lookup((), 0)
        if waiting:
            hit = self._lookup(step.request_id)
        new = min(step.num_new_tokens, request.num_tokens - request.num_computed_tokens - hit.num_tokens)
        if new <= 0:
            return  # nothing to compute: the scheduler would not schedule it
        encoder = self.setup.num_encoder_tokens
        expected = self.model.allocate(step.request_id, new + step.num_draft_tokens, hit.num_tokens,
                                       step.num_lookahead_tokens, step.delay_cache_blocks, encoder)
        actual = self.call("allocate", step.request_id, new + step.num_draft_tokens, hit.num_tokens,
                           step.num_lookahead_tokens, step.delay_cache_blocks, encoder, rule="KV-HLC-001")
        check = self.verdicts.check
        check("KV-HYB-012", (expected is None) == (actual is None), lambda: (
            f"allocate_slots({step.request_id}, {new + step.num_draft_tokens} new, hit {hit.num_tokens}): "
            f"reference {'fails' if expected is None else 'succeeds'}, engine "
            f"{'fails' if actual is None else 'succeeds'}"))
        if actual is None:
            # KV-SWA-008: the skipped blocks were freed even though the allocation failed.
            self._judge(_rules("KV-SWA-008"))
            return
        self.running.add(step.request_id)
        self.model.advance(step.request_id, new)
        self.call("advance", step.request_id, new, rule="KV-HLC-001")
        groups = self.setup.groups
        if hit.num_tokens:  # a skipped prefix in the hit is KV-SWA-009's case
            skipped = any(spec.skipped_tokens(kind, param, hit.num_tokens) >= size
                          for kind, size, param in groups if kind in spec.WINDOWED_KINDS)
            tables = "KV-SWA-009" if skipped else "KV-HLC-003"
        else:
            windowed = any(kind in spec.WINDOWED_KINDS for kind, _, _ in groups)
            tables = "KV-SWA-007" if windowed else "KV-HLC-001"
        # Where the nulls are decides which blocks were free for this allocation: a wrong null
        # layout is the table's rule, not the allocation order's.
        mine = self.model.observe().block_tables.get(step.request_id, ())
        theirs = self.call("observe", rule="KV-HLC-001").block_tables.get(step.request_id, ())
        if waiting:  # a request adopts no cross-attention block: its table is what it was given now
            for g, (kind, _, _) in enumerate(groups):
                if kind == spec.CROSS_ATTENTION and g < min(len(theirs), len(actual)):
                    adopted = [b for b in theirs[g] if b not in actual[g]]
                    check("KV-CROSS-002", not adopted, lambda g=g, adopted=adopted: (
                        f"{step.request_id} holds cross-attention blocks {adopted} in group {g} that its "
                        f"allocation did not give it (new blocks {list(actual[g])})"))
        layouts = [[[b == NULL_BLOCK_ID for b in t] for t in tables_] for tables_ in (mine, theirs)]
        if len(mine) == len(theirs):
            for (kind, _, _), a, b in zip(groups, *layouts):
                if kind == hybrid_spec.MAMBA:  # a Mamba group's table has a rule of its own
                    check("KV-HLC-008", a == b, lambda a=a, b=b: _diff(
                        f"null entries of the Mamba table of {step.request_id}", a, b))
        check(tables, layouts[0] == layouts[1],
              lambda: _diff(f"null entries in the tables of {step.request_id}", mine, theirs))
        check("KV-POOL-004", tuple(map(tuple, actual)) == tuple(map(tuple, expected)),
              lambda: _diff("newly allocated blocks per group", expected, actual))
        after = self._judge(_rules("KV-HLC-002", tables=tables, ref_counts="KV-POOL-008",
                                   free_queue="KV-HLC-001", cached=self._caching_rule()))
        for (kind, size, _), table in zip(groups, after.block_tables.get(step.request_id, ())):
            if kind == spec.CROSS_ATTENTION:
                check("KV-CROSS-001", len(table) == cdiv(encoder, size), lambda table=table, size=size: (
                    f"cross-attention table {list(table)} for {encoder} encoder tokens of block size {size}"))

    def _caching_rule(self) -> str:
        """The most specific caching rule this configuration exercises."""
        assert self.setup is not None
        groups = self.setup.groups
        if len(groups) == 1 or not self.setup.enable_caching:
            return "KV-HLC-005"
        alignment = math.lcm(*(size for _, size, _ in groups))
        eagle = self.setup.use_eagle
        sparse = any(kind == hybrid_spec.SLIDING_WINDOW
                     and cdiv(param - 1, size) + int(eagle) < alignment // size
                     for kind, size, param in groups)
        return "KV-SWA-011" if sparse else "KV-HYB-010"

    def _lookup(self, request_id: str) -> Lookup:
        assert self.setup is not None
        expected = self.model.lookup(request_id)
        actual: Lookup = self.call("lookup", request_id, rule="KV-HYB-003")  # type: ignore[assignment]
        check = self.verdicts.check
        for g, (kind, _, _) in enumerate(self.setup.groups):
            if kind == spec.CROSS_ATTENTION and g < len(actual.block_ids):
                check("KV-CROSS-002", not actual.block_ids[g], lambda g=g: (
                    f"the lookup of {request_id} hits cross-attention group {g}: {list(actual.block_ids[g])}"))
        rule_id = "KV-HYB-014" if len(self.setup.groups) == 1 else "KV-HYB-003"
        check(rule_id, actual.num_tokens == expected.num_tokens,
              lambda: _diff(f"hit length of {request_id}", expected.num_tokens, actual.num_tokens))
        check("KV-FULL-002", tuple(map(tuple, actual.block_ids)) == tuple(map(tuple, expected.block_ids)),
              lambda: _diff(f"hit blocks of {request_id}", expected.block_ids, actual.block_ids))
        return expected


def _rules(default: str, **fields: str) -> dict[str, str]:
    names = ("num_free", "tables", "ref_counts", "free_queue", "cached")
    return {name: fields.get(name, default) for name in names}


def _short(cached: object) -> object:
    if not isinstance(cached, dict):
        return cached
    return {(key.hex()[:8] if isinstance(key, bytes) else key, group): blocks
            for (key, group), blocks in sorted(cached.items(), key=lambda kv: (kv[0][1], kv[1]))}


# -- generation ----------------------------------------------------------------------------
@st.composite
def lifecycle_setups(draw: st.DrawFn) -> LifecycleSetup:
    """Valid hybrid lifecycle configurations, biased towards pools that fill up."""
    hash_size = draw(st.sampled_from([1, 2, 4]), label="hash_block_size")
    caching = draw(st.integers(0, 3), label="caching off") != 0
    eagle = draw(st.booleans(), label="use_eagle")
    count = draw(st.integers(1, 3), label="num_groups")
    kinds = [hybrid_spec.FULL, hybrid_spec.SLIDING_WINDOW, hybrid_spec.SLIDING_WINDOW]
    if not eagle:
        kinds.append(hybrid_spec.CHUNKED_LOCAL)  # KV-CHUNK-003
    drafts = []
    for _ in range(count):
        kind = draw(st.sampled_from(kinds), label="kind")
        size = hash_size if count == 1 else hash_size * draw(st.sampled_from([1, 2, 4]), label="scale")
        drafts.append([kind, size, 0])
    # Three times in four with EAGLE and caching on, where a partial tail entry can be left.
    if count > 1 and draw(st.integers(0, 3 if eagle and caching else 1), label="coarse_full_group") > 0:
        # A full-attention group coarser than the hash blocks: a prompt ending inside one of
        # its blocks leaves a partial tail entry (KV-HLC-006).
        drafts[0][:2] = [hybrid_spec.FULL, hash_size * draw(st.sampled_from([2, 4]), label="coarse scale")]
    encoder = 0
    if not caching and draw(st.integers(0, 3), label="cross_attention") > 0:  # KV-HLC-007
        drafts.append([spec.CROSS_ATTENTION, hash_size * draw(st.sampled_from([1, 2])), 0])
        encoder = draw(st.integers(1, 12), label="num_encoder_tokens")
    mamba = None
    if not caching and draw(st.integers(0, 2), label="mamba") > 0:  # KV-HLC-008
        mamba = [hybrid_spec.MAMBA, hash_size * draw(st.sampled_from([1, 2, 4])),
                 draw(st.sampled_from([0, 0, 1, 2]), label="num_speculative_blocks")]
        drafts.insert(draw(st.integers(0, len(drafts)), label="mamba position"), mamba)
    others = [size for kind, size, _ in drafts if kind != hybrid_spec.CHUNKED_LOCAL]
    alignment = math.lcm(hash_size, *others) if others else hash_size
    for draft in drafts:
        if draft[0] == hybrid_spec.CHUNKED_LOCAL:
            draft[1] = alignment  # KV-CHUNK-003
            draft[2] = alignment * draw(st.integers(1, 3), label="chunk_blocks")
        elif draft[0] == hybrid_spec.SLIDING_WINDOW:
            # Small windows as often as large ones: a window shorter than the alignment
            # caches only the reachable blocks (KV-SWA-011).
            draft[2] = draw(st.integers(1, 12) | st.integers(1, 4), label="window")
    max_model_len = alignment * draw(st.integers(4, 12), label="max_model_len blocks")
    chunked = any(kind == hybrid_spec.CHUNKED_LOCAL for kind, _, _ in drafts)
    if mamba is not None and not chunked and draw(st.integers(0, 2), label="one state block") == 0:
        # One block per request (a third of the time: only several blocks leave skipped ones to
        # judge, KV-HLC-008): the state block covers the model length (the chunked-local block
        # size must stay the scheduler block size, KV-CHUNK-003).
        mamba[1] = max_model_len
    groups = tuple(tuple(d) for d in drafts)
    blocks_per_request = sum(cdiv(max_model_len, size) for _, size, _ in groups)
    # Mostly room for two or three requests; one time in four a pool that runs out early.
    small = draw(st.integers(0, 3), label="small pool") == 0
    num_blocks = draw(st.integers(2, max(3, blocks_per_request)) if small else st.integers(
        blocks_per_request, 3 * blocks_per_request), label="num_blocks")
    return LifecycleSetup(groups, hash_size, num_blocks, max_model_len, eagle, caching, encoder)


class HybridLifecycleMachine(SuiteMachine):
    """Requests arriving, running in chunks, decoding, being preempted and finishing."""

    driver: LifecycleDriver

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[tuple[int, ...]] = []
        self.warm: list[tuple[int, ...]] = []
        self.next_id = 0

    @initialize(setup=lifecycle_setups(), data=st.data())
    def configure(self, setup: LifecycleSetup, data: st.DataObject) -> None:
        self.driver.apply(setup)
        # Every example starts with a request scheduled: Hypothesis switches rules off at
        # random per example, and an example whose rules cannot start one checks nothing.
        self.serve_shared_prefix(data)

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    def _live(self) -> list[str]:
        return sorted(self.driver.model.requests)

    def _can_arrive(self) -> bool:
        return self._alive() and len(self._live()) < MAX_LIVE_REQUESTS

    def _has_live(self) -> bool:
        return self._alive() and bool(self._live())

    @precondition(_can_arrive)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        setup = self.driver.setup
        limit = setup.max_model_len - 1
        alignment = math.lcm(*(size for _, size, _ in setup.groups))
        prefix: tuple[int, ...] = ()
        warm = self._warm()
        sources = warm if warm and data.draw(st.integers(0, 3), label="warm source") else self.prompts
        if sources and data.draw(st.integers(0, 4), label="shares a prefix"):
            source = data.draw(st.sampled_from(sources), label="source")
            cut = data.draw(st.integers(0, len(source)) | st.integers(0, len(source) // alignment).map(
                lambda k: k * alignment), label="cut")
            prefix = source[:cut]
        suffix = data.draw(st.lists(TOKENS, min_size=1, max_size=3 * alignment), label="suffix")
        prompt = (prefix + tuple(suffix))[:limit]
        self.prompts.append(prompt)
        request_id = f"r{self.next_id}"
        self.next_id += 1
        self.driver.apply(Arrive(request_id, prompt))

    def _warm(self) -> list[tuple[int, ...]]:
        """Computed tokens of live and released requests: the prefixes that can hit."""
        return [tuple(r.all_token_ids[:r.num_computed_tokens]) for r in self.driver.model.requests.values()
                if r.num_computed_tokens] + self.warm

    @precondition(_can_arrive)
    @rule(data=st.data())
    def serve_shared_prefix(self, data: st.DataObject) -> None:
        # A request continuing a computed prefix (or a fresh one, before any) arrives and is
        # scheduled at once: the lifecycle's hits (KV-HLC-003, KV-SWA-009) need exactly this.
        # It is also a second rule that starts requests: Hypothesis switches rules off at random
        # per example, and with caching off no other rule would.
        setup = self.driver.setup
        warm = self._warm()
        source = data.draw(st.sampled_from(warm), label="source") if warm else ()
        suffix = data.draw(st.lists(TOKENS, min_size=0 if warm else 1, max_size=4), label="suffix")
        prompt = (source + tuple(suffix))[:setup.max_model_len - 1] or (0,)
        self.prompts.append(prompt)
        request_id = f"r{self.next_id}"
        self.next_id += 1
        self.driver.apply(Arrive(request_id, prompt))
        self.driver.apply(Run(request_id, data.draw(st.integers(1, len(prompt)), label="num_new_tokens")))

    @precondition(_has_live)
    @rule(data=st.data())
    def run(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._live()), label="request")
        request = self.driver.model.requests[request_id]
        if request.num_computed_tokens >= request.num_tokens:
            room = self.driver.setup.max_model_len - request.num_tokens
            if room <= 0:
                self.driver.apply(Release(request_id))
                return
            self.driver.apply(Decode(request_id, tuple(data.draw(
                st.lists(TOKENS, min_size=1, max_size=min(room, 3)), label="tokens"))))
        left = request.num_tokens - request.num_computed_tokens
        chunk = data.draw(st.integers(1, max(1, left)) | st.just(max(1, left)), label="num_new_tokens")
        drafts = data.draw(st.sampled_from([0, 0, 0, 1, 2]), label="num_draft_tokens")
        lookahead = data.draw(st.sampled_from([0, 0, 0, 1, 3]), label="num_lookahead_tokens")
        delay = data.draw(st.sampled_from([False] * 5 + [True]), label="delay_cache_blocks")
        self.driver.apply(Run(request_id, chunk, drafts, lookahead, delay))

    @precondition(_has_live)
    @rule(data=st.data())
    def run_again(self, data: st.DataObject) -> None:
        self.run(data)  # scheduling is the common step: twice the weight of the others

    @precondition(_has_live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self._live()), label="request")
        request = self.driver.model.requests[request_id]
        if request.num_computed_tokens:
            self.warm.append(tuple(request.all_token_ids[:request.num_computed_tokens]))
        self.driver.apply(Release(request_id, data.draw(st.booleans(), label="preempted")))

    def _coarse_full_sizes(self) -> list[int]:
        setup = self.driver.setup
        return [size for kind, size, _ in setup.groups
                if kind == hybrid_spec.FULL and size > setup.hash_block_size] if setup else []

    def _can_leave_partial_tail(self) -> bool:
        # Only with EAGLE: without it several groups cache whole aligned segments, so the
        # boundary's block is cached whole or not reached at all.
        setup = self.driver.setup
        return self._can_arrive() and setup.enable_caching and setup.use_eagle and bool(self._coarse_full_sizes())

    @precondition(_can_leave_partial_tail)
    @rule(data=st.data())
    def prefill_and_finish(self, data: st.DataObject) -> None:
        # KV-HLC-006: a prompt whose last hash boundary lies inside a coarse full-attention
        # block, prefilled at once and finished before that block fills: the block carries
        # only a partial tail entry when it is freed.
        setup = self.driver.setup
        size = data.draw(st.sampled_from(self._coarse_full_sizes()), label="block size")
        hash_size = setup.hash_block_size
        longest = setup.max_model_len - 1 - hash_size  # room for the tokens after the boundary
        boundaries = [b for b in range(hash_size, longest + 1, hash_size) if b % size]
        if not boundaries:
            return
        boundary = data.draw(st.sampled_from(boundaries), label="boundary")
        # The boundary is the prompt in whole hash blocks with EAGLE, one token less without.
        length = boundary + data.draw(st.integers(0, hash_size - 1), label="past the boundary") + int(
            not setup.use_eagle)
        warm = [w for w in self._warm() if w]
        prefix = data.draw(st.sampled_from(warm), label="source")[:length] if warm and data.draw(
            st.booleans(), label="shares a prefix") else ()
        prompt = prefix + tuple(data.draw(st.lists(TOKENS, min_size=length - len(prefix),
                                                   max_size=length - len(prefix)), label="suffix"))
        self.prompts.append(prompt)
        request_id = f"r{self.next_id}"
        self.next_id += 1
        self.driver.apply(Arrive(request_id, prompt))
        self.driver.apply(Run(request_id, length))
        if request_id in self.driver.model.requests:
            self.warm.append(prompt)
            self.driver.apply(Release(request_id))

    def _has_cache(self) -> bool:
        return self._alive() and self.driver.setup.enable_caching

    @precondition(_has_cache)
    @rule(data=st.data())
    def forget_cached(self, data: st.DataObject) -> None:
        # One rule for both ways of forgetting (a connector's eviction, a reset), so that
        # they do not crowd out the lifecycle's own steps.
        if data.draw(st.integers(0, 3), label="reset") == 0:
            self.driver.apply(ResetPrefixCache())
            return
        cached = sorted({b for blocks in (self.driver.model.observe().cached or {}).values() for b in blocks})
        any_block = st.integers(1, self.driver.setup.num_blocks - 1)
        chosen = data.draw(st.lists(st.sampled_from(cached) if cached else any_block, max_size=3)
                           | st.lists(any_block, max_size=2), label="block ids")
        self.driver.apply(Evict(tuple(chosen)))

    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead


#: The hybrid lifecycle suite, registered with the harness.
HYBRID_LIFECYCLE = register_suite(SuiteDef(
    name="hybrid-lifecycle",
    title="allocation, caching and freeing over several KV-cache groups",
    operations=("configure", "add_request", "lookup", "allocate", "advance", "append_tokens", "free",
                "evict", "reset_prefix_cache", "observe"),
    returns=RETURNS, driver=LifecycleDriver, machine=HybridLifecycleMachine, module=__name__,
    step_names=("Arrive", "Decode", "Evict", "LifecycleSetup", "Release", "ResetPrefixCache", "Run"),
    engines={"reference": f"{__name__}:ReferenceHybridLifecycle",
             "vllm": "kvoracle.conformance.engines.vllm_hybrid_lifecycle:VllmHybridLifecycle",
             # The same engines in a paged KV store (needs torch): the KV-DATA rules are judged too.
             "paged-reference": "kvoracle.conformance.engines.paged_store:PagedHybridReferenceEngine",
             "paged-vllm": "kvoracle.conformance.engines.paged_store:PagedVllmHybridEngine"}))
