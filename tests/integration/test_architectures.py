"""The architecture matrix as a test: every decoder architecture ends exact or refused in one line.

:mod:`tests.integration.arch_matrix` builds each ``model_type`` tiny and random-init, opens it on both
backends and runs every technique against its plain-transformers reference.  Here each architecture is one
test case; the last tests check that docs/scaling.md's coverage table and the README's count are what the
matrix gives, and that the CLI refuses an architecture in one line with exit 2, writing nothing to the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.arch_matrix import MATRIX, SCALING, ArchResult, replace_table, run_arch, table

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

REPO = Path(__file__).resolve().parents[2]
_RESULTS: dict[str, ArchResult] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arch")


def result(model_type: str, root: Path) -> ArchResult:
    if model_type not in _RESULTS:
        _RESULTS[model_type] = run_arch(model_type, root)
    return _RESULTS[model_type]


@pytest.mark.parametrize("model_type", MATRIX)
def test_exact_or_refused_in_one_line(model_type, root):
    r = result(model_type, root)
    if r.refused is not None:
        assert "\n" not in r.refused and "Traceback" not in r.refused
        assert re.search(r"unsupported|cannot|refus", r.refused), r.refused
        return
    assert r.exact, f"{model_type}: " + " | ".join(r.failures)
    for name, cell in list(r.cells.items()) + list((r.nnsight or {}).items()):
        if cell.status == "refused":  # a technique that does not apply says so in one line
            assert cell.note and "\n" not in cell.note, (name, cell.note)


def test_the_matrix_is_wide_and_mostly_exact(root):
    results = [result(mt, root) for mt in MATRIX]
    exact = [r for r in results if r.exact]
    assert len(MATRIX) >= 25 and len(exact) >= 25, [r.model_type for r in exact]
    # the families issue 31 found wrong or crashing are among the exact ones, on both backends where mapped
    for mt in ("gemma2", "gemma3_text", "olmo2", "olmo3", "exaone4", "cohere", "gptj"):
        assert _RESULTS[mt].exact, mt
    for mt in ("gemma2", "gemma3_text", "olmo2", "olmo3", "gptj", "llama", "gpt2", "gpt_neox"):
        assert _RESULTS[mt].nnsight is not None, f"the nnsight backend maps {mt}"


def test_scaling_md_coverage_table_is_the_matrix(root):
    results = [result(mt, root) for mt in MATRIX]
    text = SCALING.read_text()
    assert replace_table(text, table(results)) == text, \
        "docs/scaling.md's coverage table differs from the matrix: run " \
        "`.venv/bin/python -m tests.integration.arch_matrix --write`"


def test_readme_states_the_count(root):
    n = sum(result(mt, root).exact for mt in MATRIX)
    readme = (REPO / "README.md").read_text()
    assert f"{n} decoder architectures" in readme, f"README.md should say '{n} decoder architectures'"


def test_cli_refuses_an_unstudied_architecture_in_one_line(root, tmp_path):
    from tests.integration.tiny_models import build_tiny
    model_dir = build_tiny("falcon_h1", tmp_path / "falcon_h1")
    cache = tmp_path / "results.duckdb"
    env = dict(os.environ, ARITHLAB_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    out = tmp_path / "effects.csv"
    r = subprocess.run([sys.executable, "-m", "engine", "path-patching", "--model", str(model_dir), "--n", "4",
                        "--out", str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "FalconH1ForCausalLM" in lines[0] and "Mamba" in lines[0], r.stderr
    assert r.stdout == "" and not out.exists()
    if cache.exists():  # nothing half-written: no result rows
        import duckdb
        con = duckdb.connect(str(cache), read_only=True)
        for t in ("runs", "results", "artifacts"):
            assert con.execute(f"select count(*) from {t}").fetchone()[0] == 0, t
