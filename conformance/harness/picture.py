"""A picture of a failing step: what kvoracle's model and the engine show there, side by side.

A suite's driver draws it (:meth:`~.driver.Driver.picture`) at the step that failed, when
a replay of a counterexample asks for it. The picture is plain JSON data, the same for
every suite, so that it travels in a supervised worker's records and any report can draw
it without knowing the suite:

``{"suite", "rule", "step", "panels": [panel, ...]}``
    ``step`` is the 1-based number of the failing step in the counterexample's steps.
``panel = {"title", "note", "compare", "rows": [row, ...]}``
    One thing both sides show (the block tables of one KV-cache group, the free queue,
    a lookup's hit blocks). ``compare`` is ``"values"`` (cells at one position should be
    equal) or ``"shape"`` (only the lengths are comparable: an engine that numbers its
    blocks its own way).
``row = {"label", "reference", "engine"}``
    One line of the panel (a request, a group), keyed by ``label``; each side is a list of
    cells -- block ids, flags, counts, or ``None`` for an empty cell -- or ``None`` when that
    side has no such row.

A picture that could not be taken is ``{"missing": reason}`` (the replay no longer
fails, the engine failed while being pictured, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: One cell of a row: JSON scalars only.
Cell = int | float | str | bool | None

VALUES, SHAPE = "values", "shape"


def cell(value: object) -> Cell:
    """``value`` as a JSON scalar (a hash as the start of its hex text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # type: ignore[return-value]
    if isinstance(value, bytes):
        return value.hex()[:8]
    if hasattr(value, "__index__"):
        return int(value)  # type: ignore[call-overload]
    return str(value)


def _cells(values: Iterable[object] | None) -> list[Cell] | None:
    return None if values is None else [cell(v) for v in values]


def row(label: object, reference: Iterable[object] | None, engine: Iterable[object] | None) -> dict[str, Any]:
    return {"label": str(label), "reference": _cells(reference), "engine": _cells(engine)}


def rows_by_position(labels: Sequence[object], reference: Sequence[Iterable[object]],
                     engine: Sequence[Iterable[object]]) -> list[dict[str, Any]]:
    """One row per label, the i-th holding each side's i-th item (``None`` past a side's end)."""
    return [row(label, reference[i] if i < len(reference) else None, engine[i] if i < len(engine) else None)
            for i, label in enumerate(labels)]


def rows_by_key(reference: Mapping[Any, Iterable[object]] | None, engine: Mapping[Any, Iterable[object]] | None,
                label: Any = str) -> list[dict[str, Any]]:
    """One row per key of either side, the reference's keys first (in its order)."""
    reference, engine = reference or {}, engine or {}
    keys = list(reference) + [key for key in engine if key not in reference]
    return [row(label(key), reference.get(key), engine.get(key)) for key in keys]


def panel(title: str, rows: Sequence[dict[str, Any]], note: str = "", compare: str = VALUES) -> dict[str, Any]:
    return {"title": title, "note": note, "compare": compare, "rows": list(rows)}


def group_label(group: int, kind: str, block_size: int, param: int = 0) -> str:
    """A KV-cache group's row label: ``group 1: sliding window 4, block size 2``."""
    what = {"sliding_window": f"sliding window {param}", "chunked_local": f"chunked local {param}"}.get(
        kind, kind.replace("_", " "))
    return f"group {group}: {what}, block size {block_size}"


def missing(reason: str) -> dict[str, str]:
    """The picture of a counterexample that could not be taken, and why."""
    return {"missing": reason}


def diverging(row: Mapping[str, Any], compare: str = VALUES) -> tuple[list[bool], list[bool]]:
    """Which cells of a row differ from the other side's: ``(reference flags, engine flags)``.

    A cell differs when the other side has no cell at its position, or (comparing values) a
    different one there. A side without the row has no cells: every cell of the other differs.
    """
    mine, theirs = row.get("reference") or [], row.get("engine") or []

    def flags(cells: list[Cell], other: list[Cell]) -> list[bool]:
        return [i >= len(other) or (compare == VALUES and value != other[i]) for i, value in enumerate(cells)]
    return flags(mine, theirs), flags(theirs, mine)


def differs(panel: Mapping[str, Any]) -> bool:
    """Whether any row of ``panel`` differs between the two sides."""
    return any((row.get("reference") is None) != (row.get("engine") is None)
               or any(flag for side in diverging(row, panel.get("compare", VALUES)) for flag in side)
               for row in panel["rows"])
