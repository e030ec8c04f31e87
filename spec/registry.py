"""The rule registry.

Every normative statement of the specification is a *rule* with a permanent
identifier ``KV-<AREA>-<NNN>``. Identifiers are never renumbered and never
reused: a withdrawn rule keeps its number and is marked ``withdrawn``.

Chapters register their rules at import time with :func:`rule`, and mark the
pure functions that state a rule with :func:`defines`. Code, reports and docs
look rules up with :func:`get_rule` / :func:`all_rules`.
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

    @property
    def area(self) -> str:
        return self.id.split("-")[1]


_RULES: dict[str, Rule] = {}

F = TypeVar("F", bound=Callable[..., object])


def rule(
    rule_id: str,
    title: str,
    text: str,
    *,
    source: str,
    chapter: str,
    kind: str = "normative",
    withdrawn: bool = False,
) -> str:
    """Register a rule and return its ID (so chapters can bind it to a name)."""
    if not RULE_ID_PATTERN.match(rule_id):
        raise ValueError(f"rule id {rule_id!r} does not match KV-<AREA>-<NNN>")
    if kind not in RULE_KINDS:
        raise ValueError(f"rule {rule_id}: kind {kind!r} is not one of {RULE_KINDS}")
    if rule_id in _RULES:
        raise ValueError(f"rule id {rule_id} is registered twice; rule ids are never reused")
    _RULES[rule_id] = Rule(
        id=rule_id,
        title=title,
        text=" ".join(text.split()),
        source=source,
        chapter=chapter,
        kind=kind,
        withdrawn=withdrawn,
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
