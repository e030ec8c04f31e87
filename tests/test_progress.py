"""`kvoracle check`'s live progress display (conformance/reports/progress.py): what it shows of
a real run, that the runner's events only observe (verdicts and example counts are the same
with and without an observer, even one that breaks), and that the command shows it on a
terminal -- not on a pipe, not with --no-progress or TERM=dumb, without colour under NO_COLOR
-- while the report printed after the run stays the same."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from argparse import Namespace
from pathlib import Path

import broken_engines
import pytest

from kvoracle.conformance import cli
from kvoracle.conformance.harness.runner import RunObserver, RunOptions, run_suite, run_suites

TESTS = Path(__file__).parent
KVORACLE = [sys.executable, "-m", "kvoracle"]
#: A short run that still convicts ForwardFree of KV-POOL-007 (in about 70 examples).
SHORT = ("--suite", "lockstep", "--max-examples", "10", "--max-rounds", "1", "--shrink-calls", "50",
         "--no-database", "--no-replay")
CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: An SGR sequence that sets a foreground colour.
COLOUR = re.compile(r"\x1b\[(?:\d+;)*(?:3[0-7]|9[0-7]|38)(?:;\d+)*m")
HEADER = "this round"  # in the display's column headings
SUITE = "manager (lockstep part)"


def _options(tmp_path: Path) -> RunOptions:
    return RunOptions(max_examples=10, max_rounds=1, shrink_calls=50, replay_dir=None, database=None,
                      hypothesis_dir=tmp_path)


def _row(frame: str) -> list[str]:
    """The lockstep row of a drawn frame: suite, round, phase, examples this round, examples
    in all, elapsed, failed rules."""
    line = next(line for line in frame.splitlines() if SUITE in line)
    return re.split(r"\s{2,}", line.strip())


def _drawn(display) -> str:
    from rich.console import Console
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(display)
    return console.file.getvalue()


# -- the display over a real run, in this process -----------------------------------------------
def test_the_display_shows_the_suite_its_round_examples_and_the_failed_rule(tmp_path: Path) -> None:
    pytest.importorskip("rich", reason="the live display needs rich (pip install 'kvoracle[report]')")
    from rich.console import Console

    from kvoracle.conformance.reports.progress import LiveProgress

    class Snapshots(LiveProgress):
        """Draws a frame of its own at the first and third example: the display follows the run."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.frames: list[str] = []

        def example_started(self, suite: str, in_round: int, in_all: int) -> None:
            super().example_started(suite, in_round, in_all)
            if in_all in (1, 3):
                self.frames.append(_drawn(self))

    screen = io.StringIO()
    display = Snapshots(console=Console(file=screen, force_terminal=True, width=160))
    with display:
        check = run_suites(broken_engines.ForwardFree, ["lockstep"], _options(tmp_path), progress=display.say,
                           observer=display)
    run = check.runs[0]
    assert run.verdicts.outcomes["KV-POOL-007"].outcome == "fail" and run.examples > 3

    # As examples run: round 1, searching from the seed, the counts climbing, nothing failed yet.
    first, third = (_row(frame) for frame in display.frames)
    assert first == [SUITE, "1", "searching (seed 0)", "1", "1", first[5], "none"]
    assert third == [SUITE, "1", "searching (seed 0)", "3", "3", third[5], "none"]

    # What the terminal got: the progress lines above, and the display's last frame.
    shown = CSI.sub("", screen.getvalue())
    assert "manager round 1: up to 10 examples of up to 40 steps (seed 0)" in shown
    assert "failure: KV-POOL-007" in shown
    last = _row(shown[shown.rindex(HEADER):])
    assert last == [SUITE, "1", "done: not conforming", str(run.examples), str(run.examples), last[5],
                    "KV-POOL-007"]
    assert re.fullmatch(r"\d+\.\d s", last[5])
    assert screen.getvalue().startswith("\x1b[?25l")  # rich hid the cursor: it was redrawing


# -- the events, and that observing changes nothing ----------------------------------------------
class _Recording(RunObserver):
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.examples: list[tuple[int, int]] = []

    def suite_started(self, *args) -> None:
        self.events.append(("suite_started", *args))

    def round_started(self, *args) -> None:
        self.events.append(("round_started", *args))

    def example_started(self, suite: str, in_round: int, in_all: int) -> None:
        self.examples.append((in_round, in_all))

    def failure_seen(self, *args) -> None:
        self.events.append(("failure_seen", *args))

    def rule_failed(self, *args) -> None:
        self.events.append(("rule_failed", *args))

    def suite_finished(self, suite: str, result) -> None:
        self.events.append(("suite_finished", suite, result.examples))


class _Breaks(RunObserver):
    def __init__(self) -> None:
        self.calls = 0

    def example_started(self, suite: str, in_round: int, in_all: int) -> None:
        self.calls += 1
        if in_all == 3:
            raise RuntimeError("the display broke")


def _outcomes(result) -> dict:
    return {rule: (o.outcome, o.checks, [list(map(repr, e.steps)) for e in o.counterexamples + o.errors])
            for rule, o in result.verdicts.outcomes.items()}


def test_the_runner_tells_its_observer_and_observing_changes_nothing(tmp_path: Path) -> None:
    options = _options(tmp_path)
    options.max_rounds = 2  # a second round after ForwardFree's conviction, which finds nothing new
    plain = run_suite(broken_engines.ForwardFree, options, suite="lockstep")
    recording = _Recording()
    observed = run_suite(broken_engines.ForwardFree, options, suite="lockstep", observer=recording)
    said: list[str] = []
    breaks = _Breaks()
    broken = run_suite(broken_engines.ForwardFree, options, said.append, suite="lockstep", observer=breaks)

    assert plain.examples == observed.examples == broken.examples > 3
    assert plain.rounds == observed.rounds == broken.rounds == 2
    assert _outcomes(plain) == _outcomes(observed) == _outcomes(broken)
    assert plain.verdicts.outcomes["KV-POOL-007"].outcome == "fail"

    assert recording.events == [
        ("suite_started", "lockstep", SUITE, "broken_engines:ForwardFree"),
        ("round_started", "lockstep", 1, False, 10, 0),
        ("failure_seen", "lockstep", "KV-POOL-007"),
        ("rule_failed", "lockstep", "KV-POOL-007", False),
        ("round_started", "lockstep", 2, False, 10, 1),
        ("suite_finished", "lockstep", observed.examples)]
    # Every example is told of, counted in its round and in all.
    second = next(i for i, (in_round, _) in enumerate(recording.examples) if i and in_round == 1)
    assert recording.examples == ([(i, i) for i in range(1, second + 1)]
                                  + [(i - second, i) for i in range(second + 1, observed.examples + 1)])

    # An observer that raises is dropped, once said; the run goes on as if it were never there.
    assert breaks.calls == 3
    assert [line for line in said if "progress display dropped" in line] == [
        "  progress display dropped (RuntimeError: the display broke); the run goes on"]


# -- when the command shows it -------------------------------------------------------------------
@pytest.mark.parametrize(("given", "environment", "wanted"), [
    (False, {"TERM": "xterm"}, False), (None, {"TERM": "xterm"}, True), (None, {"TERM": "dumb"}, False),
    (True, {"TERM": "dumb"}, True), (None, {"TERM": "xterm", "NO_COLOR": "1"}, True)])
def test_the_display_is_wanted_on_a_terminal_that_can_redraw(monkeypatch, capsys, given, environment,
                                                               wanted) -> None:
    pytest.importorskip("rich", reason="the live display needs rich (pip install 'kvoracle[report]')")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for name in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = Namespace(progress=given)
    assert cli._display_wanted(args) is (given is True)  # captured stdout is no terminal
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert cli._display_wanted(args) is wanted


def test_without_rich_the_progress_lines_stay_and_only_progress_says_why(monkeypatch, capsys) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setitem(sys.modules, "rich.console", None)  # import rich.console fails
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert not cli._display_wanted(Namespace(progress=None))
    assert capsys.readouterr().err == ""
    assert not cli._display_wanted(Namespace(progress=True))
    assert capsys.readouterr().err == ("note: --progress needs rich (pip install 'kvoracle[report]'); "
                                       "plain progress lines instead\n")
    with cli._progress(Namespace(progress=True)) as (say, observer):
        assert say is cli._say and observer is None


# -- through a real terminal ---------------------------------------------------------------------
def _environment(**extra: str) -> dict[str, str]:
    drop = {"NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES", "KVORACLE_DATABASE"}
    return {name: value for name, value in os.environ.items() if name not in drop} | {
        "TERM": "xterm-256color", "KVORACLE_CONTRACTS": "0", "PYTHONPATH": str(TESTS), **extra}


def _on_a_terminal(args: tuple[str, ...], timeout: float = 300, **environment: str) -> tuple[int, str]:
    """``kvoracle check ARGS`` with stdout and stderr on a pseudo-terminal 140 columns wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    process = subprocess.Popen([*KVORACLE, "check", *args], stdin=subprocess.DEVNULL, stdout=follower,
                               stderr=follower, cwd=TESTS, env=_environment(**environment))
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                process.kill()
                pytest.fail(f"kvoracle check {' '.join(args)} did not end in {timeout} s")
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        process.wait(timeout=60)
    return process.returncode, b"".join(chunks).decode().replace("\r\n", "\n")


def _on_a_pipe(args: tuple[str, ...]) -> tuple[int, str]:
    done = subprocess.run([*KVORACLE, "check", *args], cwd=TESTS, env=_environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    return done.returncode, done.stdout


def _report(output: str) -> str:
    """What is printed after the run: the verdict table on, its times made alike."""
    report = CSI.sub("", output)
    return re.sub(r"\d+\.\d s;", "T s;", report[report.index("\nrule "):])


@pytest.fixture(scope="module")
def forward_free(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """ForwardFree's short run on a pipe, on a terminal, and on a terminal with --no-progress."""
    args = (*SHORT, "--engine", "broken_engines:ForwardFree",
            "--hypothesis-dir", str(tmp_path_factory.mktemp("hypothesis")))
    return {"pipe": _on_a_pipe(args), "terminal": _on_a_terminal(args),
            "no-progress": _on_a_terminal((*args, "--no-progress"))}


def test_a_terminal_gets_the_live_display_and_the_same_report(forward_free) -> None:
    pytest.importorskip("rich", reason="the live display needs rich (pip install 'kvoracle[report]')")
    (piped_status, piped), (status, shown) = forward_free["pipe"], forward_free["terminal"]
    assert piped_status == status == 1  # not conforming
    assert "\x1b" not in piped and HEADER not in piped
    assert "\x1b[?25l" in shown and COLOUR.search(shown)  # redrawn, in colour
    text = CSI.sub("", shown)
    last = _row(text[text.rindex(HEADER):text.index("\nrule ")])
    assert last[:3] == [SUITE, "1", "done: not conforming"] and int(last[3]) > 0 and last[6] == "KV-POOL-007"
    for output in (piped, text):
        assert "manager round 1: up to 10 examples of up to 40 steps (seed 0)" in output
    assert "RESULT: NOT CONFORMING" in _report(shown)
    assert _report(shown) == _report(piped)


def test_no_progress_on_a_terminal_prints_what_a_pipe_gets(forward_free) -> None:
    (piped_status, piped), (status, shown) = forward_free["pipe"], forward_free["no-progress"]
    assert status == piped_status == 1
    assert "\x1b" not in shown
    assert re.sub(r"\d+\.\d s;", "T s;", shown) == re.sub(r"\d+\.\d s;", "T s;", piped)


def test_a_dumb_terminal_gets_the_plain_lines_and_no_colour_keeps_the_display(tmp_path: Path) -> None:
    pytest.importorskip("rich", reason="the live display needs rich (pip install 'kvoracle[report]')")
    args = (*SHORT, "--engine", "broken_engines:ForwardFree", "--hypothesis-dir", str(tmp_path))
    status, dumb = _on_a_terminal(args, TERM="dumb")
    assert status == 1 and "\x1b" not in dumb and HEADER not in dumb
    assert "manager round 1: up to 10 examples" in dumb
    status, colourless = _on_a_terminal(args, NO_COLOR="1")
    assert status == 1 and "\x1b[?25l" in colourless and HEADER in colourless
    assert not COLOUR.search(colourless)
    assert _report(colourless) == _report(dumb)
