"""Property tests of the specification's pure functions.

Each test states what a spec function *means* -- usually as a brute-force definition
written independently of the function's own code -- and checks it on generated inputs.
The functions' icontract conditions are live while these tests run, so every call is
also a check of the function's own contracts.

Never run these under hypothesis-crosshair's backend: it switches icontract off for the
whole process (``test_icontract_is_armed`` fails loudly if that ever happens).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from collections import Counter

import icontract
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kvoracle.spec as spec
from kvoracle.spec import (
    block_pool,
    config,
    contracts,
    full_attention,
    hashing,
    lifecycle,
    registry,
)
from kvoracle.spec.config import ConfigError, validate_config

SETTINGS = settings(max_examples=150, deadline=None)

small = st.integers(min_value=0, max_value=40)
positive = st.integers(min_value=1, max_value=16)
bools = st.lists(st.booleans(), max_size=12).map(tuple)
tokens_st = st.lists(st.integers(min_value=0, max_value=3), max_size=24).map(tuple)
salts = st.none() | st.text(max_size=4)


# --------------------------------------------------------------------------- harness


def contracted_functions() -> dict[str, object]:
    """Every function of the spec chapters that carries icontract conditions."""
    found = {}
    for chapter in spec.CHAPTERS:
        for name, fn in vars(chapter).items():
            if (inspect.isfunction(fn) and fn.__module__ == chapter.__name__
                    and (getattr(fn, "__preconditions__", None)
                         or getattr(fn, "__postconditions__", None))):
                found[f"{chapter.__name__.rsplit('.', 1)[-1]}.{name}"] = fn
    return found


#: The contracted spec functions this module tests; a new one must be added here.
TESTED = {
    "config.first_invalid_parameter",
    # kv_cache_spec: property-tested in tests/test_kv_cache_spec.py
    "kv_cache_spec.attention_page_size_bytes",
    "kv_cache_spec.padded_page_size_bytes",
    "kv_cache_spec.mamba_page_size_bytes",
    "kv_cache_spec.full_attention_max_pages",
    "kv_cache_spec.sliding_window_max_pages",
    "kv_cache_spec.chunked_local_max_pages",
    "kv_cache_spec.mamba_max_pages",
    "kv_cache_spec.cross_attention_max_pages",
    "kv_cache_spec.max_memory_usage_bytes",
    "kv_cache_spec.uniform_page_size_bytes",
    "kv_cache_spec.uniform_max_memory_bytes",
    "kv_cache_spec.merge_window_sizes",
    "kv_cache_spec.full_attention_merge_failure",
    "kv_cache_spec.uniform_base_kind",
    "kv_cache_spec.is_uniform_type",
    "kv_cache_spec.first_invalid_kv_cache_config",
    "hashing.num_block_hashes",
    "hashing.block_size_view_index",
    "hashing.block_size_view_length",
    "hashing.prefixes_share_hash",
    "block_pool.pop_front",
    "block_pool.queue_after_release",
    "block_pool.queue_after_append",
    "block_pool.free_order",
    "block_pool.queue_after_touch",
    "block_pool.free_iff_unreferenced",
    "block_pool.refcounts_balanced",
    "block_pool.usage",
    "block_pool.can_reset_prefix_cache",
    "block_pool.lookup_block",
    "full_attention.longest_cached_run",
    "full_attention.full_attention_hit_length",
    "full_attention.align_hit",
    "lifecycle.max_cache_hit_length",
    "lifecycle.cdiv",
    "lifecycle.num_slots",
    "lifecycle.num_blocks_to_allocate",
    "lifecycle.num_tokens_to_cache",
    "lifecycle.num_full_blocks_to_cache",
    "lifecycle.num_common_prefix_blocks",
    # Attention types and the hybrid coordinator: tests/test_hybrid_spec.py.
    "full_attention.aligned_hit_length",
    "sliding_window.contiguous_blocks_needed",
    "sliding_window.accepts",
    "sliding_window.hit_length",
    "sliding_window.greatest_accepted",
    "sliding_window.num_skipped_tokens",
    "sliding_window.blocks_to_free",
    "sliding_window.block_is_reachable",
    "chunked_local.num_null_blocks",
    "chunked_local.hit_length",
    "chunked_local.num_skipped_tokens",
    "mamba.hit_length",
    "cross_attention.num_blocks_to_allocate",
    "hybrid.scheduler_block_size",
    "hybrid.group_hit_length",
    "hybrid.group_accepts",
    "hybrid.declarative_hit",
    "hybrid.fixed_point",
    "hybrid.num_null_hit_blocks",
    "hybrid.num_cacheable_tokens",
    "hybrid.per_group_hits",
    "sliding_window.num_new_blocks",
    # The hybrid lifecycle: tests/test_hybrid_lifecycle.py.
    "hybrid.unitary_hit",
    "hybrid_lifecycle.skipped_tokens",
    "hybrid_lifecycle.group_blocks_to_allocate",
    "hybrid_lifecycle.adopted_table",
    "hybrid_lifecycle.free_order",
    "hybrid_lifecycle.table_nulls_ok",
    "hybrid_lifecycle.blocks_to_cache",
    "hybrid_lifecycle.partial_tail_boundary",
    "hybrid_lifecycle.mamba_slots",
    # (and in tests/test_release_rules.py, the lagging Mamba releases' replays)
    "hybrid_lifecycle.lagging_mamba_tokens",
    # Data integrity: slot_value and slot_violation also in tests/test_gpu.py.
    "data_integrity.slot_value",
    "data_integrity.slot_violation",
    "data_integrity.cached_block_intact",
    "data_integrity.null_block_unwritten",
    "data_integrity.first_relied_position",
    "data_integrity.state_after", "data_integrity.first_wrong_state",
    # External store: tests/test_external_store_spec.py.
    "external_store.local_eagle_groups",
    "external_store.store_eagle_groups",
    "external_store.chunk_key_index",
    "external_store.load_mask",
    "external_store.is_loadable",
    "external_store.store_fast_path",
    "external_store.store_mask",
    "external_store.lookup_mask",
    "external_store.store_is_sufficient",
    "external_store.external_hit",
    # KV-HYB-005: tests/test_hybrid_spec.py.
    "hybrid.single_pass",
    # Mamba's align mode (chapter 8): tests/test_mamba_align_spec.py, directly or (the last
    # three) through reserved_checkpoint, align_layout and align_need, which call them.
    "mamba.align_layout", "mamba.align_need", "mamba.align_blocks_to_free", "mamba.retired_after",
    "mamba.frees_last_state", "mamba.reserved_checkpoint", "mamba.checkpoint_index",
    "mamba.checkpoint_key_tokens", "mamba.chunk_keeps_states", "mamba.running_index",
    "mamba.states_written", "mamba.align_table_ok", "mamba.align_free_order",
    "mamba.num_required_entries", "mamba.checkpoint_exportable", "mamba.checkpoint_position",
    "mamba.exported_checkpoint",
    "mamba.aligned_chunk_end",  # tests/test_mamba_align_spec.py
    # KV-MAMBA-018: tests/test_mamba_runner_view.py
    "mamba.state_entry", "mamba.step_states", "mamba.passed_pages", "mamba.keyed_before_boundary",
    "mamba.checkpoint_entry_free",  # there, and through reserved_checkpoint, which calls it
    # KV-MAMBA-019 .. 025 (partial hits): tests/test_mamba_partial_spec.py
    "mamba.partial_hits_enabled", "mamba.hit_alignment", "mamba.partial_hit_length", "mamba.shared_entry",
    "mamba.tail_entry", "mamba.checkpoint_keeps_key", "mamba.copy_action", "mamba.copy_pages",
    "mamba.copy_need", "mamba.copy_ref_counts", "mamba.tail_chunk_end",
    "mamba.start_entry", "mamba.states_after_copies",  # KV-MAMBA-026, the same file
    # prefix_tree (chapter 14): property-tested in tests/test_prefix_tree_spec.py
    "prefix_tree.is_aligned_hit", "prefix_tree.longest_held_prefix", "prefix_tree.misread_positions",
    "prefix_tree.foreign_positions", "prefix_tree.is_prefix_closed", "prefix_tree.evicted_enough",
    "prefix_tree.evicts_no_locked_page", "prefix_tree.lru_leaf_order", "prefix_tree.removes_an_lru_prefix",
    "prefix_tree.pages_stamped", "prefix_tree.capacity_balances", "prefix_tree.same_content",
    "prefix_tree.cache_sizes", "prefix_tree.locked_counts", "prefix_tree.first_invalid_tree_parameter",
    "prefix_tree.window_pages", "prefix_tree.window_hit_ok", "prefix_tree.longest_windowed_hit",
    "prefix_tree.window_locked_pages", "prefix_tree.window_eviction_ok", "prefix_tree.window_slots_balance",
    "prefix_tree.state_hit_ok", "prefix_tree.longest_state_hit", "prefix_tree.state_eviction_ok",
    "prefix_tree.state_locked_pages", "prefix_tree.insertion_leaves_state", "prefix_tree.insertion_adopts_state",
    "prefix_tree.state_removals_ok", "prefix_tree.state_slots_balance",
    "prefix_tree.window_refresh_reach", "prefix_tree.segments_reached", "prefix_tree.component_lru_order",
    "prefix_tree.drops_an_order_prefix",
}


needs_contracts = pytest.mark.skipif(
    not contracts.ENABLED, reason="contracts switched off with KVORACLE_CONTRACTS=0"
)


@needs_contracts
def test_every_contracted_function_is_tested() -> None:
    assert set(contracted_functions()) == TESTED


@needs_contracts
def test_icontract_is_armed() -> None:
    """Contracts are checked in this process (no backend has switched them off)."""
    with pytest.raises(icontract.ViolationError):
        full_attention.longest_cached_run((True,), 4, 0)


# --------------------------------------------------------------------------- registry


def test_rules_are_well_formed() -> None:
    rules = registry.all_rules()
    assert rules, "no rule is registered"
    ids = [r.id for r in rules]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    chapters = {c.CHAPTER for c in spec.CHAPTERS}
    for r in rules:
        assert registry.RULE_ID_PATTERN.fullmatch(r.id), r.id
        assert r.area == r.id.split("-")[1]
        for attribute in ("title", "text", "source"):
            value = getattr(r, attribute)
            assert isinstance(value, str) and value.strip(), f"{r.id}: empty {attribute}"
        assert r.chapter in chapters, r
        assert r.kind in registry.RULE_KINDS, r
        assert registry.get_rule(r.id) is r


def test_unknown_rule_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="KV-NOPE-999"):
        registry.get_rule("KV-NOPE-999")


def test_defined_rules_exist() -> None:
    for chapter in spec.CHAPTERS:
        for fn in vars(chapter).values():
            for rule_id in getattr(fn, "__kvoracle_rules__", ()):
                assert registry.get_rule(rule_id).id == rule_id


def test_spec_imports_without_torch() -> None:
    program = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise SystemExit("the torch guard does not work")
        import kvoracle.spec
        from kvoracle.spec import block_pool, config, full_attention, hashing, lifecycle
        assert sys.modules["torch"] is None
        print("spec imported without torch")
        """
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "spec imported without torch" in proc.stdout


# --------------------------------------------------------------------------- config

VALID_BLOCK_SIZE = 16
PARAMETERS = ("num_blocks", "block_size", "max_model_len", "hash_block_size")


@st.composite
def valid_configs(draw):
    block_size = draw(positive)
    divisors = [d for d in range(1, block_size + 1) if block_size % d == 0]
    single_group_caching = draw(st.booleans())
    hash_block_size = block_size if single_group_caching else draw(st.sampled_from(divisors))
    return {
        "num_blocks": draw(st.integers(min_value=2, max_value=10_000)),
        "block_size": block_size,
        "max_model_len": draw(st.integers(min_value=1, max_value=10**6)),
        "hash_block_size": hash_block_size,
        "single_group_caching": single_group_caching,
    }


def expected_error(cfg) -> tuple[str, str] | None:
    """(parameter, rule id) of the first impossible parameter, from the rules' prose."""
    if cfg["num_blocks"] < 2:
        return "num_blocks", "KV-CFG-001"
    if cfg["block_size"] <= 0:
        return "block_size", "KV-CFG-002"
    if cfg["max_model_len"] <= 0:
        return "max_model_len", "KV-CFG-003"
    hbs, bs = cfg["hash_block_size"], cfg["block_size"]
    divides = hbs > 0 and any(hbs * k == bs for k in range(1, bs + 1))
    if not divides or (cfg["single_group_caching"] and hbs != bs):
        return "hash_block_size", "KV-CFG-004"
    return None


def assert_rejects(cfg, parameter: str, rule_id: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(**cfg)
    assert info.value.parameter == parameter
    assert info.value.rule_id == rule_id
    assert str(info.value).startswith(f"{rule_id}: {parameter}: ")
    assert isinstance(info.value, ValueError)


@SETTINGS
@given(valid_configs())
def test_valid_configs_are_accepted(cfg) -> None:
    assert validate_config(**cfg) is None
    assert config.first_invalid_parameter(**cfg) == ""


@SETTINGS
@given(valid_configs(), st.integers(max_value=1))
def test_num_blocks_below_two_is_rejected(cfg, num_blocks) -> None:
    assert_rejects({**cfg, "num_blocks": num_blocks}, "num_blocks", "KV-CFG-001")


@SETTINGS
@given(valid_configs(), st.integers(max_value=0))
def test_non_positive_block_size_is_rejected(cfg, block_size) -> None:
    assert_rejects({**cfg, "block_size": block_size}, "block_size", "KV-CFG-002")


@SETTINGS
@given(valid_configs(), st.integers(max_value=0))
def test_non_positive_max_model_len_is_rejected(cfg, max_model_len) -> None:
    assert_rejects({**cfg, "max_model_len": max_model_len}, "max_model_len", "KV-CFG-003")


@SETTINGS
@given(valid_configs(), st.integers(min_value=-8, max_value=40), st.booleans())
def test_hash_block_size_must_divide_block_size(cfg, hash_block_size, single) -> None:
    bs = cfg["block_size"]
    assume(hash_block_size <= 0 or bs % hash_block_size != 0)
    cfg = {**cfg, "hash_block_size": hash_block_size, "single_group_caching": single}
    assert_rejects(cfg, "hash_block_size", "KV-CFG-004")


@SETTINGS
@given(valid_configs(), st.sampled_from([1, 2, 4, 8]))
def test_one_group_with_caching_needs_equal_hash_block_size(cfg, divisor) -> None:
    cfg = {**cfg, "block_size": VALID_BLOCK_SIZE, "hash_block_size": VALID_BLOCK_SIZE // divisor}
    if divisor == 1:
        validate_config(**{**cfg, "single_group_caching": True})
    else:
        assert_rejects({**cfg, "single_group_caching": True}, "hash_block_size", "KV-CFG-004")
    validate_config(**{**cfg, "single_group_caching": False})


@SETTINGS
@given(st.integers(-3, 20), st.integers(-3, 20), st.integers(-3, 20), st.integers(-3, 20),
       st.booleans())
def test_the_first_impossible_parameter_is_named(nb, bs, mml, hbs, single) -> None:
    cfg = {"num_blocks": nb, "block_size": bs, "max_model_len": mml, "hash_block_size": hbs,
           "single_group_caching": single}
    expected = expected_error(cfg)
    assert config.first_invalid_parameter(**cfg) == (expected[0] if expected else "")
    if expected is None:
        validate_config(**cfg)
    else:
        assert_rejects(cfg, *expected)


@pytest.mark.parametrize("parameter", PARAMETERS)
@pytest.mark.parametrize("value", [True, 2.0, "16", None])
def test_non_int_parameters_are_rejected(parameter, value) -> None:
    cfg = {"num_blocks": 8, "block_size": 16, "max_model_len": 64, "hash_block_size": 16}
    rule_id = {"num_blocks": "KV-CFG-001", "block_size": "KV-CFG-002",
               "max_model_len": "KV-CFG-003", "hash_block_size": "KV-CFG-004"}[parameter]
    assert_rejects({**cfg, parameter: value}, parameter, rule_id)


@SETTINGS
@given(st.integers() | st.booleans() | st.floats(allow_nan=False) | st.none())
def test_token_counts_are_non_negative_ints(value) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        assert config.require_non_negative("num_new_tokens", value) is None
    else:
        with pytest.raises(ConfigError) as info:
            config.require_non_negative("num_new_tokens", value)
        assert (info.value.rule_id, info.value.parameter) == ("KV-CFG-005", "num_new_tokens")


# --------------------------------------------------------------------------- hashing


def hashes_of(tokens, hbs, salt=None, lora=None):
    return hashing.extend_block_hashes((), tokens, hbs, cache_salt=salt, lora_name=lora)


@st.composite
def token_pairs(draw):
    """Two token lists that often share a prefix (and so some hashes)."""
    a = draw(tokens_st)
    cut = draw(st.integers(min_value=0, max_value=len(a)))
    b = a[:cut] + draw(tokens_st)
    return (a, b) if draw(st.booleans()) else (b, a)


@SETTINGS
@given(small, positive)
def test_num_block_hashes_counts_full_blocks(num_tokens, hbs) -> None:
    full_blocks = sum(1 for end in range(hbs, num_tokens + 1, hbs))
    assert hashing.num_block_hashes(num_tokens, hbs) == full_blocks


@SETTINGS
@given(tokens_st, positive, salts, salts)
def test_hashes_cover_full_blocks_only(tokens, hbs, salt, lora) -> None:
    hashes = hashes_of(tokens, hbs, salt, lora)
    assert len(hashes) == len(tokens) // hbs
    assert all(isinstance(h, bytes) and len(h) == 32 for h in hashes)


@SETTINGS
@given(tokens_st, tokens_st, positive, salts, salts)
def test_hashes_are_prefix_stable(tokens, more, hbs, salt, lora) -> None:
    before = hashes_of(tokens, hbs, salt, lora)
    after = hashes_of(tokens + more, hbs, salt, lora)
    assert after[:len(before)] == before
    # Extending incrementally from the old hashes gives the same list (KV-HASH-003).
    extended = hashing.extend_block_hashes(before, tokens + more, hbs, salt, lora)
    assert extended == after


@SETTINGS
@given(tokens_st, positive, salts, salts)
def test_hashes_are_chained_from_none_hash(tokens, hbs, salt, lora) -> None:
    parent = hashing.NONE_HASH
    for i, h in enumerate(hashes_of(tokens, hbs, salt, lora)):
        block = tokens[i * hbs:(i + 1) * hbs]
        assert h == hashing.hash_block(parent, block, hashing.block_extra_keys(i, salt, lora))
        parent = h


@SETTINGS
@given(token_pairs(), positive)
def test_a_hash_identifies_the_whole_prefix(pair, hbs) -> None:
    a, b = pair
    ha, hb = hashes_of(a, hbs), hashes_of(b, hbs)
    for i in range(min(len(ha), len(hb))):
        end = (i + 1) * hbs
        assert (ha[i] == hb[i]) == (a[:end] == b[:end]), i
        assert hashing.prefixes_share_hash(a, b, i, hbs) == (ha[i] == hb[i])
    for i in range(min(len(ha), len(hb)), max(len(ha), len(hb)) + 1):
        assert not hashing.prefixes_share_hash(a, b, i, hbs)


@SETTINGS
@given(token_pairs(), positive, salts, salts, salts)
def test_different_salts_never_share_a_hash(pair, hbs, salt_a, salt_b, lora) -> None:
    # An empty salt is no salt (KV-HASH-007, as vLLM 0.33.0 hashes it).
    assume((salt_a or None) != (salt_b or None))
    a, b = pair
    ha, hb = hashes_of(a, hbs, salt_a, lora), hashes_of(b, hbs, salt_b, lora)
    assert all(x != y for x, y in zip(ha, hb, strict=False))
    # The same request with the same salt hashes the same.
    assert hashes_of(a, hbs, salt_a, lora) == ha


def test_an_empty_salt_is_no_salt() -> None:
    tokens = (1, 2, 3, 4, 5)
    assert hashing.extend_block_hashes((), tokens, 2, cache_salt="") == \
        hashing.extend_block_hashes((), tokens, 2, cache_salt=None)
    assert hashing.block_extra_keys(0, "", None) == ()


@SETTINGS
@given(tokens_st, positive, salts, salts, salts)
def test_different_lora_names_never_share_a_hash(tokens, hbs, salt, lora_a, lora_b) -> None:
    assume(lora_a != lora_b)
    ha, hb = hashes_of(tokens, hbs, salt, lora_a), hashes_of(tokens, hbs, salt, lora_b)
    assert all(x != y for x, y in zip(ha, hb, strict=False))


@SETTINGS
@given(small, salts, salts)
def test_extra_keys(block_index, salt, lora) -> None:
    keys = hashing.block_extra_keys(block_index, salt, lora)
    expected = []
    if lora is not None:
        expected.append("lora:" + lora)  # the LoRA name enters every block
    if salt and block_index == 0:
        expected.append("salt:" + salt)  # a non-empty salt enters block 0 only
    assert Counter(keys) == Counter(expected)


@SETTINGS
@given(small, positive)
def test_block_size_view_index_is_the_last_unit_of_the_block(block_index, scale) -> None:
    units = range(block_index * scale, (block_index + 1) * scale)  # units inside the block
    assert hashing.block_size_view_index(block_index, scale) == units[-1]


@SETTINGS
@given(small, positive)
def test_block_size_view_length_counts_whole_blocks(num_hashes, scale) -> None:
    whole = [j for j in range(num_hashes + 1)
             if all(u < num_hashes for u in range(j * scale, (j + 1) * scale))]
    assert hashing.block_size_view_length(num_hashes, scale) == len(whole)


@SETTINGS
@given(token_pairs(), st.integers(1, 4), st.integers(1, 4))
def test_block_size_view_identifies_coarse_prefixes(pair, hbs, scale) -> None:
    """A group with block_size = scale * hbs sees one hash per coarse block, and it
    identifies the prefix up to the end of that coarse block."""
    a, b = pair
    block_size = scale * hbs

    def view(tokens):
        fine = hashes_of(tokens, hbs)
        n = hashing.block_size_view_length(len(fine), scale)
        return [fine[hashing.block_size_view_index(j, scale)] for j in range(n)]

    va, vb = view(a), view(b)
    assert len(va) == len(a) // block_size and len(vb) == len(b) // block_size
    for j in range(min(len(va), len(vb))):
        end = (j + 1) * block_size
        assert (va[j] == vb[j]) == (a[:end] == b[:end])


# --------------------------------------------------------------------------- block pool

block_ids = st.integers(min_value=1, max_value=64)


@st.composite
def queue_and_released(draw):
    ids = draw(st.lists(block_ids, unique=True, max_size=20))
    cut = draw(st.integers(min_value=0, max_value=len(ids)))
    queue, released = tuple(ids[:cut]), tuple(ids[cut:])
    hashed = tuple(draw(st.lists(st.booleans(), min_size=len(released),
                                 max_size=len(released))))
    return queue, released, hashed


@SETTINGS
@given(st.lists(block_ids, unique=True, max_size=20).map(tuple), st.data())
def test_pop_front(queue, data) -> None:
    n = data.draw(st.integers(min_value=0, max_value=len(queue)))
    taken, left = block_pool.pop_front(queue, n)
    assert len(taken) == n
    assert list(taken) == [queue[i] for i in range(n)]
    assert list(left) == [queue[i] for i in range(n, len(queue))]


@SETTINGS
@given(queue_and_released())
def test_queue_after_release(case) -> None:
    queue, released, hashed = case
    result = block_pool.queue_after_release(queue, released, hashed)
    # Every block exactly once.
    assert Counter(result) == Counter(queue) + Counter(released)
    assert len(set(result)) == len(result)
    # Unhashed to the front, hashed to the back, each in the order given; queue kept.
    unhashed = [b for b, h in zip(released, hashed, strict=True) if not h]
    on_back = [b for b, h in zip(released, hashed, strict=True) if h]
    assert list(result) == unhashed + list(queue) + on_back
    # Caching off: nothing is hashed, so everything freed goes to the front.
    all_front = block_pool.queue_after_release(queue, released, (False,) * len(released))
    assert list(all_front) == list(released) + list(queue)



@SETTINGS
@given(queue_and_released())
def test_queue_after_append(case) -> None:
    queue, released, hashed = case
    result = block_pool.queue_after_append(queue, released)
    # Every block exactly once, the queue kept in front and the freed blocks behind it in the
    # order given, hashed or not (KV-POOL-016).
    assert Counter(result) == Counter(queue) + Counter(released)
    assert list(result[:len(queue)]) == list(queue) and list(result[len(queue):]) == list(released)
    # The two orders agree exactly when every freed block is hashed.
    if all(hashed):
        assert result == block_pool.queue_after_release(queue, released, hashed)

@SETTINGS
@given(st.lists(st.integers(min_value=0, max_value=8), max_size=16).map(tuple))
def test_free_order(table) -> None:
    result = block_pool.free_order(table)
    expected = []
    for i in range(len(table) - 1, -1, -1):
        if table[i] != 0:
            expected.append(table[i])
    assert list(result) == expected
    assert Counter(result) == Counter(b for b in table if b != 0)


@SETTINGS
@given(st.lists(block_ids, unique=True, max_size=20).map(tuple),
       st.lists(block_ids, max_size=10).map(tuple))
def test_queue_after_touch(queue, touched) -> None:
    result = block_pool.queue_after_touch(queue, touched)
    assert list(result) == [b for b in queue if b not in touched]
    # Order kept: result is a subsequence of the queue.
    it = iter(queue)
    assert all(b in it for b in result)


@st.composite
def pool_state(draw):
    n = draw(st.integers(min_value=0, max_value=10))
    ref_counts = tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    free = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return ref_counts, free


@SETTINGS
@given(pool_state())
def test_free_iff_unreferenced(state) -> None:
    ref_counts, free = state
    expected = all(
        (not free[i]) if i == 0 else ((ref_counts[i] == 0) == free[i])
        for i in range(len(ref_counts))
    )
    assert block_pool.free_iff_unreferenced(ref_counts, free) == expected


@SETTINGS
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=6).map(tuple), st.data())
def test_null_count_untouched(ref_counts, data) -> None:
    # Only block 0's count decides (KV-POOL-017); the others are KV-POOL-011's.
    others = tuple(data.draw(st.lists(st.integers(-3, 3), min_size=len(ref_counts) - 1,
                                      max_size=len(ref_counts) - 1)))
    assert block_pool.null_count_untouched((ref_counts[0], *others)) == block_pool.null_count_untouched(ref_counts)
    assert block_pool.null_count_untouched((0, *others))
    assert not block_pool.null_count_untouched((ref_counts[0] or 1, *others))
    assert block_pool.null_count_untouched(())


@SETTINGS
@given(pool_state(), st.data())
def test_refcounts_balanced(state, data) -> None:
    ref_counts, _ = state
    n = len(ref_counts)
    occurrences = tuple(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    expected = all(ref_counts[i] == occurrences[i] for i in range(1, n))
    assert block_pool.refcounts_balanced(ref_counts, occurrences) == expected
    # A balanced pool: counts taken from the occurrences, whatever the null block's count
    # (KV-POOL-017 judges that one).
    if n:
        null_count = data.draw(st.integers(-3, 3))
        assert block_pool.refcounts_balanced((null_count, *occurrences[1:]), occurrences)


@SETTINGS
@given(st.integers(min_value=2, max_value=10**9), st.data())
def test_usage_and_reset(num_blocks, data) -> None:
    num_free = data.draw(st.integers(min_value=0, max_value=num_blocks - 1))
    used = num_blocks - 1 - num_free
    u = block_pool.usage(num_free, num_blocks)
    assert 0.0 <= u <= 1.0
    assert u == pytest.approx(used / (num_blocks - 1), abs=1e-12)
    assert (u == 0.0) == (used == 0)
    assert (u == 1.0) == (num_free == 0)
    assert block_pool.can_reset_prefix_cache(num_free, num_blocks) == (used == 0)


@SETTINGS
@given(st.lists(block_ids, min_size=1, max_size=6).map(tuple))
def test_lookup_returns_the_first_cached_block(cached_under_key) -> None:
    assert block_pool.lookup_block(cached_under_key) == cached_under_key[0]


# --------------------------------------------------------------------------- full attention


def brute_longest_run(cached, max_length, block_size) -> int:
    """Greatest k <= min(len(cached), max_length // block_size) with all(cached[:k])."""
    bound = min(len(cached), max_length // block_size)
    return max(k for k in range(bound + 1) if all(cached[:k]))


@SETTINGS
@given(bools, small, positive)
def test_longest_cached_run_is_the_longest_prefix(cached, max_length, block_size) -> None:
    run = full_attention.longest_cached_run(cached, max_length, block_size)
    assert run == brute_longest_run(cached, max_length, block_size)


@SETTINGS
@given(bools, small, small, positive, st.data())
def test_longest_cached_run_is_monotone(cached, max_a, max_b, block_size, data) -> None:
    lo, hi = sorted((max_a, max_b))
    assert (full_attention.longest_cached_run(cached, lo, block_size)
            <= full_attention.longest_cached_run(cached, hi, block_size))
    more = tuple(c or data.draw(st.booleans()) for c in cached)  # cache more keys
    assert (full_attention.longest_cached_run(cached, hi, block_size)
            <= full_attention.longest_cached_run(more, hi, block_size))


@SETTINGS
@given(bools, small, positive, st.booleans())
def test_full_attention_hit_length(cached, max_length, block_size, use_eagle) -> None:
    hit = full_attention.full_attention_hit_length(cached, max_length, block_size, use_eagle)
    blocks = brute_longest_run(cached, max_length, block_size)
    if use_eagle:
        blocks = max(blocks - 1, 0)  # one block dropped from a non-empty hit
    assert hit == blocks * block_size
    assert hit % block_size == 0 and 0 <= hit <= max_length


@SETTINGS
@given(small, positive)
def test_align_hit_rounds_down(hit_length, alignment) -> None:
    expected = max(m for m in range(0, hit_length + 1, alignment))
    assert full_attention.align_hit(hit_length, alignment) == expected


# --------------------------------------------------------------------------- lifecycle


@SETTINGS
@given(st.integers(min_value=1, max_value=10**6))
def test_max_cache_hit_length(num_tokens) -> None:
    assert lifecycle.max_cache_hit_length(num_tokens) == num_tokens - 1


@SETTINGS
@given(small, positive)
def test_cdiv(a, b) -> None:
    assert lifecycle.cdiv(a, b) == min(q for q in range(a + 1) if q * b >= a)


@SETTINGS
@given(small, small, small, small, st.integers(min_value=1, max_value=100))
def test_num_slots(computed, hit, new, lookahead, max_model_len) -> None:
    total = computed + hit + new + lookahead
    expected = total if total <= max_model_len else max_model_len
    assert lifecycle.num_slots(computed, hit, new, lookahead, max_model_len) == expected


@SETTINGS
@given(small, positive, st.integers(0, 6), st.integers(0, 6), st.data())
def test_num_blocks_to_allocate(slots, block_size, held, hits, data) -> None:
    evictable = data.draw(st.integers(min_value=0, max_value=hits))
    # Simulate: the table holds the held and the hit blocks; append new blocks until the
    # slots fit. Touching an evictable hit takes one more block off the free queue.
    table, new = held + hits, 0
    while table * block_size < slots:
        table, new = table + 1, new + 1
    assert lifecycle.num_blocks_to_allocate(slots, block_size, held, hits, evictable) \
        == new + evictable


@SETTINGS
@given(small, small, small, small)
def test_num_tokens_to_cache(computed, hit, new, num_tokens) -> None:
    cached = lifecycle.num_tokens_to_cache(computed, hit, new, num_tokens)
    assert cached == sorted([computed + hit + new, num_tokens])[0]


@SETTINGS
@given(small, small, st.integers(1, 4), st.integers(1, 4))
def test_num_full_blocks_to_cache(tokens_to_cache, num_hashes, hbs, scale) -> None:
    block_size = hbs * scale
    hashed_tokens = num_hashes * hbs
    expected = max(k for k in range(tokens_to_cache + 1)
                   if k * block_size <= tokens_to_cache and k * block_size <= hashed_tokens)
    got = lifecycle.num_full_blocks_to_cache(tokens_to_cache, num_hashes, hbs, block_size)
    assert got == expected


@SETTINGS
@given(st.lists(st.integers(0, 3), max_size=12).map(tuple), st.integers(0, 3))
def test_num_common_prefix_blocks(ref_counts, holding) -> None:
    expected = max(k for k in range(len(ref_counts) + 1)
                   if all(c == holding for c in ref_counts[:k]))
    assert lifecycle.num_common_prefix_blocks(ref_counts, holding) == expected


@SETTINGS
@given(small, small, small)
def test_allocation_is_empty(new, new_computed, external) -> None:
    empty = lifecycle.allocation_is_empty(new, new_computed, external)
    assert empty == (new + new_computed + external == 0)
    assert lifecycle.allocation_is_empty(new, new_computed) == (new + new_computed == 0)


# --------------------------------------------------------------------------- data integrity


@given(prefix=st.integers(-(1 << 63), (1 << 63) - 1), token=st.integers(0, 1 << 20),
       position=st.integers(0, 1 << 20))
def test_slot_value_is_never_the_unwritten_marker(prefix: int, token: int, position: int) -> None:
    from kvoracle.spec import data_integrity
    assert data_integrity.slot_value(prefix, token, position) != data_integrity.UNWRITTEN


@given(expected=st.integers(-5, 5), actual=st.integers(-5, 5), written_at=st.integers(0, 4),
       relied_since=st.integers(0, 4), from_hit=st.booleans())
def test_slot_violation_names_a_data_rule_exactly_when_the_slot_is_wrong(
        expected: int, actual: int, written_at: int, relied_since: int, from_hit: bool) -> None:
    from kvoracle.spec import data_integrity
    result = data_integrity.slot_violation(expected, actual, written_at, relied_since, from_hit)
    assert (result is None) == (expected == actual)
    assert result in (None, "KV-DATA-001", "KV-DATA-002", "KV-DATA-003")


@given(values=st.lists(st.integers(-3, 3), max_size=6), index=st.integers(0, 5))
def test_block_and_null_block_checks(values: list[int], index: int) -> None:
    from kvoracle.spec import data_integrity
    expected = tuple(values)
    assert data_integrity.cached_block_intact(expected, expected)
    if expected:
        changed = list(expected)
        changed[index % len(changed)] += 1
        assert not data_integrity.cached_block_intact(expected, tuple(changed))
    assert data_integrity.null_block_unwritten((data_integrity.UNWRITTEN,) * len(values)) is True
    assert data_integrity.null_block_unwritten(expected) == all(v == data_integrity.UNWRITTEN for v in values)


@given(tokens=st.lists(st.integers(0, 5), max_size=8), split=st.integers(0, 8), salt=st.sampled_from([None, "s"]))
def test_a_state_is_its_prefixs_last_slot_value_and_resuming_changes_nothing(
        tokens: list[int], split: int, salt: str | None) -> None:
    """KV-DATA-007's stand-in recurrence: the state after a prefix is the slot value of its last token,
    and folding the tokens past ``split`` into the state after the first ``split`` gives the same state as
    running from the start; a state read wrong stays wrong."""
    from kvoracle.spec import data_integrity
    seed = data_integrity.prefix_seed(salt)
    whole = data_integrity.state_after(seed, tuple(tokens), 0)
    values = data_integrity.extend_prefix_values((), tokens, salt)
    assert whole == (values[-1] if tokens else seed)
    split = min(split, len(tokens))
    resumed = data_integrity.state_after(data_integrity.state_after(seed, tuple(tokens[:split]), 0),
                                         tuple(tokens), split)
    assert resumed == whole
    if split < len(tokens):
        assert data_integrity.state_after(seed ^ 2, tuple(tokens), split) != whole


@given(expected=st.lists(st.integers(-3, 3), max_size=5), index=st.integers(0, 4))
def test_first_wrong_state_finds_the_first_slot_that_differs(expected: list[int], index: int) -> None:
    from kvoracle.spec import data_integrity
    assert data_integrity.first_wrong_state(tuple(expected), tuple(expected)) == -1
    if expected:
        changed = list(expected)
        changed[index % len(changed)] += 1
        assert data_integrity.first_wrong_state(tuple(expected), tuple(changed)) == index % len(changed)


@given(kind=st.sampled_from(["full", "sliding_window", "chunked_local"]), param=st.integers(1, 9),
       num_tokens=st.integers(0, 40), later=st.integers(0, 10))
def test_first_relied_position_only_moves_forward_and_keeps_the_window(
        kind: str, param: int, num_tokens: int, later: int) -> None:
    """The relied-on suffix starts where the group's skipped tokens end, never moves back
    as tokens are computed (a block given up is never relied on again), and holds what the
    next token attends to: every position for full attention, window - 1 positions for a
    sliding window, the current chunk for chunked local attention."""
    from kvoracle.spec import data_integrity, hybrid_lifecycle
    first = data_integrity.first_relied_position(kind, param, num_tokens)
    assert first == hybrid_lifecycle.skipped_tokens(kind, param, num_tokens)
    assert first <= data_integrity.first_relied_position(kind, param, num_tokens + later)
    relied = num_tokens - first
    expected = {"full": num_tokens, "sliding_window": min(num_tokens, param - 1),
                "chunked_local": num_tokens % param}[kind]
    assert relied == expected


@given(st.integers(0, 64), st.integers(0, 8))
def test_a_lagging_mamba_group_frees_as_if_its_drafts_were_rejected(num_computed: int, num_speculative: int) -> None:
    """KV-HLC-009: the computed tokens less num_speculative_blocks, never below 0, and so never
    more skipped tokens than KV-HLC-008's."""
    from kvoracle.spec import hybrid_lifecycle
    lagged = hybrid_lifecycle.lagging_mamba_tokens(num_computed, num_speculative)
    assert lagged == max(0, num_computed - num_speculative)
    assert (hybrid_lifecycle.skipped_tokens("mamba", 0, lagged)
            <= hybrid_lifecycle.skipped_tokens("mamba", 0, num_computed))
