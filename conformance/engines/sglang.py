"""SGLang's real radix prefix cache behind the prefix-tree suite's protocol.

:class:`SGLangRadixCache` builds, per configuration, SGLang 0.5.23's ``RadixCache`` over its
real token allocator -- ``TokenToKVPoolAllocator`` for a page size of 1,
``PagedTokenToKVPoolAllocator`` above -- on the CPU, with no KV tensors (``kvcache=None``: the
cache and the allocator only move indices) and LRU eviction, and calls them as SGLang's
scheduler does: ``match_prefix`` / ``inc_lock_ref`` / ``insert`` / ``dec_lock_ref`` / ``evict``,
``alloc`` / ``free`` on the allocator. Namespaces map to ``extra_key`` (0: none, ``k``:
``"ns{k}"``). ``observe`` walks the tree: every node's key and value, cut into pages, with the
node's ``lock_ref``.

SGLang keeps recency per radix node, so the adapter declares ``tree_recency="segment"``
(KV-TREE-009). Its clock is kvoracle's logical one (:mod:`.sglang_import`). SGLang is
imported when the adapter is built, never when this module is: ``kvoracle.conformance``
imports without SGLang installed.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from ..harness.capabilities import Capabilities
from ..prefix_tree_protocol import PageView, TreeSetup, TreeView
from .sglang_import import SGLangAPI, import_sglang


def extra_key(namespace: int) -> str | None:
    return None if namespace == 0 else f"ns{namespace}"


def namespace_of(key: str | None) -> int:
    if key is None:
        return 0
    if not key.startswith("ns") or not key[2:].isdigit():
        raise ValueError(f"a tree node's extra_key {key!r} is none kvoracle gave (ns<k>)")
    return int(key[2:])


class SGLangRadixCache:
    """SGLang 0.5.23's ``RadixCache`` and its token allocator."""

    name = "sglang"
    #: SGLang's eviction policy (``CacheInitParams.eviction_policy``).
    eviction_policy = "lru"

    def __init__(self) -> None:
        self.api: SGLangAPI = import_sglang()
        self.cache: Any = None
        self.allocator: Any = None
        self.page_size = 1
        self.found: dict[int, Any] = {}
        self.locked: dict[int, Any] = {}

    def version(self) -> str:
        return self.api.version

    def capabilities(self) -> Capabilities:
        return Capabilities(tree_recency="segment")

    # -- building ----------------------------------------------------------------------------------
    def make_allocator(self, setup: TreeSetup) -> Any:
        api, size = self.api, setup.num_pages * setup.page_size
        if setup.page_size == 1:
            return api.TokenToKVPoolAllocator(size, api.torch.float16, "cpu", None, False)
        return api.PagedTokenToKVPoolAllocator(size, setup.page_size, api.torch.float16, "cpu", None, False)

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        params = self.api.CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                                          page_size=page_size, eviction_policy=self.eviction_policy)
        return self.api.RadixCache(params)

    def configure(self, setup: TreeSetup) -> None:
        self.page_size = setup.page_size
        self.allocator = self.make_allocator(setup)
        self.cache = self.make_cache(self.allocator, setup.page_size)
        self.found, self.locked = {}, {}

    def key(self, namespace: int, tokens: Sequence[int]) -> Any:
        return self.api.RadixKey(array("q", tokens), extra_key(namespace))

    def tensor(self, slots: Sequence[int]) -> Any:
        return self.api.torch.tensor(list(slots), dtype=self.api.torch.int64)

    # -- the protocol ------------------------------------------------------------------------------
    def match(self, handle: int, namespace: int, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        result = self.cache.match_prefix(self.match_params(handle, namespace, tokens))
        node = result.last_device_node
        self.found[handle] = node
        return int(result.device_prefix_len), tuple(int(s) for s in self.cache.path_device_indices(node).tolist())

    def match_params(self, handle: int, namespace: int, tokens: Sequence[int]) -> Any:
        return self.api.MatchPrefixParams(key=self.key(namespace, tokens))

    def lock(self, handle: int) -> None:
        node = self.found[handle]
        self.cache.inc_lock_ref(node)
        self.locked[handle] = node

    def unlock(self, handle: int) -> None:
        self.cache.dec_lock_ref(self.locked.pop(handle))

    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        result = self.cache.insert(self.insert_params(handle, namespace, tokens, slots))
        self.found[handle] = result.last_device_node
        #: The last insertion's ``InsertResult`` (an adapter with a state component reads ``mamba_exist``).
        self.insert_result = result
        return int(result.prefix_len)

    def insert_params(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> Any:
        return self.api.InsertParams(key=self.key(namespace, tokens), value=self.tensor(slots))

    def alloc(self, num_tokens: int) -> tuple[int, ...] | None:
        slots = self.allocator.alloc(num_tokens)
        return None if slots is None else tuple(int(s) for s in slots.tolist())

    def free(self, slots: Sequence[int]) -> None:
        self.allocator.free(self.tensor(slots))

    def evict(self, num_tokens: int) -> int:
        return int(self.cache.evict(self.api.EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def observe(self) -> TreeView:
        return TreeView(self.pages(), int(self.cache.evictable_size()), int(self.cache.protected_size()),
                        int(self.allocator.available_size()))

    def pages(self) -> tuple[PageView, ...]:
        """Every page of the tree, read node by node from the root."""
        pages: list[PageView] = []
        size = self.page_size
        stack = [(child, ()) for child in self.cache.root_node.children.values()]
        while stack:
            node, before = stack.pop()
            key, value, locks = self.node_parts(node)
            tokens = tuple(int(t) for t in key.token_ids[:len(key)])
            slots = () if value is None else tuple(int(s) for s in value.tolist())
            namespace = namespace_of(key.extra_key)
            windowed, state = self.node_windowed(node), self.node_state(node)
            state_slot = self.node_state_slot(node) if state else None
            for start in range(0, len(tokens), size):
                last = start + size >= len(tokens)
                pages.append(PageView(namespace, before + tokens[:start + size], slots[start:start + size],
                                      int(locks), windowed, state and last, state_slot if last else None))
            stack.extend((child, before + tokens) for child in node.children.values())
        return tuple(pages)

    def node_windowed(self, node: Any) -> bool:
        """Whether a radix node holds window KV (a cache without a window component: always)."""
        return True

    def node_state(self, node: Any) -> bool:
        """Whether a radix node holds a state at its end (a cache without a state component: never)."""
        return False

    def node_state_slot(self, node: Any) -> int | None:
        """The state slot of a radix node's state (a cache without a state component: none)."""
        return None

    def node_parts(self, node: Any) -> tuple[Any, Any, int]:
        """A radix node's key (a ``RadixKey``), its slots (a tensor, ``None`` when it holds none) and
        its lock count."""
        return node.key, node.value, node.lock_ref
