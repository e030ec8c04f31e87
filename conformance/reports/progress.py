"""``kvoracle check``'s live progress display on a terminal (rich: ``pip install 'kvoracle[report]'``).

One row per suite run: its round and phase (replaying the example database's stored
failures, searching from a seed, shrinking once a failure is found, drawing the
counterexamples' pictures, done), the examples run in the round and in all, the rules that
failed so far and the time it has taken. :class:`LiveProgress` is a
:class:`~..harness.runner.RunObserver`: the runner tells it what happens, and it only
shows it -- it is redrawn a few times a second by rich's own thread and changes no verdict
and no example count. The plain progress lines the run says go on above it.

The command uses it when stdout is a terminal that can redraw (``TERM=dumb`` cannot) and
rich is installed, or when ``--progress`` asks; ``$NO_COLOR`` takes its colours away, as
rich does. rich is an optional extra: nothing imports it, or this module, at import time;
the command does when it decides on the display and shows it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

import attrs
from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..harness.runner import RunObserver, RunResult

#: Redraws per second: a run goes through hundreds of examples a second, the display
#: through a few frames.
REFRESH_PER_SECOND = 4


@attrs.define
class SuiteProgress:
    """What the display knows of one suite run."""

    label: str
    started: float
    round: int = 0
    phase: str = "starting"
    #: The phase's rich style.
    style: str = ""
    replaying: bool = False
    in_round: int = 0
    in_all: int = 0
    #: Convicted rules, each with whether it was an engine error rather than a failed check.
    convicted: dict[str, bool] = attrs.Factory(dict)
    #: Rules seen failing, in order: those not convicted yet are still being searched or shrunk.
    seen: list[str] = attrs.Factory(list)
    finished: float | None = None

    def elapsed(self, now: float) -> float:
        return (self.finished if self.finished is not None else now) - self.started


def duration(seconds: float) -> str:
    """``12.3 s`` under a minute, ``4:05`` under an hour, then ``1:02:03``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class LiveProgress(RunObserver):
    """The live display; a context manager that shows it while the run is in it::

        with LiveProgress() as display:
            run_suites("reference", suites, options, progress=display.say, observer=display)
    """

    def __init__(self, console: Console | None = None, refresh_per_second: float = REFRESH_PER_SECOND,
                 redirect: bool = True) -> None:
        self.console = console if console is not None else Console(file=sys.stdout)
        self.suites: dict[str, SuiteProgress] = {}
        # The runner's thread changes the rows, rich's refresh thread draws them.
        self._lock = threading.Lock()
        # What else the process prints goes above the display (stderr only when it is a terminal
        # too: written to a file, it stays there).
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second, transient=False,
                          redirect_stdout=redirect, redirect_stderr=redirect and _is_terminal(sys.stderr))

    def __enter__(self) -> LiveProgress:
        self._live.start(refresh=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._live.stop()  # draws the last state, which stays on the screen

    def say(self, message: str) -> None:
        """A plain progress line, printed above the display."""
        try:
            self.console.print(message, markup=False, highlight=False, emoji=False, soft_wrap=True)
        except Exception:  # the line matters more than the display
            print(message, file=sys.__stdout__, flush=True)

    # -- the runner's events ------------------------------------------------------------------
    def suite_started(self, suite: str, label: str, engine: str) -> None:
        with self._lock:
            self.suites[suite] = SuiteProgress(label, time.monotonic())

    def round_started(self, suite: str, round_number: int, replaying: bool, max_examples: int,
                      seed: int) -> None:
        with self._lock:
            row = self.suites[suite]
            row.round, row.in_round, row.replaying = round_number, 0, replaying
            row.phase = "replaying stored failures" if replaying else f"searching (seed {seed})"
            row.style = "cyan"

    def example_started(self, suite: str, in_round: int, in_all: int) -> None:
        row = self.suites[suite]
        row.in_round, row.in_all = in_round, in_all  # two ints: no lock needed to draw them

    def failure_seen(self, suite: str, rule_id: str) -> None:
        with self._lock:
            row = self.suites[suite]
            row.seen.append(rule_id)
            if row.finished is None and row.round:
                row.phase, row.style = "failure found: shrinking", "yellow"

    def rule_failed(self, suite: str, rule_id: str, engine_error: bool) -> None:
        with self._lock:
            self.suites[suite].convicted[rule_id] = engine_error

    def drawing(self, suite: str, count: int) -> None:
        with self._lock:
            row = self.suites[suite]
            row.phase, row.style = f"drawing {count} counterexample(s)", "cyan"

    def suite_finished(self, suite: str, result: RunResult) -> None:
        with self._lock:
            row = self.suites[suite]
            row.finished = time.monotonic()
            row.in_all = result.examples
            if result.incomplete is not None:
                row.phase, row.style = "incomplete", "yellow"
            elif result.internal_errors:
                row.phase, row.style = "internal error", "bold red"
            elif result.ok:
                row.phase, row.style = "done: OK", "green"
            else:
                row.phase, row.style = "done: not conforming", "red"

    # -- drawing ------------------------------------------------------------------------------
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        now = time.monotonic()
        with self._lock:
            rows = [attrs.evolve(row, convicted=dict(row.convicted), seen=list(row.seen))
                    for row in self.suites.values()]
        if not rows:
            return
        wide = options.max_width >= 110  # room for steady column widths as the phase changes
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("suite", style="bold")
        table.add_column("round", justify="right")
        table.add_column("phase", min_width=len("failure found: shrinking") if wide else None)
        table.add_column("examples\nthis round", justify="right")
        table.add_column("examples\nin all", justify="right")
        table.add_column("elapsed", justify="right", min_width=len("12.3 s"))
        table.add_column("failed rules", min_width=len("KV-POOL-007") if wide else None)
        for row in rows:
            table.add_row(row.label, str(row.round) if row.round else "-", Text(row.phase, style=row.style),
                          str(row.in_round), str(row.in_all), duration(row.elapsed(now)), _failed(row))
        yield table


def _failed(row: SuiteProgress) -> Text:
    text = Text()
    for rule_id, engine_error in row.convicted.items():
        text.append((", " if text else "") + rule_id + (" (error)" if engine_error else ""), style="bold red")
    for rule_id in row.seen:
        if rule_id not in row.convicted:
            text.append((", " if text else "") + rule_id + " (found)", style="yellow")
    return text if text else Text("none", style="dim")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def end_of_display(file: IO[str] | Any = None) -> None:
    """After a worker process that showed the display died mid-frame: the cursor shown again
    and the next line below the display (what stopping the display does)."""
    console = Console(file=file if file is not None else sys.stdout)
    if console.is_terminal:
        console.show_cursor(True)
        console.line()
