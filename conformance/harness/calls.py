"""Calling an engine: every suite's one door to the engine under test.

An engine may misbehave in four ways besides answering wrongly: it raises, it
returns something of the wrong shape, it tries to end the process
(``sys.exit``, ``os._exit``), or it never answers. :class:`EngineCaller` turns
each into an :class:`EngineError`, which the driver charges to the rule being
checked; kvoracle's own code never sees the engine's exception.

Time limits end hangs; they never judge speed. A call's *engine time* is its wall
time less the time its thread waited for a CPU (Linux reports that per thread in
``/proc/self/task/<tid>/schedstat``), so a correct engine on a machine loaded with
other work uses no more engine time than on an idle one, while an engine that
sleeps, deadlocks or loops forever uses it up. Where the scheduler statistics
cannot be read, or with ``clock="wall"``, the limit is plain wall time.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import queue
import reprlib
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kvoracle.spec.contracts import checked

#: Validates what an operation returned: ``None`` when it is acceptable, else what is wrong.
Validator = Callable[[Any], "str | None"]

CLOCKS = ("engine", "wall")

#: Seconds the first construction of an adapter in a run may use: it imports the engine, and
#: an import reads many files. A thread waiting on the disk is not waiting for a CPU, so engine
#: time counts it: a cold import of vLLM on a machine busy with other disk work used more than
#: the 10 s step limit. The limit still ends a constructor that hangs.
LOAD_TIMEOUT = 300.0

#: How an engine failed in one call.
RAISED, RETURNED, EXITED, HUNG = "raised", "returned", "exited", "hung"


class EngineError(Exception):
    """The engine raised, returned a wrong type, tried to exit, or did not answer in time."""

    def __init__(self, operation: str, detail: str, kind: str = RAISED) -> None:
        super().__init__(f"engine failed in {operation}: {detail}")
        self.operation = operation
        self.detail = detail
        self.kind = kind

    @property
    def hung(self) -> bool:
        return self.kind == HUNG


class EngineExit(BaseException):
    """Raised in place of ``os._exit`` while an engine call runs (not an ``Exception``, so that
    an engine's own ``except Exception`` cannot swallow it)."""

    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


# -- os._exit while the engine runs ------------------------------------------------------------
_IN_ENGINE = threading.local()
_REAL_EXIT = os._exit
_GUARD_PID: int | None = None


def _guarded_exit(code: int) -> None:
    # Only the engine's own calls, in this process (a forked child of the engine exits for real).
    if getattr(_IN_ENGINE, "active", False) and os.getpid() == _GUARD_PID:
        raise EngineExit(code)
    _REAL_EXIT(code)


def _install_exit_guard() -> None:
    global _GUARD_PID
    if os._exit is not _guarded_exit:
        _GUARD_PID = os.getpid()
        os._exit = _guarded_exit  # type: ignore[assignment]


def _invoke(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    _IN_ENGINE.active = True
    try:
        return function(*args, **kwargs)
    finally:
        _IN_ENGINE.active = False


# -- the trail a supervisor reads after a crash ----------------------------------------------------
class Trail:
    """Where the run is: the suite, the current example's steps, the engine operation running.

    This one records nothing; a supervised worker's trail (:mod:`.supervisor`) keeps it where
    the supervising process can read it after the worker died.
    """

    def example(self, suite: str) -> None:
        """A new example of ``suite`` begins."""

    def step(self, step: object) -> None:
        """``step`` is applied next."""

    def operation(self, operation: str, rule_id: str) -> None:
        """The engine's ``operation`` runs, charged to ``rule_id`` if it fails."""


# -- quarantine ----------------------------------------------------------------------------------
@attrs.define
class Quarantine:
    """Operations kvoracle stops calling during a run, and why.

    A hung operation is quarantined at once -- every later call fails fast with the
    same error, so nothing waits for the time limit twice. An operation that raised is
    quarantined from the next round on (machines read :meth:`blocked` when a round
    starts), so that Hypothesis can still shrink the failure it found: its replays
    must meet the same engine. It is quarantined only in the *scope* it raised in: the kind of
    model the suite's driver names (:attr:`.driver.Driver.quarantine_scope`), so that a raise
    in one kind of model (vLLM 0.33.0's allocation in an align-mode Mamba model, a known bug)
    does not keep every other kind from allocating for the rest of the run.
    """

    hung: dict[str, str] = attrs.Factory(dict)
    #: By (operation, scope).
    raised: dict[tuple[str, str], str] = attrs.Factory(dict)

    def blocked(self) -> frozenset[tuple[str, str]]:
        """The (operation, scope) pairs a round starting now does not call; a hang's scope is
        :data:`EVERY_SCOPE`."""
        return frozenset((operation, EVERY_SCOPE) for operation in self.hung) | frozenset(self.raised)


#: The scope of a quarantine that holds in every kind of model (a hang's).
EVERY_SCOPE = "*"


# -- the engine clock ------------------------------------------------------------------------------
def _open_schedstat(native_id: int) -> int | None:
    """A descriptor of the thread's scheduler statistics, kept open for the thread's life: read
    before and after every engine call, the file costs a tenth as much re-read in place
    (``os.pread`` at offset 0 makes the kernel write it afresh) as opened each time."""
    try:
        descriptor = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
    except OSError:
        return None
    if _run_queue_wait(descriptor) is None:
        os.close(descriptor)
        return None
    return descriptor


def _run_queue_wait(descriptor: int) -> float | None:
    """Seconds the thread has waited runnable for a CPU (the file's second field, nanoseconds)."""
    try:
        return int(os.pread(descriptor, 256, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class _Worker:
    """One daemon thread running engine calls (a hung call cannot keep the process alive at exit,
    which ``ThreadPoolExecutor``'s joined threads would)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Event()
        self.native_id = 0
        self._thread = threading.Thread(target=self._run, args=(ready,), name="kvoracle-engine",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        #: The open scheduler statistics of the thread, or None where the kernel has none.
        self.schedstat = _open_schedstat(self.native_id)

    def _run(self, ready: threading.Event) -> None:
        self.native_id = threading.get_native_id()
        ready.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, function, args, kwargs = job
            try:
                future.set_result(_invoke(function, args, kwargs))
            except BaseException as error:  # the engine's, whatever it is: reported, never raised here
                future.set_exception(error)

    def waited(self) -> float:
        """Seconds this thread has spent runnable but waiting for a CPU."""
        if self.schedstat is None:
            return 0.0
        waited = _run_queue_wait(self.schedstat)
        return 0.0 if waited is None else waited

    def submit(self, function: Callable[..., Any], args: tuple, kwargs: dict
               ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, function, args, kwargs))
        return future

    def stop(self) -> None:
        self._jobs.put(None)
        self._close_schedstat()

    def abandon(self) -> None:
        """The thread is stuck in the engine: it is left running, its statistics file closed."""
        self._close_schedstat()

    def _close_schedstat(self) -> None:
        descriptor, self.schedstat = self.schedstat, None
        if descriptor is not None:
            os.close(descriptor)


def settle_imported() -> None:
    """Moves every object alive now out of the cyclic garbage collector's sight (``gc.freeze``):
    called after a load that imported modules, whose objects live as long as the process.

    An engine's import leaves hundreds of thousands of them (vLLM with torch about 600,000),
    which every full collection would otherwise walk again: 0.3 s a collection on the 2-core
    machine, and Hypothesis makes one at the first test of each thread (``register_random``
    collects, then searches the heap for referrers). A lookup-suite run against vLLM used 8.1 s
    of CPU without it and 7.0 s with it, for the same test calls. Reference counting still frees
    frozen objects; only a reference cycle among them that later becomes garbage is kept, as a
    module's objects would be anyway."""
    gc.freeze()


_SHORT = reprlib.Repr()
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlevel = 3


def short_repr(value: object) -> str:
    return _SHORT.repr(value)


class EngineCaller:
    """Calls an engine's operations, turning every misbehaviour into :class:`EngineError`.

    ``returns`` maps an operation to the validator of its result (the suite's protocol
    declares them). With a ``timeout`` each call runs on a worker thread; a call that
    uses more than ``timeout`` seconds of engine time (see the module's text) is
    abandoned -- Python cannot kill a thread -- reported as a hang, and its operation
    quarantined for the rest of the run.
    """

    def __init__(self, timeout: float | None = None, quarantine: Quarantine | None = None,
                 returns: Mapping[str, Validator] | None = None, clock: str = "engine",
                 trail: Trail | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"step timeout must be positive (or None for no limit), got {timeout!r}")
        if clock not in CLOCKS:
            raise ValueError(f"timeout clock must be one of {CLOCKS}, got {clock!r}")
        self.timeout = timeout
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.returns = dict(returns or {})
        self.clock = clock
        self.trail = trail if trail is not None else Trail()
        self._worker: _Worker | None = None
        _install_exit_guard()

    @property
    def measures_engine_time(self) -> bool:
        """Whether the limit excludes time spent waiting for a CPU (else it is wall time)."""
        return self.clock == "engine" and self._get_worker().schedstat is not None

    def _get_worker(self) -> _Worker:
        if self._worker is None:
            self._worker = _Worker()
        return self._worker

    def construct(self, factory: Callable[[], Any], loading: bool = False) -> Any:
        """Build an adapter: its constructor is engine code too. The first build of a run
        (``loading``) imports the engine: it may use up to :data:`LOAD_TIMEOUT` seconds."""
        if not loading:
            return self._run("the adapter's constructor", factory, (), {})
        modules = len(sys.modules)
        adapter = self._run("the adapter's constructor", factory, (), {},
                            max(self.timeout, LOAD_TIMEOUT) if self.timeout is not None else None)
        if len(sys.modules) > modules:
            settle_imported()
        return adapter

    def __call__(self, engine: Any, operation: str, *args: Any, **kwargs: Any) -> Any:
        if operation in self.quarantine.hung:
            raise EngineError(operation, self.quarantine.hung[operation] + " (quarantined)", HUNG)
        function = getattr(engine, operation, None)
        if not callable(function):
            raise EngineError(operation, f"the adapter has no operation {operation!r}", RAISED)
        value = self._run(operation, function, args, kwargs)
        validate = self.returns.get(operation)
        problem = validate(value) if validate is not None else None
        if problem is not None:
            raise EngineError(operation, f"returned {short_repr(value)}: {problem}", RETURNED)
        return value

    def _run(self, operation: str, function: Callable[..., Any], args: tuple, kwargs: dict,
             timeout: float | None = None) -> Any:
        try:
            if self.timeout is None:  # in this thread: with the engine's own contracts, whatever kvoracle's
                with checked():
                    return _invoke(function, args, kwargs)
            return self._timed(operation, function, args, kwargs, timeout or self.timeout)
        except EngineError:
            raise
        except KeyboardInterrupt:
            raise
        except (SystemExit, EngineExit) as error:
            name = "sys.exit" if isinstance(error, SystemExit) else "os._exit"
            raise EngineError(operation, f"called {name}({error.code!r})", EXITED) from None
        except BaseException as error:  # the engine's own failure, never kvoracle's
            raise EngineError(operation, f"{type(error).__name__}: {error}", RAISED) from None

    def _timed(self, operation: str, function: Callable[..., Any], args: tuple, kwargs: dict,
               timeout: float) -> Any:
        worker = self._get_worker()
        engine_time = self.clock == "engine"
        started, waited = time.monotonic(), worker.waited() if engine_time else 0.0
        future = worker.submit(function, args, kwargs)
        remaining = timeout
        while True:
            try:
                return future.result(max(remaining, 0.01))
            except concurrent.futures.TimeoutError:
                used = time.monotonic() - started
                if engine_time:
                    used -= worker.waited() - waited
                remaining = timeout - used
                if remaining > 0:
                    continue
            what = "engine time" if engine_time and worker.schedstat is not None else "wall time"
            detail = f"no answer within {timeout:g} s of {what}"
            self.quarantine.hung[operation] = detail
            worker.abandon()
            self._worker = None  # the old thread is stuck in the engine; leave it
            raise EngineError(operation, detail, HUNG)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
