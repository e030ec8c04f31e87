"""Per-rule verdicts: every check a run makes is recorded against a rule ID.

The closed set of outcomes (after the WebAssembly reference interpreter's
closed set of assertion kinds):

``pass``            the rule was checked at least once and never failed
``fail``            a check of the rule failed (with a shrunk counterexample)
``error``           the engine raised or hung during a step governed by the rule
``expected-fail``   the rule fails, as the engine's expectations file says it does
``unexpected-pass`` the expectations file says it fails, but it was checked and passed (strict xfail)
``not-applicable``  the engine does not claim what the rule needs (a capability)
``unexercised``     applicable, but the run never reached a check of it

Each rule's outcome also says when, in seconds of ``time.perf_counter`` since its suite run
began, a check of it first failed (time to detection) and its counterexample was recorded,
shrunk (time to conviction). Reports show these times; no verdict depends on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from kvoracle.spec import Rule, all_rules, get_rule
from kvoracle.spec.contracts import is_suspended

from .capabilities import MODE_RULES, Capabilities
from .shrinking import is_shrinking

PASS = "pass"
FAIL = "fail"
ERROR = "error"
EXPECTED_FAIL = "expected-fail"
UNEXPECTED_PASS = "unexpected-pass"
NOT_APPLICABLE = "not-applicable"
UNEXERCISED = "unexercised"
OUTCOMES = (PASS, FAIL, ERROR, EXPECTED_FAIL, UNEXPECTED_PASS, NOT_APPLICABLE, UNEXERCISED)
#: Outcomes that let ``kvoracle check`` exit 0.
GOOD_OUTCOMES = (PASS, EXPECTED_FAIL, NOT_APPLICABLE)

def applicability(rule_id: str, capabilities: Capabilities) -> str | None:
    """Why a rule is not applicable to an engine, or ``None`` if it is."""
    rule = get_rule(rule_id)
    if rule.kind == "validation":
        return "kvoracle input validation (checked by kvoracle's own tests, not per engine)"
    if rule_id in MODE_RULES:
        name, value = MODE_RULES[rule_id]
        if getattr(capabilities, name) not in (value if isinstance(value, tuple) else (value,)):
            return f"engine declares {name}={getattr(capabilities, name)!r}"
    missing = [name for name in rule.needs if not getattr(capabilities, name)]
    if missing:
        return "engine does not claim " + ", ".join(missing)
    return None


class KnownFailure(Exception):
    """A rule that already has a counterexample failed again.

    The example stops being judged: after a known divergence the engine's state
    differs from the reference's for a reason already reported, and every later
    comparison would only repeat it under other rules' names.
    """

    def __init__(self, rule_id: str) -> None:
        super().__init__(rule_id)
        self.rule_id = rule_id


class RuleViolation(AssertionError):
    """A check failed. Carries the rule and, once known, the steps that led to it."""

    def __init__(self, rule_id: str, message: str) -> None:
        super().__init__(f"{rule_id} ({get_rule(rule_id).title}): {message}")
        self.rule_id = rule_id
        self.message = message
        self.steps: list[object] = []
        #: How the engine failed, when the violation is an engine error (see :mod:`.calls`).
        self.engine_error_kind: str | None = None

    @property
    def is_engine_error(self) -> bool:
        return self.engine_error_kind is not None

    @property
    def hung(self) -> bool:
        return self.engine_error_kind == "hung"


_VIOLATION_TYPES: dict[str, type[RuleViolation]] = {}


def violation(rule_id: str, message: str) -> RuleViolation:
    """A :class:`RuleViolation` of a class of its own per rule.

    Hypothesis tells failures apart by exception type and origin; one class per
    rule keeps it from shrinking a failure of one rule into a failure of another.
    """
    cls = _VIOLATION_TYPES.get(rule_id)
    if cls is None:
        name = "Violation_" + rule_id.replace("-", "_")
        cls = _VIOLATION_TYPES[rule_id] = type(name, (RuleViolation,), {})
    return cls(rule_id, message)


@attrs.define
class Counterexample:
    rule_id: str
    message: str
    steps: list[object]
    engine_error: bool = False
    replay_path: str | None = None
    #: The suite whose steps these are.
    suite: str = ""
    #: Hypothesis could not make the failure happen again on replay (an engine that fails
    #: intermittently): the steps are those of the failing run, not shrunk.
    flaky: bool = False
    #: Not shrunk (a hang, whose every replay would wait again; or a crash of the process).
    shrunk: bool = True
    #: What the model and the engine show at the failing step, drawn by a replay (plain JSON
    #: data, :mod:`.picture`; ``{"missing": why}`` if none could be drawn); None: not asked for.
    picture: dict | None = None


@attrs.define
class RuleOutcome:
    rule_id: str
    not_applicable: str | None = None
    checks: int = 0
    failed_checks: int = 0
    counterexamples: list[Counterexample] = attrs.Factory(list)
    errors: list[Counterexample] = attrs.Factory(list)
    expected: str | None = None  # reason from an expectations file
    #: Seconds from the suite run's start to the first failed check (or engine error) of the
    #: rule, and to its first recorded counterexample; None: never, or not timed (a death of
    #: the worker process, charged by the supervisor, which has no clock of the run).
    first_failure_s: float | None = None
    conviction_s: float | None = None

    @property
    def outcome(self) -> str:
        if self.not_applicable is not None:
            return NOT_APPLICABLE
        failing = bool(self.counterexamples or self.failed_checks)
        if self.expected is not None:
            if failing or self.errors:
                return EXPECTED_FAIL
            # An expected failure the run never checked did not pass: nothing tested the expectation.
            return UNEXPECTED_PASS if self.checks else UNEXERCISED
        if failing:
            return FAIL
        if self.errors:
            return ERROR
        return PASS if self.checks else UNEXERCISED


class Verdicts:
    """Collects checks for one engine across a whole run."""

    def __init__(self, capabilities: Capabilities,
                 expectations: dict[str, str] | None = None,
                 scope: Callable[[Rule], bool] | None = None, out_of_scope: str = "") -> None:
        """``scope`` says which rules the suite judges; the others are not applicable,
        with ``out_of_scope`` as the reason, and their expectations are dropped."""
        self.capabilities = capabilities
        self.outcomes: dict[str, RuleOutcome] = {}
        for rule in all_rules():
            judged = scope is None or scope(rule)
            self.outcomes[rule.id] = RuleOutcome(
                rule.id, not_applicable=applicability(rule.id, capabilities) if judged else out_of_scope,
                expected=(expectations or {}).get(rule.id) if judged else None)
        #: Rules with a recorded counterexample: a later failure ends the example quietly.
        self.suppressed: set[str] = set()
        #: The first (unshrunk) failing step list seen for each rule, kept in case shrinking
        #: another rule's failure was the only time this rule failed.
        self.first_seen: dict[str, Counterexample] = {}
        #: kvoracle's own contracts that failed in a step (its bugs), as their messages: Hypothesis
        #: may report such a failure as inconsistent data generation instead, when the contract held
        #: on the same example while it shrank (:mod:`.shrinking`), so the runner names it from here.
        self.broken_contracts: list[str] = []
        #: When each rule first failed on an example drawn with kvoracle's contracts off (a run
        #: checking them only on reported counterexamples): its detection, once a failure with
        #: them on confirms the rule.
        self.provisional_failures: dict[str, float | None] = {}
        #: The first example each rule failed while drawn with the contracts off, unshrunk.
        self.provisional_seen: dict[str, Counterexample] = {}
        #: Rules in the order a failure of theirs was first seen, checked or provisional.
        self.seen_failing: dict[str, None] = {}
        #: The run's clock (``time.perf_counter``) starts with its verdicts; None: not timed.
        self.started: float | None = time.perf_counter()

    def elapsed(self) -> float | None:
        """Seconds since the run started, or ``None`` if these verdicts are not timed."""
        return None if self.started is None else time.perf_counter() - self.started

    def failed(self, rule_id: str) -> None:
        """Note the time of ``rule_id``'s first failure (a failed check or an engine error)."""
        if is_suspended():
            # Not evidence yet (see check()). Met while Hypothesis draws examples, it is the
            # rule's detection should a failure with the contracts on confirm the rule; met
            # while it shrinks a failure already seen, nothing.
            if not is_shrinking() and rule_id not in self.provisional_failures:
                self.provisional_failures[rule_id] = self.elapsed()
                self.seen_failing.setdefault(rule_id)
            return
        outcome = self.outcomes[rule_id]
        if outcome.first_failure_s is None:
            outcome.first_failure_s = self._detected(rule_id, self.elapsed())
        self.seen_failing.setdefault(rule_id)

    def _detected(self, rule_id: str, now: float | None) -> float | None:
        """When ``rule_id``'s failure, confirmed ``now``, was first seen."""
        return self.provisional_failures.get(rule_id, now)

    def exclude(self, rule_id: str, reason: str) -> None:
        """Judge ``rule_id`` not at all in this run (the suite gives the engine no example reaching it)."""
        outcome = self.outcomes[rule_id]
        if outcome.not_applicable is None:
            outcome.not_applicable, outcome.expected = reason, None

    def applicable(self, rule_id: str) -> bool:
        return self.outcomes[rule_id].not_applicable is None

    def check(self, rule_id: str, ok: bool, message: str | object = "") -> None:
        """Record one check of ``rule_id``; raise :class:`RuleViolation` when it fails."""
        outcome = self.outcomes[rule_id]
        if outcome.not_applicable is not None:
            return
        outcome.checks += 1
        if ok:
            return
        # A failure seen with kvoracle's contracts suspended (while Hypothesis shrinks, and while
        # it draws in a run that checks them on reported counterexamples only) is not counted:
        # the reference was not checked on that example. It still ends the example, so the round
        # goes on; it counts once an example with the contracts on fails (Hypothesis replays
        # every failure it reports), never on an example where the reference broke one.
        if not is_suspended():
            outcome.failed_checks += 1
        self.failed(rule_id)
        if rule_id in self.suppressed:
            raise KnownFailure(rule_id)
        raise violation(rule_id, message() if callable(message) else str(message))

    def unconfirmed_failures(self) -> list[Counterexample]:
        """The first examples of rules that failed only while drawn with kvoracle's contracts off,
        and that no counterexample, engine error or checked failure shows: each is replayed with
        the contracts on before anything is charged (a fail-fast shrink that slipped to another
        rule's smaller example leaves its own rule so)."""
        return [example for rule_id, example in self.provisional_seen.items()
                if not (self.outcomes[rule_id].counterexamples or self.outcomes[rule_id].errors
                        or self.outcomes[rule_id].failed_checks)]

    def confirm(self, example: Counterexample) -> None:
        """``example``, drawn with the contracts off, failed its rule again on a replay with them on:
        a failed check, first seen when it was drawn."""
        outcome = self.outcomes[example.rule_id]
        outcome.failed_checks += 1
        if outcome.first_failure_s is None:
            outcome.first_failure_s = self._detected(example.rule_id, self.elapsed())
        self.first_seen.setdefault(example.rule_id, example)

    def unrecorded_failures(self) -> list[Counterexample]:
        """Counterexamples for rules that failed but never got a shrunk one."""
        examples = []
        for rule_id, outcome in self.outcomes.items():
            if (outcome.failed_checks and not outcome.counterexamples and not outcome.errors
                    and rule_id in self.first_seen):
                examples.append(attrs.evolve(self.first_seen[rule_id], shrunk=False))
        return examples

    def record(self, example: Counterexample) -> None:
        outcome = self.outcomes[example.rule_id]
        (outcome.errors if example.engine_error else outcome.counterexamples).append(example)
        now = self.elapsed()
        if outcome.first_failure_s is None:  # detected no later than convicted (a hang: at once)
            outcome.first_failure_s = self._detected(example.rule_id, now)
        self.seen_failing.setdefault(example.rule_id)
        if outcome.conviction_s is None:
            outcome.conviction_s = now
        self.suppressed.add(example.rule_id)

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for outcome in self.outcomes.values():
            counts[outcome.outcome] += 1
        return counts

    def ok(self) -> bool:
        return all(o.outcome in GOOD_OUTCOMES for o in self.outcomes.values())

    def convicted(self) -> bool:
        """Whether some rule failed or erred (an expected failure, a rule not yet checked, an
        expectation not yet met are no conviction): what ends a fail-fast run."""
        return any(o.outcome in (FAIL, ERROR) for o in self.outcomes.values())
