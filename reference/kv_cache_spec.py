"""The KV-cache spec family (spec chapter ``kv_cache_spec``).

A *KV-cache spec* describes one kind of attention layer's cache: its block
size (tokens per block) and what a block holds. Layers with equal specs share
one KV-cache *group*; a model with several kinds of layers (a *hybrid* model)
has several groups, each managed by the single-type manager of its kind.

These are frozen values: equal specs compare equal, which is how the hybrid
coordinator batches groups into spec groups (KV-HYB-002).
"""

from __future__ import annotations

import attrs


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    from kvoracle.spec.config import ConfigError

    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError("KV-CFG-002", attribute.name,
                          f"{type(instance).__name__}.{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class KVCacheSpec:
    """Common fields: tokens per block and the size of one token's KV per layer."""

    block_size: int = attrs.field(validator=_positive)
    num_kv_heads: int = attrs.field(default=1, kw_only=True, validator=_positive)
    head_size: int = attrs.field(default=1, kw_only=True, validator=_positive)
    dtype_bytes: int = attrs.field(default=2, kw_only=True, validator=_positive)

    #: Short name of the attention type, used in reports and adapters.
    kind: str = attrs.field(default="abstract", init=False)


@attrs.frozen
class FullAttentionSpec(KVCacheSpec):
    """Every token attends to every earlier token."""

    kind: str = attrs.field(default="full", init=False)


@attrs.frozen
class SlidingWindowSpec(KVCacheSpec):
    """A token attends to itself and the ``sliding_window - 1`` tokens before it."""

    sliding_window: int = attrs.field(kw_only=True, validator=_positive)
    kind: str = attrs.field(default="sliding_window", init=False)


@attrs.frozen
class ChunkedLocalAttentionSpec(KVCacheSpec):
    """A token attends to the earlier tokens of its own ``attention_chunk_size`` chunk."""

    attention_chunk_size: int = attrs.field(kw_only=True, validator=_positive)
    kind: str = attrs.field(default="chunked_local", init=False)


@attrs.frozen
class MambaSpec(KVCacheSpec):
    """A recurrent state per request; with prefix caching ("align" mode) one state
    snapshot per ``block_size`` tokens can be cached."""

    kind: str = attrs.field(default="mamba", init=False)


@attrs.frozen
class CrossAttentionSpec(KVCacheSpec):
    """Decoder tokens attend to the encoder's tokens; never prefix-cached."""

    kind: str = attrs.field(default="cross_attention", init=False)


@attrs.frozen
class SinkFullAttentionSpec(KVCacheSpec):
    """Full attention with ``sink_len`` extra sink tokens held in dedicated blocks."""

    sink_len: int = attrs.field(kw_only=True, validator=_positive)
    kind: str = attrs.field(default="sink_full", init=False)


#: The kinds whose lookups scan left to right from block 0 (KV-HYB-003 sorts them first).
FULL_ATTENTION_KINDS = ("full", "sink_full")
