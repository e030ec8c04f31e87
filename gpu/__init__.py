"""kvoracle.gpu -- torch-backed block allocator and paged KV store.

Needs the ``gpu`` extra (torch). Importing this package without torch raises
an ImportError that says how to install it; ``kvoracle.spec``,
``kvoracle.reference`` and ``kvoracle.conformance`` never import it.

* :class:`TorchBlockPool` -- the block pool of spec chapter 2 with its state in
  tensors (reference counts, the free queue in LRU order, block keys and the
  key -> block lookup) and batched, vectorized operations;
* :class:`TorchKVCacheManager` -- a full-attention manager over it (block tables,
  hits, allocation, caching), the engine behind ``kvoracle check --engine gpu``;
* :class:`PagedKVStore` -- the physical paged KV cache the block ids index
  (spec chapter ``data_integrity``).

Everything lives on one device: CUDA when present, otherwise the CPU
(:func:`default_device`; the environment variable ``KVORACLE_DEVICE`` or a
``device=`` argument overrides it).
"""

import os
import warnings

try:
    with warnings.catch_warnings():
        # A CPU build of torch without numpy warns at import; kvoracle.gpu never uses numpy.
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kvoracle.gpu needs torch: pip install 'kvoracle[gpu]' "
        "(for a CPU-only machine: pip install torch==2.13.0 first)"
    ) from error

#: Environment variable naming the device (``cpu``, ``cuda``, ``cuda:1``) to use.
DEVICE_ENV = "KVORACLE_DEVICE"


def default_device() -> "torch.device":
    """``$KVORACLE_DEVICE`` if set; else CUDA when a device is present, otherwise the CPU."""
    chosen = os.environ.get(DEVICE_ENV, "").strip()
    if chosen:
        return torch.device(chosen)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


from .allocator import TorchBlockPool  # noqa: E402
from .manager import TorchKVCacheManager  # noqa: E402
from .paged_store import PagedKVStore  # noqa: E402

__all__ = ["DEVICE_ENV", "PagedKVStore", "TorchBlockPool", "TorchKVCacheManager", "default_device"]
