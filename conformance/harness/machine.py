"""The base of every suite's Hypothesis machine, and binding one to an engine.

A suite's machine subclasses :class:`SuiteMachine`: its rules only *choose* steps
and hand them to ``self.driver``. :func:`bind_machine` makes the subclass a run
uses, bound to one engine, one verdict collector and one engine caller. Third
parties can run a bound machine's ``TestCase`` in their own test suites.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.internal.reflection import function_digest
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from .calls import EVERY_SCOPE, EngineCaller
from .database import database_key
from .engines import engine_spec_of
from .suites import SuiteDef, capabilities_of, get_suite
from .verdicts import Verdicts


class SuiteMachine(RuleBasedStateMachine):
    """Holds the driver of one example; subclasses add the rules that choose steps."""

    suite: SuiteDef
    engine_factory: Callable[[], Any]
    verdicts: Verdicts
    caller: EngineCaller
    #: The (operation, scope) pairs quarantined when the round began (preconditions read this,
    #: never the live quarantine: rule availability changing within a round would make replays
    #: inconsistent).
    round_quarantine: frozenset[tuple[str, str]] = frozenset()
    on_example: Callable[[], None] | None = None
    #: A run records a hang as it is (never shrunk); a plain test fails on it.
    record_hangs: bool = False
    #: The kinds of model the suite's examples draw among, each given a run's --max-examples
    #: (set from the suite's machine options; empty: the suite has no parts).
    parts: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.caller.trail.example(self.suite.name)
        self.driver = self.suite.driver(type(self).engine_factory, self.verdicts, self.caller)
        self.driver.record_hangs = self.record_hangs
        if self.on_example is not None:
            self.on_example()

    def can(self, operation: str) -> bool:
        """Whether steps calling ``operation`` may be generated in this example."""
        return not self.driver.dead and not self.quarantined(operation)

    def quarantined(self, operation: str | None = None) -> bool:
        """Whether ``operation`` (``None``: any operation) is quarantined in this example's scope."""
        scopes = (EVERY_SCOPE, self.driver.quarantine_scope)
        return any(scope in scopes and operation in (None, blocked) for blocked, scope in self.round_quarantine)

    def draw_part(self, data: st.DataObject) -> str:
        """The kind of model this example configures: drawn among :attr:`parts`, or the only one."""
        return data.draw(st.sampled_from(self.parts), label="model") if len(self.parts) > 1 else self.parts[0]

    def closing_steps(self) -> list[object]:
        """Steps applied after an example's last rule, while its engine lives (none by default).

        Hypothesis picks each example's rules as a swarm test, turning each rule off with a
        probability drawn per example, so a suite whose checks come from one kind of step (a
        lookup) leaves many examples without one. Closing steps draw nothing: every example keeps
        the steps its draws made, and a failure in one is a step like any other, replayed and
        shrunk with the rest."""
        return []

    def teardown(self) -> None:
        for step in self.closing_steps():
            if self.driver.dead:
                break
            self.driver.apply(step)
        self.driver.close()


def machine_for(suite: str | SuiteDef, engine_factory: Callable[[], Any], step_timeout: float | None = 10.0,
                max_examples: int = 100, step_count: int = 40, database: ExampleDatabase | None = None,
                on_example: Callable[[], None] | None = None) -> type[SuiteMachine]:
    """A suite's machine bound to an engine, for an engine's own test suite::

        TestMyEngine = machine_for("manager", MyAdapter).TestCase

    A failing rule fails the test with a :class:`~.verdicts.RuleViolation` naming it (a hang
    included); Hypothesis shrinks it as usual. With a ``database`` its failures are stored
    under the key ``kvoracle check`` replays from (:func:`examples_key`); ``on_example`` is
    called at the start of every example.
    """
    suite = get_suite(suite) if isinstance(suite, str) else suite
    caller = EngineCaller(step_timeout, returns=suite.returns)
    scope = set(suite.scope())
    probe = caller.construct(engine_factory, loading=True)
    verdicts = Verdicts(capabilities_of(probe), scope=lambda rule: rule.id in scope,
                        out_of_scope=f"not judged by {suite.label}")
    machine = bind_machine(suite, engine_factory, verdicts, caller, on_example, **suite.machine_options(probe))
    machine.TestCase.settings = settings(max_examples=max_examples, stateful_step_count=step_count, deadline=None,
                                         database=database, suppress_health_check=list(HealthCheck))
    return machine


def examples_key(machine: type[SuiteMachine]) -> bytes:
    """The key under which Hypothesis (and HypoFuzz) store a bound machine's examples."""
    return function_digest(get_state_machine_test(machine).hypothesis.inner_test)


def bind_machine(suite: SuiteDef, engine_factory: Callable[[], Any], verdicts: Verdicts,
                 caller: EngineCaller, on_example: Callable[[], None] | None = None,
                 **attributes: Any) -> type[SuiteMachine]:
    """The suite's machine class bound to ``engine_factory``'s engine."""
    name = f"{suite.machine.__name__}_{getattr(engine_factory, '__name__', 'engine')}"
    return type(name, (suite.machine,), {
        # Hypothesis keys a machine's stored examples by a digest of the machine class, into
        # which this goes: the same for every run of this suite (part) and engine, in any
        # process -- `kvoracle check`'s replay round, a pytest run, HypoFuzz's workers.
        "_hypothesis_internal_add_digest": database_key(suite.name, suite.alias, engine_spec_of(engine_factory, suite)),
        "suite": suite, "engine_factory": staticmethod(engine_factory), "verdicts": verdicts,
        "caller": caller, "round_quarantine": caller.quarantine.blocked(),
        "on_example": staticmethod(on_example) if on_example else None, **attributes})
