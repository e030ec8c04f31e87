"""What the store's mutant-replay tests share: the vLLM 0.33 guard, and a replay of fixed steps
against vLLM's Mooncake store coordinator, unmutated (it must pass) and with one source mutant in
place (the violation it raises)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from kvoracle.conformance.harness.replay import replay
from kvoracle.conformance.harness.verdicts import RuleViolation


def _vllm_033() -> bool:
    try:
        return importlib.metadata.version("vllm").startswith("0.33.")
    except importlib.metadata.PackageNotFoundError:
        return False


needs_vllm_033 = pytest.mark.skipif(not _vllm_033(), reason="needs vLLM 0.33.x (scripts/install_vllm.sh)")


def passes_then_convicts(mutant_key: str, steps: list[object]) -> RuleViolation:
    """Replay ``steps`` on vLLM's store (they pass), then with the mutant in place: its violation."""
    from kvoracle.conformance.engines.vllm_mooncake import VllmMooncakeStore

    replay("external-store", VllmMooncakeStore, steps)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from mutants_vllm import MUTANTS
    from mutation import applied

    with applied(MUTANTS[mutant_key]), pytest.raises(RuleViolation) as caught:
        replay("external-store", VllmMooncakeStore, steps)
    return caught.value
