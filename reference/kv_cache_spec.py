"""The KV-cache spec family (spec chapter ``kv_cache_spec``).

A *KV-cache spec* describes one kind of attention layer's cache: its block
size (tokens per block) and what a block holds. Layers with equal specs share
one KV-cache *group*; a model with several kinds of layers (a *hybrid* model)
has several groups, each managed by the single-type manager of its kind.

These are frozen values: equal specs compare equal, which is how the hybrid
coordinator batches groups into spec groups (KV-HYB-002).

Page sizes (KV-SPEC-001..003), worst-case memory (KV-SPEC-004..009), merging
(KV-SPEC-010..014) and uniform type (KV-SPEC-015, 016) are computed by the pure
functions of :mod:`kvoracle.spec.kv_cache_spec`; the classes here only gather
their fields and call them. Impossible values raise
:class:`kvoracle.spec.ConfigError` naming the rule and the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import icontract

from kvoracle.spec import kv_cache_spec as spec
from kvoracle.spec.config import ConfigError

from .contracts import ENABLED

_FIELD_RULES = {"block_size": "KV-CFG-002"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not _is_int(value) or value <= 0:
        raise ConfigError(_FIELD_RULES.get(attribute.name, spec.KV_SPEC_017), attribute.name,
                          f"{type(instance).__name__}.{attribute.name} must be a positive int, got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ConfigError(spec.KV_SPEC_017, attribute.name,
                          f"{type(instance).__name__}.{attribute.name} must be a non-negative int, got {value!r}")


def _optional_positive(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None:
        _positive(instance, attribute, value)


@attrs.frozen(kw_only=True)
class MemoryLimits:
    """The scheduler limits worst-case memory depends on (vLLM reads them from its VllmConfig).

    ``max_in_flight_tokens`` is ``max_concurrent_batches * max_num_batched_tokens``
    (KV-SPEC-005).
    """

    max_model_len: int = attrs.field(validator=_positive)
    max_num_batched_tokens: int = attrs.field(default=0, validator=_non_negative)
    max_concurrent_batches: int = attrs.field(default=1, validator=_positive)
    max_num_encoder_input_tokens: int = attrs.field(default=0, validator=_non_negative)
    dcp_world_size: int = attrs.field(default=1, validator=_positive)

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_concurrent_batches * self.max_num_batched_tokens


@attrs.frozen
class KVCacheSpec:
    """Common fields: tokens per block and the size of one token's KV per layer."""

    block_size: int = attrs.field(validator=_positive)
    num_kv_heads: int = attrs.field(default=1, kw_only=True, validator=_positive)
    head_size: int = attrs.field(default=1, kw_only=True, validator=_positive)
    dtype_bytes: int = attrs.field(default=2, kw_only=True, validator=_positive)
    #: The padded page size in bytes, or None for the real page size (KV-SPEC-002).
    page_size_padded: int | None = attrs.field(default=None, kw_only=True, validator=_optional_positive)

    #: Short name of the attention type, used in reports and adapters.
    kind: str = attrs.field(default="abstract", init=False)

    def __attrs_post_init__(self) -> None:
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes():
            raise ConfigError(spec.KV_SPEC_002, "page_size_padded",
                              f"must be >= the real page size {self.real_page_size_bytes()}, "
                              f"got {self.page_size_padded}")

    # -- page size ---------------------------------------------------------------------
    def real_page_size_bytes(self) -> int:
        """The unpadded page size: K and V of ``block_size`` tokens (KV-SPEC-001)."""
        return spec.attention_page_size_bytes(self.block_size, self.num_kv_heads, self.head_size,
                                              self.dtype_bytes, self.use_mla)

    @icontract.ensure(lambda self, result: result >= self.real_page_size_bytes(),
                      "KV-SPEC-002: the page is never smaller than the real page", enabled=ENABLED)
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer (KV-SPEC-001..003)."""
        return spec.padded_page_size_bytes(self.real_page_size_bytes(), self.page_size_padded or 0)

    @property
    def use_mla(self) -> bool:
        return False

    # -- worst-case memory ---------------------------------------------------------------
    def max_num_pages(self, limits: MemoryLimits) -> int:
        """The most pages one request can hold in a group of this spec (KV-SPEC-004..008)."""
        raise NotImplementedError(f"{type(self).__name__} has no worst-case memory")

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int = 0, *,
                               max_concurrent_batches: int = 1, max_num_encoder_input_tokens: int = 0,
                               dcp_world_size: int = 1) -> int:
        """The most bytes one request can hold in a group of this spec (KV-SPEC-009)."""
        limits = MemoryLimits(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                              max_concurrent_batches=max_concurrent_batches,
                              max_num_encoder_input_tokens=max_num_encoder_input_tokens,
                              dcp_world_size=dcp_world_size)
        return spec.max_memory_usage_bytes(self.max_num_pages(limits), self.page_size_bytes())

    # -- merging and uniformity -----------------------------------------------------------
    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """The spec of a group of layers with these specs: only identical specs merge (KV-SPEC-014)."""
        specs = _non_empty(specs)
        if any(other != specs[0] for other in specs[1:]):
            raise ConfigError(spec.KV_SPEC_014, "specs",
                              f"all layers of a {cls.__name__} group must have the same spec")
        return specs[0]

    def uniform_type_key(self) -> tuple[int, ...]:
        """What must agree besides kind and block size for uniform type (KV-SPEC-015, 016)."""
        return ()


def _non_empty(specs: Sequence[KVCacheSpec]) -> list[KVCacheSpec]:
    specs = list(specs)
    if not specs or not all(isinstance(s, KVCacheSpec) for s in specs):
        raise ConfigError(spec.KV_SPEC_019, "specs", f"need one or more KVCacheSpec values, got {specs!r}")
    return specs


@attrs.frozen
class _FullAttentionFamily(KVCacheSpec):
    """Full attention and its variants: the window/chunk a hybrid-disabled model records, MLA."""

    #: Multi-head latent attention: one latent vector per token instead of K and V (KV-SPEC-001).
    use_mla: bool = attrs.field(default=False, kw_only=True)  # type: ignore[assignment]
    #: Recorded sliding window of layers regarded as full attention (None: none).
    sliding_window: int | None = attrs.field(default=None, kw_only=True, validator=_optional_positive)
    #: Recorded chunk size of layers regarded as full attention (None: none).
    attention_chunk_size: int | None = attrs.field(default=None, kw_only=True, validator=_optional_positive)

    def max_num_pages(self, limits: MemoryLimits) -> int:
        return spec.full_attention_max_pages(limits.max_model_len, self.block_size, limits.dcp_world_size)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Merge full-attention specs (KV-SPEC-010..013); the result is a ``cls``."""
        specs = _non_empty(specs)
        first = specs[0]
        family = all(isinstance(s, _FullAttentionFamily) for s in specs)
        fields = [(s.block_size, s.num_kv_heads, s.head_size, s.dtype_bytes, s.page_size_padded) for s in specs]
        windows = tuple(getattr(s, "sliding_window", None) or 0 for s in specs)
        chunks = tuple(getattr(s, "attention_chunk_size", None) or 0 for s in specs)
        failure = spec.full_attention_merge_failure(
            family, tuple(bool(getattr(s, "use_mla", False)) for s in specs),
            all(f == fields[0] for f in fields), windows, chunks)
        if failure:
            raise ConfigError(failure, "specs", _MERGE_MESSAGES[failure])
        changes: dict[str, Any] = {}
        if not first.use_mla:  # an all-MLA merge records no window or chunk (KV-SPEC-012)
            changes = {"sliding_window": spec.merge_window_sizes(windows) or None,
                       "attention_chunk_size": spec.merge_window_sizes(chunks) or None}
        else:
            changes = {"sliding_window": None, "attention_chunk_size": None}
        values = {a.name: getattr(first, a.name) for a in attrs.fields(type(first)) if a.init}
        values.update(changes)
        if cls is not type(first):
            values = {k: v for k, v in values.items() if k in {a.name for a in attrs.fields(cls) if a.init}}
        block_size = values.pop("block_size")
        try:
            return cls(block_size, **values)
        except TypeError as error:  # e.g. a sink merge whose first spec has no sink_len
            raise ConfigError(spec.KV_SPEC_013, "specs", f"cannot merge into {cls.__name__}: {error}") from None


def merge_layer_specs(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """The spec of a group of layers: the first layer's class merges them, as vLLM does (KV-SPEC-013)."""
    specs = _non_empty(specs)
    return type(specs[0]).merge(specs)


_MERGE_MESSAGES = {
    spec.KV_SPEC_010: "layers of one group record different sliding windows or chunk sizes",
    spec.KV_SPEC_011: "a group cannot record both a sliding window and an attention chunk size",
    spec.KV_SPEC_012: "MLA and non-MLA layers cannot share a group",
    spec.KV_SPEC_013: "all layers of a full-attention group must be full attention with the same "
                      "block_size, num_kv_heads, head_size, dtype_bytes and page_size_padded",
}


@attrs.frozen
class FullAttentionSpec(_FullAttentionFamily):
    """Every token attends to every earlier token."""

    kind: str = attrs.field(default="full", init=False)


@attrs.frozen
class SlidingWindowSpec(KVCacheSpec):
    """A token attends to itself and the ``sliding_window - 1`` tokens before it."""

    sliding_window: int = attrs.field(kw_only=True, validator=_positive)
    #: Trailing tokens kept (not attended) below the window, for multi-token drafting.
    extra_retained_tokens: int = attrs.field(default=0, kw_only=True, validator=_non_negative)
    kind: str = attrs.field(default="sliding_window", init=False)

    def max_num_pages(self, limits: MemoryLimits) -> int:
        return spec.sliding_window_max_pages(self.sliding_window, self.extra_retained_tokens,
                                             limits.max_in_flight_tokens, limits.max_model_len, self.block_size)

    def uniform_type_key(self) -> tuple[int, ...]:
        return (self.sliding_window,)


@attrs.frozen
class ChunkedLocalAttentionSpec(KVCacheSpec):
    """A token attends to the earlier tokens of its own ``attention_chunk_size`` chunk."""

    attention_chunk_size: int = attrs.field(kw_only=True, validator=_positive)
    kind: str = attrs.field(default="chunked_local", init=False)

    def max_num_pages(self, limits: MemoryLimits) -> int:
        return spec.chunked_local_max_pages(self.attention_chunk_size, limits.max_in_flight_tokens,
                                            limits.max_model_len, self.block_size)

    def uniform_type_key(self) -> tuple[int, ...]:
        return (self.attention_chunk_size,)


def _shapes(instance: object, attribute: attrs.Attribute, value: tuple[tuple[int, ...], ...]) -> None:
    if not value or not all(isinstance(shape, tuple) and all(_is_int(d) and d > 0 for d in shape)
                            for shape in value):
        raise ConfigError(spec.KV_SPEC_017, attribute.name,
                          f"must be one or more shapes of positive ints, got {value!r}")


def _state_dtype_bytes(instance: MambaSpec, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if len(value) != len(instance.shapes) or not all(_is_int(d) and d > 0 for d in value):
        raise ConfigError(spec.KV_SPEC_017, attribute.name,
                          f"must give a positive element size per shape ({len(instance.shapes)}), got {value!r}")


def _mamba_cache_mode(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in ("align", "none"):
        raise ConfigError(spec.KV_SPEC_017, attribute.name, f"must be 'align' or 'none', got {value!r}")


@attrs.frozen
class MambaSpec(KVCacheSpec):
    """A recurrent state per request; with prefix caching ("align" mode) one state
    snapshot per ``block_size`` tokens can be cached."""

    #: The state tensors' shapes; by default one ``(num_kv_heads, head_size)`` tensor.
    shapes: tuple[tuple[int, ...], ...] = attrs.field(
        kw_only=True, converter=lambda shapes: tuple(tuple(s) for s in shapes), validator=_shapes,
        default=attrs.Factory(lambda self: ((self.num_kv_heads, self.head_size),), takes_self=True))
    #: Element size in bytes of each state tensor; by default ``dtype_bytes`` for each.
    state_dtype_bytes: tuple[int, ...] = attrs.field(
        kw_only=True, converter=tuple, validator=_state_dtype_bytes,
        default=attrs.Factory(lambda self: (self.dtype_bytes,) * len(self.shapes), takes_self=True))
    mamba_cache_mode: str = attrs.field(default="align", kw_only=True, validator=_mamba_cache_mode)
    num_speculative_blocks: int = attrs.field(default=0, kw_only=True, validator=_non_negative)
    num_prefill_checkpoint_blocks: int = attrs.field(default=0, kw_only=True, validator=_non_negative)
    #: The granularity at which the backend can export a state inside a prefill chunk, or
    #: None when it cannot: without it no checkpoint page is ever reserved (KV-MAMBA-006).
    prefill_checkpoint_alignment: int | None = attrs.field(default=None, kw_only=True,
                                                           validator=_optional_positive)
    kind: str = attrs.field(default="mamba", init=False)

    def real_page_size_bytes(self) -> int:
        """One copy of the state tensors, independent of ``block_size`` (KV-SPEC-003)."""
        return spec.mamba_page_size_bytes(self.shapes, self.state_dtype_bytes)

    def max_num_pages(self, limits: MemoryLimits) -> int:
        return spec.mamba_max_pages(self.mamba_cache_mode == "align", self.num_speculative_blocks,
                                    self.num_prefill_checkpoint_blocks)

    def uniform_type_key(self) -> tuple[int, ...]:
        # vLLM's MambaSpec.is_uniform_with_collection compares the checkpoint alignment too (0: none).
        return (self.num_speculative_blocks, self.num_prefill_checkpoint_blocks, self.prefill_checkpoint_alignment or 0,
                self.page_size_bytes())


@attrs.frozen
class CrossAttentionSpec(KVCacheSpec):
    """Decoder tokens attend to the encoder's tokens; never prefix-cached."""

    kind: str = attrs.field(default="cross_attention", init=False)

    def max_num_pages(self, limits: MemoryLimits) -> int:
        return spec.cross_attention_max_pages(limits.max_num_encoder_input_tokens, self.block_size)


@attrs.frozen
class SinkFullAttentionSpec(_FullAttentionFamily):
    """Full attention with ``sink_len`` extra sink tokens held in dedicated blocks."""

    sink_len: int = attrs.field(kw_only=True, validator=_positive)
    kind: str = attrs.field(default="sink_full", init=False)


#: The kinds whose lookups scan left to right from block 0 (KV-HYB-003 sorts them first).
FULL_ATTENTION_KINDS = ("full", "sink_full")


def _layer_specs(value: Mapping[str, KVCacheSpec] | Sequence[tuple[str, KVCacheSpec]]
                 ) -> tuple[tuple[str, KVCacheSpec], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((name, layer_spec) for name, layer_spec in items)


@attrs.frozen
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """Layers of one type (KV-SPEC-015) with possibly different page sizes, as one group's spec.

    ``kv_cache_specs`` holds ``(layer name, spec)`` pairs (a dict is accepted); its page is
    one page of every layer (KV-SPEC-009). Build it with :meth:`from_specs`.
    """

    kv_cache_specs: tuple[tuple[str, KVCacheSpec], ...] = attrs.field(kw_only=True, converter=_layer_specs)
    kind: str = attrs.field(default="uniform_type", init=False)

    @kv_cache_specs.validator
    def _check(self, attribute: attrs.Attribute, value: tuple[tuple[str, KVCacheSpec], ...]) -> None:
        specs = [layer_spec for _, layer_spec in value]
        if not self.is_uniform_type(dict(value)) or specs[0].block_size != self.block_size:
            raise ConfigError(spec.KV_SPEC_015, "kv_cache_specs",
                              f"layers are not of one type with block_size {self.block_size}")

    def real_page_size_bytes(self) -> int:
        return spec.uniform_page_size_bytes(tuple(s.page_size_bytes() for _, s in self.kv_cache_specs))

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int = 0, *,
                               max_concurrent_batches: int = 1, max_num_encoder_input_tokens: int = 0,
                               dcp_world_size: int = 1) -> int:
        layers = [s for _, s in self.kv_cache_specs]
        layer_bytes = tuple(s.max_memory_usage_bytes(
            max_model_len, max_num_batched_tokens, max_concurrent_batches=max_concurrent_batches,
            max_num_encoder_input_tokens=max_num_encoder_input_tokens, dcp_world_size=dcp_world_size)
            for s in layers)
        return spec.uniform_max_memory_bytes(layer_bytes, tuple(s.page_size_bytes() for s in layers))

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        """Whether these layers can share one uniform-type group (KV-SPEC-015, KV-SPEC-016)."""
        specs = _non_empty(list(kv_cache_specs.values()))
        if any(s.kind not in spec.SPEC_KINDS for s in specs):
            raise ConfigError(spec.KV_SPEC_015, "kv_cache_specs",
                              f"no uniform type for kinds {sorted({s.kind for s in specs})}")
        return spec.is_uniform_type(tuple(spec.uniform_base_kind(s.kind) for s in specs),
                                    tuple(s.block_size for s in specs),
                                    tuple(s.uniform_type_key() for s in specs))

    @classmethod
    def from_specs(cls, kv_cache_specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """The uniform-type spec of these layers, or None when they are not of one type."""
        if not cls.is_uniform_type(kv_cache_specs):
            return None
        return cls(next(iter(kv_cache_specs.values())).block_size, kv_cache_specs=kv_cache_specs)


def _layer_names(value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError(spec.KV_SPEC_019, "layer_names", f"must be a sequence of names, got the string {value!r}")
    return tuple(value)


def _group_spec(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, KVCacheSpec):
        raise ConfigError(spec.KV_SPEC_019, attribute.name, f"must be a KVCacheSpec, got {value!r}")


@attrs.frozen
class KVCacheGroupSpec:
    """Layers that share one block table, and their merged spec."""

    layer_names: tuple[str, ...] = attrs.field(converter=_layer_names)
    kv_cache_spec: KVCacheSpec = attrs.field(validator=_group_spec)

    def __attrs_post_init__(self) -> None:
        if not self.layer_names or len(set(self.layer_names)) != len(self.layer_names):
            raise ConfigError(spec.KV_SPEC_019, "layer_names",
                              f"must name one or more distinct layers, got {list(self.layer_names)}")


@attrs.frozen
class KVCacheTensor:
    """A backing allocation of ``size`` bytes shared by ``layers``."""

    size: int
    layers: tuple[str, ...] = attrs.field(converter=_layer_names)


@attrs.frozen
class KVCacheConfig:
    """The pool's size, the groups and their backing tensors (KV-SPEC-018..020)."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = attrs.field(converter=tuple)
    kv_cache_tensors: tuple[KVCacheTensor, ...] = attrs.field(default=(), converter=tuple)

    _RULES: ClassVar[dict[str, tuple[str, str]]] = {
        "num_blocks": (spec.KV_SPEC_018, "must be a positive int"),
        "kv_cache_groups": (spec.KV_SPEC_019,
                            "every group must name one or more layers, and no layer may be in two groups"),
        "kv_cache_tensors": (spec.KV_SPEC_020,
                             "every tensor must have a positive size and back layers of the groups only"),
    }

    def __attrs_post_init__(self) -> None:
        if not _is_int(self.num_blocks):
            raise ConfigError(spec.KV_SPEC_018, "num_blocks", f"must be a positive int, got {self.num_blocks!r}")
        for group in self.kv_cache_groups:
            if not isinstance(group, KVCacheGroupSpec):
                raise ConfigError(spec.KV_SPEC_019, "kv_cache_groups", f"must hold KVCacheGroupSpec, got {group!r}")
        for tensor in self.kv_cache_tensors:
            if not isinstance(tensor, KVCacheTensor) or not _is_int(tensor.size):
                raise ConfigError(spec.KV_SPEC_020, "kv_cache_tensors",
                                  f"must hold KVCacheTensor with an int size, got {tensor!r}")
        bad = spec.first_invalid_kv_cache_config(
            self.num_blocks, tuple(g.layer_names for g in self.kv_cache_groups),
            tuple(t.size for t in self.kv_cache_tensors), tuple(t.layers for t in self.kv_cache_tensors))
        if bad:
            rule_id, why = self._RULES[bad]
            got = {"num_blocks": self.num_blocks,
                   "kv_cache_groups": [list(g.layer_names) for g in self.kv_cache_groups],
                   "kv_cache_tensors": [(t.size, list(t.layers)) for t in self.kv_cache_tensors]}[bad]
            raise ConfigError(rule_id, bad, f"{why}; got {got}")
