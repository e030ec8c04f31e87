"""The same seed draws the same examples, whatever else the process has imported.

Hypothesis (from 6.131 on) mixes into its draws, now and then, literal constants it
reads from the source of every *local* module loaded in the process -- modules that
are not in the standard library or site-packages: kvoracle itself when installed
editable, an engine's adapter module, the user's own code. The pool grows whenever
such a module is imported, so one seed gave different examples under ``kvoracle
check`` (which imports the command's module) than under ``run_suite`` in a script,
and would give others again beside a different engine. A suite run is a
measurement: its examples must depend on the seed, the suite and the engine's
answers only. While a suite runs, :func:`independent_of_imports` hands Hypothesis an
empty pool of local constants (its own fixed global constants still apply).

Where Hypothesis has no such pool (older releases), there is nothing to pin.

Nor may the examples depend on how fast the machine is. Hypothesis' engine reads two
clocks: once a round has found a bug it goes on looking for others for at most ten
seconds of wall time, and it stops shrinking after five minutes. On a machine busy
with other work a round ran fewer examples in those ten seconds (it found other bugs,
or none), and a slow shrink was cut short (another counterexample). While a suite runs,
:func:`independent_of_time` makes both clocks counts of test calls: the search clock
ticks once per call so that the ten seconds become ``search_calls`` test calls after the
round's first failing example (or it stands still with ``search_calls=None``, and the
search ends by Hypothesis' own count alone), and the shrink clock ticks once per test
call so that the five-minute limit becomes a budget of ``shrink_calls`` test calls (the
only bound on the shrinker's unsuccessful attempts). A round's search and shrinking then
end after the same calls, with the same counterexamples, on an idle machine and a busy
one, fast or slow. (An earlier version counted CPU time instead: free of load, but not of the
machine's speed, and it let one shrink take minutes.)

Nor on where objects sit in memory, or on the process's string-hash seed. Hypothesis
labels the spans of a test case by hashing what drew them: the machine's rules (whose
hash mixes in their functions' addresses), strategy functions (their code, hashed as
strings) and sampled elements. One of its shrink passes walks the distinct labels sorted
by their decimal text, so two processes shrank one failure along different paths (one
seed gave 176,713 checks in one process and 206,467 in another). While a suite runs,
:func:`independent_of_hashing` has that pass take the labels in the order their spans
first occur in the example, which the seed and the engine's answers alone decide.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

try:  # Hypothesis internals: absent before 6.131, and free to move
    from hypothesis.internal.conjecture import providers as _providers
except ImportError:  # pragma: no cover - depends on the installed Hypothesis
    _providers = None  # type: ignore[assignment]
try:
    from hypothesis.internal.conjecture import engine as _engine
except ImportError:  # pragma: no cover
    _engine = None  # type: ignore[assignment]
try:
    from hypothesis.internal.conjecture import shrinker as _shrinker
except ImportError:  # pragma: no cover
    _shrinker = None  # type: ignore[assignment]


def pins_local_constants() -> bool:
    """Whether this Hypothesis has a local-constant pool that runs pin to empty."""
    return _providers is not None and all(
        hasattr(_providers, name) for name in ("_get_local_constants", "CONSTANTS_CACHE", "Constants"))


@contextlib.contextmanager
def independent_of_imports() -> Iterator[None]:
    """Within the block, Hypothesis draws no constants from local modules."""
    if not pins_local_constants():
        yield
        return
    original = _providers._get_local_constants
    empty = _providers.Constants()
    _providers._get_local_constants = lambda: empty
    _providers.CONSTANTS_CACHE.cache.clear()  # it caches the allowed constants per draw kind
    try:
        yield
    finally:
        _providers._get_local_constants = original
        _providers.CONSTANTS_CACHE.cache.clear()


#: Seconds of wall time Hypothesis' engine goes on generating after a round's first failing
#: example, looking for other bugs (a literal in its ``should_generate_more``).
HYPOTHESIS_SEARCH_SECONDS = 10


class CountingClocks:
    """The ``time`` module as Hypothesis' engine sees it in a run: both clocks Hypothesis' engine
    reads advance by one tick per test call (:meth:`tick`). On ``perf_counter`` (the shrink limit,
    and phase statistics that kvoracle does not read) a tick is Hypothesis' shrink limit divided
    by ``shrink_calls``; on ``monotonic`` (the search for other bugs after a round's first) it is
    Hypothesis' ten seconds divided by ``search_calls``, and with ``search_calls=None`` that clock
    stands still (the search then ends by Hypothesis' own count alone: at twice the call of the
    last new bug, or 1,000 calls after the first). Anything else is the real module's."""

    def __init__(self, shrink_calls: int, search_calls: int | None = None) -> None:
        for name, calls in (("shrink_calls", shrink_calls), ("search_calls", search_calls)):
            if calls is not None and calls < 1:
                raise ValueError(f"{name} must be >= 1, got {calls}")
        limit = getattr(_engine, "MAX_SHRINKING_SECONDS", 300)
        # Hypothesis checks each limit between calls: with a tick a hair over limit/calls, the
        # limit is passed at the end of the calls-th call, not one call earlier or later.
        self.seconds_per_call = limit / (shrink_calls - 0.5)
        self.search_seconds_per_call = 0.0 if search_calls is None \
            else HYPOTHESIS_SEARCH_SECONDS / (search_calls - 0.5)
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def tick(self) -> None:
        """One test call has begun."""
        self.calls += 1

    def perf_counter(self) -> float:
        return self.calls * self.seconds_per_call

    def monotonic(self) -> float:
        return self.calls * self.search_seconds_per_call


def can_replace_the_clocks() -> bool:
    """Whether this Hypothesis's engine reads a ``time`` module that runs can replace (its clocks
    for the post-bug search and the shrink limit)."""
    return _engine is not None and hasattr(_engine, "time")


@contextlib.contextmanager
def independent_of_time(clock: CountingClocks) -> Iterator[None]:
    """Within the block, Hypothesis' search after a bug ends after the clock's ``search_calls``
    test calls (or by Hypothesis' own count), and its shrinking after ``shrink_calls``. The
    caller calls the clock's ``tick()`` at the start of every test call."""
    if not can_replace_the_clocks():
        yield
        return
    running = _engine.time
    _engine.time = clock  # type: ignore[assignment]
    try:
        yield
    finally:
        _engine.time = running  # type: ignore[assignment]


def orders_labels_by_occurrence() -> bool:
    """Whether this Hypothesis's shrinker has the label order that runs replace."""
    shrinker = getattr(_shrinker, "Shrinker", None)
    return (shrinker is not None and isinstance(getattr(shrinker, "distinct_labels", None), property)
            and hasattr(shrinker, "derived_value"))


def _labels_in_order_of_occurrence(self: object) -> list[int]:
    # spans_by_label is a dict filled span by span: its keys are in order of first occurrence.
    return list(self.spans_by_label)  # type: ignore[attr-defined]


_labels_in_order_of_occurrence.__name__ = "distinct_labels"  # the shrinker's cache key for it


@contextlib.contextmanager
def independent_of_hashing() -> Iterator[None]:
    """Within the block, the shrinker walks span labels in the order the spans first occur,
    not sorted by the labels' hash-derived values."""
    if not orders_labels_by_occurrence():
        yield
        return
    shrinker = _shrinker.Shrinker
    by_value = shrinker.distinct_labels
    shrinker.distinct_labels = shrinker.derived_value(_labels_in_order_of_occurrence)
    try:
        yield
    finally:
        shrinker.distinct_labels = by_value
