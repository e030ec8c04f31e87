"""The HTML report: one self-contained page a user opens in a browser.

``kvoracle check --html FILE`` writes it (:func:`write_html`): the run's summary (engine,
suites, seed, verdict counts), the per-rule verdict table and, for each counterexample, its
rule, message, numbered shrunk steps (the failing one highlighted), replay file and its
*picture*: what kvoracle's model and the engine show at the failing step, side by side, each
cell that differs from the other side's marked with a class and a visible ``≠`` (not colour
alone). The picture is drawn by one replay of the counterexample after the run's rounds
(:mod:`kvoracle.conformance.harness.picture`).

The page is one file: its CSS (``html.css``, package data) is inlined, it loads nothing and
runs no script. Every text from the run -- messages, steps, labels, cells -- is escaped.
"""

from __future__ import annotations

import html
import json
import platform
from importlib import resources
from pathlib import Path
from typing import Any

from kvoracle import __version__
from kvoracle.spec import all_rules, get_rule

from ..harness.picture import VALUES, diverging
from ..harness.report import (
    _MARKS,
    SEVERITY,
    _detail,
    _judging,
    combined_outcome,
    examples_of,
    result_word,
    summary,
)
from ..harness.runner import CheckResult
from ..harness.verdicts import NOT_APPLICABLE, Counterexample

#: The visible marker of a cell that differs from the other side's.
MARK = "≠"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _css() -> str:
    return resources.files(__package__).joinpath("html.css").read_text(encoding="utf-8")


def _verdict(outcome: str) -> str:
    return f'<span class="verdict {_e(outcome)}">{_e(_MARKS[outcome])}</span>'


def _cell_text(value: Any) -> str:
    if value is None:
        return "·"
    if value is True:
        return "x"
    if value is False:
        return "."
    return str(value)


def _result_badge(result: CheckResult) -> str:
    word = result_word(result)  # as the text report's RESULT line
    css = {"OK": "ok", "INCOMPLETE": "incomplete"}.get(word, "bad")
    return f'<span class="result {css}">{word}</span>'


# -- summary and verdicts --------------------------------------------------------------------------
def _summary(result: CheckResult) -> str:
    first = result.runs[0] if result.runs else None
    engine = (f"{first.engine_name} {first.engine_version} ({result.engine})" if first else result.engine)
    options = result.options
    facts = [("engine", engine), ("suites", ", ".join(f"{r.suite} ({r.part} part)" if r.part else r.suite
                                                      for r in result.runs) or "none"),
             ("seed", options.seed),
             ("options", f"{options.max_examples} examples per round, up to {options.step_count} steps, "
                         f"up to {options.max_rounds} rounds, step timeout {options.step_timeout} s "
                         f"({options.timeout_clock} time), {options.shrink_calls} shrink calls, "
                         + (f"{options.search_calls} search calls after a failure" if options.search_calls
                            else "Hypothesis' own search after a failure")
                         + ", kvoracle's contracts checked on "
                         + ("every example drawn" if options.contracts == "drawing" else "reported counterexamples")),
             ("kvoracle", f"{__version__} on Python {platform.python_version()}")]
    if result.incomplete:
        facts.append(("incomplete", result.incomplete))
    parts = ['<section id="summary"><h2>Summary</h2><dl class="facts">']
    parts += [f"<dt>{_e(name)}</dt><dd>{_e(value)}</dd>" for name, value in facts]
    parts.append("</dl>")
    counts = summary(result)
    parts.append('<table class="counts"><thead><tr>' + "".join(
        f"<th>{_verdict(name)}</th>" for name in SEVERITY) + "</tr></thead><tbody><tr>" + "".join(
        f'<td data-outcome="{_e(name)}">{counts[name]}</td>' for name in SEVERITY) + "</tr></tbody></table>")
    parts.append('<table class="runs"><thead><tr><th>suite</th><th>examples</th><th>rounds</th><th>seconds</th>'
                 "<th>seed</th><th>state</th></tr></thead><tbody>")
    for run in result.runs:
        state = f"INCOMPLETE: {run.incomplete}" if run.incomplete else "complete"
        state += "".join(f"; INTERNAL ERROR (a kvoracle bug): {error}" for error in run.internal_errors)
        label = f"{run.suite} ({run.part} part)" if run.part else run.suite
        parts.append(f"<tr><td>{_e(label)}</td><td>{run.examples}</td><td>{run.rounds}</td>"
                     f"<td>{run.duration_s:.1f}</td><td>{run.options.seed}</td><td>{_e(state)}</td></tr>")
    for name, reason in result.unsupported.items():
        parts.append(f'<tr><td>{_e(name)}</td><td colspan="5">not run: {_e(reason)}</td></tr>')
    for name in result.not_run:
        parts.append(f'<tr><td>{_e(name)}</td><td colspan="5">not run (--fail-fast: an earlier suite failed)'
                     "</td></tr>")
    parts.append("</tbody></table></section>")
    return "\n".join(parts)


def _verdict_rows(result: CheckResult, rules: list, anchors: dict[str, str]) -> str:
    rows = []
    for rule in rules:
        judging = _judging(result, rule.id)
        outcome = combined_outcome(result, rule.id)
        suites = " ".join(f"{run.suite}:{_MARKS[o.outcome]}" for run, o in judging if o.outcome != NOT_APPLICABLE)
        name = (f'<a href="#{_e(anchors[rule.id])}">{_e(rule.id)}</a>' if rule.id in anchors else _e(rule.id))
        rows.append(f'<tr data-rule="{_e(rule.id)}" data-outcome="{_e(outcome)}"><td>{name}</td>'
                    f"<td>{_e(rule.title)}</td><td>{_verdict(outcome)}</td>"
                    f"<td>{sum(o.checks for _, o in judging)}</td><td>{_e(suites)}</td>"
                    f'<td class="detail">{_e(_detail(result, rule.id))}</td></tr>')
    return "\n".join(rows)


def _verdicts(result: CheckResult, anchors: dict[str, str]) -> str:
    # Worst verdicts first (as SEVERITY orders them), each in the rules' own order.
    rules = sorted(all_rules(), key=lambda rule: SEVERITY.index(combined_outcome(result, rule.id)))
    judged = [rule for rule in rules if combined_outcome(result, rule.id) != NOT_APPLICABLE]
    others = [rule for rule in rules if combined_outcome(result, rule.id) == NOT_APPLICABLE]
    head = ("<thead><tr><th>rule</th><th>title</th><th>verdict</th><th>checks</th><th>suites</th>"
            "<th>detail</th></tr></thead>")
    parts = ['<section id="rules"><h2>Verdicts per rule</h2>',
             f'<table class="verdicts">{head}<tbody>{_verdict_rows(result, judged, anchors)}</tbody></table>']
    if others:
        parts.append(f"<details><summary>{len(others)} rules not applicable here</summary>"
                     f'<table class="verdicts">{head}<tbody>{_verdict_rows(result, others, anchors)}</tbody>'
                     "</table></details>")
    parts.append("</section>")
    return "\n".join(parts)


# -- counterexamples and their pictures ----------------------------------------------------------------
def _side(panel: dict[str, Any], side: str, width: int) -> str:
    """One side's table of a panel: a row per row of the panel, a column per cell position."""
    other = "engine" if side == "reference" else "reference"
    compare = panel.get("compare", VALUES)
    caption = "reference (kvoracle's model)" if side == "reference" else "engine"
    parts = [f'<figure class="side {side}"><figcaption>{_e(caption)}</figcaption><div class="scroll">'
             f'<table class="grid" data-side="{side}"><thead><tr><th></th>'
             + "".join(f"<th>{i}</th>" for i in range(width)) + "</tr></thead><tbody>"]
    for row in panel["rows"]:
        cells = row.get(side)
        flags = diverging(row, compare)[0 if side == "reference" else 1]
        parts.append(f'<tr data-label="{_e(row["label"])}"><th scope="row">{_e(row["label"])}</th>')
        if cells is None:
            parts.append(f'<td class="absent" colspan="{max(width, 1)}">no such row here</td></tr>')
            continue
        for i, (value, differs) in enumerate(zip(cells, flags)):
            classes = "cell" + (" null" if value is None else "") + (" diverge" if differs else "")
            theirs = row.get(other) or []
            title = ""
            if differs:
                what = _cell_text(theirs[i]) if i < len(theirs) else "no cell"
                title = f' title="differs: the {other} has {_e(what)} here"'
            mark = f'<span class="mark" aria-label="differs">{MARK}</span>' if differs else ""
            parts.append(f'<td class="{classes}" data-col="{i}" data-value="{_e(json.dumps(value))}"{title}>'
                         f"{_e(_cell_text(value))}{mark}</td>")
        parts.append('<td class="pad"></td>' * (width - len(cells)) + "</tr>")
    parts.append("</tbody></table></div></figure>")
    return "".join(parts)


def _panel(panel: dict[str, Any]) -> str:
    width = max([len(row.get(side) or []) for row in panel["rows"] for side in ("reference", "engine")] + [0])
    note = f'<p class="note">{_e(panel["note"])}</p>' if panel.get("note") else ""
    return (f'<section class="panel"><h4>{_e(panel["title"])}</h4>{note}<div class="sides">'
            f'{_side(panel, "reference", width)}{_side(panel, "engine", width)}</div></section>')


def _picture(example: Counterexample) -> str:
    picture = example.picture
    if picture is None:
        return ('<p class="no-picture">No picture: this run drew none (<code>kvoracle check --html</code> '
                "draws one for each counterexample).</p>")
    if "missing" in picture:
        return f'<p class="no-picture">No picture: {_e(picture["missing"])}.</p>'
    parts = ['<div class="picture">',
             f'<p>What kvoracle\'s model and the engine show at step {_e(picture["step"])}, where '
             f'{_e(picture["rule"])} failed when the steps were replayed once more.</p>',
             f'<p class="legend">A cell marked <span class="sample diverge">{MARK}</span> differs from the other '
             "side's cell at its position (or the other side has none there); · is an empty cell.</p>"]
    parts += [_panel(panel) for panel in picture["panels"]]
    parts.append("</div>")
    return "\n".join(parts)


def _counterexample(example: Counterexample, anchor: str, suite: str) -> str:
    rule = get_rule(example.rule_id)
    kind = "ERROR" if example.engine_error else "FAIL"
    flags = "".join(f'<span class="badge">{_e(flag)}</span>' for flag, on in (
        ("engine error", example.engine_error), ("flaky", example.flaky), ("not shrunk", not example.shrunk)) if on)
    picture = example.picture or {}
    failing = picture.get("step") if isinstance(picture.get("step"), int) else len(example.steps)
    steps = []
    for number, step in enumerate(example.steps, 1):
        if number == failing:
            steps.append(f'<li class="failing-step" id="{_e(anchor)}-failing"><code>{_e(repr(step))}</code>'
                         '<span class="failing-marker">◀ fails here</span></li>')
        else:
            steps.append(f"<li><code>{_e(repr(step))}</code></li>")
    replay = (f'<p>Replay: <code>pytest {_e(example.replay_path)}</code></p>' if example.replay_path
              else "<p>No replay file was written.</p>")
    return (f'<article class="counterexample" id="{_e(anchor)}" data-rule="{_e(example.rule_id)}">'
            f'<h3>{_e(example.rule_id)} — {_e(rule.title)} <span class="badge">{kind}</span>{flags}</h3>'
            f'<p class="meta">{_e(example.suite or suite)} suite; {len(example.steps)} steps</p>'
            f'<pre class="message">{_e(example.message)}</pre>'
            f'<h4>Steps</h4><ol class="steps">{"".join(steps)}</ol>{replay}{_picture(example)}</article>')


def _examples(result: CheckResult) -> list[tuple[str, Counterexample, str]]:
    found = []
    for run in result.runs:
        for rule_id, outcome in run.verdicts.outcomes.items():
            for example in examples_of(outcome):
                found.append((f"cx-{len(found) + 1}-{rule_id}", example, run.suite))
    return found


def to_html(result: CheckResult) -> str:
    """The report as one HTML document."""
    examples = _examples(result)
    anchors: dict[str, str] = {}
    for anchor, example, _ in examples:
        anchors.setdefault(example.rule_id, anchor)
    engine = result.runs[0].engine_name if result.runs else result.engine
    body = [f"<header><h1>kvoracle conformance report: {_e(engine)}</h1>{_result_badge(result)}</header>",
            _summary(result), _verdicts(result, anchors),
            f'<section id="counterexamples"><h2>Counterexamples ({len(examples)})</h2>']
    if not examples:
        body.append("<p>None: no rule failed.</p>")
    body += [_counterexample(example, anchor, suite) for anchor, example, suite in examples]
    body.append("</section>")
    body.append(f"<footer>Written by kvoracle {_e(__version__)}.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>kvoracle report: {_e(engine)}</title><style>\n{_css()}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_html(result: CheckResult, path: Path) -> None:
    """Write the HTML report of ``result`` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_html(result), encoding="utf-8")
