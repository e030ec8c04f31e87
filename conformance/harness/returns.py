"""Return-type validators: what each protocol operation must hand back.

A suite's protocol declares, per operation, one of these validators. The engine
caller applies it to every answer, so a wrong type (``lookup`` answering ``None``,
``observe`` a dict) is the engine's error, charged to a rule -- never a crash inside
kvoracle's comparisons. A validator returns ``None`` for an acceptable value, else
a short description of what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Validator = Callable[[Any], "str | None"]


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def anything(value: Any) -> str | None:
    return None


def instance_of(kind: type | tuple[type, ...]) -> Validator:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) and kind is int:
            return "expected int, got bool"
        return None if isinstance(value, kind) else f"expected {_name(kind)}, got {type(value).__name__}"
    return check


def integer(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected int, got {type(value).__name__}"
    return None


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected bool, got {type(value).__name__}"


def nothing(value: Any) -> str | None:
    return None if value is None else f"expected None, got {type(value).__name__}"


def optional(inner: Validator) -> Validator:
    def check(value: Any) -> str | None:
        return None if value is None else inner(value)
    return check


def sequence_of(item: Validator, length: int | None = None) -> Validator:
    """A list or tuple (not a string) whose items pass ``item``."""
    def check(value: Any) -> str | None:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            return f"expected a sequence, got {type(value).__name__}"
        if length is not None and len(value) != length:
            return f"expected {length} items, got {len(value)}"
        for index, element in enumerate(value):
            problem = item(element)
            if problem is not None:
                return f"item {index}: {problem}"
        return None
    return check


def tuple_of(*items: Validator) -> Validator:
    """A fixed-length sequence whose items pass their own validators: ``(masks, hit)``."""
    whole = sequence_of(anything, length=len(items))

    def check(value: Any) -> str | None:
        problem = whole(value)
        if problem is not None:
            return problem
        for index, (element, validate) in enumerate(zip(value, items)):
            problem = validate(element)
            if problem is not None:
                return f"item {index}: {problem}"
        return None
    return check


def mapping_of(key: Validator, item: Validator) -> Validator:
    def check(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return f"expected a mapping, got {type(value).__name__}"
        for k, v in value.items():
            problem = key(k) or item(v)
            if problem is not None:
                return f"entry {k!r}: {problem}"
        return None
    return check


def attributes(kind: type, **fields: Validator) -> Validator:
    """An instance of ``kind`` whose named attributes pass their validators."""
    def check(value: Any) -> str | None:
        if not isinstance(value, kind):
            return f"expected {kind.__name__}, got {type(value).__name__}"
        for name, validate in fields.items():
            problem = validate(getattr(value, name, None))
            if problem is not None:
                return f"{name}: {problem}"
        return None
    return check


#: Block ids per group: ``((1, 2), (0, 3))``.
block_id_groups = sequence_of(sequence_of(integer))
#: Per-group masks: ``((True, False), ())``.
mask_groups = sequence_of(sequence_of(boolean))
