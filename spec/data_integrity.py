"""Chapter 5 -- Data integrity of the paged KV store.

The other chapters judge block *ids*: which block a lookup returns, which one an
allocation hands out, in which order freed blocks come back. This chapter judges
what those ids stand for: the KV data in the blocks. A wrong block id is then
not only a different number but visibly wrong data.

**The paged store.** Each KV-cache group has a store of ``num_blocks`` blocks of
``block_size`` slots. Token position ``p`` of a request lives in slot
``p % block_size`` of block ``table[p // block_size]`` of the request's block
table. When the scheduler runs a step, the forward pass writes the KV of every
token it computed into that token's slot. The value written is a stand-in for
real KV: a deterministic 64-bit value of the token id, its position and the
whole prefix before it (and the cache salt), :func:`slot_value`, chained token
by token from :func:`prefix_seed` like the block hashes of chapter 1. Two slots
hold equal values (barring a 64-bit collision) exactly when they hold the KV
of the same token at the same position after the same prefix. A slot nobody
wrote holds :data:`UNWRITTEN` (0), a value :func:`slot_value` never returns.

A step writes the tokens it scheduled that the request already has, drafts
included: a cached block covers at most the tokens of the step that cached it
(``num_tokens_to_cache``, KV-LIFE-007), and those are written by the same
step's forward pass.

**What a conforming engine guarantees about the data.** A prefix-cache hit
stands in for computing the prefix: reading the hit blocks through the block
table must give exactly what the request's own forward pass would have
written (KV-DATA-001), and every hit slot must have been written by someone
(KV-DATA-002). While a request holds a block, the data it relies on -- the
slots it computed or adopted from a hit -- never changes (KV-DATA-003); a block
can only be rewritten after every holder has freed it. A block listed under a
cache key holds the data that key names (KV-DATA-004): reusing a cached block
for other contents must drop its key first (KV-POOL-005). The null block
stands for "no KV here" and is never written (KV-DATA-005).

**Which positions a request relies on, group by group.** A hybrid model has one
store per KV-cache group, each with its own block size and block table. In a
full-attention group a request relies on every position it computed or adopted.
A sliding-window or chunked-local group only reads a window: the positions before
:func:`first_relied_position` (the skipped tokens of KV-SWA-006 and KV-CHUNK-002)
are owed nothing -- their blocks may have been freed and rewritten by others
(KV-SWA-007) or be the null block in a hit (KV-HLC-003). From that position on,
the rules above hold in every group, and the positions a group relies on never
lie in the null block (KV-DATA-006). Mamba and cross-attention groups hold no
per-token KV of the request's own tokens (a recurrent state; the encoder's
output), so the store writes nothing in them and these rules do not judge them.

**Telling the failures apart.** The store remembers, per slot, when it was
last changed (a write epoch), and per request, since when it relies on each
position. A slot that differs from what the request expects was *overwritten*
if it changed after the request began relying on it (KV-DATA-003); otherwise
the request was *given* the wrong data: an unwritten slot from a hit
(KV-DATA-002), or another prefix's data (KV-DATA-001). :func:`slot_violation`
states the classification.

**Token-granular indices.** An engine that gives every token its own KV index
(SGLang: the radix tree's node values and the allocator's ``out_cache_loc`` are
slot indices, one per token, handed out in whole pages) keeps a *row* of slot
indices per request where vLLM keeps a block table. A row is a block table whose
blocks have one slot: position ``p`` lives in slot ``row[p]``. KV-DATA-001 to
KV-DATA-004 read the same for it, with "block" meaning a slot: a hit's slots hold
the request's prefix, never unwritten; a slot a request holds -- from its locked
hit, or computed by itself -- keeps its value until the request gives it up (it
unlocks the path or frees the slot); and every page the cache holds keeps, slot
by slot, the values of the prefix that names it. The null block (KV-DATA-005) and
the groups' windows (KV-DATA-006) are vLLM's: a prefix tree's slot 0 is either a
slot like any other (kvoracle's reference) or one its allocator never hands out
(SGLang's padding slot, which padded tokens do write), so those two rules judge
the block tables of the manager suite only.

**State slots of a prefix tree** (KV-DATA-007). A prefix tree with a state
component (chapter 14, KV-TREE-022 .. KV-TREE-027: SGLang's Mamba component)
keeps each state in a state slot of a pool of its own, one per page that holds
a state. A state is not per-token KV: it is the recurrent layers' summary of the
whole prefix, which the runner computes by folding every token into the state it
started from. Its stand-in here is :func:`state_after`: the state after a prefix
is the slot value of its last token (the chain of :func:`slot_value` from
:func:`prefix_seed`, so it covers the tokens, the positions and the salt), and
resuming from the state after ``k`` tokens gives the same state as running from
the start -- a state read from the wrong slot yields a wrong state, and every
state computed from it stays wrong. Two places hand state data over. A hit of
``h > 0`` tokens hands its request the state slot at the hit's last page, whose
state the request copies and resumes from: that slot holds the state after
exactly the request's first ``h`` tokens. An insertion gives the cache the slot
the runner wrote the request's state after the key into, or gives it back where
the page kept its own (KV-TREE-026): from then on, and for as long as the page
keeps its state, every state slot the cache holds at a page holds the state
after that page's tokens. A slot is rewritten only after the cache has given it
up (a dropped state, a duplicate handed back). vLLM's form is KV-MAMBA-015 (a
state page cached under a prefix's key holds the state after that prefix),
judged by the manager suite.

Engines are judged on these rules only through an adapter that keeps the
store (``kvoracle.conformance.engines.paged_store.PagedStoreWrapper``, any engine) and
declares the ``kv_data`` capability -- for a prefix tree,
``kvoracle.conformance.engines.prefix_tree_store.PagedTreeStore`` -- and the store needs
torch (``kvoracle.gpu``).
This chapter itself is pure Python.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import icontract

from .contracts import ENABLED
from .hybrid import CHUNKED_LOCAL, FULL, SLIDING_WINDOW
from .hybrid_lifecycle import skipped_tokens
from .registry import defines, rule

CHAPTER = "data_integrity"
RUNNER = "vllm/v1/worker/block_table.py BlockTable.compute_slot_mapping"
POOL = "vllm/v1/core/block_pool.py"
#: KV-DATA-001 .. 004 hold for a block table and for a row of token slots alike (see the chapter).
BOTH = ("manager", "prefix-tree")

KV_DATA_001 = rule(
    "KV-DATA-001",
    "A hit only returns blocks whose contents are the request's prefix",
    """Every slot covered by a prefix-cache hit, read through the hit blocks in block-table
    order, holds the value the request's own tokens would have written at that position
    (same token, position, prefix and salt).""",
    source=f"vllm/v1/core/kv_cache_manager.py get_computed_blocks; {RUNNER}",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=BOTH,
)
KV_DATA_002 = rule(
    "KV-DATA-002",
    "A hit never covers unwritten slots",
    """No slot covered by a hit is unwritten: a block is found by a lookup only after the
    forward pass that computed its tokens wrote them; caching never runs ahead of the tokens
    the caching step scheduled.""",
    source=f"{POOL} BlockPool.cache_full_blocks (num_full_blocks from num_tokens_to_cache)",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=BOTH,
)
KV_DATA_003 = rule(
    "KV-DATA-003",
    "A referenced block is never overwritten",
    """While a request holds a block, the slots it has computed or adopted from a hit keep
    their values: no write changes them until every holder has freed the block. (A block
    with a non-zero reference count is never handed out, KV-POOL-010.)""",
    source=f"{POOL} BlockPool.get_new_blocks (assert ref_cnt == 0), is_block_writable",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=BOTH,
)
KV_DATA_004 = rule(
    "KV-DATA-004",
    "A cached block holds the contents its key names",
    """Every block listed under a cache key holds, in every slot, the values of the prefix
    the key identifies. A cached block reused for other contents loses its key before it is
    written (KV-POOL-005).""",
    source=f"{POOL} BlockPool.get_new_blocks / _maybe_evict_cached_block",
    chapter=CHAPTER,
    needs=("kv_data", "cache_map"),
    judged_by=BOTH,
)
KV_DATA_005 = rule(
    "KV-DATA-005",
    "The null block is never written",
    """No token's KV is written into block 0: a computed token's slot never lies in the null
    block, so every null-block slot stays unwritten.""",
    source=f"{POOL} BlockPool.__init__ (null_block); {RUNNER}",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=("manager",),
)

KV_DATA_006 = rule(
    "KV-DATA-006",
    "A group never keeps the positions a request relies on in the null block",
    """In every group that holds per-token KV (full attention, sliding window, chunked local
    attention), each position from first_relied_position up to the request's computed (or hit)
    tokens lies in a real block of the group's block table, never in the null block and never
    past the table's end. Before that position a windowed group owes nothing: its data may be
    gone.""",
    source="vllm/v1/core/single_type_kv_cache_manager.py SlidingWindowManager / "
           "ChunkedLocalAttentionManager (get_num_skipped_tokens, remove_skipped_blocks, "
           "find_longest_cache_hit)",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=("manager",),
)

KV_DATA_007 = rule(
    "KV-DATA-007",
    "A prefix tree's state slots hold the state their page names",
    """For a prefix tree with a state component: the state slot a hit of h > 0 tokens hands its
    request to resume from (the state at the hit's last page, KV-TREE-022) holds the recurrent
    state after exactly the request's first h tokens in its namespace, never an unwritten slot nor
    another prefix's state; and every state slot the cache holds at a page holds the state after
    that page's tokens for as long as the page keeps its state. The slot an insertion gives the
    cache holds the state after the insertion's key; a slot is rewritten only after the cache has
    given it up (a dropped state, a duplicate handed back, KV-TREE-024, KV-TREE-026). vLLM's form:
    KV-MAMBA-015.""",
    source="sglang/srt/mem_cache/unified_cache/components/mamba.py (SGLang 0.5.23) "
           "MambaComponent.finalize_match_result_in_cache (mamba_cow_src_index, the hit's state slot the "
           "request copies), prepare_for_caching_req (the request's state copied into the donated slot), "
           "commit_insert_component_data, evict_component / _free_mamba_value",
    chapter=CHAPTER,
    needs=("kv_data",),
    judged_by=("prefix-tree",),
)

#: Kinds of group holding one slot of KV per token of the request: the store writes and
#: judges these (Mamba keeps a recurrent state, cross-attention the encoder's output).
TOKEN_KV_KINDS = (FULL, SLIDING_WINDOW, CHUNKED_LOCAL)

#: The value of a slot no forward pass has written.
UNWRITTEN = 0

_MASK64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit words that spreads every input bit."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _signed64(x: int) -> int:
    return x - (1 << 64) if x >> 63 else x


def prefix_seed(cache_salt: str | None) -> int:
    """The value chained into a request's first slot: its salt ("" is no salt, KV-HASH-007)."""
    digest = hashlib.sha256(b"kvoracle-kv-data:" + (cache_salt or "").encode()).digest()
    return _signed64(int.from_bytes(digest[:8], "little"))


@icontract.require(lambda prefix: _INT64_MIN <= prefix <= _INT64_MAX, enabled=ENABLED)
@icontract.require(lambda position: position >= 0, enabled=ENABLED)
@icontract.ensure(lambda result: result != UNWRITTEN and _INT64_MIN <= result <= _INT64_MAX,
                  enabled=ENABLED)
def slot_value(prefix: int, token: int, position: int) -> int:
    """The KV stand-in of ``token`` at ``position`` after a prefix whose last value is ``prefix``.

    ``prefix`` is the previous position's value (:func:`prefix_seed` for position 0),
    so the value covers the whole prefix. An int64, never :data:`UNWRITTEN`: the low
    bit is always set.
    """
    word = _mix64((prefix & _MASK64) ^ _mix64((token * 0x9E3779B97F4A7C15 + position) & _MASK64))
    return _signed64(word | 1)


def extend_prefix_values(values: tuple[int, ...], tokens: Sequence[int],
                         cache_salt: str | None = None) -> tuple[int, ...]:
    """``values`` (the slot values of a prefix of ``tokens``) extended to all of ``tokens``.

    Appending tokens never changes an earlier value, like the block hashes (KV-HASH-003).
    """
    out = list(values)
    last = out[-1] if out else prefix_seed(cache_salt)
    for position in range(len(out), len(tokens)):
        last = slot_value(last, tokens[position], position)
        out.append(last)
    return tuple(out)


@icontract.ensure(lambda result, expected, actual: (result is None) == (expected == actual),
                  enabled=ENABLED)
@icontract.ensure(lambda result, written_at, relied_since, from_hit: result is None
                  or (result == KV_DATA_003) == (written_at > relied_since or not from_hit),
                  enabled=ENABLED)
@defines(KV_DATA_001, KV_DATA_002, KV_DATA_003)
def slot_violation(expected: int, actual: int, written_at: int, relied_since: int,
                   from_hit: bool) -> str | None:
    """The rule a slot a request relies on breaks, or ``None`` when it holds ``expected``.

    ``written_at`` is the slot's write epoch, ``relied_since`` the epoch at which the
    request began relying on it (adopting a hit, or writing it itself); ``from_hit``
    says whether the request got the position from a hit rather than computing it.
    """
    if actual == expected:
        return None
    if written_at > relied_since or not from_hit:
        # Changed under the request, or its own computed data is gone from its slot.
        return KV_DATA_003
    if actual == UNWRITTEN:
        return KV_DATA_002
    return KV_DATA_001


@icontract.ensure(lambda result, expected, actual: result == (tuple(expected) == tuple(actual)),
                  enabled=ENABLED)
@defines(KV_DATA_004)
def cached_block_intact(expected: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    """Whether a block cached under a key holds that key's prefix in every slot."""
    return len(expected) == len(actual) and all(e == a for e, a in zip(expected, actual))


@icontract.ensure(lambda result, null_slots: result == all(v == UNWRITTEN for v in null_slots),
                  enabled=ENABLED)
@defines(KV_DATA_005)
def null_block_unwritten(null_slots: tuple[int, ...]) -> bool:
    """Whether every slot of the null block is still unwritten."""
    return not any(null_slots)


@icontract.require(lambda kind: kind in TOKEN_KV_KINDS, enabled=ENABLED)
@icontract.require(lambda kind, param: kind == FULL or param > 0,
                   "a window or chunk is at least one token", enabled=ENABLED)
@icontract.require(lambda num_tokens: num_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens: 0 <= result <= num_tokens, enabled=ENABLED)
@icontract.ensure(lambda result, kind: kind != FULL or result == 0,
                  "full attention relies on every position", enabled=ENABLED)
@icontract.ensure(lambda result, kind, param, num_tokens: kind != SLIDING_WINDOW
                  or num_tokens - result == min(num_tokens, param - 1),
                  "a sliding window relies on the window - 1 positions before the next token",
                  enabled=ENABLED)
@icontract.ensure(lambda result, kind, param: kind != CHUNKED_LOCAL or result % param == 0,
                  "a chunked-local group relies on its current chunk", enabled=ENABLED)
@defines(KV_DATA_006)
def first_relied_position(kind: str, param: int, num_tokens: int) -> int:
    """The first position a group relies on once a request has ``num_tokens`` tokens computed.

    ``param`` is the sliding window or the attention chunk size (ignored for full
    attention). The positions before it are the group's skipped tokens: what the next
    token cannot attend to in that group.
    """
    return skipped_tokens(kind, param, num_tokens)


@icontract.require(lambda state: _INT64_MIN <= state <= _INT64_MAX, enabled=ENABLED)
@icontract.require(lambda start: start >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, state, tokens, start: start < len(tokens) or result == state,
                  "no token past start: the state stays", enabled=ENABLED)
@icontract.ensure(lambda result, tokens, start: start >= len(tokens) or result != UNWRITTEN,
                  "a computed state is never the unwritten marker", enabled=ENABLED)
@defines(KV_DATA_007)
def state_after(state: int, tokens: Sequence[int], start: int) -> int:
    """The recurrent state after ``tokens`` when ``state`` is the state after their first ``start``
    (:func:`prefix_seed` for none): each later token is folded in as :func:`slot_value` chains slot
    values, so the state after a prefix is its last token's slot value, and resuming from the state
    after ``k`` tokens gives what running from the start gives."""
    for position in range(start, len(tokens)):
        state = slot_value(state, tokens[position], position)
    return state


@icontract.require(lambda expected, actual: len(expected) == len(actual), enabled=ENABLED)
@icontract.ensure(lambda result, expected, actual: (result == -1) == (tuple(expected) == tuple(actual)),
                  enabled=ENABLED)
@icontract.ensure(lambda result, expected, actual: result == -1 or (
    expected[result] != actual[result] and tuple(expected[:result]) == tuple(actual[:result])), enabled=ENABLED)
@defines(KV_DATA_007)
def first_wrong_state(expected: tuple[int, ...], actual: tuple[int, ...]) -> int:
    """The first of the state slots read back (``actual``: a hit's, or those of the pages holding a
    state) that does not hold the state its prefix names (``expected``, :func:`state_after`), -1 when
    every one does."""
    return next((i for i, (want, found) in enumerate(zip(expected, actual)) if want != found), -1)
