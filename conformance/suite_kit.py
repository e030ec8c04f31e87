"""What the lookup-style suites (hybrid lookup, hybrid lifecycle, external store) share.

Each suite has a step driver, a ``RuleBasedStateMachine`` base and a scope of
rules it judges. These helpers bind a machine to one engine in the runner's
``make_machine`` signature, build the suite's verdicts, and replay a step list.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from .adapter import Capabilities
from .verdicts import Verdicts


def bind_machine(base: type, prefix: str, engine_factory: Callable[[], Any], verdicts: Verdicts,
                 on_example: Callable[[], None] | None, **attributes: Any) -> type:
    """A subclass of ``base`` that drives ``engine_factory``'s engine and records into ``verdicts``."""
    return type(f"{prefix}_{getattr(engine_factory, '__name__', 'engine')}", (base,), {
        "engine_factory": staticmethod(engine_factory), "verdicts": verdicts,
        "on_example": staticmethod(on_example) if on_example else None, **attributes})


def scoped_verdicts(scope: Collection[str], reason: str, capabilities: Capabilities | None = None
                    ) -> Callable[[object, dict[str, str] | None], Verdicts]:
    """The runner's ``make_verdicts`` for a suite judging the rules in ``scope``; every other
    rule is not applicable, for ``reason`` (and a rule in scope whose capability the engine
    lacks, per ``capabilities``, is not applicable for that)."""
    def make(probe: object, expectations: dict[str, str] | None) -> Verdicts:
        return Verdicts(capabilities or Capabilities(), expectations, scope=lambda rule: rule.id in scope,
                        out_of_scope=reason)
    return make


def replay_steps(driver_class: Callable[[Callable[[], Any], Verdicts], Any], factory: Callable[[], Any],
                 verdicts: Verdicts, steps: Sequence[object]) -> Verdicts:
    """Apply ``steps`` through a fresh driver; raises :class:`~.verdicts.RuleViolation` on a failure."""
    driver = driver_class(factory, verdicts)
    for step in steps:
        driver.apply(step)
    return verdicts
