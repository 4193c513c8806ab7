"""`make test`'s units of work under xdist (tests/helpers/work_units.py): a file each, the matrix dealt in four."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.work_units import SPLIT, unit_of

REPO = Path(__file__).resolve().parents[2]
MATRIX = "tests/integration/test_architectures.py::test_exact_or_refused_in_one_line"


def test_a_file_is_one_unit_and_a_split_function_is_dealt_in_turn():
    dealt: dict[str, int] = {}
    ids = ["tests/integration/test_exports.py::test_every_export_builds_on_every_set[gemma3-figure8-carry]",
           "tests/integration/test_exports.py::test_sets_with_little_to_compute_export_and_say_why",
           "tests/e2e/test_charts_browser.py::test_every_chart_draws_every_label[smollm2]",
           *(f"{MATRIX}[{mt}]" for mt in ("gpt2", "llama", "qwen2", "gemma", "olmo2", "mistral")),
           "tests/integration/test_architectures.py::test_cli_refuses_an_unstudied_architecture_in_one_line"]
    units = [unit_of(i, SPLIT, dealt) for i in ids]
    assert units[0] == units[1] == "tests/integration/test_exports.py"
    assert units[2] == "tests/e2e/test_charts_browser.py"
    assert units[3:9] == [f"{MATRIX}#{i % 4}" for i in range(6)]
    assert units[9] == "tests/integration/test_architectures.py"  # the file's other tests: the file's unit
    assert dealt == {MATRIX: 6}


@pytest.mark.slow
def test_make_tests_xdist_run_keeps_a_files_tests_on_one_worker():
    """The scheduler is the one `make test` gets (``--dist loadfile``): a file's tests all report from one worker.
    (Under ``--dist loadgroup`` with pytest 9 they went to both.)"""
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/unit/test_intervals.py", "tests/unit/test_logistic.py",
                        "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, path in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (tests/\S+?\.py)::", r.stdout):
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == {"tests/unit/test_intervals.py", "tests/unit/test_logistic.py"}, r.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers


def test_the_suite_runs_without_xdist():
    """The scheduler hook is xdist's: with the plugin off (``-p no:xdist``) the suite still collects and runs."""
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/unit/test_intervals.py", "-q", "-p", "no:xdist",
                        "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
