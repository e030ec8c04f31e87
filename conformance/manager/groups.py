"""Judging several KV-cache groups: the manager suite's hybrid-coordinator steps.

With a :class:`~kvoracle.conformance.steps.ConfigureGroups` step the model is one or
more KV-cache groups of any kinds (spec chapter ``hybrid_lifecycle``): a waiting
request looks its hit up and adopts it, is scheduled chunk by chunk and decodes, is
preempted or finishes, while the window of its sliding-window and chunked-local
groups moves on and frees blocks; cached blocks are evicted by a connector or the
whole prefix cache is reset. After each step the driver compares what the operation
returned, then the two observations field by field (block tables per group, ref
counts, free queue, cache map), then checks the invariants any engine's observation
must satisfy (:mod:`..invariants`).

Cross attention is never prefix-cached (KV-CROSS-002), and that rule comes before the
general ones that would also see it: a lookup's entries in a cross-attention group are
charged to it before the hit comparison; a cache key of a cross-attention group before
KV-POOL-015 and KV-LIFE-012 (caching off caches nothing); and a cross-attention block a
waiting request holds without its allocation having given it before the table
comparison.

Two rules are judged only where the engine claims what they need. With ``skipped_tokens``
the engine reports each group's skipped-token count at the computed-token count an
allocation frees at, before the allocation, and the sliding-window and chunked-local entries
are compared with the spec's (KV-SWA-006, KV-CHUNK-002): a wrong count shows otherwise only
as the null prefix it leaves, which a freeing loop that stops one block early leaves too.
With ``hash_block_views``, a block of a group coarser than the hash blocks that the engine
caches under another hash unit of the same request than the reference's key, unit
``(j + 1) * k - 1`` for its block ``j`` (KV-HASH-006), is charged to that rule before the
cache-map comparison.

An engine in a paged KV store (``--engine paged-reference`` or ``paged-vllm``,
:mod:`..engines.paged_store`) claims ``kv_data``: its observations carry the store's data
checks, one tensor per group, and the suite judges the KV-DATA rules too.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from kvoracle.reference.block_pool import is_unhashed
from kvoracle.spec import block_pool as pool_spec
from kvoracle.spec import chunked_local as chunk_spec
from kvoracle.spec import hashing
from kvoracle.spec import hybrid as hybrid_spec
from kvoracle.spec import hybrid_lifecycle as spec
from kvoracle.spec import lifecycle as lifecycle_spec
from kvoracle.spec import sliding_window as swa_spec
from kvoracle.spec.lifecycle import cdiv

from .. import invariants, steps
from ..adapter import Lookup, Observation
from ..engines.reference import ReferenceEngine
from ..harness.capabilities import mode_rule
from .align import AlignJudge
from .what_if import copy_of, what_if

NULL_BLOCK_ID = 0
#: The rule of each kind's skipped-token count.
SKIP_RULES = {hybrid_spec.SLIDING_WINDOW: "KV-SWA-006", hybrid_spec.CHUNKED_LOCAL: "KV-CHUNK-002"}


def _diff(label: str, expected: object, actual: object) -> str:
    return f"{label}: reference {expected!r}, engine {actual!r}"


class GroupsJudge(AlignJudge):
    """The manager driver's handlers for a model of several KV-cache groups (a mixin of
    :class:`~.driver.ManagerDriver`, whose state it reads: ``model``, ``setup``, ``config`` and
    ``running``, the requests allocated since they arrived or were preempted)."""

    def _groups_judge(self, rules: dict[str, str], peek: frozenset[tuple[object, int]] = frozenset()
                      ) -> Observation:
        """Invariants of the engine's observation, then field-by-field comparison."""
        assert self.setup is not None
        expected = self.model.observe()
        actual: Observation = self.call("observe", rule="KV-HLC-001")  # type: ignore[assignment]
        held = Counter(b.block_id for group in self.model.manager.groups for pair in group.pending_copies
                       for b in pair)
        invariants.check_all(self.verdicts, self.config, actual, held)
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
            self._judge_views(expected.cached or {}, actual.cached)
            if "align_cached" in rules and self.setup.align_groups:
                # The Mamba groups' keys first (KV-MAMBA-011), then the others' as below.
                mamba = set(self.setup.align_groups)
                mine = {k: v for k, v in (expected.cached or {}).items() if k[1] in mamba}
                theirs = {k: v for k, v in actual.cached.items() if k[1] in mamba}
                check(rules["align_cached"], mine == theirs,
                      lambda: _diff("cache map of the Mamba groups", _short(mine), _short(theirs)))
            if rules["cached"] == "KV-SWA-011":
                # A sliding-window block the spec caches and the engine does not is KV-SWA-012's,
                # before the maps are compared (caching more is KV-SWA-011's).
                windows = {g for g, (kind, _, _) in enumerate(self.setup.groups) if kind == hybrid_spec.SLIDING_WINDOW}
                # A block counts as cached in its group under whatever key: the key's name is
                # KV-HASH-006's (an adapter may not name an old release's keys). An EAGLE group's
                # peek block past the aligned prefix is KV-HYB-010's to cache (releases before
                # 0.23 leave it out, as an intended difference).
                held = {(group, block) for (_, group), blocks in actual.cached.items() for block in blocks}
                missing = {key: blocks for key, blocks in (expected.cached or {}).items()
                           if key[1] in windows and key not in peek
                           and any((key[1], block) not in held for block in blocks)}
                check("KV-SWA-012", not missing,
                      lambda: f"sliding-window blocks the spec caches and the engine does not (cache key, "
                              f"group): {_short(missing)}; the engine caches {_short(actual.cached)}")
            check(rules["cached"], dict(actual.cached) == dict(expected.cached or {}),
                  lambda: _diff("cache map", _short(expected.cached), _short(actual.cached)))
        return actual

    def _judge_views(self, expected: dict, actual: dict) -> None:
        """KV-HASH-006: a block of a coarse group (``k`` hash blocks a block) the engine caches
        under another hash unit of the request than the one the block-size view names."""
        assert self.setup is not None
        h = self.setup.hash_block_size
        coarse = {g: size // h for g, (_, size, _) in enumerate(self.setup.groups) if size > h}
        if not coarse or not self.verdicts.applicable("KV-HASH-006"):
            return
        keys: dict[tuple[int, int], list[bytes]] = {}
        for (key, g), blocks in actual.items():
            for block in blocks if g in coarse else ():
                keys.setdefault((g, block), []).append(key)
        seen = False
        for (want, g), blocks in expected.items():
            for block in blocks if g in coarse else ():
                theirs = keys.get((g, block), [])
                if want in theirs:
                    seen = True
                    continue  # (a stale or extra entry besides it is the caching rules' to judge)
                found = next(((chain, key) for key in theirs for chain in self._hash_chains.values()
                              if want in chain and key in chain), None)
                if found is None:
                    continue  # not another unit of the same prefix: the caching rules judge it
                units, key = found
                k, unit, view = coarse[g], units.index(key), units.index(want)
                j = (view + 1) // k - 1
                self.verdicts.check("KV-HASH-006", False, (
                    f"group {g} (blocks of {k} hash blocks): block {block}, block {j} of a request's table, is "
                    f"cached under hash unit {unit}; the block-size view names it by unit (j + 1) * k - 1 = "
                    f"{hashing.block_size_view_index(j, k)}"))
        if seen:
            self.verdicts.check("KV-HASH-006", True)

    def _judge_skipped(self, num_computed_tokens: int) -> None:
        """KV-SWA-006, KV-CHUNK-002: the engine's skipped tokens of each sliding-window and
        chunked-local group after ``num_computed_tokens``, against the spec's count."""
        assert self.setup is not None
        groups = self.setup.groups
        judged = [(g, kind, param) for g, (kind, _, param) in enumerate(groups)
                  if kind in SKIP_RULES and self.verdicts.applicable(SKIP_RULES[kind])]
        if not judged:
            return
        got = self.call("skipped_tokens", num_computed_tokens, rule=SKIP_RULES[judged[0][1]])
        check = self.verdicts.check
        check(SKIP_RULES[judged[0][1]], len(got) == len(groups), lambda: (
            f"skipped_tokens({num_computed_tokens}) answered {len(got)} counts for {len(groups)} groups"))
        for g, kind, param in judged:
            if kind == hybrid_spec.SLIDING_WINDOW:
                want, how = swa_spec.num_skipped_tokens(num_computed_tokens, param), f"sliding window {param}"
            else:
                want, how = chunk_spec.num_skipped_tokens(num_computed_tokens, param), f"chunk {param}"
            check(SKIP_RULES[kind], got[g] == want, lambda g=g, want=want, how=how: (
                f"group {g} ({how}) skips {got[g]} tokens after {num_computed_tokens} computed; the spec "
                f"says {want}"))

    def _remember_hashes(self, request_id: str) -> None:
        """The request's hash units, for telling one unit from another (KV-HASH-006)."""
        self._hash_chains[request_id] = tuple(self.model.requests[request_id].block_hashes)

    def _groups_ConfigureGroups(self, step: steps.ConfigureGroups) -> None:
        self.setup = step
        self.config = config = step.config()
        self.model.configure(config)
        self.new_engine()
        self.running = set()
        #: Every request's hash units, kept after it finishes (its blocks may stay cached).
        self._hash_chains: dict[str, tuple[bytes, ...]] = {}
        # A model whose groups share specs is one the engine must merge (KV-HYB-002): refusing
        # it is that rule's failure, accepting it that rule's check.
        self.call("configure", config, rule="KV-HYB-002" if config.shares_specs
                  else "KV-MAMBA-019" if config.partial_hits else "KV-HLC-001")
        if config.shares_specs:
            self.verdicts.check("KV-HYB-002", True)
        if config.partial_hits:  # the engine takes the model that turns partial hits on
            self.verdicts.check("KV-MAMBA-019", True)
        self._groups_judge(_rules("KV-POOL-012"))

    def _groups_AddRequest(self, step: steps.AddRequest) -> None:
        self.model.add_request(step.request_id, step.prompt)
        self.call("add_request", step.request_id, step.prompt, rule="KV-HLC-001")
        self._remember_hashes(step.request_id)

    def _groups_AppendTokens(self, step: steps.AppendTokens) -> None:
        self.model.append_tokens(step.request_id, step.tokens)
        self.call("append_tokens", step.request_id, step.tokens, rule="KV-HLC-001")
        self._remember_hashes(step.request_id)

    def _groups_Free(self, step: steps.Free) -> None:
        pages = self._mamba_pages(step.request_id)
        without_partial = self._queue_without_partial_entries(step)
        at_prompt_end = self._queue_with_partial_entries_at_prompt_end(step)
        other_order = (self._in_other_free_order(lambda model: model.free(step.request_id, step.preempted))
                       if self._releases_unhashed(step.request_id) else None)
        self.model.free(step.request_id, step.preempted)
        self.call("free", step.request_id, step.preempted, rule="KV-LIFE-009")
        self.running.discard(step.request_id)
        # (A queue the partial tail entries explain too is theirs to judge, below.)
        if other_order is not None:
            self._judge_free_order(other_order[1], explained=(without_partial, at_prompt_end))
        # A queue that differs exactly as if partial tail entries did not count as cached, or
        # sat at the prompt's last hash boundary (vLLM 0.26 to 0.31; 0.32 puts them at the last
        # boundary a resend can read), is KV-HLC-006's difference, not a wrong free order.
        for queue, how in ((without_partial, "blocks with only a partial tail entry count as uncached"),
                           (at_prompt_end, "the partial tail entry sits at the prompt's last hash boundary")):
            if queue is not None and queue != self.model.observe().free_queue:
                seen = self.call("observe", rule="KV-HLC-001").free_queue  # type: ignore[attr-defined]
                self.verdicts.check("KV-HLC-006", seen != queue, lambda how=how, seen=seen: _diff(
                    f"free queue (the engine's is the one where {how})", self.model.observe().free_queue, seen))
        if len(pages) > 1:  # an align-mode Mamba table is released tail first, its nulls skipped
            seen = self.call("observe", rule="KV-HLC-001").free_queue  # type: ignore[attr-defined]
            mine = self.model.observe().free_queue
            self.verdicts.check("KV-MAMBA-012", not self._only_mamba_order_differs(pages, mine, seen), lambda: _diff(
                f"free queue (the Mamba pages {sorted(pages)} of {step.request_id} in another order)", mine, seen))
        actual = self._groups_judge(_rules("KV-HLC-004", tables="KV-LIFE-009"))
        self.verdicts.check("KV-LIFE-009", step.request_id not in actual.block_tables,
                            lambda: f"{step.request_id} still holds {actual.block_tables[step.request_id]}")

    def _queue_without_partial_entries(self, step: steps.Free) -> tuple[int, ...] | None:
        """The reference's free queue after ``step`` had partial tail entries not counted as
        cached (KV-HLC-006), or None when the request holds no block with only such an entry."""
        manager = self.model.manager
        partial = {b.block_id for group in manager.groups for b in group.req_to_blocks.get(step.request_id, ())
                   if b.partial_key is not None and b.cache_key is None}
        return self._queue_with_partial_entries(step, dict.fromkeys(partial))

    def _queue_with_partial_entries_at_prompt_end(self, step: steps.Free) -> tuple[int, ...] | None:
        """The reference's free queue after ``step`` had each full-attention group's partial tail
        entry at the prompt's last hash boundary instead (KV-HLC-006), or None when that moves
        no entry."""
        request = self.model.requests.get(step.request_id)
        if request is None:
            return None
        moves: dict[int, object] = {}  # block id -> its partial entry in that engine
        for group in self.model.manager.groups:
            table = group.req_to_blocks.get(step.request_id, ())
            if group.kind != hybrid_spec.FULL or group.block_size == request.hash_block_size or not table:
                continue
            size, unit = group.block_size, request.hash_block_size
            boundary = min(request.num_prompt_tokens // unit, len(request.block_hashes)) * unit
            wanted = (boundary // size if boundary % size and boundary <= request.num_computed_tokens
                      and boundary // size < len(table) else None)
            for index, block in enumerate(table):
                if not block.is_null and block.cache_key is None and (block.partial_key is not None) != (
                        index == wanted):
                    moves[block.block_id] = ("prompt end", group.group_id) if index == wanted else None
        return self._queue_with_partial_entries(step, moves)

    def _queue_with_partial_entries(self, step: steps.Free, entries: dict[int, object]
                                    ) -> tuple[int, ...] | None:
        """The free queue ``step`` leaves on a copy of the reference whose blocks ``entries``
        names carry those partial entries (None: none), or None when ``entries`` is empty."""
        if not entries:
            return None
        with what_if(self.model) as other:
            for block_id, entry in entries.items():
                other.manager.pool.blocks[block_id].partial_key = entry
            other.free(step.request_id, step.preempted)
            return other.observe().free_queue

    def _releases_unhashed(self, request_id: str) -> bool:
        """Whether freeing the request takes an unhashed block to count 0: only then can the two
        free orders (KV-POOL-006 / KV-POOL-016) leave different queues (with every released
        block hashed, both append them all in the same order)."""
        pool = self.model.manager.pool
        held = Counter(block.block_id for group in self.model.manager.groups
                       for block in group.req_to_blocks.get(request_id, ()) if not block.is_null)
        return any(pool.blocks[block_id].ref_cnt == times and is_unhashed(pool, pool.blocks[block_id])
                   for block_id, times in held.items())

    def _in_other_free_order(self, apply: Callable[[ReferenceEngine], object]) -> tuple[object, Observation]:
        """What ``apply`` returns, and the observation after it, on a copy of the reference that
        returns freed blocks in the order the engine did not declare (KV-POOL-006 / KV-POOL-016)."""
        with what_if(self.model) as other:
            other.manager.pool.unhashed_first = not other.manager.pool.unhashed_first
            answer = apply(other)
            return answer, other.observe()

    def _judge_free_order(self, other: Observation, allocated: object = None, expected_allocated: object = None,
                          other_allocated: object = None, explained: tuple[object, ...] = ()) -> None:
        """After a step that freed blocks: an engine left exactly where the other free order leads
        (its free queue, and the blocks an allocation took) fails the release rule of the order it
        declared, before the rules that see only the consequences (KV-HLC-004, KV-POOL-004, ...)."""
        expected = self.model.observe()
        if other.free_queue == expected.free_queue and other_allocated == expected_allocated:
            return  # the two orders agree here: nothing tells them apart
        if allocated is None and other.free_queue in explained:
            return  # another named difference leaves the same queue: the order is not shown
        seen: Observation = self.call("observe", rule="KV-HLC-001")  # type: ignore[assignment]
        declared = self.verdicts.capabilities.free_order
        self.verdicts.check(
            mode_rule("free_order", declared),
            not (seen.free_queue == other.free_queue and allocated == other_allocated),
            lambda: _diff(f"free queue (the engine declares free_order={declared!r}, and its queue"
                          + (f" and new blocks {allocated}" if allocated is not None else "")
                          + " are the other order's)", expected.free_queue, seen.free_queue))

    def _groups_Evict(self, step: steps.Evict) -> None:
        before = self.call("observe", rule="KV-HLC-001")
        self.model.evict(step.block_ids)
        self.call("evict", step.block_ids, rule="KV-POOL-013")
        actual = self._groups_judge(_rules("KV-POOL-013"))
        check = self.verdicts.check
        check("KV-POOL-013", (actual.ref_counts, actual.free_queue, dict(actual.block_tables))
              == (before.ref_counts, before.free_queue, dict(before.block_tables)),  # type: ignore[attr-defined]
              "evict_blocks changed ref counts, tables or the free queue")
        if actual.cached is not None:
            left = {b for blocks in actual.cached.values() for b in blocks} & set(step.block_ids)
            check("KV-POOL-013", not left, lambda: f"blocks {sorted(left)} are still cached")

    def _groups_ResetPrefixCache(self, step: steps.ResetPrefixCache) -> None:
        assert self.setup is not None
        before: Observation = self.call("observe", rule="KV-HLC-001")  # type: ignore[assignment]
        expected = self.model.reset_prefix_cache()
        actual = self.call("reset_prefix_cache", rule="KV-POOL-014")
        check = self.verdicts.check
        check("KV-POOL-014", actual == pool_spec.can_reset_prefix_cache(before.num_free_blocks,
                                                                         self.setup.num_blocks), lambda: (
            f"reset returned {actual} with {before.num_free_blocks} of {self.setup.num_blocks - 1} blocks free"))
        check("KV-POOL-014", actual == expected, lambda: _diff("reset result", expected, actual))
        after = self._groups_judge(_rules("KV-POOL-014"))
        if actual and after.cached is not None:
            check("KV-POOL-014", not after.cached, "cache keys survive a successful reset")

    def _groups_Schedule(self, step: steps.Schedule) -> None:
        assert self.setup is not None
        request = self.model.requests[step.request_id]
        waiting = step.request_id not in self.running
        hit = Lookup((), 0)
        if waiting:
            hit = self._groups_lookup(step.request_id)
        new = min(step.num_new_tokens, request.num_tokens - request.num_computed_tokens - hit.num_tokens)
        drafts = step.num_draft_tokens
        align = self.setup.align_groups
        if align:  # the scheduler's chunk rule for align-mode Mamba groups (KV-MAMBA-016)
            new, drafts = self._align_chunk(step.request_id, hit.num_tokens, new, drafts)
        if new <= 0:
            return  # nothing to compute: the scheduler would not schedule it
        encoder = self.setup.num_encoder_tokens
        # The count the allocation frees the skipped blocks at (KV-SWA-007), asked first: a
        # wrong count shows next only as the null prefix it leaves.
        self._judge_skipped(min(request.num_computed_tokens + hit.num_tokens, self.setup.max_model_len))
        arguments = (step.request_id, new + drafts, hit.num_tokens, step.num_lookahead_tokens,
                     step.delay_cache_blocks, encoder)
        # A running request's allocation frees the blocks its windows skipped (KV-SWA-007): where
        # they go decides which blocks it takes. (A hit's skipped blocks are cached ones, which
        # both orders put at the back.)
        computed = min(request.num_computed_tokens, self.setup.max_model_len)
        # (A running request's Mamba states are retired before the allocation, KV-MAMBA-010.)
        frees = not waiting and (bool(align) or any(
            kind in spec.WINDOWED_KINDS and spec.skipped_tokens(kind, param, computed) >= size
            for kind, size, param in self.setup.groups))
        other = self._in_other_free_order(lambda model: model.allocate(*arguments)) if frees else None
        before_tables = self._align_tables(step.request_id) if align else {}
        growth = self._align_growth(step.request_id, hit, min(computed + hit.num_tokens, self.setup.max_model_len)
                                    + new + drafts) if align else {}
        due = self._copies_due(step.request_id, hit) if align else {}
        partial = self.config.partial_hits
        before = copy_of(self.model) if align and (hit.num_tokens or due or partial) else self.model
        deferred = bool(align) and waiting and self._deferred_hit(hit)
        queued = {g: len(self.model.manager.groups[g].pending_copies) for g in due}
        expected = self.model.allocate(*arguments)
        # An engine failing inside the allocation: where the Mamba table is longer than the step
        # needs, the negative need's (KV-MAMBA-008); where the step's checkpoint has no key, that
        # rule's (KV-MAMBA-017).
        # (An engine failing where a copy is due: the copy's page, KV-MAMBA-022.)
        call_rule = ("KV-MAMBA-008" if any(n < 0 for n in growth.values())
                     else "KV-MAMBA-022" if due and not deferred
                     else "KV-MAMBA-017" if align and expected is not None and self._checkpoint_past_hashes(
                         step.request_id) else "KV-HLC-001")
        actual = self.call("allocate", *arguments, rule=call_rule)
        check = self.verdicts.check
        if other is not None and (expected is None) == (actual is None):
            self._judge_free_order(other[1], _blocks(actual), _blocks(expected), _blocks(other[0]))
        if align:
            self._judge_align_outcome(before, arguments, expected, actual, growth, hit, deferred, due)
        check("KV-HYB-012", (expected is None) == (actual is None), lambda: (
            f"allocate_slots({step.request_id}, {new + drafts} new, hit {hit.num_tokens}): "
            f"reference {'fails' if expected is None else 'succeeds'}, engine "
            f"{'fails' if actual is None else 'succeeds'}"))
        retired = bool(align) and self._align_retired(before_tables, step.request_id)
        if actual is None:
            # KV-SWA-008 (KV-MAMBA-010 for retired states): the skipped blocks were freed even
            # though the allocation failed.
            self._groups_judge(_rules("KV-MAMBA-010" if retired else "KV-SWA-008"))
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
        copies = self._new_copies(queued, step.request_id) if due else {}
        if align:  # the Mamba tables and what the allocation returned for them, first (a copy's first of all)
            self._judge_copy_tables(step.request_id, copies, theirs, actual)
            self._judge_align_tables(step.request_id, before_tables, theirs, actual, expected)
        layouts = [[[b == NULL_BLOCK_ID for b in t] for t in tables_] for tables_ in (mine, theirs)]
        if len(mine) == len(theirs) and not align:
            for (kind, _, _), a, b in zip(groups, *layouts):
                if kind == hybrid_spec.MAMBA:  # a Mamba group's table has a rule of its own
                    check(mode_rule("mamba_free_lag", self.verdicts.capabilities.mamba_free_lag), a == b,
                          lambda a=a, b=b: _diff(f"null entries of the Mamba table of {step.request_id}", a, b))
        check(tables, layouts[0] == layouts[1],
              lambda: _diff(f"null entries in the tables of {step.request_id}", mine, theirs))
        check("KV-POOL-004", _blocks(actual) == _blocks(expected),
              lambda: _diff("newly allocated blocks per group", expected, actual))
        # (Pages held for a queued copy have one reference more than their tables, KV-MAMBA-025.)
        cached = self._caching_rule()
        if partial:  # a cache map rounded to the scheduler block size is KV-MAMBA-019's
            theirs_cached = self.call("observe", rule="KV-HLC-001").cached  # type: ignore[attr-defined]
            if theirs_cached is not None and dict(theirs_cached) != dict(self.model.observe().cached or {}):
                if self._rounding_explains(before, arguments, dict(theirs_cached)):
                    cached = "KV-MAMBA-019"
            else:
                self.verdicts.check("KV-MAMBA-019", True)
        judged = _rules("KV-HLC-002", tables=tables, ref_counts="KV-MAMBA-025" if copies else "KV-POOL-008",
                        free_queue="KV-MAMBA-010" if retired else "KV-HLC-001", cached=cached)
        if align:
            judged["align_cached"] = self._align_cached_rule(copies, "KV-MAMBA-017" if self._checkpoint_past_hashes(
                step.request_id) else "KV-MAMBA-011")
        after = self._groups_judge(judged, peek=self._eagle_peek_keys(step.request_id))
        if any(step.request_id in self.model.manager.groups[g].copy_due for g in self._fine_groups()):
            self.verdicts.check("KV-MAMBA-021", True)  # a partial tail keyed, and the cache maps agree
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

    def _groups_lookup(self, request_id: str) -> Lookup:
        assert self.setup is not None
        expected = self.model.lookup(request_id)
        actual: Lookup = self.call("lookup", request_id, rule="KV-HYB-003")  # type: ignore[assignment]
        self.last_lookup = (len(self.steps), request_id, expected, actual)
        check = self.verdicts.check
        for g, (kind, _, _) in enumerate(self.setup.groups):
            if kind == spec.CROSS_ATTENTION and g < len(actual.block_ids):
                check("KV-CROSS-002", not actual.block_ids[g], lambda g=g: (
                    f"the lookup of {request_id} hits cross-attention group {g}: {list(actual.block_ids[g])}"))
        if len(self.setup.groups) > 1:  # every full-attention group trimmed to the hit, first of all
            for g, (kind, size, _) in enumerate(self.setup.groups):
                if kind == spec.FULL and g < len(actual.block_ids):
                    check("KV-HYB-006", len(actual.block_ids[g]) == cdiv(actual.num_tokens, size),
                          lambda g=g, size=size: f"the lookup of {request_id}: full-attention group {g} "
                          f"(block size {size}) has {len(actual.block_ids[g])} hit blocks for a hit of "
                          f"{actual.num_tokens} tokens")
        self._judge_partial_lookup(request_id, expected, actual)  # KV-MAMBA-019/020 before the general rules
        rule_id = "KV-HYB-014" if len(self.setup.groups) == 1 else "KV-HYB-003"
        if rule_id == "KV-HYB-003" and self.setup.use_eagle:
            # The hit of an EAGLE look-ahead capped at the bound, not the hashed tokens, is
            # KV-HYB-007's, as in the hybrid suite (vLLM 0.20 to 0.31).
            capped = (self._capped_look_ahead_hit(request_id) if actual.num_tokens != expected.num_tokens
                      else None)
            check("KV-HYB-007", actual.num_tokens != capped, lambda: (
                f"hit length of {request_id}: {actual.num_tokens}, the hit of a look-ahead capped at the "
                f"bound; the spec's is {expected.num_tokens}"))
        check(rule_id, actual.num_tokens == expected.num_tokens,
              lambda: _diff(f"hit length of {request_id}", expected.num_tokens, actual.num_tokens))
        check("KV-FULL-002", tuple(map(tuple, actual.block_ids)) == tuple(map(tuple, expected.block_ids)),
              lambda: _diff(f"hit blocks of {request_id}", expected.block_ids, actual.block_ids))
        return expected

    def _eagle_peek_keys(self, request_id: str) -> frozenset[tuple[object, int]]:
        """The cache keys of the sliding-window groups' EAGLE peek blocks past the aligned prefix
        that the request caches now (KV-HYB-010)."""
        assert self.setup is not None
        if not (self.setup.use_eagle and self.setup.enable_caching) or len(self.setup.groups) == 1:
            return frozenset()
        request = self.model.requests[request_id]
        coordinator = self.model.manager.coordinator
        alignment = coordinator.config.scheduler_block_size
        hashed = len(request.block_hashes) * request.hash_block_size
        computed = min(request.num_computed_tokens, hashed)
        keys = set()
        for g, (kind, size, _) in enumerate(self.setup.groups):
            if kind != hybrid_spec.SLIDING_WINDOW:
                continue
            aligned = hybrid_spec.num_cacheable_tokens(computed, alignment, False, size)
            with_peek = hybrid_spec.num_cacheable_tokens(computed, alignment, True, size)
            keys |= {(coordinator.view_hash(request.block_hashes, size, index), g)
                     for index in range(aligned // size, with_peek // size)}
        return frozenset(keys)

    def _capped_look_ahead_hit(self, request_id: str) -> int:
        """The hit length of the spec's loop with the EAGLE look-ahead capped at the bound."""
        coordinator = self.model.manager.coordinator
        request = self.model.requests[request_id]
        flat, cached, num_hashed = coordinator._lookup_inputs(request.block_hashes)
        bound = lifecycle_spec.max_cache_hit_length(request.num_tokens)
        return hybrid_spec.fixed_point(flat, cached, bound, num_hashed, coordinator.config.scheduler_block_size,
                                       margin_cap="max_length")[0]

    def _groups_Observe(self, step: steps.Observe) -> None:
        self._groups_judge(_rules("KV-HLC-001"))


def _blocks(allocated: object) -> tuple[tuple[int, ...], ...] | None:
    """New blocks per group, as comparable tuples (None for a failed allocation)."""
    return None if allocated is None else tuple(tuple(group) for group in allocated)  # type: ignore[attr-defined]


def _rules(default: str, **fields: str) -> dict[str, str]:
    names = ("num_free", "tables", "ref_counts", "free_queue", "cached")
    return {name: fields.get(name, default) for name in names}


def _short(cached: object) -> object:
    if not isinstance(cached, dict):
        return cached
    return {(key.hex()[:8] if isinstance(key, bytes) else key, group): blocks
            for (key, group), blocks in sorted(cached.items(), key=lambda kv: (kv[0][1], kv[1]))}


