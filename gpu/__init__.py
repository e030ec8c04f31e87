"""kvoracle.gpu -- torch-backed block allocator and paged KV store.

Needs the ``gpu`` extra (torch). Importing this package without torch raises
an ImportError that says how to install it; ``kvoracle.spec``,
``kvoracle.reference`` and ``kvoracle.conformance`` never import it.
"""

try:
    import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kvoracle.gpu needs torch: pip install 'kvoracle[gpu]' "
        "(for a CPU-only machine: pip install torch==2.13.0 first)"
    ) from error


def default_device() -> "torch.device":
    """CUDA when a device is present, otherwise the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


__all__ = ["default_device"]
