"""SGLang's real radix cache with one fault patched in at run time (meta-tests).

Each adapter builds SGLang 0.5.23's ``RadixCache`` through a subclass of the real class that
changes one method (or through a real eviction policy that is not LRU), so the suite judges
real SGLang code with one known fault. The module imports without SGLang; the classes are
made when an adapter is configured. ``BROKEN`` maps each to the rule it must be convicted of.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

from kvoracle.conformance.engines.sglang import SGLangRadixCache
from kvoracle.conformance.engines.sglang_mamba import SGLangUnifiedMamba
from kvoracle.conformance.engines.sglang_swa import SGLangUnifiedSWA
from kvoracle.conformance.engines.sglang_unified import SGLangUnifiedRadixCache, SGLangUnifiedRustCore
from kvoracle.conformance.harness.capabilities import Capabilities


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


# -- SGLang's UnifiedRadixCache (FULL component) with one fault ---------------------------------------
def _match_at_without_pages(key: Any, other: Any, offset: int, page_size: int = 1) -> int:
    return _base(key).match_at(other, offset, 1)


def _device_leaf_ignoring_locks(core: Any, node: Any) -> bool:
    locks = [data.lock_ref for data in node.component_data]
    for data in node.component_data:
        data.lock_ref = 0
    try:
        return _base(core)._is_device_leaf(node)
    finally:
        for data, count in zip(node.component_data, locks):
            data.lock_ref = count


def _unified_lock_without_sizes(cache: Any, node_id: Any, skip_lock_components: Any = ()) -> Any:
    result = _base(cache).inc_lock_ref(node_id, skip_lock_components)
    core, full = cache.tree_core, cache.tree_components[0]
    core.component_evictable_size_[full] += result.delta or 0
    core.component_protected_size_[full] -= result.delta or 0
    return result


def _insert_from_the_start(cache: Any, params: Any) -> Any:
    params.prev_prefix_len = 0
    return _base(cache).insert(params)


class _PatchedUnified(SGLangUnifiedRadixCache):
    """Builds SGLang's UnifiedRadixCache as a subclass with :attr:`methods` replaced, and gives its
    (Python) tree core a class with :attr:`core_methods` replaced."""

    methods: tuple[tuple[str, Any], ...] = ()
    core_methods: tuple[tuple[str, Any], ...] = ()

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        cls = _subclass(self.unified_class, f"Patched{type(self).__name__}", self.methods)
        cache = cls(self.cache_params(allocator, page_size))
        if self.core_methods:
            core = cache.tree_core
            core.__class__ = _subclass(type(core), f"PatchedCore{type(self).__name__}", self.core_methods)
        return cache


class UnifiedPagelessMatch(SGLangUnifiedRadixCache):
    """``RadixKey.match_at`` (the unified tree's walk) drops the page size: a match can end inside
    a page, and the node is split there."""

    name = "sglang-unified-pageless-match"

    def key(self, namespace, tokens):
        cls = _subclass(self.api.RadixKey, "PagelessAtKey",
                        (("__getitem__", _slice_keeping_class), ("match_at", _match_at_without_pages)))
        real = super().key(namespace, tokens)
        return cls(real.token_ids, real.extra_key)


class UnifiedLockedEvictable(_PatchedUnified):
    """The tree core's ``_is_device_leaf`` ignores lock counts, so a locked leaf is a victim."""

    name = "sglang-unified-locked-evictable"
    core_methods = (("_is_device_leaf", _device_leaf_ignoring_locks),)


class UnifiedInsertFreesHeld(_PatchedUnified):
    """``insert`` ignores ``prev_prefix_len``: it frees the request's slots of every held token as
    duplicates, the hit's slots (the cache's own) included."""

    name = "sglang-unified-insert-frees-held"
    methods = (("insert", _insert_from_the_start),)


class UnifiedPageRecencyClaimed(SGLangUnifiedRadixCache):
    """The real unified cache, declared to stamp recency per page (it keeps it per node)."""

    name = "sglang-unified-page-recency"

    def capabilities(self):
        return Capabilities(tree_recency="page")


def _unified(plain: type, methods: tuple[tuple[str, Any], ...] | None = None) -> type:
    """The unified cache with the fault of a broken plain cache: the same methods patched (the
    unified cache has them too; ``methods`` when its signature or its sizes differ), or the same
    eviction policy."""
    return type(f"Unified{plain.__name__}", (_PatchedUnified,), {
        "__doc__": plain.__doc__, "name": plain.name.replace("sglang", "sglang-unified", 1),
        "methods": getattr(plain, "methods", ()) if methods is None else methods,
        "eviction_policy": plain.eviction_policy})


def _on_rust(broken: type) -> type:
    """A broken unified cache over the Rust tree core (the fault is in the cache's Python methods;
    the Rust core's own cannot be patched from Python)."""
    return type(f"Rust{broken.__name__}", (broken, SGLangUnifiedRustCore), {
        "__doc__": broken.__doc__, "name": broken.name.replace("sglang-unified", "sglang-unified-rust", 1)})


UnifiedEvictMisreports = _unified(EvictMisreports)
UnifiedMostRecentlyUsed = _unified(MostRecentlyUsed)
UnifiedEvictLeaks = _unified(EvictLeaks)
UnifiedSizesNotMoved = _unified(SizesNotMoved, (("inc_lock_ref", _unified_lock_without_sizes),))
RustEvictMisreports = _on_rust(UnifiedEvictMisreports)
RustEvictLeaks = _on_rust(UnifiedEvictLeaks)
RustInsertFreesHeld = _on_rust(UnifiedInsertFreesHeld)

#: Each broken unified cache and the rule it must be convicted of.
BROKEN_UNIFIED = {
    UnifiedPagelessMatch: "KV-TREE-001",
    UnifiedLockedEvictable: "KV-TREE-005",
    UnifiedEvictMisreports: "KV-TREE-007",
    UnifiedPageRecencyClaimed: "KV-TREE-008",
    UnifiedMostRecentlyUsed: "KV-TREE-009",
    UnifiedEvictLeaks: "KV-TREE-010",
    UnifiedInsertFreesHeld: "KV-TREE-010",
    UnifiedSizesNotMoved: "KV-TREE-011",
    RustEvictMisreports: "KV-TREE-007",
    RustEvictLeaks: "KV-TREE-010",
    RustInsertFreesHeld: "KV-TREE-010",
}


# -- faults the paged KV store judges first (KV-DATA, conformance/engines/prefix_tree_store.py) -------------------
def _path_pages_reversed(cache: Any, node: Any) -> Any:
    path = _base(cache).path_device_indices(node)
    size = cache.page_size
    return path.view(-1, size).flip(0).reshape(-1) if path.numel() else path


def _evict_freeing_parents(cache: Any, params: Any) -> Any:
    """The real ``evict``, but each ``free_segment`` of a leaf's slots gives back as many of its
    parent's last slots instead, when the parent is not the root and has that many."""
    pool = cache.token_to_kv_pool_allocator
    real = pool.free_segment
    nodes, stack = {}, [cache.root_node]
    while stack:
        node = stack.pop()
        nodes[id(node.value)] = node
        stack.extend(node.children.values())

    def free_segment(value: Any, *args: Any, **kwargs: Any) -> Any:
        node = nodes.get(id(value))
        parent = None if node is None else node.parent
        if parent is not None and parent is not cache.root_node and len(parent.value) >= len(value):
            value = parent.value[len(parent.value) - len(value):]
        return real(value, *args, **kwargs)

    pool.free_segment = free_segment
    try:
        return _base(cache).evict(params)
    finally:
        del pool.free_segment


class PathPagesReversed(_PatchedCache):
    """``path_device_indices`` (the hit's slots the scheduler puts in the request's row) lists the
    path's pages root-last."""

    name = "sglang-path-pages-reversed"
    methods = (("path_device_indices", _path_pages_reversed),)


class EvictFreesParent(_PatchedCache):
    """``evict`` frees the last slots of each evicted leaf's parent instead of the leaf's own: the
    counts balance, the leaf's slots leak, and the parent's, still in the tree, are handed out
    again."""

    name = "sglang-evict-frees-parent"
    methods = (("evict", _evict_freeing_parents),)


UnifiedPathPagesReversed = _unified(PathPagesReversed)
RustPathPagesReversed = _on_rust(UnifiedPathPagesReversed)


def in_store(broken: type) -> type:
    """``broken`` in the paged KV store (conformance/engines/prefix_tree_store.py)."""
    from kvoracle.conformance.engines.prefix_tree_store import paged_tree_store

    return paged_tree_store(f"Paged{broken.__name__}", f"paged-{broken.name}", broken.__doc__, broken, __name__)


#: Each broken cache in the paged store and the data rule it must be convicted of (the store's
#: verdicts come before the suite's own, so the data rule, not KV-TREE-002 or -010, is charged).
BROKEN_IN_STORE = {
    PathPagesReversed: "KV-DATA-001",
    EvictFreesParent: "KV-DATA-004",
    UnifiedPathPagesReversed: "KV-DATA-001",
    RustPathPagesReversed: "KV-DATA-001",
}


# -- SGLang's UnifiedRadixCache with its SWA component (a window of KV-TREE-016 .. 021), one fault each ----
def _validator_ignoring_tombstones(component: Any, match_device_only: bool = False) -> Any:
    """A match validator that counts every node on the path as window-holding: the run of nodes
    before a match's end is never broken by a node without its SWA value."""
    window, covered = component.sliding_window_size, [float("inf")]

    def accepts(node: Any) -> bool:
        covered[0] += len(node.key)
        return covered[0] >= window

    return accepts


def _overlap_without_recovery(component: Any, node: Any, prefix_len: int, *args: Any, **kwargs: Any) -> int:
    """The insert's overlap hook for SWA: every overlapped token counts as held as it is, tombstones
    included (nothing is re-filled)."""
    return prefix_len


def _evict_component_keeping_window_slots(component: Any, node: Any, device_frees: Any, *args: Any,
                                          **kwargs: Any) -> Any:
    """The real SWA eviction of one node, but the window slots it frees are never handed to the
    allocator."""
    kept: dict = collections.defaultdict(list)
    result = _base(component).evict_component(node, kept, *args, **kwargs)
    for component_type, values in kept.items():
        if component_type != component.component_type:
            device_frees.setdefault(component_type, []).extend(values)
    return result


def _recovery_ignoring_locks(component: Any, *, node: Any, **kwargs: Any) -> Any:
    """The real re-fill of a tombstone from an insertion, as if no lock held the node's full value:
    it takes the inserter's slots and frees its old ones while a request still reads them."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    full = node.component_data[ComponentType.FULL]
    locks, full.lock_ref = full.lock_ref, 0
    try:
        return _base(component)._recover_from_incoming(node=node, **kwargs)
    finally:
        full.lock_ref = locks


def _match_giving_up(cache: Any, params: Any) -> Any:
    """The real match, but when the deepest full-KV match is no valid end (its window KV is missing)
    the answer is no hit, not the deepest node that is one."""
    result = _base(cache).match_prefix(params)
    page = cache.tree_core.page_size
    if result.device_prefix_len < result.full_kv_hit_length // page * page:
        root = cache.tree_core.root_node.id
        return result._replace(device_prefix_len=0, last_device_node=root, last_host_node=root,
                               best_match_node=root)
    return result


def _evict_reporting_the_window_request(cache: Any, params: Any) -> Any:
    result = _base(cache).evict(params)
    if params.swa_num_tokens:
        result.swa_num_tokens_evicted = params.swa_num_tokens
    return result


def _previous_ignoring_locks(lru: Any, node: Any, check_id: bool = True) -> Any:
    """The SWA LRU list's walk towards older nodes, without skipping locked ones."""
    previous = node.lru_prev[lru._pt]
    return None if previous is lru.head else previous


def _previous_from_the_mru_end(lru: Any, node: Any, check_id: bool = True) -> Any:
    """A component LRU list's walk towards older nodes, read the other way round: from the tail (where
    an eviction starts) it goes to the most recently used node, and from a node on towards the tail,
    skipping locked nodes as the real walk does."""
    ct, pointer = lru.component_type, lru._pt
    found = lru.head.lru_next[pointer] if node is lru.tail else node.lru_next[pointer]
    while found is not lru.tail and found.component_data[ct].lock_ref > 0:
        found = found.lru_next[pointer]
    return None if found is lru.tail else found


def _refresh_as_every_component(component: Any, phase: Any, node: Any, root_node: Any) -> None:
    """The LRU refresh a component inherits (``TreeComponent.refresh_lru``) in place of its own: an
    insertion's walk refreshes every node it passes that holds the component's value, and a match every
    such node of its path, not only what the component's own refresh reaches."""
    from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent

    TreeComponent.refresh_lru(component, phase, node, root_node)


def _refresh_one_page_short(component: Any, phase: Any, node: Any, root_node: Any) -> None:
    """The SWA component's own refresh, run with the window one page smaller: it reaches
    ``sliding_window_size`` tokens of nodes back from a match's or insertion's end, not
    ``sliding_window_size + page_size``."""
    page = component.tree_core.page_size
    component.sliding_window_size -= page
    try:
        _base(component).refresh_lru(phase, node, root_node)
    finally:
        component.sliding_window_size += page


class _PatchedSWA(SGLangUnifiedSWA):
    """SGLang's UnifiedRadixCache FULL+SWA with :attr:`methods` of the cache, :attr:`swa_methods` of
    its SWA component (given to the cache through ``component_registry_override``) and
    :attr:`lru_methods` of the SWA component's LRU list replaced."""

    methods: tuple[tuple[str, Any], ...] = ()
    swa_methods: tuple[tuple[str, Any], ...] = ()
    lru_methods: tuple[tuple[str, Any], ...] = ()

    def cache_params(self, allocator: Any, page_size: int) -> Any:
        params = super().cache_params(allocator, page_size)
        if self.swa_methods:
            from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

            patched = _subclass(SWAComponent, f"PatchedSWA{type(self).__name__}", self.swa_methods)
            params.component_registry_override = {self.swa: patched}
        return params

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        cls = _subclass(self.unified_class, f"Patched{type(self).__name__}", self.methods)
        cache = cls(self.cache_params(allocator, page_size))
        if self.lru_methods:
            lru = cache.tree_core.lru_lists[self.swa]
            lru.__class__ = _subclass(type(lru), f"PatchedLRU{type(self).__name__}", self.lru_methods)
        return cache


class SWAWindowBlindMatch(_PatchedSWA):
    """The SWA component's match validator never resets at a node without its window KV, so a
    match may end where the window's KV is missing."""

    name = "sglang-swa-window-blind-match"
    swa_methods = (("create_match_validator", _validator_ignoring_tombstones),)


class SWAMatchGivesUp(_PatchedSWA):
    """``match_prefix`` answers no hit when the deepest full-KV match lacks its window KV, instead
    of the deepest node whose window is held."""

    name = "sglang-swa-match-gives-up"
    methods = (("match_prefix", _match_giving_up),)


class SWAEvictMisreports(_PatchedSWA):
    """``evict`` reports the window tokens it was asked for, not those it dropped."""

    name = "sglang-swa-evict-misreports"
    methods = (("evict", _evict_reporting_the_window_request),)


class SWAEvictionIgnoresLocks(_PatchedSWA):
    """The SWA LRU list's walk does not skip locked nodes: window eviction tombstones the nodes of
    a held lock's window."""

    name = "sglang-swa-eviction-ignores-locks"
    lru_methods = (("get_prev_no_lock", _previous_ignoring_locks),)


class SWAInsertKeepsTombstones(_PatchedSWA):
    """The SWA component's insert-overlap hook re-fills nothing: an insertion over a tombstone
    leaves it without its window KV."""

    name = "sglang-swa-insert-keeps-tombstones"
    swa_methods = (("update_component_on_insert_overlap", _overlap_without_recovery),)


class SWARecoveryIgnoresLocks(_PatchedSWA):
    """Re-filling a tombstone from an insertion replaces its full slots even while it is locked
    (instead of keeping them and taking the inserter's window slots only)."""

    name = "sglang-swa-recovery-ignores-locks"
    swa_methods = (("_recover_from_incoming", _recovery_ignoring_locks),)


class SWAEvictLeaksWindowSlots(_PatchedSWA):
    """The SWA component's eviction drops a node's window value without freeing its window slots."""

    name = "sglang-swa-evict-leaks-window-slots"
    swa_methods = (("evict_component", _evict_component_keeping_window_slots),)


class SWARefreshWholePath(_PatchedSWA):
    """The SWA component refreshes its LRU list as every component does by default: a match or an
    insertion keeps the window KV of its whole path fresh, not only that of its last window."""

    name = "sglang-swa-refresh-whole-path"
    swa_methods = (("refresh_lru", _refresh_as_every_component),)


class SWARefreshOnePageShort(_PatchedSWA):
    """The SWA component's refresh reaches the window's tokens back, one page short of
    ``sliding_window_size + page_size``."""

    name = "sglang-swa-refresh-one-page-short"
    swa_methods = (("refresh_lru", _refresh_one_page_short),)


class SWAEvictsFreshestWindow(_PatchedSWA):
    """The SWA LRU list is walked from its most recently used end: window eviction tombstones the
    freshest window KV first."""

    name = "sglang-swa-evicts-freshest-window"
    lru_methods = (("get_prev_no_lock", _previous_from_the_mru_end),)


#: Each broken FULL+SWA cache and the window rule it must be convicted of.
BROKEN_SWA = {
    SWAWindowBlindMatch: "KV-TREE-016",
    SWAMatchGivesUp: "KV-TREE-017",
    SWAEvictMisreports: "KV-TREE-018",
    SWAEvictionIgnoresLocks: "KV-TREE-019",
    SWAInsertKeepsTombstones: "KV-TREE-020",
    SWARecoveryIgnoresLocks: "KV-TREE-020",
    SWAEvictLeaksWindowSlots: "KV-TREE-021",
    SWARefreshWholePath: "KV-TREE-029",
    SWARefreshOnePageShort: "KV-TREE-029",
    SWAEvictsFreshestWindow: "KV-TREE-029",
}


# -- SGLang's UnifiedRadixCache with its MAMBA component (a state component, KV-TREE-022 .. 027), one fault each --
def _validator_ignoring_states(component: Any, match_device_only: bool = False) -> Any:
    """A match validator that accepts every node, whether or not it holds a MAMBA value."""
    return lambda node: True


def _evict_reporting_the_state_request(cache: Any, params: Any) -> Any:
    result = _base(cache).evict(params)
    if params.mamba_num:
        result.mamba_num_evicted = params.mamba_num
    return result


def _commit_keeping_no_new_state(component: Any, node: Any, is_new_leaf: bool, params: Any, result: Any,
                                 cache_actions: Any) -> None:
    """The insert's commit hook for MAMBA, but a new leaf is left without the state it was given (and the
    insertion still answers that the cache took it)."""
    if is_new_leaf:
        return
    _base(component).commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)


def _cleanup_keeping_duplicates(component: Any, req: Any, is_finished: bool, insert_result: Any = None,
                                insert_params: Any = None) -> None:
    """The component's cleanup after an insertion, but a state the cache did not take is never freed."""
    if insert_params is not None:
        insert_params.mamba_value = None
    _base(component).cleanup_after_caching_req(req, is_finished, insert_result=insert_result,
                                               insert_params=insert_params)


class _PatchedMamba(SGLangUnifiedMamba):
    """SGLang's UnifiedRadixCache FULL+MAMBA with :attr:`methods` of the cache, :attr:`mamba_methods` of
    its MAMBA component (given to the cache through ``component_registry_override``) and
    :attr:`lru_methods` of the component's LRU list replaced."""

    methods: tuple[tuple[str, Any], ...] = ()
    mamba_methods: tuple[tuple[str, Any], ...] = ()
    lru_methods: tuple[tuple[str, Any], ...] = ()

    def cache_params(self, allocator: Any, page_size: int) -> Any:
        params = super().cache_params(allocator, page_size)
        if self.mamba_methods:
            from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

            patched = _subclass(MambaComponent, f"PatchedMamba{type(self).__name__}", self.mamba_methods)
            params.component_registry_override = {self.mamba: patched}
        return params

    def make_cache(self, allocator: Any, page_size: int) -> Any:
        cls = _subclass(self.unified_class, f"Patched{type(self).__name__}", self.methods)
        cache = cls(self.cache_params(allocator, page_size))
        if self.lru_methods:
            lru = cache.tree_core.lru_lists[self.mamba]
            lru.__class__ = _subclass(type(lru), f"PatchedLRU{type(self).__name__}", self.lru_methods)
        return cache


class MambaStateBlindMatch(_PatchedMamba):
    """The MAMBA component's match validator accepts every node: a match may end where no state is held."""

    name = "sglang-mamba-state-blind-match"
    mamba_methods = (("create_match_validator", _validator_ignoring_states),)


class MambaMatchGivesUp(_PatchedMamba):
    """``match_prefix`` answers no hit when the deepest full-KV match holds no state, instead of the
    deepest node that does."""

    name = "sglang-mamba-match-gives-up"
    methods = (("match_prefix", _match_giving_up),)


class MambaEvictMisreports(_PatchedMamba):
    """``evict`` reports the states it was asked for, not those it dropped."""

    name = "sglang-mamba-evict-misreports"
    methods = (("evict", _evict_reporting_the_state_request),)


class MambaEvictionIgnoresLocks(_PatchedMamba):
    """The MAMBA LRU list's walk does not skip locked nodes: state eviction drops a held lock's state."""

    name = "sglang-mamba-eviction-ignores-locks"
    lru_methods = (("get_prev_no_lock", _previous_ignoring_locks),)


class MambaInsertDropsState(_PatchedMamba):
    """The MAMBA insert hook leaves a new leaf without the state it was given."""

    name = "sglang-mamba-insert-drops-state"
    mamba_methods = (("commit_insert_component_data", _commit_keeping_no_new_state),)


class MambaCleanupLeaks(_PatchedMamba):
    """The component's cleanup after an insertion never frees a state the cache did not take."""

    name = "sglang-mamba-cleanup-leaks"
    mamba_methods = (("cleanup_after_caching_req", _cleanup_keeping_duplicates),)


def _refresh_nothing(component: Any, phase: Any, node: Any, root_node: Any) -> None:
    """A MAMBA refresh that moves no node: a match leaves the state it resumes from where it was."""


class MambaRefreshWholePath(_PatchedMamba):
    """The MAMBA component refreshes its LRU list as every component does by default: a match or an
    insertion keeps every state on its path fresh, not only the one its request resumes from."""

    name = "sglang-mamba-refresh-whole-path"
    mamba_methods = (("refresh_lru", _refresh_as_every_component),)


class MambaMatchRefreshesNothing(_PatchedMamba):
    """The MAMBA component's refresh does nothing: a match leaves the state it resumes from as old as
    it was (insertions still move their state to the fresh end)."""

    name = "sglang-mamba-match-refreshes-nothing"
    mamba_methods = (("refresh_lru", _refresh_nothing),)


class MambaEvictsFreshestState(_PatchedMamba):
    """The MAMBA LRU list is walked from its most recently used end: state eviction drops the freshest
    state first."""

    name = "sglang-mamba-evicts-freshest-state"
    lru_methods = (("get_prev_no_lock", _previous_from_the_mru_end),)


#: Each broken FULL+MAMBA cache and the state rule it must be convicted of.
BROKEN_MAMBA = {
    MambaStateBlindMatch: "KV-TREE-022",
    MambaMatchGivesUp: "KV-TREE-023",
    MambaEvictMisreports: "KV-TREE-024",
    MambaEvictionIgnoresLocks: "KV-TREE-025",
    MambaInsertDropsState: "KV-TREE-026",
    MambaCleanupLeaks: "KV-TREE-027",
    MambaRefreshWholePath: "KV-TREE-030",
    MambaMatchRefreshesNothing: "KV-TREE-030",
    MambaEvictsFreshestState: "KV-TREE-030",
}


# -- faults in the MAMBA component's state data, which only the paged store sees (KV-DATA-007) -----------------
def _nearest_state_above(component: Any, node: Any) -> Any:
    """The state slot (a MAMBA value) of the nearest ancestor of ``node`` that holds one, or ``None``."""
    above = node.parent
    while above is not None and above is not component.tree_core.root_node:
        value = above.component_data[component.component_type].value
        if value is not None:
            return value
        above = above.parent
    return None


def _cow_from_the_state_above(component: Any, params: Any, result: Any) -> Any:
    """The real copy-on-write naming of the hit's state slot, but naming the slot of the nearest state
    above the match's best node where there is one: the hit, the tree and every count stay right, and
    the request resumes from an earlier prefix's state."""
    result = _base(component).finalize_match_result_in_cache(params, result)
    if params.cow_mamba and getattr(params.req.kv, "mamba_cow_src_index", None) is not None:
        above = _nearest_state_above(component, component.tree_core.node_by_id(result.best_match_node))
        if above is not None:
            params.req.kv.mamba_cow_src_index = above
    return result


def _evict_component_freeing_the_state_above(component: Any, node: Any, device_frees: Any, *args: Any,
                                             **kwargs: Any) -> Any:
    """The real eviction of a node's MAMBA value, but the slot handed to the allocator is the one of the
    nearest state above the node, where there is one: the node loses its state, the counts balance,
    and a slot the tree still holds goes back to the free list."""
    above = _nearest_state_above(component, node)
    start = len(device_frees[component.component_type])
    answer = _base(component).evict_component(node, device_frees, *args, **kwargs)
    frees = device_frees[component.component_type]
    if above is not None and len(frees) > start:
        frees[start] = above
    return answer


class MambaCowFromTheStateAbove(_PatchedMamba):
    """A match's copy-on-write names the state slot of the nearest state above the hit's last node
    (Python tree core): the request resumes from an earlier prefix's state."""

    name = "sglang-mamba-cow-from-the-state-above"
    mamba_methods = (("finalize_match_result_in_cache", _cow_from_the_state_above),)


class MambaEvictFreesTheStateAbove(_PatchedMamba):
    """Dropping a node's state hands the allocator the state slot of the nearest state above it (Python
    tree core), which the tree still holds: the next insertion's state is written over it."""

    name = "sglang-mamba-evict-frees-the-state-above"
    mamba_methods = (("evict_component", _evict_component_freeing_the_state_above),)


#: Each broken FULL+MAMBA cache whose fault lies in the state data, in the paged store, and the rule it must
#: be convicted of.
BROKEN_MAMBA_IN_STORE = {
    MambaCowFromTheStateAbove: "KV-DATA-007",
    MambaEvictFreesTheStateAbove: "KV-DATA-007",
}
