"""The technique registry: every entry is wired (module, command, page, summary step), and a technique added
by one entry reaches the CLI, the circuit summary and the menu with no other file touched."""

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
    from ui.nav import PAGES
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
        assert t.page in urls, (t.name, t.page)
        assert (t.finding is not None) == bool(t.step), t.name


def test_the_summary_steps_follow_the_paper():
    """The paper's argument first, in its order; techniques beyond the paper add their steps after it."""
    steps = [t.step for t in TECHNIQUES if t.step]
    assert steps[:5] == ["key heads", "attention", "MLPs", "logit lens", "knockout"]
    assert len(set(steps)) == len(steps)


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

    def finding(model, pairs, cache, table) -> str:
        return f"There are {len(pairs)} pairs."

    mod.cli, mod.finding = cli, finding
    monkeypatch.setitem(sys.modules, "engine.techniques.fake_count", mod)
    entry = Technique("fake-count", "Fake count", "count the pairs -> CSV", "fake_count", "Fake_count",
                      (registry.out("output .csv"), Option(("--scale",), {"type": int, "default": 2})),
                      step="pairs", page_script="pages/99_Fake_count.py", icon=":material/pin:")
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


def test_one_entry_adds_a_summary_sentence(added, tmp_path):
    from cache import ResultCache
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec, generate
    from engine.techniques.patching import cached_path_patching
    from engine.techniques.summary import circuit_summary
    model = open_model("organism", device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add",), n=4, seed=0))
    cache = ResultCache(tmp_path / "c.duckdb")
    cached_path_patching(model, pairs, cache=cache)
    last = circuit_summary(model, pairs, cache)[-1]
    assert (last.step, last.text, last.page, last.computed) == ("pairs", f"There are {len(pairs)} pairs.",
                                                                "Fake_count", True)


def test_one_entry_adds_a_page_to_the_menu(added):
    import importlib

    import ui.nav
    try:
        nav = importlib.reload(ui.nav)
        assert nav.PAGES[-1] == nav.PageDef("pages/99_Fake_count.py", "Fake count", ":material/pin:", "Fake_count")
    finally:
        registry.TECHNIQUES = tuple(t for t in registry.TECHNIQUES if t.name != "fake-count")
        importlib.reload(ui.nav)
