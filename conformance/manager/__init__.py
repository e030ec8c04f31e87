"""The manager suite: a whole KV-cache manager in lockstep with kvoracle's reference.

One suite for a manager of one KV-cache group or several, as vLLM's one
``KVCacheManager`` holds either coordinator: steps in :mod:`..steps`, the driver in
:mod:`.driver` (judging in :mod:`.one_group` and :mod:`.groups`), the machine and the
suite's registration in :mod:`.machine`. ``kvoracle check --suite manager``; the
aliases ``lockstep`` and ``hybrid-lifecycle`` run its one-group and several-group parts.
The steps are :mod:`kvoracle.conformance.steps`, re-exported here: a replay file imports
them from this package, which registers the suite.
"""

from kvoracle.reference import ManagerConfig

from ..steps import (
    AddRequest,
    AppendTokens,
    CommonPrefix,
    Configure,
    ConfigureGroups,
    EmptyAllocation,
    Evict,
    Free,
    NewStep,
    Observe,
    Probe,
    ResetPrefixCache,
    Schedule,
    TakeCopies,
)
from .choose_groups import group_setups
from .choose_one_group import manager_configs
from .driver import ManagerDriver
from .machine import GROUPS, MANAGER, ONE_GROUP, ManagerMachine, make_machine

__all__ = [
    "GROUPS",
    "MANAGER",
    "ONE_GROUP",
    "AddRequest",
    "AppendTokens",
    "CommonPrefix",
    "Configure",
    "ConfigureGroups",
    "EmptyAllocation",
    "Evict",
    "Free",
    "ManagerConfig",
    "ManagerDriver",
    "ManagerMachine",
    "NewStep",
    "Observe",
    "Probe",
    "ResetPrefixCache",
    "Schedule",
    "TakeCopies",
    "group_setups",
    "make_machine",
    "manager_configs",
]
