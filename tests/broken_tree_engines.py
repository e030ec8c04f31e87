"""Deliberately broken prefix trees, each breaking one rule of chapter 14 (meta-tests).

Each is kvoracle's reference adapter with one behaviour changed, outside the reference's
own contracts, so that the suite -- not an icontract condition inside the engine -- has to
find the fault. ``BROKEN`` maps each to the rule it must be convicted of.
"""

from __future__ import annotations

import attrs

from kvoracle.conformance.harness.capabilities import Capabilities
from kvoracle.conformance.prefix_tree import ReferencePrefixTree, TreeView
from kvoracle.reference.prefix_tree import PageKey, PrefixTree
from kvoracle.spec import prefix_tree as spec


class UnalignedHit(ReferencePrefixTree):
    """With pages of several tokens, a hit that stops short of the request's end claims one more
    token (an off-by-one alignment)."""

    name = "unaligned-hit"

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        if self.tree.page_size > 1 and 0 < hit < len(tokens):
            return hit + 1, (*slots, slots[-1])
        return hit, slots


class SlotsReversed(ReferencePrefixTree):
    """Answers the right length, but the hit's slots in reverse order."""

    name = "slots-reversed"

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        return hit, tuple(reversed(slots))


class ShortHit(ReferencePrefixTree):
    """Answers one page less than it holds when it holds two pages or more."""

    name = "short-hit"

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        size = self.tree.page_size
        if hit >= 2 * size:
            hit, slots = hit - size, slots[:-size]
            self.found[handle] = self.found[handle][:-1]
        return hit, slots


class NamespaceLeak(ReferencePrefixTree):
    """A request that hits nothing in its own namespace is served from namespace 0."""

    name = "namespace-leak"

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        if hit == 0 and namespace != 0:
            hit, slots = super().match(handle, 0, tokens)
        return hit, slots


class _ReversedTree(PrefixTree):
    def eviction_order(self) -> list[PageKey]:
        keys = sorted(self.pages, key=lambda key: (len(key[1]), key))
        index = {key: i for i, key in enumerate(keys)}
        parents = tuple(-1 if self.parent(key) is None else index[self.parent(key)] for key in keys)
        order = spec.lru_leaf_order(parents, tuple(-self.pages[k].stamp for k in keys),
                                    tuple(self.pages[k].locks for k in keys))
        return [keys[i] for i in order]


class MostRecentFirst(ReferencePrefixTree):
    """Evicts the most recently used leaf first."""

    name = "most-recent-first"

    def configure(self, setup):
        super().configure(setup)
        self.tree = _ReversedTree(setup.page_size)


class EvictsLocked(ReferencePrefixTree):
    """Evicts as if no page were locked."""

    name = "evicts-locked"

    def evict(self, num_tokens):
        locks = {key: page.locks for key, page in self.tree.pages.items()}
        for page in self.tree.pages.values():
            page.locks = 0
        evicted = super().evict(num_tokens)
        for key, page in self.tree.pages.items():
            page.locks = locks[key]
        return evicted


class EvictsInnerPages(ReferencePrefixTree):
    """Evicts the oldest unlocked pages, the shorter prefix first among pages of one age, whether or
    not a longer prefix is still held (a free queue of pages in the order a request stored them)."""

    name = "evicts-inner-pages"

    def evict(self, num_tokens):
        tree, size = self.tree, self.tree.page_size
        unlocked = sorted((key for key, page in tree.pages.items() if not page.locks),
                          key=lambda key: (tree.pages[key].stamp, len(key[1])))
        removed = unlocked[:-(-num_tokens // size)] if num_tokens > 0 else []
        for key in removed:
            self.allocator.free(tree.pages[key].slots)
        object.__setattr__(tree, "pages", {k: p for k, p in tree.pages.items() if k not in removed})
        return len(removed) * size


class EvictMisreports(ReferencePrefixTree):
    """Reports the tokens asked for, not the tokens evicted."""

    name = "evict-misreports"

    def evict(self, num_tokens):
        super().evict(num_tokens)
        return num_tokens


class InsertReplaces(ReferencePrefixTree):
    """An insertion overwrites the slots of the pages already held with the caller's."""

    name = "insert-replaces"

    def insert(self, handle, namespace, tokens, slots):
        held = super().insert(handle, namespace, tokens, slots)
        size = self.tree.page_size
        for j, key in enumerate(self.tree.page_keys(namespace, tokens)[:held // size]):
            self.tree.pages[key].slots = tuple(slots[j * size:(j + 1) * size])
        return held


class LookupForgets(ReferencePrefixTree):
    """A lookup forgets the oldest unlocked leaf off its own path (making room early)."""

    name = "lookup-forgets"

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        tree = self.tree
        path = set(self.found[handle])
        leaves = [key for key, page in tree.pages.items()
                  if key not in path and not page.locks and not tree.children(key)]
        if leaves:
            oldest = min(leaves, key=lambda key: tree.pages[key].stamp)
            self.allocator.free(tree.pages[oldest].slots)
            tree.remove([oldest])
        return hit, slots


class LockLastPageOnly(ReferencePrefixTree):
    """A lock counts on the last page of its path only."""

    name = "lock-last-page-only"

    def lock(self, handle):
        path = self.found[handle][-1:]
        self.tree.lock(path)
        self.locked[handle] = path


class ProtectedUncounted(ReferencePrefixTree):
    """Reports every held token as evictable, none as protected."""

    name = "protected-uncounted"

    def observe(self):
        view = super().observe()
        return TreeView(view.pages, view.evictable + view.protected, 0, view.free_slots)


class FreeLeaks(ReferencePrefixTree):
    """Freeing slots gives nothing back to the allocator."""

    name = "free-leaks"

    def free(self, slots):
        pass


#: Each broken engine and the rule it must be convicted of.
BROKEN = {
    UnalignedHit: "KV-TREE-001",
    SlotsReversed: "KV-TREE-002",
    ShortHit: "KV-TREE-003",
    NamespaceLeak: "KV-TREE-004",
    EvictsLocked: "KV-TREE-005",
    EvictsInnerPages: "KV-TREE-006",
    EvictMisreports: "KV-TREE-007",
    MostRecentFirst: "KV-TREE-008",
    FreeLeaks: "KV-TREE-010",
    ProtectedUncounted: "KV-TREE-011",
    InsertReplaces: "KV-TREE-012",
    LookupForgets: "KV-TREE-013",
    LockLastPageOnly: "KV-TREE-014",
}


# -- the window component (KV-TREE-016 .. 021) ---------------------------------------------------------
class _WindowTree(ReferencePrefixTree):
    """The reference with its window component only: setups draw windows (and none), never states."""

    state_component = False


class WindowBlindMatch(_WindowTree):
    """A lookup answers the longest held prefix whatever window KV its pages hold (a match that
    never asks the window component)."""

    name = "window-blind-match"

    def match(self, handle, namespace, tokens):
        tree = self.tree
        window, tree.window = tree.window, 0
        try:
            return super().match(handle, namespace, tokens)
        finally:
            tree.window = window


class _MatchGivesUp:
    """A lookup that answers no hit where the held prefix is no valid end (a component's content
    missing there), instead of the longest shorter prefix that is one."""

    def match(self, handle, namespace, tokens):
        hit, slots = super().match(handle, namespace, tokens)
        if hit < self.tree.hit_of(namespace, tokens)[1]:
            self.found[handle], self.own[handle] = [], 0
            return 0, ()
        return hit, slots


class WindowMatchGivesUp(_MatchGivesUp, _WindowTree):
    """When the held prefix ends on pages without their window KV, the lookup answers no hit
    instead of the longest shorter prefix whose window is held."""

    name = "window-match-gives-up"


class WindowEvictsOnePage(_WindowTree):
    """evict_window drops the window KV of one page at most, whatever it was asked for."""

    name = "window-evicts-one-page"

    def evict_window(self, num_tokens):
        return super().evict_window(min(num_tokens, self.tree.page_size))


class WindowEvictionIgnoresLocks(_WindowTree):
    """evict_window drops window KV inside locked windows too (it never asks which are locked)."""

    name = "window-eviction-ignores-locks"

    def evict_window(self, num_tokens):
        # The cache's account (observe) still counts the locked windows as protected.
        pages = {key: self.tree.pages[key].slots for key in self.tree.pages}
        dropped, removed = self.tree.evict_window(num_tokens, set())
        for key in removed:
            self.allocator.free(pages[key])
        return len(dropped) * self.tree.page_size


class InsertKeepsTombstones(_WindowTree):
    """An insertion over pages without their window KV leaves them without it."""

    name = "insert-keeps-tombstones"

    def insert(self, handle, namespace, tokens, slots):
        held = super().insert(handle, namespace, tokens, slots)
        for key in self.tree.refilled:
            self.tree.pages[key].windowed = False
        self.tree.mark_window_boundaries()
        return held


class RefillMovesLockedPages(_WindowTree):
    """An insertion that re-fills a page's window KV gives the page the inserter's slots (and frees
    its old ones) even while a lock runs through it."""

    name = "refill-moves-locked-pages"

    def insert(self, handle, namespace, tokens, slots):
        held = super().insert(handle, namespace, tokens, slots)
        tree, size = self.tree, self.tree.page_size
        keys = tree.page_keys(namespace, tokens)
        for key in tree.refilled:
            if tree.pages[key].locks:
                j = keys.index(key)
                self.allocator.free(tree.pages[key].slots)
                tree.adopt(key, slots[j * size:(j + 1) * size])
        return held


class WindowSlotsLeak(_WindowTree):
    """Dropping a page's window KV never gives its window slots back."""

    name = "window-slots-leak"

    def configure(self, setup):
        super().configure(setup)
        self.leaked = 0

    def evict_window(self, num_tokens):
        before = {key for key, page in self.tree.pages.items() if page.windowed}
        dropped = super().evict_window(num_tokens)
        kept = {key for key, page in self.tree.pages.items() if not page.windowed}
        self.leaked += len(before & kept) * self.tree.page_size
        return dropped

    def observe(self):
        view = super().observe()
        if view.window_free is None:
            return view
        return attrs.evolve(view, window_free=view.window_free - self.leaked)


#: Each broken tree with a window component and the window rule it must be convicted of.
BROKEN_WINDOW = {
    WindowBlindMatch: "KV-TREE-016",
    WindowMatchGivesUp: "KV-TREE-017",
    WindowEvictsOnePage: "KV-TREE-018",
    WindowEvictionIgnoresLocks: "KV-TREE-019",
    InsertKeepsTombstones: "KV-TREE-020",
    RefillMovesLockedPages: "KV-TREE-020",
    WindowSlotsLeak: "KV-TREE-021",
}


# -- the state component (KV-TREE-022 .. 027) ----------------------------------------------------------
class _StateTree(ReferencePrefixTree):
    """The reference with its state component only: every setup draws state slots."""

    window_component = False


class StateBlindMatch(_StateTree):
    """A lookup answers the longest held prefix whether or not its last page holds a state (a match
    that never asks the state component)."""

    name = "state-blind-match"

    def match(self, handle, namespace, tokens):
        tree = self.tree
        states, tree.states = tree.states, False
        try:
            return super().match(handle, namespace, tokens)
        finally:
            tree.states = states


class StateMatchGivesUp(_MatchGivesUp, _StateTree):
    """When the held prefix does not end at a state, the lookup answers no hit instead of the longest
    shorter prefix that does."""

    name = "state-match-gives-up"


class StatesEvictOne(_StateTree):
    """evict_states drops one state at most, whatever it was asked for."""

    name = "states-evict-one"

    def evict_states(self, num_states):
        return super().evict_states(min(num_states, 1))


class StateEvictionIgnoresLocks(_StateTree):
    """evict_states drops the states at the end of locked paths too (it never asks which are locked)."""

    name = "state-eviction-ignores-locks"

    def evict_states(self, num_states):
        pages = {key: self.tree.pages[key].slots for key in self.tree.pages}
        dropped, removed = self.tree.evict_states(num_states, set())
        for key in removed:
            self.allocator.free(pages[key])
        self._free_dropped_states()
        return len(dropped)


class InsertLeavesNoState(_StateTree):
    """An insertion gives its state back instead of leaving it at the key's last page, where that page
    held none."""

    name = "insert-leaves-no-state"

    def insert(self, handle, namespace, tokens, slots):
        held = super().insert(handle, namespace, tokens, slots)
        if self.tree.states and self.tree.state_adopted:
            self.tree.pages[self.tree.page_keys(namespace, tokens)[-1]].state = False
            self._free_dropped_states()
        return held


class StateSlotsLeak(_StateTree):
    """Dropping a state never gives its state slot back."""

    name = "state-slots-leak"

    def evict_states(self, num_states):
        free = list(self.free_state_slots)
        dropped = super().evict_states(num_states)
        self.free_state_slots = free
        return dropped


#: Each broken tree with a state component and the state rule it must be convicted of.
BROKEN_STATE = {
    StateBlindMatch: "KV-TREE-022",
    StateMatchGivesUp: "KV-TREE-023",
    StatesEvictOne: "KV-TREE-024",
    StateEvictionIgnoresLocks: "KV-TREE-025",
    InsertLeavesNoState: "KV-TREE-026",
    StateSlotsLeak: "KV-TREE-027",
}


# -- the order of a component's evictions (KV-TREE-028 .. 030) -----------------------------------------
class _PathStamped(PrefixTree):
    """Orders a component's evictions by the pages' own stamps, which every lookup and insertion sets on
    its whole path, instead of the component's stamps."""

    def component_order(self, held, stamp, protected):
        return super().component_order(held, "stamp", protected)


class WindowOrderByPath(_WindowTree):
    """evict_window drops window KV in the order of the pages' full-attention recency: a lookup keeps its
    whole hit's window KV fresh, not only its window's."""

    name = "window-order-by-path"

    def configure(self, setup):
        super().configure(setup)
        self.tree = _PathStamped(setup.page_size, window=setup.window)


class StateOrderByPath(_StateTree):
    """evict_states drops states in the order of the pages' full-attention recency: a lookup keeps every
    state on its path fresh, not only the one it resumes from."""

    name = "state-order-by-path"

    def configure(self, setup):
        super().configure(setup)
        self.tree = _PathStamped(setup.page_size, states=setup.states > 0)


class SegmentReference(_WindowTree):
    """The reference with segment recency (SGLang's radix nodes, KV-TREE-009 and 029) and a window
    component: it passes every rule it is judged on."""

    name = "segment-reference"
    window_optional = False
    tree_class = PrefixTree

    def capabilities(self):
        return Capabilities(tree_recency=spec.SEGMENT_RECENCY)

    def configure(self, setup):
        super().configure(setup)
        self.tree = self.tree_class(setup.page_size, spec.SEGMENT_RECENCY, window=setup.window)


class _WindowReachShort(PrefixTree):
    def _stamp_window(self, path, also=()):
        for key in [*also, *(self.reached(path, self.window) if path else [])]:  # W tokens back, not W + P
            if self.pages[key].windowed:
                self.pages[key].window_stamp = self.clock


class WindowReachShort(SegmentReference):
    """With segment recency, a lookup or insertion stamps the window KV of the segments covering its last
    W tokens, not W + P (SGLang's reach, one page further back)."""

    name = "window-reach-short"
    tree_class = _WindowReachShort


#: Each broken tree and the order rule it must be convicted of.
BROKEN_ORDER = {
    WindowOrderByPath: "KV-TREE-028",
    WindowReachShort: "KV-TREE-029",
    StateOrderByPath: "KV-TREE-030",
}
