"""Security defaults: loopback-only server, no pickle, no remote code, typed model paths checked
before anything is loaded, no secrets in the cache, the logs or the pages."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import WAIT, ask_all, goto, idle
from tests.reliability.conftest import (
    CANARY,
    ORGANISM,
    REPO,
    SECRET_ENV,
    SMALL_SET_ARGS,
    cli_env,
    make_bad_model,
    run_page,
    start_cli,
    texts,
    write_malicious_pickle,
)

SOURCE_DIRS = ("engine", "cache", "ui", "views", "pages", "bench")


# ---------------------------------------------------------------------------------------------
# the server binds 127.0.0.1 unless told otherwise
# ---------------------------------------------------------------------------------------------

def _listeners(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                out.append(addr)
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc prints them


def test_server_binds_loopback_by_default(rel_server):
    """rel_server runs `streamlit run app.py` with no address flag: the repo's .streamlit/config.toml
    decides, and every listening socket is on the loopback interface."""
    found = _listeners(rel_server.port)
    assert found, "the dashboard is not listening"
    assert set(found) <= LOOPBACK, f"listening on non-loopback addresses {found}"
    try:  # and it cannot be reached through the machine's own network address (when it has one)
        other = socket.gethostbyname(socket.gethostname())
    except OSError:
        other = None
    if other and not other.startswith("127."):
        with socket.socket() as s:
            s.settimeout(3)
            assert s.connect_ex((other, rel_server.port)) != 0


def test_make_run_binds_loopback_unless_told_otherwise():
    default = subprocess.run(["make", "-n", "run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    told = subprocess.run(["make", "-n", "run", "HOST=0.0.0.0"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert default.returncode == 0 and told.returncode == 0, default.stderr + told.stderr
    [cmd] = [x for x in default.stdout.splitlines() if "ui.serve app.py" in x]
    assert "--server.address 127.0.0.1" in cmd
    assert "--server.address 0.0.0.0" in [x for x in told.stdout.splitlines() if "ui.serve app.py" in x][0]


# ---------------------------------------------------------------------------------------------
# no pickle, no remote code: the source, then the loaders at work
# ---------------------------------------------------------------------------------------------

def _source_files() -> list[Path]:
    files = [REPO / "app.py"]
    for d in SOURCE_DIRS:
        files += sorted((REPO / d).rglob("*.py"))
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


PICKLE_CALLS = {"pickle.load", "pickle.loads", "pickle.Unpickler", "cPickle.load", "cPickle.loads", "dill.load",
                "dill.loads", "joblib.load", "pd.read_pickle", "pandas.read_pickle", "cloudpickle.load",
                "cloudpickle.loads", "torch.serialization.load"}


def _violations(tree: ast.AST) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            kw = {k.arg: k.value for k in node.keywords}
            if name in PICKLE_CALLS:
                bad.append(f"{name}() at line {node.lineno}")
            if name.endswith("torch.load"):
                wo = kw.get("weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    bad.append(f"torch.load without weights_only=True at line {node.lineno}")
            if name.endswith(("np.load", "numpy.load")) and isinstance(kw.get("allow_pickle"), ast.Constant) \
                    and kw["allow_pickle"].value is True:
                bad.append(f"{name}(allow_pickle=True) at line {node.lineno}")
            trc = kw.get("trust_remote_code")
            if "trust_remote_code" in kw and not (isinstance(trc, ast.Constant) and trc.value is False):
                bad.append(f"trust_remote_code not False at line {node.lineno}")
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "trust_remote_code" and not (
                        isinstance(v, ast.Constant) and v.value is False):
                    bad.append(f"trust_remote_code not False in a dict at line {node.lineno}")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value == "trust_remote_code" and isinstance(getattr(node, "ctx", None), ast.Store):
            bad.append(f"trust_remote_code assigned at line {node.lineno}")
    return bad


def test_source_has_no_pickle_loads_and_no_remote_code():
    """Every .py of app.py, engine/, cache/, ui/, pages/, bench/: no pickle-based load
    (torch.load only with weights_only=True), trust_remote_code only ever literally False."""
    files = _source_files()
    assert len(files) > 30
    bad = {str(f.relative_to(REPO)): v for f in files if (v := _violations(ast.parse(f.read_text(), str(f))))}
    assert not bad, bad
    # the scan is not blind: it flags each pattern it looks for
    probe = ast.parse("import torch, pickle\ntorch.load(f)\npickle.loads(b)\nm(trust_remote_code=True)\n"
                      "kw = {'trust_remote_code': flag}\ntorch.load(f, weights_only=True)\n")
    assert len(_violations(probe)) == 4


def test_pickle_weights_are_never_unpickled(tmp_path, cli, monkeypatch):
    """A model directory holding safetensors *and* a pytorch_model.bin whose unpickling would create a
    file: both loaders (analysis and fine-tuning) read the safetensors and never touch the pickle."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    model = tmp_path / "both"
    shutil.copytree(ORGANISM, model)
    marker = tmp_path / "pickle.code-ran"
    write_malicious_pickle(model / "pytorch_model.bin", marker)
    with open(model / "pytorch_model.bin", "rb") as f:  # control: unpickling it does run code
        pickle.load(f)["model.embed_tokens.weight"].close()
    assert marker.exists()
    marker.unlink()
    r = cli("info", "--model", str(model))
    assert r.rc == 0, r.err
    organism = json.loads(cli("info").out)
    assert json.loads(r.out)["fingerprint"] == organism["fingerprint"]  # the safetensors weights
    from engine.models.load import load_plain
    load_plain(str(model), device="cpu")
    assert not marker.exists()
    only_pickle, marker2 = make_bad_model("pickle_only", tmp_path / "p")
    assert "pickle" in cli("info", "--model", str(only_pickle)).error_line()
    assert not marker2.exists()


@pytest.mark.parametrize("where", ["remote_code", "remote_code_tokenizer"])
def test_remote_code_is_never_run(where, tmp_path, cli, monkeypatch):
    """auto_map in config.json or tokenizer_config.json (custom code shipped with the model, whose
    import would create a file): refused by the CLI, the pages and the fine-tuning loader."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    model, marker = make_bad_model(where, tmp_path / "m")
    assert "remote code" in cli("info", "--model", str(model)).error_line()
    at = run_page("app.py", model=str(model))
    assert not at.exception and any("remote code" in e for e in texts(at, "error"))
    from engine.models.load import load_plain
    from engine.models.spec import ModelLoadError
    with pytest.raises(ModelLoadError, match="remote code"):
        load_plain(str(model), device="cpu")
    assert not marker.exists()


HOSTILE_SPECS = ["/etc/passwd", "/dev/null", "/proc/self", "../../../../etc", "a\x00b", "x" * 5000,
                 "some-org/not-cached-model", "organism/../../etc"]


def test_typed_model_paths_are_checked_before_use(tmp_path, monkeypatch):
    """Whatever is typed in the sidebar's Model box is checked (exists, is a model directory or a
    .gguf file, safetensors only, no remote code, complete weights) before transformers loads
    anything: for hostile paths and broken models no tokenizer or weights loader is ever called."""
    import transformers
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    calls: list[str] = []
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        original = cls.from_pretrained

        def recorder(target, *args, _original=original, _name=cls.__name__, **kwargs):
            calls.append(f"{_name}({target})")
            return _original(target, *args, **kwargs)
        monkeypatch.setattr(cls, "from_pretrained", recorder)
    broken = [str(make_bad_model(k, tmp_path / "bad")[0]) for k in
              ("not_a_model", "pickle_only", "remote_code", "truncated_safetensors")]
    for spec in HOSTILE_SPECS + broken:
        at = run_page("app.py", model=spec)
        assert not at.exception, (spec[:40], texts(at, "exception"))
        errs = texts(at, "error")
        assert len(errs) == 1 and errs[0].startswith("Cannot load model"), (spec[:40], errs)
    assert calls == []
    good = tmp_path / "good"
    shutil.copytree(ORGANISM, good)
    at = run_page("app.py", model=str(good))  # control: a real model does get loaded
    assert not at.exception and not at.error, texts(at, "error")
    assert any(c.startswith("AutoModelForCausalLM(") for c in calls)


# ---------------------------------------------------------------------------------------------
# no secrets in the cache, the logs or the pages
# ---------------------------------------------------------------------------------------------

def _files_holding(needle: str, paths) -> list[str]:
    hits = []
    for p in paths:
        p = Path(p)
        for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else []):
            if needle.encode() in f.read_bytes():
                hits.append(str(f))
    return hits


def test_no_secrets_in_cache_logs_or_pages(rel_server, browser, tmp_path):
    """NDIF_API_KEY and HF_TOKEN hold a canary in the CLI's and the dashboard's environment; after
    real work the canary is in no cache file, trace, log, output file or page."""
    # the CLI: a sweep with the canary in its environment (runs while the browser works)
    d = tmp_path / "cli"
    d.mkdir()
    sweep = start_cli("patch", *SMALL_SET_ARGS, "--out", str(d / "e.csv"), cache=None,
                      env=cli_env(d / "results.duckdb", ARITHLAB_TRACE=str(d / "trace.jsonl"), **SECRET_ENV))
    # the dashboard: the canary is really in the server's environment ...
    assert CANARY.encode() in Path(f"/proc/{rel_server.pid}/environ").read_bytes()
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        pg = ctx.new_page()
        bodies = []
        for path, marker in (("", "Arithmetic accuracy"), ("Path_patching", "Key heads")):
            goto(pg, rel_server.url, path)
            ask_all(pg)  # on a busy machine the page asks before computing
            pg.get_by_text(marker).first.wait_for(timeout=WAIT)
            idle(pg)
            bodies.append(pg.content())
    finally:
        ctx.close()
    # ... and in none of its outputs
    assert all(CANARY not in b for b in bodies)
    assert rel_server.cache.exists() and rel_server.log.exists()
    assert _files_holding(CANARY, [rel_server.cache.parent]) == []  # cache, WAL, lock, trace, server log
    assert os.environ.get("NDIF_API_KEY") != CANARY  # the canary never leaked into this process either
    r = sweep.result()
    assert r.rc == 0, r.err
    assert CANARY not in r.out + r.err
    assert (d / "results.duckdb").exists() and (d / "e.csv").exists() and (d / "trace.jsonl").exists()
    assert _files_holding(CANARY, [d]) == []
