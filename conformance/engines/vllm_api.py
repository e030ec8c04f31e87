"""vLLM's KV-cache API across releases: what each release offers, found by looking.

kvoracle's vLLM adapters follow the engine's real API from vLLM 0.14 to the newest
release by *feature detection*: they ask a class or method which keyword arguments it
takes, which attributes it has and how many results it returns, never which version it
is. A release that lacks a parameter kvoracle sets to the value that release has fixed
anyway (a retention interval of ``None``, no hash look-ahead, no watermark, ...) is
called without it; a release that lacks a parameter kvoracle needs at another value is
refused with an error naming the parameter and the release. Where an operation truly
does not exist in a release (the store coordinator's ``lookup_mask`` before 0.28, the
per-group lookup before 0.24), the adapter says so and the suite or rule needing it is
reported unsupported or not applicable, never passed.

This module holds the detection shared by the three vLLM adapters; it imports no vLLM.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

#: The releases whose v1 KV-cache manager the adapters know how to drive (a range as
#: expectations files write them).
SUPPORTED_RELEASES = ">=0.14"


#: Each callable's parameters, found once: the adapters ask on every request and lookup, and
#: reading a signature cost about a tenth of a conformance run against vLLM. Keyed by the
#: callable itself (a bound method by its function: a fresh bound method is made on every
#: attribute access; a class with its constructor), so a function patched in (a mutant) is
#: looked at anew.
_PARAMETERS: dict[object, Mapping[str, inspect.Parameter]] = {}


def parameters(function: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    """The parameters ``function`` (or a class's constructor) takes, by name."""
    unbound = getattr(function, "__func__", None)
    key: object = (("bound", unbound) if unbound is not None
                   else (function, function.__init__) if isinstance(function, type) else function)
    try:
        return _PARAMETERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: looked at every time
        key = None
    try:
        found = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: no keyword we can name
        found = {}
    if key is not None:
        _PARAMETERS[key] = found
    return found


def takes(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` accepts a keyword argument ``name``."""
    params = parameters(function)
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class UnsupportedByRelease(ValueError):
    """The installed vLLM release lacks a parameter or operation kvoracle needs."""


#: Parameters older releases require that later releases dropped, with the value that means
#: "not used" (vLLM 0.14's ``Request`` requires ``eos_token_id``; kvoracle never stops on one).
RETIRED_REQUIRED: Mapping[str, Any] = {"eos_token_id": None}


def call(version: str, function: Callable[..., Any], /, *args: Any,
         built_in: Mapping[str, Any] = {}, **kwargs: Any) -> Any:
    """Call ``function`` with ``kwargs`` as far as the installed release takes them.

    ``built_in`` maps parameters of later releases to the value that releases without them
    have built in. Such a parameter is left out where the release does not take it and
    kvoracle wants exactly that value; any other keyword the release does not take is
    refused (:class:`UnsupportedByRelease`, naming it), never silently dropped.
    """
    name = getattr(function, "__qualname__", repr(function))
    accepted: dict[str, Any] = {}
    refused: list[str] = []
    for key, value in kwargs.items():
        if takes(function, key):
            accepted[key] = value
        elif not (key in built_in and value == built_in[key]):
            refused.append(f"{key}={value!r}")
    if refused:
        raise UnsupportedByRelease(f"vLLM {version}: {name} takes no {', '.join(refused)}, "
                                   f"which kvoracle needs here")
    for key, param in parameters(function).items():
        if key in RETIRED_REQUIRED and key not in accepted and param.default is inspect.Parameter.empty:
            accepted[key] = RETIRED_REQUIRED[key]
    return function(*args, **accepted)
