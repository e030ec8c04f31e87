"""CrossHair meta-tests: the contract checker catches a seeded bug and passes the spec.

CrossHair always runs in a *subprocess* here, never in-process: hypothesis-crosshair's
backend switches icontract checking off for the whole process, which would silently
disarm every contract of the suite. Each subprocess has a wall-clock timeout and a
per-condition CPU budget, so these tests are bounded (about half a minute together).

They are marked ``slow`` -- deselect them with ``-m "not slow"`` -- but run by default.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import icontract
import pytest

from kvoracle.spec import full_attention

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "crosshair_fixtures" / "off_by_one.py"
SCRIPT = REPO / "scripts" / "crosshair_spec.sh"
PLUGIN = REPO / "scripts" / "crosshair_icontract_plugin.py"

#: CPU seconds CrossHair may spend on one condition.
PER_CONDITION_TIMEOUT = 3
#: Wall-clock seconds one CrossHair subprocess may take before the test fails.
SUBPROCESS_TIMEOUT = 240

BOUND_CONDITION = "0 <= result * block_size <= max_length"

REPORT = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>error|info|warning): (?P<msg>.*)$")
CALL = re.compile(
    r"false when calling (?P<call>longest_cached_run\(.*\)) \(which returns (?P<ret>-?\d+)\)"
)


def run_crosshair(*targets: str, report_all: bool = False) -> subprocess.CompletedProcess[str]:
    """``crosshair check --analysis_kind=icontract`` in a subprocess, from the repo root."""
    command = [
        sys.executable, "-m", "crosshair", "check",
        "--analysis_kind=icontract",
        f"--per_condition_timeout={PER_CONDITION_TIMEOUT}",
        f"--extra_plugin={PLUGIN}",
        *(["--report_all"] if report_all else []),
        *targets,
    ]
    try:
        return subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
            check=False, env={**os.environ, "KVORACLE_CONTRACTS": "1"},  # CrossHair needs them
        )
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - only on a hung run
        pytest.fail(f"crosshair did not finish within {SUBPROCESS_TIMEOUT}s: {exc}")


def reports(proc: subprocess.CompletedProcess[str]) -> list[re.Match[str]]:
    return [m for m in map(REPORT.match, proc.stdout.splitlines()) if m]


def line_of(path: Path, needle: str) -> int:
    """1-based line of the single ``@icontract.ensure`` of ``path`` containing ``needle``."""
    hits = [n for n, text in enumerate(path.read_text().splitlines(), 1)
            if "@icontract.ensure" in text and needle in text]
    assert len(hits) == 1, f"{needle!r} occurs on lines {hits} of {path}"
    return hits[0]


def parse_call(call: str) -> dict[str, object]:
    """The arguments of ``longest_cached_run(...)`` as CrossHair printed them."""
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call)
    names = ("cached", "max_length", "block_size")
    args = dict(zip(names, (ast.literal_eval(a) for a in node.args), strict=False))
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg})
    assert set(args) == set(names), call
    return args


def load_fixture():
    spec = importlib.util.spec_from_file_location("kvoracle_test_off_by_one", FIXTURE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def test_crosshair_catches_seeded_off_by_one() -> None:
    proc = run_crosshair(str(FIXTURE))
    assert proc.returncode == 1, describe(proc)

    bound_line = line_of(FIXTURE, BOUND_CONDITION)
    errors = [m for m in reports(proc) if m["level"] == "error"]
    assert all(Path(m["file"]).resolve() == FIXTURE for m in errors), describe(proc)
    on_bound = [m for m in errors if int(m["line"]) == bound_line]
    assert on_bound, f"no report of the postcondition on line {bound_line}\n{describe(proc)}"

    # The counterexample is genuine: it meets the preconditions, breaks the bound, the
    # fixture's own contracts reject it at run time, and the spec's function does not.
    fixture = load_fixture()
    for match in on_bound:
        call = CALL.search(match["msg"])
        assert call, describe(proc)
        args = parse_call(call["call"])
        returned = int(call["ret"])
        cached, max_length, block_size = args["cached"], args["max_length"], args["block_size"]
        assert isinstance(cached, tuple) and isinstance(max_length, int)
        assert isinstance(block_size, int)
        assert block_size > 0 and max_length >= 0
        assert returned * block_size > max_length
        with pytest.raises(icontract.ViolationError, match=re.escape("result * block_size")):
            fixture.longest_cached_run(cached, max_length, block_size)
        fixed = full_attention.longest_cached_run(cached, max_length, block_size)
        assert fixed * block_size <= max_length


def test_crosshair_passes_full_attention_chapter() -> None:
    proc = run_crosshair("kvoracle.spec.full_attention", report_all=True)
    assert proc.returncode == 0, describe(proc)
    assert "no checkable functions" not in proc.stdout + proc.stderr, describe(proc)

    found = reports(proc)
    assert not [m for m in found if m["level"] == "error"], describe(proc)
    # --report_all lists every analysed condition: the run was not vacuous.
    source = Path(full_attention.__file__).resolve()
    assert source == REPO / "spec" / "full_attention.py"
    analysed = {int(m["line"]) for m in found if Path(m["file"]).resolve() == source}
    assert line_of(source, BOUND_CONDITION) in analysed, describe(proc)
    assert len(analysed) >= 5, describe(proc)


def test_crosshair_spec_script_is_well_formed() -> None:
    assert SCRIPT.is_file()
    assert SCRIPT.stat().st_mode & 0o111, "scripts/crosshair_spec.sh is not executable"
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "--analysis_kind=icontract" in text and "--per_condition_timeout" in text
    assert PLUGIN.name in text and PLUGIN.is_file()
    syntax = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                            timeout=30, check=False)
    assert syntax.returncode == 0, syntax.stderr
