"""Copy as code: the Path patching page's notebook snippet runs as written and prints the page's key heads; its CLI
line parses (issue 51)."""

from __future__ import annotations

import ast
import shlex

from tests.app.conftest import errors, page


def test_the_path_patching_snippet_reproduces_the_key_heads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("4_Path_patching.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    cli, py = [c.value for c in at.code][:2]
    shown = [(int(r["layer"]), int(r["head"]), float(r.iloc[2])) for _, r in at.dataframe[0].value.iterrows()]
    exec(compile(py, "snippet", "exec"), {})
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(a, b) for a, b, _ in printed] == [(a, b) for a, b, _ in shown]
    assert all(abs(v - w) < 1e-6 for (_, _, v), (_, _, w) in zip(printed, shown))
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    args = parser.parse_args(shlex.split(cli)[3:])
    assert args.cmd == "path-patching" and args.n == 8 and args.op == "add,sub,mul,div"


def test_the_intervene_command_prints_the_pages_numbers(tmp_path, monkeypatch, capsys):
    import json

    from engine.cli.main import main
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("15_Intervene.py")
    at.session_state["prompt"] = "Q: What is 7 plus 8? A:"
    at.run()
    at.multiselect(key="iv_components").set_value(["1.3", "1.1"]).run()
    at.radio(key="iv_action").set_value("scale").run()
    at.slider(key="iv_factor").set_value(-1.0).run()
    at.checkbox(key="iv_freeze").check().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    cli = at.code[0].value
    shown = float(next(m.value for m in at.metric if m.label.startswith("P(answer")))
    capsys.readouterr()
    assert main(shlex.split(cli)[3:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["components"] == ["1.3", "1.1"] and out["factor"] == -1.0 and out["freeze"]
    assert abs(out["watched_prob_after"] - shown) < 5e-4  # the page shows three decimals
