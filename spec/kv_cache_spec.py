"""Chapter 0b -- The KV-cache spec family.

A *KV-cache spec* says what one attention layer keeps per block: how many
tokens a block covers (``block_size``) and how many bytes one block of that
layer occupies (its *page*). Six kinds are in scope:

* **full attention** -- every token attends to every earlier token; with
  *MLA* (multi-head latent attention) a token stores one latent vector
  instead of a key and a value;
* **sliding window** -- a token attends to the ``sliding_window - 1`` tokens
  before it;
* **chunked local** -- a token attends to the earlier tokens of its own
  ``attention_chunk_size`` chunk;
* **Mamba** -- a fixed-size recurrent state instead of per-token KV;
* **cross attention** -- decoder tokens attend to the encoder's output;
* **sink full attention** -- full attention with extra sink tokens.

**Page sizes.** An attention page holds ``block_size`` tokens, each with a
key and a value of ``num_kv_heads * head_size`` elements; MLA stores the key
only. A Mamba page holds one copy of the layer's state tensors, whatever the
block size. A spec may carry a padded page size, which replaces the real one
and may not be smaller.

**Worst-case memory.** Before the pool is sized, each spec states how much one
request can hold at most: full attention a page per block of the longest
sequence; sliding window and chunked local only what the window (or chunk)
plus the tokens in flight need; Mamba a fixed handful of state pages; cross
attention a page per block of the longest encoder input.

**Merging.** Layers with the same spec share a KV-cache group, whose spec is
the *merge* of the layer specs. Full-attention layers merge when their
attention fields agree; their recorded window or chunk sizes (layers the
hybrid allocator treats as full attention) must agree too, and a group never
records both. MLA and non-MLA layers never merge. Every other kind merges
only identical specs. A merge that is impossible is an error, never a
silently chosen value.

**Uniform type.** Layers whose specs differ in page size but always need the
same number of token slots (same kind, same block size, same window) can
still share one group as a ``UniformTypeKVCacheSpecs``; its page is the sum of
the layers' pages.

**KV-cache configuration.** A ``KVCacheConfig`` is the number of blocks of
the shared pool, the groups (each a list of layer names and the merged spec)
and the tensors backing the pool. kvoracle refuses a configuration that
could not describe a real pool, with a :class:`~kvoracle.spec.ConfigError`
naming the rule and the parameter.

Where the older documentation (seed 003) and vLLM 0.33.0 differ, the rules
state 0.33.0's behaviour and say what the older one was.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .lifecycle import cdiv
from .registry import INPUT_VALIDATION, LAYER_SPEC_GROUPING, LAYER_SPEC_SIZES, defines, rule

CHAPTER = "kv_cache_spec"
IFACE = "vllm/v1/kv_cache_interface.py"

KV_SPEC_001 = rule(
    "KV-SPEC-001",
    "An attention page holds a key and a value per token; MLA only one",
    """The page of an attention spec (full, sliding window, chunked local, cross, sink)
    is block_size * num_kv_heads * (head_size + head_size_v) * dtype_bytes bytes, where
    head_size_v equals head_size (a key and a value per token and head). MLA stores a
    single latent vector per token: head_size_v is 0, so its page is half the size.""",
    source=f"{IFACE} AttentionSpec.unpadded_page_size_bytes, state_content_size_bytes; "
    "MLAAttentionSpec.head_size_v",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_002 = rule(
    "KV-SPEC-002",
    "A padded page replaces the real page and is never smaller",
    """A spec may carry page_size_padded. When set it is the page size, and it must be at
    least the real (unpadded) page size; a smaller padding is refused.""",
    source=f"{IFACE} AttentionSpec.page_size_bytes, MambaSpec.page_size_bytes "
    "(assert page_size_padded >= page size)",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_003 = rule(
    "KV-SPEC-003",
    "A Mamba page holds the layer's state tensors, whatever the block size",
    """The page of a Mamba spec is the sum, over its state tensors, of the product of the
    tensor's shape times its element size in bytes. It does not depend on block_size.""",
    source=f"{IFACE} MambaSpec.page_size_bytes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_004 = rule(
    "KV-SPEC-004",
    "Full attention reserves a page per block of the longest sequence",
    """A full-attention (or sink full-attention, or MLA) spec needs at most
    cdiv(max_model_len, block_size) pages per request. With decode context parallelism
    over dcp ranks a sharded spec keeps cdiv(max_model_len, dcp) tokens per rank.
    Difference from seed 003: the seed divided by dcp * pcp (prefill context parallelism
    too) and did so for every spec; vLLM 0.33.0 divides by dcp only, and only for specs
    whose tokens DCP shards (dcp_sharded).""",
    source=f"{IFACE} FullAttentionSpec.max_memory_usage_bytes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_005 = rule(
    "KV-SPEC-005",
    "Sliding window reserves the window plus the tokens in flight, plus one block",
    """A sliding-window spec needs at most cdiv(n, block_size) + 1 pages per request, where
    n = min(sliding_window - 1 + extra_retained_tokens + max_in_flight_tokens,
    max_model_len). The extra page is there because the window need not start on a block
    boundary. max_in_flight_tokens is max_concurrent_batches * max_num_batched_tokens
    (one batch unless scheduling is asynchronous or pipelined).""",
    source=f"{IFACE} SlidingWindowSpec.max_admission_blocks_per_request; "
    "vllm/config/vllm.py VllmConfig.max_in_flight_tokens",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_006 = rule(
    "KV-SPEC-006",
    "Chunked local attention reserves one chunk plus the tokens in flight",
    """A chunked-local spec needs at most cdiv(min(attention_chunk_size +
    max_in_flight_tokens, max_model_len), block_size) pages per request; unlike sliding
    window there is no extra page, since a chunk starts on a chunk boundary.""",
    source=f"{IFACE} ChunkedLocalAttentionSpec.max_admission_blocks_per_request",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_007 = rule(
    "KV-SPEC-007",
    "Mamba reserves a fixed number of state pages",
    """A Mamba spec needs 2 + num_speculative_blocks + num_prefill_checkpoint_blocks
    pages per request in "align" cache mode (prefix caching of states) and
    1 + num_speculative_blocks pages otherwise. vLLM 0.33.0 reads the mode from the cache
    configuration; kvoracle reads it from the spec, which must agree with it.""",
    source=f"{IFACE} MambaSpec.max_memory_usage_bytes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_008 = rule(
    "KV-SPEC-008",
    "Cross attention reserves a page per block of the longest encoder input",
    """A cross-attention spec needs cdiv(max_num_encoder_input_tokens, block_size) pages
    per request, independent of max_model_len.""",
    source=f"{IFACE} CrossAttentionSpec.max_memory_usage_bytes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_009 = rule(
    "KV-SPEC-009",
    "Worst-case memory is pages times page size; a uniform-type group sums its pages",
    """A spec's max_memory_usage_bytes is its worst-case number of pages times its page
    size. A UniformTypeKVCacheSpecs' page is the sum of its layers' pages, and it reserves
    the largest of its layers' page counts (each cdiv(layer bytes, layer page)) times that
    summed page.""",
    source=f"{IFACE} UniformTypeKVCacheSpecs.page_size_bytes, max_memory_usage_bytes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_SIZES,
)
KV_SPEC_010 = rule(
    "KV-SPEC-010",
    "Recorded window and chunk sizes merge only when equal",
    """When full-attention specs are merged, the sliding_window values the layers set
    (ignoring layers that set none) must all be equal, and the merged spec records that
    value, or none when no layer set one; the same holds for attention_chunk_size.
    Different values are an error.""",
    source=f"{IFACE} FullAttentionSpec.merge_window_sizes",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_011 = rule(
    "KV-SPEC-011",
    "A merged full-attention spec never records both a window and a chunk size",
    """A merge whose result would record both a sliding_window and an attention_chunk_size
    (a model with both sliding-window and chunked-local layers regarded as full attention)
    is an error.""",
    source=f"{IFACE} FullAttentionSpec.merge (final assert)",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_012 = rule(
    "KV-SPEC-012",
    "MLA and non-MLA layers never merge",
    """A full-attention merge involving an MLA spec succeeds only when every spec is MLA;
    mixing MLA and non-MLA specs is an error. An all-MLA merge keeps the common attention
    fields and records no window or chunk size (vLLM 0.33.0's MLAAttentionSpec.merge does
    not carry them over).""",
    source=f"{IFACE} FullAttentionSpec.merge (assert no MLAAttentionSpec), "
    "MLAAttentionSpec.merge (assert all MLAAttentionSpec)",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_013 = rule(
    "KV-SPEC-013",
    "Full-attention specs merge when their attention fields agree",
    """The specs of a full-attention group are all full-attention specs (full or sink full)
    with equal block_size, num_kv_heads, head_size, dtype_bytes and page_size_padded;
    otherwise the merge is an error. The merged spec has the class of the first spec (the
    merge is called on it) and takes the first spec's fields; a sink spec's sink_len is
    taken from the first spec and not compared.""",
    source=f"{IFACE} FullAttentionSpec.merge, SinkFullAttentionSpec.merge; "
    "vllm/v1/core/kv_cache_planning.py create_kv_cache_group_specs (layer_specs[0].merge)",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_014 = rule(
    "KV-SPEC-014",
    "Other kinds merge only identical specs",
    """Sliding-window, chunked-local, Mamba and cross-attention specs merge only when every
    spec equals the first; the merge is a copy of it. Anything else is an error. Difference
    from seed 003: the seed checked this with an assert statement, which python -O strips;
    vLLM 0.33.0 raises AssertionError explicitly.""",
    source=f"{IFACE} KVCacheSpec.merge",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_015 = rule(
    "KV-SPEC-015",
    "Uniform type: same base kind, same block size, same window",
    """A non-empty set of layer specs is of uniform type when all have the same block_size
    and the same base kind -- full, sink full and MLA specs all count as full attention --
    and, for sliding window, the same sliding_window, for chunked local, the same
    attention_chunk_size. A uniform-type set can form one group even when page sizes
    differ.""",
    source=f"{IFACE} UniformTypeKVCacheSpecs.is_uniform_type, *.is_uniform_with_collection; "
    "vllm/v1/core/single_type_kv_cache_manager.py register_all_kvcache_specs",
    chapter=CHAPTER,
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_016 = rule(
    "KV-SPEC-016",
    "Mamba layers are uniform only with equal speculative, checkpoint and page sizes",
    """Mamba specs are of uniform type only when they agree on num_speculative_blocks,
    num_prefill_checkpoint_blocks and page size (vLLM 0.33.0 also compares the checkpoint
    alignment and TP replication, which kvoracle does not model). Seed 003 compared
    num_speculative_blocks only, so Mamba layers with different state sizes were uniform.""",
    source=f"{IFACE} MambaSpec.is_uniform_with_collection",
    chapter=CHAPTER,
    kind="divergence",
    spec_only=LAYER_SPEC_GROUPING,
)
KV_SPEC_017 = rule(
    "KV-SPEC-017",
    "Spec fields are positive integers",
    """num_kv_heads, head_size, dtype_bytes, sliding_window, attention_chunk_size, sink_len,
    every Mamba state dimension and element size are positive ints; extra_retained_tokens,
    num_speculative_blocks and num_prefill_checkpoint_blocks are non-negative ints; a
    Mamba cache mode is "align" or "none". (block_size is KV-CFG-002.)""",
    source=f"{IFACE} AttentionSpec, SlidingWindowSpec, MambaSpec; vllm/config/cache.py "
    "MambaCacheMode",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_SPEC_018 = rule(
    "KV-SPEC-018",
    "A KV-cache configuration has at least one block",
    """KVCacheConfig.num_blocks is a positive int (vLLM's block pool asserts it). A manager
    needs more, since block 0 is the null block (KV-CFG-001).""",
    source="vllm/v1/core/block_pool.py BlockPool.__init__ (assert num_gpu_blocks > 0)",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_SPEC_019 = rule(
    "KV-SPEC-019",
    "Every group names layers, and each layer is in one group",
    """Every KV-cache group names at least one layer, and no layer name occurs twice, in one
    group or across groups: the groups partition the model's layers. A configuration with
    no group at all (an attention-free model) is valid.""",
    source="vllm/v1/core/kv_cache_planning.py create_kv_cache_group_specs (layer_specs[0]), "
    "_check_exact_partition",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_SPEC_020 = rule(
    "KV-SPEC-020",
    "KV-cache tensors have a size and back grouped layers only",
    """Every KVCacheTensor has a positive size in bytes and names at least one layer, and
    every layer it names belongs to a KV-cache group.""",
    source=f"{IFACE} KVCacheTensor; vllm/v1/core/kv_cache_planning.py "
    "get_kv_cache_config_from_groups",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)

#: The ``kind`` values of the spec family (see ``kvoracle.reference.kv_cache_spec``).
SPEC_KINDS = ("full", "sliding_window", "chunked_local", "mamba", "cross_attention", "sink_full")
#: Names :func:`first_invalid_kv_cache_config` may return.
KV_CACHE_CONFIG_PARAMETERS = ("", "num_blocks", "kv_cache_groups", "kv_cache_tensors")
#: What :func:`full_attention_merge_failure` may return: "" or the rule a merge breaks.
MERGE_FAILURES = ("", KV_SPEC_013, KV_SPEC_012, KV_SPEC_010, KV_SPEC_011)


# --------------------------------------------------------------------------- page sizes


@icontract.require(lambda block_size, num_kv_heads, head_size, dtype_bytes:
                   block_size >= 1 and num_kv_heads >= 1 and head_size >= 1 and dtype_bytes >= 1,
                   enabled=ENABLED)
@icontract.ensure(lambda result, block_size: result >= block_size and result % block_size == 0,
                  enabled=ENABLED)
@icontract.ensure(lambda result, use_mla: use_mla or result % 2 == 0, enabled=ENABLED)
@defines(KV_SPEC_001)
def attention_page_size_bytes(block_size: int, num_kv_heads: int, head_size: int, dtype_bytes: int,
                              use_mla: bool) -> int:
    """Bytes of one unpadded attention page: K and V per token and head, or MLA's latent only."""
    head_size_v = 0 if use_mla else head_size
    return block_size * num_kv_heads * (head_size + head_size_v) * dtype_bytes


@icontract.require(lambda real_page_size: real_page_size >= 1, enabled=ENABLED)
@icontract.require(lambda real_page_size, page_size_padded:
                   page_size_padded == 0 or page_size_padded >= real_page_size, enabled=ENABLED)
@icontract.ensure(lambda result, real_page_size, page_size_padded:
                  result == (page_size_padded if page_size_padded else real_page_size), enabled=ENABLED)
@icontract.ensure(lambda result, real_page_size: result >= real_page_size, enabled=ENABLED)
@defines(KV_SPEC_002)
def padded_page_size_bytes(real_page_size: int, page_size_padded: int) -> int:
    """The page size of a spec: the padding when set (``page_size_padded > 0``), else the real size."""
    return page_size_padded if page_size_padded > 0 else real_page_size


@icontract.require(lambda shapes, dtype_bytes: 1 <= len(shapes) == len(dtype_bytes), enabled=ENABLED)
@icontract.require(lambda shapes: all(dim >= 1 for shape in shapes for dim in shape), enabled=ENABLED)
@icontract.require(lambda dtype_bytes: all(size >= 1 for size in dtype_bytes), enabled=ENABLED)
@icontract.ensure(lambda result, dtype_bytes: result >= sum(dtype_bytes), enabled=ENABLED)
@defines(KV_SPEC_003)
def mamba_page_size_bytes(shapes: tuple[tuple[int, ...], ...], dtype_bytes: tuple[int, ...]) -> int:
    """Bytes of one Mamba state page: each state tensor's element count times its element size."""
    total = 0
    for shape, size in zip(shapes, dtype_bytes):
        elements = 1
        for dim in shape:
            elements *= dim
        total += elements * size
    return total


# --------------------------------------------------------------------------- worst-case pages


@icontract.require(lambda max_model_len, block_size, dcp_world_size:
                   max_model_len >= 1 and block_size >= 1 and dcp_world_size >= 1, enabled=ENABLED)
@icontract.ensure(lambda result: result >= 1, enabled=ENABLED)
@icontract.ensure(lambda result, max_model_len, block_size, dcp_world_size:
                  result * block_size * dcp_world_size >= max_model_len, enabled=ENABLED)
@icontract.ensure(lambda result, max_model_len, block_size, dcp_world_size:
                  dcp_world_size > 1 or (result - 1) * block_size < max_model_len, enabled=ENABLED)
@defines(KV_SPEC_004)
def full_attention_max_pages(max_model_len: int, block_size: int, dcp_world_size: int) -> int:
    """Pages one request can hold in a full-attention group (per DCP rank when sharded)."""
    tokens = cdiv(max_model_len, dcp_world_size) if dcp_world_size > 1 else max_model_len
    return cdiv(tokens, block_size)


@icontract.require(lambda sliding_window, max_model_len, block_size:
                   sliding_window >= 1 and max_model_len >= 1 and block_size >= 1, enabled=ENABLED)
@icontract.require(lambda extra_retained_tokens, max_in_flight_tokens:
                   extra_retained_tokens >= 0 and max_in_flight_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_model_len, block_size: 1 <= result <= cdiv(max_model_len, block_size) + 1,
                  enabled=ENABLED)
@icontract.ensure(lambda result, sliding_window, extra_retained_tokens, max_in_flight_tokens, max_model_len,
                  block_size: (result - 1) * block_size
                  >= min(sliding_window - 1 + extra_retained_tokens + max_in_flight_tokens, max_model_len),
                  enabled=ENABLED)
@defines(KV_SPEC_005)
def sliding_window_max_pages(sliding_window: int, extra_retained_tokens: int, max_in_flight_tokens: int,
                             max_model_len: int, block_size: int) -> int:
    """Pages one request can hold in a sliding-window group: window, in-flight tokens, one spare."""
    tokens = min(sliding_window - 1 + extra_retained_tokens + max_in_flight_tokens, max_model_len)
    return cdiv(tokens, block_size) + 1


@icontract.require(lambda attention_chunk_size, max_model_len, block_size:
                   attention_chunk_size >= 1 and max_model_len >= 1 and block_size >= 1, enabled=ENABLED)
@icontract.require(lambda max_in_flight_tokens: max_in_flight_tokens >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_model_len, block_size: 1 <= result <= cdiv(max_model_len, block_size),
                  enabled=ENABLED)
@icontract.ensure(lambda result, attention_chunk_size, max_in_flight_tokens, max_model_len, block_size:
                  result * block_size >= min(attention_chunk_size + max_in_flight_tokens, max_model_len),
                  enabled=ENABLED)
@defines(KV_SPEC_006)
def chunked_local_max_pages(attention_chunk_size: int, max_in_flight_tokens: int, max_model_len: int,
                            block_size: int) -> int:
    """Pages one request can hold in a chunked-local group: one chunk plus the in-flight tokens."""
    return cdiv(min(attention_chunk_size + max_in_flight_tokens, max_model_len), block_size)


@icontract.require(lambda num_speculative_blocks, num_prefill_checkpoint_blocks:
                   num_speculative_blocks >= 0 and num_prefill_checkpoint_blocks >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, num_speculative_blocks: result >= 1 + num_speculative_blocks, enabled=ENABLED)
@icontract.ensure(lambda result, align_mode, num_speculative_blocks:
                  align_mode or result == 1 + num_speculative_blocks, enabled=ENABLED)
@defines(KV_SPEC_007)
def mamba_max_pages(align_mode: bool, num_speculative_blocks: int, num_prefill_checkpoint_blocks: int) -> int:
    """State pages one request can hold in a Mamba group."""
    if align_mode:
        return 2 + num_speculative_blocks + num_prefill_checkpoint_blocks
    return 1 + num_speculative_blocks


@icontract.require(lambda max_num_encoder_input_tokens, block_size:
                   max_num_encoder_input_tokens >= 0 and block_size >= 1, enabled=ENABLED)
@icontract.ensure(lambda result, max_num_encoder_input_tokens, block_size:
                  (result - 1) * block_size < max_num_encoder_input_tokens <= result * block_size
                  or result == max_num_encoder_input_tokens == 0, enabled=ENABLED)
@defines(KV_SPEC_008)
def cross_attention_max_pages(max_num_encoder_input_tokens: int, block_size: int) -> int:
    """Pages one request can hold in a cross-attention group: the longest encoder input."""
    return cdiv(max_num_encoder_input_tokens, block_size)


@icontract.require(lambda num_pages, page_size: num_pages >= 0 and page_size >= 1, enabled=ENABLED)
@icontract.ensure(lambda result, num_pages: (result == 0) == (num_pages == 0), enabled=ENABLED)
@defines(KV_SPEC_009)
def max_memory_usage_bytes(num_pages: int, page_size: int) -> int:
    """A spec's worst-case bytes per request: its worst-case pages times its page size."""
    return num_pages * page_size


@icontract.require(lambda page_sizes: len(page_sizes) >= 1 and all(p >= 1 for p in page_sizes), enabled=ENABLED)
@icontract.ensure(lambda result, page_sizes: result >= max(page_sizes), enabled=ENABLED)
@defines(KV_SPEC_009)
def uniform_page_size_bytes(page_sizes: tuple[int, ...]) -> int:
    """The page of a uniform-type group: one page of every layer."""
    return sum(page_sizes)


@icontract.require(lambda layer_max_bytes, page_sizes: 1 <= len(layer_max_bytes) == len(page_sizes),
                   enabled=ENABLED)
@icontract.require(lambda layer_max_bytes, page_sizes:
                   all(b >= 0 for b in layer_max_bytes) and all(p >= 1 for p in page_sizes), enabled=ENABLED)
@icontract.ensure(lambda result, layer_max_bytes, page_sizes: all(result >= b for b in layer_max_bytes),
                  enabled=ENABLED)
@defines(KV_SPEC_009)
def uniform_max_memory_bytes(layer_max_bytes: tuple[int, ...], page_sizes: tuple[int, ...]) -> int:
    """Worst-case bytes of a uniform-type group: the most pages any layer needs, of the summed page."""
    pages = max(cdiv(b, p) for b, p in zip(layer_max_bytes, page_sizes))
    return pages * sum(page_sizes)


# --------------------------------------------------------------------------- merging


@icontract.require(lambda sizes: all(s >= 0 for s in sizes), enabled=ENABLED)
@icontract.ensure(lambda result, sizes: (result in (-1, 0) or result in sizes)
                  and (result == 0) == all(s == 0 for s in sizes), enabled=ENABLED)
@defines(KV_SPEC_010)
def merge_window_sizes(sizes: tuple[int, ...]) -> int:
    """The window (or chunk) size a merged spec records; 0 stands for "none".

    Returns 0 when no layer sets one, the common value when all that set one agree,
    and -1 when two layers set different values (the merge is an error).
    """
    distinct = {s for s in sizes if s != 0}
    if not distinct:
        return 0
    if len(distinct) == 1:
        return distinct.pop()
    return -1


@icontract.require(lambda use_mla: len(use_mla) >= 1, enabled=ENABLED)
@icontract.require(lambda use_mla, windows, chunks: len(use_mla) == len(windows) == len(chunks), enabled=ENABLED)
@icontract.require(lambda windows, chunks: all(w >= 0 for w in windows) and all(c >= 0 for c in chunks),
                   enabled=ENABLED)
@icontract.ensure(lambda result, all_full_attention, use_mla, same_attention_fields:
                  result in MERGE_FAILURES
                  and (result != KV_SPEC_012 or len(set(use_mla)) == 2)
                  and (result != "" or (all_full_attention and same_attention_fields)), enabled=ENABLED)
@defines(KV_SPEC_010, KV_SPEC_011, KV_SPEC_012, KV_SPEC_013)
def full_attention_merge_failure(all_full_attention: bool, use_mla: tuple[bool, ...], same_attention_fields: bool,
                                 windows: tuple[int, ...], chunks: tuple[int, ...]) -> str:
    """The rule a full-attention merge breaks, or ``""`` when the specs merge.

    One entry per spec: whether it is MLA, its recorded sliding window and chunk size (0
    for none). The checks run in vLLM 0.33.0's order: every spec full attention, MLA not
    mixed, windows, chunk sizes, the attention fields, and not both window and chunk. An
    all-MLA merge ignores windows and chunk sizes (it records neither).
    """
    if not all_full_attention:
        return KV_SPEC_013
    if any(use_mla):
        if not all(use_mla):
            return KV_SPEC_012
        return "" if same_attention_fields else KV_SPEC_013
    window = merge_window_sizes(windows)
    chunk = merge_window_sizes(chunks)
    if window < 0 or chunk < 0:
        return KV_SPEC_010
    if not same_attention_fields:
        return KV_SPEC_013
    if window > 0 and chunk > 0:
        return KV_SPEC_011
    return ""


# --------------------------------------------------------------------------- uniform type


@icontract.require(lambda kind: kind in SPEC_KINDS, enabled=ENABLED)
@icontract.ensure(lambda result: result in SPEC_KINDS and result != "sink_full", enabled=ENABLED)
@defines(KV_SPEC_015)
def uniform_base_kind(kind: str) -> str:
    """The kind a spec counts as when deciding uniformity: sink full attention counts as full."""
    return "full" if kind == "sink_full" else kind


@icontract.require(lambda base_kinds: len(base_kinds) >= 1, enabled=ENABLED)
@icontract.require(lambda base_kinds, block_sizes, type_keys: len(base_kinds) == len(block_sizes) == len(type_keys),
                   enabled=ENABLED)
@icontract.ensure(lambda result, base_kinds, block_sizes:
                  (not result or len(set(block_sizes)) == 1) and (result or len(base_kinds) > 1), enabled=ENABLED)
@defines(KV_SPEC_015, KV_SPEC_016)
def is_uniform_type(base_kinds: tuple[str, ...], block_sizes: tuple[int, ...],
                    type_keys: tuple[tuple[int, ...], ...]) -> bool:
    """Whether layers can share one uniform-type group.

    One entry per layer: its base kind (:func:`uniform_base_kind`), block size and the
    kind's key -- ``(sliding_window,)``, ``(attention_chunk_size,)``, ``(num_speculative_blocks,
    num_prefill_checkpoint_blocks, page_size)`` for Mamba, ``()`` for the rest.
    """
    return all(b == block_sizes[0] for b in block_sizes) and all(
        k == base_kinds[0] and t == type_keys[0] for k, t in zip(base_kinds, type_keys)
    )


# --------------------------------------------------------------------------- configuration


@icontract.require(lambda tensor_sizes, tensor_layer_names: len(tensor_sizes) == len(tensor_layer_names),
                   enabled=ENABLED)
@icontract.ensure(lambda result, num_blocks:
                  result in KV_CACHE_CONFIG_PARAMETERS and (result == "num_blocks") == (num_blocks < 1),
                  enabled=ENABLED)
@defines(KV_SPEC_018, KV_SPEC_019, KV_SPEC_020)
def first_invalid_kv_cache_config(num_blocks: int, group_layer_names: tuple[tuple[str, ...], ...],
                                  tensor_sizes: tuple[int, ...],
                                  tensor_layer_names: tuple[tuple[str, ...], ...]) -> str:
    """The first impossible part of a KV-cache configuration, or ``""`` when it is valid."""
    if num_blocks < 1:
        return "num_blocks"
    seen: set[str] = set()
    for names in group_layer_names:
        if not names:
            return "kv_cache_groups"
        for name in names:
            if name in seen:
                return "kv_cache_groups"
            seen.add(name)
    for size, names in zip(tensor_sizes, tensor_layer_names):
        if size < 1 or not names or any(name not in seen for name in names):
            return "kv_cache_tensors"
    return ""
