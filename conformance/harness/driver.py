"""The step driver every suite's driver extends: apply a step, charge what failed.

A suite's driver subclass has one handler per step class (``_Configure`` for a
``Configure`` step, ...) that applies the step to kvoracle's model and, through
:meth:`Driver.call`, to the engine, then judges the answers with
``self.verdicts.check``. This base does what is the same in every suite: it keeps
the steps so far (the counterexample if a check fails), ends an example quietly
after a failure already reported, and charges an engine's misbehaviour
(:class:`~.calls.EngineError`) to a rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import icontract

from kvoracle.spec.contracts import is_suspended

from .calls import EngineCaller, EngineError
from .picture import missing
from .shrinking import is_shrinking
from .verdicts import Counterexample, KnownFailure, RuleViolation, Verdicts, violation

RULE_ID_IN_TEXT = re.compile(r"\bKV-[A-Z]+-\d{3}\b")


class Driver:
    """Applies steps to an engine and to the suite's model, and judges them."""

    #: The suite's name (set by each subclass; counterexamples carry it).
    suite_name = ""
    #: Charged for an engine failure when neither the call nor the step names an applicable rule.
    fault_rule = ""
    #: The kind of model the example runs (a driver that builds several kinds names them when it
    #: configures one): an operation that raised is quarantined in its own scope only.
    quarantine_scope = ""

    def __init__(self, engine_factory: Callable[[], Any], verdicts: Verdicts,
                 caller: EngineCaller | None = None) -> None:
        self.engine_factory = engine_factory
        self.verdicts = verdicts
        self.caller = caller if caller is not None else EngineCaller()
        self.engine: Any = None
        self.steps: list[object] = []
        #: Set once a failure ended the example: later steps are not applied.
        self.dead = False
        #: Record a hang as it is (a run: every replay of it would wait again) instead of
        #: raising it (a replay: the test must fail while the engine hangs).
        self.record_hangs = False
        #: Draw :meth:`picture` when a step fails (a replay asks for it: it calls the engine again).
        self.capture_picture = False
        #: The picture drawn at the failing step (:mod:`.picture`), when ``capture_picture`` asked.
        self.pictured: dict[str, Any] | None = None
        self._step_rule = ""
        self.prepare()

    def prepare(self) -> None:
        """Set up the suite's own state: its model of the engine, its configuration (none yet)."""

    def picture(self) -> list[dict[str, Any]] | None:
        """What kvoracle's model and the engine show now, side by side: a list of panels
        (:func:`.picture.panel`), or ``None`` when the suite has nothing to draw. Called at the
        step that failed, only when :attr:`capture_picture` asks; engine operations go through
        :meth:`call`, and an engine that fails in one leaves the picture out."""
        return None

    def _take_picture(self, failed: RuleViolation) -> dict[str, Any]:
        """:meth:`picture`, wrapped with what failed and where; never raises (a picture changes
        no verdict)."""
        step_rule = self._step_rule
        try:
            panels = self.picture()
            if not panels:
                return missing(f"the {self.suite_name} suite has nothing to draw at this step")
            drawn = {"suite": self.suite_name, "rule": failed.rule_id, "step": len(self.steps),
                     "panels": panels}
            json.dumps(drawn)  # plain data only: it travels in records and reports
            return drawn
        except RuleViolation as error:  # an engine call failed (Driver.call charged it)
            return missing(f"the engine failed while being pictured: {error.message}")
        except Exception as error:
            return missing(f"drawing the picture failed (a kvoracle bug): {type(error).__name__}: {error}")
        finally:
            self._step_rule = step_rule

    # -- engine calls --------------------------------------------------------------------------
    def new_engine(self) -> None:
        """Build a fresh adapter (a configure step calls this before configuring it)."""
        self.caller.trail.operation("the adapter's constructor", self._step_rule or self.fault_rule)
        try:
            self.engine = self.caller.construct(self.engine_factory)
        except EngineError as error:
            raise self._charge(error, None) from None

    def call(self, operation: str, *args: Any, rule: str | None = None, **kwargs: Any) -> Any:
        """``engine.operation(*args, **kwargs)``; a failure is charged to ``rule`` (default: the
        step's primary rule), or to the rule the engine's own message names."""
        self.caller.trail.operation(operation, rule or self._step_rule or self.fault_rule)
        try:
            return self.caller(self.engine, operation, *args, **kwargs)
        except EngineError as error:
            raise self._charge(error, rule) from None

    def _charge(self, error: EngineError, rule_id: str | None) -> RuleViolation:
        applicable = self.verdicts.applicable
        named = RULE_ID_IN_TEXT.search(error.detail)
        if named and named.group(0) in self.verdicts.outcomes and applicable(named.group(0)):
            # An engine that checks itself (one built on kvoracle's reference) names its rule.
            rule_id = named.group(0)
        else:
            rule_id = next((r for r in (rule_id, self._step_rule, self.fault_rule) if r and applicable(r)),
                           rule_id or self._step_rule or self.fault_rule)
            if not error.hung:
                # Not called again from the next round on, so that the run judges the rest.
                self.caller.quarantine.raised.setdefault((error.operation, self.quarantine_scope), error.detail)
        failure = violation(rule_id, str(error))
        failure.engine_error_kind = error.kind
        return failure

    # -- steps ---------------------------------------------------------------------------------
    def apply(self, step: object) -> None:
        if self.dead:
            return
        self.steps.append(step)
        self._step_rule = getattr(step, "primary_rule", "")
        self.caller.trail.step(step)
        try:
            getattr(self, "_" + type(step).__name__)(step)
            return
        except KnownFailure:
            self.dead = True
            return
        except RuleViolation as failed:
            found = failed
        except icontract.ViolationError as broken:  # kvoracle's own contract: its bug, never the engine's
            self.verdicts.broken_contracts.append(f"{type(broken).__name__}: {broken}")
            raise
        self.verdicts.failed(found.rule_id)  # a failed check noted it already; an engine error not
        self.dead = True
        if self.capture_picture:
            self.pictured = self._take_picture(found)
        found.steps = list(self.steps)
        example = Counterexample(found.rule_id, found.message, found.steps, found.is_engine_error,
                                 suite=self.suite_name, shrunk=not found.hung)
        # A check that failed while kvoracle's contracts were suspended (a shrink, or the drawing
        # of a run that checks them on reported counterexamples only) is no evidence until an
        # example with them on fails it too. An engine's own failure (it raised, hung, exited) is
        # its own whatever the reference said: kept, so that one seen only while shrinking and
        # not seen again is still charged as the engine's flakiness.
        if found.is_engine_error or not is_suspended():
            self.verdicts.first_seen.setdefault(found.rule_id, example)
            self.verdicts.seen_failing.setdefault(found.rule_id)
        elif not is_shrinking():  # drawn with the contracts off: confirmed at the run's end if no report shows it
            self.verdicts.provisional_seen.setdefault(found.rule_id, example)
        if found.rule_id in self.verdicts.suppressed:
            return
        if found.hung and self.record_hangs:
            self.verdicts.record(example)
            return
        # One origin and no context for every failure of a rule: Hypothesis tells failures apart by
        # type (one per rule), origin and context, and a hang replayed against its quarantine, or an
        # engine error raised from another line, is still the same failure.
        found.__context__ = found.__cause__ = None
        raise found.with_traceback(None)

    def close(self) -> None:
        """The example is over (the caller and its worker outlive it: they serve the whole run)."""
