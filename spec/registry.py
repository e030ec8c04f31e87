"""The rule registry.

Every normative statement of the specification is a *rule* with a permanent
identifier ``KV-<AREA>-<NNN>``. Identifiers are never renumbered and never
reused: a withdrawn rule keeps its number and is marked ``withdrawn``.

Chapters register their rules at import time with :func:`rule`, and mark the
pure functions that state a rule with :func:`defines`. Code, reports and docs
look rules up with :func:`get_rule` / :func:`all_rules`.

Each rule also says how it is checked against engines. ``needs`` names the
engine capabilities (flags of the conformance adapter's ``Capabilities``) an
engine must claim before it can be judged on the rule. ``judged_by`` names the
conformance suites whose checks judge the rule against engines. A rule no
suite judges either has a ``spec_only`` reason -- no behaviour an engine
adapter can observe corresponds to it -- or is listed in
:data:`NOT_YET_JUDGED`, the gap list: observable, but no suite checks it yet.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

RULE_ID_PATTERN = re.compile(r"^KV-[A-Z]+-\d{3}$")

#: Kinds of rules.
#: ``normative``  -- behaviour every conforming engine shows.
#: ``divergence`` -- a place where the seeds and vLLM 0.33.0 disagree; the rule
#:                   states the 0.33.0 behaviour and records the older one.
#: ``validation`` -- what kvoracle itself rejects as impossible input.
RULE_KINDS = ("normative", "divergence", "validation")

#: The conformance suites that judge rules against engines (``kvoracle check --suite``).
SUITES = ("manager", "hybrid", "external-store", "prefix-tree")

#: The engine capabilities a rule can need: the flags of
#: ``kvoracle.conformance.adapter.Capabilities`` (the spec does not import the
#: conformance package; a test keeps the two in step).
CAPABILITIES = ("exact_block_ids", "free_queue", "ref_counts", "cache_map", "request_hashes", "eagle",
                "caching_off", "lookahead", "delay_cache", "evict", "reset", "cache_salt",
                "hash_block_views", "kv_data", "kv_cache_groups", "uncached_prefix_tokens", "per_group_lookup",
                "skipped_tokens", "mamba_align", "mamba_partial_hits")

#: ``spec_only`` reasons shared by several rules.
INPUT_VALIDATION = ("kvoracle's own input validation: it rejects the configuration or argument with a "
                    "ConfigError before any engine sees it; checked by kvoracle's tests")
LAYER_SPEC_SIZES = ("page-size and worst-case-memory arithmetic of a layer's KV-cache spec, used to size the pool "
                    "before a manager exists; no adapter operation or observation exposes it; checked by the "
                    "spec tests (with a differential test against vLLM's spec classes) and CrossHair")
LAYER_SPEC_GROUPING = ("how layer specs merge into KV-cache groups, decided before a manager exists; adapters are "
                       "configured with groups already formed; checked by the spec tests (with a differential "
                       "test against vLLM's spec classes)")

#: The gap list: rules an engine adapter could observe but no suite judges yet, each
#: with what a suite would need to judge it. Exactly the rules with neither
#: ``judged_by`` nor ``spec_only`` (tests/test_rule_metadata.py holds it to that). Empty since
#: the manager suite judges vLLM's fine-grained partial Mamba hits (KV-MAMBA-019 .. 025, issue 16).
NOT_YET_JUDGED: dict[str, str] = {}


@dataclass(frozen=True)
class Rule:
    """One rule of the specification."""

    id: str
    title: str
    text: str
    source: str
    chapter: str
    kind: str = "normative"
    withdrawn: bool = False
    definitions: list[str] = field(default_factory=list, compare=False)
    #: Engine capabilities (names of ``Capabilities`` flags) an engine must claim to be judged.
    needs: tuple[str, ...] = ()
    #: The conformance suites (names in :data:`SUITES`) whose checks judge the rule.
    judged_by: tuple[str, ...] = ()
    #: Why no suite can judge the rule through an engine adapter, for a rule none judges.
    spec_only: str | None = None

    @property
    def area(self) -> str:
        return self.id.split("-")[1]


_RULES: dict[str, Rule] = {}

F = TypeVar("F", bound=Callable[..., object])


def check_metadata(rule_id: str, kind: str, needs: tuple[str, ...], judged_by: tuple[str, ...],
                   spec_only: str | None) -> None:
    """Raise ``ValueError`` naming ``rule_id`` when its judging metadata is malformed.

    ``needs`` must be a tuple of distinct names in :data:`CAPABILITIES`; ``judged_by``
    a tuple of distinct names in :data:`SUITES`; ``spec_only`` ``None`` or a non-empty
    reason. A rule is judged by suites or spec-only, never both; a spec-only rule needs
    no capability; a validation rule is never judged against engines; and a rule on the
    gap list (:data:`NOT_YET_JUDGED`) is neither judged nor spec-only.
    """
    def bad(message: str) -> ValueError:
        return ValueError(f"rule {rule_id}: {message}")

    for name, value in (("needs", needs), ("judged_by", judged_by)):
        if not isinstance(value, tuple):
            raise bad(f"{name} must be a tuple of strings, got {value!r}")
        if len(set(value)) != len(value):
            raise bad(f"{name} lists a name twice: {value!r}")
    unknown = [n for n in needs if not isinstance(n, str) or n not in CAPABILITIES]
    if unknown:
        raise bad(f"needs names unknown capabilities {unknown!r}; known: {', '.join(CAPABILITIES)}")
    unknown = [s for s in judged_by if not isinstance(s, str) or s not in SUITES]
    if unknown:
        raise bad(f"judged_by names unknown suites {unknown!r}; known: {', '.join(SUITES)}")
    if spec_only is not None and (not isinstance(spec_only, str) or not spec_only.strip()):
        raise bad(f"spec_only must be None or a non-empty reason, got {spec_only!r}")
    if judged_by and spec_only is not None:
        raise bad(f"judged by {', '.join(judged_by)} and spec_only at once; a judged rule is not spec-only")
    if spec_only is not None and needs:
        raise bad("spec_only but needs capabilities; no engine is judged on a spec-only rule")
    if kind == "validation" and judged_by:
        raise bad("a validation rule is kvoracle's own input check; no suite judges it against engines")
    if rule_id in NOT_YET_JUDGED and (judged_by or spec_only is not None):
        raise bad("listed in NOT_YET_JUDGED but also judged_by or spec_only; remove it from the gap list")


def rule(
    rule_id: str,
    title: str,
    text: str,
    *,
    source: str,
    chapter: str,
    kind: str = "normative",
    withdrawn: bool = False,
    needs: tuple[str, ...] = (),
    judged_by: tuple[str, ...] = (),
    spec_only: str | None = None,
) -> str:
    """Register a rule and return its ID (so chapters can bind it to a name)."""
    if not RULE_ID_PATTERN.match(rule_id):
        raise ValueError(f"rule id {rule_id!r} does not match KV-<AREA>-<NNN>")
    if kind not in RULE_KINDS:
        raise ValueError(f"rule {rule_id}: kind {kind!r} is not one of {RULE_KINDS}")
    if rule_id in _RULES:
        raise ValueError(f"rule id {rule_id} is registered twice; rule ids are never reused")
    check_metadata(rule_id, kind, needs, judged_by, spec_only)
    _RULES[rule_id] = Rule(
        id=rule_id,
        title=title,
        text=" ".join(text.split()),
        source=source,
        chapter=chapter,
        kind=kind,
        withdrawn=withdrawn,
        needs=needs,
        judged_by=judged_by,
        spec_only=spec_only,
    )
    return rule_id


def defines(*rule_ids: str) -> Callable[[F], F]:
    """Mark a pure function as the statement of one or more rules."""

    def mark(function: F) -> F:
        for rule_id in rule_ids:
            _RULES[rule_id].definitions.append(
                f"{function.__module__.rsplit('.', 1)[-1]}.{function.__qualname__}"
            )
        function.__kvoracle_rules__ = rule_ids  # type: ignore[attr-defined]
        return function

    return mark


def get_rule(rule_id: str) -> Rule:
    """Look a rule up by ID; a clear error names an unknown ID."""
    try:
        return _RULES[rule_id]
    except KeyError:
        raise KeyError(f"unknown rule id {rule_id!r}") from None


def all_rules() -> list[Rule]:
    """Every registered rule, ordered by area and number."""
    return sorted(_RULES.values(), key=lambda r: (r.area, r.id))
