"""The architecture matrix's summary: wide and mostly exact, docs/scaling.md's coverage table and the README's count
are what the matrix gives.  It reads the results test_architectures.py's cases stored in the run's shared folder
(``arch_matrix.stored_result``; one it lacks is computed here), so `make test` collects this file last.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.arch_matrix import MATRIX, SCALING, replace_table, stored_result, table

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

REPO = Path(__file__).resolve().parents[2]


def test_the_matrix_is_wide_and_mostly_exact(matrix_folder):
    results = [stored_result(mt, matrix_folder) for mt in MATRIX]
    exact = [r for r in results if r.exact]
    assert len(MATRIX) >= 25 and len(exact) >= 25, [r.model_type for r in exact]
    # the families issue 31 found wrong or crashing are among the exact ones, on both backends where mapped
    for mt in ("gemma2", "gemma3_text", "olmo2", "olmo3", "exaone4", "cohere", "gptj"):
        assert stored_result(mt, matrix_folder).exact, mt
    for mt in ("gemma2", "gemma3_text", "olmo2", "olmo3", "gptj", "llama", "gpt2", "gpt_neox"):
        assert stored_result(mt, matrix_folder).nnsight is not None, f"the nnsight backend maps {mt}"


def test_scaling_md_coverage_table_is_the_matrix(matrix_folder):
    results = [stored_result(mt, matrix_folder) for mt in MATRIX]
    text = SCALING.read_text()
    assert replace_table(text, table(results)) == text, \
        "docs/scaling.md's coverage table differs from the matrix: run " \
        "`.venv/bin/python -m tests.integration.arch_matrix --write`"


def test_readme_states_the_count(matrix_folder):
    n = sum(stored_result(mt, matrix_folder).exact for mt in MATRIX)
    readme = (REPO / "README.md").read_text()
    assert f"{n} decoder architectures" in readme, f"README.md should say '{n} decoder architectures'"
