"""The manager suite's driver: one driver for a manager of one KV-cache group or several.

vLLM's ``KVCacheManager`` holds one coordinator: the unitary one over a single group,
or the hybrid one over several. The driver follows the configuration step the same
way. After :class:`~..steps.Configure` (one full-attention group) it judges each step
with the single-group chapters' rules (:mod:`.one_group`); after
:class:`~..steps.ConfigureGroups` (one or more groups of any kinds) with the hybrid
lifecycle's (:mod:`.groups`). The steps are the same in both; what differs is which
rule a difference is charged to, because the rules that state it differ.
"""

from __future__ import annotations

from kvoracle.reference import HybridConfig, ManagerConfig

from ..engines.reference import ReferenceEngine
from ..harness.driver import Driver
from ..steps import CommonPrefix, Configure, ConfigureGroups, EmptyAllocation, Probe
from .groups import GroupsJudge
from .one_group import OneGroupJudge

#: Charged for an engine failure no call names a rule for, by configuration.
ONE_GROUP_FAULT_RULE = "KV-LIFE-016"
GROUPS_FAULT_RULE = "KV-HLC-001"


class ManagerDriver(OneGroupJudge, GroupsJudge, Driver):
    """Drives an engine and kvoracle's reference manager through the same steps."""

    suite_name = "manager"
    fault_rule = ONE_GROUP_FAULT_RULE

    def prepare(self) -> None:
        self.capabilities = self.verdicts.capabilities
        self.model = ReferenceEngine(common_prefix=self.capabilities.common_prefix,
                                     free_order=self.capabilities.free_order,
                                     mamba_free_lag=self.capabilities.mamba_free_lag)
        self.config: ManagerConfig | HybridConfig | None = None
        #: The configuration step of a model of several groups (None for one full-attention group).
        self.setup: ConfigureGroups | None = None
        #: Several groups: requests allocated since they arrived or were preempted.
        self.running: set[str] = set()
        #: One group: the engine's hashes and kvoracle's, both ways, and each hash's salt.
        self._engine_hash: dict[object, bytes] = {}
        self._kv_hash: dict[bytes, object] = {}
        self._hash_salt: dict[bytes, str | None] = {}

    @property
    def several_groups(self) -> bool:
        return self.setup is not None

    def _Configure(self, step: Configure) -> None:
        self.setup = None
        self.fault_rule = ONE_GROUP_FAULT_RULE
        self._one_Configure(step)

    def _ConfigureGroups(self, step: ConfigureGroups) -> None:
        self.fault_rule = GROUPS_FAULT_RULE
        self._groups_ConfigureGroups(step)

    def _by_model(self, step: object) -> None:
        """A step both kinds of model take, judged by the rules of the one configured."""
        part = "groups" if self.several_groups else "one"
        getattr(self, f"_{part}_{type(step).__name__}")(step)

    _AddRequest = _Schedule = _AppendTokens = _Free = _Evict = _ResetPrefixCache = _Observe = _by_model

    # Questions asked of one full-attention group only (the machine generates them only there).
    def _Probe(self, step: Probe) -> None:
        self._one_only(step)
        self._one_Probe(step)

    def _EmptyAllocation(self, step: EmptyAllocation) -> None:
        self._one_only(step)
        self._one_EmptyAllocation(step)

    def _CommonPrefix(self, step: CommonPrefix) -> None:
        self._one_only(step)
        self._one_CommonPrefix(step)

    def _one_only(self, step: object) -> None:
        if self.several_groups:
            raise ValueError(f"{step!r} is a step of a one-group model; this example configured several groups")
