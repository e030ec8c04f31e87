"""SGLang's real radix cache with one fault patched in at run time (meta-tests).

Each adapter builds SGLang 0.5.23's ``RadixCache`` through a subclass of the real class that
changes one method (or through a real eviction policy that is not LRU), so the suite judges
real SGLang code with one known fault. The module imports without SGLang; the classes are
made when an adapter is configured. ``BROKEN`` maps each to the rule it must be convicted of.
"""

from __future__ import annotations

import functools
from typing import Any

from kvoracle.conformance.engines.sglang import SGLangRadixCache


def _base(obj: Any) -> Any:
    """The real SGLang class a patched object's class derives from, bound to the object."""
    return super(type(obj), obj)


# -- the patched methods (each calls the real one through _base) ------------------------------------
def _leaf_status_ignoring_locks(cache: Any, node: Any) -> None:
    locks, node.lock_ref = node.lock_ref, 0
    try:
        _base(cache)._update_leaf_status(node)
    finally:
        node.lock_ref = locks


def _match_without_pages(key: Any, other: Any, page_size: int = 1) -> int:
    return _base(key).match(other, 1)


def _slice_keeping_class(key: Any, index: Any) -> Any:
    part = _base(key).__getitem__(index)
    part.__class__ = type(key)
    return part


def _lock_without_sizes(cache: Any, node: Any) -> Any:
    result = _base(cache).inc_lock_ref(node)
    cache.evictable_size_ -= result.delta
    cache.protected_size_ += result.delta
    return result


def _evict_reporting_the_request(cache: Any, params: Any) -> Any:
    result = _base(cache).evict(params)
    result.num_tokens_evicted = params.num_tokens
    return result


def _evict_without_freeing(cache: Any, params: Any) -> Any:
    pool = cache.token_to_kv_pool_allocator
    pool.free_segment = lambda *args, **kwargs: None
    try:
        return _base(cache).evict(params)
    finally:
        del pool.free_segment


@functools.cache
def _subclass(base: type, name: str, methods: tuple[tuple[str, Any], ...]) -> type:
    return type(name, (base,), {"__slots__": (), **dict(methods)} if "__slots__" in vars(base) else dict(methods))


class _PatchedCache(SGLangRadixCache):
    """Builds its cache as a subclass of SGLang's RadixCache with :attr:`methods` replaced."""

    methods: tuple[tuple[str, Any], ...] = ()

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        cls = _subclass(self.api.RadixCache, f"Patched{type(self).__name__}", self.methods)
        params = self.api.CacheInitParams(disable=False, req_to_token_pool=None,
                                          token_to_kv_pool_allocator=allocator, page_size=page_size,
                                          eviction_policy=self.eviction_policy)
        return cls(params)


class LockedEvictable(_PatchedCache):
    """``_update_leaf_status`` ignores lock counts, so a locked leaf is an eviction candidate."""

    name = "sglang-locked-evictable"
    methods = (("_update_leaf_status", _leaf_status_ignoring_locks),)


class PagelessMatch(SGLangRadixCache):
    """``RadixKey.match`` drops the page size: a match can end inside a page (an off-by-one page
    alignment), and the node is split there."""

    name = "sglang-pageless-match"

    def key(self, namespace, tokens):
        cls = _subclass(self.api.RadixKey, "PagelessKey",
                        (("__getitem__", _slice_keeping_class), ("match", _match_without_pages)))
        real = super().key(namespace, tokens)
        return cls(real.token_ids, real.extra_key)


class MostRecentlyUsed(SGLangRadixCache):
    """SGLang's own ``mru`` eviction policy: the LRU order reversed."""

    name = "sglang-mru"
    eviction_policy = "mru"


class SizesNotMoved(_PatchedCache):
    """``inc_lock_ref`` locks the path but leaves the evictable and protected sizes as they were."""

    name = "sglang-sizes-not-moved"
    methods = (("inc_lock_ref", _lock_without_sizes),)


class EvictMisreports(_PatchedCache):
    """``evict`` reports the tokens it was asked for, not the tokens it evicted."""

    name = "sglang-evict-misreports"
    methods = (("evict", _evict_reporting_the_request),)


class EvictLeaks(_PatchedCache):
    """``evict`` drops the evicted nodes without giving their slots back to the allocator."""

    name = "sglang-evict-leaks"
    methods = (("evict", _evict_without_freeing),)


#: Each broken engine and the rule it must be convicted of.
BROKEN = {
    PagelessMatch: "KV-TREE-001",
    LockedEvictable: "KV-TREE-005",
    EvictMisreports: "KV-TREE-007",
    MostRecentlyUsed: "KV-TREE-009",
    EvictLeaks: "KV-TREE-010",
    SizesNotMoved: "KV-TREE-011",
}
