"""The architecture matrix as a test: every decoder architecture ends exact or refused in one line.

:mod:`tests.integration.arch_matrix` builds each ``model_type`` tiny and random-init, opens it on both
backends and runs every technique against its plain-transformers reference.  Here each architecture is one
test case, the cases dealt into four units of xdist's work (tests/helpers/work_units.py: SPLIT), so both workers of
`make test` share the matrix; each result is stored in the run's shared folder (``arch_matrix.stored_result``);
test_architectures_table.py checks docs/scaling.md's table and the README's count against the same results.  The
last test checks that the CLI refuses an architecture in one line with exit 2, writing nothing to the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.arch_matrix import MATRIX, stored_result

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model_type", MATRIX)
def test_exact_or_refused_in_one_line(model_type, matrix_folder):
    r = stored_result(model_type, matrix_folder)
    if r.refused is not None:
        assert "\n" not in r.refused and "Traceback" not in r.refused
        assert re.search(r"unsupported|cannot|refus", r.refused), r.refused
        return
    assert r.exact, f"{model_type}: " + " | ".join(r.failures)
    for name, cell in list(r.cells.items()) + list((r.nnsight or {}).items()):
        if cell.status == "refused":  # a technique that does not apply says so in one line
            assert cell.note and "\n" not in cell.note, (name, cell.note)


def test_cli_refuses_an_unstudied_architecture_in_one_line(tmp_path):
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
