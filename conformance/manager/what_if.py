"""Trying another course on a copy of the reference.

The manager suite asks the reference questions it never follows: the free queue the other free
order leaves (KV-POOL-006 / KV-POOL-016), the smallest look-ahead a step fails with, what an
allocation would need, whether an engine's outcome is the reference's without a copy's page.
Each is answered on a deep copy of the reference, which the suite then drops.

The copy runs with kvoracle's contracts suspended. The reference's own course is checked
after every call; a copy only repeats that code from a state the course reached (or one
field away from it), and its answer decides which rule a difference is charged to or which
example is drawn, never a verdict by itself. The checks it would repeat are not cheap: the
class invariants walk the whole pool before and after every call, and the look-ahead searches
ask an allocation's need once per look-ahead (one such search took 14 % of a profiled run,
docs/results.md, fifteenth part).

Nothing inside the block may call the engine or judge it: a check made there would count as
one made while shrinking (:func:`kvoracle.spec.contracts.is_suspended`).

The copy is a pickle round trip rather than :func:`copy.deepcopy`: the same object graph (shared
objects stay shared, dicts keep their order, sets are rebuilt from their items either way), made
in about a third of the time -- the copies took a tenth of a profiled run.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator

from kvoracle.spec.contracts import suspended

from ..engines.reference import ReferenceEngine


@contextlib.contextmanager
def what_if(model: ReferenceEngine) -> Iterator[ReferenceEngine]:
    """A deep copy of ``model`` to try something on, with kvoracle's contracts suspended
    while the block runs."""
    with suspended():
        yield copy_of(model)


def copy_of(model: ReferenceEngine) -> ReferenceEngine:
    """A copy of ``model`` sharing no mutable state with it."""
    return pickle.loads(pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL))
