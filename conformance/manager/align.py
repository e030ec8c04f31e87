"""Judging Mamba groups in "align" mode (spec chapter 8), for the manager suite's groups part.

A model with prefix caching on and a Mamba group runs that group in vLLM's align mode: a
table of mostly null entries holding a running state page, speculative pages and sometimes
a checkpoint page, states retired one step late, a need of its own, positional cache keys,
and hits on states cached in the current scheduler step deferred to the next one. What the
driver does for it, as the scheduler that feeds the manager:

* a prefill chunk ends on a Mamba block boundary and one starting inside a block stops at
  the next (KV-MAMBA-016, :func:`kvoracle.spec.mamba.aligned_chunk_end`); draft tokens ride
  only on a step that reaches the request's last token, as vLLM schedules them;
* ``new_step()`` between steps (:class:`~..steps.NewStep`, KV-MAMBA-009).

Which rule a difference is charged to, precise rules first: an allocation that fails on one
side only is KV-MAMBA-009's when deferring the hit (or forgetting the step's keys) explains
it, KV-MAMBA-008's when the Mamba table was longer than the step needs, KV-MAMBA-007's when a
Mamba group needed blocks at all, and the hybrid need's (KV-HYB-012) otherwise. A Mamba
table that differs is charged, in this order, to what the reference freed from the old
table (KV-MAMBA-010), which old pages moved where (KV-MAMBA-005), a null layout that differs
only at the step's checkpoint entry (KV-MAMBA-006), any other layout or length (KV-MAMBA-004),
and, the shape being right, to which blocks the pool gave (KV-POOL-004). The Mamba group's
cache keys after an allocation are KV-MAMBA-011's (KV-MAMBA-017's when the step's checkpoint
lies past the hashed tokens); a free queue that differs only in the order of a freed
request's Mamba pages is KV-MAMBA-012's; a table ending in a null, KV-MAMBA-013's
(:mod:`..invariants`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from kvoracle.spec import mamba as mamba_spec

from .. import steps
from ..adapter import Lookup
from ..engines.reference import ReferenceEngine

NULL_BLOCK_ID = 0


def align_table_rule(old: Sequence[int], expected: Sequence[int], actual: Sequence[int],
                     checkpoint_index: int | None) -> str:
    """The rule a difference between the reference's Mamba table ``expected`` and the engine's
    ``actual`` after one allocation is charged to; ``old`` is the table before it, and
    ``checkpoint_index`` the entry of the checkpoint the reference reserved (None: none)."""
    def freed(table: Sequence[int]) -> set[int]:
        return {b for b in old if b != NULL_BLOCK_ID and b not in table}

    def moved(table: Sequence[int]) -> dict[int, int]:
        return {b: list(table).index(b) for i, b in enumerate(old)
                if b != NULL_BLOCK_ID and b in table and list(table).index(b) != i}

    def page_at(table: Sequence[int], index: int) -> bool:
        return 0 <= index < len(table) and table[index] != NULL_BLOCK_ID

    # A missing (or extra) checkpoint page also changes what the step frees and moves: first.
    if checkpoint_index is not None and page_at(expected, checkpoint_index) != page_at(actual, checkpoint_index):
        return "KV-MAMBA-006"
    if freed(expected) != freed(actual):
        return "KV-MAMBA-010"
    if moved(expected) != moved(actual):
        return "KV-MAMBA-005"
    nulls = [[b == NULL_BLOCK_ID for b in table] for table in (expected, actual)]
    if nulls[0] != nulls[1]:
        return "KV-MAMBA-004"
    return "KV-POOL-004"


class AlignJudge:
    """The manager driver's steps for align-mode Mamba groups (a mixin of
    :class:`~.groups.GroupsJudge`, whose state it reads)."""

    def _align_chunk(self, request_id: str, hit_tokens: int, new: int, drafts: int) -> tuple[int, int]:
        """The chunk and drafts the scheduler gives a request of an align-mode model (KV-MAMBA-016)."""
        assert self.setup is not None
        request = self.model.requests[request_id]
        block_size = self.setup.groups[self.setup.align_groups[0]][1]
        start = request.num_computed_tokens + hit_tokens
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        end = mamba_spec.aligned_chunk_end(start, start + max(new, 0), prefill_end, block_size)
        return end - start, drafts if end == request.num_tokens else 0

    def _align_tables(self, request_id: str) -> dict[int, tuple[int, ...]]:
        """The reference's Mamba tables of the request, by group."""
        assert self.setup is not None
        tables = self.model.observe().block_tables.get(request_id, ())
        return {g: tuple(tables[g]) if g < len(tables) else () for g in self.setup.align_groups}

    def _align_growth(self, request_id: str, hit: Lookup, main_tokens: int) -> dict[int, int]:
        """Each Mamba group's entries to add for ``main_tokens`` main tokens, before any cap or
        floor (negative: the table is longer than the step needs, KV-MAMBA-008)."""
        assert self.setup is not None
        tables = self._align_tables(request_id)
        growth = {}
        for g in self.setup.align_groups:
            _, size, speculative = self.setup.groups[g]
            hits = len(hit.block_ids[g]) if g < len(hit.block_ids) else 0
            growth[g] = mamba_spec.num_required_entries(main_tokens, size, speculative) - len(tables[g]) - hits
        return growth

    def _deferred_hit(self, hit: Lookup) -> bool:
        """Whether the hit's state page carries a key a Mamba group cached in this step (KV-MAMBA-009)."""
        assert self.setup is not None
        manager = self.model.manager
        for g in self.setup.align_groups:
            blocks = hit.block_ids[g] if g < len(hit.block_ids) else ()
            if blocks and manager.pool.blocks[blocks[-1]].cache_key in manager.groups[g].cached_this_step:
                return True
        return False

    def _judge_align_outcome(self, before: ReferenceEngine, arguments: tuple, expected: object, actual: object,
                             growth: dict[int, int], hit: Lookup, deferred: bool) -> None:
        """Whether the allocation succeeds on both sides, judged by the align-mode rules that decide
        it where they apply (``before``: the reference before the allocation, with ``deferred``
        whether its hit was deferred)."""
        assert self.setup is not None
        check = self.verdicts.check
        if (expected is None) == (actual is None):
            for rule_id, exercised in (("KV-MAMBA-009", deferred),
                                       ("KV-MAMBA-008", any(n < 0 for n in growth.values())),
                                       ("KV-MAMBA-007", any(n > 0 for n in growth.values()))):
                if exercised:
                    check(rule_id, True)
            return
        rule_id = "KV-HYB-012"
        if hit.num_tokens:
            for forget in (True, False):  # new_step_starts called, or never called
                other = copy.deepcopy(before)
                for g in self.setup.align_groups:
                    group = other.manager.groups[g]
                    if forget:
                        group.cached_this_step.clear()
                    else:
                        group.cached_this_step |= {key for key in other.manager.pool.cached if key[1] == g}
                if (other.allocate(*arguments) is None) == (actual is None):
                    rule_id = "KV-MAMBA-009"
                    break
        if rule_id == "KV-HYB-012" and any(n < 0 for n in growth.values()):
            rule_id = "KV-MAMBA-008"
        elif rule_id == "KV-HYB-012" and any(n > 0 for n in growth.values()):
            rule_id = "KV-MAMBA-007"
        check(rule_id, False, (
            f"allocate_slots({arguments[0]}, {arguments[1]} new, hit {arguments[2]}): reference "
            f"{'fails' if expected is None else 'succeeds'}, engine {'fails' if actual is None else 'succeeds'}"
            + (" (the hit's state page was cached in this step)" if deferred else "")
            + f"; Mamba entries to add per group (before caps): {growth}"))

    def _checkpoint_past_hashes(self, request_id: str) -> bool:
        """Whether the step's checkpoint (KV-MAMBA-006) lies past the request's hashed tokens,
        where it has no key (KV-MAMBA-017)."""
        assert self.setup is not None
        request = self.model.requests[request_id]
        hashed = len(request.block_hashes) * request.hash_block_size
        groups = self.model.manager.groups
        return any(groups[g].checkpoints.get(request_id, (0, 0))[0] > hashed for g in self.setup.align_groups)

    def _align_retired(self, before: dict[int, tuple[int, ...]], request_id: str) -> bool:
        """Whether the reference freed pages of the request's old Mamba tables this step."""
        after = self._align_tables(request_id)
        return any(b != NULL_BLOCK_ID and b not in after[g] for g, old in before.items() for b in old)

    def _judge_align_tables(self, request_id: str, before: dict[int, tuple[int, ...]],
                            actual_tables: Sequence[Sequence[int]], allocated: Sequence[Sequence[int]],
                            expected_allocated: Sequence[Sequence[int]]) -> None:
        """After a successful allocation: each Mamba table, then what the allocation returned for it."""
        assert self.setup is not None
        expected_tables = self._align_tables(request_id)
        check = self.verdicts.check
        for g in self.setup.align_groups:
            mine = expected_tables[g]
            theirs = tuple(actual_tables[g]) if g < len(actual_tables) else ()
            position_index = self.model.manager.groups[g].checkpoints.get(request_id)
            index = position_index[1] if position_index else None
            if mine != theirs:
                check(align_table_rule(before[g], mine, theirs, index), False, (
                    f"Mamba table of {request_id} in group {g} (before the step {list(before[g])}): reference "
                    f"{list(mine)}, engine {list(theirs)}"))
            moved = any(b != NULL_BLOCK_ID and b in mine and mine.index(b) != i for i, b in enumerate(before[g]))
            freed = any(b != NULL_BLOCK_ID and b not in mine for b in before[g])
            for rule_id, exercised in (("KV-MAMBA-004", True), ("KV-MAMBA-005", moved),
                                       ("KV-MAMBA-006", index is not None), ("KV-MAMBA-010", freed)):
                if exercised:
                    check(rule_id, True)
            got = tuple(allocated[g]) if g < len(allocated) else ()
            want = tuple(expected_allocated[g]) if g < len(expected_allocated) else ()
            check("KV-MAMBA-004", got == want, lambda g=g, got=got, want=want: (
                f"the allocation for {request_id} returned {list(got)} for Mamba group {g}; the table's new "
                f"entries (nulls and moved pages included) are {list(want)}"))

    def _only_mamba_order_differs(self, pages: set[int], expected: Sequence[int] | None,
                                  actual: Sequence[int] | None) -> bool:
        """KV-MAMBA-012: whether a free queue differs only in the order of the freed Mamba ``pages``."""
        if expected is None or actual is None or tuple(expected) == tuple(actual) or len(pages) < 2:
            return False
        def masked(queue: Sequence[int]) -> tuple[int | None, ...]:
            return tuple(None if b in pages else b for b in queue)
        return masked(expected) == masked(actual)

    def _mamba_pages(self, request_id: str) -> set[int]:
        """The pages the request holds in its Mamba tables (before it is freed)."""
        return {b for table in self._align_tables(request_id).values() for b in table if b != NULL_BLOCK_ID}

    def _groups_NewStep(self, step: steps.NewStep) -> None:
        self.model.new_step()
        self.call("new_step", rule="KV-MAMBA-009")
        # Starting a step forgets which keys were cached in it, and changes nothing observable.
        self._groups_judge(dict.fromkeys(("num_free", "tables", "ref_counts", "free_queue", "cached"),
                                         "KV-MAMBA-009"))
