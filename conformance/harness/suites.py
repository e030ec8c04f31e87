"""The suite registry: what a conformance suite is, and the suites kvoracle knows.

A suite is a protocol (the operations an adapter offers, and what each returns),
its steps, a driver that applies a step to the engine and to kvoracle's model and
judges it, and a Hypothesis machine that chooses the steps. A suite module builds
one :class:`SuiteDef` and registers it when imported; the harness knows suites only
through this registry and never imports one. Which rules a suite judges is stated on
the rules themselves (``judged_by`` in :mod:`kvoracle.spec`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kvoracle.spec import Rule, all_rules

from .capabilities import Capabilities
from .returns import Validator


@attrs.frozen
class SuiteDef:
    """One conformance suite, as the harness sees it."""

    #: The name ``kvoracle check --suite`` takes and ``judged_by`` cites.
    name: str
    #: One line for ``--help`` and reports.
    title: str
    #: Operations every adapter of this suite must offer.
    operations: tuple[str, ...]
    #: The validator of each operation's result (operations not listed are not checked).
    returns: Mapping[str, Validator]
    #: ``driver(engine_factory, verdicts, caller)``: applies steps and judges them.
    driver: Callable[..., Any]
    #: The ``RuleBasedStateMachine`` subclass (of :class:`~.machine.SuiteMachine`) choosing steps.
    machine: type
    #: The module that registers the suite and names its step classes (a replay file imports it).
    module: str
    #: The names a replay file imports from :attr:`module` to rebuild the steps' reprs.
    step_names: tuple[str, ...]
    #: Built-in engines: name ``--engine`` accepts -> ``module:Class`` of this suite's adapter.
    engines: Mapping[str, str] = attrs.Factory(dict)
    #: Class attributes to set on the bound machine, from a probe adapter (e.g. what it supports);
    #: a ``ValueError`` says the adapter cannot run the suite (or the part of it an alias names).
    #: ``parts``, if set, names the kinds of example the machine draws among (a suite that merged
    #: several keeps each one's share): a run gives every part ``--max-examples`` examples.
    machine_options: Callable[[Any], dict[str, Any]] = lambda probe: {}
    #: Rules of the suite an adapter (a probe) is not judged on, with the reason: those only the
    #: examples it is not given reach (e.g. models it does not claim to handle).
    exclusions: Callable[[Any], Mapping[str, str]] = lambda probe: {}
    #: The alias this definition was looked up by (a part of the suite), or "".
    alias: str = ""
    #: An alias's part judges only these of the suite's rules (None: all of them).
    part_rules: frozenset[str] | None = None

    def judges(self, rule: Rule) -> bool:
        return self.name in rule.judged_by and (self.part_rules is None or rule.id in self.part_rules)

    @property
    def label(self) -> str:
        """How reports name it: the suite, or the part of it an alias runs."""
        return f"the {self.alias} part of the {self.name} suite" if self.alias else f"the {self.name} suite"

    def scope(self) -> tuple[str, ...]:
        """The rules this suite judges, from the rules' own metadata."""
        return tuple(rule.id for rule in all_rules() if self.judges(rule))

    def missing_operations(self, adapter: object) -> list[str]:
        """The suite's operations ``adapter`` (a class or an instance) does not offer."""
        return [name for name in self.operations if not callable(getattr(adapter, name, None))]


_SUITES: dict[str, SuiteDef] = {}
#: alias -> (suite, title, the part's rules, keyword arguments fixed on ``machine_options``).
_ALIASES: dict[str, tuple[str, str, frozenset[str], dict[str, Any]]] = {}


class UnknownSuiteError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_suite(suite: SuiteDef) -> SuiteDef:
    """Register ``suite`` under its name (importing its module twice registers it once)."""
    if getattr(suite.driver, "suite_name", suite.name) != suite.name:
        raise ValueError(f"suite {suite.name!r}: its driver says it drives {suite.driver.suite_name!r}")
    known = _SUITES.get(suite.name)
    if known is not None and known.module != suite.module:
        raise ValueError(f"suite {suite.name!r} is registered by {known.module} and {suite.module}")
    _SUITES[suite.name] = suite
    return suite


def register_alias(alias: str, suite: str, title: str, rules: frozenset[str], **machine_options: Any) -> None:
    """Let ``alias`` name a part of ``suite``: the suite with ``machine_options`` fixed (its
    ``machine_options`` function takes them as keyword arguments), judging only ``rules`` of its
    own. Aliases keep a suite's older names working after suites merge; ``kvoracle check`` with
    no ``--suite`` never runs one."""
    if alias in _SUITES:
        raise ValueError(f"alias {alias!r} is the name of a suite")
    _ALIASES[alias] = (suite, title, frozenset(rules), machine_options)


def suite_aliases() -> dict[str, str]:
    """Every alias, with the suite it names a part of."""
    return {alias: target for alias, (target, *_) in _ALIASES.items()}


def get_suite(name: str) -> SuiteDef:
    if name in _ALIASES:
        target, title, rules, fixed = _ALIASES[name]
        suite = get_suite(target)
        return attrs.evolve(suite, alias=name, title=title, part_rules=rules,
                            machine_options=functools.partial(suite.machine_options, **fixed))
    try:
        return _SUITES[name]
    except KeyError:
        names = ", ".join(sorted(_SUITES)) or "none"
        aliases = f" (and aliases: {', '.join(sorted(_ALIASES))})" if _ALIASES else ""
        raise UnknownSuiteError(f"unknown suite {name!r}; registered suites: {names}{aliases}") from None


def registered_suites() -> list[SuiteDef]:
    """Every registered suite, in registration order."""
    return list(_SUITES.values())


def capabilities_of(adapter: object) -> Capabilities:
    """What ``adapter`` claims: its ``capabilities()``, or the defaults if it has none."""
    claims = getattr(adapter, "capabilities", None)
    if claims is None:
        return Capabilities()
    value = claims()
    if not isinstance(value, Capabilities):
        raise TypeError(f"capabilities() returned {type(value).__name__}, not kvoracle Capabilities")
    return value
