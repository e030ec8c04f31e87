"""The prefix-tree suite's driver and Hypothesis machine.

The driver plays a scheduler over the engine's prefix cache, request by request: a request
arrives (``match``, then ``lock`` of its hit), gets slots for the rest of its tokens
(``alloc``, after ``evict`` of what the allocator lacks), and finishes (``insert``, ``free`` of
its duplicates and of its unaligned tail, ``unlock``), checkpoints (``insert`` while it runs)
or aborts. kvoracle's model (:class:`kvoracle.reference.prefix_tree.PrefixTree`, in the recency
the engine declares) follows the same operations; where the engine evicts, the model removes
exactly what the engine removed once that passed the eviction rules, so that an engine
without an eviction order is judged on everything else.

The driver also keeps what it wrote to every slot: ``(namespace, the tokens through the
slot's token)``. A hit must read back exactly that (KV-TREE-002, KV-TREE-004). After every
step it observes the engine and judges, in this order: the pages held and their slots
against the model (the step's content rule: KV-TREE-013 for lookups and allocations,
KV-TREE-012 for insertions, KV-TREE-007 for evictions, KV-TREE-014 for unlocking), the held
set's shape (KV-TREE-006), the lock counts (KV-TREE-014), the engine's evictable and
protected sizes (KV-TREE-011) and the capacity (KV-TREE-010).

An engine in a paged KV store (capability ``kv_data``, :mod:`.engines.prefix_tree_store`) is also
judged on the data its slots hold. A request's Compute step then runs the model runner's
forward pass (the adapter's ``forward``), and the store's verdicts (``TreeView.data_checks``,
KV-DATA-001 .. 004) are recorded before the suite's own checks wherever both judge the same
fault: after a lookup (what the hit's slots hold, before which slots they are), after the
forward pass (what it overwrote, before whose slots the allocator handed out), and at the
start of every state judgement.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from kvoracle.reference.prefix_tree import PageKey, PrefixTree
from kvoracle.spec import prefix_tree as spec

from .harness.driver import Driver
from .harness.machine import SuiteMachine
from .prefix_tree_protocol import (
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
    Serve,
    TreeSetup,
    TreeView,
)

#: What the driver wrote to a slot: (namespace, the tokens through the slot's token).
Content = tuple[int, tuple[int, ...]]
UNWRITTEN: Content = (-1, ())


@attrs.define
class Request:
    """A request as the driver tracks it."""

    namespace: int
    tokens: tuple[int, ...]
    #: Tokens whose slots are the cache's (the hit, or what a checkpoint inserted).
    protected: int
    #: The request's slots, position by position (the cache's first, then its own).
    row: list[int]
    #: The pages its lock holds.
    locked: list[PageKey] = attrs.Factory(list)
    #: The pages whose window KV its lock keeps from eviction, fixed when it locked (KV-TREE-028/029).
    pinned: list[PageKey] = attrs.Factory(list)
    computed: bool = False


def _page(key: PageKey) -> str:
    return f"{list(key[1])} in namespace {key[0]}"


def _short(tokens: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(str(t) for t in tokens[:limit])
    return f"[{shown}{', ...' if len(tokens) > limit else ''}] ({len(tokens)} tokens)"


class TreeDriver(Driver):
    """Applies steps to the engine and the model, and judges each answer."""

    suite_name = "prefix-tree"
    fault_rule = "KV-TREE-010"

    def prepare(self) -> None:
        self.setup: TreeSetup | None = None
        self.model: PrefixTree | None = None
        self.requests: dict[int, Request] = {}
        self.written: dict[int, Content] = {}

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        assert self.setup is not None
        return self.setup.page_size

    @property
    def capacity(self) -> int:
        assert self.setup is not None
        return self.setup.page_size * self.setup.num_pages

    def held_by_requests(self) -> list[int]:
        return [slot for req in self.requests.values() for slot in req.row[req.protected:]]

    def model_free(self) -> int:
        assert self.model is not None
        return self.capacity - self.model.cached_tokens() - len(self.held_by_requests())

    def live(self, computed: bool | None = None) -> list[int]:
        return [r for r, req in self.requests.items() if computed is None or req.computed == computed]

    # -- steps ------------------------------------------------------------------------------------
    def _TreeSetup(self, step: TreeSetup) -> None:
        self.new_engine()
        self.call("configure", step)
        self.setup = step
        recency = self.verdicts.capabilities.tree_recency
        self.model = PrefixTree(step.page_size, recency if recency in spec.RECENCY_MODES else spec.PAGE_RECENCY,
                                window=step.window, states=step.states > 0)
        self._judge_state(self._observe(), "KV-TREE-010")

    def _Arrive(self, step: Arrive) -> None:
        assert self.setup is not None and self.model is not None
        tokens = self.setup.prompts[step.prompt][:step.length]
        hit, slots = self._look_up(step.request, step.namespace, tokens)
        path = self.model.page_keys(step.namespace, tokens)[:hit // self.page_size]
        self.call("lock", step.request, rule="KV-TREE-014")
        self.model.lock(path)
        self.requests[step.request] = Request(step.namespace, tokens, hit, list(slots), path,
                                              self.model.window_pinned(path))
        self._judge_state(self._observe(), "KV-TREE-013")

    def _Serve(self, step: Serve) -> None:
        self._Arrive(Arrive(step.request, step.prompt, step.namespace, step.length))
        if step.request in self.requests:
            self._Compute(Compute(step.request))
        if step.request in self.requests:
            self._Finish(Finish(step.request))

    def _Peek(self, step: Peek) -> None:
        assert self.setup is not None
        self._look_up(step.handle, step.namespace, self.setup.prompts[step.prompt][:step.length])
        self._judge_state(self._observe(), "KV-TREE-013")

    def _Compute(self, step: Compute) -> None:
        req = self.requests[step.request]
        size = self.page_size
        need = -(-len(req.tokens) // size) * size - req.protected
        if need > 0:
            free = self.model_free()
            if need > free:
                self._evict(need - free)
            slots = self.call("alloc", need, rule="KV-TREE-010")
            if slots is None:
                free = self.model_free()
                self.verdicts.check("KV-TREE-010", free < need, lambda: (
                    f"alloc({need}) answered None with {free} slots free (capacity {self.capacity}, "
                    f"{self.model.cached_tokens()} held by the cache, {len(self.held_by_requests())} by requests)"))
                self._release(step.request, req)
                self._judge_state(self._observe(), "KV-TREE-014")
                return
            if self.stores_kv:  # the forward pass writes first: its verdicts come before the allocation's
                self._forward(step.request, req, req.row[:req.protected] + list(slots))
            self._judge_allocation(need, tuple(slots))
            for offset, slot in enumerate(slots):
                position = req.protected + offset
                self.written[slot] = ((req.namespace, req.tokens[:position + 1]) if position < len(req.tokens)
                                      else UNWRITTEN)
            req.row = req.row[:req.protected] + list(slots)
        elif self.stores_kv:
            self._forward(step.request, req, req.row)
        req.computed = True
        self._judge_state(self._observe(), "KV-TREE-013")

    def _Finish(self, step: Finish) -> None:
        req = self.requests[step.request]
        self._insert(step.request, req)
        self._release(step.request, req)
        self._judge_state(self._observe(), "KV-TREE-012")

    def _Checkpoint(self, step: Checkpoint) -> None:
        assert self.model is not None
        req = self.requests[step.request]
        self._insert(step.request, req)
        # The request goes on reading its inserted tokens from the cache, under a lock on them.
        path = self.model.page_keys(req.namespace, req.tokens)
        self.call("unlock", step.request, rule="KV-TREE-014")
        self.model.unlock(req.locked)
        self.call("lock", step.request, rule="KV-TREE-014")
        self.model.lock(path)
        req.locked, req.pinned = path, self.model.window_pinned(path)
        self._judge_state(self._observe(), "KV-TREE-012")

    def _Abort(self, step: Abort) -> None:
        self._release(step.request, self.requests[step.request])
        self._judge_state(self._observe(), "KV-TREE-014")

    def _Evict(self, step: Evict) -> None:
        self._evict(step.num_tokens)

    def _EvictWindow(self, step: EvictWindow) -> None:
        self._evict_window(step.num_tokens)

    def _EvictStates(self, step: EvictStates) -> None:
        self._evict_states(step.num_states)

    # -- operations shared by steps ----------------------------------------------------------------
    def _look_up(self, handle: int, namespace: int, tokens: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """``match`` on the engine and the model; judges the hit (KV-TREE-001 .. 004)."""
        assert self.model is not None
        hit, slots = self.call("match", handle, namespace, tokens, rule="KV-TREE-001")
        slots = tuple(slots)
        if self.stores_kv:  # what the hit's slots hold, read from the store, before what they are
            self._judge_data(self._observe())
        window = self.model.window
        flags = self.model.window_flags(namespace, tokens)
        states = self.model.state_flags(namespace, tokens)
        want_held = spec.longest_held_prefix(self.model.held_flags(namespace, tokens), len(tokens), self.page_size)
        want, want_slots = self.model.match(namespace, tokens)
        check = self.verdicts.check
        detail = f"namespace {namespace}, tokens {_short(tokens)}, page size {self.page_size}"
        check("KV-TREE-001", spec.is_aligned_hit(hit, len(slots), len(tokens), self.page_size),
              lambda: f"match answered a hit of {hit} tokens with {len(slots)} slots; {detail}")
        contents = tuple(self.written.get(slot, UNWRITTEN) for slot in slots)
        foreign = [i for i in spec.foreign_positions(tuple(c[0] for c in contents), namespace)
                   if contents[i] != UNWRITTEN]
        check("KV-TREE-004", not foreign, lambda: (
            f"hit position {foreign[0]} reads slot {slots[foreign[0]]}, written for namespace "
            f"{contents[foreign[0]][0]}: {_short(contents[foreign[0]][1])}; {detail}"))
        wrong = spec.misread_positions(contents, namespace, tokens[:hit])
        check("KV-TREE-002", not wrong, lambda: (
            f"hit position {wrong[0]} reads slot {slots[wrong[0]]}, which holds "
            f"{'nothing written' if contents[wrong[0]] == UNWRITTEN else _short(contents[wrong[0]][1])}"
            f" (namespace {contents[wrong[0]][0]}), not the request's token {wrong[0]}; {detail}"))
        if window:
            check("KV-TREE-016", hit > want_held or spec.window_hit_ok(flags, hit, window, self.page_size), lambda: (
                f"match answered a hit of {hit} tokens, but the window KV of its last {min(hit, window)} tokens "
                f"is not all held (pages with window KV: {list(flags)}, window {window}); {detail}"))
        if self.model.states:
            check("KV-TREE-022", hit > want_held or spec.state_hit_ok(states, hit, self.page_size), lambda: (
                f"match answered a hit of {hit} tokens, but its last page holds no state (pages with a state: "
                f"{list(states)}); {detail}"))
        # With a window (a state component), a hit shorter than the held prefix is KV-TREE-017's (023's);
        # else KV-TREE-003's.
        longest = "KV-TREE-003" if want == want_held else "KV-TREE-017" if window else "KV-TREE-023"
        check(longest, hit == want, lambda: (
            f"match answered a hit of {hit} tokens; the cache holds the request's first {want_held} tokens "
            f"(held pages {list(self.model.held_flags(namespace, tokens))})"
            + (f", with window KV on pages {list(flags)} (window {window}): the hit is {want}" if window else "")
            + (f", with a state on pages {list(states)}: the hit is {want}" if self.model.states else "")
            + f"; {detail}"))
        check("KV-TREE-002", slots == want_slots, lambda: (
            f"match answered slots {list(slots)}; the cache holds those pages in slots {list(want_slots)}; {detail}"))
        return hit, slots

    def _judge_allocation(self, need: int, slots: tuple[int, ...]) -> None:
        assert self.model is not None
        owned = {s for page in self.model.pages.values() for s in page.slots} | set(self.held_by_requests())
        taken = sorted(set(slots) & owned)
        self.verdicts.check("KV-TREE-010", len(slots) == need and len(set(slots)) == need and not taken, lambda: (
            f"alloc({need}) returned {len(slots)} slots {list(slots)[:16]}: "
            + (f"slots {taken[:8]} are held by the cache or a request" if taken else "not distinct or not as many")))

    def _insert(self, handle: int, req: Request) -> int:
        """Insert the request's tokens and free its duplicates (KV-TREE-012): its first tokens are
        the cache's from then on. The aligned length."""
        assert self.model is not None
        size = self.page_size
        aligned = len(req.tokens) // size * size
        if self.model.states and self.state_free() < 1:
            # The insertion gives the cache a state from a slot of the adapter's own: the scheduler
            # evicts one first when none is free (SGLang's _alloc_mamba_slot does the same). The
            # setups draw more state slots than requests can lock, so one is evictable.
            self._evict_states(1)
        held = self.call("insert", handle, req.namespace, req.tokens, tuple(req.row[:len(req.tokens)]),
                         rule="KV-TREE-012")
        locks = {key: page.locks for key, page in self.model.pages.items()}
        want = self.model.insert(req.namespace, req.tokens, req.row[:aligned], own=req.protected)
        self.verdicts.check("KV-TREE-012", held == want, lambda: (
            f"insert answered {held} tokens already held; the cache held the first {want} of "
            f"{_short(req.tokens)} (namespace {req.namespace})"))
        adopted = self._follow_refills(req, locks) if self.model.refilled else set()
        duplicates = [slot for position, slot in enumerate(req.row[:want]) if position >= req.protected
                      and position // size not in adopted]
        if duplicates:
            self.call("free", tuple(duplicates), rule="KV-TREE-012")
        path = self.model.page_keys(req.namespace, req.tokens)
        req.row = [slot for key in path for slot in self.model.pages[key].slots] + req.row[aligned:]
        req.protected = aligned
        return aligned

    def _follow_refills(self, req: Request, locks: dict[PageKey, int]) -> set[int]:
        """The pages an insertion re-filled with window KV (KV-TREE-020): each keeps its slots or,
        when no lock ran through it, takes the inserter's; the model follows what the engine
        shows. The indices of the pages that took the inserter's slots."""
        assert self.model is not None
        size = self.page_size
        shown = {(p.namespace, tuple(p.tokens)): p for p in self._observe().pages}
        keys = self.model.page_keys(req.namespace, req.tokens)
        adopted: set[int] = set()
        for key in self.model.refilled:
            j = keys.index(key)
            given = tuple(req.row[j * size:(j + 1) * size])
            page = shown.get(key)
            if page is None or tuple(page.slots) == self.model.pages[key].slots:
                continue  # the state judgement says what is wrong with a missing or moved page
            message = (f"insert re-filled the window KV of {_page(key)} and moved it from slots "
                       f"{list(self.model.pages[key].slots)} to {list(page.slots)}: only an unlocked page may "
                       f"move, and only to the inserter's slots {list(given)} ({locks.get(key)} locks)")
            self.verdicts.check("KV-TREE-020", tuple(page.slots) == given and not locks.get(key), message)
            self.model.adopt(key, given)
            adopted.add(j)
        return adopted

    def _release(self, handle: int, req: Request) -> None:
        """Free the slots the request holds outside the cache (its unaligned tail, once inserted) and
        its lock; forget it."""
        assert self.model is not None
        own = req.row[req.protected:]
        if own:
            self.call("free", tuple(own), rule="KV-TREE-010")
        self.call("unlock", handle, rule="KV-TREE-014")
        self.model.unlock(req.locked)
        del self.requests[handle]

    def _evict(self, num_tokens: int) -> None:
        """``evict(num_tokens)``, judged (KV-TREE-005 .. KV-TREE-009); the model follows it."""
        assert self.model is not None
        model = self.model
        evictable = model.sizes()[0]
        order = model.eviction_order()
        reported = self.call("evict", num_tokens, rule="KV-TREE-007")
        view = self._observe()
        shown = {(p.namespace, p.tokens) for p in view.pages}
        removed = [key for key in model.pages if key not in shown]
        added = sorted(shown - set(model.pages))
        check = self.verdicts.check
        check("KV-TREE-007", not added, lambda: f"evict({num_tokens}) added pages {'; '.join(map(_page, added[:4]))}")
        locked = [key for key in removed if model.pages[key].locks]
        check("KV-TREE-005", spec.evicts_no_locked_page(tuple(model.pages[k].locks for k in removed)), lambda: (
            f"evict({num_tokens}) removed locked pages: " + "; ".join(
                f"{_page(k)} ({model.pages[k].locks} locks)" for k in locked[:3])))
        self._judge_shape(view)
        size = self.page_size
        check("KV-TREE-007", spec.evicted_enough(num_tokens, evictable, len(removed) * size, reported), lambda: (
            f"evict({num_tokens}) reported {reported} tokens and removed {len(removed) * size} "
            f"({len(removed)} pages); {evictable} tokens were evictable"))
        recency = self.verdicts.capabilities.tree_recency
        if recency in spec.RECENCY_MODES:
            rule_id = "KV-TREE-008" if recency == spec.PAGE_RECENCY else "KV-TREE-009"
            index = {key: i for i, key in enumerate(order)}
            first = order[:len(removed)]
            check(rule_id, spec.removes_an_lru_prefix(tuple(index.get(k, -1) for k in removed),
                                                       tuple(range(len(order)))), lambda: (
                f"evict({num_tokens}) removed {len(removed)} pages: {'; '.join(map(_page, removed[:4]))}; the "
                f"least recently used leaves ({recency} recency) are: {'; '.join(map(_page, first[:4]))}"))
            if recency == spec.SEGMENT_RECENCY:
                split = [k for k in removed if not model.pages[k].starts_segment and model.parent(k) not in removed]
                check(rule_id, not split, lambda: (
                    f"evict({num_tokens}) removed part of a segment: {_page(split[0])} without the page "
                    "before it in its segment"))
        model.remove(removed)
        self._judge_state(view, "KV-TREE-007")

    def window_guarded(self) -> set[PageKey]:
        """The pages whose window KV a held lock protects (KV-TREE-019)."""
        assert self.model is not None
        return {key for req in self.requests.values() for key in self.model.window_locked(req.locked)}

    def _component_eviction(self, operation: str, amount: int, rule_id: str, held: str, regain: str
                            ) -> tuple[int, TreeView, dict[PageKey, PageView], list[PageKey], list[PageKey]]:
        """Call ``operation(amount)``, an eviction of one component's content (``held``: the page
        flag saying a page has it), and judge what every such eviction promises: it adds no page and
        gives no page the content back (``rule_id``), removes no locked page (KV-TREE-005) and
        leaves a tree. Returns what it reported, the view after it, the pages shown, the pages
        removed and the pages that lost the content (removed ones included)."""
        assert self.model is not None
        model, check = self.model, self.verdicts.check
        reported = self.call(operation, amount, rule=rule_id)
        view = self._observe()
        shown = {(p.namespace, tuple(p.tokens)): p for p in view.pages}
        removed = [key for key in model.pages if key not in shown]
        added = sorted(set(shown) - set(model.pages))
        check(rule_id, not added, lambda: f"{operation}({amount}) added pages {'; '.join(map(_page, added[:4]))}")
        dropped = [key for key, page in model.pages.items()
                   if getattr(page, held) and (key not in shown or not getattr(shown[key], held))]
        regained = [key for key, page in model.pages.items()
                    if not getattr(page, held) and key in shown and getattr(shown[key], held)]
        check(rule_id, not regained, lambda: f"{operation}({amount}) gave {_page(regained[0])} {regain}")
        locked = [key for key in removed if model.pages[key].locks]
        check("KV-TREE-005", not locked, lambda: (
            f"{operation}({amount}) removed locked pages: " + "; ".join(
                f"{_page(k)} ({model.pages[k].locks} locks)" for k in locked[:3])))
        self._judge_shape(view)
        return reported, view, shown, removed, dropped

    def _evict_window(self, num_tokens: int) -> None:
        """``evict_window(num_tokens)``, judged (KV-TREE-018, with 005, 006 and 019); the model
        follows it."""
        assert self.model is not None
        model, size, check = self.model, self.page_size, self.verdicts.check
        guarded = self.window_guarded()
        order = model.window_eviction_order({key for req in self.requests.values() for key in req.pinned})
        before = self._observe()
        reported, view, shown, removed, dropped = self._component_eviction(
            "evict_window", num_tokens, "KV-TREE-018", "windowed", "its window KV back")
        hit_locks = [key for key in dropped if key in guarded]
        check("KV-TREE-019", not hit_locks, lambda: (
            f"evict_window({num_tokens}) dropped the window KV of {_page(hit_locks[0])}, inside a held lock's "
            f"window of {model.window} tokens"))
        inner = [key for key in removed if any(model.parent(other) == key for other in shown)]
        # The cache's own account says what it may evict: at most what lies outside the locked
        # windows, at least the window KV of pages no lock runs through.
        evictable = before.window_evictable if before.window_evictable is not None else 0
        unguarded = sum(size for key, page in model.pages.items() if page.windowed and key not in guarded)
        free_of_locks = sum(size for page in model.pages.values() if page.windowed and not page.locks)
        check("KV-TREE-018", free_of_locks <= evictable <= unguarded, lambda: (
            f"before evict_window({num_tokens}) the cache counted {evictable} window tokens evictable; "
            f"{free_of_locks} are in pages no lock runs through and {unguarded} outside the locked windows"))
        count = len(dropped) * size
        ok = spec.window_eviction_ok(num_tokens, evictable, count, reported, len(hit_locks), len(inner))
        check("KV-TREE-018", ok, lambda: (
                       f"evict_window({num_tokens}) reported {reported} window tokens and dropped {count} "
                       f"({len(dropped)} pages, {len(removed)} of them removed"
                       + (f", {len(inner)} with a held child: {_page(inner[0])}" if inner else "")
                       + f"); {evictable} window tokens were evictable"))
        # Last: window KV dropped inside a locked window lies outside the order, and is KV-TREE-019's.
        self._judge_order("evict_window", num_tokens, order, dropped, "window KV")
        model.remove(removed)
        model.drop_window([key for key in dropped if key not in removed])
        self._judge_state(view, "KV-TREE-018")

    def _judge_order(self, operation: str, amount: int, order: list[PageKey], dropped: list[PageKey],
                     content: str) -> None:
        """Whether a component eviction dropped the first pages of the model's order (KV-TREE-028/029 for
        window KV, by the recency the engine declares; KV-TREE-030 for states), and with segment
        recency whole segments of window KV."""
        assert self.model is not None
        model, recency = self.model, self.verdicts.capabilities.tree_recency
        if recency not in spec.RECENCY_MODES:
            return
        rule_id = ("KV-TREE-030" if content == "states" else
                   "KV-TREE-028" if recency == spec.PAGE_RECENCY else "KV-TREE-029")
        index = {key: i for i, key in enumerate(order)}

        def stamp(key: PageKey) -> str:
            page = model.pages[key]
            return f"{_page(key)} (stamp {page.state_stamp if content == 'states' else page.window_stamp})"

        self.verdicts.check(rule_id, spec.drops_an_order_prefix(tuple(index.get(k, -1) for k in dropped),
                                                                 tuple(range(len(order)))), lambda: (
            f"{operation}({amount}) dropped the {content} of {len(dropped)} pages: "
            f"{'; '.join(map(stamp, sorted(dropped, key=lambda k: index.get(k, -1))[:4]))}; the least recently "
            f"used ({recency} recency) are: {'; '.join(map(stamp, order[:max(len(dropped), 1)][:4]))}"))
        if rule_id == "KV-TREE-029":
            cut = [key for key in order[len(dropped):len(dropped) + 1]
                   if not model.pages[key].starts_segment and model.parent(key) in dropped]
            self.verdicts.check(rule_id, not cut, lambda: (
                f"{operation}({amount}) dropped part of a segment's window KV: not that of {_page(cut[0])}, "
                "whose page before it in its segment lost it"))

    def state_guarded(self) -> set[PageKey]:
        """The pages whose state a held lock protects (KV-TREE-025)."""
        assert self.model is not None
        return {key for req in self.requests.values() for key in self.model.state_locked(req.locked)}

    def state_free(self) -> int:
        """The state slots the model has free (requests hold none between steps)."""
        assert self.setup is not None and self.model is not None
        return self.setup.states - self.model.state_count()

    def _evict_states(self, num_states: int) -> None:
        """``evict_states(num_states)``, judged (KV-TREE-024, with 005, 006 and 025); the model follows it."""
        assert self.model is not None
        model, check = self.model, self.verdicts.check
        guarded = self.state_guarded()
        evictable = sum(1 for key, page in model.pages.items() if page.state and key not in guarded)
        order = model.state_eviction_order(guarded)
        reported, view, shown, removed, dropped = self._component_eviction(
            "evict_states", num_states, "KV-TREE-024", "state", "a state")
        hit_locks = [key for key in dropped if key in guarded]
        check("KV-TREE-025", not hit_locks, lambda: (
            f"evict_states({num_states}) dropped the state of {_page(hit_locks[0])}, the end of a held lock's path"))
        inner = [key for key in removed if any(model.parent(other) == key for other in shown)]
        keys = list(model.pages)
        index = {key: i for i, key in enumerate(keys)}
        parents = tuple(index.get(model.parent(key), -1) for key in keys)
        had = tuple(model.pages[key].state for key in keys)
        allowed = spec.state_removals_ok(parents, had, tuple(index[k] for k in removed),
                                         tuple(index[k] for k in dropped))
        stray = [] if allowed else [key for key in removed if key not in dropped and (
            model.pages[key].state or not any(model.parent(other) == key for other in removed))] or removed
        ok = spec.state_eviction_ok(num_states, evictable, len(dropped), reported, len(hit_locks), len(inner),
                                    len(stray))
        check("KV-TREE-024", ok, lambda: (
            f"evict_states({num_states}) reported {reported} states and dropped {len(dropped)} "
            f"({len(removed)} pages removed"
            + (f", {len(inner)} with a held child: {_page(inner[0])}" if inner else "")
            + (f", {_page(stray[0])} neither holding a dropped state nor above one" if stray else "")
            + f"); {evictable} states were held outside the locked paths' ends"))
        # Last: a locked path's end state lies outside the order, and dropping it is KV-TREE-025's.
        self._judge_order("evict_states", num_states, order, dropped, "states")
        model.remove(removed)
        model.drop_states([key for key in dropped if key not in removed])
        self._judge_state(view, "KV-TREE-024")

    def _forward(self, handle: int, req: Request, row: list[int]) -> None:
        """The model runner's forward pass over the request's row (an engine in a paged KV store):
        it reads the tokens the cache gave, writes the others; then the store's verdicts."""
        self.call("forward", handle, req.namespace, req.tokens, tuple(row), req.protected, rule="KV-DATA-003")
        self._judge_data(self._observe())

    # -- observing and judging ---------------------------------------------------------------------
    @property
    def stores_kv(self) -> bool:
        """Whether the engine keeps a paged KV store (``kv_data``): it offers ``forward`` and its
        observations carry the store's verdicts."""
        return self.verdicts.capabilities.kv_data

    def _observe(self) -> TreeView:
        return self.call("observe", rule="KV-TREE-010")

    def _judge_data(self, view: TreeView) -> None:
        """The store's verdicts (KV-DATA-001 .. 004), recorded like the suite's own checks."""
        for rule_id, ok, message in view.data_checks or ():
            self.verdicts.check(rule_id, ok, message)

    def _judge_shape(self, view: TreeView) -> None:
        assert self.model is not None
        shown = {(p.namespace, tuple(p.tokens)) for p in view.pages}
        orphans = [key for key in shown if self.model.parent(key) is not None and self.model.parent(key) not in shown]
        self.verdicts.check("KV-TREE-006", not orphans, lambda: (
            f"the cache holds {_page(orphans[0])} but not the page before it"))

    def _judge_state(self, view: TreeView, content_rule: str) -> None:
        assert self.model is not None
        self._judge_data(view)
        model, check = self.model, self.verdicts.check
        pages = {(p.namespace, tuple(p.tokens)): p for p in view.pages}
        check(content_rule, spec.same_content(tuple((key, page.slots) for key, page in model.pages.items()),
                                              tuple(((p.namespace, tuple(p.tokens)), tuple(p.slots))
                                                    for p in view.pages)),
              lambda: _content_difference(model.pages, pages, len(view.pages)))
        self._judge_shape(view)
        counts = [key for key, page in pages.items() if page.locks != model.pages[key].locks]
        check("KV-TREE-014", not counts, lambda: (
            f"page {_page(counts[0])} counts {pages[counts[0]].locks} locks; "
            f"{model.pages[counts[0]].locks} held locks run through it"))
        evictable, protected = model.sizes()
        check("KV-TREE-011", (view.evictable, view.protected) == (evictable, protected), lambda: (
            f"the cache reports {view.evictable} evictable and {view.protected} protected tokens; it holds "
            f"{evictable} tokens in unlocked pages and {protected} in locked ones"))
        held = len(self.held_by_requests())
        check("KV-TREE-010", spec.capacity_balances(view.free_slots, model.cached_tokens(), held, self.capacity),
              lambda: (f"{view.free_slots} free slots + {model.cached_tokens()} held by the cache + {held} held by "
                       f"requests != capacity {self.capacity}"))
        if model.window:
            self._judge_window(view, pages, "KV-TREE-020" if content_rule == "KV-TREE-012" else content_rule)
        if model.states:
            self._judge_states(view, pages, "KV-TREE-026" if content_rule == "KV-TREE-012" else content_rule)

    def _judge_states(self, view: TreeView, pages: dict, flag_rule: str) -> None:
        """A cache with a state component: which pages hold a state (the step's rule), the locked
        paths' last states (KV-TREE-025) and the state slots (KV-TREE-027)."""
        assert self.model is not None and self.setup is not None
        model, check = self.model, self.verdicts.check
        flags = [key for key, page in pages.items() if bool(page.state) != model.pages[key].state]
        check(flag_rule, not flags, lambda: (
            f"page {_page(flags[0])} {'holds' if pages[flags[0]].state else 'lacks'} a state; "
            f"kvoracle expects it to {'hold' if model.pages[flags[0]].state else 'lack'} one"))
        guarded = self.state_guarded()
        bare = sorted(key for key in guarded if key in pages and not pages[key].state)
        check("KV-TREE-025", not bare, lambda: f"page {_page(bare[0])} lacks its state, the end of a held lock's path")
        held = model.state_count()
        ends = sum(1 for key in guarded if key in model.pages and model.pages[key].state)
        free = view.state_free if view.state_free is not None else -1
        evictable = view.state_evictable if view.state_evictable is not None else -1
        protected = view.state_protected if view.state_protected is not None else -1
        check("KV-TREE-027", min(free, evictable, protected) >= 0 and spec.state_slots_balance(
            free, held, 0, self.setup.states, evictable, protected, ends), lambda: (
            f"{free} free state slots + {held} held by the cache's pages should be the state capacity "
            f"{self.setup.states}, and the cache's account ({view.state_evictable} evictable, "
            f"{view.state_protected} protected) {held - ends} evictable and {ends} protected (the ends of "
            "held locks' paths)"))

    def _judge_window(self, view: TreeView, pages: dict, flag_rule: str) -> None:
        """A cache with a window component: which pages hold window KV (the step's rule), the locked
        windows (KV-TREE-019) and the window slots (KV-TREE-021)."""
        assert self.model is not None
        model, check = self.model, self.verdicts.check
        flags = [key for key, page in pages.items() if bool(page.windowed) != model.pages[key].windowed]
        check(flag_rule, not flags, lambda: (
            f"page {_page(flags[0])} {'holds' if pages[flags[0]].windowed else 'lacks'} its window KV; "
            f"kvoracle expects it to {'hold' if model.pages[flags[0]].windowed else 'lack'} it"))
        bare = sorted(key for key in self.window_guarded() if key in pages and not pages[key].windowed)
        check("KV-TREE-019", not bare, lambda: (
            f"page {_page(bare[0])} lacks its window KV inside a held lock's window of {model.window} tokens"))
        held = len(self.held_by_requests())
        windowed = model.windowed_tokens()
        free = view.window_free if view.window_free is not None else -1
        account = (view.window_evictable or 0) + (view.window_protected or 0)
        check("KV-TREE-021", free >= 0 and spec.window_slots_balance(free, windowed, held, self.capacity, account),
              lambda: (f"{free} free window slots + {windowed} held by the cache's pages with window KV + {held} "
                       f"held by requests should be the window capacity {self.capacity}, and the cache's account "
                       f"of its window tokens ({view.window_evictable} evictable + {view.window_protected} "
                       f"protected) {windowed}"))


# -- the machine -------------------------------------------------------------------------------------
@st.composite
def tree_setups(draw: st.DrawFn) -> TreeSetup:
    """A page size, a small capacity (so that requests evict), and prompts that share prefixes."""
    page_size = draw(st.sampled_from([1, 1, 2, 4]), label="page_size")
    num_pages = draw(st.integers(4, 24), label="num_pages")
    tokens = st.lists(st.integers(0, 2), max_size=3 * page_size)
    stem = draw(st.lists(st.integers(0, 2), min_size=2 * page_size, max_size=5 * page_size), label="stem")
    prompts = []
    for _ in range(draw(st.integers(1, 5), label="prompts")):
        # Often past the first page: a lookup that matches a stored segment's first page and parts
        # from it inside a later one.
        past_first = st.integers(page_size + 1, len(stem)) if len(stem) > page_size + 1 else st.nothing()
        shared = draw(st.integers(0, len(stem)) | past_first, label="shared")
        own = draw(tokens, label="own")
        if shared < len(stem) and draw(st.booleans(), label="diverge"):
            # Part from the stem right after the shared tokens, mostly inside a page: a lookup of
            # one prompt then ends inside what another one stored.
            own = [(stem[shared] + draw(st.integers(1, 2), label="other token")) % 3, *own]
        prompts.append(tuple(stem[:shared] + own))
    return TreeSetup(page_size, num_pages, tuple(prompts))


def window_sizes(page_size: int) -> st.SearchStrategy[int]:
    """Window sizes at and around page boundaries: a page, one less and one more, two and three
    pages, a single token."""
    return st.sampled_from(sorted({w for w in (1, page_size - 1, page_size, page_size + 1, 2 * page_size - 1,
                                               2 * page_size, 2 * page_size + 1, 3 * page_size) if w > 0}))


class PrefixTreeMachine(SuiteMachine):
    """Requests arriving, computing, checkpointing, finishing and aborting; lookups; evictions."""

    driver: TreeDriver
    #: The engine has a window component (machine option): setups draw a window size, and
    #: evictions are of window KV half of the time.
    windows = False
    #: ... and it also runs without one (setups draw no window half of the time).
    windowless_too = False
    #: The engine has a state component (machine option): setups draw state slots, and evictions
    #: are of states half of the time.
    state_slots = False

    def __init__(self) -> None:
        super().__init__()
        self.next_handle = 0

    def _alive(self) -> bool:
        return self.driver.setup is not None and not self.driver.dead

    def _handle(self) -> int:
        self.next_handle += 1
        return self.next_handle

    @initialize(setup=tree_setups())
    def configure(self, setup: TreeSetup) -> None:
        self.driver.apply(setup)

    def _prompt(self, data: st.DataObject) -> tuple[int, int, int | None]:
        """A prompt, a namespace, and mostly the whole prompt, else a prefix of it (a lookup that
        ends inside what an earlier request stored)."""
        prompts = self.driver.setup.prompts
        prompt = data.draw(st.integers(0, len(prompts) - 1), label="prompt")
        namespace = data.draw(st.sampled_from([0, 0, 0, 0, 1, 2]), label="namespace")
        size = self.driver.page_size
        length = data.draw(st.none() | st.none() | st.integers(min(size, len(prompts[prompt])), len(prompts[prompt])),
                           label="length")
        return prompt, namespace, length

    @precondition(lambda self: self._alive() and len(self.driver.requests) < 4)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        self.driver.apply(Arrive(self._handle(), *self._prompt(data)))

    @precondition(lambda self: self._alive())
    @rule(data=st.data())
    def serve(self, data: st.DataObject) -> None:
        self.driver.apply(Serve(self._handle(), *self._prompt(data)))

    @precondition(lambda self: self._alive() and len(self.driver.requests) < 3)
    @rule(data=st.data())
    def twins(self, data: st.DataObject) -> None:
        """Two requests of one prompt computing side by side (parallel sampling): whichever
        inserts second finds its tokens held and frees its duplicates (KV-TREE-012)."""
        prompt = self._prompt(data)
        first, second = self._handle(), self._handle()
        for request in (first, second):
            self.driver.apply(Arrive(request, *prompt))
        for request in (first, second):
            if request in self.driver.requests:
                self.driver.apply(Compute(request))

    @precondition(lambda self: self._alive())
    @rule(data=st.data())
    def peek(self, data: st.DataObject) -> None:
        self.driver.apply(Peek(self._handle(), *self._prompt(data)))

    @precondition(lambda self: self._alive() and bool(self.driver.live(computed=False)))
    @rule(data=st.data())
    def compute(self, data: st.DataObject) -> None:
        self.driver.apply(Compute(data.draw(st.sampled_from(self.driver.live(computed=False)), label="request")))

    @precondition(lambda self: self._alive() and bool(self.driver.live(computed=True)))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self.driver.apply(Finish(data.draw(st.sampled_from(self.driver.live(computed=True)), label="request")))

    @precondition(lambda self: self._alive() and bool(self.driver.live(computed=True)))
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        self.driver.apply(Checkpoint(data.draw(st.sampled_from(self.driver.live(computed=True)), label="request")))

    @precondition(lambda self: self._alive() and bool(self.driver.live()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.driver.apply(Abort(data.draw(st.sampled_from(self.driver.live()), label="request")))

    @precondition(lambda self: self._alive())
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        # Mostly a page or two: a small eviction shows the order; sometimes anything up to all.
        size = self.driver.page_size
        small = st.sampled_from([0, size, size, 2 * size])
        count = st.one_of(small, small, small, st.integers(0, self.driver.capacity))
        if self.windows and self.driver.setup.window and data.draw(st.booleans(), label="window KV"):
            self.driver.apply(EvictWindow(data.draw(count, label="num_tokens")))
            return
        if self.state_slots and self.driver.setup.states and data.draw(st.booleans(), label="states"):
            few = st.sampled_from([0, 1, 1, 2])
            self.driver.apply(EvictStates(data.draw(few | st.integers(0, self.driver.setup.states),
                                                    label="num_states")))
            return
        self.driver.apply(Evict(data.draw(count, label="num_tokens")))

    @rule()
    def idle(self) -> None:
        pass  # lets Hypothesis finish an example whose engine is dead


@initialize(setup=tree_setups(), data=st.data())
def configure_with_window(self: PrefixTreeMachine, setup: TreeSetup, data: st.DataObject) -> None:
    """The machine's ``configure`` for an engine with a window component (:func:`machine_options`
    puts it in place of the plain one, whose draws it leaves alone for every other engine)."""
    sizes = st.just(0) | window_sizes(setup.page_size) if self.windowless_too else window_sizes(setup.page_size)
    self.driver.apply(attrs.evolve(setup, window=data.draw(sizes, label="window")))


#: State capacities a setup draws: more than the four locks requests can hold, so that an insertion
#: always finds a state to evict (:meth:`TreeDriver._insert`), and few enough to evict often.
STATE_SLOTS = (5, 6, 8)


@initialize(setup=tree_setups(), data=st.data())
def configure_with_states(self: PrefixTreeMachine, setup: TreeSetup, data: st.DataObject) -> None:
    """The machine's ``configure`` for an engine with a state component (and none for windows)."""
    self.driver.apply(attrs.evolve(setup, states=data.draw(st.sampled_from(STATE_SLOTS), label="states")))


@initialize(setup=tree_setups(), data=st.data())
def configure_with_components(self: PrefixTreeMachine, setup: TreeSetup, data: st.DataObject) -> None:
    """The machine's ``configure`` for an engine that takes either component (the reference): a window
    as :func:`configure_with_window` draws it, and where it draws none, mostly state slots."""
    window = data.draw(st.just(0) | window_sizes(setup.page_size), label="window")
    states = 0 if window else data.draw(st.sampled_from((0, *STATE_SLOTS)), label="states")
    self.driver.apply(attrs.evolve(setup, window=window, states=states))


def _tombstone_lookups(machine: PrefixTreeMachine) -> list[tuple[int, int, int]]:
    """``(prompt, namespace, length)`` of a lookup ending on each held page without its window KV
    (a page's tokens are always a prefix of a prompt: requests insert prompt prefixes)."""
    driver = machine.driver
    assert driver.setup is not None and driver.model is not None
    prompts = driver.setup.prompts
    found = []
    for (namespace, tokens), page in sorted(driver.model.pages.items()):
        if not page.windowed:
            prompt = next((p for p, whole in enumerate(prompts) if whole[:len(tokens)] == tokens), None)
            if prompt is not None:
                found.append((prompt, namespace, len(tokens)))
    return found


@precondition(lambda self: self._alive() and bool(self.driver.model.window))
@rule(data=st.data())
def look_up_a_tombstone(self: PrefixTreeMachine, data: st.DataObject) -> None:
    """A lookup that ends on a page held without its window KV, so that the hit must end before it
    (KV-TREE-017), after an eviction of window KV where no page lacks it yet; half of the time a
    request that locks it, and may go on to compute and insert over the page (KV-TREE-019, 020).
    Only engines with a window component draw it."""
    if not _tombstone_lookups(self):
        size = self.driver.page_size
        count = st.sampled_from([size, 2 * size, 4 * size]) | st.integers(0, self.driver.capacity)
        self.driver.apply(EvictWindow(data.draw(count, label="num_tokens")))
        if not self._alive() or not _tombstone_lookups(self):
            return
    prompt, namespace, length = data.draw(st.sampled_from(_tombstone_lookups(self)), label="tombstone")
    if len(self.driver.requests) < 4 and data.draw(st.booleans(), label="arrive"):
        self.driver.apply(Arrive(self._handle(), prompt, namespace, length))
        return
    self.driver.apply(Peek(self._handle(), prompt, namespace, length))


def _past_state_lookups(machine: PrefixTreeMachine) -> list[tuple[int, int, int]]:
    """``(prompt, namespace, length)`` of a lookup ending on each held page without a state that lies
    past a page with one: its hit is the earlier state's, shorter than the held prefix (KV-TREE-023)."""
    driver = machine.driver
    assert driver.setup is not None and driver.model is not None
    model, prompts = driver.model, driver.setup.prompts
    found = []
    for key, page in sorted(model.pages.items()):
        above, earlier = model.parent(key), False
        while above is not None and not earlier:
            earlier, above = model.pages[above].state, model.parent(above)
        if not page.state and earlier:
            namespace, tokens = key
            prompt = next((p for p, whole in enumerate(prompts) if whole[:len(tokens)] == tokens), None)
            if prompt is not None:
                found.append((prompt, namespace, len(tokens)))
    return found


@precondition(lambda self: self._alive() and bool(self.driver.model.states))
@rule(data=st.data())
def look_up_past_a_state(self: PrefixTreeMachine, data: st.DataObject) -> None:
    """A lookup that ends on a held page without a state past one with a state, so that the hit must
    end at the earlier state (KV-TREE-023), after an eviction of states (one, two, or any number up
    to all: KV-TREE-024, 025) where no such page is held yet; half of the time a request that locks
    the hit. Only engines with a state component draw it."""
    if not _past_state_lookups(self):
        count = st.sampled_from([1, 2]) | st.integers(0, self.driver.setup.states)
        self.driver.apply(EvictStates(data.draw(count, label="num_states")))
        if not self._alive() or not _past_state_lookups(self):
            return
    prompt, namespace, length = data.draw(st.sampled_from(_past_state_lookups(self)), label="past a state")
    if len(self.driver.requests) < 4 and data.draw(st.booleans(), label="arrive"):
        self.driver.apply(Arrive(self._handle(), prompt, namespace, length))
        return
    self.driver.apply(Peek(self._handle(), prompt, namespace, length))


def _lookups_through_a_state(machine: PrefixTreeMachine) -> list[tuple[int, int, int]]:
    """``(prompt, namespace, length)`` of a lookup ending on each held page with two or more pages holding a
    state on its path (itself included): its hit ends at the last of them and passes the others."""
    driver = machine.driver
    assert driver.setup is not None and driver.model is not None
    model, prompts = driver.model, driver.setup.prompts
    found = []
    for key, page in sorted(model.pages.items()):
        states, above = int(page.state), model.parent(key)
        while above is not None and states < 2:
            states, above = states + model.pages[above].state, model.parent(above)
        if states >= 2:
            namespace, tokens = key
            prompt = next((p for p, whole in enumerate(prompts) if whole[:len(tokens)] == tokens), None)
            if prompt is not None:
                found.append((prompt, namespace, len(tokens)))
    return found


@precondition(lambda self: self._alive() and bool(self.driver.model.window or self.driver.model.states))
@rule(data=st.data())
def look_up_then_evict(self: PrefixTreeMachine, data: st.DataObject) -> None:
    """A lookup, then an eviction of one page's window KV (a cache with a window component) or of one
    state: what a component eviction takes first depends on what the lookups before it used
    (KV-TREE-028 .. 030). Only engines with a window or a state component draw it.

    With states, half of the lookups (where the tree holds one) pass a state before the one their hit
    ends at, which they must not refresh (KV-TREE-030); and the state goes only where two or more are
    evictable: with fewer the eviction shows no order, and a state evicted every time kept the pool from
    filling (seed 0, 300 examples: 658 of 679 such evictions found at most one state, and no eviction
    could tell a state order by path from the right one)."""
    through = _lookups_through_a_state(self) if self.driver.model.states else []
    if through and data.draw(st.booleans(), label="through a state"):
        lookup = data.draw(st.sampled_from(through), label="lookup")
    else:
        lookup = self._prompt(data)
    self.driver.apply(Peek(self._handle(), *lookup))
    if not self._alive():
        return
    if self.driver.model.window:
        self.driver.apply(EvictWindow(self.driver.page_size))
    elif len(self.driver.model.state_eviction_order(self.driver.state_guarded())) >= 2:
        self.driver.apply(EvictStates(1))


def machine_options(probe: object) -> dict[str, object]:
    """The prefix-tree machine's options for an adapter: a window component (``window_component``)
    draws a window in each setup, evictions of window KV, and lookups aimed at pages without their
    window KV (:func:`look_up_a_tombstone`); a state component (``state_component``) draws state
    slots, evictions of states and lookups that end past a state (:func:`look_up_past_a_state`); an
    adapter with both draws one or the other (or neither) per setup. Other adapters' machines are
    the plain one. Either component also draws a lookup followed by a small eviction of it
    (:func:`look_up_then_evict`)."""
    windows, states = getattr(probe, "window_component", False), getattr(probe, "state_component", False)
    options: dict[str, object] = {"look_up_then_evict": look_up_then_evict} if windows or states else {}
    if windows:
        options.update({"windows": True, "windowless_too": bool(getattr(probe, "window_optional", False)),
                        "configure": configure_with_window, "look_up_a_tombstone": look_up_a_tombstone})
    if states:
        options.update({"state_slots": True, "configure": configure_with_components if windows
                        else configure_with_states, "look_up_past_a_state": look_up_past_a_state})
    return options


def _content_difference(expected: dict, pages: dict, listed: int) -> str:
    """What differs between the pages kvoracle expects and those the cache lists (KV-TREE-013's message)."""
    missing = [key for key in expected if key not in pages]
    extra = [key for key in pages if key not in expected]
    if missing or extra or len(pages) != listed:
        return (f"the cache holds {listed} pages; kvoracle expects {len(expected)}: "
                + (f"missing {'; '.join(map(_page, missing[:3]))} " if missing else "")
                + (f"unexpected {'; '.join(map(_page, extra[:3]))}" if extra else "")
                + ("" if missing or extra else "a page is listed twice"))
    moved = next(key for key, page in pages.items() if tuple(page.slots) != expected[key].slots)
    return f"page {_page(moved)} is held in slots {list(pages[moved].slots)}, not {list(expected[moved].slots)}"
