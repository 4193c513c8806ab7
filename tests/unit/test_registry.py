"""The technique registry: every entry is wired (module, command, a page that shows it), and a technique
added by one entry reaches the CLI with no other file touched.  (A finding added by one step reaches the
summary, the Paper page, the report and Story: tests/integration/test_steps.py.)"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from engine import registry
from engine.registry import TECHNIQUES, Option, Technique

REPO = Path(__file__).resolve().parents[2]


def test_every_entry_names_a_documented_module_a_command_and_a_page():
    from engine.cli.main import build_parser
    from ui.nav import PAGE_OF, PAGES
    parser, commands = build_parser()
    urls = {p.url_path for p in PAGES}
    assert len({t.name for t in TECHNIQUES}) == len(TECHNIQUES)
    for t in TECHNIQUES:
        mod = t.load()
        assert (mod.__doc__ or "").strip(), f"{t.module}: the module opens with its method"
        assert t.name in commands, t.name
        fn = t.cli.rpartition(":")[2]
        owner = registry.importlib.import_module(registry.MODULES + t.cli.rpartition(":")[0]) if ":" in t.cli else mod
        assert callable(getattr(owner, fn)), (t.name, t.cli)
        assert PAGE_OF.get(t.name) in urls, (t.name, PAGE_OF.get(t.name))


def test_the_steps_follow_the_paper_and_name_registered_techniques():
    """Identify, validate, analyse, then carry over and improve; each step's technique is registered (or is
    the fine-tuning command) and shown on a page; each sentence function exists."""
    from engine.findings.steps import STEPS
    from ui.nav import PAGE_OF
    assert [s.key for s in STEPS][:4] == ["key heads", "knockout", "attention", "MLPs"]
    assert len({s.key for s in STEPS}) == len(STEPS)
    names = {t.name for t in TECHNIQUES} | {"finetune"}
    for s in STEPS:
        assert s.technique in names and s.technique in PAGE_OF, s.key
        assert s.sentence is None or callable(s.summary_sentence()), s.key
        assert s.sentence is not None or s.check is not None, f"{s.key}: a step tells or checks something"


def test_one_name_per_technique_and_the_old_commands_still_work():
    """Module, command and (where the technique has a page of its own) page title and URL path share one name;
    a former command name parses to the same command."""
    from engine.cli.main import build_parser
    from ui.nav import PAGE_OF, page_of
    parser, commands = build_parser()
    for t in TECHNIQUES:
        assert t.module == t.name.replace("-", "_"), (t.name, t.module)
        owners = [n for n, page in PAGE_OF.items() if page == PAGE_OF[t.name]]
        if owners == [t.name]:  # a page of its own: its title and path are the technique's name
            p = page_of(t.name)
            assert p.title.lower().replace(" ", "-") == t.name and p.url_path.lower() == t.module, (t.name, p)
        for old in t.aliases:
            assert commands[old] is not None and old not in {u.name for u in TECHNIQUES}
    assert [t.name for t in TECHNIQUES if "patch" in t.aliases] == ["path-patching"]
    args = parser.parse_args(["patch", "--out", "x.csv", "--by", "op"])
    assert args.by == "op" and commands[args.cmd] is not None


def test_every_technique_command_parses_its_own_options():
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    for t in TECHNIQUES:
        required = [o for o in t.options if o.kwargs.get("required")]
        argv = [t.name] + [x for o in required for x in (o.flags[0], "x")]
        args = parser.parse_args(argv)
        assert args.model == "organism" and args.families == t.families, t.name


@pytest.fixture()
def added(monkeypatch, tmp_path):
    """A technique that exists only as a module and one registry entry (what a contributor writes)."""
    mod = types.ModuleType("engine.techniques.fake_count")
    mod.__doc__ = "Counting prompt pairs: the number of pairs and their mean length (a stand-in technique)."

    def cli(args, ctx) -> dict:
        rows = [{"n_pairs": len(ctx.pairs), "scale": args.scale}]
        ctx.write_csv(args.out, rows)
        return {"out": str(args.out), "rows": rows}

    mod.cli = cli
    monkeypatch.setitem(sys.modules, "engine.techniques.fake_count", mod)
    entry = Technique("fake-count", "Fake count", "count the pairs -> CSV", "fake_count",
                      (registry.out("output .csv"), Option(("--scale",), {"type": int, "default": 2})))
    monkeypatch.setattr(registry, "TECHNIQUES", (*registry.TECHNIQUES, entry))
    return entry


def test_one_entry_adds_a_command(added, tmp_path, capsys, monkeypatch):
    import engine.cli.main as cli
    monkeypatch.setattr(cli, "TECHNIQUES", registry.TECHNIQUES)
    out = tmp_path / "c.csv"
    assert cli.main(["fake-count", "--op", "add", "--n", "3", "--scale", "5", "--out", str(out), "--no-cache"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"][0]["scale"] == 5 and printed["rows"][0]["n_pairs"] >= 1
    assert out.read_text().splitlines()[0] == "n_pairs,scale"
    assert cli.main(["fake-count", "--scale", "x", "--out", str(out)]) == 2  # a bad option: one line, exit 2
