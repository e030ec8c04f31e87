"""What an engine claims: the capability flags that gate the rules needing them.

A rule's ``needs`` (in :mod:`kvoracle.spec`) names these flags. An engine that does
not claim a flag is never judged on a rule needing it: the rule is reported "not
applicable", never "pass". The flags are shared by every suite; an adapter without a
``capabilities()`` method claims the defaults.
"""

from __future__ import annotations

import attrs

COMMON_PREFIX_MODES = ("zero", "cascade", "none")
#: How freed blocks return to the free queue: unhashed ones to the front (KV-POOL-006), or
#: every one to the back (KV-POOL-016).
FREE_ORDERS = ("unhashed_first", "append")
#: How a prefix tree that promises LRU eviction stamps recency (chapter prefix_tree): per page
#: (KV-TREE-008), per stored segment (KV-TREE-009: SGLang's radix nodes), or not at all ("none":
#: no eviction order is promised, and neither rule is judged).
TREE_RECENCIES = ("page", "segment", "none")

#: Rules that hold for one value of a mode-valued capability: rule id -> (capability, value), or
#: (capability, a tuple of the values it holds for). The rule of another mode is not applicable (its
#: refinement is judged instead).
MODE_RULES: dict[str, tuple[str, object]] = {
    "KV-LIFE-010": ("common_prefix", "zero"),
    "KV-LIFE-011": ("common_prefix", "cascade"),
    "KV-POOL-006": ("free_order", "unhashed_first"),
    "KV-POOL-016": ("free_order", "append"),
    "KV-HLC-008": ("mamba_free_lag", False),
    "KV-HLC-009": ("mamba_free_lag", True),
    "KV-TREE-008": ("tree_recency", "page"),
    "KV-TREE-009": ("tree_recency", "segment"),
    "KV-TREE-028": ("tree_recency", "page"),
    "KV-TREE-029": ("tree_recency", "segment"),
    # States sit at one page each: page and segment recency order them alike; "none" promises no order.
    "KV-TREE-030": ("tree_recency", ("page", "segment")),
}


def mode_rule(capability: str, value: object) -> str:
    """The rule that holds for ``capability == value`` (:data:`MODE_RULES`, read backwards)."""
    return next(rule_id for rule_id, mode in MODE_RULES.items() if mode == (capability, value))


@attrs.frozen
class Capabilities:
    """What an engine claims. Each flag gates the rules that need it."""

    #: Block ids, allocation order and free-queue order are exactly the spec's.
    exact_block_ids: bool = True
    #: ``observe()`` reports the free queue in eviction order.
    free_queue: bool = True
    #: ``observe()`` reports every block's reference count.
    ref_counts: bool = True
    #: ``observe()`` reports the cache map (key -> blocks, in caching order).
    cache_map: bool = True
    #: ``observe()`` reports each request's block hashes (opaque engine values).
    request_hashes: bool = True
    eagle: bool = True
    caching_off: bool = True
    lookahead: bool = True
    delay_cache: bool = True
    evict: bool = True
    reset: bool = True
    cache_salt: bool = True
    #: Several groups with block sizes that are multiples of the hash block size.
    hash_block_views: bool = False
    #: ``zero``: vLLM >= 0.x deprecation (KV-LIFE-010); ``cascade``: KV-LIFE-011.
    common_prefix: str = attrs.field(default="zero")
    #: ``unhashed_first``: freed unhashed blocks go to the front of the free queue (KV-POOL-006,
    #: vLLM 0.24 and later); ``append``: every freed block goes to the back (KV-POOL-016).
    free_order: str = attrs.field(default="unhashed_first")
    #: A Mamba group without prefix caching frees its skipped blocks num_speculative_blocks
    #: tokens late, as if its drafts were rejected (KV-HLC-009, vLLM 0.17 to 0.25), not at the
    #: computed tokens (KV-HLC-008).
    mamba_free_lag: bool = False
    #: ``observe()`` reports checks of a paged KV store's data (``data_checks``, KV-DATA).
    kv_data: bool = False
    #: ``configure()`` takes a :class:`~kvoracle.reference.HybridConfig` of several KV-cache groups
    #: (any attention kinds), not only one full-attention group; the manager suite generates both.
    kv_cache_groups: bool = False
    #: The hybrid lookup adapter reports the third result of its last lookup, the uncached common
    #: prefix tokens (``uncached_common_prefix_tokens()``).
    uncached_prefix_tokens: bool = False
    #: The hybrid lookup adapter looks each spec group up alone (``lookup_per_group()``).
    per_group_lookup: bool = False
    #: The manager adapter reports each group's skipped-token count for a computed-token count
    #: (``skipped_tokens(num_computed_tokens)``, vLLM's ``get_num_skipped_tokens``).
    skipped_tokens: bool = False
    #: The manager adapter takes Mamba groups with prefix caching on (vLLM's "align" mode,
    #: chapter 8), checkpoint settings included, and offers ``new_step()``, the scheduler's
    #: call at the start of each step (``KVCacheManager.new_step_starts``, KV-MAMBA-009).
    mamba_align: bool = False
    #: The manager adapter takes align-mode Mamba groups coarser than the hash block where they
    #: turn vLLM's fine-grained partial hits on (KV-MAMBA-019), and offers ``take_copies()``, the
    #: scheduler's ``take_kv_cache_block_copies`` with the held pages released (KV-MAMBA-025). A
    #: hybrid lookup adapter claiming it (with ``kv_cache_groups`` and ``mamba_align``: it looks
    #: such groups up) offers ``seed_partial_entry()``, a page keyed inside a Mamba block.
    mamba_partial_hits: bool = False
    #: The prefix-tree suite's eviction order: one of :data:`TREE_RECENCIES`.
    tree_recency: str = attrs.field(default="page")

    @common_prefix.validator
    def _check_mode(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in COMMON_PREFIX_MODES:
            raise ValueError(f"common_prefix must be one of {COMMON_PREFIX_MODES}, got {value!r}")

    @free_order.validator
    def _check_free_order(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {value!r}")

    @tree_recency.validator
    def _check_tree_recency(self, attribute: attrs.Attribute, value: str) -> None:
        if value not in TREE_RECENCIES:
            raise ValueError(f"tree_recency must be one of {TREE_RECENCIES}, got {value!r}")
