"""The manager suite's Hypothesis machine, and the suite's registration.

Each example first configures a model: one full-attention group (the unitary
coordinator) or one to three groups of any kinds (the hybrid coordinator, or the
unitary one over a single group of another kind), half the time each where the
engine claims ``kv_cache_groups``. The rules of :mod:`.choose_one_group` choose the
steps for the first, those of :mod:`.choose_groups` for the second; each rule is
available only in its own kind of example, so each half draws its steps as it
would alone. Third parties can use the machine in their own test suites::

    from kvoracle.conformance.manager import make_machine
    TestMyEngine = make_machine(MyEngineAdapter).TestCase
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize

from kvoracle.spec import all_rules

from ..adapter import RETURNS, EngineAdapter
from ..harness.machine import SuiteMachine, machine_for
from ..harness.suites import SuiteDef, capabilities_of, register_alias, register_suite
from ..steps import Configure
from .choose_groups import GroupsRules, group_setups
from .choose_one_group import OneGroupRules, manager_configs
from .driver import ManagerDriver
from .trace import Conversations

#: The kinds of model an example configures.
ONE_GROUP, GROUPS = "one-group", "groups"
PARTS = (ONE_GROUP, GROUPS)


class ManagerMachine(OneGroupRules, GroupsRules, SuiteMachine):
    """Chooses the manager suite's steps from the reference's state."""

    driver: ManagerDriver
    #: The kinds of model examples configure (set from what the engine claims).
    parts: tuple[str, ...] = (ONE_GROUP,)
    #: Where one-group prompts come from: "random" (a tiny alphabet, so that requests collide)
    #: or "mooncake" (conversations shaped like the Mooncake trace, :mod:`.trace`).
    workload: str = "random"

    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        #: One group: the last eight freed requests as (tokens, cache salt, block hashes), newest first.
        self.freed: list[tuple[tuple[int, ...], str | None, tuple[bytes, ...]]] = []
        #: Several groups: every prompt so far, and the computed tokens of released requests.
        self.prompts: list[tuple[int, ...]] = []
        self.warm: list[tuple[int, ...]] = []
        #: The "mooncake" workload: the conversation under way.
        self.conversations = Conversations()

    def new_request_id(self) -> str:
        return f"r{next(self.ids)}"

    @initialize(data=st.data())
    def configure(self, data: st.DataObject) -> None:
        part = self.draw_part(data)
        if part == ONE_GROUP:
            self.driver.apply(Configure(data.draw(manager_configs(allow_caching_off=self.caps.caching_off,
                                                                  allow_eagle=self.caps.eagle), label="config")))
            return
        self.driver.apply(data.draw(group_setups(self.caps), label="config"))
        # Every example starts with a request scheduled: Hypothesis switches rules off at
        # random per example, and an example whose rules cannot start one checks nothing.
        self.serve_shared_prefix(data)


def machine_options(probe: Any, part: str | None = None, workload: str = "random") -> dict[str, Any]:
    """The kinds of model to generate for ``probe``'s engine (``part``: only that kind), and
    where one-group prompts come from."""
    claimed = PARTS if capabilities_of(probe).kv_cache_groups else (ONE_GROUP,)
    if part is None:
        return {"parts": claimed, "workload": workload}
    if part not in claimed:
        raise ValueError(f"its adapter does not claim kv_cache_groups (configure() with a HybridConfig of "
                         f"several KV-cache groups), which the {part} part of the manager suite needs")
    return {"parts": (part,), "workload": workload}


#: Rules only a model of one full-attention group reaches: the single-group chapters' lookups,
#: hashes, allocation results and free order, which the several-group steps charge to the hybrid
#: lifecycle's rules instead (tests/test_manager_suite.py holds both parts to what they reach).
ONE_GROUP_ONLY = frozenset({
    "KV-FULL-001", "KV-FULL-003", "KV-FULL-004", "KV-FULL-005",
    "KV-HASH-001", "KV-HASH-002", "KV-HASH-003", "KV-HASH-004", "KV-HASH-007",
    "KV-LIFE-001", "KV-LIFE-002", "KV-LIFE-003", "KV-LIFE-004", "KV-LIFE-005", "KV-LIFE-006", "KV-LIFE-007",
    "KV-LIFE-008", "KV-LIFE-010", "KV-LIFE-011", "KV-LIFE-013", "KV-LIFE-014", "KV-LIFE-016",
    "KV-POOL-001", "KV-POOL-003", "KV-POOL-005", "KV-POOL-007", "KV-POOL-009"})
#: Rules only a model of several groups reaches: those needing ``kv_cache_groups``, the hybrid
#: lookup's and null layout's rules the groups' steps judge, and the block-size views of groups
#: coarser than the hash blocks (one full-attention group is hashed at its block size).
GROUPS_ONLY = frozenset({"KV-HASH-006", "KV-HYB-002", "KV-HYB-003", "KV-HYB-006", "KV-HYB-007", "KV-HYB-013"} | {
    rule.id for rule in all_rules() if "kv_cache_groups" in rule.needs})


def exclusions(probe: Any) -> dict[str, str]:
    """An engine that does not claim kv_cache_groups is given one-group models only."""
    if capabilities_of(probe).kv_cache_groups:
        return {}
    return {rule_id: "engine does not claim kv_cache_groups" for rule_id in GROUPS_ONLY}


#: The manager suite, registered with the harness.
MANAGER = register_suite(SuiteDef(
    name="manager",
    title="the whole KV-cache manager, over one KV-cache group or several, against the reference step by step",
    operations=("configure", "add_request", "lookup", "allocate", "advance", "append_tokens", "free",
                "evict", "reset_prefix_cache", "common_prefix_blocks", "observe"),
    returns=RETURNS, driver=ManagerDriver, machine=ManagerMachine, module="kvoracle.conformance.manager",
    step_names=("AddRequest", "AppendTokens", "CommonPrefix", "Configure", "ConfigureGroups", "EmptyAllocation",
                "Evict", "Free", "ManagerConfig", "NewStep", "Observe", "Probe", "ResetPrefixCache", "Schedule",
                "TakeCopies"),
    engines={"reference": "kvoracle.conformance.engines.reference:ReferenceEngine",
             "vllm": "kvoracle.conformance.engines.vllm:VllmEngine",
             "gpu": "kvoracle.conformance.engines.gpu:GpuEngine",
             # The engines in a paged KV store (needs torch): the KV-DATA rules are judged too.
             "paged-reference": "kvoracle.conformance.engines.paged_store:PagedReferenceEngine",
             "paged-vllm": "kvoracle.conformance.engines.paged_store:PagedVllmEngine"},
    machine_options=machine_options, exclusions=exclusions))

_SCOPE = frozenset(MANAGER.scope())


# The names of the two suites the manager suite merged: each runs its part.
register_alias("lockstep", "manager", "the manager suite's one-group part: one full-attention group",
               _SCOPE - GROUPS_ONLY, part=ONE_GROUP)
register_alias("mooncake", "manager", "the manager suite's one-group part on prompts shaped like the Mooncake "
               "conversation trace", _SCOPE - GROUPS_ONLY, part=ONE_GROUP, workload="mooncake")
register_alias("hybrid-lifecycle", "manager", "the manager suite's groups part: one to three groups of any kinds",
               _SCOPE - ONE_GROUP_ONLY, part=GROUPS)


def make_machine(engine_factory: Callable[[], EngineAdapter], step_timeout: float | None = 10.0,
                 max_examples: int = 100, step_count: int = 40) -> type[ManagerMachine]:
    """The manager machine bound to one engine (``engine_factory()`` builds a fresh adapter), for
    use in an engine's own test suite: ``make_machine(MyAdapter).TestCase``."""
    return machine_for(MANAGER, engine_factory, step_timeout, max_examples, step_count)  # type: ignore[return-value]
