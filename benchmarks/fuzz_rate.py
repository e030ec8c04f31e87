"""Fuzzing throughput and time to a stored failure: `kvoracle fuzz` with 1 and 2 processes.

For each process count: the examples per second HypoFuzz's workers reach on an engine
that passes (the reference, no step timeout), and for each broken engine the seconds until
the first shrunk failure is stored in the example database (polled every second), beside
`kvoracle check`'s time to conviction (per-rule timing of its JSON report) on the same
engine and each suite. HypoFuzz gives a test at most one process, so two processes need two
suites: by default the lockstep part on its own prompts and the `mooncake` part, the same
machine on prompts shaped like the Mooncake conversation trace. Run from the repository
root, with the dev environment (HypoFuzz installed):

    .venv/bin/python benchmarks/fuzz_rate.py --duration 120 --json build/fuzz-rate.json

Figures are wall seconds on whatever machine runs it, printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

BROKEN = ("broken_engines:ForwardFree", "broken_engines:TouchLeavesHitsFree", "broken_engines:HitOneBlockShort")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "tests"), "KVORACLE_CONTRACTS": "0"}


def _suites(suites: list[str]) -> list[str]:
    return [argument for suite in suites for argument in ("--suite", suite)]


def throughput(processes: int, duration: float, suites: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run([sys.executable, "-m", "kvoracle", "fuzz", "--engine", "reference", *_suites(suites),
                               "-n", str(processes), "--duration", str(duration), "--step-timeout", "0",
                               "--database", f"{work}/db", "--stats-dir", f"{work}/stats"],
                              env=_env(), capture_output=True, text=True)
        rates = [float(r) for r in re.findall(r"process \d+: \d+ examples, ([\d.]+)/s", done.stdout)]
        total = re.search(r"(\d+) examples in (\d+) s", done.stdout)
    return {"processes": processes, "suites": suites, "duration_s": duration,
            "examples": int(total.group(1)) if total else None, "per_process_per_s": rates,
            "examples_per_s": sum(rates)}


def time_to_stored_failure(engine: str, processes: int, limit: float, suites: list[str]) -> float | None:
    from kvoracle.conformance.fuzz import fuzz_machines
    from kvoracle.conformance.harness.database import open_database
    from kvoracle.conformance.harness.machine import examples_key

    with tempfile.TemporaryDirectory() as work:
        database = f"{work}/db"
        keys = [examples_key(machine) for machine in fuzz_machines(engine=engine, suites=suites,
                                                                   database=database).values()]
        process = subprocess.Popen([sys.executable, "-m", "kvoracle", "fuzz", "--engine", engine, *_suites(suites),
                                    "-n", str(processes), "--duration", str(limit), "--database", database],
                                   env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        found = None
        while process.poll() is None:
            if any(True for key in keys for _ in open_database(database).fetch(key)):
                found = time.monotonic() - started
                break
            time.sleep(1)
        process.terminate()
        process.wait()
    return found


def check_conviction(engine: str, suite: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "kvoracle", "check", "--engine", engine, "--suite", suite,
                        "--no-replay", "--no-database", "--json", f"{work}/r.json"], env=_env(),
                       capture_output=True, text=True)
        wall = time.monotonic() - started
        report = json.loads(Path(f"{work}/r.json").read_text())
    convicted = {rule["id"]: run["conviction_s"] for rule in report["rules"] for run in rule.get("runs", [])
                 if run.get("conviction_s") is not None}
    return {"wall_s": round(wall, 1), "conviction_s": convicted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120, help="seconds per throughput run and per engine cap")
    parser.add_argument("--suite", action="append", help="a suite or part to fuzz (repeatable; default: "
                        "lockstep and mooncake)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.suite = args.suite or ["lockstep", "mooncake"]
    results: dict = {"throughput": [], "broken": []}
    for n in args.processes:
        row = throughput(n, args.duration, args.suite)
        print(f"reference, {n} process(es): {row['examples']} examples in {args.duration:.0f} s, "
              f"{row['examples_per_s']:.1f} examples/s ({row['per_process_per_s']})", flush=True)
        results["throughput"].append(row)
    for engine in BROKEN:
        check = {suite: check_conviction(engine, suite) for suite in args.suite}
        row = {"engine": engine, "check": check}
        for n in args.processes:
            row[f"fuzz_{n}_stored_s"] = time_to_stored_failure(engine, n, args.duration, args.suite)
        print(f"{engine}: check {check}, fuzz " + ", ".join(
            f"{n} proc: {row[f'fuzz_{n}_stored_s']}" for n in args.processes), flush=True)
        results["broken"].append(row)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
