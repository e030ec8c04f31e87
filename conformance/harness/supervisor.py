"""Runs survive an engine that takes the whole process down.

``kvoracle check`` runs the suites in a worker process and supervises it. The worker
keeps two things where the supervisor can read them after it died: a *checkpoint*
of each suite's verdicts (written whenever a rule's outcome may have changed, and
every few seconds for the counts), and a *trail* -- the suite, the steps of the
example being run and the engine operation running -- in a memory-mapped file,
which costs a memory copy per step. If the worker dies (a segmentation fault in an
engine's extension, ``os.abort``, the out-of-memory killer), the supervisor charges
the death to the rule of the step that was running, with that example's steps (not
shrunk: every replay could kill its process again) and a replay file that runs them
in a child process of its own; it keeps the verdicts so far, marks the run
incomplete, and starts a new worker for the suites still to run. A worker also hands
the suites still to run to a new worker after a suite in which an engine call never
answered: the abandoned call may still be running, and would slow every later call.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .calls import Trail
from .records import StepText, run_from_record, run_to_record
from .replay import write_replay
from .runner import CheckResult, RunOptions, RunResult
from .suites import get_suite
from .verdicts import Counterexample

TRAIL_SIZE = 8 << 20
_MAGIC = b"KVTRAIL1"
#: magic, end of the step text, example number, suite, operation, rule id.
_HEADER = struct.Struct("<8sQQ64s96s16s")


class FileTrail(Trail):
    """The worker's trail, in a memory-mapped file the supervisor reads after a crash."""

    def __init__(self, path: Path) -> None:
        with path.open("wb") as handle:
            handle.truncate(TRAIL_SIZE)
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), TRAIL_SIZE)
        self._end = _HEADER.size
        self._examples = 0
        self._suite = b""
        self._write_header(b"", b"")

    def _write_header(self, operation: bytes, rule_id: bytes) -> None:
        _HEADER.pack_into(self._map, 0, _MAGIC, self._end, self._examples, self._suite[:64],
                          operation[:96], rule_id[:16])

    def example(self, suite: str) -> None:
        self._examples += 1
        self._suite = suite.encode()
        self._end = _HEADER.size
        self._write_header(b"", b"")

    def step(self, step: object) -> None:
        text = (repr(step) + "\n").encode()
        end = self._end + len(text)
        if end > TRAIL_SIZE:
            return  # an example too long to keep whole: the steps so far are kept
        self._map[self._end:end] = text
        self._end = end
        struct.pack_into("<Q", self._map, 8, end)

    def operation(self, operation: str, rule_id: str) -> None:
        struct.pack_into("<96s16s", self._map, 8 + 8 + 8 + 64, operation.encode()[:96], rule_id.encode()[:16])

    def close(self) -> None:
        self._map.close()
        self._file.close()


def read_trail(path: Path) -> dict[str, Any] | None:
    """What a dead worker's trail says, or ``None`` if it never wrote one."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, end, examples, suite, operation, rule_id = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC:
        return None
    text = data[_HEADER.size:end].decode(errors="replace")
    return {"suite": suite.rstrip(b"\0").decode(), "operation": operation.rstrip(b"\0").decode(),
            "rule": rule_id.rstrip(b"\0").decode(), "examples": examples,
            "steps": [StepText(line) for line in text.splitlines()]}


class Checkpoints:
    """The worker side: writes each suite's verdicts where the supervisor finds them."""

    #: Counts are refreshed at most this often; outcome changes are written at once.
    INTERVAL_S = 2.0

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._last = 0.0
        self._signature: tuple[int, int] | None = None

    def path(self, suite: str, done: bool = False) -> Path:
        return self.directory / f"{'done' if done else 'current'}-{suite}.json"

    def __call__(self, result: RunResult, done: bool = False) -> None:
        outcomes = result.verdicts.outcomes.values()
        signature = (sum(1 for o in outcomes if o.checks), sum(len(o.counterexamples) + len(o.errors)
                                                              for o in outcomes))
        now = time.monotonic()
        if not done and signature == self._signature and now - self._last < self.INTERVAL_S:
            return
        self._signature, self._last = signature, now
        target = self.path(result.part or result.suite, done)  # the name the supervisor asked for
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(run_to_record(result)))
        partial.replace(target)


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _crashed_run(directory: Path, suite_name: str, returncode: int, options: RunOptions,
                 engine: str) -> RunResult | None:
    """The crashed suite's verdicts so far, with the death charged to a rule."""
    current = Checkpoints(directory).path(suite_name)
    if not current.exists():
        return None
    run = run_from_record(json.loads(current.read_text()))
    trail = read_trail(directory / "trail") or {}
    how = _signal_name(returncode)
    operation = trail.get("operation") or "an engine call"
    run.incomplete = f"the engine process died ({how}) in {operation}"
    suite = get_suite(suite_name)  # an alias names a part of its suite: the trail names the suite
    rule_id = trail.get("rule") or suite.driver.fault_rule
    if trail.get("suite") == suite.name and rule_id in run.verdicts.outcomes \
            and run.verdicts.applicable(rule_id):
        example = Counterexample(rule_id, f"engine failed in {operation}: the process died ({how})",
                                 list(trail.get("steps", [])), engine_error=True, suite=suite.name,
                                 shrunk=False)
        if options.replay_dir is not None:
            example.replay_path = str(write_replay(options.replay_dir, suite, engine, example,
                                                   options, isolate=True))
        run.verdicts.record(example)
    return run


def supervise(command: Sequence[str], engine: str, suites: Sequence[str], options: RunOptions,
              directory: Path, say: Callable[[str], None]) -> CheckResult:
    """Run ``command`` (the worker: ``kvoracle check ... --worker-state DIR``) for ``suites``,
    starting a new worker after each death, and gather what the workers wrote."""
    result = CheckResult(engine, options)
    remaining = list(suites)
    resumed: list[str] = []
    while remaining:
        asked = len(remaining)
        # The worker stays in this process group and session: Ctrl-C reaches it from the terminal,
        # and it keeps the user's scheduling (a session of its own would escape `nice`).
        process = subprocess.Popen([*command, "--worker-suites", ",".join(remaining), *resumed])
        forward = _forward_signals(process)
        try:
            returncode = process.wait()
        finally:
            forward()
        for name in list(remaining):
            done = Checkpoints(directory).path(name, done=True)
            if done.exists():
                result.runs.append(run_from_record(json.loads(done.read_text())))
                remaining.remove(name)
        summary = directory / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            result.unsupported.update(data.get("unsupported", {}))
            for name in data.get("unsupported", {}):
                if name in remaining:
                    remaining.remove(name)
            for name in data.get("not_run", []):  # --fail-fast stopped before them
                result.not_run.append(name)
                if name in remaining:
                    remaining.remove(name)
            if data.get("usage_error"):
                raise WorkerUsageError(data["usage_error"])
            if data.get("incomplete"):
                result.incomplete = data["incomplete"]
                _keep_current(result, directory, remaining)
                return result
            summary.unlink()
            if data.get("handed_on") and 0 < len(remaining) < asked and returncode == 0:
                say(f"starting a fresh engine process for {', '.join(remaining)}: an engine call that never "
                    f"answered may still be running in the last one")
                resumed = ["--worker-resumed"]
                continue
        if not remaining or returncode == 0:
            break
        crashed = remaining.pop(0)
        run = _crashed_run(directory, crashed, returncode, options, engine)
        how = _signal_name(returncode)
        if run is None:
            result.incomplete = f"{crashed}: the engine process died ({how}) before the suite started"
            say(f"{crashed}: the engine process died ({how}) before the suite started")
        else:
            result.runs.append(run)
            result.incomplete = f"{crashed}: {run.incomplete}"
            say(f"{crashed}: {run.incomplete}; its verdicts so far are kept")
        for stale in (directory / "trail", Checkpoints(directory).path(crashed)):
            stale.unlink(missing_ok=True)
        # The next worker runs what is left: that the engine has an adapter for none of it is
        # no longer an error (the suites not named may all be unsupported), only a report line.
        resumed = ["--worker-resumed"]
    return result


def _keep_current(result: CheckResult, directory: Path, remaining: list[str]) -> None:
    """An interrupted worker checkpointed the suite it was running: keep its verdicts so far."""
    for name in remaining:
        current = Checkpoints(directory).path(name)
        if current.exists():
            run = run_from_record(json.loads(current.read_text()))
            if run.incomplete is not None:
                result.runs.append(run)


class WorkerUsageError(Exception):
    """The worker found the engine cannot be run (it printed why; exit status 2)."""


def _forward_signals(process: subprocess.Popen) -> Callable[[], None]:
    """A SIGINT or SIGTERM sent to the supervisor alone reaches the worker too (which acts on
    the first it gets: from the terminal a Ctrl-C reaches both)."""
    def forward(signum: int, frame: object) -> None:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
    names = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
    previous = {name: signal.signal(name, forward) for name in names}

    def restore() -> None:
        for name, handler in previous.items():
            signal.signal(name, handler)
    return restore


def worker_command(argv: Sequence[str], directory: Path) -> list[str]:
    return [sys.executable, "-m", "kvoracle", *argv, "--worker-state", str(directory)]
