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
