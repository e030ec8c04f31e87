"""A paged KV store around any engine adapter: the KV-DATA rules (spec chapter ``data_integrity``).

:class:`PagedStoreWrapper` wraps *any* adapter -- a single-group ``EngineAdapter``
configured with one group or several -- with a physical paged KV store
(:class:`kvoracle.gpu.PagedKVStore`, one tensor per KV-cache group) and judges the
data in it. It plays the model runner: when the scheduler runs a step
(``advance``), it writes the value of every token the step scheduled into the
token's slot through each group's block table; after every operation its
observation carries the results of checking the store against what each request
should see (``Observation.data_checks``), which the suites record like any other
invariant. Each group is judged on the positions it still relies on (spec
``first_relied_position``, KV-DATA-006): a sliding-window or chunked-local group
owes nothing before its window; cross-attention groups and Mamba groups without prefix
caching are not written. An align-mode Mamba group gets a state per page, written as vLLM's
model runner writes it and judged by KV-MAMBA-014/015 (:mod:`.paged_mamba`). With vLLM's
fine-grained partial hits the runner also makes the copies of shared state pages the allocations
queued (the inner adapter's ``pending_copies()``), before the step's forward, and a request
resuming inside a block is judged on the state its private copy gives it (KV-MAMBA-026).

:class:`PagedReferenceEngine` and :class:`PagedVllmEngine` wrap the reference and
vLLM for the manager suite (``--engine paged-reference`` or ``paged-vllm``), over one
group or several.
The torch engine in its store is :class:`~.gpu.GpuEngine`.

Importing this module needs torch; it takes ``torch`` from :mod:`kvoracle.gpu`, which
imports it without the warning a CPU build without numpy prints.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvoracle.gpu import PagedKVStore, default_device, torch
from kvoracle.gpu.paged_store import NO_SLOT_EPOCH
from kvoracle.spec import data_integrity as data_spec
from kvoracle.spec import hashing
from kvoracle.spec.hybrid import CHUNKED_LOCAL, FULL, SLIDING_WINDOW

from ..adapter import (
    UNKNOWN_HASH,
    Capabilities,
    EngineAdapter,
    EngineConfig,
    KeyRef,
    Lookup,
    Observation,
)
from .paged_mamba import MambaStatePages, align_groups_of


@attrs.frozen
class Mismatch:
    """The first position read through a table that does not hold its expected value."""

    #: Its index among the positions read.
    offset: int
    #: The value its slot holds.
    found: int
    #: The slot's write epoch (``NO_SLOT_EPOCH``: the position has no slot).
    written_at: int


def first_mismatch(store: PagedKVStore, group: int, table: torch.Tensor, positions: torch.Tensor,
                   expected: Sequence[int]) -> Mismatch | None:
    """Read ``positions`` through ``table`` (a block table, or a row of slot indices in a store of
    one-slot blocks) and compare them with ``expected``: the first that differs, or ``None``.
    One gather judges every position, whoever the caller is (this wrapper, the prefix-tree
    store)."""
    actual, epochs = store.read(group, table, positions)
    want = torch.tensor(list(expected), dtype=torch.int64, device=store.device)
    wrong = (actual != want).nonzero()
    if not wrong.numel():
        return None
    offset = int(wrong[0])
    return Mismatch(offset, int(actual[offset]), int(epochs[offset]))


def first_changed_block(store: PagedKVStore, group: int, block_ids: Sequence[int],
                        expected: Sequence[tuple[int, ...]]) -> int | None:
    """KV-DATA-004 over many blocks at once: the index of the first of ``block_ids`` whose slots do
    not hold ``expected[i]`` (spec ``cached_block_intact``), or ``None``."""
    if not block_ids:
        return None
    actual = store.blocks(group, torch.tensor(list(block_ids), dtype=torch.int64, device=store.device))
    bad = (actual != torch.tensor(list(expected), dtype=torch.int64, device=store.device)).any(dim=1).nonzero()
    if not bad.numel():
        return None
    index = int(bad[0])
    assert not data_spec.cached_block_intact(tuple(expected[index]), tuple(actual[index].tolist()))
    return index


@attrs.frozen
class _Group:
    """One KV-cache group as the store sees it."""

    kind: str
    block_size: int
    #: The sliding window or attention chunk size; 0 for other kinds.
    param: int = 0

    @property
    def holds_token_kv(self) -> bool:
        """Whether the group has a slot per token of the request (written and judged)."""
        return self.kind in data_spec.TOKEN_KV_KINDS

    def first_relied(self, num_tokens: int) -> int:
        return data_spec.first_relied_position(self.kind, self.param, num_tokens)


def _groups_of(config: object) -> tuple[_Group, ...]:
    """The groups of a single-group ``EngineConfig`` or of a hybrid configuration."""
    specs = getattr(config, "kv_cache_specs", None)
    if specs is None:
        return (_Group(FULL, config.block_size),)  # type: ignore[attr-defined]
    params = {SLIDING_WINDOW: "sliding_window", CHUNKED_LOCAL: "attention_chunk_size"}
    return tuple(_Group(kv.kind, kv.block_size, getattr(kv, params[kv.kind]) if kv.kind in params else 0)
                 for kv in specs)


@attrs.define
class _Tracked:
    """What the store knows of one request: the values its tokens write, and its reliance."""

    tokens: list[int]
    salt: str | None
    #: Slot value of every token position (spec ``extend_prefix_values``).
    values: tuple[int, ...] = ()
    hashes: tuple[bytes, ...] = ()
    running: bool = False
    #: Positions computed or adopted: 0 .. computed - 1 (each group relies on a suffix of them).
    computed: int = 0
    #: The first ``hit_tokens`` of them came from a prefix-cache hit.
    hit_tokens: int = 0
    #: Per computed position, the store epoch since which the request relies on it.
    since: list[int] = attrs.Factory(list)
    #: Tokens the last allocation scheduled, written when the step runs (``advance``).
    scheduled: int = 0
    #: The verdicts on the data of the request's last lookup: (rule id, ok, message) each.
    lookup_check: tuple[tuple[str, bool, str], ...] = ()
    #: The verdicts on the Mamba state pages its last step read and wrote (KV-MAMBA-014).
    step_check: tuple[tuple[str, bool, str], ...] = ()


class PagedStoreWrapper:
    """Any engine adapter, plus a paged KV store whose data is judged (KV-DATA rules).

    Everything is forwarded to ``inner``; the wrapper only adds writes to the store
    when a step runs, and data checks to every observation. If the inner adapter
    has ``paged_block_tables(request_id)`` (per-group block tables, e.g. as tensors)
    the writes use it; otherwise they read the tables from ``inner.observe()``.
    The inner adapter may be a single-group one (``EngineAdapter``, configured with
    an ``EngineConfig``) or a hybrid lifecycle one (configured with a
    ``HybridConfig``): the store has one tensor per group either way.
    """

    #: The model runner of the align-mode Mamba groups (a seam for the meta-tests' broken runners).
    mamba_pages_class = MambaStatePages

    def __init__(self, inner: EngineAdapter, device: torch.device | str | None = None) -> None:
        self.inner = inner
        #: A subclass may name itself; a plain wrapper is named after what it wraps.
        self.name: str = getattr(type(self), "name", f"{inner.name}+paged-store")
        self.device = torch.device(device) if device is not None else default_device()
        self.config: EngineConfig | None = None
        self.groups: tuple[_Group, ...] = ()
        self.store: PagedKVStore | None = None
        self.tracked: dict[str, _Tracked] = {}
        #: (cache key, group) -> the values its block holds (every prefix seen since configure).
        self.key_values: dict[KeyRef, tuple[int, ...]] = {}
        #: The runner of the align-mode Mamba groups' state pages (None without any).
        self.mamba: MambaStatePages | None = None
        #: (cache key, Mamba group) -> (the prefix length it names, the state after that prefix).
        self.key_states: dict[KeyRef, tuple[int, int]] = {}
        #: Whether the model has vLLM's fine-grained partial Mamba hits, whose copies the runner makes
        #: (where the inner adapter shows them).
        self.partial_hits = False
        #: How many of the copies queued since the scheduler last took them the runner has made.
        self.copies_made = 0

    # -- forwarded -----------------------------------------------------------------------
    def version(self) -> str:
        return self.inner.version()

    def capabilities(self) -> Capabilities:
        inner = self.inner.capabilities()
        # The runner copies shared Mamba pages before a step's forward (KV-MAMBA-026), which it can
        # only where the inner adapter shows the copies its allocations queued (``pending_copies``).
        partial = inner.mamba_partial_hits and hasattr(self.inner, "pending_copies")
        return attrs.evolve(inner, kv_data=True, mamba_partial_hits=partial)

    def configure(self, config: EngineConfig) -> None:
        self.inner.configure(config)
        self.config = config
        self.groups = _groups_of(config)
        self.store = PagedKVStore(config.num_blocks, tuple(g.block_size for g in self.groups),
                                  self.device)
        self.tracked = {}
        self.key_values = {}
        align = align_groups_of(config)
        self.mamba = self.mamba_pages_class(self.store, align) if align else None
        self.key_states = {}
        self.partial_hits = bool(getattr(config, "partial_hits", False)) and hasattr(self.inner, "pending_copies")
        self.copies_made = 0

    def add_request(self, request_id: str, prompt: Sequence[int],
                    cache_salt: str | None = None) -> None:
        if cache_salt is None:  # (hybrid lifecycle adapters take no salt)
            self.inner.add_request(request_id, prompt)
        else:
            self.inner.add_request(request_id, prompt, cache_salt)
        self.tracked[request_id] = _Tracked(list(prompt), cache_salt)
        self._extend(request_id)

    def append_tokens(self, request_id: str, tokens: Sequence[int]) -> None:
        self.inner.append_tokens(request_id, tokens)
        self.tracked[request_id].tokens.extend(tokens)
        self._extend(request_id)

    def _extend(self, request_id: str) -> None:
        """The new tokens' slot values, and the contents each new full block's key names."""
        assert self.config is not None
        request = self.tracked[request_id]
        request.values = data_spec.extend_prefix_values(request.values, request.tokens,
                                                        request.salt)
        known = len(request.hashes)
        hash_size = self.config.hash_block_size
        request.hashes = hashing.extend_block_hashes(
            request.hashes, tuple(request.tokens), hash_size, request.salt)
        for group in self.mamba.groups if self.mamba is not None else ():
            # Every hash boundary: a page's positional key (the page is the hash block, KV-MAMBA-003)
            # or, with partial hits, a key inside a Mamba block (KV-MAMBA-021).
            for index in range(known, len(request.hashes)):
                tokens = (index + 1) * hash_size
                self.key_states.setdefault((request.hashes[index], group.group_id),
                                           (tokens, request.values[tokens - 1]))
        for group_id, group in enumerate(self.groups):
            if not group.holds_token_kv:
                continue
            size = group.block_size
            scale = size // hash_size
            for index in range(known, len(request.hashes)):
                if (index + 1) % scale == 0:  # the hash that names a whole block (KV-HASH-006)
                    block = (index + 1) // scale - 1
                    self.key_values.setdefault((request.hashes[index], group_id),
                                               request.values[block * size:(block + 1) * size])

    def lookup(self, request_id: str, max_cache_hit_length: int | None = None) -> Lookup:
        hit = self.inner.lookup(request_id) if max_cache_hit_length is None else \
            self.inner.lookup(request_id, max_cache_hit_length)
        checks = self._check_hit(request_id, hit)
        if self.mamba is not None:
            checks += tuple(self.mamba.check_hit(request_id, hit.num_tokens, hit.block_ids,
                                                 self.tracked[request_id].values))
        self.tracked[request_id].lookup_check = checks
        return hit

    def allocate(self, request_id: str, num_new_tokens: int, num_new_computed_tokens: int,
                 num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                 num_encoder_tokens: int = 0) -> tuple[tuple[int, ...], ...] | None:
        encoder = (num_encoder_tokens,) if num_encoder_tokens else ()  # hybrid adapters only
        result = self.inner.allocate(request_id, num_new_tokens, num_new_computed_tokens,
                                     num_lookahead_tokens, delay_cache_blocks, *encoder)
        if result is None:
            return None
        assert self.store is not None
        request = self.tracked[request_id]
        if not request.running:  # adopting the hit: the request relies on it from now on
            request.running = True
            request.computed = request.hit_tokens = num_new_computed_tokens
            request.since = [self.store.clock] * num_new_computed_tokens
        request.scheduled = num_new_tokens
        return result

    def advance(self, request_id: str, num_tokens: int) -> None:
        """The step ran: write the KV of every token it scheduled that the request has.

        That includes drafts at positions the request already has tokens for, so that a
        block the step cached (up to ``num_tokens_to_cache``) is fully written. Every group
        with per-token KV is written through its own block table.
        """
        self.inner.advance(request_id, num_tokens)
        assert self.store is not None
        request = self.tracked[request_id]
        start = request.computed
        scheduled = max(num_tokens, request.scheduled)
        stop = min(start + scheduled, len(request.tokens))
        request.scheduled = 0
        if self.partial_hits:  # before the step reads or writes a page (KV-MAMBA-026)
            self._copy_pages()
        if self.mamba is not None and num_tokens > 0:
            request.step_check = tuple(self.mamba.step(
                request_id, self._write_tables(request_id), request.tokens, request.salt, start,
                start + num_tokens, scheduled))
        if stop > start:
            tables = self._write_tables(request_id)
            positions = torch.arange(start, stop, device=self.device)
            values = torch.tensor(request.values[start:stop], dtype=torch.int64,
                                  device=self.device)
            for group_id, group in enumerate(self.groups):
                if group.holds_token_kv:
                    self.store.write(group_id, tables[group_id], positions, values)
        request.since.extend([self.store.clock] * num_tokens)
        request.computed += num_tokens

    def free(self, request_id: str, preempted: bool = False) -> None:
        self.inner.free(request_id, preempted)
        if self.mamba is not None:
            self.mamba.forget(request_id)
        if preempted:
            request = self.tracked[request_id]
            request.running = False
            request.computed = request.hit_tokens = request.scheduled = 0
            request.since = []
            request.lookup_check = request.step_check = ()
        else:
            del self.tracked[request_id]

    def evict(self, block_ids: Sequence[int]) -> None:
        self.inner.evict(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.inner.reset_prefix_cache()

    def common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        return self.inner.common_prefix_blocks(request_id)

    def skipped_tokens(self, num_computed_tokens: int) -> tuple[int, ...]:
        """Passed through; asked only where the inner adapter claims ``skipped_tokens``."""
        return self.inner.skipped_tokens(num_computed_tokens)  # type: ignore[attr-defined, no-any-return]

    def new_step(self) -> None:
        """Passed through; called only where the inner adapter claims ``mamba_align``."""
        self.inner.new_step()  # type: ignore[attr-defined]

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """Passed through; called only where :meth:`capabilities` claims ``mamba_partial_hits``. The
        copies were made when the steps of the allocations that queued them ran (:meth:`advance`);
        any not made yet are made now, with the step the scheduler hands them to."""
        copies = tuple(tuple(pair) for pair in self.inner.take_copies())  # type: ignore[attr-defined]
        self._make_copies(copies[self.copies_made:])  # type: ignore[arg-type]
        self.copies_made = 0
        return copies  # type: ignore[return-value]

    # -- the runner's copies (KV-MAMBA-026) --------------------------------------------------
    def _copy_pages(self) -> None:
        """Make the copies queued since the last ones made. vLLM's runner makes a step's copies after
        the scheduler has allocated for every request of the step and before the forward; here each
        request's step runs right after its own allocation, so the copies its allocation queued are
        made right before its own forward. No other request's step writes those pages in between: a
        consumer's source is a cached page no request writes (KV-MAMBA-023), a producer's source its
        own page, which only its own step writes (KV-MAMBA-024)."""
        queued = tuple(self.inner.pending_copies())  # type: ignore[attr-defined]
        self._make_copies(queued[self.copies_made:])
        self.copies_made = len(queued)

    def _make_copies(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy each (source, copy) page in every group's tensor, all at once (spec
        ``states_after_copies``; vLLM's ``copy_kv_cache_blocks_inplace``). A seam for the meta-tests'
        broken runners."""
        if not copies:
            return
        assert self.store is not None
        sources = torch.tensor([source for source, _ in copies], dtype=torch.int64, device=self.device)
        targets = torch.tensor([copy for _, copy in copies], dtype=torch.int64, device=self.device)
        self.store.copy_blocks(sources, targets)

    def observe(self) -> Observation:
        observation = self.inner.observe()
        return attrs.evolve(observation, data_checks=self._data_checks(observation))

    # -- the store -----------------------------------------------------------------------
    def _write_tables(self, request_id: str) -> list[torch.Tensor]:
        """The tables a step's writes go through: the model runner's slot mapping, one per
        group (a seam for the meta-tests' broken runners)."""
        return self._tables(request_id)

    def _tables(self, request_id: str, observation: Observation | None = None
                ) -> list[torch.Tensor]:
        """The request's block table of every group, as tensors (empty where it holds none)."""
        tables = None
        if observation is None:
            reader = getattr(self.inner, "paged_block_tables", None)
            if reader is not None:
                tables = reader(request_id)
            else:
                observation = self.inner.observe()
        if observation is not None:
            tables = observation.block_tables.get(request_id)
        return [self._as_tensor(tables[g] if tables is not None and g < len(tables) else ())
                for g in range(len(self.groups))]

    def _as_tensor(self, table: object) -> torch.Tensor:
        if isinstance(table, torch.Tensor):
            return table.to(device=self.device, dtype=torch.int64)
        return torch.tensor(list(table), dtype=torch.int64, device=self.device)  # type: ignore[call-overload]

    def _null_in_reach(self, group_id: int, table: torch.Tensor, first: int, stop: int
                       ) -> tuple[str, bool, str] | None:
        """KV-DATA-006: positions ``first .. stop - 1`` lie in real blocks of ``table``.
        ``None`` when there are no such positions."""
        if stop <= first:
            return None
        size = self.groups[group_id].block_size
        indices = torch.arange(first // size, (stop - 1) // size + 1, device=self.device)
        inside = indices < table.numel()
        entries = table.index_select(0, indices.clamp(max=max(table.numel() - 1, 0))) \
            if table.numel() else torch.zeros_like(indices)
        bad = (~inside | (entries == 0)).nonzero()
        if not bad.numel():
            return (data_spec.KV_DATA_006, True, "")
        index = first // size + int(bad[0])
        place = "past the end of" if index >= table.numel() else "in the null block of"
        return (data_spec.KV_DATA_006, False, (
            f"group {group_id} ({self.groups[group_id].kind}) relies on positions {first}..{stop - 1}, "
            f"but position {max(first, index * size)} is {place} its table {table.tolist()}"))

    def _check_hit(self, request_id: str, hit: Lookup) -> tuple[tuple[str, bool, str], ...]:
        """KV-DATA-001/002/006: the hit blocks, read in table order, hold the request's prefix
        in every position each group relies on."""
        if hit.num_tokens <= 0 or not hit.block_ids:
            return ()
        assert self.store is not None
        request = self.tracked[request_id]
        count = min(hit.num_tokens, len(request.values))
        checks: list[tuple[str, bool, str]] = []
        for group_id, group in enumerate(self.groups):
            if not group.holds_token_kv or group_id >= len(hit.block_ids):
                continue
            table = self._as_tensor(hit.block_ids[group_id])
            first = group.first_relied(count)
            reach = self._null_in_reach(group_id, table, first, count)
            if reach is None:
                continue
            if not reach[1]:
                checks.append(reach)
                continue
            positions = torch.arange(first, count, device=self.device)
            wrong = first_mismatch(self.store, group_id, table, positions, request.values[first:count])
            if wrong is None:  # one read judges both rules
                checks += [reach, (data_spec.KV_DATA_001, True, ""), (data_spec.KV_DATA_002, True, "")]
                continue
            position, found = first + wrong.offset, wrong.found
            rule_id = data_spec.slot_violation(request.values[position], found, 0, 0, True)
            assert rule_id is not None
            what = "was never written" if found == data_spec.UNWRITTEN else \
                "holds another prefix's data"
            block = hit.block_ids[group_id][position // group.block_size]
            checks.append((rule_id, False, (
                f"hit of {hit.num_tokens} tokens for {request_id} (group {group_id} blocks "
                f"{hit.block_ids[group_id]}): position {position} (block {block}) {what}")))
        return tuple(checks)

    def _data_checks(self, observation: Observation) -> tuple[tuple[str, bool, str], ...]:
        if self.store is None:
            return ()
        checks: list[tuple[str, bool, str]] = []
        for group_id, group in enumerate(self.groups):
            if group.holds_token_kv:
                null_slots = tuple(self.store.values[group_id][0].tolist())
                checks.append((data_spec.KV_DATA_005, data_spec.null_block_unwritten(null_slots),
                               f"the null block holds written slots in group {group_id}: "
                               f"{null_slots}"))
        for request_id, request in self.tracked.items():
            checks.extend(request.lookup_check)
            checks.extend(request.step_check)
            if request.running and request.computed:
                checks.extend(self._check_relied(request_id, request, observation))
        if observation.cached:
            checks.append(self._check_cached(observation.cached))
            if self.mamba is not None:
                checks.extend(self.mamba.check_cached(dict(observation.cached), self.key_states))
        return tuple(checks)

    def _check_relied(self, request_id: str, request: _Tracked, observation: Observation
                      ) -> list[tuple[str, bool, str]]:
        """KV-DATA-003 (or -001/-002) and KV-DATA-006, per group: the data a running request
        relies on is still there, in real blocks."""
        assert self.store is not None
        checks: list[tuple[str, bool, str]] = []
        tables = self._tables(request_id, observation)
        for group_id, group in enumerate(self.groups):
            if not group.holds_token_kv:
                continue
            table = tables[group_id]
            first = group.first_relied(request.computed)
            reach = self._null_in_reach(group_id, table, first, request.computed)
            if reach is None:
                continue
            checks.append(reach)
            if not reach[1]:
                continue
            positions = torch.arange(first, request.computed, device=self.device)
            wrong = first_mismatch(self.store, group_id, table, positions,
                                   request.values[first:request.computed])
            if wrong is None:
                checks.append((data_spec.KV_DATA_003, True, ""))
                continue
            position, written_at = first + wrong.offset, wrong.written_at
            rule_id = data_spec.slot_violation(
                request.values[position], wrong.found, written_at,
                request.since[position], position < request.hit_tokens)
            assert rule_id is not None
            size = group.block_size
            where = f"block {int(table[position // size])} slot {position % size}" \
                if written_at != NO_SLOT_EPOCH else "no slot (the table is too short)"
            origin = "from its hit" if position < request.hit_tokens else "computed by itself"
            checks.append((rule_id, False, (
                f"{request_id} relies on position {position} in group {group_id} ({origin}, since "
                f"write epoch {request.since[position]}), but {where} holds other data (last "
                f"changed at epoch {written_at if written_at != NO_SLOT_EPOCH else '-'})")))
        return checks

    def _check_cached(self, cached: dict) -> tuple[str, bool, str]:
        """KV-DATA-004: every cached block holds the prefix its key names."""
        assert self.store is not None
        by_group: dict[int, tuple[list[KeyRef], list[int], list[tuple[int, ...]]]] = {}
        for key, block_ids in cached.items():
            values = self.key_values.get(key)
            if values is None or key[0].startswith(UNKNOWN_HASH):
                continue  # a key kvoracle cannot place: the cache-map rules judge it
            keys, blocks, expected = by_group.setdefault(key[1], ([], [], []))
            for block_id in block_ids:
                keys.append(key)
                blocks.append(block_id)
                expected.append(values)
        for group_id, (keys, blocks, expected) in sorted(by_group.items()):
            index = first_changed_block(self.store, group_id, blocks, expected)
            if index is None:
                continue
            row = tuple(self.store.blocks(group_id, torch.tensor([blocks[index]], device=self.device))[0].tolist())
            unwritten = sum(v == data_spec.UNWRITTEN for v in row)
            return (data_spec.KV_DATA_004, False, (
                f"block {blocks[index]} is cached under key {keys[index][0].hex()[:12]} in group "
                f"{group_id} but holds other data ({unwritten} of {len(row)} slots unwritten)"))
        return (data_spec.KV_DATA_004, True, "")


class PagedReferenceEngine(PagedStoreWrapper):
    """kvoracle's reference manager in a paged KV store, one tensor per group."""

    def __init__(self) -> None:
        from .reference import ReferenceEngine

        super().__init__(ReferenceEngine())


class PagedVllmEngine(PagedStoreWrapper):
    """vLLM's ``KVCacheManager`` (``--engine vllm``) in a paged KV store, one tensor per group."""

    def __init__(self) -> None:
        from .vllm import VllmEngine

        super().__init__(VllmEngine())
