"""SGLang's ``UnifiedRadixCache`` (what SGLang 0.5.23's scheduler builds) behind the prefix-tree
suite's protocol, with its FULL component alone.

:class:`SGLangUnifiedRadixCache` builds ``UnifiedRadixCache`` with ``tree_components=(FULL,)``
over the same real token allocators, on the CPU and without KV tensors, as
:class:`~.sglang.SGLangRadixCache` does for the plain ``RadixCache``, and drives it through the
calls the unified cache offers and SGLang's ``checkpoint_into_tree`` makes:

- ``match_prefix`` answers node ids (ints), not nodes; ``path_device_indices`` reads the hit's
  slots from one;
- a lock is the receipt ``lock(node_id)`` returns (``TreeLock``), and ``unlock`` takes it back;
- ``insert`` takes ``prev_prefix_len``, the tokens the request already holds from the cache
  (its hit, or what it inserted last), and *frees the request's duplicates itself*: the slots
  it was given for the held tokens past ``prev_prefix_len``. SGLang's scheduler therefore frees
  only the request's unaligned tail afterwards. The suite's driver frees the duplicates as the
  plain cache's scheduler does; the adapter passes each handle's held length, as SGLang does,
  and drops the one ``free`` that names exactly the duplicates of the last insertion (what the
  cache has freed already, or should have: a slot the cache did not free stays lost, and
  KV-TREE-010's balance shows it).

``tree_core_backend`` picks the tree core: ``"python"`` (``UnifiedTreeCore``, the Python one)
for ``sglang-unified``; :class:`SGLangUnifiedRustCore` (``sglang-unified-rust``) takes the
bundled Rust one, which SGLang selects by default where it loads (it does on CPU here).

Recency: the unified tree stamps nodes from a logical counter of its own
(``unified_cache.components.base.get_and_increase_time_counter``), never from the machine's
clock, so no clock is patched; like the plain cache it keeps one stamp per radix node, so the
adapter declares ``tree_recency="segment"`` (KV-TREE-009).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any

from ..prefix_tree_protocol import PageView, TreeSetup
from .sglang import SGLangRadixCache


class SGLangUnifiedRadixCache(SGLangRadixCache):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component, Python tree core) and its allocator."""

    name = "sglang-unified"
    #: ``CacheInitParams.tree_core_backend``.
    tree_core_backend = "python"

    def __init__(self) -> None:
        super().__init__()
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.unified_class: type = UnifiedRadixCache
        self.full = ComponentType.FULL
        self.held: dict[int, int] = {}
        self.freed_by_insert: tuple[int, ...] = ()

    # -- building ----------------------------------------------------------------------------------
    def cache_params(self, allocator: Any, page_size: int) -> Any:
        return self.api.CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                                        page_size=page_size, eviction_policy=self.eviction_policy,
                                        tree_components=(self.full,), tree_core_backend=self.tree_core_backend)

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        cache = self.unified_class(self.cache_params(allocator, page_size))
        if cache._tree_core_backend != self.tree_core_backend:
            raise RuntimeError(f"SGLang built the {cache._tree_core_backend} tree core, not the "
                               f"{self.tree_core_backend} one this adapter judges")
        return cache

    def configure(self, setup: TreeSetup) -> None:
        super().configure(setup)
        self.held, self.freed_by_insert = {}, ()

    # -- the protocol ------------------------------------------------------------------------------
    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        hit, slots = super().match(handle, namespace, tokens)
        self.held[handle] = hit
        return hit, slots

    def lock(self, handle: int) -> None:
        self.locked[handle] = self.cache.lock(self.found[handle])

    def unlock(self, handle: int) -> None:
        self.cache.unlock(self.locked.pop(handle))

    def insert_params(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> Any:
        params = super().insert_params(handle, namespace, tokens, slots)
        params.prev_prefix_len = self.held.get(handle, 0)
        return params

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        held = super().insert(handle, namespace, tokens, slots)
        self.freed_by_insert = tuple(slots[self.held.get(handle, 0):held])
        self.held[handle] = len(tokens) // self.page_size * self.page_size
        return held

    def alloc(self, num_tokens: int) -> tuple[int, ...] | None:
        self.freed_by_insert = ()
        return super().alloc(num_tokens)

    def free(self, slots: Sequence[int]) -> None:
        duplicates, self.freed_by_insert = self.freed_by_insert, ()
        if tuple(slots) != duplicates:
            super().free(slots)

    def node_parts(self, node: Any) -> tuple[Any, Any, int]:
        full = node.component(self.full)
        return node.key, full.value, full.lock_ref


#: One line of the Rust tree core's ``pretty_print``: indentation, ``[node id] key length
#: full_lock=<count> Full=<yes|no>``, then ``Swa=<yes|no>`` where the tree has a SWA component and
#: ``Mamba=<yes|no>`` where it has a MAMBA one.
_RUST_NODE = re.compile(r"^( *)\[(\d+)\] (\d+) full_lock=(\d+) Full=(yes|no)(?: Swa=(yes|no))?(?: Mamba=(yes|no))?$")


class SGLangUnifiedRustCore(SGLangUnifiedRadixCache):
    """The same cache over SGLang's bundled Rust tree core (``RustUnifiedTreeCore``).

    The Rust core's production binding shows its tree only through ``pretty_print`` (node ids,
    key lengths and FULL lock counts, indented by depth, written to the process's standard
    output) and ``get_component_device_value`` (a node's slots); it never shows a node's
    tokens. :meth:`observe` reads the shape, the slots and the locks from those, and names each
    page by the namespace and tokens this adapter inserted with the page's last slot
    (:attr:`inserted`), which is what the cache was given for that slot. A tree that paired
    tokens and slots wrongly would still be caught by the lookups (KV-TREE-002/003), not by
    the shape check.
    """

    name = "sglang-unified-rust"
    tree_core_backend = "rust"

    def configure(self, setup: TreeSetup) -> None:
        super().configure(setup)
        #: slot -> (namespace, the tokens through the slot's token) given to insert with it.
        self.inserted: dict[int, tuple[int, tuple[int, ...]]] = {}

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        held = super().insert(handle, namespace, tokens, slots)
        # Every position, the held ones too: a held slot is the cache's own (a hit) or a duplicate
        # the cache frees, unless the insertion re-fills a tombstone of a window component with it.
        for position in range(len(tokens) // self.page_size * self.page_size):
            self.inserted[int(slots[position])] = (namespace, tuple(tokens[:position + 1]))
        return held

    def tree_lines(self) -> list[str]:
        """The Rust core's ``pretty_print``, read from file descriptor 1 (Rust writes there,
        not through Python's ``sys.stdout``)."""
        with tempfile.TemporaryFile(mode="w+b") as sink:
            saved = os.dup(1)
            try:
                with contextlib.redirect_stdout(None):
                    os.dup2(sink.fileno(), 1)
                    self.cache.tree_core.pretty_print()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            sink.seek(0)
            return sink.read().decode().splitlines()

    def pages(self) -> tuple[PageView, ...]:
        """Every page of the tree, read from ``pretty_print`` and the nodes' device values (a node
        printed ``Swa=no`` is a tombstone: its pages hold no window KV; one printed ``Mamba=yes``
        holds a state at its last page)."""
        core, size = self.cache.tree_core, self.page_size
        root = core.root_node_handle()
        pages: list[PageView] = []
        for line in self.tree_lines():
            match = _RUST_NODE.match(line)
            if match is None:
                raise RuntimeError(f"unexpected line in the Rust tree core's pretty_print: {line!r}")
            node_id, locks, full, windowed = int(match[2]), int(match[4]), match[5], match[6] != "no"
            state = match[7] == "yes"
            state_slot = self.state_slot_of_node(node_id) if state else None
            if node_id == root:
                continue
            value = core.get_component_device_value(node_id, self.full) if full == "yes" else None
            slots = () if value is None else tuple(int(s) for s in value.tolist())
            for start in range(size - 1, len(slots), size):
                namespace, tokens = self.inserted.get(slots[start], (0, ()))
                last = start + 1 == len(slots)
                pages.append(PageView(namespace, tokens, slots[start - size + 1:start + 1], locks, windowed,
                                      state and last, state_slot if last else None))
        return tuple(pages)

    def state_slot_of_node(self, node_id: int) -> int | None:
        """The state slot of a node's state, by node id (a cache without a state component: none)."""
        return None
