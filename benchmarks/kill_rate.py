#!/usr/bin/env python
"""Kill rate: how many of vLLM's source mutants the suites convict, per suite and per seed.

Run with the Python of a vLLM 0.33 environment (``scripts/install_vllm.sh``)::

    .venv-vllm/bin/python benchmarks/kill_rate.py --seeds 0 1 2 --json build/kill-rate.json
    .venv-vllm/bin/python benchmarks/kill_rate.py --mutants pool.touch.double-ref --seeds 0
    .venv-vllm/bin/python benchmarks/kill_rate.py --check     # every mutant applies, none runs

For each mutant (``benchmarks/mutants_vllm``) and seed, the engine runs with the mutant in
place through the suites of ``kvoracle check --engine vllm`` -- the mutant's own suite first,
then the others -- with the default budget, until a suite reports a rule with a shrunk
counterexample (*killed*, with the rule and the seconds to conviction from the mutant's first
step, the engine's import excluded, in wall and in CPU time) or every suite ends without one
(*survived*), and when the first example failing a counted rule was seen (*detected*, before its
shrink). A rule that also fails on the unmutated engine (measured first, on the first seed) or
that a real bug of the installed release breaks (benchmarks/zoo.py) is not a kill. Equivalent
mutants are listed with their reason, never run.

Each mutant runs in a child process of its own, so that an engine call a mutant sends into a
loop (abandoned by the step timeout, but still holding the interpreter) cannot slow the next
mutant; a child that abandoned a call hands its remaining seeds to a fresh child.

A benchmark, not a test: it prints figures (kill rate per suite and per seed, median and
slowest conviction) and exits 1 when a mutant survives a seed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kvoracle.conformance.harness.runner import RunObserver
from kvoracle.conformance.harness.shrinking import CONTRACT_MODES, DEFAULT_CONTRACTS

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SUITES = ("manager", "hybrid", "external-store")

#: A rule the runner reports with its counterexample (the line it prints for a conviction).
_REPORTED = re.compile(r"^\s+(?:failure|engine error)(?: \(flaky\))?: (KV-[A-Z]+-\d{3}) ")
#: The line after a shrunk (or unshrunk) counterexample's: its length in steps.
_LENGTH = re.compile(r"^\s+(?:shrunk to|not shrunk:) (\d+) steps")


class _Killed(BaseException):
    """Ends a suite run at the first conviction (not an ``Exception``: nothing swallows it)."""


class Detection(RunObserver):
    """Notes when an example first fails a rule that counts, before its shrink: the time to
    detection, beside the time to conviction."""

    def __init__(self, row: dict[str, Any], ignored: set[str], start: float, cpu_start: float) -> None:
        self.row, self.ignored, self.start, self.cpu_start = row, ignored, start, cpu_start
        self.calls_before = self.last_suite_calls = 0

    def example_started(self, suite: str, in_round: int, in_all: int) -> None:
        # Test calls, generation's and shrinking's: a count, the same on any machine.
        self.row["calls"] = self.calls_before + in_all
        self.last_suite_calls = in_all

    def suite_ended(self) -> None:
        self.calls_before += self.last_suite_calls
        self.last_suite_calls = 0

    def failure_seen(self, suite: str, rule_id: str) -> None:
        if rule_id not in self.ignored and self.row.get("detected_s") is None:
            self.row.update(detected_rule=rule_id, detected_s=round(time.perf_counter() - self.start, 2),
                            detected_cpu_s=round(time.process_time() - self.cpu_start, 2),
                            detected_calls=self.row.get("calls", 0))


def _suite_order(home: str) -> list[str]:
    return [home, *(suite for suite in SUITES if suite != home)]


def run_one(key: str | None, seed: int, max_examples: int, step_count: int,
            baseline: dict[str, list[str]], fail_fast: bool, shrink_calls: int,
            search_calls: int | None, contracts: str = DEFAULT_CONTRACTS) -> dict[str, Any]:
    """One mutant (``None``: the unmutated engine) on one seed, through the suites in order."""
    import contextlib

    import vllm
    from mutants_vllm import MUTANTS
    from mutation import applied

    from kvoracle.conformance.engines import EngineLoadError
    from kvoracle.conformance.harness.expectations import expectations_path, load_expectations
    from kvoracle.conformance.harness.runner import RunOptions, run_suite

    mutant = MUTANTS[key] if key else None
    order = _suite_order(mutant.suite if mutant else "manager")
    options = RunOptions(max_examples=max_examples, step_count=step_count, seed=seed,
                         replay_dir=None, fail_fast=fail_fast, shrink_calls=shrink_calls,
                         search_calls=search_calls, contracts=contracts)
    row: dict[str, Any] = {"mutant": key, "seed": seed, "killed": False, "rule": None, "suite": None,
                           "convicted_s": None, "message": None, "failing": {}, "abandoned": False}
    # vLLM's first adapter construction imports the rest of its engine (3 to 7 s here): a cost
    # a user pays once per process, not the suites' search. Paid before the clocks start.
    # Built as a run builds it (EngineCaller.construct), which settles the imported heap.
    from kvoracle.conformance.harness.calls import EngineCaller, EngineError
    from kvoracle.conformance.harness.engines import engine_factory
    from kvoracle.conformance.harness.suites import get_suite
    for suite in order:
        with contextlib.suppress(EngineLoadError, EngineError):
            EngineCaller().construct(engine_factory("vllm", get_suite(suite)), loading=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    detection = Detection(row, set(), start, cpu_start) if mutant else None
    with applied(mutant) if mutant else contextlib.nullcontext():
        for suite in order:
            reported: list[str] = []
            ignored = set(baseline.get(suite, ()))
            if detection is not None:
                detection.ignored = ignored

            def progress(message: str, reported: list[str] = reported, ignored: set = ignored,
                         suite: str = suite) -> None:
                if row["killed"]:  # the conviction's line came last: this one may give its length
                    length = _LENGTH.match(message)
                    if length:
                        row["steps"] = int(length.group(1))
                    raise _Killed(row["rule"])
                match = _REPORTED.match(message)
                if match:
                    reported.append(match.group(1))
                    if mutant and match.group(1) not in ignored:
                        # CPU time too: this process's own, which other work on the machine does not use up.
                        row.update(killed=True, rule=match.group(1), suite=suite, message=message.strip(),
                                   convicted_s=round(time.perf_counter() - start, 2),
                                   convicted_cpu_s=round(time.process_time() - cpu_start, 2),
                                   convicted_calls=row.get("calls"))

            # The rules the unmutated engine fails too are expected failures here, so that under
            # fail_fast they do not end the suite before the mutant's own failure.
            expected = {**(load_expectations(expectations_path("vllm"), vllm.__version__, suite) or {}),
                        **{rule: "fails on the unmutated engine too" for rule in ignored}}
            try:
                result = run_suite("vllm", options, progress=progress, expectations=expected, suite=suite,
                                   observer=detection)
            except _Killed:
                break
            except EngineLoadError as error:
                row["failing"][suite] = f"unsupported: {error}"
                continue
            if row["killed"]:  # convicted by the run's last line
                break
            if detection is not None:
                detection.suite_ended()
            row["failing"][suite] = sorted(r for r, o in result.verdicts.outcomes.items()
                                           if o.outcome in ("fail", "error"))
            if result.abandoned:
                row["abandoned"] = True
                break
    row["run_s"] = round(time.perf_counter() - start, 2)
    return row


def _child(args: argparse.Namespace) -> int:
    baseline = json.loads(args.baseline) if args.baseline else {}
    for seed in args.seeds:
        row = run_one(args.one or None, seed, args.max_examples, args.steps, baseline, args.fail_fast,
                      args.shrink_calls, args.search_calls, args.contracts)
        print("ROW " + json.dumps(row), flush=True)
        if row["abandoned"]:
            return 3  # the parent starts a fresh child for the remaining seeds
    return 0


def _spawn(key: str, seeds: list[int], args: argparse.Namespace, baseline: dict) -> list[dict]:
    rows: list[dict] = []
    remaining = list(seeds)
    while remaining:
        command = [sys.executable, str(Path(__file__).resolve()), "--one", key, "--seeds",
                   *map(str, remaining), "--max-examples", str(args.max_examples), "--steps",
                   str(args.steps), "--shrink-calls", str(args.shrink_calls), "--search-calls",
                   str(args.search_calls or 0), "--contracts", args.contracts, "--baseline", json.dumps(baseline)]
        if args.fail_fast:
            command.append("--fail-fast")
        proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        got = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        if not got:  # the child died before its first row: kvoracle's or the mutant's crash
            rows.append({"mutant": key, "seed": remaining[0], "killed": False, "rule": None,
                         "error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]})
            remaining = remaining[1:]
            continue
        rows.extend(got)
        done = {row["seed"] for row in got}
        remaining = [seed for seed in remaining if seed not in done]
        if proc.returncode not in (0, 3) and remaining:
            rows.append({"mutant": key, "seed": remaining[0], "killed": False, "rule": None,
                         "error": proc.stderr.strip().splitlines()[-1:]})
            remaining = remaining[1:]
    return rows


def known_bugs() -> dict[str, set[str]]:
    """The rules the zoo's bugs of the installed vLLM break, per suite (benchmarks/zoo.py)."""
    from importlib.metadata import version

    from zoo import ZOO

    from kvoracle.conformance.harness.expectations import version_in_range

    installed = version("vllm")
    rules: dict[str, set[str]] = {}
    for bug in ZOO:
        if version_in_range(installed, bug.releases):
            rules.setdefault(bug.suite, set()).add(bug.rule)
    return rules


def _check_all() -> int:
    from mutants_vllm import MUTANTS
    from mutation import StaleMutant, applied

    bad = 0
    for mutant in MUTANTS.values():
        try:
            with applied(mutant):
                pass
        except StaleMutant as error:
            bad += 1
            print(f"STALE {error}")
    print(f"{len(MUTANTS) - bad} of {len(MUTANTS)} mutants apply")
    return 1 if bad else 0


def summarize(rows: list[dict], mutants: dict) -> tuple[str, bool]:
    """The kill-rate tables (per suite, per seed) and the slowest convictions."""
    lines = []
    seeds = sorted({row["seed"] for row in rows})
    by_suite: dict[str, list[dict]] = {}
    for row in rows:
        by_suite.setdefault(mutants[row["mutant"]].suite, []).append(row)
    lines.append("| suite | mutants | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    lines.append("|---|---|" + "---|" * len(seeds))
    for suite in SUITES:
        suite_rows = by_suite.get(suite, [])
        if not suite_rows:
            continue
        cells = []
        for seed in seeds:
            seed_rows = [r for r in suite_rows if r["seed"] == seed]
            cells.append(f"{sum(r['killed'] for r in seed_rows)}/{len(seed_rows)}")
        lines.append(f"| {suite} | {len({r['mutant'] for r in suite_rows})} | " + " | ".join(cells) + " |")
    for what, field in (("wall", "convicted_s"), ("CPU", "convicted_cpu_s"), ("CPU, to detection", "detected_cpu_s")):
        times = [row[field] for row in rows if row["killed"] and row.get(field) is not None]
        if times:
            lines.append("")
            lines.append(f"conviction ({what} time): median {statistics.median(times):.1f} s, "
                         f"slowest {max(times):.1f} s over {len(times)} kills")
    calls = [row["convicted_calls"] for row in rows if row["killed"] and row.get("convicted_calls") is not None]
    if calls:
        lines.append("")
        lines.append(f"test calls to conviction: median {statistics.median(calls):.0f}, most {max(calls)}")
    survivors = sorted({(row["mutant"], row["seed"]) for row in rows if not row["killed"]})
    if survivors:
        lines.append("")
        lines.append("survived: " + ", ".join(f"{key} (seed {seed})" for key, seed in survivors))
    return "\n".join(lines), not survivors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--mutants", nargs="+", help="mutant keys or key prefixes (default: all)")
    parser.add_argument("--max-examples", type=int, default=150)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fail-fast", action="store_true", help="run the suites as `kvoracle check --fail-fast`")
    parser.add_argument("--shrink-calls", type=int,
                        help="as `kvoracle check --shrink-calls` (its default: 150)")
    parser.add_argument("--search-calls", type=int,
                        help="as `kvoracle check --search-calls` (its default: 100; 0: Hypothesis' own count)")
    parser.add_argument("--contracts", choices=CONTRACT_MODES, default=DEFAULT_CONTRACTS,
                        help="as `kvoracle check --contracts` (its default: reported)")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own process")
    parser.add_argument("--check", action="store_true", help="only check that every mutant applies")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run (every reported rule but the zoo's known bugs counts as a kill)")
    parser.add_argument("--baseline-from", metavar="JSON",
                        help="the rules that are no kills, per suite, as a JSON object (a run prints them; "
                             "`baseline` in its --json file): skips the unmutated run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.shrink_calls is None:
        from kvoracle.conformance.harness.runner import DEFAULT_SHRINK_CALLS

        args.shrink_calls = DEFAULT_SHRINK_CALLS
    from kvoracle.conformance.harness.runner import search_calls_option

    args.search_calls = search_calls_option(args.search_calls)
    if args.one is not None:
        return _child(args)
    if args.check:
        return _check_all()
    from mutants_vllm import MUTANTS

    keys = [key for key in MUTANTS
            if not args.mutants or any(key == m or key.startswith(m + ".") or key.startswith(m)
                                       for m in args.mutants)]
    if not keys:
        parser.error("no mutant matches --mutants")
    baseline: dict[str, list[str]] = {}
    if args.baseline_from:
        # The unmutated run's failing rules, as an earlier run of the same tree printed them.
        baseline = json.loads(args.baseline_from)
    elif not args.no_baseline:
        # The rules the unmutated engine fails (the store's named divergences) are no kill, nor
        # are the zoo's real bugs of the installed release: the unmutated run of the first seed
        # need not reach them, and another seed's mutant run may.
        for row in _spawn("", args.seeds[:1], args, {}):
            baseline = {suite: failing for suite, failing in row.get("failing", {}).items()
                        if isinstance(failing, list)}
    for suite, rules in known_bugs().items():
        baseline[suite] = sorted(set(baseline.get(suite, ())) | rules)
    print(f"not counted as kills: {baseline}", flush=True)
    for key in keys:
        if MUTANTS[key].equivalent:
            print(f"{key:<44} equivalent: {MUTANTS[key].equivalent}", flush=True)
    running = [key for key in keys if not MUTANTS[key].equivalent]

    def write(rows: list[dict], complete: bool) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"baseline": baseline, "max_examples": args.max_examples,
                                             "fail_fast": args.fail_fast, "shrink_calls": args.shrink_calls,
                                             "search_calls": args.search_calls, "contracts": args.contracts,
                                             "seeds": args.seeds,
                                             "complete": complete, "rows": rows},
                                            indent=1) + "\n")

    finished: list[dict] = []
    lock = threading.Lock()

    def one_mutant(key: str) -> list[dict]:
        found = _spawn(key, args.seeds, args, baseline)
        for row in found:
            what = (f"killed by {row['rule']} ({row['suite']}) in {row['convicted_cpu_s']} s of CPU"
                    if row["killed"] else f"ERROR {row['error']}" if "error" in row else "SURVIVED")
            print(f"{key:<44} seed {row['seed']}: {what}", flush=True)
        with lock:  # written as it goes: a run cut short keeps the rows of its finished mutants
            finished.extend(found)
            write(finished, complete=False)
        return found

    # Each mutant runs in child processes of its own, whose verdicts count calls, not clocks:
    # running several at once (--jobs) changes no verdict. It lengthens the wall times; the CPU
    # times, each process's own, only by what sharing caches and cores costs.
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = [row for found in pool.map(one_mutant, running) for row in found]
    table, good = summarize(rows, MUTANTS)
    print()
    print(table)
    write(rows, complete=True)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
