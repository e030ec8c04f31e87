"""Replaying a step list, and writing a counterexample as a standalone pytest file.

A replay applies the steps through the suite's driver with the same engine caller a
run uses: the same time limit, the same fault containment. It raises
:class:`~.verdicts.RuleViolation` at the first failure -- including an engine that
raises, returns a wrong type, exits or hangs -- so a replay file fails for as long as
the engine still does what it was convicted of, and passes once it is fixed.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoracle.spec.contracts import checked

from .calls import EngineCaller, EngineError
from .engines import engine_factory
from .picture import missing
from .suites import SuiteDef, capabilities_of, get_suite
from .verdicts import Counterexample, RuleViolation, Verdicts

if TYPE_CHECKING:
    from .runner import RunOptions


def replay(suite: str | SuiteDef, engine: str | Callable[[], Any], steps: Sequence[object],
           step_timeout: float | None = 10.0, timeout_clock: str = "engine", isolate: str | None = None
           ) -> Verdicts | None:
    """Apply ``steps`` to ``engine`` in ``suite``; raises on the first failure.

    With ``isolate`` (the path of a replay file) the steps run in a child process running
    that file, so an engine that kills its process fails the replay instead of ending it.
    """
    if isolate is not None:
        _replay_in_child(isolate)
        return None
    suite = get_suite(suite) if isinstance(suite, str) else suite
    factory = engine_factory(engine, suite) if isinstance(engine, str) else engine
    caller = EngineCaller(step_timeout, returns=suite.returns, clock=timeout_clock)
    try:
        driver = _driver(suite, factory, caller)
        for step in steps:
            driver.apply(step)
        driver.close()
    finally:
        caller.close()
    return driver.verdicts


def _driver(suite: SuiteDef, factory: Callable[[], Any], caller: EngineCaller, as_run: bool = False):
    """A fresh driver of ``suite`` judging the engine ``factory`` builds, every rule of the suite in
    scope; ``as_run`` also leaves out the rules the suite excludes for this engine, as a run does."""
    probe = caller.construct(factory, loading=True)
    scope = set(suite.scope())
    verdicts = Verdicts(capabilities_of(probe), scope=lambda rule: rule.id in scope,
                        out_of_scope=f"not judged by {suite.label}")
    if as_run:
        for rule_id, reason in suite.exclusions(probe).items():
            if rule_id in scope:
                verdicts.exclude(rule_id, reason)
    return suite.driver(factory, verdicts, caller)


def picture_replay(suite: str | SuiteDef, engine: str | Callable[[], Any], example: Counterexample,
                   step_timeout: float | None = 10.0, timeout_clock: str = "engine",
                   hung: dict[str, str] | None = None) -> dict[str, Any]:
    """Replay ``example``'s steps once, the driver drawing its picture (:mod:`.picture`) at the
    step that fails; never raises.

    The picture is :func:`.picture.missing`, with the reason, when the steps no longer fail
    (an engine that fails only now and then), fail another rule first, or the engine cannot be
    built. ``hung`` (operation -> why) are operations that never answered in the run: they fail
    at once here instead of waiting out the time limit again.
    """
    suite = get_suite(suite) if isinstance(suite, str) else suite
    caller = EngineCaller(step_timeout, returns=suite.returns, clock=timeout_clock)
    caller.quarantine.hung.update(hung or {})
    try:
        factory = engine_factory(engine, suite) if isinstance(engine, str) else engine
        driver = _driver(suite, factory, caller, as_run=True)
        driver.capture_picture = True
        try:
            for step in example.steps:
                driver.apply(step)
        except RuleViolation as failed:
            if failed.rule_id != example.rule_id:
                return missing(f"replayed once for the picture, the steps failed {failed.rule_id} first, "
                               f"not {example.rule_id}")
            return driver.pictured or missing("the driver drew no picture")
        finally:
            driver.close()
        return missing("replayed once for the picture, the steps did not fail again (an engine that fails "
                       "only now and then)")
    except EngineError as error:
        return missing(f"the engine could not be built to replay the steps: {error.detail}")
    except Exception as error:  # kvoracle's own, or an adapter's capabilities(): never a verdict
        return missing(f"replaying the steps for the picture failed: {type(error).__name__}: {error}")
    finally:
        caller.close()


def confirm_replay(suite: SuiteDef, factory: Callable[[], Any], example: Counterexample,
                   step_timeout: float | None = 10.0, timeout_clock: str = "engine",
                   hung: dict[str, str] | None = None) -> str | None:
    """Replay ``example``'s steps once with kvoracle's contracts on, as a run judges them:
    ``None`` when they fail ``example``'s rule again, else why not (they no longer fail, or fail
    another rule first: an engine that answers the same steps differently). A contract of
    kvoracle's that breaks is raised (:class:`icontract.ViolationError`): kvoracle's bug. ``hung``
    (operation -> why) fail at once instead of waiting out the time limit again."""
    caller = EngineCaller(step_timeout, returns=suite.returns, clock=timeout_clock)
    caller.quarantine.hung.update(hung or {})
    try:
        driver = _driver(suite, factory, caller, as_run=True)
        try:
            with checked():
                for step in example.steps:
                    driver.apply(step)
        except RuleViolation as failed:
            if failed.rule_id == example.rule_id:
                return None
            return f"replayed with kvoracle's contracts on, the steps failed {failed.rule_id} first"
        finally:
            driver.close()
        return "replayed with kvoracle's contracts on, the steps did not fail again"
    except EngineError as error:
        return f"the engine could not be built to replay the steps: {error.detail}"
    finally:
        caller.close()


def _replay_in_child(path: str) -> None:
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    if done.returncode < 0:
        try:
            how = signal.Signals(-done.returncode).name
        except ValueError:
            how = f"signal {-done.returncode}"
        raise AssertionError(f"the engine process died ({how}) replaying {path}\n{done.stderr[-2000:]}")
    raise AssertionError(f"replaying {path} failed (exit status {done.returncode}):\n{done.stderr[-4000:]}")


_TEMPLATE = '''\
"""kvoracle counterexample: {rule_id} on engine {engine!r} ({suite} suite).

{message}

Generated by `kvoracle check --suite {suite}`; run with `pytest {filename}`. The test
fails while the engine still {does}, and passes once it is fixed.
"""

from kvoracle.conformance.harness.replay import replay
from {module} import (  # importing the module registers the suite
    {names})

ENGINE = {engine!r}
STEPS = [
{steps}
]


def test_{test_name}():
    replay({suite!r}, ENGINE, STEPS, step_timeout={timeout!r}, timeout_clock={clock!r}{isolate})
{main}'''

_MAIN = '''

if __name__ == "__main__":  # the child process the test runs the steps in
    replay({suite!r}, ENGINE, STEPS, step_timeout={timeout!r}, timeout_clock={clock!r})
'''


def write_replay(directory: Path, suite: SuiteDef, engine_spec: str, example: Counterexample,
                 options: RunOptions | None = None, isolate: bool = False) -> Path:
    """Write ``example`` as ``test_<suite>_<rule>_<engine>.py`` under ``directory`` (``isolate``:
    the test runs the steps in a child process, for an engine that killed its process)."""
    directory.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"\W+", "_", f"{suite.name}_{example.rule_id}_{engine_spec}").strip("_").lower()
    path = directory / f"test_{slug}.py"
    message = "\n".join(line.rstrip() for line in example.message.splitlines())
    does = "fails this way" if example.engine_error else "violates the rule"
    timeout = options.step_timeout if options else 10.0
    clock = options.timeout_clock if options else "engine"
    main = _MAIN.format(suite=suite.name, timeout=timeout, clock=clock) if isolate else ""
    path.write_text(_TEMPLATE.format(
        isolate=", isolate=__file__" if isolate else "", main=main, rule_id=example.rule_id, engine=engine_spec,
        suite=suite.name, message=message.replace('"""', "'''"),
        filename=path.name, does=does, module=suite.module, names=", ".join(suite.step_names),
        steps="\n".join(f"    {step!r}," for step in example.steps), test_name=slug, timeout=timeout,
        clock=clock))
    return path
