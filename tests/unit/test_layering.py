"""Layering rules: pages stay thin (no torch), the engine and cache never import Streamlit, the
product's modules import no other module's private names and form no import cycle."""

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
    files = [REPO / "app.py", *sorted((REPO / "pages").glob("*.py")), *sorted((REPO / "ui").glob("*.py")),
             *sorted((REPO / "views").glob("*.py"))]
    assert len(files) >= 7
    offenders = [f.name for f in files if {"torch", "transformers", "transformer_lens", "nnsight"} & _imports(f)]
    assert not offenders, offenders


def test_engine_and_cache_do_not_import_streamlit_or_ui():
    """Imports inside functions count too: the CLI and the report reach charts through ``views``."""
    files = [*sorted((REPO / "engine").rglob("*.py")), *sorted((REPO / "cache").glob("*.py"))]
    assert len(files) >= 40
    offenders = [str(f.relative_to(REPO)) for f in files if {"streamlit", "ui"} & _imports(f)]
    assert not offenders, offenders


def test_views_draw_without_streamlit_or_torch():
    """``views/`` (chart builders, the HTML report) is shared by pages, CLI and report: Altair and pandas only."""
    files = sorted((REPO / "views").glob("*.py"))
    assert len(files) >= 3
    banned = {"streamlit", "ui", "torch", "transformers", "transformer_lens", "nnsight"}
    offenders = [f"{f.name}: {sorted(banned & _imports(f))}" for f in files if banned & _imports(f)]
    assert not offenders, offenders


PRODUCT = ("engine", "cache", "ui", "views")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _product_files() -> dict[str, Path]:
    files = [f for d in PRODUCT for f in (REPO / d).rglob("*.py")]
    return {_module_name(f): f for f in files}


def _imported(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(module, names) of every product import in ``path``, module-level or inside functions;
    ``from pkg import mod`` counts as importing ``pkg.mod``; relative imports are resolved."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [a.name for a in node.names]
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            out += [(m, []) for m in subs]
            rest = [n for n in names if f"{base}.{n}" not in modules]
            if base in modules and rest:
                out.append((base, rest))
    return out


def test_no_private_names_imported_across_modules():
    modules = _product_files()
    offenders = [f"{me}: from {mod} import {n}" for me, path in modules.items()
                 for mod, names in _imported(path, modules) if mod != me
                 for n in names if n.startswith("_") and not n.startswith("__")]
    assert not offenders, offenders


def test_no_import_cycles():
    """Imports inside functions count too: a lazy import only hides a cycle."""
    modules = _product_files()
    graph = {me: {mod for mod, _ in _imported(path, modules) if mod != me} for me, path in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_cycle_check_finds_a_cycle(tmp_path):
    """The checker itself: two modules importing each other (one lazily) are reported."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    from a import x\n")
    tree = {"a": a, "b": b}
    global REPO
    old, REPO = REPO, tmp_path
    try:
        graph = {me: {m for m, _ in _imported(p, tree)} for me, p in tree.items()}
    finally:
        REPO = old
    assert graph == {"a": {"b"}, "b": {"a"}}


def test_no_sys_path_edits():
    """The lab is installed (``make setup``: ``pip install -e .``): nothing edits ``sys.path`` to import it."""
    files = [f for d in (*PRODUCT, "bench", "tests", "docs", "pages") for f in (REPO / d).rglob("*.py")]
    files.append(REPO / "app.py")
    offenders = [str(f.relative_to(REPO)) for f in files
                 if "sys.path.insert" in f.read_text(encoding="utf-8").replace("test_no_sys_path_edits", "")
                 and f.name != "test_layering.py"]
    assert not offenders, offenders
