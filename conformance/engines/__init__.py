"""Engines kvoracle knows by name, and loading an engine from ``module:Class``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from ..adapter import EngineAdapter

#: Engines built into kvoracle, by the name ``kvoracle check --engine`` accepts.
BUILTIN_ENGINES: dict[str, str] = {
    "reference": "kvoracle.conformance.engines.reference:ReferenceEngine",
    "vllm": "kvoracle.conformance.engines.vllm:VllmEngine",
    "gpu": "kvoracle.conformance.engines.gpu:GpuEngine",
}


class EngineLoadError(Exception):
    """An ``--engine`` value that names nothing loadable."""


def load_engine(spec: str) -> Callable[[], EngineAdapter]:
    """The adapter factory named by ``spec``: a built-in name or ``module:Class``."""
    target = BUILTIN_ENGINES.get(spec, spec)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise EngineLoadError(
            f"engine {spec!r}: expected one of {sorted(BUILTIN_ENGINES)} or 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # Like `python -m`, also look in the current directory (plain `pytest` and console
        # scripts do not put it on sys.path).
        if error.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {error}"
                                  ) from error
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as again:
            raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {again}"
                                  ) from again
    except ImportError as error:
        raise EngineLoadError(f"engine {spec!r}: cannot import {module_name}: {error}") from error
    factory: object = module
    for part in attribute.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise EngineLoadError(
                f"engine {spec!r}: {module_name} has no attribute {attribute}") from None
    if not callable(factory):
        raise EngineLoadError(f"engine {spec!r}: {attribute} is not callable")
    return factory  # type: ignore[return-value]


def engine_spec_of(factory: Callable[[], EngineAdapter]) -> str:
    """The ``module:qualname`` that loads ``factory`` again (for replay files)."""
    for name, target in BUILTIN_ENGINES.items():
        module_name, _, attribute = target.partition(":")
        if getattr(factory, "__module__", None) == module_name and \
                getattr(factory, "__qualname__", None) == attribute:
            return name
    return f"{factory.__module__}:{factory.__qualname__}"
