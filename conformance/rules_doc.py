"""The generated rule table (``docs/rules.md``), built from the spec's registry."""

from __future__ import annotations

from kvoracle.spec import CHAPTERS, all_rules

from .verdicts import REQUIREMENTS


def rules_markdown() -> str:
    lines = [
        "# Rules",
        "",
        "Generated from `kvoracle.spec` by `kvoracle rules --markdown`; do not edit by hand.",
        "Rule IDs are permanent: never renumbered, never reused.",
        "",
    ]
    by_chapter: dict[str, list] = {}
    for rule in all_rules():
        by_chapter.setdefault(rule.chapter, []).append(rule)
    for chapter in CHAPTERS:
        name = chapter.__name__.rsplit(".", 1)[-1]
        rules = by_chapter.get(getattr(chapter, "CHAPTER", name), [])
        if not rules:
            continue
        title = (chapter.__doc__ or name).strip().splitlines()[0].rstrip(".").replace("``", "`")
        lines += [f"## {title}", "", "| ID | Rule | Kind | Stated by | Needs | Source |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for rule in sorted(rules, key=lambda r: r.id):
            text = f"**{rule.title}.** {rule.text}".replace("|", "\\|")
            stated = ", ".join(f"`{d}`" for d in rule.definitions) or (
                "kvoracle's input checks" if rule.kind == "validation" else "lockstep check")
            needs = ", ".join(REQUIREMENTS.get(rule.id, ())) or "-"
            lines.append(f"| {rule.id} | {text} | {rule.kind} | {stated} | {needs} | "
                         f"{rule.source.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n")
