"""Session-wide hooks: timings reported by tests are printed in pytest's terminal summary (from every xdist
worker); one Chromium (``browser``) serves every browser test of a process (tests/e2e, tests/reliability); the
bundled model (``organism``, alias ``model``) is one fixture for every test module that opens it; each test carries
its folder's tier marker, ``fast`` when it belongs to the fast tier and ``serial`` when it compares a time or a CPU
reading with a threshold (`make test` runs those alone, after the rest ran on two workers)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

TIMINGS: list[str] = []
CHROMIUM = "/usr/bin/chromium"
TESTS = Path(__file__).resolve().parent
#: a test's tier is its folder (docs/testing.md); each folder's tests carry its marker, so `-m unit` picks a tier
TIERS = ("unit", "integration", "app", "e2e", "reliability")
#: the fast tier (`make test-fast`, the loop for every change): the model-free units and, on the bundled model, each
#: core technique against its plain reference, the charts' specs, the compute gate and one page end to end -- no
#: Chromium, no real model, no architecture matrix, nothing marked slow
FAST = ("unit/", "integration/test_path_patching.py", "integration/test_knockout.py",
        "integration/test_knockout_curve.py", "integration/test_attention.py", "integration/test_mlp_projections.py",
        "integration/test_promptlab.py", "integration/test_logit_lens.py", "integration/test_head_patching.py",
        "integration/test_position_patching.py", "integration/test_carries.py", "app/test_charts.py",
        "app/test_compute_gate.py", "app/test_operand_grid.py")
NOT_FAST = ("slow", "realmodel", "e2e", "matrix")
#: tests that compare a time or a CPU reading with a threshold: run alone (`make test`: `-m serial` after the
#: parallel run), since a second worker's load would move the reading, not the code
SERIAL = ("e2e/test_cold_cache_browser.py", "e2e/test_leave_page_browser.py", "app/test_cancel.py",
          "reliability/test_concurrency.py", "reliability/test_crashes.py")
#: the files that take longest (minutes: browser walks, real models), collected first so that under xdist
#: (a file per worker at a time) neither worker is left with one of them at the end while the other idles
LONGEST = ("e2e/test_charts_browser.py", "integration/test_exports.py", "e2e/test_gemma3_browser.py",
           "integration/test_gemma3.py", "e2e/test_pages_browser.py", "integration/test_architectures.py",
           "e2e/test_paper_browser.py", "integration/test_numbers.py", "e2e/test_share_link_browser.py",
           "integration/test_smollm2_finetune.py", "e2e/test_beyond_browser.py", "integration/test_cli.py",
           "e2e/test_workbench_smollm2_browser.py", "app/test_as_code.py")
#: collected last: the matrix's summary reads the results its cases stored (tests/integration/arch_matrix.py)
LAST = ("integration/test_architectures_table.py",)


def _rel(item) -> str:
    return "/".join(Path(str(item.path)).resolve().relative_to(TESTS).parts)


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = _rel(item)
        tier = rel.split("/")[0]
        if tier in TIERS:
            item.add_marker(tier)
        if "smollm2" in item.name.lower():  # a test named for the real SmolLM2 opens it (4 did without the marker)
            item.add_marker("realmodel")
        if rel.startswith(FAST) and not any(item.get_closest_marker(m) for m in NOT_FAST):
            item.add_marker("fast")
        if rel.startswith(SERIAL):
            item.add_marker("serial")
    first = {f: i for i, f in enumerate(LONGEST)} | {f: len(LONGEST) + 1 + i for i, f in enumerate(LAST)}
    items.sort(key=lambda item: first.get(_rel(item).split("::")[0], len(LONGEST)))  # stable: order kept within


@pytest.hookimpl(optionalhook=True)  # an xdist hook: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile`` (`make test`), a file per unit of work but the architecture matrix dealt into four
    (tests/helpers/work_units.py; xdist's loadgroup marks no longer reach its scheduler under pytest 9)."""
    if config.getvalue("dist") == "loadfile":
        from tests.helpers.work_units import FileUnits
        return FileUnits(config, log)
    return None


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: two of them share the 2 cores, one torch thread each
        import torch
        torch.set_num_threads(1)
        # and so does every process a worker starts (its dashboard, a CLI run): two workers' dashboards on two OpenMP
        # threads each made the browser walks 2.5x slower (docs/testing.md, "Two workers, and the serial few")
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        # and the Numbers probes fit in the process that asks (engine/techniques/numbers/probes.py: fit_workers), not
        # in a worker process per core that imports the ML stack again (test_numbers.py checks both give the same)
        os.environ["LOKY_MAX_CPU_COUNT"] = "1"
    elif config.getoption("numprocesses", None):  # the xdist controller: a folder for what the workers share
        import tempfile

        from tests.helpers.shared import SHARED_ENV
        os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="arithlab-tests-")


def _stop_shared_server() -> None:
    """Stop the dashboards of the xdist workers (tests/e2e/conftest.py: shared_server) and remove their folder."""
    import json
    import shutil
    import signal

    from tests.helpers.shared import SHARED_ENV
    shared = os.environ.pop(SHARED_ENV, None)
    if not shared:
        return
    for info in Path(shared).glob("server-*.json"):
        pid = json.loads(info.read_text())["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            deadline = time.time() + 10
            while time.time() < deadline and _alive(pid):
                time.sleep(0.2)
            os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(shared, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                    "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


#: the interpreter's own __main__ (pytest's): a spawned process re-imports it
_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _main_module_restored():
    """Streamlit's AppTest leaves the last page script it ran as ``sys.modules["__main__"]``; a process started with
    multiprocessing's "spawn" afterwards re-runs that script as its main module and dies before its target runs (the
    cache's cross-process tests then waited on an empty queue, in every full run). Each test ends with pytest's own
    __main__ back."""
    yield
    if sys.modules.get("__main__") is not _MAIN:
        sys.modules["__main__"] = _MAIN


@pytest.fixture(scope="module")
def organism():
    """The bundled model on the CPU through TransformerBridge, opened once per test module (a module's tests may
    leave memos on the backend; no test module sees another's)."""
    from engine.backends import open_model
    return open_model("organism", device="cpu")


@pytest.fixture(scope="module")
def model(organism):
    """The bundled model, under the name the technique-level tests use."""
    return organism


#: the lines already attached to a report (TIMINGS is per process; reports travel from xdist workers)
_SENT = {"n": 0}
#: the lines of every report, in the process that prints the summary
_REPORTED: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.user_properties.extend(("timing", line) for line in TIMINGS[_SENT["n"]:])
    _SENT["n"] = len(TIMINGS)


def pytest_runtest_logreport(report):
    _REPORTED.extend(v for k, v in report.user_properties if k == "timing")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _REPORTED:
        terminalreporter.section("timings reported by tests")
        for line in _REPORTED:
            terminalreporter.write_line(line)
    from tests.e2e.conftest import TRACE, compute_seconds
    from tests.helpers.shared import SHARED_ENV
    if os.environ.get(SHARED_ENV):
        spent = sorted(compute_seconds(Path(os.environ[SHARED_ENV]) / TRACE).items(), key=lambda kv: -kv[1][1])
        if spent:
            terminalreporter.section("what the browser tests' dashboard computed (s)")
            terminalreporter.write_line(", ".join(f"{m} {s:.0f} ({n})" for m, (n, s) in spent))


def pytest_sessionfinish(session, exitstatus):
    _remember(exitstatus)
    # close the cache's process-wide DuckDB instance before interpreter teardown
    import gc

    from cache.connection import reset_engine
    reset_engine()
    gc.collect()


_EXIT_STATUS = {"value": 0}


def pytest_sessionstart(session):
    _EXIT_STATUS["value"] = 0


def _remember(exitstatus) -> None:
    _EXIT_STATUS["value"] = int(exitstatus)


def pytest_unconfigure(config):
    """Leave without interpreter teardown once pytest has reported everything.

    DuckDB's nanobind bindings print pages of "leaked instance" warnings when Python tears down
    after a long session (torch, Streamlit and DuckDB objects still referenced); they would bury
    pytest's closing line. The exit status is pytest's own.
    """
    if not hasattr(config, "workerinput"):
        _stop_shared_server()
    if os.environ.get("ARITHLAB_PYTEST_FAST_EXIT", "1") != "1" or hasattr(config, "workerinput"):
        return  # an xdist worker ends as xdist ends it (its reports still travel after this hook)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["value"])
