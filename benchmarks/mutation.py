"""Source mutants of a real engine: one small edit to one function, applied while a suite runs.

A :class:`Mutant` names a function of the installed engine (``module:Class.method`` or
``module:function``), a piece of its source text and what replaces it -- the kind of edit a
real bug is (a bound off by one, a reversed order, a missing reference-count change, the
wrong free-queue end). :func:`applied` reads the function's *installed* source, makes the
edit, compiles the result in the function's own module globals and puts it in place of the
original (on its class, or in every loaded module that holds the function) until the
``with`` block ends. So the engine's own code runs everywhere else, and no engine code is
copied into kvoracle: a mutant carries only the few characters it changes.

An edit must match exactly once (or name which occurrence) in the function's source, so a
mutant written for one release fails loudly -- :class:`StaleMutant` -- on a release whose
code moved, instead of silently testing nothing.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs

#: The kinds of edit, after the kinds real bugs take (issue 18).
KINDS = (
    "off-by-one",       # a bound, a count or an index one block/token out
    "wrong-order",      # a sequence taken or released in the other order
    "wrong-group",      # a value of one KV-cache group used for another
    "refcount",         # a reference-count change missing, doubled or reversed
    "stale-hash",       # a block hash not set, not cleared, or kept after reuse
    "free-queue-end",   # a block queued at, or taken from, the wrong end of the free queue
    "skipped-step",     # an EAGLE, alignment, window or bookkeeping step left out
    "wrong-condition",  # a test inverted or made always/never true
)


class StaleMutant(Exception):
    """The mutant does not apply to the installed engine (its code moved or changed)."""


@attrs.frozen
class Mutant:
    """One edit of one function of the engine."""

    #: Stable identifier, cited by reports: ``<area>.<function>.<what>``.
    key: str
    #: ``module:Qualified.name`` of the function edited.
    target: str
    #: Source text of the function to replace (after dedenting), and its replacement.
    find: str
    replace: str
    kind: str
    #: The suite whose steps reach the function first (kill-rate runs try it first).
    suite: str
    #: Which occurrence of ``find`` to edit when it occurs more than once (0-based).
    occurrence: int | None = None
    #: What the edit breaks, in a line.
    note: str = ""
    #: Non-empty: why the edit cannot change anything a suite observes (an equivalent
    #: mutant); such a mutant is listed, not counted as a survivor.
    equivalent: str = ""

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"mutant {self.key}: kind {self.kind!r} is not one of {KINDS}")
        if self.find == self.replace:
            raise ValueError(f"mutant {self.key}: the edit changes nothing")


def _resolve(target: str) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw attribute) for ``module:Qualified.name``."""
    module_name, _, qualname = target.partition(":")
    if not qualname:
        raise StaleMutant(f"{target}: expected module:Qualified.name")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise StaleMutant(f"{target}: cannot import {module_name}: {error}") from None
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise StaleMutant(f"{target}: no {part} in {module_name}")
    raw = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:
        raise StaleMutant(f"{target}: no {name}")
    return owner, name, raw


def _function_of(raw: Any) -> Any:
    for kind in (staticmethod, classmethod):
        if isinstance(raw, kind):
            return raw.__func__
    if isinstance(raw, property):
        return raw.fget
    return raw


def _rewrap(raw: Any, function: Any) -> Any:
    for kind in (staticmethod, classmethod):
        if isinstance(raw, kind):
            return kind(function)
    if isinstance(raw, property):
        return property(function, raw.fset, raw.fdel, raw.__doc__)
    return function


def mutated_source(mutant: Mutant) -> str:
    """The edited source of the mutant's function; raises :class:`StaleMutant`."""
    _, _, raw = _resolve(mutant.target)
    function = _function_of(raw)
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError) as error:
        raise StaleMutant(f"{mutant.key}: no source for {mutant.target}: {error}") from None
    count = source.count(mutant.find)
    if count == 0:
        raise StaleMutant(f"{mutant.key}: {mutant.find!r} is not in {mutant.target}")
    if mutant.occurrence is None and count > 1:
        raise StaleMutant(f"{mutant.key}: {mutant.find!r} occurs {count} times in {mutant.target}; "
                          "name the occurrence")
    index = mutant.occurrence or 0
    if index >= count:
        raise StaleMutant(f"{mutant.key}: {mutant.find!r} occurs {count} times in {mutant.target}, "
                          f"not {index + 1}")
    start = -1
    for _ in range(index + 1):
        start = source.index(mutant.find, start + 1)
    return source[:start] + mutant.replace + source[start + len(mutant.find):]


def _compile(mutant: Mutant, raw: Any, source: str, owner: Any) -> Any:
    function = _function_of(raw)
    # A zero-argument super() gives a method a __class__ cell (rewritten below); any other
    # free variable belongs to an enclosing function the edit cannot see.
    if set(function.__code__.co_freevars) - {"__class__"}:
        raise StaleMutant(f"{mutant.key}: {mutant.target} is a closure; it cannot be recompiled")
    if isinstance(owner, type) and "super()" in source:
        # A zero-argument super() needs the class cell of a class body; name the class.
        source = source.replace("super()", f"super({owner.__name__}, self)")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise StaleMutant(f"{mutant.key}: the edit does not parse: {error}") from None
    # Line numbers of the original file, so that tracebacks point at the right place.
    ast.increment_lineno(tree, function.__code__.co_firstlineno - 1)
    code = compile(tree, function.__code__.co_filename, "exec")
    # Compiled against the module's own globals (names the engine sets at run time, such
    # as its hash seed, stay live); the definition itself lands in a namespace of its own.
    namespace: dict[str, Any] = {}
    exec(code, function.__globals__, namespace)
    new = _function_of(namespace[function.__name__])
    new.__qualname__ = function.__qualname__
    new.__module__ = function.__module__
    return new


@contextlib.contextmanager
def applied(mutant: Mutant) -> Iterator[None]:
    """The engine with ``mutant`` in place of its function, for the ``with`` block."""
    owner, name, raw = _resolve(mutant.target)
    new = _compile(mutant, raw, mutated_source(mutant), owner)
    original_function = _function_of(raw)
    replaced: list[tuple[Any, str, Any]] = []
    if isinstance(owner, type):
        replaced.append((owner, name, raw))
        setattr(owner, name, _rewrap(raw, new))
    else:
        # A module function: every loaded module that imported it holds its own reference.
        for module in list(sys.modules.values()):
            holder = getattr(module, "__dict__", None)
            if not holder:
                continue
            for attribute, value in list(holder.items()):
                if value is original_function:
                    replaced.append((module, attribute, value))
                    setattr(module, attribute, new)
    try:
        yield
    finally:
        for holder, attribute, value in reversed(replaced):
            setattr(holder, attribute, value)
