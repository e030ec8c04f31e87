"""The prefix-tree suite's protocol: what an engine's prefix cache offers, what it shows, and the
steps that drive it.

The operations are the ones a scheduler calls on a radix prefix cache (SGLang's
``RadixCache`` and its token allocator), over plain values: token lists, namespaces as
ints (0: none; an adapter maps them to its own, e.g. SGLang's ``extra_key``), and slot
indices. ``handle`` names one lookup's place in the cache: the adapter remembers where the
last ``match`` or ``insert`` under a handle ended, ``lock(handle)`` locks that path and
``unlock(handle)`` releases the lock the handle holds (a handle holds at most one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from .harness import returns


@attrs.frozen
class PageView:
    """One page the cache holds: its namespace, the tokens from the start through the page, its
    slots, and how many held locks run through it."""

    namespace: int
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    locks: int
    #: Whether the page holds its window KV (a cache with a window component; always without one).
    windowed: bool = True
    #: Whether the page holds the state after its last token (a cache with a state component).
    state: bool = False
    #: The state slot holding that state, where the adapter names it (one that runs in a paged KV
    #: store, KV-DATA-007); ``None`` otherwise.
    state_slot: int | None = None


@attrs.frozen
class TreeView:
    """What the engine shows after a step: every page it holds, its own account of evictable and
    protected tokens, and its allocator's free slots."""

    pages: tuple[PageView, ...]
    evictable: int
    protected: int
    free_slots: int
    #: An engine in a paged KV store (capability ``kv_data``): the store's verdicts since the last
    #: observation, ``(rule id, ok, message)`` each (KV-DATA-001 .. 004); ``None`` without a store.
    data_checks: tuple[tuple[str, bool, str], ...] | None = None
    #: A cache with a window component (``TreeSetup.window > 0``): its free window slots and its own
    #: account of the window KV tokens it holds, evictable and protected (KV-TREE-018, 021).
    window_free: int | None = None
    window_evictable: int | None = None
    window_protected: int | None = None
    #: A cache with a state component (``TreeSetup.states > 0``): its free state slots and its own
    #: account of the states it holds, evictable and protected (KV-TREE-024, 027).
    state_free: int | None = None
    state_evictable: int | None = None
    state_protected: int | None = None


@runtime_checkable
class PrefixTreeAdapter(Protocol):
    """An engine's prefix cache and slot allocator, behind engine-neutral operations."""

    name: str

    def version(self) -> str: ...

    def configure(self, setup: TreeSetup) -> None:
        """A fresh, empty cache of ``setup.num_pages`` pages of ``setup.page_size`` slots."""

    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, Sequence[int]]:
        """``(hit tokens, the hit's slots)``; remembers where the hit ends under ``handle``."""

    def lock(self, handle: int) -> None:
        """Lock the path that the last ``match`` or ``insert`` under ``handle`` ended at."""

    def unlock(self, handle: int) -> None:
        """Release the lock ``handle`` holds."""

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Store the full pages of ``tokens`` (one slot per token); the tokens already held."""

    def alloc(self, num_tokens: int) -> Sequence[int] | None:
        """``num_tokens`` free slots (a multiple of the page size), or ``None`` if there are fewer."""

    def free(self, slots: Sequence[int]) -> None:
        """Give whole pages of slots back to the allocator."""

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` tokens of unlocked leaves if it can; the tokens evicted."""

    def observe(self) -> TreeView: ...

    # An adapter with a window component (``window_component = True``: it takes ``TreeSetup.window``)
    # also offers
    #
    #   evict_window(num_tokens) -> int
    #
    # drop at least ``num_tokens`` tokens of window KV outside locked windows if it can (a leaf may
    # go whole); the window tokens dropped (KV-TREE-018).
    #
    # An adapter with a state component (``state_component = True``: it takes ``TreeSetup.states``)
    # also offers
    #
    #   evict_states(num_states) -> int
    #
    # drop at least ``num_states`` states outside held locks if it can (a leaf may go whole); the
    # states dropped (KV-TREE-024). Its ``insert`` gives the cache the state after the inserted
    # tokens, from a state slot of its own that it takes back when the cache holds one there
    # already (KV-TREE-026); the driver leaves a state slot free before each insertion.
    #
    # An adapter with a state component that runs in a paged KV store (KV-DATA-007) also names its
    # state slots: ``PageView.state_slot`` for every page holding a state, and
    #
    #   state_slot(handle) -> int | None
    #
    # the state slot the last ``match`` under ``handle`` hands its request to resume from (the state
    # at the hit's last page; ``None`` for no hit); and, before the cache takes the state slot it gives
    # an insertion, it calls its attribute ``state_writer`` (when set: the store's runner) with that
    # slot, so that the runner writes the request's state into it first.
    #
    # An adapter that claims ``kv_data`` (a paged KV store around the cache) also offers
    #
    #   forward(handle, namespace, tokens, slots, start) -> None
    #
    # the model runner's forward pass of the request under ``handle``: it attends to
    # ``tokens[:start]`` through ``slots[:start]`` and writes the KV of ``tokens[start:]`` to
    # ``slots[start:len(tokens)]`` (the request's row: its hit's slots, then its own).


# -- steps -----------------------------------------------------------------------------------------
@attrs.frozen
class TreeSetup:
    """Configure the engine: the page size, the capacity in pages, and the prompts later steps
    name by index."""

    primary_rule = "KV-TREE-010"

    page_size: int
    num_pages: int
    prompts: tuple[tuple[int, ...], ...]
    #: A window component of this many tokens (a hybrid model's sliding-window layers), 0 for none;
    #: its slots are a capacity of ``num_pages * page_size`` of their own.
    window: int = 0
    #: A state component (a hybrid model's recurrent layers) with this many state slots, 0 for none.
    states: int = 0


@attrs.frozen
class Arrive:
    """Request ``request`` looks ``prompt`` (its first ``length`` tokens, all if ``None``) up in
    ``namespace`` and locks its hit."""

    primary_rule = "KV-TREE-001"

    request: int
    prompt: int
    namespace: int = 0
    length: int | None = None


@attrs.frozen
class Compute:
    """The request's tokens past its hit get slots (evicting what the allocator lacks) and are
    written."""

    primary_rule = "KV-TREE-010"

    request: int


@attrs.frozen
class Finish:
    """The request inserts its tokens, frees its duplicates and its unaligned tail, and unlocks."""

    primary_rule = "KV-TREE-012"

    request: int


@attrs.frozen
class Checkpoint:
    """A running request inserts what it computed so far, frees its duplicates and moves its
    lock to the inserted path (SGLang's ``cache_unfinished_req``)."""

    primary_rule = "KV-TREE-012"

    request: int


@attrs.frozen
class Abort:
    """The request frees the slots it holds outside the cache and unlocks."""

    primary_rule = "KV-TREE-014"

    request: int


@attrs.frozen
class Serve:
    """A whole request at once: it arrives (as :class:`Arrive`), computes and finishes."""

    primary_rule = "KV-TREE-012"

    request: int
    prompt: int
    namespace: int = 0
    length: int | None = None


@attrs.frozen
class Peek:
    """A lookup that nobody locks (a scheduler weighing a prompt, or the first ``length`` tokens
    of it)."""

    primary_rule = "KV-TREE-001"

    handle: int
    prompt: int
    namespace: int = 0
    length: int | None = None


@attrs.frozen
class Evict:
    """The scheduler asks for ``num_tokens`` tokens of the cache back."""

    primary_rule = "KV-TREE-007"

    num_tokens: int


@attrs.frozen
class EvictWindow:
    """The scheduler asks for ``num_tokens`` tokens of window KV back (a cache with a window)."""

    primary_rule = "KV-TREE-018"

    num_tokens: int


@attrs.frozen
class EvictStates:
    """The scheduler asks for ``num_states`` state slots back (a cache with a state component)."""

    primary_rule = "KV-TREE-024"

    num_states: int


STEP_NAMES = ("Abort", "Arrive", "Checkpoint", "Compute", "Evict", "EvictStates", "EvictWindow", "Finish", "Peek",
              "Serve", "TreeSetup")

_SLOTS = returns.sequence_of(returns.integer)
_PAGE = returns.attributes(PageView, namespace=returns.integer, tokens=_SLOTS, slots=_SLOTS, locks=returns.integer,
                           windowed=returns.boolean, state=returns.boolean,
                           state_slot=returns.optional(returns.integer))

#: What each operation must return.
RETURNS = {
    "match": returns.tuple_of(returns.integer, _SLOTS),
    "insert": returns.integer,
    "alloc": returns.optional(_SLOTS),
    "evict": returns.integer,
    "evict_window": returns.integer,
    "evict_states": returns.integer,
    "observe": returns.attributes(TreeView, pages=returns.sequence_of(_PAGE), evictable=returns.integer,
                                  protected=returns.integer, free_slots=returns.integer,
                                  data_checks=returns.optional(returns.sequence_of(
                                      returns.sequence_of(returns.anything, length=3))),
                                  window_free=returns.optional(returns.integer),
                                  window_evictable=returns.optional(returns.integer),
                                  window_protected=returns.optional(returns.integer),
                                  state_free=returns.optional(returns.integer),
                                  state_evictable=returns.optional(returns.integer),
                                  state_protected=returns.optional(returns.integer)),
}
OPERATIONS = ("configure", "match", "lock", "unlock", "insert", "alloc", "free", "evict", "observe")
