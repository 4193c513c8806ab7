"""Layering rules: pages stay thin (no torch), the engine and cache never import Streamlit."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_pages_and_ui_do_not_import_torch():
    files = [REPO / "app.py", *sorted((REPO / "app_pages").glob("*.py")), *sorted((REPO / "ui").glob("*.py"))]
    assert len(files) >= 7
    offenders = [f.name for f in files if {"torch", "transformers", "transformer_lens", "nnsight"} & _imports(f)]
    assert not offenders, offenders


def test_engine_and_cache_do_not_import_streamlit():
    files = [*sorted((REPO / "engine").glob("*.py")), *sorted((REPO / "cache").glob("*.py"))]
    offenders = [f.name for f in files if "streamlit" in _imports(f)]
    assert not offenders, offenders
