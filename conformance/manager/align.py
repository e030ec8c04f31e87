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

With partial hits on (a Mamba block coarser than the hash block, KV-MAMBA-019) the scheduler
also stops a chunk at the prompt's last hash boundary (:func:`kvoracle.spec.mamba.tail_chunk_end`)
and takes the step's copies before each new step (:class:`~..steps.TakeCopies`). Charged first:
a lookup whose hit ends inside a Mamba block on either side, KV-MAMBA-020; an attention group's
cache map that is the one rounded to the scheduler block size, KV-MAMBA-019; a Mamba key inside a
block, KV-MAMBA-021 (KV-MAMBA-024 in the step that moves a tail's key); an allocation whose
outcome the copy's page explains, KV-MAMBA-022; a consumer's table without its private copy at
the shared entry, KV-MAMBA-023, a producer's without its own page, KV-MAMBA-024; the copies
taken, KV-MAMBA-023/024; reference counts while a copy is queued and after it is taken,
KV-MAMBA-025.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle.spec import mamba as mamba_spec

from .. import steps
from ..adapter import Lookup
from ..engines.reference import ReferenceEngine
from .what_if import what_if

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
        if self.config.partial_hits and start < prefill_end:
            end = self._tail_stop(request, start, end, prefill_end, block_size)
        return end - start, drafts if end == request.num_tokens else 0

    def _tail_stop(self, request: object, start: int, end: int, prefill_end: int, block_size: int) -> int:
        """KV-MAMBA-021: with partial hits the scheduler also ends a chunk at the prompt's last hash
        boundary, unless the backend exports that boundary as the chunk's checkpoint."""
        assert self.setup is not None
        h = self.setup.hash_block_size
        eagle = self.setup.use_eagle
        exported = bool(self.setup.mamba_checkpoint_blocks) and end >= prefill_end and \
            mamba_spec.checkpoint_exportable(start, end, mamba_spec.checkpoint_position(prefill_end, h, eagle), h,
                                             block_size, self.setup.mamba_checkpoint_alignment)
        last_cacheable = 0 if exported else mamba_spec.checkpoint_position(request.num_tokens, block_size, eagle)
        return mamba_spec.tail_chunk_end(start, end, request.num_prompt_tokens, h, block_size, eagle, exported,
                                         last_cacheable)

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
                             growth: dict[int, int], hit: Lookup, deferred: bool, due: dict[int, str]) -> None:
        """Whether the allocation succeeds on both sides, judged by the align-mode rules that decide
        it where they apply (``before``: the reference before the allocation, with ``deferred``
        whether its hit was deferred)."""
        assert self.setup is not None
        check = self.verdicts.check
        if (expected is None) == (actual is None):
            for rule_id, exercised in (("KV-MAMBA-009", deferred), ("KV-MAMBA-022", bool(due) and not deferred),
                                       ("KV-MAMBA-008", any(n < 0 for n in growth.values())),
                                       ("KV-MAMBA-007", any(n > 0 for n in growth.values()))):
                if exercised:
                    check(rule_id, True)
            return
        rule_id = "KV-HYB-012"
        if hit.num_tokens:
            for forget in (True, False):  # new_step_starts called, or never called
                with what_if(before) as other:
                    for g in self.setup.align_groups:
                        group = other.manager.groups[g]
                        if forget:
                            group.cached_this_step.clear()
                        else:
                            group.cached_this_step |= {key for key in other.manager.pool.cached if key[1] == g}
                    explains = (other.allocate(*arguments) is None) == (actual is None)
                if explains:
                    rule_id = "KV-MAMBA-009"
                    break
        if rule_id == "KV-HYB-012" and due and not deferred and self._copy_explains(before, arguments, actual):
            rule_id = "KV-MAMBA-022"
        if rule_id == "KV-HYB-012" and any(n < 0 for n in growth.values()):
            rule_id = "KV-MAMBA-008"
        elif rule_id == "KV-HYB-012" and any(n > 0 for n in growth.values()):
            rule_id = "KV-MAMBA-007"
        check(rule_id, False, (
            f"allocate_slots({arguments[0]}, {arguments[1]} new, hit {arguments[2]}): reference "
            f"{'fails' if expected is None else 'succeeds'}, engine {'fails' if actual is None else 'succeeds'}"
            + (" (the hit's state page was cached in this step)" if deferred else "")
            + (f" (a copy is due: {due})" if due else "")
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

    # -- partial hits (KV-MAMBA-019 .. KV-MAMBA-025) ------------------------------------------
    def _fine_groups(self) -> dict[int, int]:
        """The Mamba groups coarser than the hash block in a partial-hit model, with their blocks."""
        assert self.setup is not None
        if not self.config.partial_hits:
            return {}
        return {g: self.setup.groups[g][1] for g in self.setup.align_groups
                if self.setup.groups[g][1] > self.setup.hash_block_size}

    def _judge_partial_lookup(self, request_id: str, expected: Lookup, actual: Lookup) -> None:
        """KV-MAMBA-020: a Mamba hit may end inside a block, on a cached hash boundary; judged before
        the hit's general rules wherever either answer ends inside a Mamba block. (Partial entries
        are what a hit aligned to the hash block shows, KV-MAMBA-019, which the cache maps judge.)"""
        fine = self._fine_groups()
        if not fine:
            return
        check = self.verdicts.check
        want, got = expected.num_tokens, actual.num_tokens
        partial = any(n % size for n in (want, got) for size in fine.values())
        if partial:
            mamba = {g: (expected.block_ids[g] if g < len(expected.block_ids) else (),
                         actual.block_ids[g] if g < len(actual.block_ids) else ()) for g in fine}
            check("KV-MAMBA-020", want == got and all(a == b for a, b in mamba.values()), lambda: (
                f"partial hit of {request_id}: reference {want} tokens, Mamba entries "
                f"{ {g: a for g, (a, _) in mamba.items()} }; engine {got} tokens, "
                f"{ {g: b for g, (_, b) in mamba.items()} }"))

    def _rounding_explains(self, before: ReferenceEngine, arguments: tuple, theirs: dict) -> bool:
        """KV-MAMBA-019: whether the engine's cache map outside the fine-grained Mamba groups is the
        reference's had the groups rounded what they cache down to the scheduler block size, as
        they do with partial hits off."""
        fine = self._fine_groups()
        with what_if(before) as other:
            for g, group in enumerate(other.manager.groups):
                if g not in fine:
                    group.partial_hits = False
                    group.alignment = self.config.scheduler_block_size
            if other.allocate(*arguments) is None:
                return False
            rounded = {k: v for k, v in (other.observe().cached or {}).items() if k[1] not in fine}
        return rounded == {k: v for k, v in theirs.items() if k[1] not in fine}

    def _copies_due(self, request_id: str, hit: Lookup) -> dict[int, str]:
        """Per fine-grained group, the copy the request's next allocation makes: "consumer" for a
        partial hit (KV-MAMBA-023), "producer" for its pending tail (KV-MAMBA-024)."""
        due = {}
        for g, size in self._fine_groups().items():
            if hit.num_tokens % size and g < len(hit.block_ids) and hit.block_ids[g]:
                due[g] = "consumer"
            elif request_id in self.model.manager.groups[g].copy_due:
                due[g] = "producer"
        return due

    def _copy_explains(self, before: ReferenceEngine, arguments: tuple, actual: object) -> bool:
        """KV-MAMBA-022: whether the engine's outcome is the reference's without the copy's page."""
        with what_if(before) as other:
            for g in self._fine_groups():
                other.manager.groups[g].fine = False  # the need without the copy (KV-MAMBA-007 alone)
            return (other.allocate(*arguments) is None) == (actual is None)

    def _new_copies(self, counts: dict[int, int], request_id: str) -> dict[int, tuple[int, int, int, bool]]:
        """The copy each fine-grained group queued in the last allocation: (entry, source, copy,
        whether the request's table took the copy)."""
        copies = {}
        for g, before in counts.items():
            group = self.model.manager.groups[g]
            for source, page in group.pending_copies[before:]:
                table = group.req_to_blocks.get(request_id, [])
                holder = next((i for i, b in enumerate(table) if b is page), None)
                entry = holder if holder is not None else next(i for i, b in enumerate(table) if b is source)
                copies[g] = (entry, source.block_id, page.block_id, holder is not None)
        return copies

    def _judge_copy_tables(self, request_id: str, copies: dict[int, tuple[int, int, int, bool]],
                           actual_tables: Sequence[Sequence[int]], allocated: Sequence[Sequence[int]]) -> None:
        """KV-MAMBA-023: a consumer's table holds its private copy at the shared entry, returned first;
        KV-MAMBA-024: a producer's table keeps its page. Judged before the table's general rules."""
        check = self.verdicts.check
        for g, (entry, source, page, consumer) in copies.items():
            theirs = tuple(actual_tables[g]) if g < len(actual_tables) else ()
            got = tuple(allocated[g]) if g < len(allocated) else ()
            at = theirs[entry] if entry < len(theirs) else None
            if consumer:
                check("KV-MAMBA-023", at not in (None, NULL_BLOCK_ID, source) and got[:1] == (at,), (
                    f"{request_id} resumes inside Mamba page {source} (entry {entry} of group {g}): the reference's "
                    f"table takes a private copy there and returns it first; the engine's entry is {at}, its "
                    f"allocation returned {list(got)}"))
            else:
                check("KV-MAMBA-024", at == source and page not in theirs, (
                    f"{request_id} still writes its partial tail page {source} (entry {entry} of group {g}): its "
                    f"table keeps it and the cache entry moves to a copy; the engine's entry is {at}, table "
                    f"{list(theirs)}"))

    def _align_cached_rule(self, copies: dict[int, tuple[int, int, int, bool]], default: str) -> str:
        """The rule a difference in the Mamba groups' cache map is charged to: a moved tail key's
        (KV-MAMBA-024), a partial entry's (KV-MAMBA-021: a key inside a block), else ``default``."""
        fine = self._fine_groups()
        if not fine:
            return default
        expected = self.model.observe().cached or {}
        actual = self.call("observe", rule="KV-HLC-001").cached or {}  # type: ignore[attr-defined]
        differing = {key for key in set(expected) | set(actual)
                     if key[1] in fine and expected.get(key) != actual.get(key)}
        if not differing:
            return default
        if any(not consumer for _, _, _, consumer in copies.values()):
            return "KV-MAMBA-024"
        h = self.setup.hash_block_size  # type: ignore[union-attr]
        index = {unit: i for chain in self._hash_chains.values() for i, unit in enumerate(chain)}
        inside = any(key[0] in index and (index[key[0]] + 1) * h % fine[key[1]] for key in differing)
        return "KV-MAMBA-021" if inside else default

    def _groups_TakeCopies(self, step: steps.TakeCopies) -> None:
        groups = self.model.manager.groups
        queued = [(s.block_id, c.block_id, any(c in t for t in group.req_to_blocks.values()))
                  for group in groups for s, c in group.pending_copies]
        expected = tuple(self.model.take_copies())
        actual = tuple(tuple(pair) for pair in self.call("take_copies", rule="KV-MAMBA-025"))  # type: ignore[union-attr]
        check = self.verdicts.check
        wrong = next((consumer for (s, c, consumer), pair in zip(queued, actual) if (s, c) != pair),
                     queued[len(actual)][2] if len(actual) < len(queued) else None)
        rule_id = "KV-MAMBA-023" if wrong or (wrong is None and any(q[2] for q in queued)) else "KV-MAMBA-024"
        check(rule_id, actual == expected, lambda: (
            f"copies taken (source, copy): reference {list(expected)}, engine {list(actual)}"))
        for consumer, rule in ((True, "KV-MAMBA-023"), (False, "KV-MAMBA-024")):
            if any(q[2] == consumer for q in queued):
                check(rule, True)
        # The pages that held the copies are released: ref counts and the free queue (KV-MAMBA-025).
        self._groups_judge(dict.fromkeys(("num_free", "tables", "ref_counts", "free_queue", "cached"),
                                         "KV-MAMBA-025"))
        if queued:
            check("KV-MAMBA-025", True)
