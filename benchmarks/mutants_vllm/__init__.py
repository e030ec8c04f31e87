"""Mutants of vLLM 0.33's KV-cache manager, one module per area (issue 18).

:data:`MUTANTS` is every mutant, keyed by its stable ``key``; ``benchmarks/kill_rate.py``
runs the suites against each and reports which are convicted, by which rule, how fast.
"""

from __future__ import annotations

import importlib

from mutation import Mutant

#: The areas, in the order of the engine's layers (block pool up to the external store).
AREAS = ("pool", "single_type", "coordinator", "store")


def _load() -> dict[str, Mutant]:
    found: dict[str, Mutant] = {}
    for area in AREAS:
        try:
            module = importlib.import_module(f"mutants_vllm.{area}")
        except ModuleNotFoundError as error:
            if error.name != f"mutants_vllm.{area}":
                raise
            continue
        for mutant in module.MUTANTS:
            if mutant.key in found:
                raise ValueError(f"two mutants are keyed {mutant.key}")
            found[mutant.key] = mutant
    return found


MUTANTS: dict[str, Mutant] = _load()
