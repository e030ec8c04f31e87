"""The Mamba state pages of the paged store: KV-MAMBA-014 and KV-MAMBA-015 (spec chapter 8).

An align-mode Mamba group keeps one state per page instead of a slot per token. The store
plays the model runner for it, as vLLM's runner does (``vllm/v1/worker/mamba_utils.py``)
but finding the state where KV-MAMBA-018 says it is:

* a step starts from the state where the previous step left it -- the entry the runner
  remembers for the request, or, for a request's first step, entry ``(C - 1) // B`` of its
  table (the hit's state page; no state at all when nothing is computed);
* it computes the state after the step's committed tokens by chaining the request's tokens
  into that state (``data_integrity.slot_value``, the stand-in recurrence: a state read
  from the wrong page yields a wrong state, and stays wrong);
* it writes the pages :func:`kvoracle.spec.mamba.step_states` names: the table's running
  entry (``len - 1 - s``, which is the step's own running page unless rejected drafts left the
  table longer than the step), the checkpoint's page where the backend exports one
  (``exported_checkpoint``, decided from the chunk as the backend decides it, not from the
  table) and the page of a block boundary the committed tokens reached (``postprocess_mamba``'s
  copy). Every slot of a page holds the page's state. Over a table as long as a step without
  drafts that is :func:`~kvoracle.spec.mamba.states_written` (KV-MAMBA-014).

A page cached under the key of a prefix of ``P`` tokens must hold the state after ``P``
tokens (KV-MAMBA-015), when a hit offers it and for as long as it stays cached.

Draft tokens are always rejected in kvoracle's steps: a checkpoint past the committed tokens
holds a draft's state. That page, a page holding a checkpoint keyed before its block boundary
that the boundary copy reaches, a page whose block boundary a step passed without writing
it, and a page rejected drafts left in the table that the backend writes a checkpoint into
though the manager reserved none there (drafts on several real tokens, or several real tokens
right after a step with drafts: the suite's driver sends both, vLLM's scheduler neither) hold
no state a key may name
(``NO_STATE``): they are written :data:`UNKNOWN_STATE` and not judged. The request itself
stays in the model; one that starts from a page holding :data:`UNKNOWN_STATE` (a hit on such a
page) leaves it, and every page it holds is marked from then on.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvoracle.gpu import PagedKVStore, torch
from kvoracle.spec import data_integrity as data_spec
from kvoracle.spec import mamba as mamba_spec
from kvoracle.spec.hybrid import MAMBA, scheduler_block_size

KV_MAMBA_014 = mamba_spec.KV_MAMBA_014
KV_MAMBA_015 = mamba_spec.KV_MAMBA_015
KV_MAMBA_026 = mamba_spec.KV_MAMBA_026

#: What a page holds whose state kvoracle does not model (a request out of the model). Every
#: real state is odd (``slot_value`` sets the low bit) and an unwritten slot is 0, so it
#: collides with neither.
UNKNOWN_STATE = 2

Check = tuple[str, bool, str]


@attrs.frozen
class AlignGroup:
    """An align-mode Mamba group as the runner sees it."""

    group_id: int
    block_size: int
    #: Whether the group has prefill checkpoint pages, and the backend's export granularity.
    has_checkpoint_blocks: bool
    checkpoint_alignment: int
    #: The hit alignment A: the block size with one group, the scheduler block size with several (the
    #: hash block with partial hits on).
    alignment: int
    drop_eagle: bool
    hash_block_size: int
    num_speculative_blocks: int = 0

    def checkpoint(self, query_start: int, query_end: int) -> int:
        """The checkpoint position the backend exports for this chunk, 0 for none (KV-MAMBA-006,
        the backend's half: it does not look at the table)."""
        return mamba_spec.exported_checkpoint(self.has_checkpoint_blocks, self.checkpoint_alignment, query_start,
                                              query_end, self.alignment, self.hash_block_size, self.block_size,
                                              self.drop_eagle)


def align_groups_of(config: object) -> tuple[AlignGroup, ...]:
    """The align-mode Mamba groups of a hybrid configuration (none for a single-group one)."""
    specs = getattr(config, "kv_cache_specs", None)
    if not specs or not getattr(config, "enable_caching", False):
        return ()
    several = len(specs) > 1
    # The backend exports checkpoints at the alignment of hits (vLLM's cache_hit_alignment_tokens):
    # the scheduler block size, or the hash block with partial hits on (KV-MAMBA-019).
    alignment = getattr(config, "hit_alignment", 0) or scheduler_block_size(tuple(s.block_size for s in specs))
    return tuple(
        AlignGroup(g, s.block_size, s.num_prefill_checkpoint_blocks > 0, s.prefill_checkpoint_alignment or 0,
                   alignment if several else s.block_size, bool(config.use_eagle),  # type: ignore[attr-defined]
                   config.hash_block_size, s.num_speculative_blocks)  # type: ignore[attr-defined]
        for g, s in enumerate(specs) if s.kind == MAMBA and getattr(s, "mamba_cache_mode", "") == "align")


@attrs.define
class RunnerState:
    """What the runner remembers of one request: where each group's state is."""

    #: Group id -> the table entry holding the request's current state.
    state_index: dict[int, int] = attrs.Factory(dict)
    #: Whether the request's states left the model (a step that started from a page holding
    #: UNKNOWN_STATE, or a page the step needs missing): written as UNKNOWN_STATE from then on.
    unknown: bool = False
    #: The groups whose pages were marked UNKNOWN_STATE when the request left the model.
    forgotten: set[int] = attrs.Factory(set)
    #: Group id -> the pages holding a checkpoint keyed before their block boundary
    #: (``spec.mamba.keyed_before_boundary``), by block id.
    keyed_early: dict[int, set[int]] = attrs.Factory(dict)
    #: Group id -> which entries of the table were null after the request's last step: the
    #: table the manager saw when it decided whether to reserve this step's checkpoint page.
    #: (What it frees in between, KV-MAMBA-010, lies before the pages a checkpoint can take.)
    last_tables: dict[int, tuple[bool, ...]] = attrs.Factory(dict)


class MambaStatePages:
    """The runner's Mamba half of a paged store: writes, and the checks of KV-MAMBA-014/015."""

    def __init__(self, store: PagedKVStore, groups: tuple[AlignGroup, ...]) -> None:
        self.store = store
        self.groups = groups
        self.device = store.device
        self.requests: dict[str, RunnerState] = {}

    # -- pages ---------------------------------------------------------------------------
    def _read(self, group: AlignGroup, table: torch.Tensor, index: int) -> int | None:
        """The state in entry ``index`` of ``table``; ``None`` where the entry is missing or null."""
        if not 0 <= index < table.numel() or int(table[index]) == 0:
            return None
        return int(self.store.blocks(group.group_id, table[index:index + 1])[0, 0])

    def _write(self, group: AlignGroup, table: torch.Tensor, index: int, state: int) -> None:
        positions = torch.arange(index * group.block_size, (index + 1) * group.block_size, device=self.device)
        self.store.write(group.group_id, table, positions,
                         torch.full_like(positions, state, dtype=torch.int64))

    # -- the runner ----------------------------------------------------------------------
    def _source(self, runner: RunnerState, group: AlignGroup, start: int) -> int:
        """The entry a step starting after ``start`` tokens reads its state from (-1: none yet)."""
        return mamba_spec.start_entry(runner.state_index.get(group.group_id, -1), start, group.block_size)

    def _running_entry(self, group: AlignGroup, table: torch.Tensor, query_end: int) -> int:
        """The entry holding the request's state after the step: KV-MAMBA-018's running entry
        (where the table is too short for the step, the step's own running page, past the end)."""
        required = mamba_spec.num_required_entries(query_end, group.block_size, group.num_speculative_blocks)
        if table.numel() < required:
            return mamba_spec.running_index(query_end, group.block_size)
        return mamba_spec.state_entry(table.numel(), query_end, group.block_size, group.num_speculative_blocks)

    def _targets(self, group: AlignGroup, is_null: tuple[bool, ...], keyed_early: tuple[bool, ...], committed: int,
                 query_end: int, checkpoint: int, reserved: bool) -> tuple[tuple[int, int], ...]:
        """(entry, state after that many tokens, or ``NO_STATE``) for every page the step writes
        (KV-MAMBA-018; over a table as long as a step without drafts, KV-MAMBA-014's
        ``states_written``)."""
        return mamba_spec.step_states(is_null, keyed_early, committed, query_end, group.block_size,
                                      group.num_speculative_blocks, checkpoint, reserved)

    def forget(self, request_id: str) -> None:
        """A finished or preempted request: its next step starts from its table again."""
        self.requests.pop(request_id, None)

    def step(self, request_id: str, tables: Sequence[torch.Tensor], tokens: Sequence[int], salt: str | None,
             start: int, committed: int, scheduled: int) -> list[Check]:
        """The step from ``start`` computed tokens to ``committed`` ran with ``scheduled`` tokens
        (drafts included, all rejected): read each group's state, chain the committed tokens in,
        write the pages KV-MAMBA-018 names. Returns the KV-MAMBA-014 verdicts: every page the
        step reads or must write is a real one."""
        runner = self.requests.setdefault(request_id, RunnerState())
        query_end = start + scheduled
        judged = not runner.unknown
        checks: list[Check] = []
        #: KV-MAMBA-026's verdicts: the first step of a request resuming inside a block (a partial hit).
        resumed: list[Check] = []
        for group in self.groups:
            table = tables[group.group_id]
            first = group.group_id not in runner.state_index
            source = self._source(runner, group, start)
            if source < 0:
                state: int | None = data_spec.prefix_seed(salt)
            else:
                state = self._read(group, table, source)
                if state is None and not runner.unknown:
                    checks.append((KV_MAMBA_014, False, (
                        f"{request_id}'s step from {start} tokens reads its state in group {group.group_id} from "
                        f"entry {source}, which is {'null' if source < table.numel() else 'past the end'} in "
                        f"its table {table.tolist()}")))
                    runner.unknown = True
                elif first and mamba_spec.shared_entry(start, group.block_size) >= 0 and not runner.unknown \
                        and state != UNKNOWN_STATE:
                    resumed.append(self._check_resumed(request_id, group, table, source, state, tokens, salt, start))
                    runner.unknown = not resumed[-1][1]  # a wrong state: what the step writes is not modelled
            if state == UNKNOWN_STATE:
                runner.unknown = True  # a hit on a page kvoracle does not model
            if runner.unknown and group.group_id not in runner.forgotten:
                # Leaving the model: any page the request holds may be keyed later, and what it
                # holds is no longer known.
                runner.forgotten.add(group.group_id)
                for index in range(table.numel()):
                    if self._read(group, table, index) is not None:
                        self._write(group, table, index, UNKNOWN_STATE)
            running = self._running_entry(group, table, query_end)
            runner.state_index[group.group_id] = running
            checkpoint = group.checkpoint(start, query_end)
            # Whether the manager reserved the checkpoint's page, judged on the table it saw then
            # (a request's first step: none, so any entry is free).
            last_table = runner.last_tables.get(group.group_id, ())
            reserved = bool(checkpoint) and mamba_spec.checkpoint_entry_free(
                mamba_spec.checkpoint_index(query_end, group.block_size), last_table,
                group.group_id in runner.last_tables, group.num_speculative_blocks)
            runner.last_tables[group.group_id] = tuple(int(block) == 0 for block in table.tolist())
            missing = self._missing_page(group, table, running, committed, query_end, checkpoint)
            if missing is not None:
                if not runner.unknown:
                    index, count = missing
                    what = "a draft's state" if count == mamba_spec.NO_STATE else f"the state after {count} tokens"
                    checks.append((KV_MAMBA_014, False, (
                        f"{request_id}'s step to {query_end} tokens writes {what} into "
                        f"entry {index} of group {group.group_id}, which is "
                        f"{'null' if index < table.numel() else 'past the end'} in its table {table.tolist()}")))
                runner.unknown = True
                continue
            blocks = [int(block) for block in table.tolist()]
            is_null = tuple(block == 0 for block in blocks)
            early_blocks = runner.keyed_early.setdefault(group.group_id, set())
            early_blocks &= set(blocks)
            keyed_early = tuple(block in early_blocks for block in blocks)
            # Pages whose boundary the step passed without writing them hold no state a key names
            # (decided by the rule, not by what this runner writes).
            passed = mamba_spec.passed_pages(is_null, keyed_early, start, committed, query_end, group.block_size,
                                             group.num_speculative_blocks, checkpoint)
            for index in passed:
                self._write(group, table, index, UNKNOWN_STATE)
            targets = self._targets(group, is_null, keyed_early, committed, query_end, checkpoint, reserved)
            target = mamba_spec.checkpoint_index(query_end, group.block_size) if checkpoint else -1
            for index, count in targets:
                if 0 <= index < len(blocks):
                    early = index == target and count == checkpoint and mamba_spec.keyed_before_boundary(
                        index, checkpoint, committed, group.block_size)
                    (early_blocks.add if early else early_blocks.discard)(blocks[index])
            if runner.unknown:
                for index, _ in targets:
                    self._write(group, table, index, UNKNOWN_STATE)
                continue
            assert state is not None
            states = {start: state, mamba_spec.NO_STATE: UNKNOWN_STATE}
            for position in range(start, committed):
                state = data_spec.slot_value(state, tokens[position], position)
                states[position + 1] = state
            for index, count in targets:
                if not 0 <= index < table.numel() or is_null[index]:
                    checks.append((KV_MAMBA_014, False, (
                        f"{request_id}'s step to {query_end} tokens writes the state after {count} tokens "
                        f"into entry {index} of group {group.group_id}, which is "
                        f"{'null' if index < table.numel() else 'past the end'} in its table {table.tolist()}")))
                    runner.unknown = True
                    continue
                self._write(group, table, index, states[count])
        if judged and not runner.unknown and not checks:
            checks.append((KV_MAMBA_014, True, ""))
        return checks + resumed

    def _check_resumed(self, request_id: str, group: AlignGroup, table: torch.Tensor, source: int, found: int,
                       tokens: Sequence[int], salt: str | None, start: int) -> Check:
        """KV-MAMBA-026: the first step of a request that resumes inside a block -- after a partial hit,
        whose shared page the request holds a private copy of -- reads the state after its ``start``
        computed tokens from that copy, which the runner made before the step."""
        values = data_spec.extend_prefix_values((), tokens[:start], salt)
        ok = found == values[-1]
        return (KV_MAMBA_026, ok, "" if ok else (
            f"{request_id} resumes inside a block after {start} tokens: its first step reads entry {source} "
            f"(block {int(table[source])}) of group {group.group_id}, which {_holds(found, values, start)} "
            f"(the copy of the shared page is made before the step's forward)"))

    def _missing_page(self, group: AlignGroup, table: torch.Tensor, running: int, committed: int, query_end: int,
                      checkpoint: int) -> tuple[int, int] | None:
        """(entry, state after that many tokens, or ``NO_STATE`` for a draft's) of a page the step
        must write that the table lacks: its running entry or a speculative one (the runner's
        kernels take the table's last 1 + s entries, KV-MAMBA-013). ``None`` when none is missing.
        (A checkpoint's entry may be null: the manager gives it a page only where the table grows
        past it, and KV-MAMBA-018 writes no checkpoint there.)"""
        for index in range(running, running + group.num_speculative_blocks + 1):
            if not 0 <= index < table.numel() or int(table[index]) == 0:
                return index, committed if index == running else mamba_spec.NO_STATE
        return None

    # -- the checks ----------------------------------------------------------------------
    def check_hit(self, request_id: str, hit_tokens: int, hit_blocks: Sequence[Sequence[int]],
                  values: Sequence[int]) -> list[Check]:
        """KV-MAMBA-015: a hit's state page holds the state after the hit's tokens."""
        checks: list[Check] = []
        if hit_tokens <= 0:
            return checks
        for group in self.groups:
            if group.group_id >= len(hit_blocks) or not hit_blocks[group.group_id]:
                continue
            blocks = hit_blocks[group.group_id]
            index = mamba_spec.running_index(hit_tokens, group.block_size)  # the last entry (a partial hit's too)
            table = torch.tensor(list(blocks), dtype=torch.int64, device=self.device)
            found = self._read(group, table, index)
            if found == UNKNOWN_STATE:
                continue
            ok = found == values[hit_tokens - 1]
            checks.append((KV_MAMBA_015, ok, "" if ok else (
                f"hit of {hit_tokens} tokens for {request_id}: group {group.group_id}'s state page "
                f"(entry {index} of {list(blocks)}) {_holds(found, values, hit_tokens)}")))
        return checks

    def check_cached(self, cached: dict, key_states: dict) -> list[Check]:
        """KV-MAMBA-015: every cached state page holds the state its key names."""
        ids = {group.group_id for group in self.groups}
        compared = 0
        for key, block_ids in cached.items():
            if key[1] not in ids or key not in key_states:
                continue
            tokens, expected = key_states[key]
            for block_id in block_ids:
                found = int(self.store.values[key[1]][block_id, 0])
                compared += found != UNKNOWN_STATE
                if found not in (expected, UNKNOWN_STATE):
                    what = "no state" if found == data_spec.UNWRITTEN else "another state"
                    return [(KV_MAMBA_015, False, (
                        f"block {block_id} is cached in group {key[1]} under the key of {tokens} tokens "
                        f"({key[0].hex()[:12]}) but holds {what}"))]
        return [(KV_MAMBA_015, True, "")] if compared else []


def _holds(found: int | None, values: Sequence[int], tokens: int) -> str:
    if found is None:
        return "is null or missing"
    if found == data_spec.UNWRITTEN:
        return "was never written"
    for count, value in enumerate(values, start=1):
        if value == found:
            return f"holds the state after {count} tokens, not {tokens}"
    return f"holds another state than the one after {tokens} tokens"
