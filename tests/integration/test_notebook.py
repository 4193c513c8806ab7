"""docs/notebook.md runs as written: the public API (``engine/__init__.py``) in at most 15 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import engine

DOC = Path(__file__).resolve().parents[2] / "docs" / "notebook.md"


def _cell() -> str:
    return re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S).group(1)


def test_notebook_cell_is_short_and_uses_only_the_public_api():
    code = _cell()
    lines = [ln for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(lines) <= 15, len(lines)
    imported = re.search(r"^from engine import (.+)$", code, re.M).group(1).split(", ")
    assert set(imported) <= set(engine.__all__)
    assert not re.search(r"^\s*(from|import) engine\.", code, re.M)  # nothing from the submodules


def test_every_public_name_resolves():
    for name in engine.__all__:
        assert getattr(engine, name) is not None
    with pytest.raises(AttributeError):
        engine.no_such_name  # noqa: B018


def test_notebook_cell_runs_and_shows_the_paper_result(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    exec(compile(_cell(), str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "key heads:" in out
    points = {int(k): (int(top), int(rand)) for k, top, rand in
              re.findall(r"k=(\d): top-k knocked out (\d+)%, random k (\d+)%", out)}
    assert sorted(points) == [0, 1, 2, 3, 4, 5]
    top5, rand5 = points[5]
    # knocking out the key heads breaks the arithmetic, as many random ones much less (the bundled model
    # needs 4-5 of its 64 heads knocked out on this set; 5 is the cell's k_max)
    assert rand5 - top5 >= 50 and points[5][0] < points[0][0], out
    assert (tmp_path / "results.duckdb").exists()  # the cell's results went to the cache it named
