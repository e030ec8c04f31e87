"""While Hypothesis shrinks a failure, kvoracle's own contracts are off.

A round's failing example is shrunk by replaying hundreds of variants of it, and with the
reference's icontract conditions on (its class invariants walk the whole block pool on every
method call) each replay cost about 40 % more. Those conditions check kvoracle, not the engine:
they are on wherever an example is *drawn* (a contract that fails there is kvoracle's bug, an
INTERNAL ERROR) and on again for the replay Hypothesis makes of each shrunk counterexample
before it is reported. A shrunk variant on which the reference would break a contract therefore
never convicts the engine: its last replay fails the contract instead, an INTERNAL ERROR.

Only the conditions evaluated in the thread that runs the examples are off
(:func:`kvoracle.spec.contracts.suspended`); an engine called on the engine caller's worker
thread -- an engine built on kvoracle's reference, which checks itself -- keeps its own.
Whether the conditions are on changes nothing the reference or the engine answers, so the
shrink takes the same steps either way: a count of calls, on any machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvoracle.spec.contracts import ENABLED, can_suspend, suspended

try:  # Hypothesis internals: free to move
    from hypothesis.internal.conjecture.engine import ConjectureRunner as _Runner
except ImportError:  # pragma: no cover - depends on the installed Hypothesis
    _Runner = None  # type: ignore[assignment,misc]


def can_shrink_without_contracts() -> bool:
    """Whether there are contracts to switch off (``KVORACLE_CONTRACTS`` did not), and this
    Hypothesis and this icontract let a run switch them off while shrinking (else they stay on:
    slower, never wrong)."""
    return ENABLED and can_suspend() and callable(getattr(_Runner, "shrink_interesting_examples", None))


@contextlib.contextmanager
def contracts_off_while_shrinking() -> Iterator[None]:
    """Within the block, Hypothesis shrinks its failing examples with kvoracle's contracts
    suspended in the thread that runs them; its generation and its final replays keep them."""
    if not can_shrink_without_contracts():
        yield
        return
    shrink = _Runner.shrink_interesting_examples

    def shrink_without_contracts(self: Any) -> None:
        with suspended():
            shrink(self)

    _Runner.shrink_interesting_examples = shrink_without_contracts  # type: ignore[method-assign]
    try:
        yield
    finally:
        _Runner.shrink_interesting_examples = shrink  # type: ignore[method-assign]
