"""Layering rules: the drawing of docs/architecture.md (:data:`LAYERS`: every import points down or sideways),
pages stay thin (no torch), nothing below the front ends imports Streamlit or ``ui``, the product's modules
import no other module's private names and form no import cycle."""

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


def test_nothing_below_the_dashboard_imports_streamlit_or_ui():
    """Imports inside functions count too: the CLI and the report reach charts through ``views``."""
    files = [*sorted((REPO / "engine").rglob("*.py")), *sorted((REPO / "cache").glob("*.py")),
             *sorted((REPO / "views").glob("*.py"))]
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

#: docs/architecture.md's drawing, top to bottom: (layer, its paths).  A module imports only from its own
#: layer and the layers below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("front ends", ("app.py", "pages/", "ui/", "engine/cli/", "engine/__main__.py", "engine/__init__.py")),
    ("views", ("views/",)),
    ("findings", ("engine/findings/",)),
    ("registry", ("engine/registry.py",)),
    ("finetune", ("engine/finetune/",)),
    ("studies", ("engine/organism/", "engine/evaluation/")),
    ("techniques", ("engine/techniques/",)),
    ("machinery", ("engine/machinery/",)),
    ("core", ("engine/results.py", "engine/cost.py", "engine/backends/")),
    ("base", ("engine/prompts/", "engine/models/", "engine/numerics/", "engine/progress.py", "engine/paths.py",
              "cache/")),
)


def layer_of(path: Path) -> int:
    """Index in :data:`LAYERS` (0 = top) of the file ``path``; KeyError for a file the drawing does not place."""
    rel = path.relative_to(REPO).as_posix()
    for i, (_, paths) in enumerate(LAYERS):
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in paths):
            return i
    raise KeyError(rel)


def test_the_drawing_in_the_docs_is_this_table():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- layers: read by tests/unit/test_layering.py -->", 1)[1].split("```")[1]
    drawn = tuple((line[:13].strip(), tuple(line[13:].split())) for line in block.strip().splitlines())
    assert drawn == LAYERS


def test_every_import_points_down_the_drawing():
    """Every product module, page and app.py: each import of a product module is of its own layer or a lower
    one (imports inside functions count: a lazy import pointing up is still a dependency pointing up)."""
    modules = _product_files()
    files = {**modules, "app": REPO / "app.py", **{f"pages.{f.stem}": f for f in (REPO / "pages").glob("*.py")}}
    assert len(files) > 100
    offenders = upward_imports(files, modules)  # KeyError: a file the drawing does not place
    assert not offenders, offenders


def upward_imports(files: dict[str, Path], modules: dict[str, Path]) -> list[str]:
    out = []
    for me, path in sorted(files.items()):
        mine = layer_of(path)
        for mod, _ in _imported(path, modules):
            theirs = layer_of(modules[mod])
            if theirs < mine:
                out.append(f"{me} ({LAYERS[mine][0]}) imports {mod} ({LAYERS[theirs][0]})")
    return out


def test_the_layer_check_finds_an_import_pointing_up(tmp_path):
    """The checker itself: a technique importing the findings lazily, and the registry importing the CLI,
    are reported; the findings importing a technique is not."""
    files = {"engine.techniques.t": "def f():\n    from engine.findings import steps\n",
             "engine.findings.steps": "from engine.techniques.t import f\n",
             "engine.registry": "import engine.cli.context\n", "engine.cli.context": ""}
    for name, text in files.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    global REPO
    old, REPO = REPO, tmp_path
    try:
        tree = {name: tmp_path / (name.replace(".", "/") + ".py") for name in files}
        assert upward_imports(tree, tree) == [
            "engine.registry (registry) imports engine.cli.context (front ends)",
            "engine.techniques.t (techniques) imports engine.findings.steps (findings)"]
    finally:
        REPO = old


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
