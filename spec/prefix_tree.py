"""Chapter 14 -- Prefix trees: a prefix cache over token pages (SGLang's radix cache).

The other chapters specify vLLM's design: blocks named by chained hashes in a flat
cache map, reference counts, a free queue that is also the eviction order. SGLang
keeps its prefix cache as a *radix tree* over token ids instead, and its scheduler
drives it through a handful of operations: look a prompt up (``match_prefix``), pin
the path of a hit while a request uses it (``inc_lock_ref`` / ``dec_lock_ref``),
insert what a request computed (``insert``), and evict ``n`` tokens of unlocked
leaves when the allocator runs short (``evict``). This chapter states what such a
cache promises in terms that fit both designs, and says where vLLM's rules of the
earlier chapters are the stricter refinements of a statement made here.

**Pages and paths.** A cache with page size ``P`` stores KV in pages of ``P`` token
slots. Page ``j`` of a request of ``n`` tokens in namespace ``s`` is named by ``s``
and the request's first ``(j + 1) * P`` tokens: two requests share the page exactly
when they share those tokens and the namespace (vLLM names the same thing by a
chained block hash, KV-HASH-004). A page's *parent* is page ``j - 1`` of the same
prefix. Only full pages are stored: a request's last ``n % P`` tokens never are.
The cache *holds* a page when a lookup can return it. A prefix tree holds the
parent of every page it holds (KV-TREE-006): it forgets pages leaves first.

**Lookups** (KV-TREE-001 .. KV-TREE-004). A lookup of ``n`` tokens answers a hit of
``h`` tokens and the ``h`` slots that hold them. ``h`` is a multiple of ``P`` and at
most ``n`` (KV-TREE-001); it is the longest run of held pages from page 0
(KV-TREE-003); and every slot of the hit holds the KV written for that very token
after that very prefix, in the request's own namespace (KV-TREE-002, KV-TREE-004).
vLLM refines these: its hit is bounded by a ``max_length`` as well (KV-FULL-004),
its scheduler-facing lookup by ``n - 1`` tokens (KV-LIFE-001: SGLang leaves that cap
to its scheduler, which asks for ``n - 1`` tokens itself), and its hit blocks are the
first blocks cached under the keys (KV-FULL-002). A lookup changes what the cache
holds in no way (KV-TREE-013); it may refresh recency (below).

**Locks** (KV-TREE-005, KV-TREE-014). A request that uses a hit locks its path: every
page from page 0 to the hit's last page counts the lock, and counts it once whatever
shape the engine's tree takes. A page with a lock count above 0 is never evicted
(KV-TREE-005; vLLM's form is the reference count: a referenced block is never free,
KV-POOL-010, and the counts balance the tables, KV-POOL-011). Unlocking releases
exactly what the lock took.

**Insertion** (KV-TREE-012). Inserting the first ``n`` tokens with the slots a request
wrote them to stores the page-aligned part, ``floor(n / P) * P`` tokens. Where the
cache already holds a page it keeps its own slots (the first copy stays, as vLLM's
lookups keep returning the first block, KV-POOL-009); the insertion answers how many
tokens were already held, ``p``, and the caller still owns its own slots of those
``p`` tokens (the duplicates it frees). The pages past ``p`` adopt the given slots.

**Eviction** (KV-TREE-005 .. KV-TREE-009). ``evict(n)`` removes unlocked pages that no
held page descends from -- leaves -- and returns their slots to the allocator. It
removes at least ``min(n, E)`` tokens when ``E`` tokens are evictable, and reports
exactly what it removed (KV-TREE-007). An engine that promises least-recently-used
order removes leaves oldest first: every lookup stamps the pages it covers and every
insertion the pages of its key, with one clock, and eviction repeatedly removes the
unlocked leaf with the oldest stamp (:func:`lru_leaf_order`; the pages removed are a
prefix of that order, KV-TREE-008). SGLang keeps recency per *segment* (a radix
node: a run of pages stored together) instead of per page: a lookup or insertion
that enters a segment stamps all of it, the pages past its end included, and then
splits the segment where it ended; eviction removes whole segments. That is the
``segment`` recency of KV-TREE-009, which an engine declares in place of KV-TREE-008
(capability ``tree_recency``). vLLM's eviction order is its free queue (KV-POOL-004,
KV-POOL-006, KV-POOL-007), which evicts cached blocks whether or not a longer prefix
is still cached; its rules, not these, judge it.

**Capacity** (KV-TREE-010, KV-TREE-011). The allocator hands out only free slots, and
at every moment the free slots, the slots the cache holds and the slots requests
hold outside the cache add up to the capacity (vLLM's form: KV-POOL-010, KV-POOL-012).
The cache's own account splits what it holds into *protected* tokens, those of locked
pages, and *evictable* tokens, the rest (SGLang's ``protected_size`` and
``evictable_size``).

**A window component** (KV-TREE-016 .. KV-TREE-021). A hybrid model with sliding-window
layers needs two kinds of KV per token: the full-attention layers' KV (what the rules above
call a page's slots) and the window layers' KV, of which a request only ever reads its last
``W`` tokens' (SGLang's ``UnifiedRadixCache`` with a SWA component keeps the second kind in a
pool of its own). A cache with a window component may therefore drop a page's *window KV*
while it keeps the page (SGLang calls such a page a tombstone): longer prefixes through it
still need its full-attention KV. A hit of ``h`` tokens is only usable if the window KV of
its last ``min(h, W)`` tokens is held -- every page overlapping them (KV-TREE-016; vLLM
states the same need as ``window - 1`` tokens, KV-SWA-001, and the same acceptance test,
:func:`kvoracle.spec.sliding_window.accepts`, which :func:`window_hit_ok` calls). The hit
is the longest usable one within the held prefix (KV-TREE-017: KV-TREE-003 with the window's
condition; where every page of the held prefix holds its window KV the two agree). Evicting
window KV (SGLang's ``evict(swa_num_tokens=n)``) drops it from unlocked pages, keeps the
full-attention KV of every page that still has a held child, and may remove leaves whole
(KV-TREE-018); a lock protects the window KV of its hit's last ``W`` tokens (KV-TREE-019);
an insertion leaves every page of its key past what the inserter already held with its
window KV (KV-TREE-020). The window KV slots balance like the full-attention ones
(KV-TREE-021). Which full-attention slots a page re-filled by an insertion keeps is the
engine's: SGLang stores the inserter's slots in an unlocked page and frees its old ones
(the one case where a held page's slots change, which KV-TREE-012 then reads through
KV-TREE-020). Window KV goes least recently used first (KV-TREE-028): a page's window KV carries a
stamp of its own, which a lookup sets on the window its hit uses and an insertion on the window KV it
stores or re-fills and on its key's window, and ``evict_window`` drops the oldest first, the page
nearer the root first among equal stamps. SGLang keeps that order per radix node in the SWA
component's LRU list and reaches one page further back (``W + P`` tokens of whole nodes): the
``segment`` form, KV-TREE-029, which an engine with segment recency is judged on instead.

**A state component** (KV-TREE-022 .. KV-TREE-027). A hybrid model with recurrent layers
(Mamba) needs, to resume after a prefix, those layers' *state* after the prefix's last token: one
fixed-size state per prefix end, not KV per token (SGLang's ``UnifiedRadixCache`` with a MAMBA
component keeps it in a pool of state slots of its own, one slot per radix node at most, at the
node's end). A cache with a state component holds a state at some pages (the page that ends the
prefix it was computed for) and none at the others. A hit of ``h`` tokens is only usable if the
page that ends it holds a state (KV-TREE-022; vLLM's form: a Mamba hit ends at a cached, aligned
state block, KV-MAMBA-001); the hit is the longest such prefix within the held one (KV-TREE-023:
KV-TREE-003 with the state's condition, so a lookup that ends between two states answers the
earlier one). Evicting states (SGLang's ``evict(mamba_num=n)``) drops them from pages outside held
locks, keeps the KV of every page that still has a held child, and may remove a leaf whole with
the pages above it that hold no state (KV-TREE-024); a lock protects the state at the end of its
path, the one its request resumes from (KV-TREE-025); an insertion leaves a state at its key's
last page: the one it was given where that page held none, else the page keeps its own and the
inserter's is a duplicate it gets back (KV-TREE-026). The state slots balance, and the cache's
own account splits its states into protected and evictable ones (KV-TREE-027). States go least
recently used first (KV-TREE-030): a state's stamp is that of the last lookup whose hit ended at it
(the state its request resumes from) or insertion that left a state there, and ``evict_states`` drops
the oldest first. What the state slots hold -- a hit's the state after its tokens, every held page's
the state after its prefix -- is the data chapter's rule, judged through a paged store (KV-DATA-007). A
cache with both a window and a state component is not yet judged.

**Namespaces** (KV-TREE-004). A namespace (SGLang's ``extra_key``: a LoRA adapter, a
cache salt) partitions the cache: a page is never shared between namespaces, even
for equal tokens (vLLM's form: the extra keys of the block hash, KV-HASH-007).

The functions below state the rules over flat values (tuples of flags, counts,
stamps), so that CrossHair can check them; the reference
(:mod:`kvoracle.reference.prefix_tree`) is a prefix tree built on them, and the
``prefix-tree`` conformance suite judges an engine against it.
"""

from __future__ import annotations

from itertools import pairwise

import icontract

from .contracts import ENABLED
from .registry import INPUT_VALIDATION, defines, rule
from .sliding_window import accepts

CHAPTER = "prefix_tree"
SUITE = ("prefix-tree",)
RADIX = "sglang/srt/mem_cache/radix_cache.py (SGLang 0.5.23)"
ALLOC = "sglang/srt/mem_cache/allocator/"

#: The two recency modes an engine that promises LRU eviction declares (capability ``tree_recency``).
PAGE_RECENCY = "page"
SEGMENT_RECENCY = "segment"
RECENCY_MODES = (PAGE_RECENCY, SEGMENT_RECENCY)

KV_TREE_001 = rule(
    "KV-TREE-001",
    "A hit is a page-aligned prefix of the request",
    """A lookup of n tokens answers a hit of h tokens with 0 <= h <= n, h a multiple of the page size,
    and exactly h slots. vLLM's refinements: the hit is also at most max_length (KV-FULL-004), and the
    manager's lookup caps it at n - 1 tokens (KV-LIFE-001).""",
    source=f"{RADIX} RadixCache.match_prefix (RadixKey.page_aligned, MatchResult.device_prefix_len)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_002 = rule(
    "KV-TREE-002",
    "A hit's slots hold the request's own KV",
    """Slot i of a hit holds the KV written for token i of a sequence whose first i + 1 tokens are the
    request's first i + 1 tokens, and the hit's slots are the slots the cache holds for those pages: the
    cache returns only KV it really holds for this prefix. vLLM's
    refinements: hit blocks are the blocks cached under the chained hashes of the prefix (KV-FULL-002,
    KV-HASH-004), and the data rules of chapter 5 (KV-DATA-001).""",
    source=f"{RADIX} RadixCache._match_prefix_helper (node values along the matched path)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_003 = rule(
    "KV-TREE-003",
    "The hit is the longest held prefix",
    """The hit is the longest run of pages, from page 0 of the request, that the cache holds in the
    request's namespace. vLLM's refinement: KV-FULL-001 (the longest run of cached block hashes,
    within max_length).""",
    source=f"{RADIX} RadixCache._match_prefix_helper",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_004 = rule(
    "KV-TREE-004",
    "Namespaces never share a hit",
    """A request in namespace s never hits KV stored under another namespace, even for equal tokens: no
    slot of its hit holds KV written for a request of another namespace. vLLM's refinement: the cache
    salt and LoRA extra keys of the block hash (KV-HASH-007).""",
    source=f"{RADIX} RadixKey.child_key / RadixKey._check_compatible (extra_key, cache_salt)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_005 = rule(
    "KV-TREE-005",
    "Locked pages are never evicted",
    """A page whose lock count is above 0 (a request holding a lock on a path through it) stays held
    until every such lock is released. vLLM's refinement: a block with a reference count above 0 is
    never free (KV-POOL-010).""",
    source=f"{RADIX} RadixCache.evict (evictable_leaves), inc_lock_ref, _update_leaf_status",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_006 = rule(
    "KV-TREE-006",
    "The cache forgets leaves first",
    """The cache holds the parent of every page it holds: eviction removes a page only together with, or
    after, every held page that descends from it. (vLLM's block pool does not promise this: it evicts
    any free block, KV-POOL-005, and its lookups stop at the first missing block, KV-FULL-001.)""",
    source=f"{RADIX} RadixCache.evict (leaves only; a parent is queued once its last child is gone)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_007 = rule(
    "KV-TREE-007",
    "evict(n) removes at least what it can of n tokens and reports it",
    """evict(n) removes at least min(n, E) tokens when E tokens are evictable (held in unlocked pages),
    never more than E, returns their slots to the allocator, and reports the number of tokens it
    removed.""",
    source=f"{RADIX} RadixCache.evict (num_tokens_evicted, token_to_kv_pool_allocator.free_segment)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_008 = rule(
    "KV-TREE-008",
    "Least recently used leaves go first (page recency)",
    """Every lookup stamps the pages of its hit and every insertion the pages of its key, from one clock.
    The pages evict(n) removes are the first pages of the leaf-first LRU order: repeatedly the unlocked
    page without a held child that has the oldest stamp. An engine declares this recency with
    tree_recency = "page".""",
    source=f"{RADIX} RadixCache.evict with eviction_policy 'lru' (evict_policy.LRUStrategy)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_009 = rule(
    "KV-TREE-009",
    "Least recently used segments go first (segment recency)",
    """For an engine that keeps recency per stored segment (tree_recency = "segment": SGLang's radix
    nodes): a lookup or insertion stamps every segment it enters, the pages past its end included, and
    splits the segment where it ends; an insertion's new pages form one new segment. A lookup whose hit
    ends before its held prefix (a window or a state component: KV-TREE-017, KV-TREE-023) stamps the
    segments of its hit and, of the rest of the held prefix, only the segment the held prefix ends
    inside, which it splits at the held end and stamps both parts of; the whole segments between keep
    their stamps. The pages evict(n) removes are whole segments and the first pages of the leaf-first
    LRU order over those stamps.""",
    source=f"{RADIX} RadixCache._match_prefix_helper / _insert_helper (last_access_time set on the "
           "child before _split_node), RadixCache.evict (whole leaf nodes); "
           "sglang/srt/mem_cache/unified_cache/unified_tree_core.py (SGLang 0.5.23) "
           "UnifiedTreeCore._match_post_processor (the "
           "path from best_match_node up), _split_node (the new node's stamp at creation, "
           "child.last_access_time)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_010 = rule(
    "KV-TREE-010",
    "Capacity balances and allocation hands out free slots only",
    """An allocation returns distinct slots that neither the cache nor a request holds; after every
    operation the free slots, the slots the cache holds and the slots requests hold outside the cache
    add up to the capacity. vLLM's refinements: a block is free iff its count is 0 (KV-POOL-010), and
    the free count (KV-POOL-012).""",
    source=f"{ALLOC}token.py TokenToKVPoolAllocator.alloc/free/available_size; "
           f"{ALLOC}paged.py PagedTokenToKVPoolAllocator",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_011 = rule(
    "KV-TREE-011",
    "Protected and evictable sizes split what the cache holds",
    """The cache's protected size is the number of tokens it holds in pages with a lock count above 0;
    its evictable size is the number of the other tokens it holds.""",
    source=f"{RADIX} RadixCache.inc_lock_ref / dec_lock_ref / evictable_size / protected_size",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_012 = rule(
    "KV-TREE-012",
    "Insertion keeps the held copy and answers how much was held",
    """Inserting n tokens with their slots stores the first floor(n / P) * P tokens. It answers p, the
    longest held prefix of those tokens before the insertion; the pages of the first p tokens keep the
    slots they had (the caller's own slots for them are duplicates it still owns), and the later pages
    hold the given slots. vLLM keeps the first copy for its lookups too (KV-POOL-009), without
    removing the duplicate.""",
    source=f"{RADIX} RadixCache.insert / _insert_helper (InsertResult.prefix_len); RadixCache._insert_cache "
           "(frees kv_indices[cache_protected_len:prefix_len])",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_013 = rule(
    "KV-TREE-013",
    "Lookups change no content",
    """A lookup adds no page, removes none and changes no page's slots or lock count (it may refresh
    recency and reshape the engine's tree). vLLM's refinement: KV-LIFE-016.""",
    source=f"{RADIX} RadixCache.match_prefix (splits a node without duplicating data)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_014 = rule(
    "KV-TREE-014",
    "A lock counts once on every page of its path",
    """The lock count of a held page is the number of held locks whose path runs through it; locking a
    hit of h tokens adds 1 to each of its h / P pages, unlocking it subtracts 1 from the same pages,
    whatever the tree's shape in between. vLLM's refinement: reference counts balance the block tables
    (KV-POOL-011).""",
    source=f"{RADIX} RadixCache.inc_lock_ref / dec_lock_ref (walk to the root); _split_node copies lock_ref",
    chapter=CHAPTER,
    judged_by=SUITE,
)


# -- lookups --------------------------------------------------------------------------------------
@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, page_size: not result or hit % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, num_tokens, num_slots: not result or 0 <= hit == num_slots <= num_tokens,
                  enabled=ENABLED)
@defines(KV_TREE_001)
def is_aligned_hit(hit: int, num_slots: int, num_tokens: int, page_size: int) -> bool:
    """Whether a hit of ``hit`` tokens with ``num_slots`` slots is a page-aligned prefix of ``num_tokens``."""
    return 0 <= hit <= num_tokens and hit % page_size == 0 and num_slots == hit


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda num_tokens: num_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, page_size: result % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens: 0 <= result <= num_tokens, enabled=ENABLED)
@icontract.ensure(lambda result, held, page_size: all(held[:result // page_size]), enabled=ENABLED)
@icontract.ensure(lambda result, held, num_tokens, page_size:
                  result // page_size in (len(held), num_tokens // page_size) or not held[result // page_size],
                  enabled=ENABLED)
@defines(KV_TREE_003, KV_TREE_012)
def longest_held_prefix(held: tuple[bool, ...], num_tokens: int, page_size: int) -> int:
    """The tokens of the longest run of held pages from page 0, among the ``num_tokens // page_size``
    full pages of the request; ``held[j]`` says whether page ``j`` is held."""
    limit = min(len(held), num_tokens // page_size)
    run = 0
    while run < limit and held[run]:
        run += 1
    return run * page_size


@icontract.ensure(lambda result, written: all(0 <= i < len(written) for i in result), enabled=ENABLED)
@icontract.ensure(lambda result, written, namespace, tokens:
                  all(written[i] == (namespace, tokens[:i + 1]) for i in range(len(written)) if i not in result),
                  enabled=ENABLED)
@defines(KV_TREE_002, KV_TREE_004)
def misread_positions(written: tuple[tuple[int, tuple[int, ...]], ...], namespace: int,
                      tokens: tuple[int, ...]) -> tuple[int, ...]:
    """The positions of a hit whose slot does not hold the request's own KV: ``written[i]`` is what
    slot ``i`` of the hit holds, ``(namespace, prefix)`` of the token written there; position ``i``
    is right when it is ``(namespace, tokens[:i + 1])``."""
    return tuple(i for i, content in enumerate(written) if content != (namespace, tokens[:i + 1]))


@icontract.ensure(lambda result, written_namespaces, namespace:
                  all(written_namespaces[i] != namespace for i in result)
                  and len(result) == sum(1 for s in written_namespaces if s != namespace), enabled=ENABLED)
@defines(KV_TREE_004)
def foreign_positions(written_namespaces: tuple[int, ...], namespace: int) -> tuple[int, ...]:
    """The positions of a hit whose slot holds KV written in another namespace than ``namespace``."""
    return tuple(i for i, s in enumerate(written_namespaces) if s != namespace)


# -- the shape of what is held --------------------------------------------------------------------
@icontract.require(lambda parents, held: len(parents) == len(held), enabled=ENABLED)
@icontract.require(lambda parents: all(-1 <= p < len(parents) for p in parents), enabled=ENABLED)
@icontract.ensure(lambda result, parents, held:
                  result == all(not h or p < 0 or held[p] for p, h in zip(parents, held)), enabled=ENABLED)
@defines(KV_TREE_006)
def is_prefix_closed(parents: tuple[int, ...], held: tuple[bool, ...]) -> bool:
    """Whether every held page's parent is held: ``parents[i]`` is page ``i``'s parent (-1 for a
    page 0), ``held[i]`` whether page ``i`` is held."""
    return all(not held[i] or parents[i] < 0 or held[parents[i]] for i in range(len(held)))


# -- eviction -------------------------------------------------------------------------------------
@icontract.require(lambda asked, evictable, removed: asked >= 0 and evictable >= 0 and removed >= 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, asked, evictable, removed, reported:
                  not result or (min(asked, evictable) <= removed <= evictable and reported == removed),
                  enabled=ENABLED)
@defines(KV_TREE_007)
def evicted_enough(asked: int, evictable: int, removed: int, reported: int) -> bool:
    """Whether an ``evict(asked)`` that removed ``removed`` tokens (of ``evictable``) and reported
    ``reported`` kept its promise."""
    return min(asked, evictable) <= removed <= evictable and reported == removed


@icontract.ensure(lambda result, removed_locks: result == all(c == 0 for c in removed_locks), enabled=ENABLED)
@defines(KV_TREE_005)
def evicts_no_locked_page(removed_locks: tuple[int, ...]) -> bool:
    """Whether every removed page had a lock count of 0 when it was removed."""
    return all(count == 0 for count in removed_locks)


def _children_left(parents: tuple[int, ...], gone: list[bool]) -> list[int]:
    counts = [0] * len(parents)
    for i, p in enumerate(parents):
        if p >= 0 and not gone[i]:
            counts[p] += 1
    return counts


@icontract.require(lambda parents, stamps, locks: len(parents) == len(stamps) == len(locks), enabled=ENABLED)
@icontract.require(lambda parents: all(-1 <= p < len(parents) for p in parents), enabled=ENABLED)
@icontract.require(lambda parents: all(p < i for i, p in enumerate(parents)), enabled=ENABLED)
@icontract.ensure(lambda result: len(set(result)) == len(result), enabled=ENABLED)
@icontract.ensure(lambda result, locks: all(locks[i] == 0 for i in result), enabled=ENABLED)
@icontract.ensure(lambda result, parents:
                  all(result.index(c) < result.index(parents[c]) for c in result if parents[c] in result),
                  enabled=ENABLED)
@defines(KV_TREE_008, KV_TREE_009)
def lru_leaf_order(parents: tuple[int, ...], stamps: tuple[int, ...], locks: tuple[int, ...]) -> tuple[int, ...]:
    """The order in which eviction removes pages: repeatedly the unlocked page without a remaining
    child that has the oldest stamp (the lower index first among equal stamps). Pages are listed
    parents first (``parents[i] < i``); a page with a locked descendant never becomes a leaf, so
    the order holds exactly the pages eviction can remove."""
    gone = [False] * len(parents)
    order: list[int] = []
    while True:
        children = _children_left(parents, gone)
        leaves = [i for i in range(len(parents)) if not gone[i] and children[i] == 0 and locks[i] == 0]
        if not leaves:
            return tuple(order)
        oldest = min(leaves, key=lambda i: (stamps[i], i))
        gone[oldest] = True
        order.append(oldest)


@icontract.require(lambda order: len(set(order)) == len(order), enabled=ENABLED)
@icontract.ensure(lambda result, removed, order: not result or set(removed) == set(order[:len(removed)]),
                  enabled=ENABLED)
@defines(KV_TREE_008, KV_TREE_009)
def removes_an_lru_prefix(removed: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """Whether the pages ``removed`` (in any order) are the first ``len(removed)`` pages of ``order``."""
    return len(set(removed)) == len(removed) and set(removed) == set(order[:len(removed)])


@icontract.require(lambda hit_pages, pages_after: hit_pages >= 0 and pages_after >= 0, enabled=ENABLED)
@icontract.require(lambda recency: recency in RECENCY_MODES, enabled=ENABLED)
@icontract.ensure(lambda result, hit_pages, recency: result == hit_pages or recency == SEGMENT_RECENCY,
                  enabled=ENABLED)
@icontract.ensure(lambda result, hit_pages, pages_after: hit_pages <= result <= hit_pages + pages_after,
                  enabled=ENABLED)
@defines(KV_TREE_008, KV_TREE_009)
def pages_stamped(hit_pages: int, pages_after: int, recency: str) -> int:
    """How many pages along a lookup's or insertion's path it stamps: the ``hit_pages`` it covers,
    and with segment recency also the ``pages_after`` its last entered segment has past its end
    (none when it covers no page)."""
    if recency == SEGMENT_RECENCY and hit_pages > 0:
        return hit_pages + pages_after
    return hit_pages


# -- capacity -------------------------------------------------------------------------------------
@icontract.require(lambda free, cached, requests, capacity: min(free, cached, requests, capacity) >= 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, free, cached, requests, capacity: result == (free + cached + requests == capacity),
                  enabled=ENABLED)
@defines(KV_TREE_010)
def capacity_balances(free: int, cached: int, requests: int, capacity: int) -> bool:
    """Whether ``free`` slots, the ``cached`` slots the cache holds and the slots ``requests`` hold
    outside it add up to ``capacity``."""
    return free + cached + requests == capacity


@icontract.ensure(lambda result, expected, actual: not result or len(expected) == len(actual), enabled=ENABLED)
@icontract.ensure(lambda result, expected, actual: not result or set(expected) == set(actual),
                  "the same pages in the same slots, whatever the listing's order", enabled=ENABLED)
@defines(KV_TREE_013)
def same_content(expected: tuple[tuple[object, tuple[int, ...]], ...],
                 actual: tuple[tuple[object, tuple[int, ...]], ...]) -> bool:
    """Whether a cache listing its held pages as ``(page, slots)`` pairs in ``actual`` holds exactly
    the pages of ``expected``, each in the same slots. A listing that names a page twice never
    does. (A step that changes no content, a lookup, leaves the listing it found.)"""
    return len({page for page, _ in actual}) == len(actual) and len({page for page, _ in expected}) == len(
        expected) and dict(expected) == dict(actual)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda page_locks: all(c >= 0 for c in page_locks), enabled=ENABLED)
@icontract.ensure(lambda result, page_locks, page_size: result[0] + result[1] == len(page_locks) * page_size,
                  enabled=ENABLED)
@defines(KV_TREE_011)
def cache_sizes(page_locks: tuple[int, ...], page_size: int) -> tuple[int, int]:
    """``(evictable, protected)`` tokens of a cache whose held pages have these lock counts."""
    protected = sum(page_size for count in page_locks if count > 0)
    return len(page_locks) * page_size - protected, protected


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda hit: hit >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, page_size: len(result) == hit // page_size, enabled=ENABLED)
@icontract.ensure(lambda result, counts: all(result[j] == counts[j] + 1 for j in range(min(len(result), len(counts)))),
                  enabled=ENABLED)
@defines(KV_TREE_014)
def locked_counts(counts: tuple[int, ...], hit: int, page_size: int) -> tuple[int, ...]:
    """The lock counts of a path's first ``hit // page_size`` pages after a lock on a hit of ``hit``
    tokens, given their counts before (``counts``; a page not listed counted 0)."""
    return tuple((counts[j] if j < len(counts) else 0) + 1 for j in range(hit // page_size))


KV_TREE_015 = rule(
    "KV-TREE-015",
    "A prefix tree's page size and capacity are positive",
    """A prefix tree has a page size of at least 1 token and a capacity of at least one page; slots are
    allocated in whole pages. kvoracle refuses anything else before an engine sees it.""",
    source="kvoracle input validation (kvoracle.reference.prefix_tree)",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)


@icontract.ensure(lambda result: result in ("", "page_size", "num_pages"), enabled=ENABLED)
@defines(KV_TREE_015)
def first_invalid_tree_parameter(page_size: int, num_pages: int) -> str:
    """The first impossible parameter of a prefix tree, or ``""``."""
    if page_size < 1:
        return "page_size"
    if num_pages < 1:
        return "num_pages"
    return ""


# -- a window component (a hybrid model's sliding-window layers) ----------------------------------
SWA = "sglang/srt/mem_cache/unified_cache/components/swa.py (SGLang 0.5.23)"
CORE = "sglang/srt/mem_cache/unified_cache/unified_tree_core.py"

KV_TREE_016 = rule(
    "KV-TREE-016",
    "A hit ends where its window's KV is held",
    """For a cache with a window component of W tokens: a hit of h > 0 tokens holds the window KV of
    every page that overlaps its last min(h, W) tokens (ceil(W / P) pages, or all h / P when fewer), so
    that the request's window layers can resume after it. vLLM's form: a sliding-window hit needs the
    blocks of the last window - 1 tokens (KV-SWA-001, KV-SWA-002); the acceptance test is the same
    (sliding_window.accepts), with SGLang's reach of W tokens (its swa_retain_window).""",
    source=f"{SWA} SWAComponent.create_match_validator (a match may end at a node once the run of "
           "window-holding nodes before it covers sliding_window_size tokens, or reaches the root)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_017 = rule(
    "KV-TREE-017",
    "The hit is the longest held prefix whose window is held",
    """For a cache with a window component: the hit is the longest h, a multiple of P, within the
    longest held prefix (KV-TREE-003), that is 0 or whose last min(h, W) tokens' pages hold their window
    KV (KV-TREE-016). Where every page of the held prefix holds its window KV this is KV-TREE-003. vLLM's
    form: KV-SWA-002 (the greatest accepted length).""",
    source=f"{CORE} UnifiedTreeCore._match_prefix_helper (best_match_node: the deepest node every "
           "component's validator accepts)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_018 = rule(
    "KV-TREE-018",
    "Evicting window KV spares locked windows and the KV of inner pages, and reports it",
    """evict_window(n) drops the window KV of at least min(n, E) tokens when E tokens of window KV are
    held outside locked windows (KV-TREE-019), never more than E, and reports the window tokens it
    dropped. A page whose window KV it drops stays held with its full-attention KV while a held page
    descends from it; a leaf may be removed whole (its slots freed), as by evict (KV-TREE-005, 006).""",
    source=f"{SWA} SWAComponent.evict_component / _evict_device_next_node (internal nodes become "
           f"tombstones; leaves are evicted whole); {CORE} _evict_component_and_detach_lru",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_019 = rule(
    "KV-TREE-019",
    "A lock protects its hit's window",
    """While a lock on a hit of h tokens is held, every page overlapping the hit's last min(h, W) tokens
    holds its window KV: evictions never drop it. (A lock protects every page's full-attention KV,
    KV-TREE-005; the window KV of the pages before the window may go.) vLLM's form: a request's blocks
    inside its window are referenced, KV-POOL-010.""",
    source=f"{SWA} SWAComponent.acquire_component_lock / release_component_lock (the lock covers the "
           "nodes of the trailing sliding_window_size tokens, tombstones included)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_020 = rule(
    "KV-TREE-020",
    "An insertion leaves its key's pages with their window KV",
    """After inserting n tokens, every page of the key past the inserter's own held prefix holds its
    window KV: a page held without it gets it from the insertion. The insertion answers the held prefix
    as KV-TREE-012 says. A page re-filled this way keeps its full-attention slots or, when no lock runs
    through it, may take the inserter's slots for both kinds (its old slots are freed; SGLang does so);
    this is the only change of a held page's slots an insertion makes.""",
    source=f"{SWA} SWAComponent.update_component_on_insert_overlap / _recover_from_incoming "
           "(RecoverSWAWithLockedFull when the full value is locked); commit_insert_component_data",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_021 = rule(
    "KV-TREE-021",
    "Window KV slots balance",
    """The window KV slots are a capacity of their own: at every moment the free window slots, the
    window slots of the pages holding window KV, and the window slots requests hold outside the cache
    (one per token they hold) add up to the window capacity; and the cache's own account of its window
    tokens (evictable plus protected) is the window KV it holds.""",
    source="sglang/srt/mem_cache/allocator/swa.py SWATokenToKVPoolAllocator (swa_available_size, "
           f"free_swa); {SWA} (component_evictable_size_ / component_protected_size_)",
    chapter=CHAPTER,
    judged_by=SUITE,
)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.ensure(lambda result, window, page_size: result * page_size >= window, enabled=ENABLED)
@icontract.ensure(lambda result, window, page_size: (result - 1) * page_size < window, enabled=ENABLED)
@defines(KV_TREE_016, KV_TREE_019)
def window_pages(window: int, page_size: int) -> int:
    """How many pages the last ``window`` tokens of a page-aligned hit overlap (at most)."""
    return -(-window // page_size)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda hit, page_size: hit >= 0 and hit % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, windowed, page_size, window:
                  result == (hit == 0 or (hit // page_size <= len(windowed) and all(
                      windowed[j] for j in range(max(0, hit // page_size - window_pages(window, page_size)),
                                                 hit // page_size)))), enabled=ENABLED)
@defines(KV_TREE_016)
def window_hit_ok(windowed: tuple[bool, ...], hit: int, window: int, page_size: int) -> bool:
    """Whether a hit of ``hit`` tokens may end there: ``windowed[j]`` says whether page ``j`` holds
    its window KV. The test is vLLM's (:func:`kvoracle.spec.sliding_window.accepts`) with the
    need counted in pages of the window's ``window`` tokens."""
    return accepts(windowed, hit // page_size, window_pages(window, page_size), page_size, page_size)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda held, page_size: held >= 0 and held % page_size == 0, enabled=ENABLED)
@icontract.require(lambda windowed, held, page_size: held // page_size <= len(windowed), enabled=ENABLED)
@icontract.ensure(lambda result, held: 0 <= result <= held, enabled=ENABLED)
@icontract.ensure(lambda result, page_size: result % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, windowed, window, page_size: window_hit_ok(windowed, result, window, page_size),
                  enabled=ENABLED)
@icontract.ensure(lambda result, windowed, held, window, page_size:
                  not all(windowed[:held // page_size]) or result == held, enabled=ENABLED)
@defines(KV_TREE_017)
def longest_windowed_hit(windowed: tuple[bool, ...], held: int, window: int, page_size: int) -> int:
    """The hit within a held prefix of ``held`` tokens: the longest page-aligned length whose
    window KV is held (KV-TREE-016), or 0."""
    for pages in range(held // page_size, 0, -1):
        if window_hit_ok(windowed, pages * page_size, window, page_size):
            return pages * page_size
    return 0


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda window: window > 0, enabled=ENABLED)
@icontract.require(lambda hit, page_size: hit >= 0 and hit % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, page_size: all(0 <= j < hit // page_size for j in result), enabled=ENABLED)
@icontract.ensure(lambda result, hit, window, page_size: len(result) == min(hit // page_size,
                                                                              window_pages(window, page_size)),
                  enabled=ENABLED)
@defines(KV_TREE_019)
def window_locked_pages(hit: int, window: int, page_size: int) -> tuple[int, ...]:
    """The pages of a locked hit of ``hit`` tokens whose window KV the lock protects."""
    pages = hit // page_size
    return tuple(range(max(0, pages - window_pages(window, page_size)), pages))


@icontract.require(lambda asked, evictable, dropped: asked >= 0 and evictable >= 0 and dropped >= 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, asked, evictable, dropped, reported, locked_dropped, inner_removed:
                  not result or (min(asked, evictable) <= dropped <= evictable and reported == dropped
                                 and locked_dropped == 0 and inner_removed == 0), enabled=ENABLED)
@defines(KV_TREE_018)
def window_eviction_ok(asked: int, evictable: int, dropped: int, reported: int, locked_dropped: int,
                       inner_removed: int) -> bool:
    """Whether an ``evict_window(asked)`` kept its promise: it dropped ``dropped`` window tokens of
    the ``evictable`` ones, reported ``reported``, dropped ``locked_dropped`` of locked windows, and
    removed ``inner_removed`` pages that kept a held child."""
    return (min(asked, evictable) <= dropped <= evictable and reported == dropped and locked_dropped == 0
            and inner_removed == 0)


@icontract.require(lambda free, windowed, requests, capacity, account:
                   min(free, windowed, requests, capacity, account) >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, free, windowed, requests, capacity, account:
                  result == (capacity_balances(free, windowed, requests, capacity) and account == windowed),
                  enabled=ENABLED)
@defines(KV_TREE_021)
def window_slots_balance(free: int, windowed: int, requests: int, capacity: int, account: int) -> bool:
    """Whether ``free`` window slots, the ``windowed`` ones of the pages holding window KV and the
    ``requests``' add up to ``capacity``, and the cache's own ``account`` is ``windowed``."""
    return capacity_balances(free, windowed, requests, capacity) and account == windowed


# -- a state component (a hybrid model's recurrent layers: SGLang's Mamba) ------------------------
MAMBA = "sglang/srt/mem_cache/unified_cache/components/mamba.py (SGLang 0.5.23)"

KV_TREE_022 = rule(
    "KV-TREE-022",
    "A hit ends at a page that holds a state",
    """For a cache with a state component (recurrent layers, whose state after a prefix is all they need
    to resume): a hit of h > 0 tokens ends at a page that holds the state after its last token, so that
    the request's recurrent layers can resume after it. vLLM's form: a Mamba hit ends at a cached state
    block (KV-MAMBA-001), which holds the state after the hit's tokens (KV-MAMBA-015).""",
    source=f"{MAMBA} MambaComponent.create_match_validator (a node is a valid match end only while it holds "
           f"its MAMBA value); {CORE} UnifiedTreeCore._match_prefix_helper (best_match_node)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_023 = rule(
    "KV-TREE-023",
    "The hit is the longest held prefix that ends at a state",
    """For a cache with a state component: the hit is the longest h, a multiple of P, within the longest
    held prefix (KV-TREE-003), that is 0 or ends at a page holding a state (KV-TREE-022). Where the held
    prefix's last page holds a state this is KV-TREE-003. vLLM's form: KV-MAMBA-001 (the rightmost cached
    state block).""",
    source=f"{CORE} UnifiedTreeCore._match_prefix_helper / _match_post_processor (the deepest node every "
           "component's validator accepts; the full-KV match may go on past it)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_024 = rule(
    "KV-TREE-024",
    "Evicting states spares locked states and the KV of inner pages, and reports it",
    """evict_states(n) drops at least min(n, E) states when E states are held outside held locks
    (KV-TREE-025), never more than E, and reports the number it dropped. A page whose state it drops
    stays held with its KV while a held page descends from it. It may remove a leaf whose state it drops
    whole (its slots freed, as by evict: KV-TREE-005, 006), and with it the pages above it that hold no
    state and keep no other held child; it removes no other page.""",
    source=f"{MAMBA} MambaComponent._evict_device_next_node (an evictable leaf is evicted whole, an inner "
           f"node loses only its MAMBA value) / evict_component; {CORE} evict_device_leaf, "
           "_evict_component_and_detach_lru; unified_radix_cache.py UnifiedRadixCache._evict "
           "(EvictResult.mamba_num_evicted)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_025 = rule(
    "KV-TREE-025",
    "A lock protects its path's last state",
    """While a lock on a path of h > 0 tokens is held (a hit, or what a running request inserted), the
    page that ends the path keeps its state: evictions never drop it. (The lock protects every page's KV,
    KV-TREE-005; the states of the path's other pages may go: the request resumes from the end only.)
    vLLM's form: a running request's state blocks are referenced, KV-POOL-010.""",
    source=f"{MAMBA} MambaComponent.acquire_component_lock / release_component_lock (the lock counts on the "
           f"anchor node's MAMBA value only); {CORE} UnifiedLRUList.get_lru_no_lock / get_prev_no_lock",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_026 = rule(
    "KV-TREE-026",
    "An insertion leaves a state at its key's end",
    """Inserting n >= P tokens with the state after them leaves a state at the key's last page (its
    first floor(n / P) * P tokens): the given one where that page held none, which the cache then owns;
    else the page keeps its own and the given state is a duplicate the caller gets back (SGLang's
    InsertResult.mamba_exist). The insertion gives no other page a state and drops none. The insertion
    answers the held prefix as KV-TREE-012 says.""",
    source=f"{MAMBA} MambaComponent.commit_insert_component_data (new leaf, existing node without a "
           f"state, existing state: mamba_exist) / cleanup_after_caching_req (frees the duplicate); "
           f"{CORE} UnifiedTreeCore._insert_commit_step",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_027 = rule(
    "KV-TREE-027",
    "State slots balance",
    """The state slots are a capacity of their own: at every moment the free state slots, the state slots
    of the pages holding a state and the state slots requests hold outside the cache add up to the state
    capacity; and the cache's own account splits the states it holds into protected ones, those at the end
    of a held lock's path (KV-TREE-025), and evictable ones, the rest.""",
    source="sglang/srt/mem_cache/allocator/mamba.py MambaSlotAllocator (available_size, free); "
           f"{MAMBA} (component_evictable_size_ / component_protected_size_ in acquire_component_lock, "
           "release_component_lock, evict_component)",
    chapter=CHAPTER,
    judged_by=SUITE,
)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda hit, page_size: hit >= 0 and hit % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit, states, page_size:
                  result == (hit == 0 or (hit // page_size <= len(states) and states[hit // page_size - 1])),
                  enabled=ENABLED)
@defines(KV_TREE_022)
def state_hit_ok(states: tuple[bool, ...], hit: int, page_size: int) -> bool:
    """Whether a hit of ``hit`` tokens may end there: ``states[j]`` says whether page ``j`` holds the
    state after its last token."""
    pages = hit // page_size
    return pages == 0 or (pages <= len(states) and states[pages - 1])


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda held, page_size: held >= 0 and held % page_size == 0, enabled=ENABLED)
@icontract.require(lambda states, held, page_size: held // page_size <= len(states), enabled=ENABLED)
@icontract.ensure(lambda result, held: 0 <= result <= held, enabled=ENABLED)
@icontract.ensure(lambda result, page_size: result % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, states, page_size: state_hit_ok(states, result, page_size), enabled=ENABLED)
@icontract.ensure(lambda result, states, held, page_size:
                  not any(states[result // page_size:held // page_size]), "no longer prefix ends at a state",
                  enabled=ENABLED)
@icontract.ensure(lambda result, states, held, page_size:
                  held == 0 or not states[held // page_size - 1] or result == held, enabled=ENABLED)
@defines(KV_TREE_023)
def longest_state_hit(states: tuple[bool, ...], held: int, page_size: int) -> int:
    """The hit within a held prefix of ``held`` tokens: the longest page-aligned length that ends at a
    page holding a state (KV-TREE-022), or 0."""
    for pages in range(held // page_size, 0, -1):
        if states[pages - 1]:
            return pages * page_size
    return 0


@icontract.require(lambda hit, page_size: page_size > 0 and hit >= 0 and hit % page_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit: len(result) == (1 if hit else 0), enabled=ENABLED)
@icontract.ensure(lambda result, hit, page_size: all(j == hit // page_size - 1 for j in result), enabled=ENABLED)
@defines(KV_TREE_025)
def state_locked_pages(hit: int, page_size: int) -> tuple[int, ...]:
    """The pages of a locked path of ``hit`` tokens whose state the lock protects: its last one."""
    return (hit // page_size - 1,) if hit else ()


@icontract.require(lambda parents, states: len(parents) == len(states), enabled=ENABLED)
@icontract.require(lambda parents, removed, dropped: all(0 <= i < len(parents) for i in (*removed, *dropped)),
                   enabled=ENABLED)
@icontract.ensure(lambda result, removed, dropped: result or bool(removed), "removing nothing is always allowed",
                  enabled=ENABLED)
@icontract.ensure(lambda result, parents, states, removed, dropped:
                  result == all(i in dropped or (not states[i] and any(parents[c] == i for c in removed))
                                for i in removed), enabled=ENABLED)
@defines(KV_TREE_024)
def state_removals_ok(parents: tuple[int, ...], states: tuple[bool, ...], removed: tuple[int, ...],
                      dropped: tuple[int, ...]) -> bool:
    """Whether every page a state eviction removed is one whose state it ``dropped``, or one that held no
    state (``states``) and loses a child with it (so that, the removal being closed under leaves, it lies
    above a dropped state): ``parents[i]`` is page ``i``'s parent, -1 for a page 0."""
    gone = set(removed)
    return all(i in dropped or (not states[i] and any(parents[c] == i for c in gone)) for i in removed)


@icontract.require(lambda asked, evictable, dropped: asked >= 0 and evictable >= 0 and dropped >= 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, asked, evictable, dropped, reported, locked_dropped, inner_removed,
                  stray_removed:
                  not result or (min(asked, evictable) <= dropped <= evictable and reported == dropped
                                 and locked_dropped == 0 and inner_removed == 0 and stray_removed == 0),
                  enabled=ENABLED)
@defines(KV_TREE_024)
def state_eviction_ok(asked: int, evictable: int, dropped: int, reported: int, locked_dropped: int,
                      inner_removed: int, stray_removed: int) -> bool:
    """Whether an ``evict_states(asked)`` kept its promise: it dropped ``dropped`` states of the
    ``evictable`` ones, reported ``reported``, dropped ``locked_dropped`` locked ones, removed
    ``inner_removed`` pages that kept a held child and ``stray_removed`` pages
    :func:`state_removals_ok` does not allow."""
    return (min(asked, evictable) <= dropped <= evictable and reported == dropped and locked_dropped == 0
            and inner_removed == 0 and stray_removed == 0)


@icontract.require(lambda page_size: page_size > 0, enabled=ENABLED)
@icontract.require(lambda key_tokens: key_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, key_tokens, page_size: result == (key_tokens // page_size > 0), enabled=ENABLED)
@defines(KV_TREE_026)
def insertion_leaves_state(key_tokens: int, page_size: int) -> bool:
    """Whether inserting ``key_tokens`` tokens leaves a state in the cache (at its last full page)."""
    return key_tokens // page_size > 0


@icontract.require(lambda had_state: isinstance(had_state, bool), enabled=ENABLED)
@icontract.ensure(lambda result, had_state: result == (not had_state), enabled=ENABLED)
@defines(KV_TREE_026)
def insertion_adopts_state(had_state: bool) -> bool:
    """Whether an insertion's given state is the cache's afterwards: only where the key's last page held
    none (else the caller gets it back)."""
    return not had_state


@icontract.require(lambda free, held, requests, capacity, evictable, protected, locked_ends:
                   min(free, held, requests, capacity, evictable, protected, locked_ends) >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, free, held, requests, capacity, evictable, protected, locked_ends:
                  result == (capacity_balances(free, held, requests, capacity) and protected == locked_ends
                             and evictable + protected == held), enabled=ENABLED)
@defines(KV_TREE_027)
def state_slots_balance(free: int, held: int, requests: int, capacity: int, evictable: int, protected: int,
                        locked_ends: int) -> bool:
    """Whether ``free`` state slots, the ``held`` ones of the pages holding a state and the
    ``requests``' add up to ``capacity``, and the cache's own account is ``protected`` states at the
    ``locked_ends`` (the distinct pages ending a held lock's path, each holding a state) and
    ``evictable`` the rest."""
    return capacity_balances(free, held, requests, capacity) and protected == locked_ends and (
        evictable + protected == held)


# -- the order of a component's evictions ---------------------------------------------------------
KV_TREE_028 = rule(
    "KV-TREE-028",
    "Window KV goes least recently used first (page recency)",
    """For a cache with a window component and page recency (tree_recency = "page"): every held page's
    window KV carries a stamp from the tree's clock (the one lookups and insertions tick, KV-TREE-008). A
    lookup with a hit of h > 0 tokens stamps the window KV of the pages overlapping its last min(h, W)
    tokens (the window KV the hit uses, KV-TREE-016); an insertion stamps the window KV of every page it
    stores or re-fills (KV-TREE-020) and of the pages overlapping its key's last W tokens. Nothing else
    stamps window KV (not locks, not the rest of a hit's path). evict_window(n) drops the window KV of the
    first pages of the order: repeatedly, among the pages holding window KV outside the locked windows
    (KV-TREE-019), the one with the oldest stamp, the shorter prefix first among equal stamps (the page
    further from the window that stamped them).""",
    source=f"{SWA} SWAComponent.refresh_lru (MATCH_END / INSERT_END refresh a window back from the match's "
           f"or insertion's end node; WALKDOWN nothing), _evict_device_next_node (one walk from the LRU tail); "
           f"{CORE} UnifiedLRUList.reset_node_and_window_ancestors_mru, get_lru_no_lock / get_prev_no_lock, "
           "UnifiedTreeCore.set_component_device_value (insert_mru)",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_029 = rule(
    "KV-TREE-029",
    "Window KV goes least recently used first (segment recency)",
    """For an engine that keeps recency per stored segment (tree_recency = "segment": SGLang's radix nodes
    and its SWA component's LRU list of them), KV-TREE-028 over whole segments: a lookup stamps the window
    KV of the segments from its hit's last page back until they cover W + P tokens (SGLang refreshes
    sliding_window_size + page_size tokens of nodes, one page more than the window), an insertion those of
    its key's last page back as far, besides the segments it stores or re-fills; a lock pins the window
    KV of the segments from its path's last page back until they cover W tokens (KV-TREE-019's window, in
    whole segments); a segment split later keeps its stamp and its pins on both parts, its first part the
    older. evict_window(n) drops the window KV of whole segments, the first of the order over those
    stamps among the segments no lock pins.""",
    source=f"{SWA} SWAComponent.refresh_lru (reset_node_and_window_ancestors_mru with "
           f"sliding_window_size + page_size), acquire_component_lock (whole nodes until the window is "
           f"covered), _populate_range (older fragments published first); {CORE} UnifiedTreeCore._split_node "
           "(insert_after(child, new_parent)), UnifiedLRUList.get_prev_no_lock",
    chapter=CHAPTER,
    judged_by=SUITE,
)
KV_TREE_030 = rule(
    "KV-TREE-030",
    "States go least recently used first",
    """For a cache with a state component: every held state carries a stamp from the tree's clock. A lookup
    with a hit of h > 0 tokens stamps the state at the hit's last page (the one its request resumes from,
    KV-TREE-022), an insertion of n >= P tokens the state it leaves at its key's last page, adopted or
    kept (KV-TREE-026). Nothing else stamps a state: not the states on a lookup's or insertion's path
    before its end, not locks. evict_states(n) drops the first states of the order: repeatedly the state
    outside the locked paths' ends (KV-TREE-025) with the oldest stamp, the shorter prefix first among
    equal stamps. A state sits at one page, so page and segment recency agree.""",
    source=f"{MAMBA} MambaComponent.refresh_lru (MATCH_END moves the best match node's state to the MRU end; "
           f"WALKDOWN and INSERT_END nothing), commit_insert_component_data (insert_mru / reset_node_mru), "
           f"_evict_device_next_node; {CORE} UnifiedLRUList.get_lru_no_lock / get_prev_no_lock, "
           "UnifiedTreeCore.set_component_device_value (insert_mru)",
    chapter=CHAPTER,
    judged_by=SUITE,
)


@icontract.require(lambda window, page_size: window > 0 and page_size > 0, enabled=ENABLED)
@icontract.require(lambda recency: recency in RECENCY_MODES, enabled=ENABLED)
@icontract.ensure(lambda result, window, page_size, recency:
                  result == (window if recency == PAGE_RECENCY else window + page_size), enabled=ENABLED)
@defines(KV_TREE_028, KV_TREE_029)
def window_refresh_reach(window: int, page_size: int, recency: str) -> int:
    """How many tokens back from a lookup's or insertion's end its window stamp reaches: the window's
    ``window`` with page recency, one page more with segment recency (SGLang's)."""
    return window if recency == PAGE_RECENCY else window + page_size


@icontract.require(lambda lengths: all(n > 0 for n in lengths), enabled=ENABLED)
@icontract.require(lambda reach: reach >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, lengths: 0 <= result <= len(lengths), enabled=ENABLED)
@icontract.ensure(lambda result, lengths, reach: result == 0 or sum(lengths[:result - 1]) < reach,
                  "every segment entered starts within the reach", enabled=ENABLED)
@icontract.ensure(lambda result, lengths, reach: result == len(lengths) or sum(lengths[:result]) >= reach,
                  "the walk stops only once the reach is covered", enabled=ENABLED)
@defines(KV_TREE_028, KV_TREE_029)
def segments_reached(lengths: tuple[int, ...], reach: int) -> int:
    """How many segments, counted from a path's last one back (``lengths[0]`` tokens long, then its
    parent's ...), a walk covering ``reach`` tokens enters: each one it starts before ``reach`` tokens are
    covered. With every page its own segment and a reach of W tokens these are the pages overlapping the
    last W tokens (:func:`window_locked_pages`); a lock's pin is the same walk with a reach of W."""
    covered, count = 0, 0
    while count < len(lengths) and covered < reach:
        covered += lengths[count]
        count += 1
    return count


def _order_key(stamps: tuple[int, ...], depths: tuple[int, ...], i: int) -> tuple[int, int, int]:
    return stamps[i], depths[i], i


@icontract.require(lambda stamps, depths, candidates: len(stamps) == len(depths) == len(candidates),
                   enabled=ENABLED)
@icontract.ensure(lambda result, candidates: sorted(result) == [i for i, c in enumerate(candidates) if c],
                  "the order holds every candidate once, and nothing else", enabled=ENABLED)
@icontract.ensure(lambda result, stamps, depths: all(
    (stamps[a], depths[a]) <= (stamps[b], depths[b]) for a, b in pairwise(result)),
    "oldest stamp first, the shorter prefix first among equal stamps", enabled=ENABLED)
@defines(KV_TREE_028, KV_TREE_029, KV_TREE_030)
def component_lru_order(stamps: tuple[int, ...], depths: tuple[int, ...],
                        candidates: tuple[bool, ...]) -> tuple[int, ...]:
    """The order in which a component eviction drops content: the pages whose content it may drop
    (``candidates[i]``: page ``i`` holds it, outside every lock's protection), oldest ``stamps`` first,
    the smaller ``depths`` (pages from the root) first among equal stamps, then the lower index."""
    return tuple(sorted((i for i in range(len(candidates)) if candidates[i]),
                        key=lambda i: _order_key(stamps, depths, i)))


@icontract.require(lambda order: len(set(order)) == len(order), enabled=ENABLED)
@icontract.ensure(lambda result, dropped, order:
                  result == (len(set(dropped)) == len(dropped) and set(dropped) == set(order[:len(dropped)])),
                  enabled=ENABLED)
@defines(KV_TREE_028, KV_TREE_029, KV_TREE_030)
def drops_an_order_prefix(dropped: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """Whether the pages whose content a component eviction dropped (in any order) are the first
    ``len(dropped)`` pages of its ``order`` (:func:`component_lru_order`)."""
    return removes_an_lru_prefix(dropped, order)
