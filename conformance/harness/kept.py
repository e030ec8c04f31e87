"""Strategies built once per shape and kept, for the rules that draw from them on every step.

Hypothesis validates a strategy object, and works out its recursive properties (whether it
can be empty, whether its values can be reused), the first time that object is drawn from.
A rule that writes ``st.integers(1, n) | st.just(n)`` or ``st.sampled_from(live)`` builds a
new object at every step, so every step paid for that work again: measured with py-spy, it
was about a third of the lookup suite's time against vLLM, shrinks included. (In the manager
suite, whose steps cost more, it was too little to measure.) :func:`kept` builds a strategy
once per argument tuple.

A kept strategy draws exactly what a freshly built equal one would: what Hypothesis draws
depends on the strategy's shape and the choices it is given, never on the object's identity.
The suites' own determinism tests (the same examples and checks for a seed) hold across the
change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

#: Keeps what the decorated builder returns, per (hashable) arguments, told apart by type as
#: well as value (``True`` is not ``1`` here). Bounded: the shapes a run draws are few (block
#: counts, token counts up to the model length), but a long fuzzing session must not grow
#: without end.
kept = functools.lru_cache(maxsize=4096, typed=True)


@functools.lru_cache(maxsize=4096)
def _sampled(typed_elements: tuple[tuple[type, object], ...]) -> st.SearchStrategy:
    return st.sampled_from(tuple(element for _, element in typed_elements))


def sampled(elements: Sequence[T]) -> st.SearchStrategy[T]:
    """``st.sampled_from(elements)``, kept per tuple of elements (``sampled_from`` takes any
    sequence as the tuple of its elements, so the draws are the same).

    The elements are told apart by type as well as value, so ``[True, False]`` and ``[1, 0]``
    get strategies of their own (a plain cache takes them for one key, as ``True == 1``). A
    sequence inside an element is compared by value alone: the suites sample prompts, tuples
    of integer tokens, never tuples that mix booleans and integers."""
    return _sampled(tuple((type(element), element) for element in elements))
