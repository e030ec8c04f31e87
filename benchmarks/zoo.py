#!/usr/bin/env python
"""The zoo: real historical bugs of vLLM's KV-cache manager, convicted on the releases that
shipped them.

Each entry of :data:`ZOO` is one bug: where it was reported or fixed, the releases that had
it (read in each release's code), the rule that convicts it and the suite that judges that
rule. Run with the Python of one release's environment (``scripts/install_vllm.sh`` with
``VLLM_VERSION``; ``make zoo`` builds one per release)::

    /path/to/venv-0.22.0/bin/python benchmarks/zoo.py --json build/zoo/0.22.0.json

It runs the manager and hybrid suites (and any other suite judging a zoo rule) against the
installed release, once, and records
for each rule the seconds until the runner reported it with a shrunk counterexample (the
*time to conviction*: generation, both engines, every check and the shrinking), the
counterexample's steps, and the run's other verdicts. A bug whose releases hold the installed
one must be convicted; a bug fixed before it must not be (the *clean run*). ::

    python benchmarks/zoo.py --summarize build/zoo/*.json    # the table of docs/zoo.md

A benchmark script, not a test: it prints figures and what it saw, and exits 1 when a bug is
missed on a release that has it or charged on one that does not, or when a rule fails that
is neither a zoo bug of the release nor one of its expected differences (unclassified).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@attrs.frozen
class Bug:
    """One historical bug of the real engine."""

    key: str
    title: str
    #: The releases that shipped it, as an expectations-file version range.
    releases: str
    #: The first release without it.
    fixed_in: str
    rule: str
    suite: str
    #: Where it was reported or fixed; "" when kvoracle found it (docs/zoo.md says how).
    link: str
    #: The code that had it, in the last release with it.
    source: str
    note: str = ""


ZOO: tuple[Bug, ...] = (
    Bug("vllm-32802", "The EAGLE drop spirals the hybrid hit down to 0",
        ">=0.14.0,<0.20", "0.20.0", "KV-HYB-015", "hybrid",
        "https://github.com/vllm-project/vllm/issues/32802",
        "https://github.com/vllm-project/vllm/blob/v0.19.1/vllm/v1/core/kv_cache_coordinator.py",
        "0.15.1 stops after one pass with one full-attention and one other spec group; with more "
        "spec groups the loop still drops on every pass until 0.20.0 (verified set and look-ahead)"),
    Bug("vllm-52828", "Only the first full-attention spec group is trimmed to the final hit",
        ">=0.15.1,<0.29", "0.29.0", "KV-HYB-006", "hybrid",
        "https://github.com/vllm-project/vllm/issues/52828",
        "https://github.com/vllm-project/vllm/blob/v0.28.0/vllm/v1/core/kv_cache_coordinator.py"),
    Bug("vllm-43559", "Mamba gets the EAGLE look-ahead, never drops it, and the hit outgrows full attention",
        ">=0.20.0,<0.26", "0.26.0", "KV-MAMBA-002", "hybrid",
        "https://github.com/vllm-project/vllm/issues/43559",
        "https://github.com/vllm-project/vllm/blob/v0.25.1/vllm/v1/core/kv_cache_coordinator.py",
        "0.20.0's loop gave every EAGLE group the look-ahead, Mamba included; Mamba's finder never "
        "drops, so its answer is a block past the candidate, the candidate grows, and the request "
        "counts a block as computed that full attention does not hold (silent wrong output; "
        "tool-use accuracy 90% -> 50% in the report)"),
    Bug("vllm-39528", "An EAGLE sliding window finer than the alignment crashes the lookup",
        ">=0.14.0,<0.19.1", "0.19.1", "KV-SWA-010", "hybrid",
        "https://github.com/vllm-project/vllm/issues/39528",
        "https://github.com/vllm-project/vllm/blob/v0.19.0/vllm/v1/core/single_type_kv_cache_manager.py",
        "SlidingWindowManager.find_longest_cache_hit asserts block_size == alignment_tokens with "
        "EAGLE ('aligned_length is not compatible with eagle now'); a hybrid model whose window "
        "group has a smaller block than another group cannot look anything up"),
    Bug("vllm-44082", "The sliding-window cache mask leaves out the block an EAGLE hit peeks at",
        ">=0.22.0,<0.23", "0.23.0", "KV-SWA-012", "manager",
        "https://github.com/vllm-project/vllm/pull/44082",
        "https://github.com/vllm-project/vllm/blob/v0.22.1/vllm/v1/core/single_type_kv_cache_manager.py",
        "SlidingWindowManager._cache_block_mask (new in 0.22.0, PR #42258) caches the last "
        "cdiv(window - 1, block_size) blocks of each aligned segment, as a lookup without EAGLE "
        "reads them; an EAGLE lookup needs one block more, one block later, so an EAGLE model with "
        "a window group finer than the alignment never hits"),
    Bug("vllm-51482", "With prefix caching off, freed blocks go to the back of the free queue",
        ">=0.27.0,<0.28", "0.28.0", "KV-POOL-006", "manager",
        "https://github.com/vllm-project/vllm/pull/51482",
        "https://github.com/vllm-project/vllm/blob/v0.27.1/vllm/v1/core/block_pool.py",
        "PR #48017 merged free_blocks' two conditions into 'block_hash is None and enable_caching', "
        "so with caching off every freed block was appended: reuse flipped from last-in-first-out "
        "to first-in-first-out (a TPU core halt was bisected to it)"),
    Bug("mooncake-store-trim", "The Mooncake store's lookup trims only the first full-attention spec group",
        ">=0.22.0,<0.29", "0.29.0", "KV-EXT-003", "external-store",
        "https://github.com/vllm-project/vllm/pull/52828",
        "https://github.com/vllm-project/vllm/blob/v0.28.0/vllm/distributed/kv_transfer/kv_connector/v1/"
        "mooncake/store/coordinator.py",
        "the store coordinator's copy of the hybrid loop had #52828's defect: after the loop only "
        "attention_groups[0] is cut to the hit, so another full-attention group's load mask keeps "
        "blocks past it; 0.29.0 cuts every full-attention spec group, as the local coordinator. "
        "The suite drives the store coordinator from 0.26.0 (store_mask(start_token))"),
    Bug("vllm-49069", "The Mooncake store gives the EAGLE drop per KV-cache group, not per merged spec group",
        ">=0.24.0,<0.27", "0.27.0", "KV-EXT-005", "external-store",
        "https://github.com/vllm-project/vllm/pull/49069",
        "https://github.com/vllm-project/vllm/blob/v0.26.0/vllm/distributed/kv_transfer/kv_connector/v1/"
        "mooncake/store/coordinator.py",
        "the lookup drops the EAGLE block in a merged spec group when any member is marked "
        "is_eagle_group, but store_mask read each KV-cache group's own mark, so an unmarked sibling "
        "stored its tail without the peek shift and the store never held a whole EAGLE hit "
        "(DeepSeek-V4 with MTP, #45785)"),
    Bug("mooncake-store-mamba", "The Mooncake store writes Mamba chunks by table position",
        ">=0.22.0,<0.29", "0.29.0", "KV-EXT-008", "external-store", "",
        "https://github.com/vllm-project/vllm/blob/v0.28.0/vllm/distributed/kv_transfer/kv_connector/v1/"
        "mooncake/store/coordinator.py",
        "store_mask marked a Mamba group's reachable chunks for writing; an align-mode Mamba table is "
        "not append-only (interior state blocks are nulled and freed, speculative blocks move), so "
        "the positional read can persist a null, freed or draft block's bytes under a valid prefix "
        "hash. 0.29.0 never stores Mamba chunks (its store_mask docstring says why). No issue was "
        "found; the fix is read in the code"),
    Bug("mamba-draft-checkpoint", "An align-mode checkpoint past the drafts' committed tokens fails an assertion",
        ">=0.32.0", "unfixed", "KV-MAMBA-017", "manager", "",
        "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py",
        "a decode step with at least a Mamba block of draft tokens can reserve a prefill checkpoint "
        "past the request's hashed tokens; caching it asserts in BlockPool.cache_partial_block after "
        "the allocation took its blocks (docs/findings/mamba-draft-checkpoint.md). Found by kvoracle; "
        "checkpoint alignment, and so the manager suite's align mode on vLLM, begins with 0.32"),
    Bug("mamba-negative-need", "An align-mode Mamba need goes negative and hides another group's need",
        ">=0.32.0", "unfixed", "KV-MAMBA-008", "manager", "",
        "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/core/single_type_kv_cache_manager.py",
        "after rejected drafts the Mamba table is longer than the step needs; the unfloored negative "
        "count lets allocate_slots pass its capacity check and raise in get_new_blocks instead of "
        "returning None (docs/findings/mamba-negative-need.md). The code has it from 0.15.1; the "
        "suite judges align mode from 0.32 (earlier align modes are not specified), so the zoo "
        "convicts it there"),
)


def _version_in(version: str, releases: str) -> bool:
    from kvoracle.conformance.harness.expectations import version_in_range
    return version_in_range(version, releases)


# -- one release -------------------------------------------------------------------------------
def run_release(seed: int, max_examples: int) -> dict:
    """The manager and hybrid suites (and any other judging a zoo rule), once, against the installed vLLM."""
    import vllm
    from bench_vllm import _REPORTED

    from kvoracle.conformance.harness import EngineLoadError
    from kvoracle.conformance.harness.expectations import expectations_path, load_expectations
    from kvoracle.conformance.harness.runner import RunOptions, run_suite
    from kvoracle.spec import get_rule

    version = str(vllm.__version__)
    report: dict[str, Any] = {"vllm": version, "seed": seed, "max_examples": max_examples, "suites": {}}
    # Both lockstep suites, whichever suites the entries name: a release must fail nothing else.
    for suite in sorted({"manager", "hybrid"} | {bug.suite for bug in ZOO}):
        convicted_at: dict[str, float] = {}

        def progress(message: str, convicted_at: dict[str, float] = convicted_at) -> None:
            reported = _REPORTED.match(message)
            if reported:
                convicted_at.setdefault(reported.group(1), time.perf_counter())

        options = RunOptions(max_examples=max_examples, seed=seed, replay_dir=None)
        start = time.perf_counter()
        # The release's intended differences (conformance/engines/vllm.toml) are expected
        # failures, as in `kvoracle check`: what still fails is a bug or not yet classified.
        expected = load_expectations(expectations_path("vllm"), version, suite)
        try:
            result = run_suite("vllm", options, progress=progress, expectations=expected, suite=suite)
        except EngineLoadError as error:  # the release lacks what the suite drives (said, not hidden)
            report["suites"][suite] = {"unsupported": str(error), "failing": [], "unclassified": {},
                                       "expected_fail": [], "rules": {}}
            print(f"  {suite}: unsupported by vLLM {version}: {error}")
            continue
        outcomes = result.verdicts.outcomes
        failing = sorted(r for r, o in outcomes.items() if o.outcome in ("fail", "error"))
        # (A bug may show in another suite than the one its entry names: #52828 shows in both.)
        known = {bug.rule for bug in ZOO if _version_in(version, bug.releases)}
        # A divergence rule names a known difference of the engine from the spec's intent
        # (docs/rules.md, kind "divergence"): failing it is that difference, classified.
        divergences = [r for r in failing if r not in known and get_rule(r).kind == "divergence"]
        report["suites"][suite] = {
            "run_s": round(time.perf_counter() - start, 2),
            "failing": failing,
            "named_divergences": divergences,
            # Failures that are neither a zoo bug of this release, an expected difference nor
            # a named divergence.
            "unclassified": {r: _counterexample(outcomes[r]) for r in failing
                             if r not in known and r not in divergences},
            "expected_fail": sorted(r for r, o in outcomes.items() if o.outcome == "expected-fail"),
            "rules": {bug.rule: {
                "outcome": outcomes[bug.rule].outcome,
                "convicted_s": (round(convicted_at[bug.rule] - start, 2) if bug.rule in convicted_at else None),
                "counterexample": _counterexample(outcomes[bug.rule]),
            } for bug in ZOO if bug.suite == suite},
        }
    return report


def _counterexample(outcome: Any) -> dict | None:
    for example in [*outcome.counterexamples, *outcome.errors]:
        return {"message": example.message, "steps": [repr(step) for step in example.steps]}
    return None


def verdict_of(bug: Bug, report: dict) -> tuple[bool, str]:
    """(as it should be, what happened) for ``bug`` on the release of ``report``."""
    has_bug = _version_in(report["vllm"], bug.releases)
    suite = report["suites"][bug.suite]
    if "unsupported" in suite:  # the release cannot be driven by that suite: neither verdict
        return True, "suite unsupported"
    rule = suite["rules"][bug.rule]
    convicted = rule["outcome"] in ("fail", "error")
    if has_bug:
        return convicted, (f"convicted in {rule['convicted_s']} s" if convicted
                           else f"MISSED ({rule['outcome']})")
    return not convicted, "clean" if not convicted else f"CHARGED ({rule['outcome']})"


# -- the summary -------------------------------------------------------------------------------
def summarize(reports: list[dict]) -> tuple[str, bool]:
    """The markdown table of docs/zoo.md, and whether every verdict is as it should be and no
    release failed a rule that is neither its zoo bug nor its expected difference."""

    def key(report: dict) -> tuple[int, ...]:
        return tuple(int(p) for p in report["vllm"].split("+")[0].split(".") if p.isdigit())

    reports = sorted(reports, key=key)
    all_good = True
    lines = ["| bug | rule | releases with it | " + " | ".join(r["vllm"] for r in reports) + " |",
             "|---|---|---|" + "---|" * len(reports)]
    for bug in ZOO:
        cells = []
        for report in reports:
            good, what = verdict_of(bug, report)
            all_good &= good
            cells.append(what)
        lines.append(f"| {bug.key} | {bug.rule} | {bug.releases} | " + " | ".join(cells) + " |")
    unclassified = [sorted(r for suite in report["suites"].values() for r in suite["unclassified"])
                    for report in reports]
    all_good &= not any(unclassified)
    lines.append("| unclassified | | | " + " | ".join(", ".join(rules) or "none" for rules in unclassified) + " |")
    return "\n".join(lines), all_good


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write this release's report here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-examples", type=int, default=150)
    parser.add_argument("--summarize", nargs="+", type=Path, metavar="REPORT",
                        help="print the table of these reports instead of running")
    args = parser.parse_args(argv)
    if args.summarize:
        table, good = summarize([json.loads(path.read_text()) for path in args.summarize])
        print(table)
        return 0 if good else 1
    report = run_release(args.seed, args.max_examples)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    good = True
    print(f"vLLM {report['vllm']}, seed {report['seed']}, {report['max_examples']} examples per round")
    for bug in ZOO:
        ok, what = verdict_of(bug, report)
        good &= ok
        print(f"  {bug.key:<24} {bug.rule:<12} {what}")
    for suite, data in report["suites"].items():
        if "unsupported" in data:
            print(f"  {suite}: unsupported ({data['unsupported']})")
            continue
        print(f"  {suite}: {data['run_s']} s; failing {data['failing']}; expected-fail {data['expected_fail']}; "
              f"named divergences {data.get('named_divergences', [])}")
        for rule_id, example in data["unclassified"].items():
            good = False
            print(f"  UNCLASSIFIED {rule_id} ({suite}): {example['message'] if example else '?'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
