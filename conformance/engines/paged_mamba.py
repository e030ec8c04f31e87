"""The Mamba state pages of the paged store: KV-MAMBA-014 and KV-MAMBA-015 (spec chapter 8).

An align-mode Mamba group keeps one state per page instead of a slot per token. The store
plays vLLM's model runner for it (``vllm/v1/worker/mamba_utils.py``):

* a step starts from the state where the previous step left it -- the page the runner
  remembers for the request, or, for a request's first step, entry ``(C - 1) // B`` of its
  table (the hit's state page; no state at all when nothing is computed);
* it computes the state after the step's committed tokens by chaining the request's tokens
  into that state (``data_integrity.slot_value``, the stand-in recurrence: a state read
  from the wrong page yields a wrong state, and stays wrong);
* it writes the pages :func:`kvoracle.spec.mamba.states_written` names: the running page
  and, where the backend exports one (``checkpoint_exportable``, decided from the chunk as
  the backend decides it, not from the table), the checkpoint's page. Every slot of a page
  holds the page's state.

A page cached under the key of a prefix of ``P`` tokens must hold the state after ``P``
tokens (KV-MAMBA-015), when a hit offers it and for as long as it stays cached.

Draft tokens are always rejected in kvoracle's steps. A step with drafts leaves the state after
its committed tokens in its running page (the drafts' states go to the speculative pages,
which nothing caches) and copies it to the page of a block boundary the committed tokens reached
(``postprocess_mamba``); a checkpoint past the committed tokens holds a draft's state,
:data:`UNKNOWN_STATE`. After rejected drafts a step can be shorter than the last one, and the
table longer than it needs: there vLLM's runner reads by position and KV-MAMBA-013 from the
table's end (``docs/findings/mamba-runner-null-state.md``), so such a request -- and one that
starts from a page holding :data:`UNKNOWN_STATE` -- leaves the model: it writes that marker from
then on, and pages holding it are not judged.
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
    #: The hit alignment A: the block size with one group, the scheduler block size with several.
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
    alignment = scheduler_block_size(tuple(s.block_size for s in specs))
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
    #: Whether the request's states left the model (a table longer than a step, drafts on
    #: several real tokens or several real tokens right after drafts, an unknown start page):
    #: written as UNKNOWN_STATE from then on.
    unknown: bool = False
    #: Whether its last step had drafts.
    drafted: bool = False
    #: The groups whose pages were marked UNKNOWN_STATE when the request left the model.
    forgotten: set[int] = attrs.Factory(set)


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
        return runner.state_index.get(group.group_id, (start - 1) // group.block_size if start else -1)

    def _targets(self, group: AlignGroup, committed: int, checkpoint: int) -> tuple[tuple[int, int], ...]:
        """(entry, state after that many tokens) a step without drafts writes (KV-MAMBA-014)."""
        return mamba_spec.states_written(committed, group.block_size, checkpoint)

    def forget(self, request_id: str) -> None:
        """A finished or preempted request: its next step starts from its table again."""
        self.requests.pop(request_id, None)

    def step(self, request_id: str, tables: Sequence[torch.Tensor], tokens: Sequence[int], salt: str | None,
             start: int, committed: int, scheduled: int) -> list[Check]:
        """The step from ``start`` computed tokens to ``committed`` ran with ``scheduled`` tokens
        (drafts included, all rejected): read each group's state, chain the committed tokens in,
        write the pages. Returns the KV-MAMBA-014 verdicts: every page the step reads or writes
        is a real one."""
        runner = self.requests.setdefault(request_id, RunnerState())
        query_end = start + scheduled
        drafts = scheduled > committed - start
        judged = not runner.unknown
        checks: list[Check] = []
        for group in self.groups:
            table = tables[group.group_id]
            if (drafts or runner.drafted) and committed - start > 1:
                # Several real tokens with drafts (the driver's last prefill chunk), or right after
                # a step with drafts: vLLM's scheduler sends neither (update_draft_token_ids drops
                # drafts of prefill chunks, and a drafting request decodes one token a step). There
                # the runner's boundary copy can land on the step's checkpoint page, and the page
                # the drafts' step ran in can be keyed at a position whose state it never held.
                runner.unknown = True
            if table.numel() > mamba_spec.num_required_entries(query_end, group.block_size,
                                                               group.num_speculative_blocks):
                # After rejected drafts the table is longer than the step: vLLM's runner reads
                # by position there and KV-MAMBA-013 from the table's end
                # (docs/findings/mamba-runner-null-state.md); the request leaves the model.
                runner.unknown = True
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
            if state == UNKNOWN_STATE:
                runner.unknown = True
            if runner.unknown and group.group_id not in runner.forgotten:
                # Leaving the model: any page the request holds may be keyed later, and what it
                # holds is no longer known.
                runner.forgotten.add(group.group_id)
                for index in range(table.numel()):
                    if self._read(group, table, index) is not None:
                        self._write(group, table, index, UNKNOWN_STATE)
            running = mamba_spec.running_index(query_end, group.block_size)
            checkpoint = group.checkpoint(start, query_end)
            if runner.unknown:
                writes = self._unknown_writes(group, query_end, committed, checkpoint)
            else:
                assert state is not None
                states: dict[int | None, int] = {start: state, None: UNKNOWN_STATE}
                for position in range(start, committed):
                    state = data_spec.slot_value(state, tokens[position], position)
                    states[position + 1] = state
                if drafts:
                    writes = self._draft_writes(group, query_end, committed, checkpoint)
                else:
                    writes = list(self._targets(group, committed, checkpoint))
                writes = [(index, count, states[count]) for index, count in writes]
            for index, count, value in writes:
                if self._read(group, table, index) is None:
                    copy_only = drafts and index != running and not (
                        checkpoint and index == mamba_spec.checkpoint_index(query_end, group.block_size))
                    # (postprocess_mamba's copy into a null entry goes to the null block, which no
                    # one reads as a state: not a page the request relies on)
                    if not runner.unknown and count is not None and not copy_only:
                        checks.append((KV_MAMBA_014, False, (
                            f"{request_id}'s step to {query_end} tokens writes the state after {count} tokens "
                            f"into entry {index} of group {group.group_id}, which is "
                            f"{'null' if index < table.numel() else 'past the end'} in its table {table.tolist()}")))
                    continue
                self._write(group, table, index, value)
            runner.state_index[group.group_id] = running
        runner.drafted = drafts
        if judged and not runner.unknown and not checks:
            checks.append((KV_MAMBA_014, True, ""))
        return checks

    def _draft_writes(self, group: AlignGroup, query_end: int, committed: int, checkpoint: int
                      ) -> list[tuple[int, int | None]]:
        """(entry, state after that many tokens) a step with rejected drafts leaves: the state after
        its committed tokens in the running page (``preprocess_mamba``'s running entry; the drafts'
        states go to the speculative pages), copied to the page of the block boundary it reached
        (``postprocess_mamba``); a checkpoint past the committed tokens holds a draft's state."""
        writes: list[tuple[int, int | None]] = [(mamba_spec.running_index(query_end, group.block_size), committed)]
        if checkpoint:  # None: a draft's state, not modelled
            writes.append((mamba_spec.checkpoint_index(query_end, group.block_size),
                           checkpoint if checkpoint <= committed else None))
        if committed % group.block_size == 0 and committed // group.block_size - 1 != writes[0][0]:
            writes.append((committed // group.block_size - 1, committed))
        return writes

    def _unknown_writes(self, group: AlignGroup, query_end: int, committed: int, checkpoint: int
                        ) -> list[tuple[int, int | None, int]]:
        """The pages a step of a request out of the model may write, marked as not modelled."""
        indices = {index for index, _ in self._draft_writes(group, query_end, committed, checkpoint)}
        return [(index, None, UNKNOWN_STATE) for index in sorted(indices)]

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
            index = hit_tokens // group.block_size - 1
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
