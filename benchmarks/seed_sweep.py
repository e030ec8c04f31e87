#!/usr/bin/env python
"""Seed sweep: on how many seeds the default run convicts each of the reference-based broken engines.

    .venv/bin/python benchmarks/seed_sweep.py --seeds 0 1 2 3 4 5 6 7 8 9
    .venv/bin/python benchmarks/seed_sweep.py --cases "Mamba keeps every state" --seeds 0 1 2

The meta-tests (tests/test_hybrid_lifecycle.py, tests/test_mamba_align_suite.py) run each broken
engine on seed 0 only; a change to the suite's generation moves every seed's draws, so one seed
says little about whether the change made a bug easier or harder to find. This script runs each
case's broken engine through the hybrid-lifecycle part of the manager suite on every seed given,
with the default budget (150 examples a round, 40 steps, rounds until one finds nothing new, the
reference's contracts on as in the meta-tests; ``KVORACLE_CONTRACTS=0`` turns them off, which
changes what a broken engine that relies on them fails), and reports, per case,
the seeds on which the case's own rule was convicted and the seconds to that conviction (process
CPU time, from the suite's start). A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))


#: A rule the runner reports with its counterexample (as benchmarks/kill_rate.py reads it).
_REPORTED = re.compile(r"^\s+(?:failure|engine error)(?: \(flaky\))?: (KV-[A-Z]+-\d{3}) ")


class _Convicted(BaseException):
    """Ends a run at the case's own conviction (not an ``Exception``: nothing swallows it)."""


def cases() -> dict[str, tuple[type, str, bool]]:
    """Every case: its broken groups class, its rule, and whether it keeps the need contracts."""
    import test_hybrid_lifecycle
    import test_mamba_align_suite

    found = {name: (groups_class, rule, True) for name, (groups_class, rule, _) in test_hybrid_lifecycle.CASES.items()}
    found.update({name: (groups_class, rule, False)
                  for name, (groups_class, rule, _) in test_mamba_align_suite.CASES.items()})
    return found


def sweep_one(name: str, seed: int, max_examples: int) -> dict:
    from broken_groups import groups_engine

    from kvoracle.conformance.harness.runner import RunOptions, run_suite

    groups_class, rule_id, need_contracts = cases()[name]

    def progress(message: str) -> None:
        match = _REPORTED.match(message)
        if match and match.group(1) == rule_id:
            raise _Convicted

    engine = groups_engine(groups_class, need_contracts=need_contracts)
    start = time.process_time()
    try:
        result = run_suite(engine, RunOptions(max_examples=max_examples, seed=seed, replay_dir=None),
                           suite="hybrid-lifecycle", progress=progress)
    except _Convicted:
        return {"case": name, "seed": seed, "convicted": True, "cpu_s": round(time.process_time() - start, 2)}
    failed = sorted(o.rule_id for o in result.verdicts.outcomes.values() if o.counterexamples or o.errors)
    return {"case": name, "seed": seed, "convicted": rule_id in failed, "others": failed,
            "examples": result.examples, "cpu_s": round(time.process_time() - start, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--cases", nargs="+", help="case names (default: every case)")
    parser.add_argument("--max-examples", type=int, default=150)
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args(argv)
    names = args.cases or sorted(cases())
    unknown = sorted(set(names) - set(cases()))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {sorted(cases())}")
    rows = []
    for name in names:
        for seed in args.seeds:
            row = sweep_one(name, seed, args.max_examples)
            rows.append(row)
            what = f"convicted in {row['cpu_s']} s" if row["convicted"] else f"MISSED (failed {row.get('others')})"
            print(f"{name:<36} seed {seed}: {what}", flush=True)
    print()
    for name in names:
        mine = [r for r in rows if r["case"] == name]
        times = [r["cpu_s"] for r in mine if r["convicted"]]
        timing = f"median {statistics.median(times):.1f} s, slowest {max(times):.1f} s" if times else "-"
        print(f"{name:<36} {len(times)}/{len(mine)} seeds; {timing}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"max_examples": args.max_examples, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
