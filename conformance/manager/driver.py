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

from ..adapter import UNKNOWN_HASH
from ..engines.reference import ReferenceEngine
from ..harness import picture as draw
from ..harness.driver import Driver
from ..steps import CommonPrefix, Configure, ConfigureGroups, EmptyAllocation, NewStep, Probe, TakeCopies
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
        #: The last lookup: (step number, request id, the reference's hit, the engine's).
        self.last_lookup: tuple | None = None

    @property
    def several_groups(self) -> bool:
        return self.setup is not None

    def _Configure(self, step: Configure) -> None:
        self.setup = None
        self.fault_rule = ONE_GROUP_FAULT_RULE
        self.quarantine_scope = "one group"
        self._one_Configure(step)

    def _ConfigureGroups(self, step: ConfigureGroups) -> None:
        self.fault_rule = GROUPS_FAULT_RULE
        self.quarantine_scope = "groups"
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

    # -- the picture of a failing step --------------------------------------------------------
    def picture(self) -> list[dict] | None:
        """Block tables per KV-cache group (one row per request), the failing step's lookup, the
        block pool (free blocks, free queue, ref counts by block id) and the cache map: the
        reference's and the engine's."""
        if self.config is None:
            return None
        expected = self.model.observe()
        actual = self.call("observe", rule=self.fault_rule)
        caps = self.capabilities
        exact = caps.exact_block_ids
        compare = draw.VALUES if exact else draw.SHAPE
        note = "" if exact else "the engine numbers its blocks its own way: only the lengths compare"
        described = self.setup.groups if self.setup is not None else (("full", self.config.block_size, 0),)
        groups = [draw.group_label(g, *group) for g, group in enumerate(described)]
        panels = []
        for g, what in enumerate(groups):
            def group_of(tables: dict, g: int = g) -> dict:
                return {rid: table[g] for rid, table in tables.items() if g < len(table)}
            panels.append(draw.panel(f"block tables of {what}", draw.rows_by_key(
                group_of(dict(expected.block_tables)), group_of(dict(actual.block_tables))), note, compare))
        if self.last_lookup is not None and self.last_lookup[0] == len(self.steps):
            _, request_id, want, got = self.last_lookup
            labels = [f"group {g}" for g in range(max(len(want.block_ids), len(got.block_ids)))]
            rows = draw.rows_by_position(labels, want.block_ids, got.block_ids)
            panels.append(draw.panel(f"hit blocks of {request_id}'s lookup at this step",
                                     [*rows, draw.row("hit tokens", [want.num_tokens], [got.num_tokens])]))
        pool = [draw.row("free blocks", [expected.num_free_blocks], [actual.num_free_blocks])]
        if exact and (caps.free_queue or actual.free_queue is not None):
            pool.append(draw.row("free queue (head first)", expected.free_queue, actual.free_queue))
        if exact and (caps.ref_counts or actual.ref_counts is not None):
            pool.append(draw.row("ref counts (column = block id)", expected.ref_counts, actual.ref_counts))
        panels.append(draw.panel("block pool", pool))
        if caps.cache_map and actual.cached is not None:
            panels.append(draw.panel("cache map (key hash, group): blocks in caching order", draw.rows_by_key(
                dict(expected.cached or {}), dict(actual.cached),
                label=_key_label), note, compare))
        return panels

    # A step of align-mode Mamba groups only (the machine generates it only there).
    def _NewStep(self, step: NewStep) -> None:
        if not self.several_groups:
            raise ValueError(f"{step!r} is a step of a model of KV-cache groups; this example configured one group")
        self._groups_NewStep(step)

    def _TakeCopies(self, step: TakeCopies) -> None:
        if not self.several_groups:
            raise ValueError(f"{step!r} is a step of a model of KV-cache groups; this example configured one group")
        self._groups_TakeCopies(step)

    def _one_only(self, step: object) -> None:
        if self.several_groups:
            raise ValueError(f"{step!r} is a step of a one-group model; this example configured several groups")


def _key_label(key: tuple) -> str:
    """A cache key's row label: the start of kvoracle's hash (``?`` and the engine's, for a hash
    the adapter could not name) and the group."""
    digest, group = key
    if isinstance(digest, bytes) and digest.startswith(UNKNOWN_HASH):
        return f"?{draw.cell(digest[len(UNKNOWN_HASH):])} g{group}"
    return f"{draw.cell(digest)} g{group}"
