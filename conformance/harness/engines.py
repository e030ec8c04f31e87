"""The engine registry: from an ``--engine`` value to an adapter factory for one suite.

A built-in engine name (``reference``, ``vllm``, ``gpu``, ...) names one adapter per
suite that has one; the suites declare theirs (:attr:`~.suites.SuiteDef.engines`).
Any other value is ``module:Class`` (or ``module:factory``): one adapter for every
suite whose operations it offers.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from .suites import SuiteDef, registered_suites


class EngineLoadError(Exception):
    """An ``--engine`` value that names nothing loadable, or nothing for the suite asked for."""


def builtin_engines() -> dict[str, list[str]]:
    """Built-in engine name -> the suites it has an adapter for."""
    names: dict[str, list[str]] = {}
    for suite in registered_suites():
        for name in suite.engines:
            names.setdefault(name, []).append(suite.name)
    return names


def load_target(spec: str, target: str | None = None) -> Callable[[], Any]:
    """The callable named by ``target`` (``module:attribute``); ``spec`` names it in errors."""
    target = target or spec
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise EngineLoadError(
            f"engine {spec!r}: expected one of {sorted(builtin_engines())} or 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # Like `python -m`, also look in the current directory (plain `pytest` and console
        # scripts do not put it on sys.path).
        if error.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {error}") from error
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as again:
            raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {again}") from again
    except ImportError as error:
        raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {error}") from error
    except Exception as error:  # the module's own code failed on import
        raise EngineLoadError(
            f"engine {spec!r}: importing {module_name} raised {type(error).__name__}: {error}") from error
    factory: object = module
    for part in attribute.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise EngineLoadError(f"engine {spec!r}: {module_name} has no attribute {attribute}") from None
    if not callable(factory):
        raise EngineLoadError(f"engine {spec!r}: {attribute} is not callable")
    return factory  # type: ignore[return-value]


def engine_factory(engine: str, suite: SuiteDef) -> Callable[[], Any]:
    """The adapter factory ``engine`` names for ``suite``.

    A built-in name without an adapter for ``suite`` is an error naming the suites it
    has one for (never another engine in its place).
    """
    if engine in suite.engines:
        return load_target(engine, suite.engines[engine])
    builtins = builtin_engines()
    if engine in builtins:
        raise EngineLoadError(
            f"engine {engine!r} has no adapter for the {suite.name} suite; it has one for: "
            f"{', '.join(builtins[engine])}")
    return load_target(engine)


def engine_spec_of(factory: Callable[[], Any], suite: SuiteDef | None = None) -> str:
    """What ``--engine`` value loads ``factory`` again (a built-in name, or ``module:qualname``)."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    for candidate in [suite] if suite is not None else registered_suites():
        for name, target in candidate.engines.items():
            if target == f"{module}:{qualname}":
                return name
    return f"{module}:{qualname}"
