"""The layers import one way: spec <- reference <- conformance -> engines.

Every ``import`` in kvoracle's own modules (at module level or inside a function, relative
ones resolved) is read from the source, and each layer may reach only the layers below it:
the spec nothing but itself; the reference the spec; the harness the spec and itself, never
a suite (suites register themselves with it, and it finds them by name); the suites and
the command the harness, the reference and the spec, never an engine adapter's module
(built-in engines are registered as "module:Class" strings, imported when a run needs them)
but the reference adapter the manager suite judges against.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Top-level folder -> the package it installs as (pyproject.toml's package-dir).
PACKAGES = {"spec": "kvoracle.spec", "reference": "kvoracle.reference", "conformance": "kvoracle.conformance",
            "gpu": "kvoracle.gpu"}


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(REPO).with_suffix("").parts
    parts = [*PACKAGES[folder].split("."), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The kvoracle modules ``path`` imports, relative imports resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return {module for module in found if module == "kvoracle" or module.startswith("kvoracle.")}


def _sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _within(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in allowed)


ROOT = ("kvoracle", "kvoracle.__version__")
#: The adapters suites judge engines against: the reference behind each suite's protocol. The
#: manager suite's is the built-in ``reference`` engine (the other suites keep theirs in their
#: own modules).
MODELS = ("kvoracle.conformance.engines.reference",)
#: Which kvoracle modules each part may import (beyond the root package's ``__version__``), and
#: which of those it still may not.
LAYERS = [
    ("spec", lambda name: True, ("kvoracle.spec",), ()),
    ("reference", lambda name: True, ("kvoracle.spec", "kvoracle.reference"), ()),
    ("conformance", lambda name: name.startswith("kvoracle.conformance.harness"),
     ("kvoracle.spec", "kvoracle.conformance.harness"), ()),
    ("conformance", lambda name: not name.startswith("kvoracle.conformance.engines"),
     ("kvoracle.spec", "kvoracle.reference", "kvoracle.conformance"), ("kvoracle.conformance.engines",)),
]


@pytest.mark.parametrize(("folder", "selects", "allowed", "forbidden"), LAYERS,
                         ids=["spec", "reference", "harness", "suites"])
def test_each_layer_imports_only_the_layers_below(folder, selects, allowed, forbidden) -> None:
    wrong = {}
    for path in _sources(folder):
        name = _module_name(path)
        if not selects(name):
            continue
        bad = sorted(module for module in _imports(path) if module not in ROOT
                     and (not _within(module, allowed) or _within(module, forbidden))
                     and not _within(module, MODELS))
        if bad:
            wrong[name] = bad
    assert not wrong, wrong


def test_the_check_reads_relative_imports() -> None:
    # A harness module's relative imports resolve inside the harness: the check sees them.
    imports = _imports(REPO / "conformance" / "harness" / "runner.py")
    assert "kvoracle.conformance.harness.determinism" in imports
    assert _imports(REPO / "conformance" / "manager" / "groups.py") >= {"kvoracle.conformance.invariants"}
