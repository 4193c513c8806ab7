"""Shared pieces of the reliability and security suite (issue #7).

* ``seeded_cache``: a copy of a result cache filled by the real pages (bundled model, a small prompt
  set), with a snapshot taken straight from the DuckDB file, so every case can check that nothing
  cached before it was lost;
* ``cli``: ``python -m engine`` run in-process (``engine.cli.main.main``) with the file descriptors
  captured; ``run_cli`` runs it as a real process; ``unprivileged`` makes file permissions apply
  even when the tests run as root (``setpriv`` drops CAP_DAC_OVERRIDE);
* ``bad_model``: broken copies of the bundled model (missing, unreadable, not a model, unsupported
  architecture, remote code, truncated safetensors, pickle-only), the last two armed with code
  that would leave a marker file if it ever ran;
* ``rel_server``: one dashboard started like ``make run`` minus the explicit address (so the
  ``.streamlit/config.toml`` default is what binds), with a computation trace and secret canaries
  in its environment.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest

from tests.e2e.conftest import _free_port, streamlit_server

REPO = Path(__file__).resolve().parents[2]
ORGANISM = REPO / "models" / "organism"
PAGES = REPO / "pages"
# the small prompt set every seeded page uses (8 addition prompts)
SMALL_SET: dict[str, Any] = {"ops": ["add"], "families": "paper (Fig. 8, 32 templates)", "n": 8, "seed": 0}
SMALL_SET_ARGS = ("--op", "add", "--n", "8", "--seed", "0", "--families", "paper")
# canaries put in the environment where secrets live: they must never reach a cache, a log or a page
CANARY = f"canary-{uuid.uuid4().hex}"
SECRET_ENV = {"NDIF_API_KEY": CANARY, "HF_TOKEN": CANARY}


# ---------------------------------------------------------------------------------------------
# the cache: seeding and snapshots
# ---------------------------------------------------------------------------------------------

def snapshot(db: Path) -> dict[str, tuple]:
    """Every run in the DuckDB file (read directly, not through the cache package): run_id ->
    (method, fingerprint, schema version, sorted rows, sorted artifacts)."""
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for run_id, method, fp, sv in con.execute(
                "SELECT run_id, method, model_fingerprint, schema_version FROM runs").fetchall():
            rows = con.execute("SELECT layer, head, label, metric, value FROM results WHERE run_id = ? "
                               "ORDER BY ALL", [run_id]).fetchall()
            arts = con.execute("SELECT name, json FROM artifacts WHERE run_id = ? ORDER BY ALL", [run_id]).fetchall()
            out[run_id] = (method, fp, sv, tuple(rows), tuple(arts))
        return out
    finally:
        con.close()


def orphan_rows(db: Path) -> int:
    """Result/artifact rows whose run is not in ``runs`` (a partial write would leave some)."""
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        return sum(con.execute(f"SELECT count(*) FROM {t} WHERE run_id NOT IN (SELECT run_id FROM runs)").fetchone()[0]
                   for t in ("results", "artifacts"))
    finally:
        con.close()


def run_page(name: str, *, prompt_set: dict[str, Any] | None = None, model: str | None = None,
             prompt: str | None = None, timeout: float = 300):
    """Run one page (``app.py`` or ``pages/<name>``) once with AppTest and return it."""
    from streamlit.testing.v1 import AppTest
    path = REPO / name if name == "app.py" else PAGES / name
    at = AppTest.from_file(str(path), default_timeout=timeout)
    at.session_state["prompt_set"] = dict(prompt_set or SMALL_SET)
    if model is not None:
        from ui.session import ModelChoice
        at.session_state["model_choice"] = ModelChoice(spec=model)
    if prompt is not None:  # the app's typed prompt (ui.state), which every page analyses
        at.session_state["prompt"] = prompt
    return at.run()


def texts(at, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def n_charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


SEED_PAGES = ("4_Path_patching.py", "5_MLP_projections.py", "6_Knockout.py")


@pytest.fixture(scope="session")
def seed_template(tmp_path_factory) -> Path:
    """A cache file filled by the real pages on SMALL_SET (prompt filter, path patching, attention
    roles, MLP projections, knockout curve)."""
    db = tmp_path_factory.mktemp("seed") / "results.duckdb"
    old = os.environ.get("ARITHLAB_CACHE")
    os.environ["ARITHLAB_CACHE"] = str(db)
    try:
        for name in SEED_PAGES:
            at = run_page(name)
            if name == "6_Knockout.py":  # the Fig. 3 curve is computed when asked
                at = at.button(key="knockout_curve_go").click().run()
            assert not at.exception and not at.error, (name, texts(at, "exception"), texts(at, "error"))
    finally:
        if old is None:
            os.environ.pop("ARITHLAB_CACHE", None)
        else:
            os.environ["ARITHLAB_CACHE"] = old
    assert len(snapshot(db)) >= 5
    return db


@dataclass
class Seeded:
    path: Path
    baseline: dict[str, tuple]

    def assert_intact(self, db: Path | None = None) -> None:
        """Every run cached before the case is still there, row for row."""
        now = snapshot(db or self.path)
        lost = [r for r, v in self.baseline.items() if now.get(r) != v]
        assert not lost, f"{len(lost)} cached run(s) lost or changed: {[self.baseline[r][0] for r in lost]}"
        assert orphan_rows(db or self.path) == 0


@pytest.fixture()
def seeded_cache(seed_template, tmp_path, monkeypatch) -> Seeded:
    db = tmp_path / "cache" / "results.duckdb"
    db.parent.mkdir()
    shutil.copy2(seed_template, db)
    monkeypatch.setenv("ARITHLAB_CACHE", str(db))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return Seeded(db, snapshot(db))


# ---------------------------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------------------------

@dataclass
class CliResult:
    rc: int
    out: str
    err: str

    def error_line(self) -> str:
        """The one stderr line of a failed command (asserting the CLI contract on the way)."""
        lines = [x for x in self.err.splitlines() if x.strip()]
        assert "Traceback" not in self.err + self.out, self.err[-2000:]
        assert self.rc == 2, (self.rc, self.err[-1000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), self.err[-2000:]
        return lines[0]


@pytest.fixture()
def cli(capfd):
    """Run ``python -m engine ARGS`` in this process; fd-level capture sees whatever a real process
    would print (logging, warnings, C libraries included)."""
    from engine.cli.main import main

    def run(*argv: str) -> CliResult:
        capfd.readouterr()
        rc = main(list(argv))
        out, err = capfd.readouterr()
        return CliResult(rc, out, err)
    return run


def cli_env(cache: Path | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    if cache is not None:
        env["ARITHLAB_CACHE"] = str(cache)
    return env


def unprivileged(cmd: Sequence[str]) -> list[str]:
    """``cmd`` with file permissions enforced: as root, run it without CAP_DAC_OVERRIDE (setpriv)."""
    if os.geteuid() != 0:
        return list(cmd)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("running as root without util-linux setpriv: cannot make file permissions apply")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", *cmd]


class Started:
    """A started process whose output is collected by :meth:`result` (several run side by side)."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(list(cmd), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def result(self, timeout: int = 600) -> CliResult:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"timed out after {timeout} s: {err[-2000:]}") from None
        return CliResult(self.proc.returncode, out, err)


def start_cli(*args: str, cache: Path | None, env: dict[str, str] | None = None,
              enforce_permissions: bool = False) -> Started:
    """``python -m engine ARGS`` as a real process, started (collect with ``.result()``)."""
    cmd = [sys.executable, "-m", "engine", *args]
    return Started(unprivileged(cmd) if enforce_permissions else cmd, env or cli_env(cache))


def run_cli(*args: str, cache: Path | None, env: dict[str, str] | None = None, timeout: int = 300,
            enforce_permissions: bool = False) -> CliResult:
    """``python -m engine ARGS`` as a real process."""
    return start_cli(*args, cache=cache, env=env, enforce_permissions=enforce_permissions).result(timeout)


def start_pages_unprivileged(scenarios: list[dict[str, Any]]) -> Started:
    """Page scenarios (see page_runner.py) in a process where file permissions apply; collect the
    per-scenario dicts with :func:`page_results`."""
    cmd = [sys.executable, str(Path(__file__).with_name("page_runner.py")), json.dumps(scenarios)]
    return Started(unprivileged(cmd), cli_env(None))


def page_results(started: Started) -> list[dict[str, Any]]:
    r = started.result()
    assert r.rc == 0, r.err[-3000:]
    return json.loads(r.out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# broken models
# ---------------------------------------------------------------------------------------------

class _OpenOnUnpickle:
    """Unpickling this object calls open(path, "w"): a harmless stand-in for code a pickle runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def write_malicious_pickle(path: Path, marker: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"model.embed_tokens.weight": _OpenOnUnpickle(str(marker))}, f)


def _edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# kind -> phrase the user must see
BAD_MODELS: dict[str, str] = {
    "missing": "does not exist",
    "not_a_model": "not a Hugging Face model directory",
    "unsupported_architecture": "unsupported architecture",
    "remote_code": "remote code",
    "truncated_safetensors": "truncated",
    "pickle_only": "pickle",
}


def make_bad_model(kind: str, root: Path) -> tuple[Path, Path]:
    """(model path, marker file that must never appear) for one kind of broken model."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"{kind}.code-ran"
    path = root / kind
    if kind == "missing":
        return path, marker
    if kind == "not_a_model":
        path.mkdir()
        (path / "notes.txt").write_text("lecture notes, not a model\n")
        return path, marker
    shutil.copytree(ORGANISM, path)
    if kind == "unsupported_architecture":
        _edit_json(path / "config.json", model_type="frobnicator", architectures=["FrobnicatorForCausalLM"])
    elif kind == "remote_code":
        (path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('remote code ran')\n")
        _edit_json(path / "config.json", auto_map={"AutoConfig": "modeling_evil.EvilConfig",
                                                   "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    elif kind == "remote_code_tokenizer":
        (path / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').write('remote code ran')\n")
        _edit_json(path / "tokenizer_config.json",
                   auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    elif kind == "truncated_safetensors":
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "pickle_only":
        (path / "model.safetensors").unlink()
        write_malicious_pickle(path / "pytorch_model.bin", marker)
    else:
        raise ValueError(kind)
    return path, marker


# ---------------------------------------------------------------------------------------------
# a live dashboard for the browser cases
# ---------------------------------------------------------------------------------------------

@dataclass
class RelServer:
    url: str
    port: int
    pid: int
    cache: Path
    trace: Path
    log: Path

    def trace_events(self) -> list[dict[str, Any]]:
        if not self.trace.exists():
            return []
        return [json.loads(x) for x in self.trace.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="session")
def rel_server(tmp_path_factory):
    """The dashboard as `streamlit run app.py --server.port P` with no address flag (the repo's
    .streamlit/config.toml decides where it binds), a fresh cache, ARITHLAB_TRACE and canaries."""
    d = tmp_path_factory.mktemp("rel-server")
    cache, trace, log = d / "results.duckdb", d / "trace.jsonl", d / "server.log"
    env = dict(os.environ, ARITHLAB_CACHE=str(cache), ARITHLAB_TRACE=str(trace), HF_HUB_OFFLINE="1",
               **SECRET_ENV)
    port = _free_port()
    with streamlit_server(env, port=port, log=log, args=()) as (url, proc):
        yield RelServer(url, port, proc.pid, cache, trace, log)
