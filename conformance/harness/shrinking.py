"""Where in a round kvoracle's own contracts are checked.

The reference's icontract conditions check kvoracle, not the engine: a contract that fails is
kvoracle's bug, an INTERNAL ERROR, never the engine's. They are not cheap (its class invariants
walk the whole block pool around every method call, its postconditions compare snapshots of the
manager), so a run checks them only where a verdict rests on them. A run's ``contracts`` option
says where:

``reported`` (the default)
    On the replay Hypothesis makes of each counterexample before it is reported, and nowhere
    else in the round: neither while it draws examples nor while it shrinks a failure. A
    counterexample is charged to the engine only after that replay, contracts on, failed the
    rule again; a replay on which the reference breaks a contract is kvoracle's bug instead.
    With them off a manager-suite conviction against a vLLM mutant took a quarter less CPU
    time, the same test calls (docs/results.md, issue 18's sixteenth part). A failure drawn with
    them off is provisional: it ends the example and counts as the rule's detection once a
    replay with them on confirms the rule.
``drawing``
    Also on every example drawn (off only while shrinking): a reference that breaks a contract
    anywhere in the run stops it, even where the engine agreed with it. For kvoracle's own
    tests and for checking the reference itself; an engine built on the reference (the embedded
    default) checks its own contracts on its own thread in either mode.

While Hypothesis shrinks, the contracts are off in both modes: it replays hundreds of variants
of a failure it has already seen. A failure met then is not counted (the reference was not
checked on that example); it still ends the example, so the shrink goes on.

Only the conditions evaluated in the thread that runs the examples are off
(:func:`kvoracle.spec.contracts.suspended`); an engine called on the engine caller's worker
thread, or in this thread (:func:`kvoracle.spec.contracts.checked`), keeps its own. Whether the
conditions are on changes nothing the reference or the engine answers, so a round draws and
shrinks the same steps either way: a count of calls, on any machine.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from kvoracle.spec.contracts import ENABLED, can_suspend, suspended

try:  # Hypothesis internals: free to move
    from hypothesis.internal.conjecture.engine import ConjectureRunner as _Runner
except ImportError:  # pragma: no cover - depends on the installed Hypothesis
    _Runner = None  # type: ignore[assignment,misc]

#: Where a run checks kvoracle's contracts (the ``contracts`` option).
CONTRACT_MODES = ("reported", "drawing")
DEFAULT_CONTRACTS = "reported"

_SHRINKING: contextvars.ContextVar[bool] = contextvars.ContextVar("kvoracle_shrinking", default=False)


def is_shrinking() -> bool:
    """Whether Hypothesis is shrinking a failure in the current context."""
    return _SHRINKING.get()


def can_shrink_without_contracts() -> bool:
    """Whether there are contracts to switch off (``KVORACLE_CONTRACTS`` did not), and this
    Hypothesis and this icontract let a run switch them off while shrinking (else they stay on:
    slower, never wrong)."""
    return ENABLED and can_suspend() and all(
        callable(getattr(_Runner, name, None)) for name in ("run", "shrink_interesting_examples"))


@contextlib.contextmanager
def contracts_checked_where(mode: str = DEFAULT_CONTRACTS) -> Iterator[None]:
    """Within the block, a Hypothesis round checks kvoracle's contracts where ``mode`` says
    (:data:`CONTRACT_MODES`): with ``reported`` only on the replays of the failures it reports,
    with ``drawing`` also on the examples it draws. It never checks them while it shrinks."""
    if mode not in CONTRACT_MODES:
        raise ValueError(f"contracts must be one of {CONTRACT_MODES}, got {mode!r}")
    if not can_shrink_without_contracts():
        yield
        return
    run, shrink = _Runner.run, _Runner.shrink_interesting_examples

    def run_without_contracts(self: Any) -> None:
        # ConjectureRunner.run draws and shrinks; the replays of what it found come after it
        # returns (StateForActualGivenExecution.run_engine), with the contracts on again.
        with suspended():
            run(self)

    def shrink_without_contracts(self: Any) -> None:
        token = _SHRINKING.set(True)
        try:
            with suspended():
                shrink(self)
        finally:
            _SHRINKING.reset(token)

    if mode == "reported":
        _Runner.run = run_without_contracts  # type: ignore[method-assign]
    _Runner.shrink_interesting_examples = shrink_without_contracts  # type: ignore[method-assign]
    try:
        yield
    finally:
        _Runner.run, _Runner.shrink_interesting_examples = run, shrink  # type: ignore[method-assign]
