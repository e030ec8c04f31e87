"""The ``kvoracle`` command.

``kvoracle check``  run the conformance suite against an engine and print the verdicts
``kvoracle rules``  list the specification's rules
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvoracle import __version__
from kvoracle.spec import all_rules

from .engines import BUILTIN_ENGINES, EngineLoadError


def _check(args: argparse.Namespace) -> int:
    from .expectations import ExpectationsError, expectations_for
    from .report import format_counterexamples, format_table, write_json
    from .runner import RunOptions, run_suite

    options = RunOptions(max_examples=args.max_examples, step_count=args.steps, seed=args.seed,
                         step_timeout=args.step_timeout or None, max_rounds=args.max_rounds,
                         replay_dir=None if args.no_replay else Path(args.replay_dir))
    suite_name = "" if args.suite == "lockstep" else f" ({args.suite} suite)"
    print(f"kvoracle {__version__}: checking engine {args.engine!r}{suite_name}", flush=True)
    try:
        if args.suite == "hybrid":
            from .hybrid_lookup import hybrid_suite, load_hybrid_engine
            suite = hybrid_suite()
            expectations = expectations_for(load_hybrid_engine(args.engine))
        elif args.suite == "hybrid-lifecycle":
            from .hybrid_lifecycle import lifecycle_suite, load_lifecycle_engine
            suite = lifecycle_suite()
            expectations = expectations_for(load_lifecycle_engine(args.engine))
        elif args.suite == "external-store":
            from .external_store import external_suite, load_external_engine
            suite = external_suite()
            expectations = expectations_for(load_external_engine(args.engine))
        else:
            from .runner import LOCKSTEP as suite
            expectations = expectations_for(args.engine)  # conformance/engines/<name>.toml
        result = run_suite(args.engine, options,
                           progress=lambda message: print(message, flush=True),
                           expectations=expectations, suite=suite)
    except (EngineLoadError, ExpectationsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    counterexamples = format_counterexamples(result)
    if counterexamples:
        print()
        print(counterexamples)
    if args.json:
        write_json(result, Path(args.json))
        print(f"\nJSON report: {args.json}")
    return 0 if result.ok else 1


def _rules(args: argparse.Namespace) -> int:
    rules = all_rules()
    if args.markdown:
        from .rules_doc import rules_markdown
        print(rules_markdown())
        return 0
    for rule in rules:
        kind = "" if rule.kind == "normative" else f" [{rule.kind}]"
        print(f"{rule.id}  {rule.title}{kind}")
        if args.verbose:
            print(f"    {rule.text}\n    source: {rule.source}")
    print(f"\n{len(rules)} rules")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvoracle", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvoracle {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="run the conformance suite against an engine")
    check.add_argument("--engine", default="reference",
                       help=f"one of {sorted(BUILTIN_ENGINES)} or module:Class "
                            "(default: reference)")
    check.add_argument("--max-examples", type=int, default=150,
                       help="Hypothesis examples per round (default 150)")
    check.add_argument("--steps", type=int, default=40, help="steps per example (default 40)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.add_argument("--max-rounds", type=int, default=12,
                       help="rounds after failures, one new failing rule each (default 12)")
    check.add_argument("--step-timeout", type=float, default=10.0,
                       help="seconds an engine may take for one operation; 0 = no limit")
    check.add_argument("--suite", choices=("lockstep", "hybrid", "hybrid-lifecycle", "external-store"),
                       default="lockstep",
                       help="lockstep: the whole manager against the reference (default); hybrid: "
                            "the hybrid cache-hit lookup over several KV-cache groups; hybrid-lifecycle: "
                            "allocation, caching and freeing over several groups; external-store: an external "
                            "KV store's (Mooncake) hit, load and store masks")
    check.add_argument("--json", metavar="FILE", help="also write a JSON report")
    check.add_argument("--replay-dir", default="kvoracle-replays",
                       help="where counterexamples are written as pytest files")
    check.add_argument("--no-replay", action="store_true", help="do not write replay files")
    check.set_defaults(run=_check)

    rules = commands.add_parser("rules", help="list the specification's rules")
    rules.add_argument("-v", "--verbose", action="store_true", help="print text and source")
    rules.add_argument("--markdown", action="store_true", help="print the docs' rule table")
    rules.set_defaults(run=_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("max_examples", "steps", "max_rounds"):
        if getattr(args, name, 1) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    return args.run(args)
