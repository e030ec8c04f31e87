"""The write-ups of differences from vLLM in docs/findings/: each page shows its reproducer byte
for byte (no vLLM needed), and each reproducer, run under vLLM, still prints exactly the output
its page shows and still reports the difference (needs vLLM: skipped without it; `make
test-vllm` runs this file with .venv-vllm's pytest, where vLLM 0.33.0 is installed).

When a reproducer test fails, vLLM's behaviour changed: rerun the script, then update its page
(output, verdict, releases) and docs/findings/index.md."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

FINDINGS = Path(__file__).parent.parent / "docs" / "findings"

#: Each finding's reproducer (docs/findings/<slug>.py, shown in <slug>.md) and its exit status on
#: vLLM 0.33.0: 1 while vLLM behaves as the page describes.
EXIT_STATUS = {
    "eagle-drop-with-eagle-off": 1,  # KV-EXT-009
    "partial-hit-inside-a-block": 1,  # KV-EXT-010, vLLM #50359
    "one-spec-group-without-look-ahead": 1,  # KV-EXT-013
    "window-one-loads-unchecked-block": 1,  # KV-EXT-014
    "mamba-negative-need": 1,  # KV-MAMBA-008
    "mamba-draft-checkpoint": 1,  # KV-MAMBA-017
    "mamba-runner-null-state": 1,  # KV-MAMBA-013 (the model runner's side)
}
SLUGS = sorted(EXIT_STATUS)


def _block(slug: str, opening: str) -> str:
    """The text of the fenced block of docs/findings/<slug>.md whose opening line is ``opening``."""
    page = (FINDINGS / f"{slug}.md").read_text()
    match = re.search(rf"^{re.escape(opening)}\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert match, f"docs/findings/{slug}.md has no block opened by {opening!r}"
    return match.group(1)


def _page_output(slug: str) -> str:
    """The output the page shows for its reproducer: its console block, less the command line."""
    command = f"$ .venv-vllm/bin/python docs/findings/{slug}.py\n"
    block = _block(slug, "```console")
    assert block.startswith(command), f"docs/findings/{slug}.md's console block does not start with {command!r}"
    return block[len(command):]


def test_every_finding_has_a_page_a_script_and_a_test() -> None:
    scripts = sorted(path.stem for path in FINDINGS.glob("*.py"))
    pages = sorted(path.stem for path in FINDINGS.glob("*.md") if path.stem != "index")
    assert scripts == pages == SLUGS, (
        "every docs/findings/<slug>.py needs a page <slug>.md showing it and an entry in this file's "
        f"EXIT_STATUS: scripts {scripts}, pages {pages}, EXIT_STATUS {SLUGS}")
    index = (FINDINGS / "index.md").read_text()
    assert all(f"]({slug}.md)" in index for slug in SLUGS), "docs/findings/index.md leaves a finding out"


@pytest.mark.parametrize("slug", SLUGS)
def test_page_shows_its_reproducer(slug: str) -> None:
    shown = _block(slug, f'```python title="{slug}.py"')
    assert shown == (FINDINGS / f"{slug}.py").read_text(), (
        f"docs/findings/{slug}.md's code block differs from docs/findings/{slug}.py: copy the script into the page")


@pytest.mark.parametrize("slug", SLUGS)
def test_reproducer_still_shows_the_difference(slug: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vllm", reason=f"vLLM is not importable by {sys.executable}; `make test-vllm` runs "
                                       "this test with .venv-vllm/bin/pytest")
    reproducer = runpy.run_path(str(FINDINGS / f"{slug}.py"))  # defines main() without running it
    status = reproducer["main"]()
    printed = capsys.readouterr().out
    assert (status, printed) == (EXIT_STATUS[slug], _page_output(slug)), (
        f"vLLM's answer changed for docs/findings/{slug}.py (exit {status}):\n{printed}\n"
        f"update docs/findings/{slug}.md, docs/findings/index.md and EXIT_STATUS here")
