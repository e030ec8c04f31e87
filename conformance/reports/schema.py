"""The JSON Schema (draft 2020-12) of ``kvoracle check --json`` reports, and a validator.

The schema ships with kvoracle as ``report.schema.json`` and describes the reports this
kvoracle writes: ``format`` ``"kvoracle-report"``, ``format_version``
:data:`~..harness.report.REPORT_FORMAT_VERSION` (what raises that version:
:mod:`..harness.report`). :func:`load_schema` needs nothing beyond the standard library;
:func:`validate_report` needs ``jsonschema``, which the ``report`` extra installs
(``pip install 'kvoracle[report]'``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SCHEMA_FILE = "report.schema.json"


class InvalidReport(ValueError):
    """A report that does not match the schema; ``errors`` lists every mismatch."""

    def __init__(self, errors: list[str]) -> None:
        shown = "\n  ".join(errors[:10]) + (f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else "")
        super().__init__(f"not a valid kvoracle report ({len(errors)} problem(s)):\n  {shown}")
        self.errors = errors


def load_schema() -> dict[str, Any]:
    """The report schema, as a dict."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def _jsonschema():
    try:
        import jsonschema
    except ImportError as error:
        raise ImportError("validating a kvoracle report needs jsonschema: install kvoracle's 'report' extra "
                          "(pip install 'kvoracle[report]')") from error
    return jsonschema


def validate_report(data: Any) -> None:
    """Raise :class:`InvalidReport` unless ``data`` (a parsed JSON report) matches the schema."""
    jsonschema = _jsonschema()
    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(data), key=lambda error: error.json_path)
    if errors:
        raise InvalidReport([f"{error.json_path}: {error.message}" for error in errors])
