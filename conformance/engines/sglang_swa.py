"""SGLang's ``UnifiedRadixCache`` with its FULL and SWA components (a hybrid model's full and
sliding-window layers) behind the prefix-tree suite's protocol, window component included,
over the Python tree core (``sglang-unified-swa``) or the bundled Rust one
(``sglang-unified-swa-rust``).

:class:`SGLangUnifiedSWA` builds, per configuration, SGLang 0.5.23's ``UnifiedRadixCache`` with
``tree_components=(FULL, SWA)`` and ``sliding_window_size = TreeSetup.window`` over its real
``SWATokenToKVPoolAllocator`` (a full pool and a window pool of ``num_pages * page_size`` slots
each, paired per token by ``full_to_swa_index_mapping``), on the CPU. The allocator needs a
``SWAKVPool`` to register its mapping with, so the adapter gives it one of one head of width 1
in float16 per layer (a few hundred bytes); nothing writes to it.

The protocol's slots are the full pool's (what a page's ``PageView.slots`` and a hit's slots
are); each of them carries its window slot. The adapter calls:

- ``alloc``: ``alloc`` at page size 1, ``alloc_extend`` from an empty prefix above (the SWA
  allocator's ``alloc`` takes page size 1 only); ``free``: ``free``, which returns both slots;
- ``evict_window(n)``: ``evict(EvictParams(swa_num_tokens=n))``, answering
  ``swa_num_tokens_evicted``; ``evict(n)``: ``EvictParams(num_tokens=n)``;
- ``observe``: every node's FULL value and lock count, and whether it holds a SWA value (a node
  without one is what SGLang calls a tombstone); ``full_available_size`` as the free slots,
  ``swa_available_size`` as the free window slots, and the SWA component's evictable and
  protected sizes.

``insert`` frees the request's duplicates itself, as in the FULL-only unified cache, except
where it re-fills a tombstone: there an unlocked node takes the request's slots (and frees its
old ones), a locked one keeps its full slots and takes the request's window slots. The driver
frees the duplicates it computes after seeing which; the adapter drops a ``free`` right after an
``insert`` whose slots the insertion was given for the held tokens past ``prev_prefix_len``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..prefix_tree_protocol import TreeSetup, TreeView
from .sglang_unified import SGLangUnifiedRadixCache, SGLangUnifiedRustCore


class SGLangUnifiedSWA(SGLangUnifiedRadixCache):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + SWA, Python tree core) and its SWA allocator."""

    name = "sglang-unified-swa"
    #: It takes a window component (``TreeSetup.window`` > 0 always: SGLang's SWA component
    #: refuses a window below 1).
    window_component = True

    def __init__(self) -> None:
        super().__init__()
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        self.swa_allocator_class: type = SWATokenToKVPoolAllocator
        self.swa_pool_class: type = SWAKVPool
        self.swa = ComponentType.SWA
        self.window = 0
        self.given_for_held: frozenset[int] = frozenset()

    def make_allocator(self, setup: TreeSetup) -> Any:
        torch, size = self.api.torch, setup.num_pages * setup.page_size
        pool = self.swa_pool_class(size=size, size_swa=size, page_size=setup.page_size, dtype=torch.float16,
                                   head_num=1, head_dim=1, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                                   device="cpu")
        return self.swa_allocator_class(size=size, size_swa=size, page_size=setup.page_size, dtype=torch.float16,
                                        device="cpu", kvcache=pool, need_sort=False)

    def cache_params(self, allocator: Any, page_size: int) -> Any:
        return self.api.CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                                        page_size=page_size, eviction_policy=self.eviction_policy,
                                        sliding_window_size=self.window, tree_components=(self.full, self.swa),
                                        tree_core_backend=self.tree_core_backend)

    def configure(self, setup: TreeSetup) -> None:
        if setup.window < 1:
            raise ValueError(f"window: SGLang's SWA component needs a window of at least 1 token, got {setup.window}")
        self.window = setup.window
        super().configure(setup)
        self.given_for_held = frozenset()

    # -- the protocol ------------------------------------------------------------------------------
    def insert(self, handle: int, namespace: int, tokens: Sequence[int], slots: Sequence[int]) -> int:
        before = self.held.get(handle, 0)
        held = super().insert(handle, namespace, tokens, slots)
        self.given_for_held = frozenset(int(s) for s in slots[before:held])
        return held

    def alloc(self, num_tokens: int) -> tuple[int, ...] | None:
        self.given_for_held = frozenset()
        if self.page_size == 1 or num_tokens == 0:
            return super().alloc(num_tokens)
        torch = self.api.torch
        zero, length = torch.tensor([0], dtype=torch.int64), torch.tensor([num_tokens], dtype=torch.int64)
        slots = self.allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1], dtype=torch.int64),
                                            num_tokens)
        return None if slots is None else tuple(int(s) for s in slots.tolist())

    def free(self, slots: Sequence[int]) -> None:
        given, self.given_for_held = self.given_for_held, frozenset()
        self.freed_by_insert = ()
        if slots and given and set(int(s) for s in slots) <= given:
            return  # the duplicates of the last insertion: the cache freed them (or kept them) itself
        self.allocator.free(self.tensor(slots))

    def evict(self, num_tokens: int) -> int:
        return int(self.cache.evict(self.api.EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def evict_window(self, num_tokens: int) -> int:
        return int(self.cache.evict(self.api.EvictParams(swa_num_tokens=num_tokens)).swa_num_tokens_evicted)

    def window_slots(self, slots: Sequence[int]) -> tuple[int, ...]:
        """The window slot behind each full slot: the allocator's own translation (what SGLang's
        model runner writes and reads a window layer's KV through; 0 where none is mapped)."""
        return tuple(int(s) for s in self.allocator.translate_loc_from_full_to_swa(self.tensor(slots)).tolist())

    def node_windowed(self, node: Any) -> bool:
        return node.component(self.swa).value is not None

    def observe(self) -> TreeView:
        return TreeView(self.pages(), int(self.cache.evictable_size()), int(self.cache.protected_size()),
                        int(self.allocator.full_available_size()),
                        window_free=int(self.allocator.swa_available_size()),
                        window_evictable=int(self.cache.swa_evictable_size()),
                        window_protected=int(self.cache.swa_protected_size()))


class SGLangUnifiedSWARust(SGLangUnifiedSWA, SGLangUnifiedRustCore):
    """The same FULL + SWA cache over SGLang's bundled Rust tree core: the tree is read as
    :class:`~.sglang_unified.SGLangUnifiedRustCore` reads it (``pretty_print``, which prints each
    node's ``Swa=yes|no`` too), the protocol is :class:`SGLangUnifiedSWA`'s."""

    name = "sglang-unified-swa-rust"
    tree_core_backend = "rust"
