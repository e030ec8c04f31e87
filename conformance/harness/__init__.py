"""The conformance harness: what every suite shares, knowing no suite in particular.

* :mod:`.suites` -- :class:`SuiteDef` and the suite registry (suites register themselves);
* :mod:`.engines` -- the engine registry: ``--engine`` values to adapter factories;
* :mod:`.calls` -- the engine caller: time limits on engine time, fault containment,
  return-type validation (:mod:`.returns`);
* :mod:`.driver`, :mod:`.machine` -- the bases of each suite's driver and machine;
* :mod:`.verdicts` -- per-rule verdicts; :mod:`.runner` -- rounds, shrinking, results;
* :mod:`.replay`, :mod:`.report`, :mod:`.expectations` -- replay files, reports,
  expected failures.
"""

from .calls import EngineCaller, EngineError, Quarantine
from .capabilities import Capabilities
from .driver import Driver
from .engines import EngineLoadError, builtin_engines, engine_factory, engine_spec_of, load_target
from .machine import SuiteMachine, bind_machine, machine_for
from .replay import replay, write_replay
from .runner import CheckResult, RunOptions, RunResult, SuiteLoadError, run_suite, run_suites
from .suites import SuiteDef, get_suite, register_alias, register_suite, registered_suites
from .verdicts import Counterexample, KnownFailure, RuleViolation, Verdicts, violation

__all__ = [
    "Capabilities",
    "CheckResult",
    "Counterexample",
    "Driver",
    "EngineCaller",
    "EngineError",
    "EngineLoadError",
    "KnownFailure",
    "Quarantine",
    "RuleViolation",
    "RunOptions",
    "RunResult",
    "SuiteDef",
    "SuiteLoadError",
    "SuiteMachine",
    "Verdicts",
    "bind_machine",
    "builtin_engines",
    "engine_factory",
    "engine_spec_of",
    "get_suite",
    "load_target",
    "machine_for",
    "register_alias",
    "register_suite",
    "registered_suites",
    "replay",
    "run_suite",
    "run_suites",
    "violation",
    "write_replay",
]
