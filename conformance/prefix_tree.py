"""The prefix-tree suite: a radix prefix cache and its slot allocator against chapter 14.

The suite drives an engine's prefix cache behind :class:`PrefixTreeAdapter`
(:mod:`.prefix_tree_protocol`) the way a scheduler does -- requests look their prompt up and
lock the hit, get slots for the rest, insert what they computed and free their duplicates,
checkpoint, abort; the scheduler evicts when slots run short -- and judges every answer and
the state after every step against kvoracle's model (:mod:`.prefix_tree_driver`).

Built-in engines: ``reference`` (kvoracle's :class:`~kvoracle.reference.prefix_tree.PrefixTree`
and :class:`~kvoracle.reference.prefix_tree.PageAllocator`, page recency), ``sglang``
(SGLang 0.5.23's ``RadixCache`` with its token allocators, segment recency;
``scripts/install_sglang.sh``), and ``sglang-unified`` / ``sglang-unified-rust`` (its
``UnifiedRadixCache``, FULL component only, over the Python or the Rust tree core),
``sglang-unified-swa`` / ``sglang-unified-swa-rust`` (its FULL and SWA components: a window
component, KV-TREE-016 .. 021; :mod:`.engines.sglang_swa`), ``sglang-unified-mamba`` /
``sglang-unified-mamba-rust`` (its FULL and MAMBA components: a state component, KV-TREE-022 ..
027; :mod:`.engines.sglang_mamba`); and each of them in a paged KV store that SGLang's model runner
writes through the engine's slot indices (window KV through its window slots, states through its
state slots), judged by the data rules KV-DATA-001 .. 004 and 007 as well (``paged-reference``,
``paged-sglang``, ``paged-sglang-unified``, ``paged-sglang-unified-rust``,
``paged-sglang-unified-swa``, ``paged-sglang-unified-swa-rust``, ``paged-sglang-unified-mamba``,
``paged-sglang-unified-mamba-rust``; :mod:`.engines.prefix_tree_store`).

Run it with ``kvoracle check --suite prefix-tree [--engine reference|sglang|sglang-unified|module:Class]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoracle import __version__
from kvoracle.reference.prefix_tree import PageAllocator, PageKey, PrefixTree

from .harness.suites import SuiteDef, register_suite
from .prefix_tree_driver import PrefixTreeMachine, TreeDriver, machine_options
from .prefix_tree_protocol import (
    OPERATIONS,
    RETURNS,
    STEP_NAMES,
    Abort,
    Arrive,
    Checkpoint,
    Compute,
    Evict,
    EvictStates,
    EvictWindow,
    Finish,
    PageView,
    Peek,
    PrefixTreeAdapter,
    Serve,
    TreeSetup,
    TreeView,
)

__all__ = ["Abort", "Arrive", "Checkpoint", "Compute", "Evict", "EvictStates", "EvictWindow", "Finish", "PageView",
           "Peek", "PrefixTreeAdapter", "ReferencePrefixTree", "Serve", "TreeSetup", "TreeView"]


class ReferencePrefixTree:
    """kvoracle's reference prefix tree and page allocator behind :class:`PrefixTreeAdapter`."""

    name = "reference"

    def __init__(self) -> None:
        self.tree: PrefixTree | None = None
        self.allocator: PageAllocator | None = None
        #: handle -> the path its last match or insert ended at; handle -> the path it locked.
        self.found: dict[int, list[PageKey]] = {}
        self.locked: dict[int, list[PageKey]] = {}

    def version(self) -> str:
        return __version__

    #: It takes a window component (``TreeSetup.window``; KV-TREE-016 .. 021).
    window_component = True
    #: ... and runs without one too (setups draw ``window = 0`` half of the time).
    window_optional = True
    #: It takes a state component (``TreeSetup.states``; KV-TREE-022 .. 027) where it has no window.
    state_component = True
    #: A paged store's runner, which writes the request's state into the state slot an insertion
    #: gives the cache before the cache takes it (KV-DATA-007); ``None`` outside a store.
    state_writer = None

    def configure(self, setup: TreeSetup) -> None:
        self.allocator = PageAllocator(setup.num_pages, setup.page_size)
        self.tree = PrefixTree(setup.page_size, window=setup.window, states=setup.states > 0)
        self.found, self.locked = {}, {}
        self.own: dict[int, int] = {}
        #: handle -> the pages whose window KV its lock keeps from eviction, fixed when it locked.
        self.pinned: dict[int, list[PageKey]] = {}
        #: Window slots in use outside the cache: one per slot allocated and not yet freed.
        self.window_capacity = setup.num_pages * setup.page_size
        self.window_used = 0
        #: State slots, numbered 0 .. states - 1: the free ones in the order they are handed out (an
        #: insertion takes the first and gives it back when the cache keeps its own), and the one of
        #: each page holding a state.
        self.state_capacity = setup.states
        self.free_state_slots: list[int] = list(range(setup.states))
        self.state_slot_of: dict[PageKey, int] = {}

    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        assert self.tree is not None
        hit, slots = self.tree.match(namespace, tokens)
        self.found[handle] = self.tree.page_keys(namespace, tokens)[:hit // self.tree.page_size]
        self.own[handle] = hit
        return hit, slots

    def lock(self, handle: int) -> None:
        assert self.tree is not None
        if handle in self.locked:
            raise ValueError(f"KV-TREE-014: handle {handle} already holds a lock")
        path = self.found[handle]
        self.tree.lock(path)
        self.locked[handle] = path
        self.pinned[handle] = self.tree.window_pinned(path)

    def unlock(self, handle: int) -> None:
        assert self.tree is not None
        self.tree.unlock(self.locked.pop(handle))
        self.pinned.pop(handle, None)

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        assert self.tree is not None
        given = None
        if self.tree.states:
            if not self.free_state_slots:
                raise ValueError("KV-TREE-027: no free state slot for the insertion's state")
            given = self.free_state_slots.pop(0)
            if self.state_writer is not None:
                self.state_writer(given)
        held = self.tree.insert(namespace, tokens, slots, own=self.own.get(handle, 0))
        self.found[handle] = self.tree.page_keys(namespace, tokens)
        if given is not None:
            if self.tree.state_adopted:
                self.state_slot_of[self.found[handle][-1]] = given
            else:  # the key's last page kept its own state (or the key is shorter than a page)
                self.free_state_slots.append(given)
        self.own[handle] = len(self.found[handle]) * self.tree.page_size
        return held

    def alloc(self, num_tokens: int) -> tuple[int, ...] | None:
        assert self.allocator is not None
        return self.allocator.alloc(num_tokens)

    def free(self, slots: Sequence[int]) -> None:
        assert self.allocator is not None
        self.allocator.free(slots)

    def evict(self, num_tokens: int) -> int:
        assert self.tree is not None and self.allocator is not None
        pages = {key: self.tree.pages[key].slots for key in self.tree.pages}
        removed = self.tree.evict(num_tokens)
        for key in removed:
            self.allocator.free(pages[key])
        self._free_dropped_states()
        return len(removed) * self.tree.page_size

    def _free_dropped_states(self) -> None:
        """Give back the state slot of every page that no longer holds its state (dropped, or removed)."""
        assert self.tree is not None
        for key in [key for key in self.state_slot_of if key not in self.tree.pages or not self.tree.pages[key].state]:
            self.free_state_slots.append(self.state_slot_of.pop(key))

    def state_slot(self, handle: int) -> int | None:
        """The state slot the last match under ``handle`` hands its request: the one at its hit's last page."""
        path = self.found.get(handle)
        return self.state_slot_of.get(path[-1]) if path else None

    def evict_states(self, num_states: int) -> int:
        """Drop states (KV-TREE-024): the reference's oldest-first order, sparing the locked paths' ends."""
        assert self.tree is not None and self.allocator is not None
        pages = {key: self.tree.pages[key].slots for key in self.tree.pages}
        protected = {key for path in self.locked.values() for key in self.tree.state_locked(path)}
        dropped, removed = self.tree.evict_states(num_states, protected)
        for key in removed:
            self.allocator.free(pages[key])
        self._free_dropped_states()
        return len(dropped)

    def evict_window(self, num_tokens: int) -> int:
        """Drop window KV (KV-TREE-018): the reference's oldest-first order, sparing locked windows."""
        assert self.tree is not None and self.allocator is not None
        pages = {key: self.tree.pages[key].slots for key in self.tree.pages}
        dropped, removed = self.tree.evict_window(num_tokens, self.window_protected())
        for key in removed:
            self.allocator.free(pages[key])
        return len(dropped) * self.tree.page_size

    def window_slots(self, slots: Sequence[int]) -> tuple[int, ...]:
        """Where a paged store keeps the window KV of each slot: at the slot itself (the reference
        counts window slots, KV-TREE-021, but gives them no indices of their own)."""
        return tuple(slots)

    def window_protected(self) -> set[PageKey]:
        """The pages whose window KV the held locks pin (their windows, KV-TREE-019)."""
        return {key for pages in self.pinned.values() for key in pages}

    def observe(self) -> TreeView:
        assert self.tree is not None and self.allocator is not None
        pages = tuple(PageView(ns, tokens, page.slots, page.locks, page.windowed, page.state,
                               self.state_slot_of.get((ns, tokens)))
                      for (ns, tokens), page in self.tree.pages.items())
        evictable, protected = self.tree.sizes()
        if self.tree.states:
            ends = {key for path in self.locked.values() for key in self.tree.state_locked(path)}
            locked_states = sum(1 for key in ends if self.tree.pages[key].state)
            return TreeView(pages, evictable, protected, self.allocator.available(),
                            state_free=len(self.free_state_slots),
                            state_evictable=self.tree.state_count() - locked_states, state_protected=locked_states)
        if not self.tree.window:
            return TreeView(pages, evictable, protected, self.allocator.available())
        size = self.tree.page_size
        guarded = self.window_protected()
        window_protected = sum(size for key, page in self.tree.pages.items() if page.windowed and key in guarded)
        # Every slot outside the cache carries its window slot; the cache's pages without window KV
        # gave theirs back.
        window_free = self.allocator.available() + (self.tree.cached_tokens() - self.tree.windowed_tokens())
        return TreeView(pages, evictable, protected, self.allocator.available(), window_free=window_free,
                        window_evictable=self.tree.windowed_tokens() - window_protected,
                        window_protected=window_protected)


#: The rules of a cache with a window component (chapter 14, KV-TREE-016 .. 021, and the order of its
#: evictions, KV-TREE-028 or 029 by the engine's recency).
WINDOW_RULES = (*(f"KV-TREE-{n:03d}" for n in range(16, 22)), "KV-TREE-028", "KV-TREE-029")

#: The rules of a cache with a state component (chapter 14, KV-TREE-022 .. 027, and the order of its
#: evictions, KV-TREE-030).
MAMBA_RULES = (*(f"KV-TREE-{n:03d}" for n in range(22, 28)), "KV-TREE-030")

#: The engines in a paged KV store (:mod:`.engines.prefix_tree_store`, needs torch), judged by KV-DATA-001 .. 004
#: (and 007, with a state component) too.
_STORE = "kvoracle.conformance.engines.prefix_tree_store"

def _exclusions(probe: object) -> dict[str, str]:
    """The rules of a component the engine lacks: not applicable."""
    excluded: dict[str, str] = {}
    if not getattr(probe, "window_component", False):
        excluded.update(dict.fromkeys(WINDOW_RULES, "the engine has no window component (window_component), the "
                                                    "only caches these rules are about"))
    if not getattr(probe, "state_component", False):
        excluded.update(dict.fromkeys((*MAMBA_RULES, "KV-DATA-007"), "the engine has no state component "
                                      "(state_component), the only caches these rules are about"))
    return excluded


#: The prefix-tree suite, registered with the harness.
PREFIX_TREE = register_suite(SuiteDef(
    name="prefix-tree",
    title="a radix prefix cache's (SGLang's) lookups, locks, insertions, eviction and capacity",
    operations=OPERATIONS,
    returns=RETURNS,
    driver=TreeDriver, machine=PrefixTreeMachine, module=__name__,
    step_names=STEP_NAMES,
    engines={"reference": f"{__name__}:ReferencePrefixTree",
             "sglang": "kvoracle.conformance.engines.sglang:SGLangRadixCache",
             "sglang-unified": "kvoracle.conformance.engines.sglang_unified:SGLangUnifiedRadixCache",
             "sglang-unified-rust": "kvoracle.conformance.engines.sglang_unified:SGLangUnifiedRustCore",
             "paged-reference": f"{_STORE}:PagedReferenceTree",
             "paged-sglang": f"{_STORE}:PagedSGLangRadixCache",
             "paged-sglang-unified": f"{_STORE}:PagedSGLangUnified",
             "paged-sglang-unified-rust": f"{_STORE}:PagedSGLangUnifiedRust",
             "paged-sglang-unified-swa": f"{_STORE}:PagedSGLangUnifiedSWA",
             "paged-sglang-unified-swa-rust": f"{_STORE}:PagedSGLangUnifiedSWARust",
             "paged-sglang-unified-mamba": f"{_STORE}:PagedSGLangUnifiedMamba",
             "paged-sglang-unified-mamba-rust": f"{_STORE}:PagedSGLangUnifiedMambaRust",
             "sglang-unified-mamba": "kvoracle.conformance.engines.sglang_mamba:SGLangUnifiedMamba",
             "sglang-unified-mamba-rust": "kvoracle.conformance.engines.sglang_mamba:SGLangUnifiedMambaRust",
             "sglang-unified-swa": "kvoracle.conformance.engines.sglang_swa:SGLangUnifiedSWA",
             "sglang-unified-swa-rust": "kvoracle.conformance.engines.sglang_swa:SGLangUnifiedSWARust"},
    machine_options=machine_options,
    exclusions=lambda probe: _exclusions(probe)))
