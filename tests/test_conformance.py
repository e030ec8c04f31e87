"""Tests of the conformance machinery itself: runner, verdicts, replay, CLI, plugin, layout."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import broken_engines
import icontract
import pytest

from kvoracle.conformance import steps as s
from kvoracle.conformance.adapter import Capabilities, EngineAdapter
from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness.engines import EngineLoadError, engine_factory, engine_spec_of
from kvoracle.conformance.harness.replay import replay, write_replay
from kvoracle.conformance.harness.runner import RunOptions, run_suite
from kvoracle.conformance.harness.suites import capabilities_of, get_suite
from kvoracle.conformance.harness.verdicts import (
    Counterexample,
    RuleViolation,
    Verdicts,
    applicability,
)
from kvoracle.conformance.manager.what_if import what_if
from kvoracle.reference import BlockPool, ManagerConfig
from kvoracle.spec import ConfigError, all_rules
from kvoracle.spec.contracts import can_suspend, is_suspended

REPO = Path(__file__).parent.parent


def _cli(*args: str, cwd: Path | None = None, env: dict | None = None
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvoracle", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


# -- the reference passes its own suite ------------------------------------------------------
def test_reference_conforms_and_every_applicable_rule_is_exercised(tmp_path: Path) -> None:
    # 200 examples: at 150, seed 0 drew no caching-off Mamba group that reached KV-HLC-008 once the
    # partial-hit models joined the draws (one align-mode model in three).
    result = run_suite("reference", RunOptions(max_examples=200, replay_dir=tmp_path))
    outcomes = {rule: o.outcome for rule, o in result.verdicts.outcomes.items()}
    assert result.ok, outcomes
    assert result.internal_errors == []
    assert set(outcomes.values()) == {"pass", "not-applicable"}
    assert not list(tmp_path.iterdir())  # no counterexample, no replay file


def test_reference_adapter_satisfies_the_protocol() -> None:
    assert isinstance(ReferenceEngine(), EngineAdapter)


# -- verdicts --------------------------------------------------------------------------------
def test_rules_needing_unclaimed_capabilities_are_not_applicable_never_passed() -> None:
    caps = Capabilities(exact_block_ids=False, eagle=False, common_prefix="cascade")
    assert applicability("KV-POOL-004", caps) == "engine does not claim exact_block_ids"
    assert applicability("KV-FULL-003", caps) == "engine does not claim eagle"
    assert applicability("KV-LIFE-010", caps) is not None
    assert applicability("KV-LIFE-011", caps) is None
    assert applicability("KV-CFG-001", caps) is not None
    verdicts = Verdicts(caps)
    verdicts.check("KV-POOL-004", False, "ignored: not applicable")
    assert verdicts.outcomes["KV-POOL-004"].outcome == "not-applicable"
    assert verdicts.outcomes["KV-FULL-001"].outcome == "unexercised"
    assert not verdicts.ok()


def test_a_failed_check_raises_a_violation_naming_the_rule() -> None:
    verdicts = Verdicts(Capabilities())
    verdicts.check("KV-POOL-011", True)
    with pytest.raises(RuleViolation, match="KV-POOL-011") as raised:
        verdicts.check("KV-POOL-011", False, "counts differ")
    assert raised.value.rule_id == "KV-POOL-011"
    verdicts.record(Counterexample("KV-POOL-011", "counts differ", []))
    assert verdicts.outcomes["KV-POOL-011"].outcome == "fail"


def test_expected_failures_are_strict() -> None:
    verdicts = Verdicts(Capabilities(), expectations={"KV-POOL-007": "known divergence"})
    # Never checked: the expectation was not tested either way (not a pass).
    assert verdicts.outcomes["KV-POOL-007"].outcome == "unexercised"
    verdicts.check("KV-POOL-007", True)
    assert verdicts.outcomes["KV-POOL-007"].outcome == "unexpected-pass"
    verdicts.record(Counterexample("KV-POOL-007", "diverges", []))
    assert verdicts.outcomes["KV-POOL-007"].outcome == "expected-fail"


# -- replays ---------------------------------------------------------------------------------
FORWARD_FREE_STEPS = [
    s.Configure(ManagerConfig(num_blocks=4, block_size=2, max_model_len=8)),
    s.AddRequest("r0", (1, 2, 3, 4, 5)),
    s.Schedule("r0", 5),
    s.Free("r0"),
]


def test_replay_finds_the_rule_and_the_reference_passes_the_same_steps() -> None:
    with pytest.raises(RuleViolation, match="KV-POOL-007"):
        replay("lockstep", broken_engines.ForwardFree, FORWARD_FREE_STEPS)
    verdicts = replay("lockstep", "reference", FORWARD_FREE_STEPS)
    assert verdicts.outcomes["KV-POOL-007"].checks >= 1


def test_replay_file_is_a_runnable_pytest_module(tmp_path: Path) -> None:
    example = Counterexample("KV-POOL-007", "free queue differs", FORWARD_FREE_STEPS)
    path = write_replay(tmp_path, get_suite("lockstep"), "broken_engines:ForwardFree", example)
    assert path.name == "test_manager_kv_pool_007_broken_engines_forwardfree.py"
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert namespace["STEPS"] == FORWARD_FREE_STEPS
    with pytest.raises(RuleViolation, match="KV-POOL-007"):
        namespace[f"test_{path.stem[5:]}"]()


# -- engines by name -------------------------------------------------------------------------
def test_engine_loading_errors_are_clear() -> None:
    lockstep = get_suite("lockstep")
    assert engine_factory("reference", lockstep) is ReferenceEngine
    assert engine_spec_of(ReferenceEngine) == "reference"
    assert engine_spec_of(ReferenceEngine, lockstep) == "reference"
    assert engine_spec_of(broken_engines.ForwardFree) == "broken_engines:ForwardFree"
    with pytest.raises(EngineLoadError, match="module:Class"):
        engine_factory("no-colon", lockstep)
    with pytest.raises(EngineLoadError, match="cannot import"):
        engine_factory("no_such_module_xyz:Engine", lockstep)
    with pytest.raises(EngineLoadError, match="has no attribute"):
        engine_factory("broken_engines:NoSuchEngine", lockstep)


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "parameter", "rule_id"), [
    ({"num_blocks": 1}, "num_blocks", "KV-CFG-001"),
    ({"block_size": 0}, "block_size", "KV-CFG-002"),
    ({"max_model_len": 0}, "max_model_len", "KV-CFG-003"),
    ({"hash_block_size": 3}, "hash_block_size", "KV-CFG-004"),
    ({"block_size": 4, "hash_block_size": 2}, "hash_block_size", "KV-CFG-004"),
])
def test_impossible_configs_name_the_parameter_and_rule(kwargs, parameter, rule_id) -> None:
    values = {"num_blocks": 8, "block_size": 4, "max_model_len": 32, **kwargs}
    with pytest.raises(ConfigError) as raised:
        ManagerConfig(**values)
    assert raised.value.parameter == parameter
    assert raised.value.rule_id == rule_id
    assert str(raised.value).startswith(f"{rule_id}: {parameter}:")


def test_negative_token_counts_are_rejected_with_the_rule() -> None:
    engine = ReferenceEngine()
    engine.configure(ManagerConfig(num_blocks=8, block_size=4, max_model_len=32))
    engine.add_request("r0", (1, 2, 3))
    with pytest.raises(ConfigError, match="KV-CFG-005: num_lookahead_tokens"):
        engine.allocate("r0", 3, 0, num_lookahead_tokens=-1)
    with pytest.raises(ValueError, match="KV-LIFE-013"):
        engine.allocate("r0", 0, 0)


def test_contract_violations_in_the_reference_name_their_rule() -> None:
    if os.environ.get("KVORACLE_CONTRACTS", "1") == "0":
        pytest.skip("contracts are switched off in this process")
    pool = BlockPool(4, enable_caching=True)
    with pytest.raises(icontract.ViolationError, match="KV-POOL-004"):
        pool.get_new_blocks(4)


def test_a_what_if_runs_on_a_copy_with_the_contracts_suspended() -> None:
    if os.environ.get("KVORACLE_CONTRACTS", "1") == "0" or not can_suspend():
        pytest.skip("no contracts to suspend in this process")
    model = ReferenceEngine()
    model.configure(ManagerConfig(num_blocks=4, block_size=2, max_model_len=8))
    model.add_request("r0", (1, 2, 3, 4, 5))
    before = model.observe()
    with what_if(model) as other:
        assert is_suspended()
        other.manager.pool.blocks[1].ref_cnt = 1  # in the free queue and referenced: KV-POOL-010
        assert other.manager.pool.num_free_blocks() == 3  # the invariant is not checked
        assert other.allocate("r0", 5, 0) == ((1, 2, 3),)
    assert not is_suspended()
    assert model.observe() == before  # the copy's course left the model as it was
    broken = copy.deepcopy(model)
    broken.manager.pool.blocks[1].ref_cnt = 1
    with pytest.raises(icontract.ViolationError, match="KV-POOL-010"):
        broken.manager.pool.num_free_blocks()


def _same_graph(one: object, other: object) -> bool:
    """Whether two object graphs are alike: the same types, equal atoms, containers with their
    items in the same order, and one object of one graph for each object of the other (a
    mutable object shared in one is shared in the other). Identity of atoms is not compared."""
    paired: dict[int, int] = {}
    pending = [(one, other)]
    while pending:
        a, b = pending.pop()
        if type(a) is not type(b):
            return False
        if isinstance(a, (int, float, str, bytes, bool, type(None), type, range)) or callable(a):
            if a != b if not callable(a) else a is not b:
                return False
            continue
        if id(a) in paired:
            if paired[id(a)] != id(b):
                return False
            continue
        paired[id(a)] = id(b)
        if isinstance(a, (list, tuple)):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b))
        elif isinstance(a, dict):
            if list(a) != list(b):
                return False
            pending.extend(zip(a.values(), b.values()))
        elif isinstance(a, (set, frozenset)):
            if a != b or list(a) != list(b):
                return False
        else:
            pending.append((pickle_state(a), pickle_state(b)))
    return True


def pickle_state(obj: object) -> object:
    """An object's state as pickle sees it (its ``__dict__`` or slots)."""
    reduced = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return reduced[2] if len(reduced) > 2 else ()


def test_the_copies_a_manager_run_makes_are_deep_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy_of`` (a pickle round trip) gives the object graph ``copy.deepcopy`` gives, on every
    model a manager run copies: the same graph (mutable objects shared alike, containers in the
    same order, equal atoms), sharing no block with the model."""
    from kvoracle.conformance.manager import groups
    from kvoracle.conformance.manager import what_if as what_if_module

    made: Counter[str] = Counter()
    copy_of = what_if_module.copy_of

    def checked(where: str) -> Callable[[ReferenceEngine], ReferenceEngine]:
        def checked_copy_of(model: ReferenceEngine) -> ReferenceEngine:
            ours, theirs = copy_of(model), copy.deepcopy(model)
            assert _same_graph(ours, theirs)
            assert ours.manager is not model.manager
            assert not set(map(id, ours.manager.pool.blocks)) & set(map(id, model.manager.pool.blocks))
            made[where] += 1
            return ours
        return checked_copy_of

    monkeypatch.setattr(what_if_module, "copy_of", checked("what-if"))
    monkeypatch.setattr(groups, "copy_of", checked("before an align-mode allocation"))
    result = run_suite("reference", RunOptions(max_examples=15, replay_dir=None), suite="manager")
    assert result.internal_errors == []
    assert not [rule for rule, o in result.verdicts.outcomes.items() if o.outcome in ("fail", "error")]
    assert made["what-if"] > 100 and made["before an align-mode allocation"] > 0, made


def test_contracts_switch_off_in_a_fresh_process() -> None:
    code = ("from kvoracle.reference import BlockPool, CONTRACTS_ENABLED; "
            "print(CONTRACTS_ENABLED, hasattr(BlockPool.get_new_blocks, '__wrapped__'))")
    for value, expected in (("0", "False False"), ("1", "True True")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "KVORACLE_CONTRACTS": value}, timeout=120)
        assert done.stdout.split() == expected.split(), done.stderr


# -- the command -----------------------------------------------------------------------------
def test_cli_rules_lists_every_rule() -> None:
    done = _cli("rules")
    assert done.returncode == 0
    for rule in all_rules():
        assert rule.id in done.stdout


def test_cli_check_writes_a_json_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = _cli("check", "--suite", "lockstep", "--max-examples", "100", "--seed", "7",
                "--json", str(report), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT: OK" in done.stdout
    data = json.loads(report.read_text())
    assert data["engine"]["name"] == "reference"
    assert data["seed"] == 7
    assert data["ok"] is True
    assert {r["id"] for r in data["rules"]} == {r.id for r in all_rules()}


def test_cli_bad_arguments_exit_2_with_a_message(tmp_path: Path) -> None:
    done = _cli("check", "--engine", "nowhere_module:Engine", cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot import nowhere_module" in done.stderr
    done = _cli("check", "--max-examples", "0", cwd=tmp_path)
    assert done.returncode == 2
    assert "--max-examples must be >= 1" in done.stderr


def test_pytest_plugin_turns_rules_into_items(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--kvoracle-engine=reference", "--kvoracle-suite=lockstep", "--kvoracle-max-examples=100",
         "-rs"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # One item per rule the lockstep suite judges: the applicable ones pass, the rest are skipped.
    scope = get_suite("lockstep").scope()
    verdicts = Verdicts(capabilities_of(ReferenceEngine()), scope=lambda rule: rule.id in set(scope))
    applicable = sum(1 for rule_id in scope if verdicts.applicable(rule_id))
    assert 0 < applicable < len(scope)
    assert f"{applicable} passed, {len(scope) - applicable} skipped" in done.stdout
    assert "KV-LIFE-011 not applicable" in done.stdout


# -- packaging -------------------------------------------------------------------------------
def test_only_the_kvoracle_namespace_is_installed() -> None:
    code = ("import importlib.util as u, json; print(json.dumps({n: u.find_spec(n) is not None "
            "for n in ['spec', 'reference', 'conformance', 'gpu', 'namespace', 'kvoracle.spec', "
            "'kvoracle.reference', 'kvoracle.conformance']}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd="/", timeout=120)
    found = json.loads(done.stdout)
    assert found == {"spec": False, "reference": False, "conformance": False, "gpu": False,
                     "namespace": False, "kvoracle.spec": True, "kvoracle.reference": True,
                     "kvoracle.conformance": True}
    assert importlib.util.find_spec("kvoracle.gpu") is not None


def test_spec_reference_conformance_import_without_torch() -> None:
    code = ("import sys\nsys.modules['torch'] = None\n"
            "import kvoracle.spec, kvoracle.reference, kvoracle.conformance.harness.runner\n"
            "import kvoracle.conformance.cli, kvoracle.conformance.plugin\n"
            "try:\n import kvoracle.gpu\nexcept ImportError as e: print('gpu:', e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gpu: kvoracle.gpu needs torch" in done.stdout


def test_generated_rule_table_is_up_to_date() -> None:
    from kvoracle.conformance.rules_doc import rules_markdown

    committed = (REPO / "docs" / "rules.md").read_text()
    assert committed == rules_markdown() + "\n", (
        "docs/rules.md is stale: run `kvoracle rules --markdown > docs/rules.md`")
    for rule in all_rules():
        assert f"| {rule.id} |" in committed
