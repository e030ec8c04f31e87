"""Expectations files: the rules an engine is known to break, and why.

An engine may differ from kvoracle's specification on purpose (or in a release
that kvoracle still wants to check). Such differences are listed in a TOML file,
``conformance/engines/<engine name>.toml`` for the built-in engines::

    [[expect]]
    rule = "KV-FULL-003"
    versions = ">=0.33.0,<0.34"
    reason = "why the engine differs"
    source = "https://github.com/.../file.py#L123"
    suite = "manager"           # optional: only in this suite's runs

``kvoracle check`` reports a listed rule that fails as ``expected-fail`` and one
that no longer fails as ``unexpected-pass``, which fails the run (strict xfail):
a fixed difference must be removed from the file. ``versions`` is a
comma-separated list of ``<op> version`` clauses (``>=``, ``>``, ``<=``, ``<``,
``==``, ``!=``; ``==0.33.*`` matches a release line); an entry whose range
excludes the engine's version is ignored.

A user's own file (``kvoracle check --expectations FILE``, the pytest plugin's
``--kvoracle-expectations``) has the same format and adds to the packaged one; it
applies to whichever engine is checked.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvoracle.spec import all_rules

from .suites import suite_aliases

#: Where the built-in engines' expectation files live.
ENGINES_DIR = Path(__file__).resolve().parent.parent / "engines"
REQUIRED_KEYS = ("rule", "versions", "reason")


class ExpectationsError(ValueError):
    """A malformed expectations file."""


def expectations_path(engine_name: str) -> Path | None:
    """``conformance/engines/<engine_name>.toml``, if there is one."""
    path = ENGINES_DIR / f"{engine_name}.toml"
    return path if path.is_file() else None


def load_expectations(path: Path, engine_version: str, suite: str | None = None) -> dict[str, str]:
    """Rule id -> reason for each entry of ``path`` whose range holds ``engine_version`` (and,
    when an entry names a suite, only for that ``suite``)."""
    try:
        document = _read_toml(path)
    except OSError as error:
        raise ExpectationsError(f"{path}: cannot read: {error.strerror or error}") from None
    except ValueError as error:  # tomllib.TOMLDecodeError
        raise ExpectationsError(f"{path}: not valid TOML: {error}") from None
    entries = document.get("expect", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"{path}: 'expect' must be an array of tables ([[expect]])")
    known = {rule.id for rule in all_rules()}
    expected: dict[str, str] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: entry {index + 1}"
        missing = [key for key in REQUIRED_KEYS if not isinstance(entry.get(key), str)]
        if missing:
            raise ExpectationsError(f"{where}: missing or non-string {', '.join(missing)}")
        rule_id = entry["rule"]
        if rule_id not in known:
            raise ExpectationsError(f"{where}: unknown rule {rule_id!r}")
        if "suite" in entry and not isinstance(entry["suite"], str):
            raise ExpectationsError(f"{where}: 'suite' must be a string")
        if not version_in_range(engine_version, entry["versions"]):
            continue
        # An entry may name a suite by an older name that is now an alias of a part of it.
        named = entry.get("suite", suite)
        if suite is not None and suite_aliases().get(named, named) != suite:
            continue
        reason = entry["reason"]
        if entry.get("source"):
            reason += f" ({entry['source']})"
        expected[rule_id] = f"{expected[rule_id]}; {reason}" if rule_id in expected else reason
    return expected


def expectations_for(adapter: Any, suite: str | None = None, extra: Sequence[Path] = ()
                     ) -> dict[str, str] | None:
    """The expected failures of ``adapter``'s engine in ``suite``: its packaged file
    (``engines/<name>.toml``) and the user's files ``extra``; ``None`` when there are none."""
    version = str(adapter.version()) if callable(getattr(adapter, "version", None)) else ""
    paths = [p for p in (expectations_path(str(getattr(adapter, "name", ""))),) if p] + list(extra)
    if not paths:
        return None
    expected: dict[str, str] = {}
    for path in paths:
        for rule_id, reason in load_expectations(path, version, suite).items():
            expected[rule_id] = f"{expected[rule_id]}; {reason}" if rule_id in expected else reason
    return expected


# -- versions --------------------------------------------------------------------------------
_CLAUSE = re.compile(r"^(>=|<=|==|!=|>|<)\s*([0-9][0-9A-Za-z.+*-]*)$")


def _release(version: str) -> tuple[int, ...]:
    """The numeric release part: ``0.33.0rc1+cpu`` -> (0, 33, 0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies every clause of ``spec`` (e.g. ``">=0.33,<0.34"``)."""
    have = _release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ExpectationsError(f"bad version clause {clause!r} in {spec!r}")
        op, wanted = match.groups()
        if wanted.endswith(".*"):
            if op not in ("==", "!="):
                raise ExpectationsError(f"a wildcard needs == or != in {clause!r}")
            prefix = _release(wanted[:-2])
            if (have[:len(prefix)] == prefix) != (op == "=="):
                return False
            continue
        order = _compare(have, _release(wanted))
        ok = {">=": order >= 0, ">": order > 0, "<=": order <= 0, "<": order < 0,
              "==": order == 0, "!=": order != 0}[op]
        if not ok:
            return False
    return True


# -- TOML ------------------------------------------------------------------------------------
def _read_toml(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib.loads(text)
    try:
        import tomli
    except ImportError:
        return _parse_minimal_toml(text, path)
    return tomli.loads(text)


_KEY_VALUE = re.compile(r'^([A-Za-z0-9_-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(#.*)?$')


def _parse_minimal_toml(text: str, path: Path) -> dict:
    """The subset expectations files use: ``[[expect]]`` tables of ``key = "string"``."""
    document: dict[str, list[dict[str, str]]] = {}
    table: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.match(r"^\[\[\s*([A-Za-z0-9_-]+)\s*\]\]\s*(#.*)?$", line)
        if header:
            table = {}
            document.setdefault(header.group(1), []).append(table)
            continue
        pair = _KEY_VALUE.match(line)
        if pair is None or table is None:
            raise ExpectationsError(f"{path}:{number}: unsupported TOML (install tomli): {raw!r}")
        table[pair.group(1)] = re.sub(r'\\(["\\])', r"\1", pair.group(2))
    return document
