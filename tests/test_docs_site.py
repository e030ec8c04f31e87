"""The documentation site (mkdocs.yml): it builds offline with --strict, its nav leaves no page
under docs/ out, and its rule table names every rule of the spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvoracle.spec import CHAPTERS, all_rules

REPO = Path(__file__).parent.parent
DOCS = REPO / "docs"
#: The venv's mkdocs (pinned in requirements-dev.txt), next to this interpreter.
MKDOCS = Path(sys.executable).parent / "mkdocs"


def _nav_pages(entries: list) -> list[str]:
    """The pages of a mkdocs nav, in order: entries are paths, {title: path} or {title: [...]}."""
    pages: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
            continue
        for value in entry.values():
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert MKDOCS.exists(), f"{MKDOCS} is missing: mkdocs is pinned in requirements-dev.txt"
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "search" / "search_index.json").is_file()
    # Offline: the theme loads no web fonts (font: false).
    for page in site.rglob("*.html"):
        assert "fonts.googleapis.com" not in page.read_text(), page


def test_every_docs_page_is_in_the_nav(config: dict) -> None:
    pages = _nav_pages(config["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk, "mkdocs.yml's nav and the pages under docs/ differ"
    assert len(pages) == len(set(pages)), "a page is in the nav twice"


def test_nav_chapters_follow_the_spec(config: dict) -> None:
    chapters = [page for page in _nav_pages(config["nav"]) if page.startswith("chapters/")]
    assert chapters == [f"chapters/{chapter.CHAPTER}.md" for chapter in CHAPTERS]


def test_site_rule_table_names_every_rule(site: Path) -> None:
    table = (site / "rules.html").read_text()
    missing = [rule.id for rule in all_rules() if f"<td>{rule.id}</td>" not in table]
    assert not missing, f"the site's rule table leaves out {missing}"
