"""Importing SGLang's prefix cache on a CPU-only machine, once per process.

SGLang 0.5.23's configs package imports ``torchvision.transforms`` at import time (for an
image preprocessor the prefix cache never calls), and no torchvision build matches the CPU
torch kvoracle installs (``scripts/install_sglang.sh``). When torchvision is missing,
:func:`import_sglang` first asks transformers whether torchvision is available (transformers
caches the answer, False), then stands stub modules in for ``torchvision``,
``torchvision.transforms`` and ``torchvision.transforms.functional``: any attribute of them
is a placeholder that raises ``ImportError`` when called, and dunder attributes are absent
(so ``inspect`` and ``torch.library`` see an ordinary module). A real torchvision is used
as it is.

The radix cache reads its LRU clock from ``time.monotonic()``; :func:`import_sglang` gives
the radix cache module a clock of its own (:class:`LogicalClock`), which ticks once per
read, so that eviction order depends on the order of operations only, never on the
machine's timer resolution or load. Nothing outside that module sees it.

Nothing here imports SGLang at import time: ``kvoracle.conformance`` imports without it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import time
import types
from typing import Any

import attrs

#: The modules the stub stands in for (SGLang imports these and no other torchvision module).
TORCHVISION_STUBS = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class SGLangUnavailable(ImportError):
    """SGLang (or a module its prefix cache imports) cannot be imported here."""


class _Placeholder:
    """A torchvision attribute: usable as a name at import time, refused when used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> _Placeholder:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Placeholder(f"{self._name}.{attribute}")

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise ImportError(f"{self._name}: torchvision is a stub in kvoracle's SGLang process "
                          "(scripts/install_sglang.sh); the prefix cache never needs it")


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def attribute(attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{name}.{attr}")

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


def _stub_torchvision() -> bool:
    """Stand the stub in for a missing torchvision; whether it did."""
    if "torchvision" in sys.modules:
        return getattr(sys.modules["torchvision"], "__file__", None) is None
    try:
        if importlib.util.find_spec("torchvision") is not None:
            importlib.import_module("torchvision")
            return False
    except Exception:
        # A torchvision built for another torch raises at import; drop what it left behind.
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    try:
        from transformers.utils import import_utils
    except ImportError as error:
        raise SGLangUnavailable(f"transformers is not installed ({error}); run scripts/install_sglang.sh") from error
    # Cached answers (functools.lru_cache) taken before the stub exists: False.
    import_utils.is_torchvision_available()
    import_utils.is_torchvision_v2_available()
    for name in TORCHVISION_STUBS:
        sys.modules[name] = _stub_module(name)
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]  # type: ignore[attr-defined]
    sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]  # type: ignore[attr-defined]
    return True


class LogicalClock:
    """A stand-in for the ``time`` module in SGLang's radix cache: ``monotonic()`` counts
    reads (1.0, 2.0, ...); everything else is the real ``time``."""

    def __init__(self) -> None:
        self.ticks = 0

    def monotonic(self) -> float:
        self.ticks += 1
        return float(self.ticks)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@attrs.frozen
class SGLangAPI:
    """The SGLang classes kvoracle's adapters use."""

    version: str
    torch: Any
    RadixCache: type
    RadixKey: type
    TreeNode: type
    CacheInitParams: type
    MatchPrefixParams: type
    InsertParams: type
    EvictParams: type
    TokenToKVPoolAllocator: type
    PagedTokenToKVPoolAllocator: type
    radix_cache_module: types.ModuleType
    clock: LogicalClock
    torchvision_stubbed: bool


_API: SGLangAPI | None = None


def import_sglang() -> SGLangAPI:
    """SGLang's prefix-cache classes, imported once per process (see the module docstring);
    :class:`SGLangUnavailable` says what is missing."""
    global _API
    if _API is not None:
        return _API
    try:
        from importlib.metadata import version

        sglang_version = version("sglang")
        import torch
    except Exception as error:
        raise SGLangUnavailable(f"SGLang is not installed ({error}); run scripts/install_sglang.sh") from error
    stubbed = _stub_torchvision()
    try:
        from sglang.srt.mem_cache import radix_cache
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    except ImportError as error:
        raise SGLangUnavailable(f"importing SGLang {sglang_version}'s radix cache failed: {error}; "
                                "run scripts/install_sglang.sh") from error
    clock = LogicalClock()
    radix_cache.time = clock  # the module's own name for `time`; no other module sees the clock
    _API = SGLangAPI(sglang_version, torch, radix_cache.RadixCache, radix_cache.RadixKey, radix_cache.TreeNode,
                     CacheInitParams, MatchPrefixParams, InsertParams, EvictParams, TokenToKVPoolAllocator,
                     PagedTokenToKVPoolAllocator, radix_cache, clock, stubbed)
    return _API
