"""A prefix cache over token pages, and a page allocator (spec chapter ``prefix_tree``).

:class:`PrefixTree` holds pages named by ``(namespace, the tokens through the page)``
(a :data:`PageKey`); a page's parent is the key one page shorter. It answers lookups
(:meth:`PrefixTree.match`), takes insertions (:meth:`PrefixTree.insert`), counts locks on
paths and evicts leaves in the order :func:`kvoracle.spec.prefix_tree.lru_leaf_order` gives
over its stamps, with either recency the chapter states (``page``: KV-TREE-008, or
``segment``: KV-TREE-009). It also keeps where the engine's segments begin, so that the
segment recency can be modelled; with page recency that changes nothing.

With ``window > 0`` it models a cache with a window component of that many tokens (a hybrid
model's sliding-window layers, SGLang's SWA component): each page also holds its window KV
or not (:attr:`TreePage.windowed`), a hit ends where its window's KV is held (KV-TREE-016,
KV-TREE-017), :meth:`PrefixTree.drop_window` follows a window eviction, and an insertion
re-fills the window KV of the pages it covers past the inserter's own prefix (KV-TREE-020).
Window KV keeps a stamp of its own (:attr:`TreePage.window_stamp`), set by lookups and
insertions on the window they use, and :meth:`PrefixTree.evict_window` drops the oldest first,
whole segments with segment recency (KV-TREE-028, KV-TREE-029).

With ``states=True`` it models a cache with a state component (a hybrid model's recurrent
layers, SGLang's Mamba component): a page holds the state after its last token or not
(:attr:`TreePage.state`), a hit ends at a page holding a state (KV-TREE-022, KV-TREE-023), an
insertion leaves a state at its key's last page (KV-TREE-026, :attr:`PrefixTree.state_adopted`
says whether the given one was taken), and :meth:`PrefixTree.evict_states` drops states oldest
first by their own stamps (:attr:`TreePage.state_stamp`, KV-TREE-030), removing a leaf whole
(KV-TREE-024). A tree has a window or a state component, not both.

:class:`PageAllocator` hands out whole pages of slots from a free list. Together they are
the ``reference`` engine of the ``prefix-tree`` suite, and the suite's model of any engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import icontract

from kvoracle.spec import prefix_tree as spec
from kvoracle.spec.config import ConfigError

from .contracts import ENABLED

#: A page: its namespace and the request's tokens through the page's last token.
PageKey = tuple[int, tuple[int, ...]]


def check_tree_parameters(page_size: int, num_pages: int = 1) -> None:
    """Raise :class:`ConfigError` naming KV-TREE-015 and the parameter when one is impossible."""
    for name, value in (("page_size", page_size), ("num_pages", num_pages)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("KV-TREE-015", name, f"must be an int, got {type(value).__name__}")
    bad = spec.first_invalid_tree_parameter(page_size, num_pages)
    if bad:
        raise ConfigError("KV-TREE-015", bad, f"must be at least 1, got {locals()[bad]}")


@attrs.define
class TreePage:
    """One held page: its slots, its recency stamp, its lock count, and whether an engine with
    segments starts one here."""

    slots: tuple[int, ...]
    stamp: int
    locks: int = 0
    starts_segment: bool = True
    #: Whether the page holds its window KV (a cache with a window component; always with none).
    windowed: bool = True
    #: Whether the page holds the state after its last token (a cache with a state component).
    state: bool = False
    #: When a lookup or insertion last used the page's window KV (KV-TREE-028/029).
    window_stamp: int = 0
    #: When a lookup last resumed from the page's state or an insertion left one there (KV-TREE-030).
    state_stamp: int = 0


def _parents_held(tree: PrefixTree) -> bool:
    keys = list(tree.pages)
    held = tuple(True for _ in keys)
    index = {key: i for i, key in enumerate(keys)}
    parents = tuple(-1 if tree.parent(key) is None else index.get(tree.parent(key), -2) for key in keys)
    return -2 not in parents and spec.is_prefix_closed(parents, held)


@icontract.invariant(lambda self: _parents_held(self), "KV-TREE-006: every held page's parent is held",
                     enabled=ENABLED)
@icontract.invariant(lambda self: all(page.locks >= 0 for page in self.pages.values()),
                     "KV-TREE-014: lock counts are never negative", enabled=ENABLED)
@attrs.define(slots=False)
class PrefixTree:
    """The held pages of a prefix cache with page size ``page_size``."""

    page_size: int
    recency: str = spec.PAGE_RECENCY
    pages: dict[PageKey, TreePage] = attrs.Factory(dict)
    #: Ticks once per lookup or insertion.
    clock: int = 0
    #: The window component's reach in tokens (0: none).
    window: int = 0
    #: The pages the last insertion re-filled with window KV (KV-TREE-020).
    refilled: list[PageKey] = attrs.Factory(list)
    #: A state component (KV-TREE-022 .. 027): pages may hold the state after their last token.
    states: bool = False
    #: Whether the last insertion took the state it was given (KV-TREE-026).
    state_adopted: bool = False

    def __attrs_post_init__(self) -> None:
        check_tree_parameters(self.page_size)
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ConfigError("KV-TREE-016", "window", f"must be an int of at least 0, got {self.window!r}")
        if self.states and self.window:
            raise ConfigError("KV-TREE-022", "states",
                              "a tree with both a window and a state component is not modelled")
        if self.recency not in spec.RECENCY_MODES:
            raise ConfigError("KV-TREE-008", "recency", f"must be one of {spec.RECENCY_MODES}, got {self.recency!r}")

    # -- naming pages ------------------------------------------------------------------------------
    def page_keys(self, namespace: int, tokens: Sequence[int]) -> list[PageKey]:
        """The keys of the request's full pages, page 0 first."""
        tokens = tuple(tokens)
        return [(namespace, tokens[:(j + 1) * self.page_size]) for j in range(len(tokens) // self.page_size)]

    def parent(self, key: PageKey) -> PageKey | None:
        namespace, tokens = key
        return (namespace, tokens[:-self.page_size]) if len(tokens) > self.page_size else None

    def children(self, key: PageKey) -> list[PageKey]:
        return [other for other in self.pages if self.parent(other) == key]

    def held_flags(self, namespace: int, tokens: Sequence[int]) -> tuple[bool, ...]:
        return tuple(key in self.pages for key in self.page_keys(namespace, tokens))

    def cached_tokens(self) -> int:
        return len(self.pages) * self.page_size

    def window_flags(self, namespace: int, tokens: Sequence[int]) -> tuple[bool, ...]:
        """Whether each full page of the request is held with its window KV."""
        return tuple(key in self.pages and self.pages[key].windowed for key in self.page_keys(namespace, tokens))

    def windowed_tokens(self) -> int:
        """The window KV tokens the cache holds."""
        return sum(self.page_size for page in self.pages.values() if page.windowed)

    def window_locked(self, path: Sequence[PageKey]) -> list[PageKey]:
        """The pages of a locked path whose window KV the lock protects (KV-TREE-019)."""
        if not self.window:
            return []
        return [path[j] for j in spec.window_locked_pages(len(path) * self.page_size, self.window, self.page_size)]

    def state_flags(self, namespace: int, tokens: Sequence[int]) -> tuple[bool, ...]:
        """Whether each full page of the request is held with a state."""
        return tuple(key in self.pages and self.pages[key].state for key in self.page_keys(namespace, tokens))

    def state_count(self) -> int:
        """The states the cache holds."""
        return sum(1 for page in self.pages.values() if page.state)

    def state_locked(self, path: Sequence[PageKey]) -> list[PageKey]:
        """The page of a locked path whose state the lock protects (KV-TREE-025)."""
        if not self.states:
            return []
        return [path[j] for j in spec.state_locked_pages(len(path) * self.page_size, self.page_size)]

    def hit_of(self, namespace: int, tokens: Sequence[int]) -> tuple[int, int]:
        """``(hit, held)``: the hit a lookup answers and the longest held prefix it lies in."""
        held = spec.longest_held_prefix(self.held_flags(namespace, tokens), len(tokens), self.page_size)
        if self.states:
            flags = self.state_flags(namespace, tokens)[:held // self.page_size]
            return spec.longest_state_hit(flags, held, self.page_size), held
        if not self.window:
            return held, held
        flags = self.window_flags(namespace, tokens)[:held // self.page_size]
        return spec.longest_windowed_hit(flags, held, self.window, self.page_size), held

    def sizes(self) -> tuple[int, int]:
        """``(evictable, protected)`` tokens (KV-TREE-011)."""
        return spec.cache_sizes(tuple(page.locks for page in self.pages.values()), self.page_size)

    # -- recency -----------------------------------------------------------------------------------
    def segment_rest(self, key: PageKey) -> list[PageKey]:
        """The held pages after ``key`` in its segment: the chain of children that start none."""
        rest: list[PageKey] = []
        while True:
            follow = [child for child in self.children(key) if not self.pages[child].starts_segment]
            if not follow:
                return rest
            key = follow[0]
            rest.append(key)

    def _stamp(self, path: list[PageKey]) -> None:
        """Stamp a lookup's or insertion's held ``path`` (KV-TREE-008/009) and split the segment
        it ends inside."""
        self.clock += 1
        if not path:
            return
        rest = self.segment_rest(path[-1])
        count = spec.pages_stamped(len(path), len(rest), self.recency)
        for key in (path + rest)[:count]:
            self.pages[key].stamp = self.clock
        if rest:
            self.pages[rest[0]].starts_segment = True

    def path_segments(self, path: Sequence[PageKey]) -> list[list[PageKey]]:
        """The segments of a held ``path`` (root first), from its last one back, each as its pages
        (root first); with page recency every page is a segment of its own."""
        segments: list[list[PageKey]] = []
        for key in reversed(path):
            if not segments or self.recency == spec.PAGE_RECENCY:
                segments.append([key])
            else:
                segments[-1].insert(0, key)
            if self.recency == spec.SEGMENT_RECENCY and self.pages[key].starts_segment:
                segments.append([])
        return [segment for segment in segments if segment]

    def reached(self, path: Sequence[PageKey], reach: int) -> list[PageKey]:
        """The pages of the segments a walk back from ``path``'s end enters before it covers ``reach``
        tokens (:func:`kvoracle.spec.prefix_tree.segments_reached`)."""
        segments = self.path_segments(path)
        count = spec.segments_reached(tuple(len(seg) * self.page_size for seg in segments), reach)
        return [key for segment in segments[:count] for key in segment]

    def window_pinned(self, path: Sequence[PageKey]) -> list[PageKey]:
        """The pages whose window KV a lock on ``path`` keeps from eviction: its window's
        (KV-TREE-019), in whole segments with segment recency (KV-TREE-029)."""
        if not self.window:
            return []
        if self.recency == spec.PAGE_RECENCY:
            return self.window_locked(path)
        return self.reached(path, self.window)

    def _stamp_window(self, path: Sequence[PageKey], also: Iterable[PageKey] = ()) -> None:
        """Stamp the window KV a lookup or insertion ending at ``path``'s end uses (KV-TREE-028/029),
        and that of the pages ``also`` (what an insertion stored or re-filled)."""
        reach = spec.window_refresh_reach(self.window, self.page_size, self.recency)
        for key in [*also, *(self.reached(path, reach) if path else [])]:
            if self.pages[key].windowed:
                self.pages[key].window_stamp = self.clock

    # -- lookups and insertions ------------------------------------------------------------------
    @icontract.ensure(lambda result, tokens, self: spec.is_aligned_hit(result[0], len(result[1]), len(tokens),
                                                                       self.page_size),
                      "KV-TREE-001: the hit is a page-aligned prefix", enabled=ENABLED)
    @icontract.ensure(lambda result, self, namespace, tokens:
                      self.window or self.states or result[0] == spec.longest_held_prefix(
                          self.held_flags(namespace, tokens), len(tokens), self.page_size),
                      "KV-TREE-003: the hit is the longest held prefix", enabled=ENABLED)
    @icontract.ensure(lambda result, self, namespace, tokens:
                      not self.window or spec.window_hit_ok(self.window_flags(namespace, tokens), result[0],
                                                            self.window, self.page_size),
                      "KV-TREE-016: the hit's window KV is held", enabled=ENABLED)
    @icontract.ensure(lambda result, self, namespace, tokens:
                      not self.states or spec.state_hit_ok(self.state_flags(namespace, tokens), result[0],
                                                           self.page_size),
                      "KV-TREE-022: the hit ends at a state", enabled=ENABLED)
    def match(self, namespace: int, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        """The hit of ``tokens`` in ``namespace`` and its slots; stamps what it covers.

        With a window or states, the whole segments of the held prefix past the hit are not stamped; a
        segment the held prefix ends inside is split there and both parts are stamped, the pages up to
        the held end and the rest (SGLang's split of the node the walk parts from: the new node that
        takes the part up to the split is created with a fresh stamp, and the rest is stamped)."""
        keys = self.page_keys(namespace, tokens)
        hit, held = self.hit_of(namespace, tokens)
        path = keys[:hit // self.page_size]
        self._stamp(path)
        if held > hit and self.recency == spec.SEGMENT_RECENCY:
            end = keys[held // self.page_size - 1]
            rest = self.segment_rest(end)
            if rest:
                head = [end]
                while not self.pages[head[0]].starts_segment and self.parent(head[0]) is not None:
                    head.insert(0, self.parent(head[0]))
                for key in head + rest:
                    self.pages[key].stamp = self.clock
                self.pages[rest[0]].starts_segment = True
        if self.window and path:
            self._stamp_window(path)
        if self.states and path:
            self.pages[path[-1]].state_stamp = self.clock
        return hit, tuple(slot for key in path for slot in self.pages[key].slots)

    @icontract.require(lambda self, tokens, slots: len(slots) >= len(tokens) // self.page_size * self.page_size,
                       "KV-TREE-012: a slot for every token of the stored pages", enabled=ENABLED)
    @icontract.snapshot(lambda self, namespace, tokens: spec.longest_held_prefix(
        self.held_flags(namespace, tokens), len(tokens), self.page_size), name="held", enabled=ENABLED)
    @icontract.ensure(lambda result, OLD: result == OLD.held,
                      "KV-TREE-012: insertion answers the longest held prefix", enabled=ENABLED)
    @icontract.ensure(lambda self, namespace, tokens: all(self.held_flags(namespace, tokens)),
                      "KV-TREE-012: every page of the key is held afterwards", enabled=ENABLED)
    @icontract.ensure(lambda self, namespace, tokens: not self.states or not tokens or len(tokens) < self.page_size
                      or self.state_flags(namespace, tokens)[-1],
                      "KV-TREE-026: the key's last page holds a state afterwards", enabled=ENABLED)
    def insert(self, namespace: int, tokens: Sequence[int], slots: Sequence[int], own: int = 0) -> int:
        """Store the full pages of ``tokens`` with ``slots`` (one per token); the pages already
        held keep theirs. Returns the tokens that were held.

        With a window, the held pages past the inserter's ``own`` tokens (its hit, or what it
        inserted before) that lack their window KV get it back (KV-TREE-020); they keep their
        slots here (:meth:`adopt` follows an engine that gives them the inserter's). A new run of
        pages longer than the window is stored as two segments, the last ``ceil(window / P)``
        pages apart (SGLang caps a fresh leaf at one window so that a lock on it pins no more)."""
        keys = self.page_keys(namespace, tokens)
        held = spec.longest_held_prefix(self.held_flags(namespace, tokens), len(tokens), self.page_size)
        self._stamp(keys[:held // self.page_size])
        size = self.page_size
        self.refilled = [key for key in keys[own // size:held // size] if not self.pages[key].windowed]
        for key in self.refilled:
            self.pages[key].windowed = True
        tail = len(keys) - spec.window_pages(self.window, size) if self.window else held // size
        for j in range(held // size, len(keys)):
            self.pages[keys[j]] = TreePage(tuple(slots[j * size:(j + 1) * size]), self.clock,
                                           starts_segment=j in (held // size, tail))
        if self.window:
            self._stamp_window(keys, [*self.refilled, *keys[held // size:]])
        self.state_adopted = False
        if self.states and spec.insertion_leaves_state(len(tokens), size):
            last = self.pages[keys[-1]]
            self.state_adopted = spec.insertion_adopts_state(last.state)
            last.state = True
            last.state_stamp = self.clock
        return held

    def adopt(self, key: PageKey, slots: Sequence[int]) -> None:
        """A page an insertion re-filled holds the inserter's ``slots`` from now on (KV-TREE-020)."""
        self.pages[key].slots = tuple(slots)

    def drop_window(self, keys: Iterable[PageKey]) -> None:
        """Forget these pages' window KV (a window eviction the model follows); a page whose window
        state differs from its parent's starts a segment (the engine drops whole segments)."""
        for key in keys:
            self.pages[key].windowed = False
        self.mark_window_boundaries()

    def drop_states(self, keys: Iterable[PageKey]) -> None:
        """Forget these pages' states (a state eviction the model follows)."""
        for key in keys:
            self.pages[key].state = False

    def component_order(self, held: str, stamp: str, protected: set[PageKey]) -> list[PageKey]:
        """The pages holding a component's content (the page flag ``held``) outside ``protected``, in
        the order a component eviction drops it: oldest ``stamp`` first, the shorter prefix first
        (:func:`kvoracle.spec.prefix_tree.component_lru_order`)."""
        keys = sorted(self.pages, key=lambda key: (len(key[1]), key))
        order = spec.component_lru_order(tuple(getattr(self.pages[k], stamp) for k in keys),
                                         tuple(len(k[1]) for k in keys),
                                         tuple(getattr(self.pages[k], held) and k not in protected for k in keys))
        return [keys[i] for i in order]

    def window_eviction_order(self, protected: set[PageKey]) -> list[PageKey]:
        """The pages whose window KV ``evict_window`` drops, in order (KV-TREE-028/029); ``protected``:
        the pages the held locks pin (:meth:`window_pinned`)."""
        return self.component_order("windowed", "window_stamp", protected)

    def state_eviction_order(self, protected: set[PageKey]) -> list[PageKey]:
        """The pages whose state ``evict_states`` drops, in order (KV-TREE-030); ``protected``: the
        locked paths' last pages."""
        return self.component_order("state", "state_stamp", protected)

    @icontract.snapshot(lambda self, protected: self.state_eviction_order(protected), name="order", enabled=ENABLED)
    @icontract.ensure(lambda result, OLD: spec.drops_an_order_prefix(
        tuple(OLD.order.index(k) if k in OLD.order else -1 for k in result[0]), tuple(range(len(OLD.order)))),
        "KV-TREE-030: states go oldest first", enabled=ENABLED)
    def evict_states(self, num_states: int, protected: set[PageKey]) -> tuple[list[PageKey], list[PageKey]]:
        """The reference's state eviction: in :meth:`state_eviction_order`, drop the states of pages
        outside ``protected`` (the locked paths' last pages) until ``num_states`` are gone; a page
        without a held child and without a lock goes whole. ``(pages whose state went, pages removed)``."""
        dropped: list[PageKey] = []
        removed: list[PageKey] = []
        for key in self.state_eviction_order(protected):
            if len(dropped) >= num_states:
                break
            dropped.append(key)
            if self.children(key) or self.pages[key].locks:
                self.pages[key].state = False
            else:
                removed.append(key)
                self.remove([key])
        return dropped, removed

    def mark_window_boundaries(self) -> None:
        for key, page in self.pages.items():
            parent = self.parent(key)
            if parent is not None and parent in self.pages and self.pages[parent].windowed != page.windowed:
                page.starts_segment = True

    # -- locks -------------------------------------------------------------------------------------
    @icontract.require(lambda self, path: all(key in self.pages for key in path),
                       "KV-TREE-014: a lock covers held pages only", enabled=ENABLED)
    def lock(self, path: Iterable[PageKey]) -> None:
        for key in path:
            self.pages[key].locks += 1

    @icontract.require(lambda self, path: all(key in self.pages and self.pages[key].locks > 0 for key in path),
                       "KV-TREE-014: unlocking releases a lock that is held", enabled=ENABLED)
    def unlock(self, path: Iterable[PageKey]) -> None:
        for key in path:
            self.pages[key].locks -= 1

    # -- eviction ----------------------------------------------------------------------------------
    def eviction_order(self) -> list[PageKey]:
        """Every page eviction can remove, in the order it removes them (KV-TREE-008/009)."""
        keys = sorted(self.pages, key=lambda key: (len(key[1]), key))  # parents first
        index = {key: i for i, key in enumerate(keys)}
        parents = tuple(-1 if self.parent(key) is None else index[self.parent(key)] for key in keys)
        order = spec.lru_leaf_order(parents, tuple(self.pages[k].stamp for k in keys),
                                    tuple(self.pages[k].locks for k in keys))
        return [keys[i] for i in order]

    @icontract.ensure(lambda result, OLD: spec.evicts_no_locked_page(tuple(OLD.locks.get(k, 1) for k in result)),
                      "KV-TREE-005: no locked page is evicted", enabled=ENABLED)
    @icontract.snapshot(lambda self: {key: page.locks for key, page in self.pages.items()}, name="locks",
                        enabled=ENABLED)
    @icontract.snapshot(lambda self: self.sizes()[0], name="evictable", enabled=ENABLED)
    @icontract.ensure(lambda result, OLD, self, num_tokens:
                      spec.evicted_enough(num_tokens, OLD.evictable, len(result) * self.page_size,
                                          len(result) * self.page_size),
                      "KV-TREE-007: evict(n) removes at least what it can of n tokens", enabled=ENABLED)
    def evict(self, num_tokens: int) -> list[PageKey]:
        """Remove leaves in LRU order until ``num_tokens`` tokens are gone (whole segments with
        segment recency) or nothing evictable is left; the removed keys, in removal order."""
        order = self.eviction_order()
        removed: list[PageKey] = []
        while len(order) > len(removed) and len(removed) * self.page_size < num_tokens:
            removed.append(order[len(removed)])
            # With segment recency a segment goes whole: its pages are consecutive in the order,
            # bottom up, ending with the page that starts it.
            while (self.recency == spec.SEGMENT_RECENCY and not self.pages[removed[-1]].starts_segment
                   and len(order) > len(removed)):
                removed.append(order[len(removed)])
        self.remove(removed)
        return removed

    @icontract.snapshot(lambda self, protected: self.window_eviction_order(protected), name="order", enabled=ENABLED)
    @icontract.ensure(lambda result, OLD: spec.drops_an_order_prefix(
        tuple(OLD.order.index(k) if k in OLD.order else -1 for k in result[0]), tuple(range(len(OLD.order)))),
        "KV-TREE-028/029: window KV goes oldest first", enabled=ENABLED)
    def evict_window(self, num_tokens: int, protected: set[PageKey]) -> tuple[list[PageKey], list[PageKey]]:
        """The reference's window eviction: in :meth:`window_eviction_order`, drop the window KV of
        pages outside ``protected`` (what the held locks pin) until ``num_tokens`` window tokens are
        gone, a whole segment at a time; an unlocked segment without a held child goes whole.
        ``(pages whose window KV went, pages removed)``."""
        order = self.window_eviction_order(protected)
        dropped: list[PageKey] = []
        removed: list[PageKey] = []
        while len(dropped) < len(order) and len(dropped) * self.page_size < num_tokens:
            # A segment's pages share their stamp, so they are consecutive in the order, its first page first.
            segment = [order[len(dropped)]]
            while (self.recency == spec.SEGMENT_RECENCY and len(dropped) + len(segment) < len(order)
                   and self.parent(order[len(dropped) + len(segment)]) == segment[-1]
                   and not self.pages[order[len(dropped) + len(segment)]].starts_segment):
                segment.append(order[len(dropped) + len(segment)])
            dropped.extend(segment)
            if self.children(segment[-1]) or any(self.pages[key].locks for key in segment):
                for key in segment:
                    self.pages[key].windowed = False
            else:
                removed.extend(segment)
                self.remove(segment)
        self.mark_window_boundaries()
        return dropped, removed

    def remove(self, keys: Iterable[PageKey]) -> None:
        """Forget these pages (an engine's eviction the model follows), children first."""
        for key in sorted(keys, key=lambda k: -len(k[1])):
            del self.pages[key]


@icontract.invariant(lambda self: len(set(self.free_pages)) == len(self.free_pages),
                     "KV-TREE-010: no page is free twice", enabled=ENABLED)
@attrs.define(slots=False)
class PageAllocator:
    """Slots in whole pages: page ``q`` holds slots ``q * page_size ... (q + 1) * page_size - 1``.
    Allocation takes pages from the front of the free list; freed pages go to its back."""

    num_pages: int
    page_size: int
    free_pages: list[int] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        check_tree_parameters(self.page_size, self.num_pages)
        self.free_pages = list(range(self.num_pages))

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    def available(self) -> int:
        return len(self.free_pages) * self.page_size

    @icontract.ensure(lambda result, num_tokens: result is None or len(result) == num_tokens,
                      "KV-TREE-010: an allocation returns the slots asked for", enabled=ENABLED)
    def alloc(self, num_tokens: int) -> tuple[int, ...] | None:
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ConfigError("KV-TREE-015", "num_tokens",
                              f"allocations are whole pages of {self.page_size} slots, got {num_tokens}")
        count = num_tokens // self.page_size
        if count > len(self.free_pages):
            return None
        taken, self.free_pages = self.free_pages[:count], self.free_pages[count:]
        return tuple(page * self.page_size + k for page in taken for k in range(self.page_size))

    @icontract.require(lambda self, slots: all(0 <= s < self.capacity for s in slots),
                       "KV-TREE-010: freed slots are the allocator's", enabled=ENABLED)
    def free(self, slots: Sequence[int]) -> None:
        """Free the pages these slots lie in (each once)."""
        for page in dict.fromkeys(slot // self.page_size for slot in slots):
            self.free_pages.append(page)
