"""The docs' lists are the code's: the README's technique table, docs/cli.md's commands and docs/dashboard.md's
pages are checked against the registry, the CLI's parser and the menu; numbers the docs quote from the code
(the Paper page's criteria) are the code's; the README holds no commit hashes (history: CHANGELOG.md)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.registry import TECHNIQUES

REPO = Path(__file__).resolve().parents[2]


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    level = heading.split(" ")[0]
    body = text.split(heading + "\n", 1)[1]
    return re.split(rf"\n{level} ", body, maxsplit=1)[0]


def test_the_readme_table_has_every_technique_with_its_module_command_and_page():
    from ui.nav import page_of
    table = _section((REPO / "README.md").read_text(encoding="utf-8"), "## Techniques")
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines() if line.startswith("| ")]
    for t in TECHNIQUES:
        mine = [r for r in rows if re.search(rf"`{re.escape(t.name)}( [^`]*)?`", r[2])]
        assert mine, f"README's technique table has no row with the command `{t.name}`"
        technique, module, command, page = mine[0]
        assert (f"engine/techniques/{t.module}.py" in module  # a module, or a package of one module per part
                or f"engine/techniques/{t.module}/" in module), (t.name, module)
        assert page_of(t.name).title in page, (t.name, page, page_of(t.name).title)


def test_cli_md_documents_every_subcommand():
    from engine.cli.main import build_parser
    _, commands = build_parser()
    commands = set(commands) - {a for t in TECHNIQUES for a in t.aliases}  # former names: not documented
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    index = text.split("## Common options")[0]
    listed = set(re.findall(r"`([a-z][a-z-]*)(?: --receiver)?`", index))
    assert listed == set(commands), (sorted(set(commands) - listed), sorted(listed - set(commands)))
    for name in commands:
        assert re.search(rf"python -m engine {re.escape(name)}\b", text), f"docs/cli.md has no example of {name}"
        assert f"* **`{name}" in text, f"docs/cli.md does not describe {name}'s output"


def test_dashboard_md_describes_every_page_in_menu_order():
    from ui.nav import PAGES
    text = _section((REPO / "docs" / "dashboard.md").read_text(encoding="utf-8"), "## The pages")
    described = re.findall(r"^\*\*([^*]+)\*\* \(\[`(pages/[^`]+)`\]", text, flags=re.M)
    assert described == [(p.title, p.script) for p in PAGES]


def test_the_readme_quotes_the_criteria_the_code_checks():
    from engine.findings import checks
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"≥ {checks.PRECISE_SHARE:.0%}".replace("%", " %") in readme
    assert f"under {checks.SPARSE_SHARE:.0%}".replace("%", " %") in readme


def test_no_commit_hashes_in_the_readme():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"`[0-9a-f]{7,40}`", readme)
