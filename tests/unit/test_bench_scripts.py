"""Every benchmark under ``bench/`` still imports, and the ones with a command line still parse it (``--help``).

The docs quote their tables; a script that no longer runs cannot be rerun to check them (two did not until
2026-12-07: ``bench/precision.py`` imported two private names the engine had since moved, and
``bench/intervene_page.py`` a browser helper the tests had replaced)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 15 and {"resolutions", "edges", "precision", "intervene_page"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_benchmark_imports_and_parses_its_command_line(name, monkeypatch, capsys):
    module = importlib.import_module(f"bench.{name}")
    text = (BENCH / f"{name}.py").read_text(encoding="utf-8")
    if "__main__" not in text:  # a helper the benchmarks share (bench/work.py): importing it is all
        return
    if "argparse" not in text:
        assert callable(getattr(module, "main", None)), name  # run as `python bench/<name>.py`, no arguments
        return
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
