"""The vLLM adapter against vLLM 0.33's real KVCacheManager.

Skipped unless vLLM 0.33.x is importable: install it with
``scripts/install_vllm.sh`` and run ``.venv-vllm/bin/python -m pytest tests/test_vllm_adapter.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed; run scripts/install_vllm.sh and use .venv-vllm")
if not str(vllm.__version__).startswith("0.33."):
    pytest.skip(f"the vLLM adapter supports vLLM 0.33.x, found {vllm.__version__}",
                allow_module_level=True)

from kvoracle.conformance.adapter import UNKNOWN_HASH, EngineAdapter  # noqa: E402
from kvoracle.conformance.engines import EngineLoadError  # noqa: E402
from kvoracle.conformance.engines import vllm as vllm_engine  # noqa: E402
from kvoracle.conformance.engines.vllm import VllmEngine  # noqa: E402
from kvoracle.conformance.harness.expectations import expectations_for  # noqa: E402
from kvoracle.conformance.harness.runner import RunOptions, run_suite  # noqa: E402
from kvoracle.reference import ManagerConfig  # noqa: E402
from kvoracle.spec.hashing import extend_block_hashes  # noqa: E402

GOOD = {"pass", "expected-fail", "not-applicable"}


def _engine(**config: object) -> VllmEngine:
    engine = VllmEngine()
    engine.configure(ManagerConfig(**{"num_blocks": 8, "block_size": 2, "max_model_len": 16,
                                      **config}))
    return engine


def _run(engine: VllmEngine, request_id: str, prompt: tuple[int, ...]) -> tuple[int, ...]:
    """Add a request and compute its whole prompt, as the scheduler would."""
    engine.add_request(request_id, prompt)
    hit = engine.lookup(request_id)
    new = engine.allocate(request_id, len(prompt) - hit.num_tokens, hit.num_tokens)
    assert new is not None
    engine.advance(request_id, len(prompt) - hit.num_tokens)
    return engine.observe().block_tables[request_id][0]


def test_vllm_conforms_within_a_bounded_run(tmp_path: Path) -> None:
    expectations = expectations_for(VllmEngine(), "lockstep")
    result = run_suite("vllm", RunOptions(max_examples=120, replay_dir=tmp_path),
                       expectations=expectations, suite="lockstep")
    outcomes = {rule: o.outcome for rule, o in result.verdicts.outcomes.items()}
    assert result.engine_version.startswith("0.33.")
    assert result.internal_errors == []
    assert set(outcomes.values()) <= GOOD, {r: o for r, o in outcomes.items() if o not in GOOD}
    assert result.ok
    for rule_id in expectations or {}:
        assert outcomes[rule_id] == "expected-fail", rule_id
    # Lookups, allocation order, free order and the cache map are judged, not skipped.
    for rule_id in ("KV-FULL-001", "KV-FULL-002", "KV-POOL-004", "KV-POOL-006", "KV-POOL-009",
                    "KV-LIFE-003", "KV-LIFE-007", "KV-HASH-004", "KV-HASH-007"):
        assert outcomes[rule_id] == "pass", rule_id
    assert not list(tmp_path.iterdir())  # no counterexample


def test_adapter_satisfies_the_protocol_and_reports_the_version() -> None:
    engine = VllmEngine()
    assert isinstance(engine, EngineAdapter)
    assert engine.version() == vllm.__version__
    assert engine.capabilities().common_prefix == "zero"


def test_a_computed_prefix_is_hit_by_the_next_request() -> None:
    engine = _engine()
    table = _run(engine, "a", (1, 2, 3, 4, 5))
    assert table == (1, 2, 3)
    engine.add_request("b", (1, 2, 3, 4, 9, 9))
    hit = engine.lookup("b")
    assert (hit.block_ids, hit.num_tokens) == (((1, 2),), 4)  # live blocks, shared
    assert engine.allocate("b", 2, hit.num_tokens) == ((4,),)
    observed = engine.observe()
    assert observed.block_tables["b"] == ((1, 2, 4),)
    assert observed.ref_counts[1] == observed.ref_counts[2] == 2
    # A different salt never shares a hash, so it never hits.
    engine.add_request("c", (1, 2, 3, 4, 9), cache_salt="salt-1")
    assert engine.lookup("c").num_tokens == 0


def test_free_releases_the_tail_first_and_keeps_hashed_blocks_last() -> None:
    engine = _engine()
    _run(engine, "a", (1, 2, 3, 4, 5))  # blocks 1, 2 full and cached; 3 partial
    engine.free("a")
    observed = engine.observe()
    assert observed.free_queue == (3, 4, 5, 6, 7, 2, 1)
    assert observed.block_tables == {}
    # The freed prefix is still cached and hit from the free queue.
    engine.add_request("b", (1, 2, 3, 4, 5, 6))
    assert engine.lookup("b").block_ids == ((1, 2),)


def test_cache_keys_translate_to_kvoracle_prefix_hashes() -> None:
    engine = _engine()
    _run(engine, "a", (1, 2, 3, 4, 5))
    ours = extend_block_hashes((), (1, 2, 3, 4, 5), 2)
    observed = engine.observe()
    assert observed.cached == {(ours[0], 0): (1,), (ours[1], 0): (2,)}
    assert not any(key.startswith(UNKNOWN_HASH) for key, _ in observed.cached)
    assert observed.request_hashes is not None
    assert len(observed.request_hashes["a"]) == 2  # the engine's own hashes, full blocks only


def test_preemption_resets_computed_tokens_and_the_request_hits_its_own_blocks() -> None:
    engine = _engine()
    _run(engine, "a", (1, 2, 3, 4, 5))
    engine.free("a", preempted=True)
    request = engine.requests["a"]
    assert request.num_computed_tokens == 0
    assert engine.lookup("a").block_ids == ((1, 2),)


def test_a_release_older_than_the_adapters_know_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "_VLLM", None)
    monkeypatch.setattr(vllm, "__version__", "0.13.0")
    with pytest.raises(EngineLoadError, match=r"0\.13\.0.*vLLM 0\.14 and later.*install_vllm\.sh"):
        VllmEngine()


def test_any_later_release_is_driven_by_what_it_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No version gate: a release the adapters never saw is driven by feature detection."""
    monkeypatch.setattr(vllm_engine, "_VLLM", None)
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    engine = VllmEngine()
    assert engine.version() == "0.99.0"
