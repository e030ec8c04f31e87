#!/usr/bin/env python
"""kvoracle against vLLM 0.33's real ``KVCacheManager``: lockstep speed, reference/vLLM
time per operation, and time to the first counterexample on broken vLLM engines.

A benchmark script, not a test: it prints figures and asserts nothing about speed.
Run it with the Python of the vLLM environment (``scripts/install_vllm.sh`` builds
``.venv-vllm``)::

    .venv-vllm/bin/python benchmarks/bench_vllm.py              # parts a, b and c
    .venv-vllm/bin/python benchmarks/bench_vllm.py --parts b    # one part

Parts:

a. **Lockstep steps/second.** The conformance suite (``run_suite``, the runner behind
   ``kvoracle check``) against the vLLM adapter and, for comparison, against the
   reference engine, with a fixed seed and budget. The runner has no step counter, so
   the script wraps ``ManagerDriver.apply`` while it runs: a step is one call that
   the driver executes (a step skipped because the example's engine already failed is
   not counted). The wall time covers generation, both engines, every comparison and
   any shrinking: it is what a user waits for per step.
b. **Time per operation, reference vs vLLM.** The same deterministic closed-loop
   replay of the Mooncake conversation trace (``benchmarks/bench_reference.py``'s
   ``load_trace``: each trace hash id becomes one block of synthetic token ids, so
   equal hash ids give equal blocks) driven through the two adapters, so that both
   engines see identical calls: ``add_request``, ``lookup`` (``get_computed_blocks``),
   ``allocate`` (``allocate_slots``), ``advance``, decode steps (``append_tokens`` +
   ``allocate`` of one token) and ``free``. An operation is one adapter call. The
   reference runs with contracts off. vLLM is measured twice: through the shipped
   adapter, and through the adapter without its KeyRef translation (which recomputes
   kvoracle's hash of every block only so that observations can be compared, and
   would charge kvoracle's hashing to vLLM). Both engines must produce the same hits;
   the script prints each hit rate and whether every lookup agreed.
c. **Time to first counterexample.** Each of the meta-tests' broken engines, rebuilt
   around vLLM (``benchmarks/broken_vllm.py``), run through ``run_suite`` for a few
   fixed seeds. Printed per run: seconds from the start of the run until the first
   failing check of the expected rule (*detected*; the unshrunk example), until the
   runner reports it with a shrunk counterexample (*convicted*), and whether the
   expected rule was convicted. The runner reports a rule only after shrinking it and
   has no stop-at-first-failure option, so the script stops the run from its progress
   callback as soon as the expected rule is reported (``--stop end`` lets every run
   finish and prints the whole run's time; ``--stop detection`` ends it at the first
   failing check, which is what ``tests/test_bench_vllm.py`` uses to stay fast).

``KVORACLE_CONTRACTS`` is read when kvoracle is first imported, so the script sets it
(``--contracts``, default off) before importing anything from kvoracle. Part b always
needs contracts off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # bench_reference and broken_vllm live next to this script
    sys.path.insert(0, str(HERE))

DEFAULT_TRACE = HERE.parent.parent / "shared" / "data" / "mooncake-fast25" / "conversation_trace.jsonl"
OUT_TOKEN_BASE = 1 << 40  # decode tokens never collide with the trace's synthetic tokens


# -- instrumentation of the lockstep driver ------------------------------------------------
class LockstepProbe:
    """Counts the lockstep steps a run executes and stamps the first failure of each rule.

    The runner and the driver keep no step counter and no timestamps, so while the
    probe is active ``ManagerDriver.apply`` is wrapped (and restored on exit). A rule's
    first failure is the moment the driver records it in ``Verdicts.first_seen``, which
    it does for every failing check before Hypothesis shrinks the example.
    """

    def __init__(self, stop_on: str | None = None) -> None:
        self.steps = 0
        self.first_failure: dict[str, float] = {}
        #: A rule whose first failing check ends the run at once (raises :class:`Detected`).
        self.stop_on = stop_on
        self._original: Callable[..., Any] | None = None
        self._own = False

    def __enter__(self) -> LockstepProbe:
        from kvoracle.conformance.manager import ManagerDriver

        # ManagerDriver inherits apply from the harness's Driver: remember whether it had one
        # of its own, so that __exit__ leaves the class as it found it.
        self._own = "apply" in vars(ManagerDriver)
        original = self._original = ManagerDriver.apply
        probe = self

        def apply(driver: Any, step: Any) -> None:
            if not driver.dead:
                probe.steps += 1
            try:
                original(driver, step)
            finally:
                if len(driver.verdicts.first_seen) != len(probe.first_failure):
                    now = time.perf_counter()
                    for rule_id in driver.verdicts.first_seen:
                        probe.first_failure.setdefault(rule_id, now)
                    if probe.stop_on in probe.first_failure:
                        raise Detected(probe.stop_on)

        ManagerDriver.apply = apply  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from kvoracle.conformance.manager import ManagerDriver

        if self._own:
            ManagerDriver.apply = self._original  # type: ignore[method-assign]
        else:
            del ManagerDriver.apply


class _Convicted(Exception):
    """Raised from the runner's progress callback to end a run once its rule is reported."""


class Detected(BaseException):
    """Ends a run at the first failing check of a rule, before Hypothesis shrinks it.

    A ``BaseException`` that is not an ``Exception``: Hypothesis treats ``Exception``
    as a test failure and would shrink it, but lets other ``BaseException`` types
    propagate, and the runner catches only ``Exception``. The abandoned example's
    machine is not torn down (its engine worker thread, a daemon, stays idle).
    """


#: A rule the runner reports with its counterexample (``failure``, ``engine error``, either
#: possibly ``(flaky)``): the progress line it prints for a conviction.
_REPORTED = re.compile(r"^\s+(?:failure|engine error)(?: \(flaky\))?: (KV-[A-Z]+-\d{3}) ")


# -- part a: lockstep steps per second -----------------------------------------------------
def lockstep_speed(engine: str | Callable[[], Any], max_examples: int, step_count: int,
                   seed: int, step_timeout: float | None = 10.0) -> dict:
    """One ``run_suite`` against ``engine``; steps executed, examples and wall time."""
    from kvoracle.conformance.harness.engines import engine_factory
    from kvoracle.conformance.harness.runner import RunOptions, run_suite
    from kvoracle.conformance.harness.suites import get_suite

    factory = engine_factory(engine, get_suite("lockstep")) if isinstance(engine, str) else engine
    t0 = time.perf_counter()
    factory()  # imports the engine's library (vLLM: several seconds) outside the timing
    import_s = time.perf_counter() - t0
    options = RunOptions(max_examples=max_examples, step_count=step_count, seed=seed,
                         step_timeout=step_timeout, replay_dir=None)
    with LockstepProbe() as probe:
        start = time.perf_counter()
        result = run_suite(factory, options, suite="lockstep")
        wall = time.perf_counter() - start
    summary = result.verdicts.summary()
    return {
        "engine": result.engine_name, "version": result.engine_version, "seed": seed,
        "max_examples": max_examples, "step_count": step_count, "import_s": import_s,
        "steps": probe.steps, "examples": result.examples, "rounds": result.rounds,
        "wall_s": wall, "steps_per_s": probe.steps / wall if wall else 0.0,
        "ok": result.ok, "pass": summary["pass"], "fail": summary["fail"] + summary["error"],
        "unexercised": summary["unexercised"],
    }


# -- part b: the same trace through both adapters ------------------------------------------
def _untranslated_vllm() -> Any:
    """The vLLM adapter without KeyRef translation (only observations need it)."""
    from kvoracle.conformance.engines.vllm import VllmEngine

    class VllmNoTranslation(VllmEngine):
        name = "vllm-no-translation"

        def _translate(self, request_id: str) -> None:
            pass

    return VllmNoTranslation()


def replay_trace(engine: Any, workload: Sequence[tuple[tuple[int, ...], int]], num_blocks: int,
                 block_size: int, max_model_len: int, max_running: int) -> dict:
    """Replay ``workload`` (prompt, decode steps) through an adapter, scheduler-style.

    Each scheduler step admits waiting requests in arrival order while fewer than
    ``max_running`` run (add_request, lookup, allocate the uncomputed prompt, advance),
    then gives every running request one decode step (append_tokens, allocate one
    token, advance). A request that cannot be admitted is freed and dropped; one that
    cannot get a decode slot is freed (preempted) and dropped. Decisions depend only on
    what the engine returns, so two conforming engines make identical calls.
    """
    from kvoracle.reference import ManagerConfig

    engine.configure(ManagerConfig(num_blocks, block_size, max_model_len,
                                   hash_block_size=block_size, enable_caching=True,
                                   use_eagle=False))
    clock = time.perf_counter
    spent: Counter[str] = Counter()
    calls: Counter[str] = Counter()

    def call(operation: str, *args: Any) -> Any:
        t = clock()
        result = getattr(engine, operation)(*args)
        spent[operation] += clock() - t
        calls[operation] += 1
        return result

    hits: list[int] = []  # every lookup's hit length, in order: the two engines must agree
    prompt_tokens = hit_tokens = dropped = preempted = finished = 0
    waiting = deque((f"req-{i}", tokens, decode) for i, (tokens, decode) in enumerate(workload))
    running: list[list] = []  # [request id, decode steps left]
    out_token = OUT_TOKEN_BASE
    start = clock()
    while waiting or running:
        while waiting and len(running) < max_running:
            request_id, tokens, decode = waiting.popleft()
            call("add_request", request_id, tokens)
            hit = call("lookup", request_id).num_tokens
            hits.append(hit)
            prompt_tokens += len(tokens)
            hit_tokens += hit
            if call("allocate", request_id, len(tokens) - hit, hit) is None:
                call("free", request_id)  # the pool is short: drop it, admit no more now
                dropped += 1
                break
            call("advance", request_id, len(tokens) - hit)
            running.append([request_id, decode])
        still_running = []
        for entry in running:
            request_id = entry[0]
            call("append_tokens", request_id, (out_token,))
            out_token += 1
            if call("allocate", request_id, 1, 0) is None:
                call("free", request_id)
                preempted += 1
                continue
            call("advance", request_id, 1)
            entry[1] -= 1
            if entry[1] == 0:
                call("free", request_id)
                finished += 1
            else:
                still_running.append(entry)
        running = still_running
    wall = clock() - start
    ops = sum(calls.values())
    timed = sum(spent.values())
    return {
        "engine": getattr(engine, "name", type(engine).__name__), "requests": len(workload),
        "finished": finished, "dropped": dropped, "preempted": preempted, "ops": ops,
        "calls": dict(calls), "op_s": dict(spent), "wall_s": wall, "in_engine_s": timed,
        "ops_per_s": ops / timed if timed else 0.0,
        "us_per_op": 1e6 * timed / ops if ops else 0.0,
        "prompt_tokens": prompt_tokens, "hit_tokens": hit_tokens,
        "hit_rate": hit_tokens / prompt_tokens if prompt_tokens else 0.0, "hits": hits,
    }


def compare_engines(workload: Sequence[tuple[tuple[int, ...], int]], num_blocks: int,
                    block_size: int, max_model_len: int, max_running: int) -> dict:
    """Part b: the same replay through the reference, vLLM, and vLLM untranslated."""
    from kvoracle.conformance.engines.reference import ReferenceEngine
    from kvoracle.conformance.engines.vllm import VllmEngine
    from kvoracle.reference import CONTRACTS_ENABLED

    if CONTRACTS_ENABLED:
        raise SystemExit("part b measures the reference with contracts off: run with "
                         "--contracts off (KVORACLE_CONTRACTS=0) in a fresh interpreter")
    engines = {"reference": ReferenceEngine(), "vllm": VllmEngine(),
               "vllm-no-translation": _untranslated_vllm()}
    return {name: replay_trace(engine, workload, num_blocks, block_size, max_model_len,
                               max_running) for name, engine in engines.items()}


# -- part c: time to the first counterexample ----------------------------------------------
STOPS = ("detection", "conviction", "end")


def time_to_counterexample(factory: Callable[[], Any], expected_rule: str, seed: int,
                           max_examples: int, step_count: int = 40,
                           step_timeout: float = 2.0, stop: str = "conviction") -> dict:
    """Run the suite on a broken engine; when was ``expected_rule`` detected and convicted?

    ``stop``: end the run at the expected rule's first failing check (``detection``),
    when the runner reports it with a shrunk counterexample (``conviction``), or let the
    run finish (``end``).
    """
    from kvoracle.conformance.harness.runner import RunOptions, run_suite

    if stop not in STOPS:
        raise ValueError(f"stop must be one of {STOPS}")
    factory()  # import the engine's library outside the timing
    convicted_at: dict[str, float] = {}

    def progress(message: str) -> None:
        reported = _REPORTED.match(message)
        if reported:
            convicted_at.setdefault(reported.group(1), time.perf_counter())
            if reported.group(1) == expected_rule and stop == "conviction":
                raise _Convicted(expected_rule)

    options = RunOptions(max_examples=max_examples, step_count=step_count, seed=seed,
                         step_timeout=step_timeout, replay_dir=None)
    outcome = None
    with LockstepProbe(stop_on=expected_rule if stop == "detection" else None) as probe:
        start = time.perf_counter()
        try:
            result = run_suite(factory, options, progress=progress, suite="lockstep")
            outcome = result.verdicts.outcomes[expected_rule].outcome
        except (_Convicted, Detected):
            pass
        end = time.perf_counter()
    convicted = expected_rule in convicted_at
    detected = probe.first_failure.get(expected_rule)
    return {
        "seed": seed, "expected": expected_rule, "stop": stop,
        "detected": detected is not None, "convicted": convicted,
        # The final verdict, known only when the run was let finish.
        "outcome": outcome,
        "detected_s": None if detected is None else detected - start,
        "convicted_s": convicted_at[expected_rule] - start if convicted else None,
        "run_s": end - start, "steps": probe.steps,
        "first_rule": min(convicted_at, key=convicted_at.__getitem__) if convicted_at else None,
        "rules_reported": sorted(convicted_at, key=convicted_at.__getitem__),
        "rules_detected": sorted(probe.first_failure, key=probe.first_failure.__getitem__),
    }


# -- printing ------------------------------------------------------------------------------
def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_lockstep(rows: list[dict]) -> None:
    print(f"{'engine':<12} {'seed':>4} {'examples':>8} {'steps':>7} {'wall s':>7} "
          f"{'steps/s':>8}  verdicts")
    for r in rows:
        print(f"{r['engine']:<12} {r['seed']:>4} {r['examples']:>8} {r['steps']:>7} "
              f"{r['wall_s']:>7.2f} {r['steps_per_s']:>8.0f}  {r['pass']} pass, {r['fail']} fail, "
              f"{r['unexercised']} unexercised; engine import {r['import_s']:.1f} s")


def print_comparison(res: dict) -> None:
    ref = res["reference"]
    operations = sorted(ref["calls"])
    print(f"{'engine':<20} {'ops':>8} {'ops/s':>9} {'us/op':>7} {'hit rate':>9} "
          f"{'finished':>8} {'dropped':>7} {'preempt':>7}")
    for name, r in res.items():
        print(f"{name:<20} {r['ops']:>8,} {r['ops_per_s']:>9,.0f} {r['us_per_op']:>7.1f} "
              f"{r['hit_rate']:>9.2%} {r['finished']:>8} {r['dropped']:>7} {r['preempted']:>7}")
    print("microseconds per call, by operation:")
    print(f"  {'operation':<14} {'calls':>8} " + " ".join(f"{n:>20}" for n in res))
    for op in operations:
        cells = " ".join(f"{1e6 * r['op_s'].get(op, 0) / max(1, r['calls'].get(op, 0)):>20.1f}"
                         for r in res.values())
        print(f"  {op:<14} {ref['calls'][op]:>8,} {cells}")
    for name, r in res.items():
        if name == "reference":
            continue
        same = r["hits"] == ref["hits"] and r["calls"] == ref["calls"]
        print(f"time per operation, reference / {name}: {ref['us_per_op'] / r['us_per_op']:.2f} "
              f"({name} / reference: {r['us_per_op'] / ref['us_per_op']:.2f});"
              f" hit rate {ref['hit_rate']:.4%} vs {r['hit_rate']:.4%}; identical lookups and "
              f"calls: {'yes' if same else 'NO -- the engines diverged'}")


def print_counterexamples(rows: list[dict], stop: str) -> None:
    print(f"{'engine':<22} {'rule':<12} {'seed':>4} {'detected s':>10} {'convicted s':>11} "
          f"{'run s':>7} {'steps':>7}  convicted / first rule reported")
    for r in rows:
        first = r["first_rule"] if r["first_rule"] != r["expected"] else "itself"
        convicted = "yes" if r["convicted"] else ("not reached" if stop == "detection" else "NO")
        print(f"{r['engine']:<22} {r['expected']:<12} {r['seed']:>4} {_s(r['detected_s']):>10} "
              f"{_s(r['convicted_s']):>11} {r['run_s']:>7.2f} {r['steps']:>7}  "
              f"{convicted} / {first or '-'}")
    print("detected: the expected rule's first failing check (unshrunk); convicted: the runner "
          "reports it with a shrunk counterexample (a hang is reported at the end of its round)")
    if stop != "end":
        print(f"run s: each run was stopped at the expected rule's {stop} (the runner has no "
              "stop-at-first-failure option); --stop end times whole runs")


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--parts", default="abc", help="which parts to run: any of a, b, c")
    p.add_argument("--json", action="store_true",
                   help="print the results as one JSON document (progress goes to stderr)")
    p.add_argument("--contracts", choices=("off", "on"), default="off",
                   help="reference contracts for parts a and c (part b needs off)")
    p.add_argument("--seed", type=int, default=0, help="part a: Hypothesis seed")
    p.add_argument("--max-examples", type=int, default=150, help="parts a and c: examples per round")
    p.add_argument("--steps", type=int, default=40, help="parts a and c: steps per example")
    p.add_argument("--requests", type=int, default=2000, help="part b: trace requests replayed")
    p.add_argument("--pool-blocks", type=int, default=10_000, help="part b: blocks in the pool")
    p.add_argument("--block-size", type=int, default=16,
                   help="part b: tokens per block; each trace hash id becomes one block")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="part b: prompt length cap")
    p.add_argument("--max-decode-tokens", type=int, default=16, help="part b: decode steps cap")
    p.add_argument("--max-running", type=int, default=64, help="part b: requests running at once")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="part b: Mooncake trace")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="part c: seeds")
    p.add_argument("--engines", nargs="+", default=None,
                   help="part c: broken engines (default: all of broken_vllm.EXPECTED)")
    p.add_argument("--step-timeout", type=float, default=2.0,
                   help="part c: seconds before an operation counts as hung (as the meta-tests)")
    p.add_argument("--stop", choices=STOPS, default="conviction",
                   help="part c: end each run at the expected rule's first failing check, at its "
                        "conviction (shrunk counterexample reported), or at the end of the run")
    args = p.parse_args(argv)
    if not set(args.parts) <= set("abc") or not args.parts:
        p.error("--parts takes letters from 'abc'")
    if "b" in args.parts and args.contracts == "on":
        p.error("part b measures the reference with contracts off; drop --contracts on")
    if "b" in args.parts and not args.trace.is_file():
        p.error(f"trace not found: {args.trace}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Read by kvoracle.reference at its first import: set before anything imports kvoracle.
    os.environ["KVORACLE_CONTRACTS"] = "1" if args.contracts == "on" else "0"
    from kvoracle.conformance.engines.vllm import _load_vllm
    from kvoracle.reference import CONTRACTS_ENABLED

    if CONTRACTS_ENABLED is not (args.contracts == "on"):
        raise SystemExit("kvoracle was imported before --contracts took effect")
    # With --json only the JSON document goes to stdout; progress lines go to stderr.
    say = (lambda *a, **k: print(*a, **k, file=sys.stderr)) if args.json else print
    t0 = time.perf_counter()
    vllm = _load_vllm()
    report: dict[str, Any] = {
        "vllm": vllm.version, "torch": str(vllm.torch.__version__),
        "vllm_import_s": time.perf_counter() - t0, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "contracts": args.contracts}
    say(f"vLLM {vllm.version} (torch {vllm.torch.__version__}), imported in "
        f"{report['vllm_import_s']:.1f} s; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; reference contracts {args.contracts}")

    if "a" in args.parts:
        say(f"\n(a) lockstep steps/second: run_suite, seed {args.seed}, up to "
            f"{args.max_examples} examples of up to {args.steps} steps")
        rows = report["lockstep"] = [
            lockstep_speed(engine, args.max_examples, args.steps, args.seed)
            for engine in ("vllm", "reference")]
        if not args.json:
            print_lockstep(rows)
            print(f"vLLM lockstep steps/s relative to reference-vs-reference: "
                  f"{rows[0]['steps_per_s'] / rows[1]['steps_per_s']:.2f}")

    if "b" in args.parts:
        from bench_reference import load_trace

        workload = load_trace(args.trace, args.requests, args.block_size,
                              args.max_prompt_tokens, args.max_decode_tokens)
        say(f"\n(b) time per operation: {len(workload)} Mooncake requests, "
            f"{args.pool_blocks:,} blocks of {args.block_size} tokens, up to "
            f"{args.max_running} running; reference with contracts off")
        report["per_operation"] = compare_engines(
            workload, args.pool_blocks, args.block_size,
            args.max_prompt_tokens + args.max_decode_tokens, args.max_running)
        if not args.json:
            print_comparison(report["per_operation"])

    if "c" in args.parts:
        import broken_vllm

        names = args.engines or list(broken_vllm.EXPECTED)
        say(f"\n(c) time to first counterexample: broken vLLM engines, run_suite with up to "
            f"{args.max_examples} examples of up to {args.steps} steps, step timeout "
            f"{args.step_timeout:g} s, seeds {' '.join(map(str, args.seeds))}")
        rows = report["counterexamples"] = []
        for name in names:
            for seed in args.seeds:
                row = time_to_counterexample(broken_vllm.ENGINES[name], broken_vllm.EXPECTED[name],
                                             seed, args.max_examples, args.steps,
                                             args.step_timeout, args.stop)
                rows.append({"engine": name, **row})
                say(f"  {name} seed {seed}: detected in {_s(row['detected_s'])} s, convicted in "
                    f"{_s(row['convicted_s'])} s", flush=True)
        if not args.json:
            print_counterexamples(rows, args.stop)
            for key, label in (("detected", "detection"), ("convicted", "conviction")):
                done = sorted(r[f"{key}_s"] for r in rows if r[key])
                if done:
                    print(f"{key} in {len(done)}/{len(rows)} runs; seconds to {label}: median "
                          f"{done[len(done) // 2]:.2f}, max {done[-1]:.2f}")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
