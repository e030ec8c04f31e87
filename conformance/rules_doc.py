"""The generated rule table (``docs/rules.md``), built from the spec's registry."""

from __future__ import annotations

from kvoracle.spec import CHAPTERS, Rule, all_rules
from kvoracle.spec.registry import NOT_YET_JUDGED


def judged_by_cell(rule: Rule) -> str:
    """The "Judged by" column: the suites, or why none judges the rule."""
    if rule.judged_by:
        return ", ".join(rule.judged_by)
    if rule.spec_only is not None:
        return f"spec only: {rule.spec_only}"
    return f"not yet judged: {NOT_YET_JUDGED.get(rule.id, 'no suite checks it and no reason is recorded')}"


def rules_markdown() -> str:
    rules_all = all_rules()
    judged = sum(1 for rule in rules_all if rule.judged_by)
    spec_only = sum(1 for rule in rules_all if not rule.judged_by and rule.spec_only is not None)
    gaps = len(rules_all) - judged - spec_only
    lines = [
        "# Rules",
        "",
        "Generated from `kvoracle.spec` by `kvoracle rules --markdown`; do not edit by hand.",
        "Rule IDs are permanent: never renumbered, never reused.",
        "",
        "*Judged by* names the conformance suites (`kvoracle check --suite ...`) whose checks judge the "
        "rule against an engine; *Needs* the capabilities an engine must claim to be judged on it. "
        "*Spec only* rules have no behaviour an engine adapter can observe; kvoracle's own tests check them "
        "(and CrossHair, where a pure function states them). *Not yet judged* rules are observable, but no "
        "suite checks them yet; the column says what a suite would need. "
        f"Of {len(rules_all)} rules, {judged} are judged by a suite, {spec_only} are spec only "
        f"and {gaps} are not yet judged.",
        "",
    ]
    by_chapter: dict[str, list] = {}
    for rule in rules_all:
        by_chapter.setdefault(rule.chapter, []).append(rule)
    for chapter in CHAPTERS:
        name = chapter.__name__.rsplit(".", 1)[-1]
        rules = by_chapter.get(getattr(chapter, "CHAPTER", name), [])
        if not rules:
            continue
        title = (chapter.__doc__ or name).strip().splitlines()[0].rstrip(".").replace("``", "`")
        lines += [f"## {title}", "", "| ID | Rule | Kind | Stated by | Needs | Judged by | Source |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for rule in sorted(rules, key=lambda r: r.id):
            text = f"**{rule.title}.** {rule.text}".replace("|", "\\|")
            stated = ", ".join(f"`{d}`" for d in rule.definitions) or (
                "kvoracle's input checks" if rule.kind == "validation" else
                "suite checks" if rule.judged_by else "-")
            needs = ", ".join(rule.needs) or "-"
            judged_by = judged_by_cell(rule).replace("|", "\\|")
            lines.append(f"| {rule.id} | {text} | {rule.kind} | {stated} | {needs} | {judged_by} | "
                         f"{rule.source.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n")
