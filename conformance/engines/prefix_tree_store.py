"""A paged KV store around any prefix-tree adapter: the KV-DATA rules for a radix cache.

:class:`PagedTreeStore` wraps an adapter of the prefix-tree suite (kvoracle's reference tree,
SGLang's ``RadixCache`` or ``UnifiedRadixCache``) with a physical KV store
(:class:`kvoracle.gpu.PagedKVStore`) and plays SGLang's model runner over it. SGLang gives
every token its own KV index: a request's row (``req_to_token``) is the slots of its hit,
read off the locked path (``prefix_device_indices``), then the slots the allocator gave it
(``out_cache_loc``); the forward pass writes each computed token's KV into its slot and
attends to the others through the row. So the store has blocks of one slot, and a row is a
block table (spec chapter ``data_integrity``, token-granular indices).

What the wrapper does, operation by operation (everything is forwarded to the inner adapter
first):

- ``match``: reads the hit's slots and compares them with the values of the request's own
  prefix in its namespace (KV-DATA-001, never unwritten: KV-DATA-002);
- ``lock``: the request relies on the locked path's slots from now on;
- ``forward`` (the driver's call when a request computes): writes the value of every token
  past ``start`` into its slot; the request relies on those too;
- ``insert``: the request goes on with the cache's slots for the inserted pages (SGLang's
  scheduler re-reads the path after ``cache_unfinished_req``), read from the inner adapter's
  observation;
- ``free`` and ``unlock``: the request stops relying on the slots it gives up;
- ``observe``: the inner observation with the store's verdicts (``TreeView.data_checks``):
  the hits since the last observation, every slot a request relies on (KV-DATA-003, or -001
  / -002 when it was handed wrong data, spec ``slot_violation``) and every slot of every page
  the cache holds (KV-DATA-004).

A cache with a window component (a hybrid model's sliding-window layers, ``window_component``)
keeps those layers' KV in window slots of their own, one per full slot, and the wrapper keeps a
second group for them. Its inner adapter names the window slot behind each full slot
(``window_slots(slots)``: SGLang's ``translate_loc_from_full_to_swa``, the runner's own
translation; the reference's window KV lives at its full slot). The forward pass writes every
computed token's window KV too, and the data rules read the window KV a window layer attends
to, where the chapter's window rules say the cache keeps it:

- a hit's last window (the pages overlapping its last ``W`` tokens, spec ``window_locked_pages``:
  KV-TREE-016) holds the request's own prefix (KV-DATA-001/002);
- a request relies on the window KV of its last ``W`` tokens and of the locked window of its
  path (KV-TREE-019) for as long as it holds them (KV-DATA-003);
- every page the cache lists with window KV holds the page's prefix there (KV-DATA-004); a page
  without it (a tombstone) is not read.

A cache with a state component (a hybrid model's recurrent layers, ``state_component``:
SGLang's Mamba component) keeps one state per page that holds one, in a state slot of a pool of its
own; the wrapper keeps a group for them, indexed by state slot, and plays the runner's part of the
recurrent layers (KV-DATA-007):

- ``match``: the hit hands its request the state slot at the hit's last page (the inner adapter's
  ``state_slot(handle)``: the slot SGLang's copy-on-write copies from); the wrapper reads it and
  compares it with the state after the request's first ``hit`` tokens, and the request resumes
  from what it read (the state after its namespace's seed where it hit nothing);
- ``insert``: the inner adapter calls the wrapper (its ``state_writer``) with the state slot it gives
  the cache, and the wrapper writes there the request's state after the insertion's key (its first
  ``floor(n / P) * P`` tokens), as SGLang's ``prepare_for_caching_req`` copies it: the state the
  request resumed from with the tokens past its hit folded in (spec ``state_after``), so that a
  state read wrong stays wrong;
- ``observe``: every page the cache lists with a state holds, in its state slot
  (``PageView.state_slot``), the state after the page's tokens.

The value written for a token is spec ``slot_value`` chained from a seed that covers the
namespace (:func:`namespace_salt`), so that equal tokens in two namespaces never hold equal
values. The checks share their reading code with the vLLM-shaped wrapper
(:func:`~.engines.paged_store.first_mismatch`, :func:`~.engines.paged_store.first_changed_block`).

Built-in engines of the prefix-tree suite: ``paged-reference`` (:class:`PagedReferenceTree`),
``paged-sglang``, ``paged-sglang-unified``, ``paged-sglang-unified-rust``,
``paged-sglang-unified-swa``, ``paged-sglang-unified-swa-rust``, ``paged-sglang-unified-mamba`` and
``paged-sglang-unified-mamba-rust`` (SGLang's caches,
``scripts/install_sglang.sh``). Importing this module needs torch (``kvoracle.gpu``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import attrs

from kvoracle.gpu import PagedKVStore, default_device, torch
from kvoracle.gpu.paged_store import NO_SLOT_EPOCH
from kvoracle.spec import data_integrity as data_spec
from kvoracle.spec import prefix_tree as tree_spec

from ..harness.capabilities import Capabilities
from ..harness.suites import capabilities_of
from ..prefix_tree_protocol import PrefixTreeAdapter, TreeSetup, TreeView
from .paged_store import first_changed_block, first_mismatch

#: The store's group of full-attention KV: a block is one slot, a request's row is its block table.
GROUP = 0
#: The group of window KV (a cache with a window component), indexed by window slot.
WINDOW_GROUP = 1
#: A position the request does not rely on (any more) in its row.
NOT_RELIED = -1

Check = tuple[str, bool, str]


def namespace_salt(namespace: int) -> str | None:
    """The salt chained into a namespace's slot values (spec ``prefix_seed``): none for 0."""
    return None if namespace == 0 else f"prefix-tree namespace {namespace}"


@attrs.define
class _Held:
    """What a request holds, position by position: the slot its row names (``NOT_RELIED`` where it
    relies on nothing), since which store epoch it relies on it, and whether the cache gave it
    (a hit, or the cache's copy after an insertion) rather than the request computing it."""

    namespace: int
    tokens: tuple[int, ...] = ()
    row: list[int] = attrs.Factory(list)
    since: list[int] = attrs.Factory(list)
    given: list[bool] = attrs.Factory(list)
    #: The first positions, those the request reads from the cache's pages (its lock's path).
    from_cache: int = 0

    def rely(self, position: int, slot: int, epoch: int, given: bool) -> None:
        """Rely on ``slot`` at ``position`` from ``epoch`` on (an unchanged slot keeps its epoch)."""
        while len(self.row) <= position:
            self.row.append(NOT_RELIED)
            self.since.append(0)
            self.given.append(False)
        if self.row[position] != slot:
            self.row[position], self.since[position], self.given[position] = slot, epoch, given

    def drop(self, positions: Sequence[int]) -> None:
        for position in positions:
            if position < len(self.row):
                self.row[position] = NOT_RELIED

    def relied(self) -> list[int]:
        return [p for p, slot in enumerate(self.row) if slot != NOT_RELIED]


class PagedTreeStore:
    """Any prefix-tree adapter, plus a paged KV store that a model runner writes through the
    engine's slot indices, judged by KV-DATA-001 .. 004."""

    def __init__(self, inner: PrefixTreeAdapter, device: torch.device | str | None = None) -> None:
        self.inner = inner
        #: A subclass may name itself; a plain wrapper is named after what it wraps.
        self.name: str = getattr(type(self), "name", f"{inner.name}+paged-store")
        self.device = torch.device(device) if device is not None else default_device()
        self.setup: TreeSetup | None = None
        self.store: PagedKVStore | None = None
        #: A window component is the inner cache's, and so is whether it runs without one.
        self.window_component = bool(getattr(inner, "window_component", False))
        self.window_optional = bool(getattr(inner, "window_optional", False))
        if self.window_component and not callable(getattr(inner, "window_slots", None)):
            raise TypeError(f"{self.name}: an adapter with a window component needs window_slots(slots) (the "
                            "window slot behind each full slot) to run in a paged KV store")
        #: The window of the configuration (0: none).
        self.window = 0
        #: A state component is the inner cache's; the wrapper is the runner that writes its states.
        self.state_component = bool(getattr(inner, "state_component", False))
        if self.state_component:
            if not callable(getattr(inner, "state_slot", None)) or not hasattr(inner, "state_writer"):
                raise TypeError(f"{self.name}: an adapter with a state component needs state_slot(handle) and a "
                                "state_writer attribute (and PageView.state_slot) to run in a paged KV store")
            inner.state_writer = self._write_given_state
        #: The state slots of the configuration (0: no state component); the store's group for them.
        self.states = 0
        self.state_group = -1
        self._reset()

    def _reset(self) -> None:
        #: handle -> (namespace, tokens, slots) of the path its last match or insert ended at.
        self.found: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
        self.held: dict[int, _Held] = {}
        #: Verdicts on the hits since the last observation.
        self.pending: list[Check] = []
        #: (namespace, tokens) -> the slot value of every position (spec ``extend_prefix_values``).
        self.values: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
        #: handle -> (namespace, tokens looked up, the hit, the state read from the hit's state slot):
        #: what the request's recurrent layers resume from.
        self.resumed: dict[int, tuple[int, tuple[int, ...], int, int]] = {}
        #: The state the runner writes into the state slot the insertion under way gives the cache.
        self.state_to_give: int = data_spec.UNWRITTEN
        #: A state value -> the prefix it is the state after (for the messages).
        self.state_names: dict[int, tuple[int, tuple[int, ...]]] = {}

    # -- forwarded ---------------------------------------------------------------------------------
    def version(self) -> str:
        return self.inner.version()

    def capabilities(self) -> Capabilities:
        return attrs.evolve(capabilities_of(self.inner), kv_data=True)

    def configure(self, setup: TreeSetup) -> None:
        self.inner.configure(setup)
        self.setup = setup
        # Slot indices of every allocator here lie below capacity + one page (SGLang's start at 1,
        # or at page 1: slot 0 is its padding slot); an index past the store has no slot.
        self.window = setup.window if self.window_component else 0
        self.states = setup.states if self.state_component else 0
        groups = (1, 1) if self.window else (1,)
        if self.states:
            self.state_group, groups = len(groups), (*groups, 1)
        # State slots lie below states + 1 (SGLang's Mamba allocator hands out 1 .. states: slot 0 is its
        # padding slot too).
        self.store = PagedKVStore(max(setup.num_pages * setup.page_size + setup.page_size, self.states + 1), groups,
                                  self.device)
        self._reset()

    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, Sequence[int]]:
        hit, slots = self.inner.match(handle, namespace, tokens)
        slots = tuple(int(s) for s in slots)
        self.found[handle] = (namespace, tuple(tokens[:hit]), slots)
        self.pending.extend(self._check_hit(handle, namespace, tuple(tokens), hit, slots))
        if self.states:
            self.pending.extend(self._resume(handle, namespace, tuple(tokens), hit))
        return hit, slots

    def lock(self, handle: int) -> None:
        self.inner.lock(handle)
        assert self.store is not None
        namespace, tokens, slots = self.found[handle]
        held = self.held.setdefault(handle, _Held(namespace))
        if len(tokens) > len(held.tokens):
            held.tokens = tokens
        for position, slot in enumerate(slots[:len(tokens)]):
            held.rely(position, slot, self.store.clock, given=True)
        held.from_cache = min(len(tokens), len(slots))

    def unlock(self, handle: int) -> None:
        self.inner.unlock(handle)
        held = self.held.get(handle)
        if held is None:
            return
        held.drop(range(held.from_cache))
        held.from_cache = 0
        if not held.relied():
            del self.held[handle]

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        assert self.setup is not None and self.store is not None
        size = self.setup.page_size
        if self.states:
            self.state_to_give = self.request_state(handle, namespace, tuple(tokens)[:len(tokens) // size * size])
        prefix = self.inner.insert(handle, namespace, tokens, slots)
        pages = {(page.namespace, tuple(page.tokens)): tuple(page.slots) for page in self.inner.observe().pages}
        path: list[int] = []
        for end in range(size, len(tokens) // size * size + 1, size):
            page = pages.get((namespace, tuple(tokens[:end])))
            if page is None or len(page) != size:
                break  # the cache lost the path here: its own rules say so
            path.extend(page)
        self.found[handle] = (namespace, tuple(tokens[:len(path)]), tuple(path))
        held = self.held.get(handle)
        if held is not None:  # from now on the request reads the cache's copy of its pages
            for position, slot in enumerate(path):
                held.rely(position, slot, self.store.clock, given=True)
            held.from_cache = max(held.from_cache, len(path))
        return prefix

    def alloc(self, num_tokens: int) -> Sequence[int] | None:
        return self.inner.alloc(num_tokens)

    def free(self, slots: Sequence[int]) -> None:
        self.inner.free(slots)
        gone = {int(s) for s in slots}
        for held in self.held.values():
            held.drop([p for p, slot in enumerate(held.row) if slot in gone])

    def evict(self, num_tokens: int) -> int:
        return self.inner.evict(num_tokens)

    def evict_window(self, num_tokens: int) -> int:
        return self.inner.evict_window(num_tokens)  # type: ignore[attr-defined]

    def evict_states(self, num_states: int) -> int:
        return self.inner.evict_states(num_states)  # type: ignore[attr-defined]

    # -- the recurrent layers' states (KV-DATA-007) -------------------------------------------------
    def _resume(self, handle: int, namespace: int, tokens: tuple[int, ...], hit: int) -> list[Check]:
        """The request under ``handle`` resumes from the state slot its hit hands it: read it, and judge
        it against the state after the hit's tokens (KV-DATA-007)."""
        assert self.store is not None
        if hit <= 0:
            self.resumed[handle] = (namespace, tokens, 0, data_spec.prefix_seed(namespace_salt(namespace)))
            return []
        slot = self.inner.state_slot(handle)  # type: ignore[attr-defined]
        found = self._read_states([slot])[0]
        self.resumed[handle] = (namespace, tokens, hit, found)
        want = self._state_of(namespace, tokens[:hit])
        if data_spec.first_wrong_state((want,), (found,)) == -1:
            return [(data_spec.KV_DATA_007, True, "")]
        return [(data_spec.KV_DATA_007, False, (
            f"a lookup under handle {handle} (namespace {namespace}) hit {hit} tokens and hands its request "
            + ("no state slot" if slot is None else f"state slot {slot}") + " to resume from, which "
            + self._describe_state(found) + f", not the state after its first {hit} tokens "
            f"{list(tokens[:hit][:16])}{' ...' if hit > 16 else ''}"))]

    def request_state(self, handle: int, namespace: int, tokens: tuple[int, ...]) -> int:
        """The request's recurrent state after ``tokens``: the state it resumed from, with the tokens
        past its hit folded in (spec ``state_after``; a seam for the meta-tests' broken runners)."""
        resumed = self.resumed.get(handle)
        if resumed is None or resumed[0] != namespace or resumed[1][:resumed[2]] != tokens[:resumed[2]]:
            resumed = (namespace, tokens, 0, data_spec.prefix_seed(namespace_salt(namespace)))
        _, _, hit, state = resumed
        return data_spec.state_after(state, tokens, min(hit, len(tokens)))

    def _write_given_state(self, slot: int) -> None:
        """The inner adapter gives the cache ``slot`` for the insertion under way: the runner writes
        the request's state into it first."""
        assert self.store is not None
        row = torch.tensor([int(slot)], dtype=torch.int64, device=self.device)
        self.store.write(self.state_group, row, torch.zeros(1, dtype=torch.int64, device=self.device),
                         torch.tensor([self.state_to_give], dtype=torch.int64, device=self.device))

    def _read_states(self, slots: Sequence[int | None]) -> list[int]:
        """What each state slot holds (``None``, or a slot past the store: unwritten)."""
        assert self.store is not None
        known = [s if s is not None else -1 for s in slots]
        if not known:
            return []
        row = torch.tensor(known, dtype=torch.int64, device=self.device)
        values, _ = self.store.read(self.state_group, row, torch.arange(len(known), device=self.device))
        return [int(v) for v in values.tolist()]

    def _state_of(self, namespace: int, tokens: tuple[int, ...]) -> int:
        """The state after ``tokens`` in ``namespace``: spec ``state_after`` from the namespace's seed,
        which is the last token's slot value (read from the kept chain)."""
        state = self._values(namespace, tokens)[-1] if tokens else data_spec.prefix_seed(namespace_salt(namespace))
        self.state_names.setdefault(state, (namespace, tokens))
        return state

    def _describe_state(self, found: int) -> str:
        if found == data_spec.UNWRITTEN:
            return "was never written"
        named = self.state_names.get(found)
        if named is None:
            return "holds a state after no prefix kvoracle knows"
        namespace, tokens = named
        return f"holds the state after {list(tokens[:16])}{' ...' if len(tokens) > 16 else ''} (namespace {namespace})"

    def _check_states(self, view: TreeView) -> Check:
        """KV-DATA-007: every page the cache lists with a state holds, in its state slot, the state
        after the page's tokens."""
        pages = [page for page in view.pages if page.state]
        want = tuple(self._state_of(page.namespace, tuple(page.tokens)) for page in pages)
        found = tuple(self._read_states([page.state_slot for page in pages]))
        wrong = data_spec.first_wrong_state(want, found)
        if wrong == -1:
            return (data_spec.KV_DATA_007, True, "")
        page = pages[wrong]
        slot = "no state slot" if page.state_slot is None else f"state slot {page.state_slot}"
        return (data_spec.KV_DATA_007, False, (
            f"the cache holds page {list(page.tokens)} (namespace {page.namespace}) with a state in {slot}, which "
            f"{self._describe_state(found[wrong])}, not the state after the page's tokens"))

    def window_slots(self, slots: Sequence[int]) -> tuple[int, ...]:
        """The window slot behind each of ``slots``, as the inner cache maps them now
        (``NOT_RELIED`` stays)."""
        known = [int(s) for s in slots if s != NOT_RELIED]
        mapped = iter(int(s) for s in self.inner.window_slots(known)) if known else iter(())  # type: ignore
        return tuple(NOT_RELIED if s == NOT_RELIED else next(mapped) for s in slots)

    def forward(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int],
                start: int) -> None:
        """The forward pass: writes the KV of ``tokens[start:]`` into ``slots[start:len(tokens)]``;
        the request relies on its whole row from now on."""
        assert self.store is not None
        if not 0 <= start <= len(tokens):
            raise ValueError(f"forward: start must lie in 0..{len(tokens)} (the request's tokens), got {start}")
        tokens, slots = tuple(tokens), tuple(int(s) for s in slots)
        held = self.held.setdefault(handle, _Held(namespace))
        held.namespace, held.tokens = namespace, tokens
        values = self._values(namespace, tokens)
        stop = min(len(tokens), len(slots))
        epoch = self.store.clock
        if stop > start:
            positions = torch.arange(start, stop, device=self.device)
            written = torch.tensor(values[start:stop], dtype=torch.int64, device=self.device)
            epoch = self.store.write(GROUP, self.write_row(slots), positions, written)
            if self.window:
                self.write_window(slots[:stop], positions, written)
        for position in range(stop):
            held.rely(position, slots[position], epoch if position >= start else self.store.clock,
                      given=position < start)

    def write_row(self, slots: tuple[int, ...]) -> torch.Tensor:
        """The row the forward pass writes through: the request's slots (a seam for the meta-tests'
        broken runners)."""
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def write_window(self, slots: tuple[int, ...], positions: torch.Tensor, values: torch.Tensor) -> None:
        """The window layers' half of the forward pass: the KV of ``positions`` into the window
        slots behind the row's ``slots`` (a seam for the meta-tests' broken runners)."""
        assert self.store is not None
        self.store.write(WINDOW_GROUP, self.write_row(self.window_slots(slots)), positions, values)

    def observe(self) -> TreeView:
        view = self.inner.observe()
        checks, self.pending = self.pending, []
        for handle, held in self.held.items():
            checks.extend(self._check_held(handle, held))
        checks.append(self._check_pages(view))
        if self.window:
            checks.append(self._check_pages(view, WINDOW_GROUP))
        if self.states:
            checks.append(self._check_states(view))
        return attrs.evolve(view, data_checks=tuple(checks))

    # -- the values and the checks -----------------------------------------------------------------
    def _values(self, namespace: int, tokens: tuple[int, ...]) -> tuple[int, ...]:
        """The slot value of each of ``tokens`` in ``namespace``, kept per prefix."""
        key = (namespace, tokens)
        known = self.values.get(key)
        if known is None:
            before = self._values(namespace, tokens[:-1]) if tokens else ()
            known = data_spec.extend_prefix_values(before, tokens, namespace_salt(namespace))
            self.values[key] = known
        return known

    def _read(self, slots: Sequence[int], positions: Sequence[int], expected: Sequence[int], group: int = GROUP):
        assert self.store is not None
        row = torch.tensor(list(slots), dtype=torch.int64, device=self.device)
        return first_mismatch(self.store, group, row, torch.tensor(list(positions), dtype=torch.int64,
                                                                     device=self.device), expected)

    def _window_start(self, cached: int) -> int:
        """The first position whose window KV a request relies on when its first ``cached`` tokens
        (page-aligned) are the cache's: the locked window's first page (KV-TREE-019)."""
        assert self.setup is not None
        size = self.setup.page_size
        pages = tree_spec.window_locked_pages(cached, self.window, size)
        return pages[0] * size if pages else cached

    def _check_hit(self, handle: int, namespace: int, tokens: tuple[int, ...], hit: int,
                   slots: tuple[int, ...]) -> list[Check]:
        """KV-DATA-001/002: every slot of the hit holds the request's own prefix."""
        count = min(hit, len(slots), len(tokens))
        if count <= 0:
            return []
        values = self._values(namespace, tokens[:count])
        wrong = self._read(slots, range(count), values)
        kind, row, positions = "", slots, list(range(count))
        if wrong is None and self.window and count == hit:
            # The window layers resume from the hit's last window (KV-TREE-016): its window KV.
            kind, row, positions = "window KV of ", self.window_slots(slots[:count]), list(range(
                self._window_start(hit), hit))
            wrong = self._read(row, positions, [values[p] for p in positions], WINDOW_GROUP)
        if wrong is None:
            return [(data_spec.KV_DATA_001, True, ""), (data_spec.KV_DATA_002, True, "")]
        position = positions[wrong.offset]
        rule_id = data_spec.slot_violation(values[position], wrong.found, 0, 0, True)
        assert rule_id is not None
        what = "was never written" if wrong.found == data_spec.UNWRITTEN else "holds other data"
        return [(rule_id, False, (
            f"a lookup under handle {handle} (namespace {namespace}) hit {hit} tokens in slots "
            f"{list(slots[:16])}{' ...' if len(slots) > 16 else ''}: the {kind}position {position} (slot "
            f"{row[position]}, token {tokens[position]}) {what}, not the request's prefix"))]

    def _check_held(self, handle: int, held: _Held) -> list[Check]:
        """KV-DATA-003 (or -001/-002 for data the cache handed over wrong): every slot the request
        relies on still holds what it computed or adopted."""
        positions = held.relied()
        if not positions:
            return []
        values = self._values(held.namespace, held.tokens)
        positions = [p for p in positions if p < len(values)]
        wrong = self._read(held.row, positions, [values[p] for p in positions])
        kind, row = "", held.row
        if wrong is None and self.window:
            # Its window layers attend to its last W tokens, and its lock keeps its path's window
            # (KV-TREE-019): the window KV of those.
            locked = range(self._window_start(held.from_cache), held.from_cache)
            last = max(held.from_cache, len(held.tokens) - self.window)
            positions = [p for p in positions if p in locked or p >= last]
            kind, row = "the window KV of ", list(self.window_slots(held.row))
            wrong = self._read(row, positions, [values[p] for p in positions], WINDOW_GROUP)
        if wrong is None:
            return [(data_spec.KV_DATA_003, True, "")]
        position = positions[wrong.offset]
        rule_id = data_spec.slot_violation(values[position], wrong.found, wrong.written_at,
                                           held.since[position], held.given[position])
        assert rule_id is not None
        origin = "given by the cache" if held.given[position] else "computed by itself"
        changed = "-" if wrong.written_at == NO_SLOT_EPOCH else wrong.written_at
        return [(rule_id, False, (
            f"the request under handle {handle} relies on {kind}position {position} (token "
            f"{held.tokens[position]}, {origin}, since write epoch {held.since[position]}), but slot "
            f"{row[position]} holds other data (last changed at epoch {changed})"))]

    def _check_pages(self, view: TreeView, group: int = GROUP) -> Check:
        """KV-DATA-004: every slot of every page the cache holds holds the prefix naming the page
        (in the window group: every page the cache lists with window KV, in its window slots)."""
        assert self.store is not None
        slots: list[int] = []
        expected: list[tuple[int, ...]] = []
        names: list[tuple[int, tuple[int, ...]]] = []
        pages = view.pages if group == GROUP else [page for page in view.pages if page.windowed]
        for page in pages:
            tokens = tuple(page.tokens)
            values = self._values(page.namespace, tokens)
            first = len(tokens) - len(page.slots)
            page_slots = page.slots if group == GROUP else self.window_slots(page.slots)
            for offset, slot in enumerate(page_slots):
                if 0 <= first + offset < len(values) and 0 <= slot < self.store.num_blocks:
                    slots.append(int(slot))
                    expected.append((values[first + offset],))
                    names.append((page.namespace, tokens))
        index = first_changed_block(self.store, group, slots, expected)
        if index is None:
            return (data_spec.KV_DATA_004, True, "")
        found = int(self.store.values[group][slots[index], 0])
        namespace, tokens = names[index]
        what = "was never written" if found == data_spec.UNWRITTEN else "holds other data"
        kind = "slot" if group == GROUP else "window KV in window slot"
        return (data_spec.KV_DATA_004, False, (
            f"the cache holds page {list(tokens)} (namespace {namespace}) with {kind} {slots[index]}, which "
            f"{what}"))


def paged_tree_store(class_name: str, name: str, doc: str | None,
                     make_inner: Callable[[], PrefixTreeAdapter], module: str = __name__) -> type[PagedTreeStore]:
    """An engine class: the tree adapter ``make_inner()`` builds, in a paged KV store, named ``name``
    (``module:class_name`` is what ``--engine`` and the engine registry load)."""
    return type(class_name, (PagedTreeStore,), {
        "__doc__": doc, "__module__": module, "__qualname__": class_name, "name": name,
        "__init__": lambda self: PagedTreeStore.__init__(self, make_inner())})


def _adapter(module: str, adapter: str) -> Callable[[], PrefixTreeAdapter]:
    """Builds ``adapter`` of ``module`` (relative to this package), imported only then: SGLang loads
    where its engine is asked for, never when this module is."""
    return lambda: getattr(importlib.import_module(module, __package__), adapter)()


PagedReferenceTree = paged_tree_store(
    "PagedReferenceTree", "paged-reference", "kvoracle's reference prefix tree and page allocator in a paged KV store.",
    _adapter("..prefix_tree", "ReferencePrefixTree"))
PagedSGLangRadixCache = paged_tree_store(
    "PagedSGLangRadixCache", "paged-sglang",
    "SGLang 0.5.23's ``RadixCache`` (``--engine sglang``) in a paged KV store.",
    _adapter(".sglang", "SGLangRadixCache"))
PagedSGLangUnified = paged_tree_store(
    "PagedSGLangUnified", "paged-sglang-unified",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL, Python tree core) in a paged KV store.",
    _adapter(".sglang_unified", "SGLangUnifiedRadixCache"))
PagedSGLangUnifiedRust = paged_tree_store(
    "PagedSGLangUnifiedRust", "paged-sglang-unified-rust",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL, Rust tree core) in a paged KV store.",
    _adapter(".sglang_unified", "SGLangUnifiedRustCore"))
PagedSGLangUnifiedSWA = paged_tree_store(
    "PagedSGLangUnifiedSWA", "paged-sglang-unified-swa",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + SWA, Python tree core) in a paged KV store.",
    _adapter(".sglang_swa", "SGLangUnifiedSWA"))
PagedSGLangUnifiedSWARust = paged_tree_store(
    "PagedSGLangUnifiedSWARust", "paged-sglang-unified-swa-rust",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + SWA, Rust tree core) in a paged KV store.",
    _adapter(".sglang_swa", "SGLangUnifiedSWARust"))
PagedSGLangUnifiedMamba = paged_tree_store(
    "PagedSGLangUnifiedMamba", "paged-sglang-unified-mamba",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA, Python tree core) in a paged KV store: its "
    "state slots written and read too (KV-DATA-007).",
    _adapter(".sglang_mamba", "SGLangUnifiedMamba"))
PagedSGLangUnifiedMambaRust = paged_tree_store(
    "PagedSGLangUnifiedMambaRust", "paged-sglang-unified-mamba-rust",
    "SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA, Rust tree core) in a paged KV store.",
    _adapter(".sglang_mamba", "SGLangUnifiedMambaRust"))
