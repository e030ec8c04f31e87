"""The HTML report: a failure shown as a picture, checked in a real headless browser.

A broken engine runs through ``kvoracle check --html`` (in its supervised worker, so the
pictures travel through the worker's JSON records); the page is opened in Debian's
Chromium through Playwright, and the side-by-side tables, the marked cells and the
failing step are read off the rendered page. Without Chromium or Playwright the browser
test fails -- CI installs Chromium (``make test``), and a silent skip would hide a broken
page -- unless ``KVORACLE_NO_BROWSER=1`` says to skip it.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import broken_engines
import pytest
from broken_hybrid_engines import SwaWindowNotMinusOne
from broken_store_gap_engines import StoreDropsMarkedGroups

from kvoracle.conformance.external_store import Store, StoreSetup
from kvoracle.conformance.harness import picture as draw
from kvoracle.conformance.harness.records import run_from_record
from kvoracle.conformance.harness.replay import picture_replay
from kvoracle.conformance.harness.runner import CheckResult, RunOptions, run_suite
from kvoracle.conformance.harness.supervisor import Checkpoints
from kvoracle.conformance.harness.verdicts import Counterexample
from kvoracle.conformance.hybrid_lookup import HybridSetup, LookUp, Seed
from kvoracle.conformance.reports.html import MARK, to_html, write_html
from kvoracle.conformance.steps import Configure, Evict
from kvoracle.reference import ManagerConfig

TESTS = Path(__file__).parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: The marked cells' background (html.css: --diverge-bg), as the screenshot's pixels show it.
DIVERGE_BG = (0xFF, 0xEB, 0xE9)


def _examples(result) -> list[Counterexample]:
    return [e for o in result.verdicts.outcomes.values() for e in o.counterexamples + o.errors]


# -- a broken engine through `kvoracle check --html` ------------------------------------------------
@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """ForgetsEvictableHits (it forgets that touching a free hit uses a free block) convicted by the
    default, supervised ``kvoracle check``, with an HTML report."""
    root = tmp_path_factory.mktemp("html")
    page = root / "report" / "kvoracle.html"
    done = subprocess.run(
        [sys.executable, "-m", "kvoracle", "check", "--suite", "lockstep", "--engine",
         "broken_engines:ForgetsEvictableHits", "--max-examples", "100", "--seed", "0", "--fail-fast",
         "--replay-dir", str(root / "replays"), "--hypothesis-dir", str(root / "hypothesis"),
         "--json", str(root / "report.json"), "--html", str(page)],
        cwd=TESTS, env={**os.environ, "KVORACLE_CONTRACTS": "0"}, capture_output=True, text=True, timeout=900,
        check=False)
    return {"done": done, "page": page, "report": json.loads((root / "report.json").read_text())}


def test_check_writes_the_html_report(checked: dict) -> None:
    done, page = checked["done"], checked["page"]
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"HTML report: {page}" in done.stdout
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "NOT CONFORMING" in text
    failed = [r["id"] for r in checked["report"]["rules"] if r["outcome"] in ("fail", "error")]
    assert failed, checked["report"]
    for rule_id in failed:  # every convicted rule has its counterexample on the page
        assert re.search(rf'<article class="counterexample" id="cx-\d+-{rule_id}" data-rule="{rule_id}">', text)
    # The picture came back from the worker's records: drawn, not missing.
    assert 'class="picture"' in text and "No picture" not in text
    assert "block tables of group 0" in text
    # Nothing from elsewhere: no script, no stylesheet or image to fetch.
    assert "<script" not in text and "<link" not in text and "src=" not in text


def test_the_json_report_carries_the_same_pictures(checked: dict) -> None:
    """The pictures drawn for the page travel in the JSON report too, valid by its schema."""
    report = checked["report"]
    pictures = [cx["picture"] for rule in report["rules"] for cx in rule["counterexamples"]]
    assert pictures and all(picture and picture["panels"] for picture in pictures), pictures
    titles = [panel["title"] for picture in pictures for panel in picture["panels"]]
    assert any(title.startswith("block tables of group 0") for title in titles), titles
    assert any(draw.diverging(row, panel["compare"]) != ([False] * len(row["reference"] or []),
                                                          [False] * len(row["engine"] or []))
               for picture in pictures for panel in picture["panels"] for row in panel["rows"]), \
        "no cell differs in any picture of a failure"
    jsonschema = pytest.importorskip("jsonschema")
    del jsonschema
    from kvoracle.conformance.reports.schema import validate_report
    validate_report(report)


def test_html_is_refused_up_front_when_it_cannot_be_written(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kvoracle", "check", "--html", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert f"--html {tmp_path} is a directory" in done.stderr
    assert "checking engine" not in done.stdout  # refused before anything ran


# -- the page in a real browser --------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    problems = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        problems.append(f"playwright is not importable ({error})")
    if not CHROMIUM.exists():
        problems.append(f"{CHROMIUM} is missing (make test installs Debian's chromium)")
    if problems:
        reason = "; ".join(problems)
        if os.environ.get("KVORACLE_NO_BROWSER") == "1":
            pytest.skip(f"KVORACLE_NO_BROWSER=1: {reason}")
        pytest.fail(f"the HTML report's browser check cannot run: {reason}. Install it, or set "
                    "KVORACLE_NO_BROWSER=1 to skip this test knowingly.")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _side(table) -> list[tuple[str, list[dict]]]:
    """A side's table as (row label, cells) with each cell's column, value, marking and text."""
    return table.evaluate("""table => [...table.querySelectorAll('tbody tr')].map(tr => [
        tr.dataset.label,
        [...tr.querySelectorAll('td.cell')].map(td => ({
            col: Number(td.dataset.col), value: JSON.parse(td.dataset.value),
            marked: td.classList.contains('diverge'), text: td.textContent}))])""")


def _png_colours(png: bytes) -> set[bytes]:
    """The distinct pixel colours of an 8-bit, non-interlaced RGB(A) PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data, header = 8, b"", None
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            data += body
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour_type in (2, 6), header
    size = 3 if colour_type == 2 else 4
    stride = width * size
    raw = zlib.decompress(data)
    previous = bytearray(stride)
    colours = set()
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - size] if i >= size else 0
            b = previous[i]
            c = previous[i - size] if i >= size else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, size))
        previous = line
    return colours


def test_the_picture_renders_side_by_side_with_the_differences_marked(browser, checked: dict, tmp_path: Path
                                                                       ) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(checked["page"].resolve().as_uri())
    assert set(requested) <= {checked["page"].resolve().as_uri()}  # nothing fetched but the page itself

    article = page.locator("article.counterexample").first
    assert article.is_visible()
    # The failing step is highlighted, marked in words, and is the last of the numbered steps.
    steps = article.locator("ol.steps > li")
    failing = article.locator("ol.steps > li.failing-step")
    assert failing.count() == 1 and failing.is_visible()
    assert "fails here" in failing.inner_text()
    assert steps.nth(steps.count() - 1).evaluate("li => li.classList.contains('failing-step')")
    assert failing.evaluate("li => getComputedStyle(li).backgroundColor") != \
        steps.first.evaluate("li => getComputedStyle(li).backgroundColor")

    panels = article.locator("section.panel")
    assert panels.count() >= 3
    marked_in_all = 0
    tables_differ = False
    for index in range(panels.count()):
        panel = panels.nth(index)
        reference = panel.locator("table.grid[data-side=reference]")
        engine = panel.locator("table.grid[data-side=engine]")
        # What the page shows of each table is its scroll box: a grid wider than its half of the
        # page (a pool of many blocks) scrolls inside it instead of running under the other side.
        left, right = (table.locator("xpath=..").bounding_box() for table in (reference, engine))
        assert left and right and min(left["width"], left["height"], right["width"], right["height"]) > 0
        for table in (reference, engine):
            assert table.evaluate("t => t.parentElement.classList.contains('scroll') && getComputedStyle("
                                  "t.parentElement).overflowX === 'auto' && t.parentElement.scrollWidth >= "
                                  "t.getBoundingClientRect().width - 1")
        # Side by side: the engine's table to the right of the reference's, on the same rows of the page.
        assert left["x"] + left["width"] <= right["x"]
        assert left["y"] < right["y"] + right["height"] and right["y"] < left["y"] + left["height"]
        mine, theirs = dict(_side(reference)), dict(_side(engine))
        assert len(mine) == len(_side(reference))  # row labels name rows uniquely in this picture
        assert list(mine) == list(theirs)  # the same rows in the same order on both sides
        for label in mine:
            for cells, other in ((mine[label], theirs[label]), (theirs[label], mine[label])):
                values = {cell["col"]: cell["value"] for cell in other}
                assert [cell["col"] for cell in cells] == list(range(len(cells)))
                for cell in cells:
                    # Marked exactly where the two tables differ: no cell at this column on the
                    # other side, or another value there.
                    differs = cell["col"] not in values or values[cell["col"]] != cell["value"]
                    assert cell["marked"] == differs, (panel.locator("h4").inner_text(), label, cell, other)
                    assert (MARK in cell["text"]) == differs  # a visible marker, not colour alone
                    marked_in_all += differs
                    tables_differ |= differs and "block tables" in panel.locator("h4").inner_text()
    assert marked_in_all > 0
    assert tables_differ  # this engine's bug shows in its block tables
    marked = article.locator("td.cell.diverge").first
    plain = article.locator("td.cell:not(.diverge)").first
    assert marked.evaluate("td => getComputedStyle(td).backgroundColor") != \
        plain.evaluate("td => getComputedStyle(td).backgroundColor")

    # The page is really painted: the block tables' panel in more than one colour, the marked
    # cells' background among them.
    shot = tmp_path / "tables.png"
    panels.first.screenshot(path=str(shot))
    colours = _png_colours(shot.read_bytes())
    assert len(colours) > 2
    assert bytes(DIVERGE_BG) in colours
    page.close()


# -- the picture in the runner, the records and the replay --------------------------------------------
@pytest.fixture(scope="module")
def forward_free():
    """ForwardFree (frees a request's blocks head first) in this process, pictures on."""
    options = RunOptions(max_examples=100, seed=0, fail_fast=True, replay_dir=None, pictures=True)
    return run_suite(broken_engines.ForwardFree, options, suite="lockstep")


def test_run_suite_draws_each_counterexample_at_its_failing_step(forward_free) -> None:
    examples = _examples(forward_free)
    assert examples
    for example in examples:
        picture = example.picture
        assert picture and "missing" not in picture, picture
        assert picture["suite"] == "manager" and picture["rule"] == example.rule_id
        assert picture["step"] == len(example.steps)
        json.dumps(picture)  # plain data
        pool = next(p for p in picture["panels"] if p["title"] == "block pool")
        assert draw.differs(pool)  # a wrong free order shows in the free queue
        queue = next(r for r in pool["rows"] if r["label"].startswith("free queue"))
        assert queue["reference"] != queue["engine"] and sorted(queue["reference"]) == sorted(queue["engine"])


def test_the_picture_survives_the_supervisors_records(forward_free, tmp_path: Path) -> None:
    Checkpoints(tmp_path)(forward_free, done=True)  # what a supervised worker writes
    record = Checkpoints(tmp_path).path(forward_free.part or forward_free.suite, done=True)
    rebuilt = run_from_record(json.loads(record.read_text()))
    assert [e.picture for e in _examples(rebuilt)] == [e.picture for e in _examples(forward_free)]
    options = forward_free.options
    # The supervisor's page is the in-process one, picture and all.
    assert to_html(CheckResult("broken", options, [rebuilt])) == to_html(CheckResult("broken", options,
                                                                                      [forward_free]))


def test_a_replay_that_no_longer_fails_draws_no_picture_and_the_page_says_so(forward_free, tmp_path: Path
                                                                             ) -> None:
    example = _examples(forward_free)[0]
    # The same steps on the correct reference: they no longer fail, as a flaky engine's may not.
    picture = picture_replay("manager", "reference", example)
    assert set(picture) == {"missing"} and "did not fail again" in picture["missing"]
    example = Counterexample(example.rule_id, example.message, example.steps, suite="manager", picture=picture)
    run = forward_free
    outcome = run.verdicts.outcomes[example.rule_id]
    saved = outcome.counterexamples
    outcome.counterexamples = [example]
    try:
        page = tmp_path / "flaky.html"
        write_html(CheckResult("broken", run.options, [run]), page)
    finally:
        outcome.counterexamples = saved
    text = page.read_text()
    assert "No picture: replayed once for the picture, the steps did not fail again" in text
    assert 'class="picture"' not in text


class ObserveFailsWhenPictured(broken_engines.ForwardFree):
    """ForwardFree whose ``observe`` raises from its second call after a free on: the suite's own
    observation of the free still answers, the picture's does not."""

    observed_since_free: int | None = None

    def free(self, *args, **kwargs):
        super().free(*args, **kwargs)
        self.observed_since_free = 0

    def observe(self):
        if self.observed_since_free is not None:
            self.observed_since_free += 1
            if self.observed_since_free > 1:
                raise RuntimeError("observe is broken")
        return super().observe()


def test_an_engine_failing_while_pictured_leaves_the_picture_out(forward_free) -> None:
    example = _examples(forward_free)[0]
    picture = picture_replay("manager", ObserveFailsWhenPictured, example)
    assert set(picture) == {"missing"}
    assert picture["missing"].startswith("the engine failed while being pictured")
    assert "observe is broken" in picture["missing"]


def test_a_hung_operation_is_pictured_without_waiting_again() -> None:
    steps = [Configure(ManagerConfig(num_blocks=5, block_size=1, max_model_len=6, hash_block_size=1)),
             Evict((1,))]
    example = Counterexample("KV-POOL-013", "", steps, engine_error=True, suite="manager", shrunk=False)
    # A hang the run saw fails at once here (the engine would sleep for an hour).
    picture = picture_replay("manager", broken_engines.HangsOnEvict, example, step_timeout=600,
                             hung={"evict": "no answer within 2 s of engine time"})
    assert "missing" not in picture and picture["step"] == 2
    assert picture["panels"][0]["title"].startswith("block tables of group 0")


# -- the other suites' pictures --------------------------------------------------------------------
def test_the_hybrid_suite_pictures_its_last_lookup() -> None:
    steps = [HybridSetup(groups=(("full", 2, 0), ("sliding_window", 1, 1)), hash_block_size=1, num_blocks=129,
                         use_eagle=True, prompts=((0,) * 8, (0,) * 3)),
             LookUp(prompt=0), Seed(prompt=0, group=0, mask=(True, True, False, False)),
             Seed(prompt=0, group=1, mask=(True, False, True, True, True, True, True, True)), LookUp(prompt=0)]
    picture = picture_replay("hybrid", SwaWindowNotMinusOne, Counterexample("KV-HYB-007", "", steps, suite="hybrid"))
    assert "missing" not in picture, picture
    lookup = picture["panels"][0]
    assert lookup["title"] == "hit blocks of the lookup of prompt 0 at this step"
    rows = {row["label"]: row for row in lookup["rows"]}
    assert rows["hit tokens"]["reference"] != rows["hit tokens"]["engine"]
    assert set(rows) == {"group 0: full, block size 2", "group 1: sliding window 1, block size 1", "hit tokens"}
    assert draw.differs(lookup)


def test_the_external_store_suite_pictures_its_masks() -> None:
    steps = [StoreSetup(groups=(("sliding_window", 1, 1), ("sliding_window", 1, 1)), hash_block_size=1,
                        use_eagle=False, eagle_groups=(True, False), prompts=((0, 0, 0, 0),)),
             Store(prompt=0, aligned_len=1)]
    picture = picture_replay("external-store", StoreDropsMarkedGroups,
                             Counterexample("KV-EXT-009", "", steps, suite="external-store"))
    assert "missing" not in picture, picture
    (masks,) = picture["panels"]
    assert masks["title"] == "store_mask(1) at this step"
    assert [(row["reference"], row["engine"]) for row in masks["rows"]] == [([False], [True]), ([False], [True])]


def test_diverging_marks_cells_where_the_sides_differ() -> None:
    row = draw.row("r0", [1, 2, 3], [1, 5])
    assert draw.diverging(row) == ([False, True, True], [False, True])
    assert draw.diverging(row, draw.SHAPE) == ([False, False, True], [False, False])
    assert draw.diverging(draw.row("r1", None, [4])) == ([], [True])
    assert not draw.differs(draw.panel("same", [draw.row("r0", [1], [1])]))


def test_everything_on_the_page_is_escaped(forward_free) -> None:
    example = Counterexample("KV-POOL-007", "<b>bold</b> & 'quoted'", ["Step('<script>alert(1)</script>')"],
                             suite="manager", replay_path="a<b>.py", picture={
                                 "suite": "manager", "rule": "KV-POOL-007", "step": 1, "panels": [draw.panel(
                                     "<i>title</i>", [draw.row("<r>", ["<c>"], ['"q"'])], note="<n>")]})
    run = forward_free
    outcome = run.verdicts.outcomes["KV-POOL-007"]
    saved = outcome.counterexamples
    outcome.counterexamples = [example]
    try:
        text = to_html(CheckResult("<engine>", run.options, [run]))
    finally:
        outcome.counterexamples = saved
    for raw in ("<b>bold</b>", "<script>", "<i>title</i>", "<r>", "<c>", "<n>", "a<b>.py", "<engine>"):
        assert raw not in text, raw
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &#x27;quoted&#x27;" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert 'data-value="&quot;\\&quot;q\\&quot;&quot;"' in text  # a cell's JSON value, in an attribute
