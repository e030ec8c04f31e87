"""The manager suite: one suite for a manager of one KV-cache group or several.

It merged the former ``lockstep`` (one full-attention group) and ``hybrid-lifecycle``
(several groups) suites; their names stay as aliases that run one part each. An adapter
claims ``kv_cache_groups`` to be given models of several groups.
"""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import attrs
import pytest

from kvoracle.conformance.engines.reference import ReferenceEngine
from kvoracle.conformance.harness import RunOptions, get_suite, run_suite
from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.runner import SuiteLoadError
from kvoracle.conformance.harness.verdicts import RuleViolation
from kvoracle.conformance.manager import GROUPS, ONE_GROUP
from kvoracle.conformance.steps import AddRequest, Configure, ConfigureGroups, Free, Probe, Schedule
from kvoracle.reference import ManagerConfig
from kvoracle.spec import all_rules


class OneGroupOnly(ReferenceEngine):
    """The reference, claiming only what a single-group adapter claims."""

    configured: ClassVar[list[str]] = []

    def capabilities(self):  # type: ignore[no-untyped-def]
        import attrs

        return attrs.evolve(super().capabilities(), kv_cache_groups=False)

    def configure(self, config):  # type: ignore[no-untyped-def]
        OneGroupOnly.configured.append(type(config).__name__)
        super().configure(config)


def test_the_old_suite_names_are_aliases_of_the_manager_suite() -> None:
    for alias in ("lockstep", "hybrid-lifecycle"):
        suite = get_suite(alias)
        assert (suite.name, suite.alias) == ("manager", alias)
    random = {"workload": "random"}
    assert get_suite("lockstep").machine_options(ReferenceEngine()) == {"parts": (ONE_GROUP,), **random}
    assert get_suite("manager").machine_options(ReferenceEngine()) == {"parts": (ONE_GROUP, GROUPS), **random}
    assert get_suite("manager").machine_options(OneGroupOnly()) == {"parts": (ONE_GROUP,), **random}
    # The mooncake part is the one-group part on trace-shaped prompts (conformance/manager/trace.py).
    assert get_suite("mooncake").machine_options(ReferenceEngine()) == {"parts": (ONE_GROUP,), "workload": "mooncake"}
    assert get_suite("mooncake").scope() == get_suite("lockstep").scope()


def test_an_adapter_without_kv_cache_groups_gets_one_group_models_only() -> None:
    OneGroupOnly.configured = []
    result = run_suite(OneGroupOnly, RunOptions(max_examples=40, replay_dir=None), suite="manager")
    assert set(OneGroupOnly.configured) == {"ManagerConfig"}
    hlc = result.verdicts.outcomes["KV-HLC-003"]
    assert hlc.outcome == "not-applicable" and "kv_cache_groups" in hlc.not_applicable
    assert result.verdicts.outcomes["KV-LIFE-003"].outcome == "pass"
    # Judged by the manager suite with no capability named, but reached only by several groups.
    assert result.verdicts.outcomes["KV-HYB-003"].not_applicable == "engine does not claim kv_cache_groups"
    assert result.ok


def test_the_manager_suite_configures_both_kinds_of_model_and_gives_each_its_examples() -> None:
    seen: list[str] = []

    class Recording(ReferenceEngine):
        def configure(self, config):  # type: ignore[no-untyped-def]
            seen.append(type(config).__name__)
            super().configure(config)

    result = run_suite(Recording, RunOptions(max_examples=30, replay_dir=None), suite="manager")
    assert {"ManagerConfig", "HybridConfig"} <= set(seen)
    # Each part is given --max-examples examples: more than 30 were run in all.
    assert result.examples > 30


def test_a_part_run_by_its_alias_judges_its_own_rules_only() -> None:
    result = run_suite("reference", RunOptions(max_examples=60, replay_dir=None), suite="lockstep")
    assert result.suite == "manager" and result.ok
    outcome = result.verdicts.outcomes["KV-HLC-003"]
    assert outcome.outcome == "not-applicable"
    assert outcome.not_applicable == "not judged by the lockstep part of the manager suite"
    assert result.verdicts.outcomes["KV-LIFE-003"].outcome == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["lockstep", "hybrid-lifecycle"])
def test_each_part_reaches_exactly_the_rules_it_declares(alias: str) -> None:
    """The parts' rule lists (ONE_GROUP_ONLY, GROUPS_ONLY) are kept by hand: a part must reach
    every rule it declares, and no rule it does not (the paged reference claims kv_data and, its
    runner copying shared Mamba pages, partial Mamba hits; only cascade attention, KV-LIFE-011, the
    append free order, KV-POOL-016, and the Mamba free lag, KV-HLC-009, are not claimed)."""
    suite = get_suite(alias)
    wide = attrs.evolve(suite, part_rules=None)  # judge the whole suite's rules with the part's steps
    reached: set[str] = set()
    for seed in (0, 1):
        result = run_suite("paged-reference", RunOptions(max_examples=300, seed=seed, replay_dir=None), suite=wide)
        assert result.ok or all(o.outcome in ("pass", "not-applicable", "unexercised")
                                for o in result.verdicts.outcomes.values())
        reached |= {rule for rule, outcome in result.verdicts.outcomes.items() if outcome.checks}
    assert reached == set(suite.scope()) - {"KV-LIFE-011", "KV-POOL-016", "KV-HLC-009"}


def test_the_groups_part_needs_an_adapter_claiming_kv_cache_groups() -> None:
    with pytest.raises(SuiteLoadError, match="kv_cache_groups"):
        run_suite(OneGroupOnly, RunOptions(max_examples=5, replay_dir=None), suite="hybrid-lifecycle")
    done = subprocess.run([sys.executable, "-m", "kvoracle", "check", "--suite", "hybrid-lifecycle", "--engine",
                           "test_manager_suite:OneGroupOnly", "--no-replay"],
                          capture_output=True, text=True, cwd=__file__.rsplit("/", 1)[0], timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "kv_cache_groups" in done.stderr and "Traceback" not in done.stderr


def test_one_step_list_is_judged_by_the_rules_of_the_model_it_configures() -> None:
    """The same steps after Configure (one group) and ConfigureGroups (one full group):
    an engine that hits the whole prompt breaks KV-LIFE-001 in the first, KV-HYB-014 in the
    second (the one-group lookup of the hybrid lifecycle)."""

    class WholePromptHits(ReferenceEngine):
        def lookup(self, request_id, max_cache_hit_length=None):  # type: ignore[no-untyped-def]
            if max_cache_hit_length is None:
                max_cache_hit_length = self.requests[request_id].num_tokens
            return super().lookup(request_id, max_cache_hit_length)

    prompt = (1, 2, 3, 4, 5, 6, 7, 8)
    rest = [AddRequest("a", prompt), Schedule("a", 8), Free("a"), AddRequest("b", prompt), Schedule("b", 8)]
    one = [Configure(ManagerConfig(num_blocks=8, block_size=4, max_model_len=32)), *rest]
    groups = [ConfigureGroups((("full", 4, 0),), hash_block_size=4, num_blocks=8, max_model_len=32), *rest]
    for steps in (one, groups):
        replay("manager", ReferenceEngine, steps)
    with pytest.raises(RuleViolation, match="KV-LIFE-001"):
        replay("manager", WholePromptHits, one)
    with pytest.raises(RuleViolation, match="KV-HYB-014"):
        replay("manager", WholePromptHits, groups)


def test_a_one_group_question_after_configure_groups_is_kvoraclesown_error() -> None:
    steps = [ConfigureGroups((("full", 4, 0),), hash_block_size=4, num_blocks=8, max_model_len=32),
             AddRequest("a", (1, 2, 3)), Probe("a", 2)]
    with pytest.raises(ValueError, match="one-group model"):
        replay("manager", ReferenceEngine, steps)


def test_every_rule_the_old_suites_judged_is_judged_by_the_manager_suite() -> None:
    scope = set(get_suite("manager").scope())
    assert {"KV-LIFE-001", "KV-POOL-003", "KV-HASH-004", "KV-HLC-006", "KV-SWA-009", "KV-CROSS-001",
            "KV-DATA-006"} <= scope
    assert not [rule.id for rule in all_rules() if {"lockstep", "hybrid-lifecycle"} & set(rule.judged_by)]
