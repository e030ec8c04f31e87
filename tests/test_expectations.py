"""Expectations files (``conformance/engines/<engine>.toml``) and the vLLM adapter's loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import broken_engines
import pytest

from kvoracle.conformance import cli
from kvoracle.conformance.harness import expectations as exp
from kvoracle.conformance.harness.runner import RunOptions, run_suite

ENTRY = """
# a comment
[[expect]]
rule = "KV-POOL-007"
versions = "{versions}"   # trailing comment
reason = "frees the head first"
source = "https://example.org/free.py#L1"
"""


def _write(directory: Path, name: str, versions: str = ">=0.0") -> Path:
    path = directory / f"{name}.toml"
    path.write_text(ENTRY.format(versions=versions))
    return path


@pytest.mark.parametrize(("version", "spec", "inside"), [
    ("0.33.0", ">=0.33.0,<0.34", True),
    ("0.33.2+cpu", ">=0.33,<0.34", True),
    ("0.34.0", ">=0.33,<0.34", False),
    ("0.33.1", "==0.33.*", True),
    ("0.330.1", "==0.33.*", False),
    ("0.33.0", "!=0.33.0", False),
    ("1.0", "", True),
])
def test_version_ranges(version: str, spec: str, inside: bool) -> None:
    assert exp.version_in_range(version, spec) is inside


def test_bad_files_are_rejected_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(exp.ExpectationsError, match="bad version clause"):
        exp.version_in_range("1.0", "~=1.0")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[expect]]\nrule = "KV-NOPE-001"\nversions = ">=0"\nreason = "x"\n')
    with pytest.raises(exp.ExpectationsError, match="unknown rule"):
        exp.load_expectations(bad, "1.0")
    bad.write_text('[[expect]]\nrule = "KV-POOL-007"\n')
    with pytest.raises(exp.ExpectationsError, match="versions, reason"):
        exp.load_expectations(bad, "1.0")


def test_entries_apply_only_inside_their_version_range(tmp_path: Path) -> None:
    path = _write(tmp_path, "engine", ">=0.33,<0.34")
    assert exp.load_expectations(path, "0.33.0") == {
        "KV-POOL-007": "frees the head first (https://example.org/free.py#L1)"}
    assert exp.load_expectations(path, "0.34.0") == {}


def test_the_fallback_parser_reads_what_tomllib_reads(tmp_path: Path) -> None:
    path = _write(tmp_path, "engine")
    text = path.read_text() + '\n[[expect]]\nrule = "KV-POOL-006"\nversions = ">=0"\n' \
        'reason = "say \\"hi\\""\n'
    path.write_text(text)
    assert exp._parse_minimal_toml(text, path) == exp._read_toml(path)


def test_the_vllm_file_is_well_formed() -> None:
    path = exp.expectations_path("vllm")
    assert path is not None
    assert isinstance(exp.load_expectations(path, "0.33.0"), dict)


@pytest.mark.slow
def test_a_listed_failure_is_expected_and_a_fixed_one_fails_the_run(tmp_path: Path) -> None:
    reason = {"KV-POOL-007": "frees the head first"}
    broken = run_suite(broken_engines.ForwardFree,
                       RunOptions(max_examples=20, max_rounds=2, replay_dir=tmp_path),
                       expectations=reason, suite="lockstep")
    assert broken.verdicts.outcomes["KV-POOL-007"].outcome == "expected-fail"
    assert broken.ok
    fixed = run_suite("reference", RunOptions(max_examples=40, replay_dir=tmp_path),
                      expectations=reason, suite="lockstep")
    assert fixed.verdicts.outcomes["KV-POOL-007"].outcome == "unexpected-pass"
    assert not fixed.ok


def test_check_loads_the_engines_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(exp, "ENGINES_DIR", tmp_path)
    # In this process (no supervised worker process), so that the run sees the patched ENGINES_DIR.
    common = ["check", "--engine", "reference", "--suite", "lockstep", "--max-examples", "40", "--no-replay",
              "--in-process"]
    assert cli.main(common) == 0  # no reference.toml: nothing expected
    _write(tmp_path, "reference")
    assert cli.main(common) == 1  # the reference does not fail KV-POOL-007: strict
    assert "XPASS" in capsys.readouterr().out
    _write(tmp_path, "reference", versions="<0.1")  # kvoracle 0.1.0 is outside the range
    assert cli.main(common) == 0
    (tmp_path / "reference.toml").write_text("[[expect]]\nrule = 'KV-POOL-007'\n")
    assert cli.main(common) == 2
    assert "missing or non-string versions, reason" in capsys.readouterr().err


def test_the_vllm_engine_imports_lazily_and_refuses_without_vllm() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import kvoracle.conformance, kvoracle.conformance.engines.vllm\n"
        "from kvoracle.conformance.engines import EngineLoadError\n"
        "from kvoracle.conformance.harness.engines import engine_factory\n"
        "from kvoracle.conformance.harness.suites import get_suite\n"
        "factory = engine_factory('vllm', get_suite('lockstep'))\n"
        "try:\n    factory()\nexcept EngineLoadError as error:\n    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cannot import vllm" in done.stdout and "install_vllm.sh" in done.stdout
