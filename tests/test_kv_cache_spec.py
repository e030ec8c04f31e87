"""The KV-cache spec family: spec chapter ``kv_cache_spec`` and ``kvoracle.reference.kv_cache_spec``.

Property tests state what each pure function means, written independently of its code;
seed-003 examples pin the formulas; error tests check that every refusal names its rule
and parameter; and a differential test compares the reference classes with vLLM 0.33.0's
own (run it where vllm is importable: ``/tmp/vv/venv/bin/python -m pytest
tests/test_kv_cache_spec.py``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvoracle.reference.kv_cache_spec import (
    FULL_ATTENTION_KINDS,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    merge_layer_specs,
)
from kvoracle.spec import ConfigError, get_rule
from kvoracle.spec import kv_cache_spec as ks

SETTINGS = settings(max_examples=150, deadline=None)
pos = st.integers(min_value=1, max_value=64)
nat = st.integers(min_value=0, max_value=512)


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b) if a < 2**52 else -(-a // b)


# --------------------------------------------------------------------------- registry


def test_chapter_rules_are_registered() -> None:
    ids = [f"KV-SPEC-{n:03d}" for n in range(1, 21)]
    for rule_id in ids:
        assert get_rule(rule_id).chapter == "kv_cache_spec"
    assert get_rule("KV-SPEC-016").kind == "divergence"
    assert {get_rule(r).kind for r in ids[16:]} == {"validation"}
    assert "seed 003" in get_rule("KV-SPEC-004").text


def test_skeleton_names_are_kept() -> None:
    assert FULL_ATTENTION_KINDS == ("full", "sink_full")
    kinds = [FullAttentionSpec(4).kind, SlidingWindowSpec(4, sliding_window=2).kind,
             ChunkedLocalAttentionSpec(4, attention_chunk_size=8).kind, MambaSpec(4).kind,
             CrossAttentionSpec(4).kind, SinkFullAttentionSpec(4, sink_len=2).kind]
    assert tuple(kinds) == ks.SPEC_KINDS
    assert not issubclass(SlidingWindowSpec, FullAttentionSpec)
    assert FullAttentionSpec(4) == FullAttentionSpec(4) and hash(FullAttentionSpec(4)) == hash(FullAttentionSpec(4))
    assert FullAttentionSpec(4) != SinkFullAttentionSpec(4, sink_len=1)


# --------------------------------------------------------------------------- page sizes


@SETTINGS
@given(pos, pos, pos, st.sampled_from([1, 2, 4]), st.booleans())
def test_attention_page_size(block_size, heads, head_size, dtype_bytes, use_mla) -> None:
    per_token_head = head_size * dtype_bytes * (1 if use_mla else 2)  # K (and V)
    expected = sum(per_token_head for _ in range(block_size * heads))
    assert ks.attention_page_size_bytes(block_size, heads, head_size, dtype_bytes, use_mla) == expected
    spec = FullAttentionSpec(block_size, num_kv_heads=heads, head_size=head_size, dtype_bytes=dtype_bytes,
                             use_mla=use_mla)
    assert spec.page_size_bytes() == expected


def test_seed_page_size_examples() -> None:
    # block 16, 8 KV heads of 128, fp16: 16 * 8 * (128 + 128) * 2 bytes.
    assert FullAttentionSpec(16, num_kv_heads=8, head_size=128, dtype_bytes=2).page_size_bytes() == 65536
    # DeepSeek-style MLA: one 576-wide latent per token, fp16.
    assert FullAttentionSpec(64, head_size=576, use_mla=True).page_size_bytes() == 64 * 576 * 2
    # A Mamba state of a (3, 4) fp32 conv state and a (8,) fp16 ssm state, any block size.
    for block_size in (1, 16, 1024):
        assert MambaSpec(block_size, shapes=((3, 4), (8,)), state_dtype_bytes=(4, 2)).page_size_bytes() == 64


@SETTINGS
@given(pos, st.integers(min_value=0, max_value=200))
def test_padded_page_size(real, padded) -> None:
    if padded and padded < real:
        return
    assert ks.padded_page_size_bytes(real, padded) == (padded or real)


def test_too_small_padding_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        FullAttentionSpec(4, page_size_padded=8)
    assert (info.value.rule_id, info.value.parameter) == ("KV-SPEC-002", "page_size_padded")
    assert FullAttentionSpec(4, page_size_padded=64).page_size_bytes() == 64


@SETTINGS
@given(st.lists(st.tuples(st.lists(st.integers(1, 6), max_size=3).map(tuple), st.sampled_from([1, 2, 4])),
                min_size=1, max_size=4))
def test_mamba_page_size(states) -> None:
    shapes = tuple(shape for shape, _ in states)
    sizes = tuple(size for _, size in states)
    assert ks.mamba_page_size_bytes(shapes, sizes) == sum(math.prod(shape) * size for shape, size in states)


# --------------------------------------------------------------------------- worst-case pages


@SETTINGS
@given(st.integers(1, 5000), pos, st.integers(1, 8))
def test_full_attention_max_pages(max_model_len, block_size, dcp) -> None:
    tokens = max_model_len if dcp == 1 else ceil_div(max_model_len, dcp)
    pages = min(p for p in range(tokens + 1) if p * block_size >= tokens)
    assert ks.full_attention_max_pages(max_model_len, block_size, dcp) == pages


@SETTINGS
@given(pos, st.integers(0, 8), nat, st.integers(1, 2000), pos)
def test_sliding_window_max_pages(window, extra, in_flight, max_model_len, block_size) -> None:
    tokens = min(window - 1 + extra + in_flight, max_model_len)
    pages = ks.sliding_window_max_pages(window, extra, in_flight, max_model_len, block_size)
    assert pages == ceil_div(tokens, block_size) + 1
    # It bounds the blocks the held tokens can touch wherever the window starts in a block.
    assert pages >= max(ceil_div(offset + tokens, block_size) for offset in range(block_size))


@SETTINGS
@given(pos, nat, st.integers(1, 2000), pos)
def test_chunked_local_max_pages(chunk, in_flight, max_model_len, block_size) -> None:
    tokens = min(chunk + in_flight, max_model_len)
    assert ks.chunked_local_max_pages(chunk, in_flight, max_model_len, block_size) == ceil_div(tokens, block_size)


@SETTINGS
@given(st.booleans(), st.integers(0, 5), st.integers(0, 5))
def test_mamba_max_pages(align, spec_blocks, checkpoints) -> None:
    expected = (2 + spec_blocks + checkpoints) if align else (1 + spec_blocks)
    assert ks.mamba_max_pages(align, spec_blocks, checkpoints) == expected


@SETTINGS
@given(nat, pos)
def test_cross_attention_max_pages(encoder_tokens, block_size) -> None:
    assert ks.cross_attention_max_pages(encoder_tokens, block_size) == ceil_div(encoder_tokens, block_size)


@SETTINGS
@given(nat, pos)
def test_max_memory_usage_bytes(pages, page_size) -> None:
    assert ks.max_memory_usage_bytes(pages, page_size) == sum(page_size for _ in range(pages))


@SETTINGS
@given(st.lists(pos, min_size=1, max_size=5).map(tuple))
def test_uniform_page_size(page_sizes) -> None:
    assert ks.uniform_page_size_bytes(page_sizes) == sum(page_sizes)


@SETTINGS
@given(st.lists(st.tuples(nat, pos), min_size=1, max_size=5))
def test_uniform_max_memory(layers) -> None:
    layer_bytes = tuple(b for b, _ in layers)
    page_sizes = tuple(p for _, p in layers)
    most_pages = max(ceil_div(b, p) for b, p in layers)
    assert ks.uniform_max_memory_bytes(layer_bytes, page_sizes) == most_pages * sum(page_sizes)


def test_seed_max_memory_examples() -> None:
    # 8 KV heads of 128, fp16, block 16: a page is 64 KiB.
    full = FullAttentionSpec(16, num_kv_heads=8, head_size=128)
    assert full.max_memory_usage_bytes(1000) == 63 * 65536  # cdiv(1000, 16) pages
    assert full.max_memory_usage_bytes(1000, dcp_world_size=2) == 32 * 65536  # cdiv(cdiv(1000, 2), 16)
    window = SlidingWindowSpec(16, num_kv_heads=8, head_size=128, sliding_window=128)
    assert window.max_memory_usage_bytes(1000, 256) == (ceil_div(127 + 256, 16) + 1) * 65536
    assert window.max_memory_usage_bytes(1000, 256, max_concurrent_batches=2) == (ceil_div(639, 16) + 1) * 65536
    assert window.max_memory_usage_bytes(100, 256) == (ceil_div(100, 16) + 1) * 65536
    chunked = ChunkedLocalAttentionSpec(16, num_kv_heads=8, head_size=128, attention_chunk_size=128)
    assert chunked.max_memory_usage_bytes(1000, 256) == ceil_div(384, 16) * 65536
    cross = CrossAttentionSpec(16, num_kv_heads=8, head_size=128)
    assert cross.max_memory_usage_bytes(1000, max_num_encoder_input_tokens=1500) == 94 * 65536
    mamba = MambaSpec(16, shapes=((3, 4),), state_dtype_bytes=(4,), num_speculative_blocks=1)
    assert mamba.max_memory_usage_bytes(10**6) == 3 * 48
    assert MambaSpec(16, shapes=((3, 4),), state_dtype_bytes=(4,), mamba_cache_mode="none")\
        .max_memory_usage_bytes(10**6) == 48
    sink = SinkFullAttentionSpec(16, num_kv_heads=8, head_size=128, sink_len=4)
    assert sink.max_memory_usage_bytes(1000) == full.max_memory_usage_bytes(1000)


# --------------------------------------------------------------------------- merging


@SETTINGS
@given(st.lists(st.sampled_from([0, 0, 4, 8]), max_size=6).map(tuple))
def test_merge_window_sizes(sizes) -> None:
    set_ones = {s for s in sizes if s}
    expected = 0 if not set_ones else (next(iter(set_ones)) if len(set_ones) == 1 else -1)
    assert ks.merge_window_sizes(sizes) == expected


@st.composite
def merge_inputs(draw):
    n = draw(st.integers(1, 4))
    return (draw(st.booleans()), tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
            draw(st.booleans()), tuple(draw(st.lists(st.sampled_from([0, 4, 8]), min_size=n, max_size=n))),
            tuple(draw(st.lists(st.sampled_from([0, 16, 32]), min_size=n, max_size=n))))


@SETTINGS
@given(merge_inputs())
def test_full_attention_merge_failure(args) -> None:
    family, mla, same_fields, windows, chunks = args
    got = ks.full_attention_merge_failure(family, mla, same_fields, windows, chunks)
    one_window = len({w for w in windows if w}) <= 1
    one_chunk = len({c for c in chunks if c}) <= 1
    has_both = any(windows) and any(chunks)
    if not family:
        assert got == "KV-SPEC-013"
    elif any(mla) and not all(mla):
        assert got == "KV-SPEC-012"
    elif all(mla):
        assert got == ("" if same_fields else "KV-SPEC-013")
    elif not (one_window and one_chunk):
        assert got == "KV-SPEC-010"
    elif not same_fields:
        assert got == "KV-SPEC-013"
    else:
        assert got == ("KV-SPEC-011" if has_both else "")


def test_seed_merge_examples() -> None:
    plain = FullAttentionSpec(16, num_kv_heads=2, head_size=64)
    windowed = FullAttentionSpec(16, num_kv_heads=2, head_size=64, sliding_window=128)
    merged = merge_layer_specs([plain, windowed, plain])
    assert merged == windowed and type(merged) is FullAttentionSpec
    sink = SinkFullAttentionSpec(16, num_kv_heads=2, head_size=64, sink_len=4)
    assert merge_layer_specs([sink, plain]) == sink  # the first spec's class and sink_len
    assert merge_layer_specs([plain, sink]) == plain
    mla = FullAttentionSpec(16, head_size=576, use_mla=True, sliding_window=8)
    assert merge_layer_specs([mla, mla]).sliding_window is None  # an MLA merge records no window
    window = SlidingWindowSpec(16, sliding_window=8)
    assert merge_layer_specs([window, window]) == window


@pytest.mark.parametrize(("specs", "rule_id"), [
    ([FullAttentionSpec(16, sliding_window=4), FullAttentionSpec(16, sliding_window=8)], "KV-SPEC-010"),
    ([FullAttentionSpec(16, attention_chunk_size=4), FullAttentionSpec(16, attention_chunk_size=8)], "KV-SPEC-010"),
    ([FullAttentionSpec(16, sliding_window=4), FullAttentionSpec(16, attention_chunk_size=8)], "KV-SPEC-011"),
    ([FullAttentionSpec(16), FullAttentionSpec(16, use_mla=True)], "KV-SPEC-012"),
    ([FullAttentionSpec(16, use_mla=True), FullAttentionSpec(16)], "KV-SPEC-012"),
    ([FullAttentionSpec(16), FullAttentionSpec(16, head_size=2)], "KV-SPEC-013"),
    ([FullAttentionSpec(16), FullAttentionSpec(8)], "KV-SPEC-013"),
    ([FullAttentionSpec(16), SlidingWindowSpec(16, sliding_window=4)], "KV-SPEC-013"),
    ([SlidingWindowSpec(16, sliding_window=4), FullAttentionSpec(16)], "KV-SPEC-014"),
    ([SlidingWindowSpec(16, sliding_window=4), SlidingWindowSpec(16, sliding_window=8)], "KV-SPEC-014"),
    ([MambaSpec(16), MambaSpec(16, num_speculative_blocks=1)], "KV-SPEC-014"),
    ([CrossAttentionSpec(16), CrossAttentionSpec(16, num_kv_heads=2)], "KV-SPEC-014"),
])
def test_impossible_merges_name_their_rule(specs, rule_id) -> None:
    with pytest.raises(ConfigError) as info:
        merge_layer_specs(specs)
    assert (info.value.rule_id, info.value.parameter) == (rule_id, "specs")
    assert str(info.value).startswith(f"{rule_id}: specs: ")


# --------------------------------------------------------------------------- uniform type


@st.composite
def layer_specs(draw, block_size=None):
    block_size = block_size or draw(st.sampled_from([4, 8]))
    heads, head = draw(st.integers(1, 3)), draw(st.sampled_from([8, 16]))
    kind = draw(st.sampled_from((*ks.SPEC_KINDS, "mla")))
    common = {"num_kv_heads": heads, "head_size": head, "dtype_bytes": draw(st.sampled_from([1, 2, 4]))}
    if kind == "full":
        return FullAttentionSpec(block_size, **common, sliding_window=draw(st.sampled_from([None, 4])),
                                 attention_chunk_size=None)
    if kind == "mla":
        return FullAttentionSpec(block_size, **common, use_mla=True)
    if kind == "sink_full":
        return SinkFullAttentionSpec(block_size, **common, sink_len=draw(st.integers(1, 4)))
    if kind == "sliding_window":
        return SlidingWindowSpec(block_size, **common, sliding_window=draw(st.sampled_from([4, 8])))
    if kind == "chunked_local":
        return ChunkedLocalAttentionSpec(block_size, **common, attention_chunk_size=draw(st.sampled_from([8, 16])))
    if kind == "cross_attention":
        return CrossAttentionSpec(block_size, **common)
    return MambaSpec(block_size, shapes=((heads, head),), state_dtype_bytes=(common["dtype_bytes"],),
                     num_speculative_blocks=draw(st.integers(0, 1)),
                     num_prefill_checkpoint_blocks=draw(st.integers(0, 1)),
                     mamba_cache_mode=draw(st.sampled_from(["align", "none"])))


def same_type(a, b) -> bool:
    """Uniformity of two specs, from the rule's prose."""
    full = ("full", "sink_full")
    if a.block_size != b.block_size:
        return False
    if a.kind in full or b.kind in full:
        return a.kind in full and b.kind in full
    if a.kind != b.kind:
        return False
    if a.kind == "sliding_window":
        return a.sliding_window == b.sliding_window
    if a.kind == "chunked_local":
        return a.attention_chunk_size == b.attention_chunk_size
    if a.kind == "mamba":
        return (a.num_speculative_blocks, a.num_prefill_checkpoint_blocks, a.page_size_bytes()) == \
            (b.num_speculative_blocks, b.num_prefill_checkpoint_blocks, b.page_size_bytes())
    return True


@SETTINGS
@given(st.lists(layer_specs(), min_size=1, max_size=5))
def test_is_uniform_type(specs) -> None:
    layers = {f"layer{i}": s for i, s in enumerate(specs)}
    expected = all(same_type(specs[0], s) for s in specs)
    assert UniformTypeKVCacheSpecs.is_uniform_type(layers) == expected
    uniform = UniformTypeKVCacheSpecs.from_specs(layers)
    assert (uniform is not None) == expected
    if uniform is not None:
        assert uniform.page_size_bytes() == sum(s.page_size_bytes() for s in specs)
        assert uniform.block_size == specs[0].block_size
        most = max(s.max_memory_usage_bytes(64, 8, max_num_encoder_input_tokens=32) // s.page_size_bytes()
                   for s in specs)
        assert uniform.max_memory_usage_bytes(64, 8, max_num_encoder_input_tokens=32) == \
            most * uniform.page_size_bytes()


@SETTINGS
@given(st.lists(st.sampled_from(ks.SPEC_KINDS), min_size=1, max_size=4).map(tuple))
def test_uniform_base_kind_and_predicate(kinds) -> None:
    base = tuple(ks.uniform_base_kind(k) for k in kinds)
    assert all(b == ("full" if k == "sink_full" else k) for k, b in zip(kinds, base))
    keys = tuple(() for _ in kinds)
    assert ks.is_uniform_type(base, tuple(8 for _ in kinds), keys) == (len(set(base)) == 1)
    assume(len(kinds) > 1)
    assert not ks.is_uniform_type(base, (8,) * (len(kinds) - 1) + (16,), keys)


def test_mamba_uniformity_divergence() -> None:
    # Seed 003 called these uniform (same num_speculative_blocks); vLLM 0.33.0 does not.
    small = MambaSpec(16, shapes=((4,),), state_dtype_bytes=(2,))
    large = MambaSpec(16, shapes=((8,),), state_dtype_bytes=(2,))
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": small, "b": large})
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": small, "b": small})


def test_not_uniform_is_refused_by_the_constructor() -> None:
    with pytest.raises(ConfigError) as info:
        UniformTypeKVCacheSpecs(16, kv_cache_specs={"a": FullAttentionSpec(16), "b": CrossAttentionSpec(16)})
    assert (info.value.rule_id, info.value.parameter) == ("KV-SPEC-015", "kv_cache_specs")


# --------------------------------------------------------------------------- configuration

names = st.lists(st.sampled_from("abcdefg"), max_size=3).map(tuple)


@SETTINGS
@given(st.integers(-2, 4), st.lists(names, max_size=3).map(tuple),
       st.lists(st.tuples(st.integers(-1, 3), names), max_size=3))
def test_first_invalid_kv_cache_config(num_blocks, groups, tensors) -> None:
    all_names = [n for g in groups for n in g]
    if num_blocks < 1:
        expected = "num_blocks"
    elif any(not g for g in groups) or len(set(all_names)) != len(all_names):
        expected = "kv_cache_groups"
    elif any(size < 1 or not layers or not set(layers) <= set(all_names) for size, layers in tensors):
        expected = "kv_cache_tensors"
    else:
        expected = ""
    got = ks.first_invalid_kv_cache_config(num_blocks, groups, tuple(s for s, _ in tensors),
                                           tuple(n for _, n in tensors))
    assert got == expected
    if expected == "" and all(groups):
        spec = FullAttentionSpec(4)
        config = KVCacheConfig(num_blocks, [KVCacheGroupSpec(g, spec) for g in groups],
                               [KVCacheTensor(s, n) for s, n in tensors])
        assert config.num_blocks == num_blocks


def assert_refused(make, rule_id: str, parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert (info.value.rule_id, info.value.parameter) == (rule_id, parameter)
    assert str(info.value).startswith(f"{rule_id}: {parameter}: ")
    assert isinstance(info.value, ValueError)


def test_kv_cache_config_errors_name_rule_and_parameter() -> None:
    full = FullAttentionSpec(16)
    group = KVCacheGroupSpec(["layer.0", "layer.1"], full)
    assert_refused(lambda: KVCacheConfig(0, [group]), "KV-SPEC-018", "num_blocks")
    assert_refused(lambda: KVCacheConfig(2.0, [group]), "KV-SPEC-018", "num_blocks")
    assert_refused(lambda: KVCacheConfig(8, [group, KVCacheGroupSpec(["layer.1"], full)]),
                   "KV-SPEC-019", "kv_cache_groups")
    assert_refused(lambda: KVCacheConfig(8, [group], [KVCacheTensor(0, ["layer.0"])]),
                   "KV-SPEC-020", "kv_cache_tensors")
    assert_refused(lambda: KVCacheConfig(8, [group], [KVCacheTensor(64, ["layer.9"])]),
                   "KV-SPEC-020", "kv_cache_tensors")
    assert_refused(lambda: KVCacheGroupSpec([], full), "KV-SPEC-019", "layer_names")
    assert_refused(lambda: KVCacheGroupSpec(["a", "a"], full), "KV-SPEC-019", "layer_names")
    assert_refused(lambda: KVCacheGroupSpec("ab", full), "KV-SPEC-019", "layer_names")
    assert_refused(lambda: KVCacheGroupSpec(["a"], "full"), "KV-SPEC-019", "kv_cache_spec")
    assert KVCacheConfig(1, []).kv_cache_groups == ()  # an attention-free model


@pytest.mark.parametrize(("make", "rule_id", "parameter"), [
    (lambda: FullAttentionSpec(0), "KV-CFG-002", "block_size"),
    (lambda: FullAttentionSpec(4, num_kv_heads=0), "KV-SPEC-017", "num_kv_heads"),
    (lambda: FullAttentionSpec(4, head_size=True), "KV-SPEC-017", "head_size"),
    (lambda: FullAttentionSpec(4, sliding_window=0), "KV-SPEC-017", "sliding_window"),
    (lambda: SlidingWindowSpec(4, sliding_window=-1), "KV-SPEC-017", "sliding_window"),
    (lambda: SlidingWindowSpec(4, sliding_window=2, extra_retained_tokens=-1), "KV-SPEC-017",
     "extra_retained_tokens"),
    (lambda: ChunkedLocalAttentionSpec(4, attention_chunk_size=0), "KV-SPEC-017", "attention_chunk_size"),
    (lambda: SinkFullAttentionSpec(4, sink_len=0), "KV-SPEC-017", "sink_len"),
    (lambda: MambaSpec(4, shapes=()), "KV-SPEC-017", "shapes"),
    (lambda: MambaSpec(4, shapes=((2, 0),)), "KV-SPEC-017", "shapes"),
    (lambda: MambaSpec(4, shapes=((2,),), state_dtype_bytes=(2, 2)), "KV-SPEC-017", "state_dtype_bytes"),
    (lambda: MambaSpec(4, mamba_cache_mode="all"), "KV-SPEC-017", "mamba_cache_mode"),
    (lambda: MambaSpec(4, num_speculative_blocks=-1), "KV-SPEC-017", "num_speculative_blocks"),
])
def test_spec_fields_are_validated(make, rule_id, parameter) -> None:
    assert_refused(make, rule_id, parameter)


# --------------------------------------------------------------------------- vLLM 0.33.0

DTYPES = {1: "int8", 2: "float16", 4: "float32"}


def _vllm():
    vllm = pytest.importorskip("vllm", reason="vllm is not importable here (it lives in /tmp/vv/venv)")
    if not vllm.__version__.startswith("0.33."):
        pytest.skip(f"the differential test targets vLLM 0.33.x, found {vllm.__version__}")
    import torch
    from vllm.v1 import kv_cache_interface
    return torch, kv_cache_interface


def to_vllm(spec, torch, v):
    common = {"block_size": spec.block_size, "page_size_padded": spec.page_size_padded}
    if spec.kind == "mamba":
        return v.MambaSpec(shapes=spec.shapes, dtypes=tuple(getattr(torch, DTYPES[d]) for d in spec.state_dtype_bytes),
                           mamba_cache_mode=spec.mamba_cache_mode, num_speculative_blocks=spec.num_speculative_blocks,
                           num_prefill_checkpoint_blocks=spec.num_prefill_checkpoint_blocks, **common)
    common.update(num_kv_heads=spec.num_kv_heads, head_size=spec.head_size,
                  dtype=getattr(torch, DTYPES[spec.dtype_bytes]))
    if spec.kind == "full" and spec.use_mla:
        return v.MLAAttentionSpec(**common, sliding_window=spec.sliding_window,
                                  attention_chunk_size=spec.attention_chunk_size)
    if spec.kind == "full":
        return v.FullAttentionSpec(**common, sliding_window=spec.sliding_window,
                                   attention_chunk_size=spec.attention_chunk_size)
    if spec.kind == "sink_full":
        return v.SinkFullAttentionSpec(**common, sliding_window=spec.sliding_window,
                                       attention_chunk_size=spec.attention_chunk_size, sink_len=spec.sink_len)
    if spec.kind == "sliding_window":
        return v.SlidingWindowSpec(**common, sliding_window=spec.sliding_window,
                                   extra_retained_tokens=spec.extra_retained_tokens)
    if spec.kind == "chunked_local":
        return v.ChunkedLocalAttentionSpec(**common, attention_chunk_size=spec.attention_chunk_size)
    return v.CrossAttentionSpec(**common)


@st.composite
def diff_specs(draw, block_size=None):
    block_size = block_size or draw(st.sampled_from([1, 4, 16]))
    heads, head = draw(st.integers(1, 4)), draw(st.sampled_from([1, 8, 64]))
    dtype_bytes = draw(st.sampled_from(sorted(DTYPES)))
    kind = draw(st.sampled_from((*ks.SPEC_KINDS, "mla")))
    common = {"num_kv_heads": heads, "head_size": head, "dtype_bytes": dtype_bytes}
    window = draw(st.sampled_from([None, None, 4, 8]))
    chunk = draw(st.sampled_from([None, None, 16])) if window is None or draw(st.booleans()) else None
    if kind == "full":
        spec = FullAttentionSpec(block_size, **common, sliding_window=window, attention_chunk_size=chunk)
    elif kind == "mla":
        spec = FullAttentionSpec(block_size, **common, use_mla=True)
    elif kind == "sink_full":
        spec = SinkFullAttentionSpec(block_size, **common, sink_len=draw(st.integers(1, 8)),
                                     sliding_window=window)
    elif kind == "sliding_window":
        spec = SlidingWindowSpec(block_size, **common, sliding_window=draw(st.integers(1, 64)),
                                 extra_retained_tokens=draw(st.integers(0, 4)))
    elif kind == "chunked_local":
        spec = ChunkedLocalAttentionSpec(block_size, **common, attention_chunk_size=draw(st.integers(1, 64)))
    elif kind == "cross_attention":
        spec = CrossAttentionSpec(block_size, **common)
    else:
        shapes = tuple(draw(st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
                                     min_size=1, max_size=3)))
        spec = MambaSpec(block_size, shapes=shapes,
                         state_dtype_bytes=tuple(draw(st.sampled_from(sorted(DTYPES))) for _ in shapes),
                         mamba_cache_mode=draw(st.sampled_from(["align", "none"])),
                         num_speculative_blocks=draw(st.integers(0, 2)),
                         num_prefill_checkpoint_blocks=draw(st.integers(0, 2)))
    if draw(st.booleans()):
        spec = type(spec)(spec.block_size, **{**_init_values(spec), "page_size_padded": spec.page_size_bytes()
                                              + draw(st.integers(0, 64))})
    return spec


def _init_values(spec):
    return {a.name: getattr(spec, a.name) for a in attrs.fields(type(spec)) if a.init and a.name != "block_size"}


def _vllm_config(spec, limits):
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=limits["max_model_len"]),
        parallel_config=SimpleNamespace(decode_context_parallel_size=limits["dcp_world_size"]),
        scheduler_config=SimpleNamespace(max_num_encoder_input_tokens=limits["max_num_encoder_input_tokens"]),
        cache_config=SimpleNamespace(mamba_cache_mode=getattr(spec, "mamba_cache_mode", "none")),
        max_in_flight_tokens=limits["max_concurrent_batches"] * limits["max_num_batched_tokens"])


limits_st = st.fixed_dictionaries({
    "max_model_len": st.integers(1, 5000), "max_num_batched_tokens": st.integers(0, 2048),
    "max_concurrent_batches": st.integers(1, 3), "max_num_encoder_input_tokens": st.integers(0, 3000),
    "dcp_world_size": st.integers(1, 4)})


def _outcome(call):
    try:
        return ("ok", call())
    except (AssertionError, ValueError, ConfigError):
        return ("error", None)


def _summary(spec) -> tuple:
    """What the two merges must agree on: kind, page size, window and chunk."""
    if hasattr(spec, "page_size_bytes") and callable(spec.page_size_bytes):
        page = spec.page_size_bytes()
    else:
        page = spec.page_size_bytes
    kind = getattr(spec, "kind", None) or type(spec).__name__
    return (kind, page, getattr(spec, "sliding_window", None), getattr(spec, "attention_chunk_size", None),
            getattr(spec, "sink_len", None))


VLLM_KINDS = {"FullAttentionSpec": "full", "MLAAttentionSpec": "full", "SinkFullAttentionSpec": "sink_full",
              "SlidingWindowSpec": "sliding_window", "ChunkedLocalAttentionSpec": "chunked_local",
              "MambaSpec": "mamba", "CrossAttentionSpec": "cross_attention"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(diff_specs(), limits_st)
def test_differential_page_size_and_max_memory_against_vllm(spec, limits) -> None:
    torch, v = _vllm()
    if spec.kind == "sliding_window" and limits["dcp_world_size"] > 1:
        limits = {**limits, "dcp_world_size": 1}  # vLLM: "DCP not support sliding window"
    theirs = to_vllm(spec, torch, v)
    assert spec.page_size_bytes() == theirs.page_size_bytes
    ours = spec.max_memory_usage_bytes(**limits)
    assert ours == theirs.max_memory_usage_bytes(_vllm_config(spec, limits))


@st.composite
def merge_groups(draw):
    block_size = draw(st.sampled_from([4, 16]))
    first = draw(diff_specs(block_size=block_size))
    variants = [st.just(first), diff_specs(block_size=block_size)]
    if first.kind in FULL_ATTENTION_KINDS:  # same fields, another recorded window or chunk
        variants.append(st.builds(lambda w, c: attrs.evolve(first, sliding_window=w, attention_chunk_size=c),
                                  st.sampled_from([None, 4, 8]), st.sampled_from([None, 16, 32])))
    others = draw(st.lists(st.one_of(*variants), max_size=3))
    return [first, *others]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge_groups())
def test_differential_merge_against_vllm(specs) -> None:
    torch, v = _vllm()
    theirs = [to_vllm(s, torch, v) for s in specs]
    ours = _outcome(lambda: merge_layer_specs(specs))
    vllm = _outcome(lambda: theirs[0].merge(theirs))
    assert ours[0] == vllm[0], (ours, vllm)
    if ours[0] == "ok":
        mine, other = _summary(ours[1]), _summary(vllm[1])
        assert mine[1:] == other[1:] and mine[0] == VLLM_KINDS[other[0]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(diff_specs(block_size=16), min_size=1, max_size=4), st.booleans())
def test_differential_uniform_type_against_vllm(specs, mixed_block_sizes) -> None:
    torch, v = _vllm()
    if mixed_block_sizes:
        specs = [*specs, FullAttentionSpec(4)]
    layers = {f"model.layers.{i}": s for i, s in enumerate(specs)}
    theirs = {name: to_vllm(s, torch, v) for name, s in layers.items()}
    expected = v.UniformTypeKVCacheSpecs.is_uniform_type(theirs)
    assert UniformTypeKVCacheSpecs.is_uniform_type(layers) == expected
    if expected:
        config = _vllm_config(specs[0], {"max_model_len": 777, "max_num_batched_tokens": 64,
                                         "max_concurrent_batches": 1, "max_num_encoder_input_tokens": 100,
                                         "dcp_world_size": 1})
        if any(s.kind == "mamba" for s in specs):
            return  # vLLM reads one cache mode for every Mamba layer; kvoracle reads each spec's
        ours = UniformTypeKVCacheSpecs.from_specs(layers)
        vllm = v.UniformTypeKVCacheSpecs.from_specs(theirs)
        assert ours.page_size_bytes() == vllm.page_size_bytes
        assert ours.max_memory_usage_bytes(777, 64, max_num_encoder_input_tokens=100) == \
            vllm.max_memory_usage_bytes(config)
