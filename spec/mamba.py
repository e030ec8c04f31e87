"""Chapter 8 -- Mamba (state-space) layers.

A Mamba layer keeps one recurrent *state* per request instead of per-token
KV. To resume after ``L`` tokens only the state after token ``L`` is needed,
not the blocks before it. vLLM 0.33.0 has two cache modes for a Mamba group,
and which one a group is in follows prefix caching: ``"none"`` with caching
off, ``"align"`` with it on (vLLM derives the mode from
``enable_prefix_caching`` and its ``MambaManager`` refuses caching in
``"none"`` mode). Without caching a group keeps the last state only
(KV-HLC-008). This chapter is about the ``"align"`` mode.

Words used below. ``B`` is the Mamba group's block size, which in kvoracle is
also the hash block size (KV-MAMBA-003) -- except in the partial-hit rules
(KV-MAMBA-019 .. KV-MAMBA-025), where ``h`` is the hash block size and ``B`` a
larger multiple of it. A block of the table is a *state
page*: table entry ``i`` stands for the state after ``(i + 1) * B`` tokens.
``s`` is the spec's ``num_speculative_blocks`` (the pages MTP/EAGLE drafting
needs beyond the running state). ``A`` is the alignment of hits: the block
size with one KV-cache group, the scheduler block size (the LCM of the groups'
block sizes) with several. A step's *main tokens* ``T`` are the request's
computed tokens (hit included) plus the tokens scheduled this step; look-ahead
tokens do not count -- draft models have no Mamba layers.

**The hit** (KV-MAMBA-001). Scanning right to left from the last block within
``max_length``, the hit ends at the first cached block whose end is a multiple
of the alignment; it has ``i`` null blocks followed by that one block. Any
earlier snapshot is irrelevant: only the *last* matching state counts.
Declaratively: the greatest aligned ``L`` whose last block ``L / block_size -
1`` is cached.

**No EAGLE drop** (KV-MAMBA-002). A state snapshot cannot be rewound: dropping
the last block would leave only nulls, not the previous state. vLLM 0.33.0's
Mamba finder ignores the drop flag, and the hybrid coordinator therefore
gives a Mamba group no EAGLE look-ahead margin -- giving it one lets the Mamba
group return a hit *longer* than the candidate every other group agreed on
(vLLM issue #43559, the historical failure the meta-tests replay).

**Scope** (KV-MAMBA-003). kvoracle rejects the Mamba configurations it does
not specify: a cache mode that contradicts prefix caching, and a Mamba block
larger than the hash block with caching on. The latter is what turns on vLLM's
*fine-grained partial hits*: hits that end inside a Mamba block, a partial
tail entry registered at the prompt's last hash boundary, and the
copy-on-write of that shared tail (a request resuming inside a block gets a
private copy of the state page, or, while it still writes the page, the cache
entry moves to the copy). KV-MAMBA-019 to KV-MAMBA-025 now state those
behaviours (below); the reference implements them where every other group keeps
the hash block (a coarser full-attention group would get sub-block hits and
copies of its own, which kvoracle does not specify, and is rejected). Sparse checkpoint retention
(``prefix_cache_retention_interval``), the shared-prefix checkpoint
(``enable_mamba_shared_prefix_checkpoint``), look-ahead hashes and KV
connectors are not kvoracle parameters at all: the engines run with them off.

**The table of a request** (KV-MAMBA-004). An align-mode table is indexed by
position, like a full-attention one, but it holds at most a few pages: the
running state, the speculative pages and a checkpoint. When an allocation
brings a request to ``T`` main tokens and the table has fewer than
``cdiv(T, B) + s`` entries, the table grows to exactly that: null entries up to
the running page at ``cdiv(T, B) - 1``, then ``s`` speculative pages. The
running page of a request that has allocated before is a block taken from the
free queue, or one of its earlier speculative pages (KV-MAMBA-005). A table at
least that long is left as it is (unless a checkpoint is due). The allocation
*returns* the table's new tail -- nulls and moved pages included -- not just the
blocks taken from the pool.

**Speculative pages move** (KV-MAMBA-005). The speculative pages of a request
that has allocated before sit at the end of its table. When the table grows
past them, every one of them that would otherwise stand before the new running
page is moved to the end of the table (and a null put in its place), in table
order, instead of being freed and another block taken: an exclusively owned,
uncached page can simply change position. Only the pages still missing after
the moves are taken from the free queue; the first allocation of a request
moves nothing.

**Prefill checkpoints** (KV-MAMBA-006). A state is written where a chunk ends.
A backend that can also export the state at a point *inside* a chunk
(``num_prefill_checkpoint_blocks > 0`` with a ``prefill_checkpoint_alignment``)
gets an extra page for it: the *checkpoint*. Its position is the last multiple
of ``A`` below the chunk's end ``T`` (with EAGLE: the last multiple at most ``T``,
less one alignment unit, where an EAGLE hit drops back to); it is written into
table entry ``cdiv(T, B) - 2``, the
page before the running one, which the allocation then does not make null.
The backend can export it only if the chunk starts on a hash boundary, the
position lies strictly inside the chunk, at least one hash block after its
start and a multiple of the checkpoint alignment away from it, and the
checkpoint's page lies after the page the chunk starts from. A one-token decode
step never qualifies; one with draft tokens can, past the committed tokens
(KV-MAMBA-017).

**What an allocation needs** (KV-MAMBA-007, KV-MAMBA-008). The free blocks an
align-mode group consumes: the growth of its table, ``cdiv(T, B) + s`` minus
the entries it holds and the hit entries it adopts, capped at what is taken
from the pool -- one running page, one checkpoint if due, and, on a request's
first allocation, the ``s`` speculative pages -- plus the hit's state page if
it sits in the free queue. A table longer than the step needs (after
rejected drafts, ``T`` can shrink) needs nothing: never a negative number.
vLLM 0.33.0 returns the difference unfloored, and the negative number hides
another group's need from the capacity check (``docs/findings/
mamba-negative-need.md``).

**A state cached this step is not a hit yet** (KV-MAMBA-009). A page is
cached in the step that allocates it, before the forward pass has written the
state into it. A request whose Mamba hit ends on a page cached in the current
step (under the same key) is therefore not admitted in that step: its
allocation fails as if the pool were full. The scheduler starts a new step
with ``new_step_starts()``, which forgets the pages cached so far.

**States are freed one step late** (KV-MAMBA-010). Before each allocation a
group frees the pages before the one holding the last processed token: every
non-null entry in ``[retired, (P - 1) // B)`` (``P`` the processed tokens),
right to left, in one release, and replaces it by the null block. Unlike a
sliding-window group it does not stop at the first null -- a prefill leaves
nulls between its pages -- so it remembers how far it has retired instead. The
page the previous step's state was copied from is thus released at the next
allocation, when the current state has been computed from it.

**Caching** (KV-MAMBA-011). After an allocation the group caches the non-null
entries among its full blocks up to the cacheable tokens (KV-HLC-005) under
their positional keys; a page that already carries a key (a checkpoint keyed
earlier) loses it first. Then a checkpoint reserved this step is keyed at its
position, ``hash(prefix of position tokens)``, replacing whatever key its page
had, unless it carries that key already -- or lies past the request's hashed tokens,
which a step with draft tokens can reach (KV-MAMBA-017). With one KV-cache group the
checkpoint's page is its own position and this changes nothing; with several,
the checkpoint's position can lie before its page (page ``cdiv(T, B) - 2``,
position a multiple of ``A``), and the page is then found by a lookup of the
position, as page ``position / B - 1``.

**Freeing a request** (KV-MAMBA-012). ``free`` hands the table to the pool
tail first; the pool skips every null entry, leading or not.

**The shape of a table** (KV-MAMBA-013). Nulls may sit anywhere in an
align-mode table (KV-HYB-013's "nulls only as a prefix" does not hold for it),
but its last ``1 + s`` entries -- the running state and the speculative pages
-- are never null.

**The state pages** (KV-MAMBA-014, KV-MAMBA-015, KV-MAMBA-016). The model
runner writes the state after a step's ``T`` main tokens into table entry
``cdiv(T, B) - 1`` and a checkpoint's state into its entry, starting from the
state of the previous step's running page. A page cached under the key of a
prefix of ``P`` tokens must hold the state after exactly ``P`` tokens once a
hit can read it. That holds only if the scheduler chunks the prefill so that
states are written where they are cached: in align mode it ends every prefill
chunk but the prompt's last on a block boundary, and a chunk that starts inside
a block stops at the next boundary (KV-MAMBA-016). A chunk breaking that rule
leaves a page whose key names a later boundary than the state it holds.

**A table longer than the step** (KV-MAMBA-018). After rejected drafts a step's
``T`` can be smaller than the last one's, and KV-MAMBA-004 leaves the table as the
longer step made it: the running page stands further right than ``cdiv(T, B) - 1``,
which is null. The model runner then finds the request's state where KV-MAMBA-013
says it is, in entry ``len - 1 - s`` of a table of ``len`` entries -- the entry
vLLM's manager itself records as the last state (``last_state_block_idx``) -- and
not by the step's length, as vLLM 0.33.0's runner does (it reads and writes the
null block there: ``docs/findings/mamba-runner-null-state.md``). A step reads the
state the previous step left, and leaves: the state after its committed tokens
``C`` in that running entry; an exported checkpoint's state in entry ``cdiv(T, B)
- 2`` only where that entry is a page (the manager gives it one only where the
table grows past it: a table that was longer leaves it null, and nothing is
written); and, when ``C`` ends on a block boundary, the state after ``C`` in the
page of that boundary as well (``postprocess_mamba``'s copy), which is where the
step's positional key will look for it. Every other page keeps its state, and
with a table exactly as long as the step this is KV-MAMBA-014. Two kinds of
page hold no state a key may name: a page that both the step's checkpoint (at a
position before ``C``) and that copy reach, whose keys name the checkpoint now
and the boundary later, and a page whose block boundary the committed tokens
pass strictly inside the step. vLLM's scheduler produces neither -- drafts ride
only on one real token a step, and prefill chunks obey KV-MAMBA-016 -- but an
engine's caller may (kvoracle's own driver does), and they are then left
unjudged.

**Partial hits** (KV-MAMBA-019 .. KV-MAMBA-025; judged by the manager suite where
the engine claims ``mamba_partial_hits``, which adds ``take_copies()``, the scheduler's
end of a step; the hybrid lookup suite judges what a lookup shows, KV-MAMBA-019 and
KV-MAMBA-020, over partial entries it leaves with ``seed_partial_entry()``). With several
KV-cache groups, vLLM lets a hit end
inside a Mamba block when an align-mode Mamba group's block ``B`` is a larger
multiple of the hash block ``h`` and every other group can look hits up at ``h``
(full attention and Mamba can; a sliding-window or chunked-local group only
with block ``h``): the alignment of hits becomes ``A = h`` (KV-MAMBA-019). The
Mamba hit is then the last hash boundary ``L`` whose key is cached, under a
page's positional key or a *partial entry*; it is *partial* when ``L`` is not a
multiple of ``B``, and its last page, entry ``L // B``, is shared with the cache
(KV-MAMBA-020). Partial entries come from one place: the state after the
prompt's last hash boundary ``b``, at which the scheduler ends a chunk, is keyed
at the page that holds it, the running page of the step that ends there
(KV-MAMBA-021); a checkpoint inside a block keeps its key only at the prompt's
checkpoint position. A shared page must not be written, and the runner writes
the running page of each step. So a state page is copied, one page more in the
allocation's need (KV-MAMBA-022), in one of two ways. A request *resuming*
inside a shared page gets a private copy in its table on its first allocation
and the cache keeps the shared page (KV-MAMBA-023). A request that *produced*
a partial tail and goes on writing that page keeps it, and the cache entry
moves to the copy at its next allocation (KV-MAMBA-024): the runner's table of
a running request only grows. The runner makes the copy before the step's
forward; both pages are held one reference more until then, and afterwards
only the tables hold them -- a producer's copy none: it waits in the free queue,
cached under the tail key (KV-MAMBA-025). Either way the page a key names is
never the page a request writes next.

**Where a partial hit's state lives** (KV-MAMBA-026; judged through a paged store,
where the store's runner makes the copies). The runner makes the copies the
scheduler hands it with a step before that step's forward pass, all at once: each
copy page then holds what its source page held before the step. A step reads the
request's state from the entry the runner recorded at its previous step, or, at
its first step after ``C`` computed tokens, from entry ``(C - 1) // B``. After a
partial hit of ``L`` tokens that entry is ``L // B``, the private copy, which
holds the state after ``L`` by then; the request never reads the shared page the
hit named. A producer whose tail key moved goes on from its own page, and the copy
keeps the state after the tail's tokens, which the moved key names, while the step
overwrites the page (KV-MAMBA-015). A copy made after the forward would leave the
consumer without its state and give the moved key the producer's next state.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .lifecycle import cdiv
from .registry import INPUT_VALIDATION, defines, rule

CHAPTER = "mamba"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"
MGR = "vllm/v1/core/kv_cache_manager.py"
IFACE = "vllm/v1/kv_cache_interface.py"
SCHED = "vllm/v1/core/sched/scheduler.py"

#: A layout entry (:func:`align_layout`): the null block.
NULL = -1
#: A layout entry: a block taken from the free queue.
NEW = -2

KV_MAMBA_001 = rule(
    "KV-MAMBA-001",
    "The hit is the last cached, aligned state block",
    """The hit ends after the rightmost block i < max_length // block_size that is cached
    and whose end (i + 1) * block_size is a multiple of the alignment; it is i null blocks
    followed by block i. Without such a block the hit is empty.""",
    source=f"{STKV} MambaManager.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_MAMBA_002 = rule(
    "KV-MAMBA-002",
    "A Mamba group neither drops an EAGLE block nor gets the EAGLE margin",
    """The Mamba finder ignores the EAGLE drop, and the hybrid coordinator looks a Mamba
    group up at the current candidate length (no extra block): a Mamba group never answers
    longer than the candidate (issue #43559: vLLM 0.20 to 0.25 gave it the look-ahead, and
    the hit outgrew what full attention holds; the hybrid suite charges an answer that is
    exactly such a loop's, ``fixed_point(..., mamba_margin=True)``, to this rule).""",
    source=f"{STKV} MambaManager.find_longest_cache_hit; {COORD} find_longest_cache_hit "
           "(no eagle margin for MambaSpec)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_MAMBA_003 = rule(
    "KV-MAMBA-003",
    "Sub-block Mamba hits and a cache mode that contradicts prefix caching are rejected",
    """With prefix caching on, a Mamba group's block size larger than hash_block_size is
    accepted only where it turns on vLLM's fine-grained partial hits (rules KV-MAMBA-019 to KV-MAMBA-025:
    sub-block hits, partial tail entries and their copy-on-write) and every other
    cacheable group has block size hash_block_size (a coarser full-attention group would get
    sub-block hits and copies of its own, which kvoracle does not specify). mamba_cache_mode
    must be "align" with prefix caching on and "none" with it off: vLLM derives the mode
    from enable_prefix_caching, and its MambaManager refuses caching in "none" mode. (Until
    the align chapter, align-mode allocation was out of scope here too; KV-MAMBA-004 to
    KV-MAMBA-017 now specify it.)""",
    source=f"vllm/v1/core/kv_cache_utils.py partial_hash_hits_enabled; {STKV} MambaManager.__init__ "
           "(align-or-no-caching assertion); vllm/model_executor/models/config.py "
           "MambaModelConfig.verify_and_update_config",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_MAMBA_004 = rule(
    "KV-MAMBA-004",
    "An align-mode table grows to the running page and the speculative pages",
    """An allocation that brings a request to T main tokens (computed plus scheduled, no
    look-ahead) leaves a table with fewer than cdiv(T, B) + s entries exactly that long: null
    entries up to the running page at cdiv(T, B) - 1 (but a due checkpoint's entry,
    KV-MAMBA-006), then s speculative pages; a longer table is left unchanged when no
    checkpoint is due. The allocation returns the table's entries past its old length, nulls
    and moved pages included, then the blocks taken from the pool.""",
    source=f"{STKV} MambaManager.allocate_new_blocks (align branch: early return, null padding, "
           "new blocks, returned_blocks)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_005 = rule(
    "KV-MAMBA-005",
    "A running request's speculative pages are moved, not replaced",
    """When the table of a request that has allocated before grows, each of its last s
    entries (in table order) whose index is below cdiv(T, B) - 1 (minus one more with a due
    checkpoint) is moved to the end of the table and replaced by the null block; the moves
    stop at the first entry that stays. Only the entries still missing are new blocks: at
    most one running page and one checkpoint. A request's first allocation moves nothing and
    takes its s speculative pages from the pool.""",
    source=f"{STKV} MambaManager.allocate_new_blocks (blocks_allocated relocation loop) / "
           "_relocate_speculative_block",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_006 = rule(
    "KV-MAMBA-006",
    "A prefill chunk reserves a checkpoint page where the backend can export the state",
    """With num_prefill_checkpoint_blocks > 0 and a prefill_checkpoint_alignment c, a step
    from S computed to T main tokens reserves a checkpoint at position p = the last multiple
    of A at most T - 1 (with EAGLE: at most T, less A), in entry k = cdiv(T, B) - 2, iff p >
    0, k >= 0, S is a multiple of the hash block size, k > (S - 1) // B, S + hash block <= p,
    S < p < T, (p - S) % c == 0, and entry k is past the table's end, null, or (for a request
    that has allocated before) one of its last s entries.""",
    source=f"{STKV} MambaManager._needs_internal_checkpoint / get_num_blocks_to_allocate; {IFACE} "
           "get_mamba_prefill_checkpoint_position / is_mamba_prefill_checkpoint_valid; "
           f"{COORD} KVCacheCoordinator.__init__ (drop_eagle_checkpoint_block)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_007 = rule(
    "KV-MAMBA-007",
    "An align-mode group needs its table's growth, capped at one page per role",
    """The free blocks an align-mode group consumes are g = cdiv(T, B) + s - held entries -
    hit entries, capped (when positive) at 1 + (1 if a checkpoint is due) + (s on the request's
    first allocation), plus 1 if the hit's state page sits in the free queue. Nothing about
    the window is subtracted: the hit entries before the state page are nulls.""",
    source=f"{STKV} MambaManager.get_num_blocks_to_allocate (align branch, physical_block_cap)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_008 = rule(
    "KV-MAMBA-008",
    "A Mamba group's need is never negative",
    """When a request's align-mode table is longer than the step needs (T shrank after
    rejected drafts), the group needs 0 new blocks, not the negative difference: the summed
    need must not count blocks another group will take as freed. vLLM 0.33.0 returns the
    difference unfloored; allocate_slots then passes its capacity check with too few free
    blocks and raises in get_new_blocks instead of returning None
    (docs/findings/mamba-negative-need.md).""",
    source=f"{STKV} MambaManager.get_num_blocks_to_allocate (num_new_blocks not floored when <= 0); "
           f"{MGR} KVCacheManager.allocate_slots (capacity check)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_009 = rule(
    "KV-MAMBA-009",
    "A hit on a state page cached in the current step is deferred",
    """If the last entry of a request's Mamba hit carries a key the group cached since the
    last new_step_starts(), the allocation fails (the group's need is the pool size plus
    one); new_step_starts() forgets those keys. A group caches a key this step when it caches
    a page under it (KV-MAMBA-011).""",
    source=f"{STKV} MambaManager.get_num_blocks_to_allocate (cached_blocks_this_step) / cache_blocks / "
           f"new_step_starts; {MGR} KVCacheManager.new_step_starts; {SCHED} Scheduler.schedule",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_010 = rule(
    "KV-MAMBA-010",
    "States before the last processed token's page are freed, past the retired mark",
    """Before an allocation with P processed tokens (P > 1), an align-mode group frees, in
    one release, right to left, every non-null entry with index in [retired, min((P - 1) //
    B, len(table))), replaces them by the null block and sets retired to that end (retired
    starts at 0 and only moves when the range is not empty). Nulls inside the range do not
    stop it. Then the entry that held the running state at the table's last growth is freed
    too if it is not null and lies before cdiv(P, B) - 1.""",
    source=f"{STKV} MambaManager._remove_blocks_in_range / remove_skipped_blocks (last_state_block_idx)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_011 = rule(
    "KV-MAMBA-011",
    "Non-null full pages are cached at their positions, a checkpoint at its own",
    """After an allocation an align-mode group caches every non-null entry i among its
    uncached full blocks (KV-HLC-005) under the key of the prefix (i + 1) * B, dropping any
    key the page carried. Then a checkpoint reserved this step (KV-MAMBA-006), if its entry
    is not null and not already keyed at its position p, is keyed at the prefix of p tokens
    in place of every key it had.""",
    source=f"{STKV} MambaManager.cache_blocks / _cache_partial_tail_block (checkpoint branch); "
           "vllm/v1/core/block_pool.py cache_full_blocks (promotion) / cache_partial_block "
           "(replace_existing_hashes)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_012 = rule(
    "KV-MAMBA-012",
    "An align-mode table is freed tail first, every null skipped",
    """free hands an align-mode Mamba table to the pool reversed; the null entries, which
    may sit anywhere in it, are skipped, so the pages are released last page first.""",
    source=f"{STKV} MambaManager.pop_blocks_for_free / SingleTypeKVCacheManager.free; "
           "vllm/v1/core/block_pool.py BlockPool.free_blocks (null blocks skipped)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_013 = rule(
    "KV-MAMBA-013",
    "An align-mode table ends with its running page and its speculative pages",
    """Nulls may stand anywhere in an align-mode Mamba table, but between operations its
    last min(len, 1 + s) entries are never null: the model runner reads the running state
    and the speculative states from there.""",
    source=f"{STKV} MambaManager.allocate_new_blocks (last_state_block_idx = len - 1 - s); "
           "vllm/v1/attention/backends/utils.py mamba_get_block_table_tensor",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_014 = rule(
    "KV-MAMBA-014",
    "A step writes its state into the running page, a checkpoint into its page",
    """A step without draft tokens that brings a request to T main tokens writes the state
    after T tokens into table entry cdiv(T, B) - 1 and, with a checkpoint at p (KV-MAMBA-006),
    the state after p tokens into entry cdiv(T, B) - 2; it writes no other state page of the
    request. It starts from the state the previous step left in its running page (a request's
    first step: the hit's state page, entry (C - 1) // B for C computed tokens; after a partial hit
    the private copy there, KV-MAMBA-026), so that page
    and the pages it writes are real blocks of the table, never null or past its end. (A table
    longer than the step, and steps with drafts: KV-MAMBA-018.)""",
    source="vllm/v1/worker/mamba_utils.py preprocess_mamba (prev_state_idx, curr_state_idx); "
           "vllm/model_executor/layers/mamba/checkpoint.py compute_mamba_prefill_checkpoints; "
           f"{STKV} MambaManager.allocate_new_blocks",
    chapter=CHAPTER,
    needs=("kv_data", "kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_015 = rule(
    "KV-MAMBA-015",
    "A hit's state page holds the state after the hit's tokens",
    """When a request adopts a Mamba hit of L tokens, its state page (the hit's last entry)
    holds the state after exactly L tokens of the request's prompt, provided every step that
    wrote states obeyed KV-MAMBA-016 and hits on pages cached in the current step were
    deferred (KV-MAMBA-009). More generally, once the step that cached it has run, a page
    cached under the key of a prefix of P tokens holds the state after P tokens for as long as
    it stays cached.""",
    source=f"{STKV} MambaManager.find_longest_cache_hit / cache_blocks; {SCHED} "
           "Scheduler._mamba_block_aligned_split",
    chapter=CHAPTER,
    needs=("kv_data", "kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)
KV_MAMBA_016 = rule(
    "KV-MAMBA-016",
    "In align mode the scheduler ends prefill chunks on block boundaries",
    """With a Mamba group in align mode, a prefill chunk from S to E (E below the prefill end
    max(prompt length, tokens - 1)) ends on a multiple of the Mamba block size, and a chunk
    that starts inside a block does not run past the next block boundary. (vLLM also stops a
    chunk at the prompt's last cacheable position when the backend cannot export it as a
    checkpoint; that decides which states exist, not whether they are right.)""",
    source=f"{SCHED} Scheduler._mamba_block_aligned_split",
    chapter=CHAPTER,
    spec_only="a rule for the scheduler that feeds the manager, not a behaviour of the manager: the "
              "suites obey it when they generate align-mode chunks, and KV-MAMBA-015 depends on it; "
              "checked by the spec tests",
)
KV_MAMBA_017 = rule(
    "KV-MAMBA-017",
    "A checkpoint past the request's committed tokens is not keyed",
    """A step whose scheduled tokens include draft tokens can reserve a checkpoint
    (KV-MAMBA-006 does not look at drafts) at a position past the request's hashed tokens,
    where no key exists: the page is reserved and written, but not cached. vLLM 0.33.0
    asserts in BlockPool.cache_partial_block instead, after the allocation has taken its
    blocks (docs/findings/mamba-draft-checkpoint.md).""",
    source=f"{STKV} MambaManager._cache_partial_tail_block (checkpoint branch); "
           "vllm/v1/core/block_pool.py BlockPool._get_partial_block_hash (assertion)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align"),
    judged_by=("manager",),
)

KV_MAMBA_018 = rule(
    "KV-MAMBA-018",
    "The runner finds a request's state at its table's running entry, not at the step's length",
    """After an allocation that brings a request to T main tokens, its align-mode table of len
    entries holds the running state in entry R = len - 1 - s (KV-MAMBA-013): cdiv(T, B) - 1,
    unless the table is longer than the step needs (rejected drafts shrank T, and KV-MAMBA-004
    left the table as it was). A step reads the state the previous step left (a request's first
    step: the hit's state page) and leaves, for C committed tokens: the state after C in entry R;
    a checkpoint exported at p (KV-MAMBA-006) in entry cdiv(T, B) - 2 where that entry is not
    null (the state after p, or a draft's state for p > C; the manager gives the entry a page
    only where the table grows past it); when C = jB, the state after C in
    entry j - 1 too if it is another page (the boundary copy). Every other page keeps its state.
    No state a key may name is left in a page both the checkpoint (p < C) and the boundary copy
    reach, nor in a page whose block boundary lies strictly between the step's start and C, nor
    by a checkpoint in a page the manager did not reserve for it (one rejected drafts left in a
    longer table, which KV-MAMBA-011 keys at its block boundary) unless p is that boundary; no
    step of vLLM's scheduler makes any of these (drafts ride on one real token, prefill chunks
    keep KV-MAMBA-016). vLLM 0.33.0's runner reads and writes entry cdiv(T, B) - 1 instead, the null
    block in a longer table (docs/findings/mamba-runner-null-state.md).""",
    source="vllm/v1/worker/mamba_utils.py preprocess_mamba (curr_state_idx from the step's length) / "
           "postprocess_mamba_fused_kernel (the boundary copy); vllm/v1/attention/backends/utils.py "
           f"mamba_get_block_table_tensor (\"the last 1 + num_speculative_blocks\"); {STKV} "
           "MambaManager.allocate_new_blocks (early return on a longer table; last_state_block_idx = "
           "prev_block_len - 1 - num_speculative_blocks)",
    chapter=CHAPTER,
    spec_only="a rule for the model runner that reads the manager's tables, not a behaviour of the manager: "
              "the paged store's runner follows it and KV-MAMBA-014/015 judge the pages it writes (vLLM "
              "0.33.0's runner reads by position instead, a finding); checked by the spec tests",
)

# -- fine-grained partial hits (KV-MAMBA-019 .. KV-MAMBA-025) ------------------------------------
# The reference implements them for models whose other groups keep the hash block (KV-MAMBA-003
# rejects the rest), and the manager suite judges them where the engine claims mamba_partial_hits.
KV_MAMBA_019 = rule(
    "KV-MAMBA-019",
    "Partial hits are on where a Mamba block is coarser than the hash block and every group can follow",
    """With prefix caching on and several KV-cache groups (one group requires B = h), vLLM turns
    fine-grained partial hits on when some align-mode Mamba group's block B is larger than the hash
    block h and every other cacheable group either looks hits up at hash-block granularity (full
    attention, Mamba) or has block h (a sliding-window or chunked-local group with a larger block
    turns them off). Then hits are aligned to A = h instead of the scheduler block size, and the
    tokens a group caches are not rounded down to A.""",
    source="vllm/v1/core/kv_cache_utils.py partial_hash_hits_enabled; "
           f"{COORD} HybridKVCacheCoordinator.__init__ (enable_partial_hash_hits) / "
           "_cache_hit_alignment_tokens / _align_cacheable; "
           f"{COORD} UnitaryKVCacheCoordinator.__init__ (hash_block_size == block_size); "
           f"{SCHED} Scheduler.__init__ (mamba_partial_cache_hit)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager", "hybrid"),
)
KV_MAMBA_020 = rule(
    "KV-MAMBA-020",
    "A partial hit ends on the last cached hash boundary, inside a Mamba block if need be",
    """With partial hits on, the Mamba finder scans hash units right to left from unit
    min(max_length // h, number of hashes) - 1; the hit ends after the first unit f whose key,
    the hash of the prefix of L = (f + 1) * h tokens, is cached in the group, under a page's
    positional key (L a multiple of B) or a partial entry (KV-MAMBA-021). It is cdiv(L, B) - 1
    null entries, then the page the cache holds under that key (the first one). Where L is not a
    multiple of B the hit is partial: it ends inside the block of entry L // B, whose page the
    request shares with the cache (KV-MAMBA-023). Where only positional keys are cached, the hit
    is KV-MAMBA-001's.""",
    source=f"{STKV} MambaManager.find_longest_cache_hit (fine-grained branch) / "
           "SingleTypeKVCacheManager._has_partial_local_hit; vllm/v1/core/kv_cache_utils.py "
           "resolve_block_hashes (the raw hashes kept for fine-grained lookups)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager", "hybrid"),
)
KV_MAMBA_021 = rule(
    "KV-MAMBA-021",
    "The prompt's last hash boundary is keyed at the page holding its state: the partial tail",
    """With partial hits on, let b be the prompt's last hash boundary: the last multiple of h at
    most P - 1 (with EAGLE's drop, at most P, less h). The scheduler ends a prefill chunk at b
    unless the chunk exports it as a checkpoint. After an allocation that reserves no checkpoint,
    when the tokens the group caches equal b, the page in entry cdiv(b, B) - 1 -- if the table
    reaches it, it is not null and it is not keyed at b already -- is keyed at the prefix of b
    tokens; keys it carried for fewer tokens are dropped first. Where b is not a multiple of B
    this is a partial tail entry: the entry counts as not cached (its page is cached at its
    positional key when the block fills) and the request is the tail's producer (KV-MAMBA-024).
    The key counts as cached this step (KV-MAMBA-009). A reserved checkpoint (KV-MAMBA-006, at a
    multiple of h) keeps the key KV-MAMBA-011 gives it only on a block boundary or at the prompt's
    checkpoint position; inside a block elsewhere its page loses every key (a transient state).""",
    source=f"{STKV} MambaManager._cache_partial_tail_block (both branches) / cache_blocks; "
           "vllm/v1/core/block_pool.py BlockPool.cache_partial_block; "
           "vllm/v1/kv_cache_interface.py get_mamba_prefill_checkpoint_position; "
           f"{SCHED} Scheduler._mamba_block_aligned_split (tail_boundary)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)
KV_MAMBA_022 = rule(
    "KV-MAMBA-022",
    "An allocation with a copy due needs one page more",
    """An align-mode allocation with a copy due -- a request's first allocation adopting a
    partial hit (KV-MAMBA-023), or the next allocation of a request that registered a partial
    tail (KV-MAMBA-024) -- needs one free page more than KV-MAMBA-007 and KV-MAMBA-008 say, the
    copy (unless the hit is deferred, KV-MAMBA-009). The allocation is never skipped then, even
    where the table is long enough (KV-MAMBA-004's unchanged table does not apply).""",
    source=f"{STKV} MambaManager.get_num_blocks_to_allocate (has_partial_hit, physical_block_cap) / "
           "allocate_new_blocks (early return skipped with a partial hit)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)
KV_MAMBA_023 = rule(
    "KV-MAMBA-023",
    "A request resuming inside a shared page gets a private copy of it",
    """On its first allocation, a request adopting a partial hit of L tokens takes the copy from
    the pool first and puts it in entry L // B in place of the shared page, and a copy of the
    shared page into it is queued; the runner makes it before the step's forward, so the request
    reads the state after L from its own page and never writes the shared one. The allocation
    returns the copy first, then the table's new entries (KV-MAMBA-004). The shared page keeps its
    keys; the copy has none, and entry L // B counts as not cached, so the copy is cached at its
    positional key when its block fills (KV-MAMBA-011).""",
    source=f"{STKV} SingleTypeKVCacheManager.add_local_computed_blocks (_partial_hit_reqs) / "
           "_apply_cow; MambaManager.allocate_new_blocks (partial_hit, not blocks_allocated); "
           "vllm/v1/worker/utils.py copy_kv_cache_blocks_inplace; vllm/v1/worker/gpu_model_runner.py "
           "GPUModelRunner._update_states (the copies before the forward)",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)
KV_MAMBA_024 = rule(
    "KV-MAMBA-024",
    "A request still writing its partial tail moves the cache entry to a copy",
    """A request that registered a partial tail at entry j (KV-MAMBA-021) writes page j again in
    its next step. At its next allocation it takes the copy from the pool, every key of page j
    moves to the copy (the first with its token count), and a copy of page j into it is queued,
    which the runner makes before the forward overwrites page j. The request's table keeps page j
    (a running request's table only grows) and the copy is in no table. The moved key counts as
    cached this step: a hit on it waits for the next step (KV-MAMBA-009). Page j, without keys
    now, is cached at its positional key when its block fills. A request freed before that
    allocation releases page j with the tail key, and nothing is copied.""",
    source=f"{STKV} MambaManager.allocate_new_blocks (partial_hit with blocks_allocated: "
           "move_block_hashes, cached_blocks_this_step) / pop_blocks_for_free; "
           "vllm/v1/core/block_pool.py BlockPool.move_block_hashes",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)
KV_MAMBA_025 = rule(
    "KV-MAMBA-025",
    "Both pages of a copy are held until it has run; then only the tables hold them",
    """From the allocation that queues a copy until the scheduler hands it to the runner (with
    deferred frees, until the step that runs it has completed), the source page holds one
    reference more than the tables holding it (a consumer's hit reference, or one taken for the
    producer) and the copy one more than the tables holding it, so neither can be reused before
    the copy has run. Then both are released: the source page keeps the references of the tables
    holding it (a consumer's shared page may drop to 0 and return to the free queue, cached), a
    consumer's copy has 1, and a producer's copy 0: it returns to the free queue still cached
    under the moved keys. The page named by the partial key is then one no request writes, and
    holds the state after the key's tokens (KV-MAMBA-015).""",
    source=f"{STKV} SingleTypeKVCacheManager._apply_cow (cow_block.ref_cnt += 1) / "
           "MambaManager.allocate_new_blocks (source_block.ref_cnt += 1); "
           f"{MGR} KVCacheManager.take_kv_cache_block_copies; {SCHED} Scheduler.schedule / "
           "_free_cow_retained_blocks",
    chapter=CHAPTER,
    needs=("kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)
KV_MAMBA_026 = rule(
    "KV-MAMBA-026",
    "The runner makes a step's copies before its forward; a partial hit resumes from its own copy",
    """The model runner makes the copies the scheduler hands it with a step (take_kv_cache_block_copies:
    (source, copy) pages) after zeroing the step's fresh pages and before the step's forward pass, all at
    once: each copy page then holds what its source page held before the step. A step reads a request's
    state from the entry the runner recorded at the request's previous step, or, at its first step after C
    computed tokens, from entry (C - 1) // B (none for C = 0). A request that adopted a partial hit of L
    tokens (KV-MAMBA-023) therefore starts from the state after L tokens in its own entry L // B, the
    private copy, not from the shared page the hit named. A producer whose tail key moved to a copy
    (KV-MAMBA-024) starts from its own page as before, and the copy holds the state after the tail's
    tokens, which the moved key names (KV-MAMBA-015), while the step overwrites the producer's page.""",
    source="vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states (new_block_ids_to_zero, then "
           "copy_kv_cache_blocks_inplace) / execute_model (_update_states before preprocess_mamba and the "
           "forward); vllm/v1/worker/gpu/model_runner.py (the same order); vllm/v1/worker/utils.py "
           "copy_kv_cache_blocks_inplace (blocks[dst] = blocks[src], every KV-cache tensor); "
           "vllm/v1/worker/mamba_utils.py preprocess_mamba (prev_state_idx = (num_computed_tokens - 1) // "
           "block_size for a new or resumed request); vllm/v1/core/sched/output.py "
           f"SchedulerOutput.kv_cache_block_copies; {SCHED} Scheduler.schedule",
    chapter=CHAPTER,
    needs=("kv_data", "kv_cache_groups", "mamba_align", "mamba_partial_hits"),
    judged_by=("manager",),
)


# -- the hit (KV-MAMBA-001, KV-MAMBA-002) ------------------------------------------------------
@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment: alignment > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: 0 <= result <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result % alignment == 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached, block_size: result == 0 or cached[result // block_size - 1],
                  enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, alignment: not any(
    cached[i] and ((i + 1) * block_size) % alignment == 0
    for i in range(result // block_size, min(max_length // block_size, len(cached)))), enabled=ENABLED)
@defines(KV_MAMBA_001, KV_MAMBA_002)
def hit_length(cached: tuple[bool, ...], max_length: int, block_size: int, alignment: int) -> int:
    """The Mamba hit in tokens (the EAGLE flag has no effect, KV-MAMBA-002)."""
    for i in range(min(max_length // block_size, len(cached)) - 1, -1, -1):
        if cached[i] and ((i + 1) * block_size) % alignment == 0:
            return (i + 1) * block_size
    return 0


# -- the table of a request (KV-MAMBA-004, KV-MAMBA-005) --------------------------------------
@icontract.require(lambda num_tokens, block_size, num_speculative_blocks:
                   num_tokens >= 0 and block_size > 0 and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size, num_speculative_blocks:
                  (result - num_speculative_blocks - 1) * block_size < num_tokens
                  <= (result - num_speculative_blocks) * block_size or (num_tokens == 0 and
                                                                         result == num_speculative_blocks),
                  enabled=ENABLED)
@defines(KV_MAMBA_004, KV_MAMBA_007)
def num_required_entries(num_tokens: int, block_size: int, num_speculative_blocks: int) -> int:
    """How many entries a table needs for ``num_tokens`` main tokens: up to the running page,
    then the speculative pages."""
    return cdiv(num_tokens, block_size) + num_speculative_blocks


@icontract.require(lambda num_tokens, block_size: num_tokens > 0 and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size: result * block_size < num_tokens
                  <= (result + 1) * block_size, enabled=ENABLED)
@defines(KV_MAMBA_004, KV_MAMBA_014)
def running_index(num_tokens: int, block_size: int) -> int:
    """The table entry that holds the state after ``num_tokens`` main tokens."""
    return cdiv(num_tokens, block_size) - 1


def _layout_ok(result: tuple[int, ...], num_held: int, num_tokens: int, block_size: int,
               num_speculative_blocks: int, checkpoint: bool, allocated: bool) -> bool:
    """The layout's own promises, for its postcondition: old entries at most once, in
    their old order among themselves only where nothing moved, and the tail shaped as
    KV-MAMBA-004 says when the table grew."""
    olds = [e for e in result if e >= 0]
    if sorted(olds) != list(range(num_held)):
        return False
    required = num_required_entries(num_tokens, block_size, num_speculative_blocks)
    if required <= num_held and not checkpoint:
        return result == tuple(range(num_held))
    if len(result) < required:
        return False
    running = running_index(num_tokens, block_size)
    return all(e != NULL for e in result[len(result) - 1 - num_speculative_blocks:]) and len(result) - 1 \
        - num_speculative_blocks >= running


@icontract.require(lambda num_held, num_tokens, block_size, num_speculative_blocks:
                   num_held >= 0 and num_tokens > 0 and block_size > 0 and num_speculative_blocks >= 0,
                   enabled=ENABLED)
@icontract.require(lambda num_held, num_speculative_blocks, allocated:
                   not allocated or num_held > num_speculative_blocks,
                   "a request that has allocated holds its running page and its speculative pages",
                   enabled=ENABLED)
@icontract.require(lambda num_tokens, block_size, checkpoint: not checkpoint or cdiv(num_tokens, block_size) >= 2,
                   "a checkpoint's page lies before the running page (KV-MAMBA-006)", enabled=ENABLED)
@icontract.ensure(lambda result, num_held: result[:num_held].count(NEW) == 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_held, num_tokens, block_size, num_speculative_blocks, checkpoint, allocated:
                  _layout_ok(result, num_held, num_tokens, block_size, num_speculative_blocks, checkpoint,
                             allocated), enabled=ENABLED)
@icontract.ensure(lambda result, num_speculative_blocks, checkpoint, allocated:
                  result.count(NEW) <= 1 + int(checkpoint) + (0 if allocated else num_speculative_blocks),
                  "KV-MAMBA-005: at most a running page and a checkpoint are new for a running request",
                  enabled=ENABLED)
@icontract.ensure(lambda result, allocated, num_held, num_speculative_blocks:
                  allocated or result[:num_held] == tuple(range(num_held)),
                  "a first allocation moves nothing", enabled=ENABLED)
@defines(KV_MAMBA_004, KV_MAMBA_005)
def align_layout(num_held: int, num_tokens: int, block_size: int, num_speculative_blocks: int,
                 checkpoint: bool, allocated: bool) -> tuple[int, ...]:
    """A table after an align-mode allocation to ``num_tokens`` main tokens, entry by entry.

    ``num_held`` is the table's length before (adopted hit entries included); ``checkpoint``
    whether a checkpoint is due (:func:`checkpoint_position`); ``allocated`` whether the
    request has allocated in this group before. Each entry is the index of an old entry, or
    :data:`NULL`, or :data:`NEW` (a block from the free queue). The allocation returns the
    entries from ``num_held`` on.
    """
    required = num_required_entries(num_tokens, block_size, num_speculative_blocks)
    layout = list(range(num_held))
    if required <= num_held and not checkpoint:
        return tuple(layout)
    first_kept = required - num_speculative_blocks - 1 - int(checkpoint)
    layout.extend([NULL] * max(0, first_kept - num_held))
    if allocated:
        for index in range(num_held - num_speculative_blocks, num_held):
            if index >= first_kept:
                break
            layout.append(layout[index])
            layout[index] = NULL
    layout.extend([NEW] * max(0, required - len(layout)))
    return tuple(layout)


# -- prefill checkpoints (KV-MAMBA-006) --------------------------------------------------------
@icontract.require(lambda num_tokens, alignment: num_tokens >= 0 and alignment > 0, enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result >= 0 and result % alignment == 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, drop_eagle: result <= max(0, num_tokens - 1)
                  or (drop_eagle and result == 0), enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, alignment, drop_eagle:
                  result == 0 or (num_tokens - (0 if drop_eagle else 1)) - result
                  < alignment * (2 if drop_eagle else 1), "the last such multiple", enabled=ENABLED)
@defines(KV_MAMBA_006)
def checkpoint_position(num_tokens: int, alignment: int, drop_eagle: bool) -> int:
    """The position a chunk ending at ``num_tokens`` checkpoints: the last multiple of the
    alignment that leaves a token to recompute (with EAGLE: that a hit can drop back to)."""
    limit = num_tokens if drop_eagle else num_tokens - 1
    position = limit // alignment * alignment - (alignment if drop_eagle else 0)
    return max(position, 0)


@icontract.require(lambda query_start, query_end: 0 <= query_start <= query_end, enabled=ENABLED)
@icontract.require(lambda hash_block_size, block_size, checkpoint_alignment:
                   hash_block_size > 0 and block_size > 0 and checkpoint_alignment >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, query_start, query_end, position: not result or query_start < position < query_end,
                  enabled=ENABLED)
@icontract.ensure(lambda result, checkpoint_alignment: not result or checkpoint_alignment > 0,
                  "a backend without a checkpoint alignment exports nothing", enabled=ENABLED)
@defines(KV_MAMBA_006)
def checkpoint_exportable(query_start: int, query_end: int, position: int, hash_block_size: int,
                          block_size: int, checkpoint_alignment: int) -> bool:
    """Whether the backend can export the state at ``position`` inside the chunk
    ``[query_start, query_end)`` (``checkpoint_alignment`` 0: the backend has none)."""
    if checkpoint_alignment == 0:
        return False
    start_page = (query_start - 1) // block_size
    checkpoint_page = cdiv(query_end, block_size) - 2
    return (query_start % hash_block_size == 0 and checkpoint_page > start_page
            and query_start + hash_block_size <= position and query_start < position < query_end
            and (position - query_start) % checkpoint_alignment == 0)


@icontract.require(lambda query_start, query_end: 0 <= query_start <= query_end, enabled=ENABLED)
@icontract.require(lambda alignment, hash_block_size, block_size, checkpoint_alignment:
                   alignment > 0 and hash_block_size > 0 and block_size > 0 and checkpoint_alignment >= 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, has_checkpoint_blocks: result == 0 or has_checkpoint_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, query_start, query_end: result == 0 or query_start < result < query_end,
                  enabled=ENABLED)
@icontract.ensure(lambda result, query_end, block_size: result == 0 or checkpoint_index(query_end, block_size) >= 0,
                  "the checkpoint's page lies before the running page", enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result % alignment == 0, enabled=ENABLED)
@defines(KV_MAMBA_006)
def exported_checkpoint(has_checkpoint_blocks: bool, checkpoint_alignment: int, query_start: int, query_end: int,
                        alignment: int, hash_block_size: int, block_size: int, drop_eagle: bool) -> int:
    """The checkpoint position the backend exports for a chunk from ``query_start`` computed to
    ``query_end`` main tokens, or 0 for none: the backend's half of KV-MAMBA-006, decided from
    the chunk alone (vLLM's ``compute_mamba_prefill_checkpoints``). The model runner writes it
    into entry :func:`checkpoint_index`; the manager reserves a page there only where that entry
    is free (:func:`reserved_checkpoint`)."""
    if not has_checkpoint_blocks:
        return 0
    position = checkpoint_position(query_end, alignment, drop_eagle)
    if position <= 0 or cdiv(query_end, block_size) - 2 < 0:
        return 0
    if not checkpoint_exportable(query_start, query_end, position, hash_block_size, block_size,
                                 checkpoint_alignment):
        return 0
    return position


@icontract.require(lambda query_start, query_end: 0 <= query_start <= query_end, enabled=ENABLED)
@icontract.require(lambda alignment, hash_block_size, block_size, checkpoint_alignment, num_speculative_blocks:
                   alignment > 0 and hash_block_size > 0 and block_size > 0 and checkpoint_alignment >= 0
                   and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, has_checkpoint_blocks: result == 0 or has_checkpoint_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, query_start, query_end: result == 0 or query_start < result < query_end,
                  enabled=ENABLED)
@icontract.ensure(lambda result, query_end, block_size, is_null, allocated, num_speculative_blocks:
                  result == 0 or (cdiv(query_end, block_size) - 2 >= 0 and (
                      cdiv(query_end, block_size) - 2 >= len(is_null) or is_null[cdiv(query_end, block_size) - 2]
                      or (allocated and cdiv(query_end, block_size) - 2 >= len(is_null) - num_speculative_blocks))),
                  "the checkpoint's entry is free to take", enabled=ENABLED)
@defines(KV_MAMBA_006)
def reserved_checkpoint(has_checkpoint_blocks: bool, checkpoint_alignment: int, query_start: int, query_end: int,
                        alignment: int, hash_block_size: int, block_size: int, drop_eagle: bool,
                        is_null: tuple[bool, ...], allocated: bool, num_speculative_blocks: int) -> int:
    """The checkpoint position a step from ``query_start`` computed to ``query_end`` main
    tokens reserves a page for, or 0 for none. Its entry is :func:`checkpoint_index`.

    ``is_null`` describes the table as it is before the step adopts a hit.
    """
    position = exported_checkpoint(has_checkpoint_blocks, checkpoint_alignment, query_start, query_end, alignment,
                                   hash_block_size, block_size, drop_eagle)
    if not position:
        return 0
    free_entry = checkpoint_entry_free(checkpoint_index(query_end, block_size), is_null, allocated,
                                       num_speculative_blocks)
    return position if free_entry else 0


@icontract.require(lambda index, num_speculative_blocks: index >= 0 and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, index, is_null: result or (index < len(is_null) and not is_null[index]),
                  "KV-MAMBA-006: a page already in the table is never taken for a checkpoint", enabled=ENABLED)
@defines(KV_MAMBA_006)
def checkpoint_entry_free(index: int, is_null: tuple[bool, ...], allocated: bool, num_speculative_blocks: int) -> bool:
    """Whether the manager may give entry ``index`` of a table (``is_null``, as it is before
    the step's allocation) a checkpoint page: the entry lies past the table's end, is null, or
    is one of the speculative pages the allocation moves to the new end. A page rejected drafts
    left in a longer table is none of these: the manager reserves no checkpoint there, though
    the backend may still write one into it (:func:`step_states`)."""
    return index >= len(is_null) or is_null[index] or (allocated and index >= len(is_null) - num_speculative_blocks)


@icontract.require(lambda query_end, block_size: query_end > 0 and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, query_end, block_size: result == running_index(query_end, block_size) - 1,
                  enabled=ENABLED)
@defines(KV_MAMBA_006, KV_MAMBA_014)
def checkpoint_index(query_end: int, block_size: int) -> int:
    """The table entry a checkpoint of a step ending at ``query_end`` is written to."""
    return cdiv(query_end, block_size) - 2


# -- what an allocation needs (KV-MAMBA-007, KV-MAMBA-008, KV-MAMBA-009) ----------------------
def _need_args_ok(num_tokens: int, block_size: int, num_speculative_blocks: int, num_hit_blocks: int,
                  num_held: int, allocated: bool, checkpoint: bool, num_evictable_hits: int,
                  num_pool_blocks: int) -> bool:
    """What :func:`align_need` (and :func:`copy_need`, which adds to it) takes: positive sizes, at
    most one evictable hit block, a table that holds its speculative pages once allocated, a
    checkpoint only in a step of two blocks or more, and a hit only for a request without entries."""
    return (num_tokens > 0 and block_size > 0 and num_speculative_blocks >= 0 and num_hit_blocks >= 0
            and num_held >= 0 and 0 <= num_evictable_hits <= min(num_hit_blocks, 1) and num_pool_blocks > 0
            and (not allocated or num_held > num_speculative_blocks)
            and (not checkpoint or cdiv(num_tokens, block_size) >= 2)
            and (num_hit_blocks == 0 or num_held == 0))


#: The precondition :func:`align_need` and :func:`copy_need` share.
_NEED_ARGS = icontract.require(
    _need_args_ok, "the need's arguments: a step, a table, at most one evictable hit block, and only a request "
    "without entries adopts a hit", enabled=ENABLED)


@_NEED_ARGS
@icontract.ensure(lambda result: result >= 0, "KV-MAMBA-008: never negative", enabled=ENABLED)
@icontract.ensure(lambda result, deferred, num_hit_blocks, num_pool_blocks:
                  not (deferred and num_hit_blocks > 0) or result > num_pool_blocks,
                  "KV-MAMBA-009: a deferred hit cannot be admitted", enabled=ENABLED)
@icontract.ensure(lambda result, deferred, num_hit_blocks, num_held, num_tokens, block_size,
                  num_speculative_blocks, checkpoint, allocated, num_evictable_hits:
                  (deferred and num_hit_blocks > 0) or result - num_evictable_hits == align_layout(
                      num_held + num_hit_blocks, num_tokens, block_size, num_speculative_blocks, checkpoint,
                      allocated).count(NEW),
                  "KV-MAMBA-007: the need is exactly the blocks the layout takes from the pool", enabled=ENABLED)
@defines(KV_MAMBA_007, KV_MAMBA_008, KV_MAMBA_009)
def align_need(num_tokens: int, block_size: int, num_speculative_blocks: int, num_hit_blocks: int,
               num_held: int, allocated: bool, checkpoint: bool, num_evictable_hits: int, deferred: bool,
               num_pool_blocks: int) -> int:
    """The free blocks an align-mode group consumes in an allocation to ``num_tokens`` main
    tokens.

    ``num_evictable_hits`` is 1 when the hit's state page sits in the free queue;
    ``deferred`` whether that page's key was cached in the current step (KV-MAMBA-009), which
    makes the need exceed the pool of ``num_pool_blocks`` blocks.
    """
    if deferred and num_hit_blocks > 0:
        return num_pool_blocks + 1
    growth = num_required_entries(num_tokens, block_size, num_speculative_blocks) - num_hit_blocks - num_held
    cap = 1 + int(checkpoint) + (0 if allocated else num_speculative_blocks)
    return min(max(growth, 0), cap) + num_evictable_hits


# -- freeing (KV-MAMBA-010, KV-MAMBA-012) ------------------------------------------------------
@icontract.require(lambda num_retired, processed, block_size: num_retired >= 0 and processed >= 0 and block_size > 0,
                   enabled=ENABLED)
@icontract.ensure(lambda result, is_null: all(not is_null[i] for i in result), enabled=ENABLED)
@icontract.ensure(lambda result: list(result) == sorted(set(result), reverse=True), "right to left, once each",
                  enabled=ENABLED)
@icontract.ensure(lambda result, num_retired, processed, block_size:
                  all(num_retired <= i < max(processed - 1, 0) // block_size for i in result), enabled=ENABLED)
@icontract.ensure(lambda result, is_null, num_retired, processed, block_size:
                  len(result) == sum(1 for i in range(num_retired, min(max(processed - 1, 0) // block_size,
                                                                       len(is_null))) if not is_null[i]),
                  "KV-MAMBA-010: every non-null entry in the range, nulls do not stop it", enabled=ENABLED)
@defines(KV_MAMBA_010)
def align_blocks_to_free(is_null: tuple[bool, ...], num_retired: int, processed: int, block_size: int
                         ) -> tuple[int, ...]:
    """Table entries an align-mode group frees before an allocation with ``processed``
    processed tokens, in the order they are released (one release)."""
    if processed - 1 <= 0:
        return ()
    last = min((processed - 1) // block_size, len(is_null))
    return tuple(i for i in range(last - 1, num_retired - 1, -1) if not is_null[i])


@icontract.require(lambda num_retired, processed, block_size, table_length:
                   num_retired >= 0 and processed >= 0 and block_size > 0 and table_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_retired: result >= num_retired, "the mark only moves on", enabled=ENABLED)
@icontract.ensure(lambda result, num_retired, table_length: result <= max(num_retired, table_length), enabled=ENABLED)
@defines(KV_MAMBA_010)
def retired_after(num_retired: int, processed: int, block_size: int, table_length: int) -> int:
    """The retired mark after freeing at ``processed`` tokens: the end of the range freed, if
    it was not empty."""
    if processed - 1 <= 0:
        return num_retired
    last = min((processed - 1) // block_size, table_length)
    return last if last > num_retired else num_retired


@icontract.require(lambda last_state_index, processed, block_size: last_state_index >= -1 and processed >= 0
                   and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, last_state_index, is_null: not result or (
    0 <= last_state_index < len(is_null) and not is_null[last_state_index]), enabled=ENABLED)
@defines(KV_MAMBA_010)
def frees_last_state(last_state_index: int, processed: int, block_size: int, is_null: tuple[bool, ...]) -> bool:
    """Whether the entry that held the running state at the table's last growth
    (``last_state_index``, -1 for none) is freed now, after :func:`align_blocks_to_free`'s
    release: when it is not null and lies before the page of the last processed token."""
    return (0 <= last_state_index < cdiv(processed, block_size) - 1 and last_state_index < len(is_null)
            and not is_null[last_state_index])


@icontract.require(lambda null_id: null_id >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, table, null_id: sorted(result) == sorted(b for b in table if b != null_id),
                  enabled=ENABLED)
@icontract.ensure(lambda result, table, null_id: list(result) == [b for b in reversed(table) if b != null_id],
                  "KV-MAMBA-012: tail first, every null skipped", enabled=ENABLED)
@defines(KV_MAMBA_012)
def align_free_order(table: tuple[int, ...], null_id: int = 0) -> tuple[int, ...]:
    """The order ``free`` releases an align-mode table's pages: last first, nulls skipped."""
    return tuple(b for b in reversed(table) if b != null_id)


@icontract.require(lambda num_speculative_blocks: num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, is_null: result or any(is_null), enabled=ENABLED)
@defines(KV_MAMBA_013)
def align_table_ok(is_null: tuple[bool, ...], num_speculative_blocks: int) -> bool:
    """KV-MAMBA-013: the last ``1 + num_speculative_blocks`` entries are not null."""
    return not any(is_null[max(0, len(is_null) - 1 - num_speculative_blocks):])


# -- caching (KV-MAMBA-011) --------------------------------------------------------------------
@icontract.require(lambda position, index, num_hashed_tokens: position >= 0 and index >= -1
                   and num_hashed_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, position: result in (0, position), enabled=ENABLED)
@icontract.ensure(lambda result, keyed_at_position: result == 0 or not keyed_at_position,
                  "no key is cached twice", enabled=ENABLED)
@icontract.ensure(lambda result, num_hashed_tokens: result <= num_hashed_tokens,
                  "KV-MAMBA-017: only a hashed prefix is keyed", enabled=ENABLED)
@icontract.ensure(lambda result, position, index, is_null, keyed_at_position, num_hashed_tokens:
                  result == position or position == 0 or keyed_at_position or position > num_hashed_tokens
                  or not 0 <= index < len(is_null) or is_null[index], "a due checkpoint's page is keyed",
                  enabled=ENABLED)
@defines(KV_MAMBA_011, KV_MAMBA_017)
def checkpoint_key_tokens(position: int, index: int, is_null: tuple[bool, ...], keyed_at_position: bool,
                          num_hashed_tokens: int) -> int:
    """The prefix length the checkpoint page is (re)keyed at after caching, or 0 for none.

    ``position`` is the checkpoint reserved this step (0 for none), ``index`` its entry,
    ``keyed_at_position`` whether its page carries the key of that prefix already and
    ``num_hashed_tokens`` how many of the request's tokens are hashed (its committed tokens
    in whole hash blocks).
    """
    if position == 0 or position > num_hashed_tokens or not 0 <= index < len(is_null) or is_null[index]:
        return 0
    return 0 if keyed_at_position else position


# -- the state pages (KV-MAMBA-014, KV-MAMBA-015, KV-MAMBA-016) --------------------------------
@icontract.require(lambda num_tokens, block_size, checkpoint: num_tokens > 0 and block_size > 0
                   and 0 <= checkpoint < num_tokens, enabled=ENABLED)
@icontract.require(lambda num_tokens, block_size, checkpoint: checkpoint == 0 or cdiv(num_tokens, block_size) >= 2,
                   "a checkpoint's page lies before the running page", enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens: result[0][1] == num_tokens, enabled=ENABLED)
@icontract.ensure(lambda result: len({index for index, _ in result}) == len(result),
                  "KV-MAMBA-014: one state per page", enabled=ENABLED)
@defines(KV_MAMBA_014)
def states_written(num_tokens: int, block_size: int, checkpoint: int) -> tuple[tuple[int, int], ...]:
    """``(table entry, state after that many tokens)`` a step without drafts writes: the
    running page, then the checkpoint's page if one was reserved (``checkpoint`` > 0)."""
    running = running_index(num_tokens, block_size)
    if checkpoint == 0:
        return ((running, num_tokens),)
    return ((running, num_tokens), (running - 1, checkpoint))


# -- the runner's view of a table (KV-MAMBA-018) ------------------------------------------------
#: A state in :func:`step_states`: none that a key may name (a draft's state, or a page two of a
#: step's writes reach).
NO_STATE = -1


@icontract.require(lambda table_length, num_tokens, block_size, num_speculative_blocks:
                   num_tokens > 0 and block_size > 0 and num_speculative_blocks >= 0, enabled=ENABLED)
@icontract.require(lambda table_length, num_tokens, block_size, num_speculative_blocks:
                   table_length >= num_required_entries(num_tokens, block_size, num_speculative_blocks),
                   "an allocation leaves at least the entries the step needs (KV-MAMBA-004)", enabled=ENABLED)
@icontract.ensure(lambda result, table_length, num_speculative_blocks:
                  result + 1 + num_speculative_blocks == table_length,
                  "KV-MAMBA-013: the first of the table's last 1 + s entries", enabled=ENABLED)
@icontract.ensure(lambda result, table_length, num_tokens, block_size, num_speculative_blocks:
                  (result == running_index(num_tokens, block_size))
                  == (table_length == num_required_entries(num_tokens, block_size, num_speculative_blocks)),
                  "the step's own running page exactly when the table is as long as the step", enabled=ENABLED)
@defines(KV_MAMBA_018)
def state_entry(table_length: int, num_tokens: int, block_size: int, num_speculative_blocks: int) -> int:
    """The table entry holding a request's running state after an allocation to ``num_tokens``
    main tokens left its table ``table_length`` entries long (a longer table than the step
    needs: further right than :func:`running_index`)."""
    return table_length - 1 - num_speculative_blocks


def _one_state_per_page(result: tuple[tuple[int, int], ...]) -> bool:
    return len({index for index, _ in result}) == len(result)


def _step_ok(committed: int, num_tokens: int, block_size: int, num_speculative_blocks: int, checkpoint: int,
             is_null: tuple[bool, ...], keyed_early: tuple[bool, ...]) -> bool:
    """A step's arguments as :func:`step_states` and :func:`passed_pages` take them: the committed
    tokens within the main tokens, the table at least as long as the step needs and not null at
    its last 1 + s entries (KV-MAMBA-004, KV-MAMBA-013), a checkpoint inside the step with its page
    before the running page (KV-MAMBA-006)."""
    return (0 < committed <= num_tokens and block_size > 0 and num_speculative_blocks >= 0
            and len(keyed_early) == len(is_null)
            and len(is_null) >= num_required_entries(num_tokens, block_size, num_speculative_blocks)
            and not any(is_null[len(is_null) - 1 - num_speculative_blocks:])
            and (checkpoint == 0 or (0 < checkpoint < num_tokens and cdiv(num_tokens, block_size) >= 2)))


@icontract.require(lambda is_null, keyed_early, committed, num_tokens, block_size, num_speculative_blocks,
                   checkpoint: _step_ok(committed, num_tokens, block_size, num_speculative_blocks, checkpoint, is_null,
                                        keyed_early), enabled=ENABLED)
@icontract.ensure(lambda result, is_null, num_tokens, block_size, num_speculative_blocks, committed:
                  result[0] == (state_entry(len(is_null), num_tokens, block_size, num_speculative_blocks), committed),
                  "the running entry first, with the state after the committed tokens", enabled=ENABLED)
@icontract.ensure(lambda result: _one_state_per_page(result), "one state per page", enabled=ENABLED)
@icontract.ensure(lambda result, is_null: all(0 <= index < len(is_null) and not is_null[index] for index, _ in result),
                  "only pages, never a null entry", enabled=ENABLED)
@icontract.ensure(lambda result, committed, checkpoint: all(
    count in (committed, checkpoint, NO_STATE) for _, count in result), enabled=ENABLED)
@icontract.ensure(lambda result, checkpoint, committed: checkpoint <= committed or all(
    count != checkpoint for _, count in result), "a checkpoint past the committed tokens is a draft's state",
    enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size, checkpoint, reserved: reserved or not checkpoint or all(
    count in (NO_STATE, (index + 1) * block_size) for index, count in result
    if index == checkpoint_index(num_tokens, block_size)),
    "KV-MAMBA-018: a checkpoint's page the manager did not reserve holds only the state its boundary key names",
    enabled=ENABLED)
@icontract.ensure(lambda result, is_null, committed, num_tokens, block_size, num_speculative_blocks, checkpoint,
                  reserved: committed != num_tokens
                  or len(is_null) != num_required_entries(num_tokens, block_size, num_speculative_blocks)
                  or (checkpoint and (is_null[checkpoint_index(num_tokens, block_size)] or not reserved))
                  or result == states_written(num_tokens, block_size, checkpoint),
                  "KV-MAMBA-014: a step without drafts over a table as long as it writes what states_written says",
                  enabled=ENABLED)
@defines(KV_MAMBA_018)
def step_states(is_null: tuple[bool, ...], keyed_early: tuple[bool, ...], committed: int, num_tokens: int,
                block_size: int, num_speculative_blocks: int, checkpoint: int, reserved: bool
                ) -> tuple[tuple[int, int], ...]:
    """``(table entry, state after that many tokens)`` for every page a step writes: the step
    brought the request to ``committed`` computed tokens with ``num_tokens`` main tokens (drafts
    included, all rejected) over a table whose entries are null where ``is_null`` says, and its
    backend exported a checkpoint at ``checkpoint`` (0: none; :func:`exported_checkpoint`),
    into a page the manager reserved for it this step (``reserved``:
    :func:`checkpoint_entry_free`) or into one rejected drafts left in the table.
    ``keyed_early`` says which entries hold an earlier step's checkpoint keyed before their
    block boundary (:func:`keyed_before_boundary`).

    The running entry comes first. :data:`NO_STATE` marks a page the step leaves without a
    state a key may name: a checkpoint past the committed tokens (a draft's state); a
    checkpoint in a page the manager did not reserve, which KV-MAMBA-011 keys at its block
    boundary, unless the checkpoint lies on that boundary; and a page holding a checkpoint
    keyed before its boundary (this step's or an earlier one's) that the boundary copy reaches
    -- its keys name the checkpoint now and the boundary later.
    """
    running = state_entry(len(is_null), num_tokens, block_size, num_speculative_blocks)
    states = {running: committed}
    target = checkpoint_index(num_tokens, block_size) if checkpoint else -1
    if checkpoint and not is_null[target]:
        # The key the page will carry: the checkpoint's own, or (not reserved) its position's.
        key = checkpoint if reserved else (target + 1) * block_size
        states[target] = checkpoint if checkpoint <= committed and checkpoint == key else NO_STATE
    boundary = committed // block_size - 1 if committed % block_size == 0 else -1
    if boundary >= 0 and boundary != running and not is_null[boundary]:
        early = keyed_early[boundary] or (boundary == target and reserved and checkpoint < committed)
        states[boundary] = NO_STATE if early else committed
    del states[running]
    return ((running, committed), *sorted(states.items()))


@icontract.require(lambda is_null, keyed_early, committed, num_tokens, block_size, num_speculative_blocks,
                   checkpoint: _step_ok(committed, num_tokens, block_size, num_speculative_blocks, checkpoint, is_null,
                                        keyed_early), enabled=ENABLED)
@icontract.require(lambda start, committed: 0 <= start < committed, enabled=ENABLED)
@icontract.ensure(lambda result: list(result) == sorted(set(result)), enabled=ENABLED)
@icontract.ensure(lambda result, is_null, start, committed, block_size: all(
    not is_null[i] and start < (i + 1) * block_size < committed for i in result), enabled=ENABLED)
@icontract.ensure(lambda result, is_null, keyed_early, committed, num_tokens, block_size, num_speculative_blocks,
                  checkpoint: not set(result) & {i for i, _ in step_states(is_null, keyed_early, committed, num_tokens,
                                                                           block_size, num_speculative_blocks,
                                                                           checkpoint, True)},
                  "a page the step writes is not passed over", enabled=ENABLED)
@icontract.ensure(lambda result, start, committed, block_size: not result
                  or committed > (start // block_size + 1) * block_size,
                  "a step that ends by its next block boundary passes no page", enabled=ENABLED)
@defines(KV_MAMBA_018)
def passed_pages(is_null: tuple[bool, ...], keyed_early: tuple[bool, ...], start: int, committed: int,
                 num_tokens: int, block_size: int, num_speculative_blocks: int, checkpoint: int) -> tuple[int, ...]:
    """The pages whose block boundary a step from ``start`` to ``committed`` computed tokens
    passed strictly inside it without writing them (:func:`step_states`): their positional key
    (KV-MAMBA-011) would name a state they never held. Empty for every step vLLM's scheduler
    makes (KV-MAMBA-016; one real token a step with or after drafts)."""
    # Which pages a step writes does not depend on whether its checkpoint's page was reserved.
    written = {index for index, _ in step_states(is_null, keyed_early, committed, num_tokens, block_size,
                                                 num_speculative_blocks, checkpoint, True)}
    return tuple(index for index in range(start // block_size, len(is_null))
                 if start < (index + 1) * block_size < committed and not is_null[index] and index not in written)


@icontract.require(lambda index, position, committed, block_size: index >= 0 and position >= 0 and committed > 0
                   and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, position, committed: not result or 0 < position <= committed, enabled=ENABLED)
@defines(KV_MAMBA_018)
def keyed_before_boundary(index: int, position: int, committed: int, block_size: int) -> bool:
    """Whether a step that wrote its checkpoint at ``position`` (0: none) into entry ``index``
    left there a state keyed (KV-MAMBA-011: at most the committed tokens) before the entry's
    block boundary, which the entry's positional key will name later. With several KV-cache
    groups a checkpoint's position can lie before its page's boundary (KV-MAMBA-006)."""
    return 0 < position <= committed and position < (index + 1) * block_size

@icontract.require(lambda start, end, prefill_end, block_size: 0 <= start <= end and prefill_end >= 0
                   and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, start, end, prefill_end: result or start < prefill_end, enabled=ENABLED)
@icontract.ensure(lambda result, start, end, block_size: result or end > start,
                  "KV-MAMBA-015/KV-MAMBA-016: only a chunk that computes something can break the states",
                  enabled=ENABLED)
@defines(KV_MAMBA_015, KV_MAMBA_016)
def chunk_keeps_states(start: int, end: int, prefill_end: int, block_size: int) -> bool:
    """Whether a step from ``start`` to ``end`` computed tokens obeys KV-MAMBA-016 (decode
    steps, from ``prefill_end`` on, always do)."""
    if start >= prefill_end or end == start:
        return True
    ends_on_boundary = end >= prefill_end or end % block_size == 0
    stays_in_block = start % block_size == 0 or end <= (start // block_size + 1) * block_size
    return ends_on_boundary and stays_in_block


@icontract.require(lambda start, end, prefill_end, block_size: 0 <= start <= end and prefill_end >= 0
                   and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, start, end: start <= result <= end, enabled=ENABLED)
@icontract.ensure(lambda result, start, end, prefill_end, block_size:
                  chunk_keeps_states(start, result, prefill_end, block_size),
                  "KV-MAMBA-016: the chunk the scheduler keeps obeys the rule", enabled=ENABLED)
@icontract.ensure(lambda result, start, end, prefill_end, block_size:
                  not chunk_keeps_states(start, end, prefill_end, block_size) or result == end,
                  "a chunk that obeys the rule already is kept whole", enabled=ENABLED)
@defines(KV_MAMBA_016)
def aligned_chunk_end(start: int, end: int, prefill_end: int, block_size: int) -> int:
    """Where the scheduler ends a chunk it wanted to run from ``start`` to ``end`` computed
    tokens, so that it obeys KV-MAMBA-016: a prefill chunk ending before ``prefill_end`` is cut
    back to its last block boundary, and one starting inside a block stops at the next
    boundary. ``start`` itself (nothing scheduled) when no boundary lies inside the chunk --
    vLLM's scheduler then leaves the request for a later step (a Mamba block wider than the
    prefill budget, where it advances inside the block instead, is not a kvoracle case)."""
    if start >= prefill_end or end == start:
        return end
    if end < prefill_end:
        boundary = end // block_size * block_size
        if boundary <= start:
            return start
        end = boundary
    next_boundary = (start // block_size + 1) * block_size
    if start % block_size and end > next_boundary:
        return next_boundary
    return end


# -- fine-grained partial hits (KV-MAMBA-019 .. KV-MAMBA-025) ------------------------------------
#: The group kinds (as :mod:`kvoracle.spec.hybrid` names them) whose managers look hits up at
#: hash-block granularity in vLLM 0.33.0 (``supports_fine_grained_hash_lookup``).
FINE_GRAINED_KINDS = ("full", "mamba")
_GROUP_KINDS = ("full", "sliding_window", "chunked_local", "mamba")


def _groups_ok(kinds: tuple[str, ...], block_sizes: tuple[int, ...], hash_block_size: int) -> bool:
    return (hash_block_size > 0 and len(kinds) == len(block_sizes) > 0
            and all(kind in _GROUP_KINDS for kind in kinds)
            and all(size > 0 and size % hash_block_size == 0 for size in block_sizes))


@icontract.require(lambda kinds, block_sizes, hash_block_size: _groups_ok(kinds, block_sizes, hash_block_size),
                   enabled=ENABLED)
@icontract.ensure(lambda result, kinds: not result or len(kinds) >= 2,
                  "one group keeps B = h: no partial hits", enabled=ENABLED)
@icontract.ensure(lambda result, kinds, block_sizes, hash_block_size: not result or any(
    kind == "mamba" and size > hash_block_size for kind, size in zip(kinds, block_sizes)), enabled=ENABLED)
@icontract.ensure(lambda result, kinds, block_sizes, hash_block_size: not result or all(
    kind in FINE_GRAINED_KINDS or size == hash_block_size for kind, size in zip(kinds, block_sizes)),
    "every group can look up hash boundaries", enabled=ENABLED)
@icontract.ensure(lambda result, kinds, block_sizes, hash_block_size: not result or not all(
    size == hash_block_size for kind, size in zip(kinds, block_sizes) if kind == "mamba"),
    "KV-MAMBA-003's groups (Mamba block = hash block) never turn them on", enabled=ENABLED)
@defines(KV_MAMBA_019)
def partial_hits_enabled(kinds: tuple[str, ...], block_sizes: tuple[int, ...], hash_block_size: int) -> bool:
    """Whether vLLM 0.33.0 turns fine-grained partial hits on for these cacheable groups (an
    align-mode Mamba group with caching on; ``kinds`` as :mod:`kvoracle.spec.hybrid` names them)."""
    if len(kinds) < 2:
        return False
    coarse_mamba = any(kind == "mamba" and size > hash_block_size for kind, size in zip(kinds, block_sizes))
    others_follow = all(kind in FINE_GRAINED_KINDS or size == hash_block_size
                        for kind, size in zip(kinds, block_sizes))
    return coarse_mamba and others_follow


@icontract.require(lambda kinds, block_sizes, hash_block_size, scheduler_block_size:
                   _groups_ok(kinds, block_sizes, hash_block_size) and scheduler_block_size > 0
                   and all(scheduler_block_size % size == 0 for size in block_sizes), enabled=ENABLED)
@icontract.ensure(lambda result, kinds, block_sizes, hash_block_size, scheduler_block_size:
                  result == (hash_block_size if partial_hits_enabled(kinds, block_sizes, hash_block_size)
                             else scheduler_block_size), enabled=ENABLED)
@icontract.ensure(lambda result, hash_block_size: result % hash_block_size == 0, enabled=ENABLED)
@defines(KV_MAMBA_019)
def hit_alignment(kinds: tuple[str, ...], block_sizes: tuple[int, ...], hash_block_size: int,
                  scheduler_block_size: int) -> int:
    """The alignment ``A`` of hits: the hash block with partial hits on, else the scheduler block
    size (the LCM of the groups' block sizes)."""
    if partial_hits_enabled(kinds, block_sizes, hash_block_size):
        return hash_block_size
    return scheduler_block_size


def _page_keys_only(cached: tuple[bool, ...], units_per_block: int) -> bool:
    return all(not hit or (f + 1) % units_per_block == 0 for f, hit in enumerate(cached))


@icontract.require(lambda max_length, block_size, hash_block_size: max_length >= 0 and hash_block_size > 0
                   and block_size > hash_block_size and block_size % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length, hash_block_size: 0 <= result <= max_length
                  and result % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached, hash_block_size: result == 0 or cached[result // hash_block_size - 1],
                  "the hit's key is cached", enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, hash_block_size: not any(
    cached[f] for f in range(result // hash_block_size, min(max_length // hash_block_size, len(cached)))),
    "no later cached boundary within the bound", enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, hash_block_size:
                  not _page_keys_only(cached, block_size // hash_block_size)
                  or result == hit_length(tuple(cached[(i + 1) * (block_size // hash_block_size) - 1]
                                                for i in range(len(cached) // (block_size // hash_block_size))),
                                          max_length, block_size, block_size),
                  "with positional keys only, KV-MAMBA-001's hit", enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, hash_block_size:
                  result == hit_length(tuple(cached), max_length, hash_block_size, hash_block_size),
                  "KV-MAMBA-001's finder over hash units: the hybrid loop can look it up as a group of "
                  "block h", enabled=ENABLED)
@defines(KV_MAMBA_020)
def partial_hit_length(cached: tuple[bool, ...], max_length: int, block_size: int, hash_block_size: int) -> int:
    """The Mamba hit in tokens with partial hits on: ``cached[f]`` says whether the key of the
    prefix of ``(f + 1) * hash_block_size`` tokens is cached in the group (a page's positional
    key or a partial entry)."""
    for f in range(min(max_length // hash_block_size, len(cached)) - 1, -1, -1):
        if cached[f]:
            return (f + 1) * hash_block_size
    return 0


@icontract.require(lambda hit_tokens, block_size: hit_tokens >= 0 and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, hit_tokens, block_size: result == -1
                  or result * block_size < hit_tokens < (result + 1) * block_size,
                  "the hit ends strictly inside the shared entry's block", enabled=ENABLED)
@icontract.ensure(lambda result, hit_tokens, block_size: (result == -1) == (hit_tokens % block_size == 0),
                  enabled=ENABLED)
@defines(KV_MAMBA_020, KV_MAMBA_023)
def shared_entry(hit_tokens: int, block_size: int) -> int:
    """The table entry whose page a hit of ``hit_tokens`` leaves shared with the cache -- the
    hit's last entry, ``cdiv(L, B) - 1`` -- or -1 when the hit is not partial."""
    if hit_tokens % block_size == 0:
        return -1
    return hit_tokens // block_size


def _tail_args_ok(num_tokens: int, num_prompt_tokens: int, hash_block_size: int, block_size: int,
                  is_null: tuple[bool, ...], keyed_tokens: tuple[int, ...]) -> bool:
    return (num_tokens >= 0 and num_prompt_tokens > 0 and hash_block_size > 0 and block_size > hash_block_size
            and block_size % hash_block_size == 0 and len(keyed_tokens) == len(is_null)
            and all(k >= 0 for k in keyed_tokens))


@icontract.require(lambda num_tokens, num_prompt_tokens, hash_block_size, block_size, is_null, keyed_tokens:
                   _tail_args_ok(num_tokens, num_prompt_tokens, hash_block_size, block_size, is_null, keyed_tokens),
                   enabled=ENABLED)
@icontract.ensure(lambda result, checkpoint_due: result == -1 or not checkpoint_due,
                  "a step with a checkpoint keys the checkpoint instead", enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, num_prompt_tokens, hash_block_size, drop_eagle: result == -1 or (
    num_tokens > 0 and num_tokens == checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle)),
    "only at the prompt's last hash boundary", enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size: result == -1 or result == cdiv(num_tokens, block_size) - 1,
                  "the page holding the state after the boundary", enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, is_null, keyed_tokens: result == -1 or (
    not is_null[result] and keyed_tokens[result] != num_tokens), "a page, not keyed there already",
    enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, num_prompt_tokens, hash_block_size, block_size, drop_eagle,
                  checkpoint_due, is_null, keyed_tokens:
                  result != -1 or checkpoint_due or num_tokens == 0
                  or num_tokens != checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle)
                  or cdiv(num_tokens, block_size) > len(is_null) or is_null[cdiv(num_tokens, block_size) - 1]
                  or keyed_tokens[cdiv(num_tokens, block_size) - 1] == num_tokens,
                  "a due tail entry is registered", enabled=ENABLED)
@defines(KV_MAMBA_021)
def tail_entry(num_tokens: int, num_prompt_tokens: int, hash_block_size: int, block_size: int, drop_eagle: bool,
               checkpoint_due: bool, is_null: tuple[bool, ...], keyed_tokens: tuple[int, ...]) -> int:
    """The table entry keyed at the prompt's last hash boundary after an allocation whose group
    caches ``num_tokens`` tokens, or -1 for none.

    ``keyed_tokens[i]`` is the token count of entry ``i``'s page key (0: none); ``checkpoint_due``
    whether the allocation reserved a checkpoint (KV-MAMBA-006). The entry is a partial tail
    (its request the tail's producer, KV-MAMBA-024) when ``num_tokens`` is not a multiple of
    ``block_size``.
    """
    boundary = checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle)
    if checkpoint_due or num_tokens == 0 or num_tokens != boundary:
        return -1
    index = cdiv(num_tokens, block_size) - 1
    if index >= len(is_null) or is_null[index] or keyed_tokens[index] == num_tokens:
        return -1
    return index


@icontract.require(lambda position, num_prompt_tokens, hash_block_size, block_size:
                   position > 0 and position % hash_block_size == 0 and num_prompt_tokens > 0
                   and hash_block_size > 0 and block_size > hash_block_size
                   and block_size % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, position, block_size: result or position % block_size != 0,
                  "a checkpoint on a block boundary keeps its key", enabled=ENABLED)
@icontract.ensure(lambda result, position, num_prompt_tokens, hash_block_size, block_size, drop_eagle:
                  not result or position % block_size == 0
                  or position == checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle),
                  "inside a block, only the prompt's checkpoint", enabled=ENABLED)
@defines(KV_MAMBA_021)
def checkpoint_keeps_key(position: int, num_prompt_tokens: int, hash_block_size: int, block_size: int,
                         drop_eagle: bool) -> bool:
    """Whether a checkpoint reserved at ``position`` (KV-MAMBA-006) keeps the key KV-MAMBA-011
    gives it, with partial hits on; otherwise its page loses every key."""
    return (position % block_size == 0
            or position == checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle))


@icontract.require(lambda start, end, num_prompt_tokens, hash_block_size, block_size:
                   0 <= start <= end and num_prompt_tokens > 0 and hash_block_size > 0
                   and block_size > hash_block_size and block_size % hash_block_size == 0, enabled=ENABLED)
@icontract.ensure(lambda result, start, end: start <= result <= end, enabled=ENABLED)
@icontract.ensure(lambda result, start, end, num_prompt_tokens, hash_block_size, drop_eagle, exported:
                  result == end or (not exported and result == checkpoint_position(
                      num_prompt_tokens, hash_block_size, drop_eagle) < num_prompt_tokens),
                  "only the prompt's last hash boundary stops a chunk, and only where it is not exported",
                  enabled=ENABLED)
@icontract.ensure(lambda result, start, end, num_prompt_tokens, hash_block_size, block_size, drop_eagle, exported,
                  last_cacheable: result < end or exported
                  or not last_cacheable < checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle)
                  < num_prompt_tokens
                  or not start < checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle) < end,
                  "a chunk that passes the boundary stops there", enabled=ENABLED)
@defines(KV_MAMBA_021)
def tail_chunk_end(start: int, end: int, num_prompt_tokens: int, hash_block_size: int, block_size: int,
                   drop_eagle: bool, exported: bool, last_cacheable: int) -> int:
    """Where the scheduler ends a chunk from ``start`` to ``end`` computed tokens with partial hits
    on, once KV-MAMBA-016 has cut it: at the prompt's last hash boundary ``b`` where the chunk
    passes it strictly inside, ``b`` lies inside the prompt and past the last block boundary the
    scheduler may cache at (``last_cacheable``), and the backend does not export ``b`` as the
    chunk's checkpoint (``exported``) -- the step that ends there keys the partial tail
    (:func:`tail_entry`)."""
    boundary = checkpoint_position(num_prompt_tokens, hash_block_size, drop_eagle)
    if exported or not last_cacheable < boundary < num_prompt_tokens or not start < boundary < end:
        return end
    return boundary


#: What an allocation does about a shared page (:func:`copy_action`).
NO_COPY = 0
#: KV-MAMBA-023: the request's table takes the copy, the cache keeps the shared page.
PRIVATE_COPY = 1
#: KV-MAMBA-024: the request keeps its page, the cache entry moves to the copy.
MOVED_ENTRY = 2
#: The two pages of a copy (:func:`copy_pages`).
SOURCE = 0
COPY = 1


@icontract.require(lambda partial_hit, tail_pending, allocated: not (partial_hit and allocated)
                   and not (tail_pending and not allocated),
                   "a hit is adopted on a first allocation; a tail is registered after one", enabled=ENABLED)
@icontract.ensure(lambda result, partial_hit, tail_pending:
                  (result == NO_COPY) == (not partial_hit and not tail_pending), enabled=ENABLED)
@icontract.ensure(lambda result, allocated: result != PRIVATE_COPY or not allocated, enabled=ENABLED)
@icontract.ensure(lambda result, allocated: result != MOVED_ENTRY or allocated, enabled=ENABLED)
@defines(KV_MAMBA_022, KV_MAMBA_023, KV_MAMBA_024)
def copy_action(partial_hit: bool, tail_pending: bool, allocated: bool) -> int:
    """What an align-mode allocation does about a shared page: ``partial_hit`` whether the request
    adopts a partial hit (:func:`shared_entry`), ``tail_pending`` whether it registered a partial
    tail at its last caching (:func:`tail_entry`), ``allocated`` whether it has allocated before."""
    if partial_hit:
        return PRIVATE_COPY
    if tail_pending:
        return MOVED_ENTRY
    return NO_COPY


@icontract.require(lambda action: action in (PRIVATE_COPY, MOVED_ENTRY), enabled=ENABLED)
@icontract.ensure(lambda result: result[0] != result[1],
                  "the page the request writes is never the one the key names", enabled=ENABLED)
@icontract.ensure(lambda result: set(result) == {SOURCE, COPY}, enabled=ENABLED)
@defines(KV_MAMBA_023, KV_MAMBA_024)
def copy_pages(action: int) -> tuple[int, int]:
    """``(the page in the request's table at the entry, the page the shared keys name)`` after
    a copy (:data:`SOURCE` or :data:`COPY`)."""
    return (COPY, SOURCE) if action == PRIVATE_COPY else (SOURCE, COPY)


@_NEED_ARGS
@icontract.require(lambda action, num_hit_blocks, allocated: action in (NO_COPY, PRIVATE_COPY, MOVED_ENTRY)
                   and (action != PRIVATE_COPY or (num_hit_blocks > 0 and not allocated))
                   and (action != MOVED_ENTRY or allocated), enabled=ENABLED)
@icontract.ensure(lambda result, action, deferred, num_hit_blocks: action == NO_COPY
                  or (deferred and num_hit_blocks > 0) or result >= 1, "the copy is always taken", enabled=ENABLED)
@icontract.ensure(lambda result, num_tokens, block_size, num_speculative_blocks, num_hit_blocks, num_held,
                  allocated, checkpoint, num_evictable_hits, deferred, num_pool_blocks, action:
                  result == align_need(num_tokens, block_size, num_speculative_blocks, num_hit_blocks, num_held,
                                       allocated, checkpoint, num_evictable_hits, deferred, num_pool_blocks)
                  + int(action != NO_COPY and not (deferred and num_hit_blocks > 0)),
                  "KV-MAMBA-007's need and the copy", enabled=ENABLED)
@defines(KV_MAMBA_022)
def copy_need(num_tokens: int, block_size: int, num_speculative_blocks: int, num_hit_blocks: int, num_held: int,
              allocated: bool, checkpoint: bool, num_evictable_hits: int, deferred: bool, num_pool_blocks: int,
              action: int) -> int:
    """The free blocks an align-mode allocation consumes with :func:`copy_action`'s ``action``
    (the arguments before it are :func:`align_need`'s)."""
    need = align_need(num_tokens, block_size, num_speculative_blocks, num_hit_blocks, num_held, allocated,
                      checkpoint, num_evictable_hits, deferred, num_pool_blocks)
    if action == NO_COPY or (deferred and num_hit_blocks > 0):
        return need
    return need + 1


@icontract.require(lambda action, source_table_refs: action in (PRIVATE_COPY, MOVED_ENTRY)
                   and source_table_refs >= (1 if action == MOVED_ENTRY else 0),
                   "a producer's own table holds its page", enabled=ENABLED)
@icontract.ensure(lambda result, action, source_table_refs, released: released or (
    result[0] == source_table_refs + 1 and result[1] == (2 if action == PRIVATE_COPY else 1)),
    "until the copy has run, each page holds one reference more than its tables", enabled=ENABLED)
@icontract.ensure(lambda result, released: released or min(result) >= 1,
                  "neither page can be reused before the copy has run", enabled=ENABLED)
@icontract.ensure(lambda result, action, source_table_refs, released: not released or result == (
    source_table_refs, 1 if copy_pages(action)[0] == COPY else 0), "then only the tables hold them", enabled=ENABLED)
@defines(KV_MAMBA_025)
def copy_ref_counts(action: int, source_table_refs: int, released: bool) -> tuple[int, int]:
    """``(the source page's references, the copy's)`` after an allocation that queued a copy:
    ``source_table_refs`` is how many tables hold the source page after the allocation (a
    consumer's shared page: the other requests'; a producer's page: its own and any sharers'),
    ``released`` whether the scheduler has released the copy's retention (the copy has run)."""
    copy_in_table = 1 if action == PRIVATE_COPY else 0
    if released:
        return (source_table_refs, copy_in_table)
    return (source_table_refs + 1, copy_in_table + 1)


# -- the runner's copies (KV-MAMBA-026) ---------------------------------------------------------
@icontract.require(lambda remembered, num_computed, block_size: remembered >= -1 and num_computed >= 0
                   and block_size > 0, enabled=ENABLED)
@icontract.ensure(lambda result, remembered: remembered < 0 or result == remembered,
                  "a running request: the entry the runner recorded", enabled=ENABLED)
@icontract.ensure(lambda result, remembered, num_computed: remembered >= 0 or (result == -1) == (num_computed == 0),
                  "no state to read only before any token is computed", enabled=ENABLED)
@icontract.ensure(lambda result, remembered, num_computed, block_size: remembered >= 0 or num_computed == 0
                  or result == running_index(num_computed, block_size), "a first step: the hit's last entry",
                  enabled=ENABLED)
@icontract.ensure(lambda result, remembered, num_computed, block_size: remembered >= 0
                  or shared_entry(num_computed, block_size) == -1 or result == shared_entry(num_computed, block_size),
                  "after a partial hit: the entry of the shared page, which holds the private copy", enabled=ENABLED)
@defines(KV_MAMBA_026)
def start_entry(remembered: int, num_computed: int, block_size: int) -> int:
    """The table entry a step reads the request's state from: ``remembered``, the running entry the
    runner recorded at the request's previous step (-1 at its first step since it was added or
    resumed), else entry ``(C - 1) // B`` for ``num_computed`` = C computed tokens; -1 (the empty
    state, no page) when nothing is computed."""
    if remembered >= 0:
        return remembered
    return running_index(num_computed, block_size) if num_computed else -1


def _copies_ok(num_pages: int, copies: tuple[tuple[int, int], ...]) -> bool:
    """One step's copies: pages in range, each copy page written once and none of them a source."""
    pages = [page for pair in copies for page in pair]
    written = [copy for _, copy in copies]
    return (all(len(pair) == 2 for pair in copies) and all(0 <= page < num_pages for page in pages)
            and len(set(written)) == len(written) and not set(written) & {source for source, _ in copies})


@icontract.require(lambda states, copies: _copies_ok(len(states), copies), enabled=ENABLED)
@icontract.ensure(lambda result, states: len(result) == len(states), enabled=ENABLED)
@icontract.ensure(lambda result, states, copies: all(result[copy] == states[source] for source, copy in copies),
                  "each copy page holds what its source held before the step", enabled=ENABLED)
@icontract.ensure(lambda result, states, copies: all(
    result[page] == states[page] for page in range(len(states)) if page not in {copy for _, copy in copies}),
    "every other page, the sources included, keeps what it held", enabled=ENABLED)
@defines(KV_MAMBA_026)
def states_after_copies(states: tuple[int, ...], copies: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """What the pages hold once the runner has made one step's ``copies`` ((source, copy) page
    indices into ``states``), before the step's forward reads or writes any of them."""
    after = list(states)
    for source, copy in copies:
        after[copy] = states[source]
    return tuple(after)
