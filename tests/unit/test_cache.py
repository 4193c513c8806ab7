"""Unit tests of the DuckDB result cache (``cache/``).

Covers key canonicality, round trips, upsert, schema versioning, crash
safety (SIGKILL mid-write), multi-process concurrency, compute-once,
corrupt-file recovery, read-only locations, disk-full handling and lock
timeouts.  Multi-process helpers are module-level so that the 'spawn'
start method can import them.
"""

from __future__ import annotations

import errno
import fcntl
import math
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import cache
import cache.bulk
import cache.connection
from cache import (
    SCHEMA_VERSION,
    CacheBusyError,
    CachedRun,
    CacheError,
    CacheWriteError,
    ResultCache,
    ResultRow,
    canonical_json,
    hash_prompt_set,
    make_key,
    rows_as_records,
)

REPO_ROOT = Path(cache.__file__).resolve().parent.parent
META: dict[str, Any] = {"model_fingerprint": "fp-tiny", "prompt_set_hash": "ps-1", "method": "patching"}
SPAWN = mp.get_context("spawn")


# --------------------------------------------------------------------- helpers
def make_rows(n: int, tag: str = "op") -> list[ResultRow]:
    """Deterministic rows with NULLs in every nullable column."""
    return [
        ResultRow(
            layer=None if i % 7 == 0 else i % 12,
            head=None if i % 5 == 0 else i % 8,
            label=None if i % 3 == 0 else f"{tag}{i % 4}",
            metric="acc" if i % 2 else "logit_diff",
            value=i / 3.0,
        )
        for i in range(n)
    ]


def put_run(c: ResultCache, run_id: str, rows: list[ResultRow], **extra: Any) -> CachedRun:
    return c.put(run_id, **META, params={"run": run_id}, rows=rows, **extra)


def rows_equal(a: list[ResultRow], b: list[ResultRow]) -> bool:
    return len(a) == len(b) and all(x.same_as(y) for x, y in zip(a, b, strict=True))


def run_python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``python -c code`` with the repo importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "results.duckdb"


@pytest.fixture(params=[True, False], ids=["arrow", "unnest"])
def bulk_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    monkeypatch.setattr(cache.bulk, "USE_ARROW", request.param)
    monkeypatch.setattr(cache.bulk, "CHUNK_ROWS", 1000)  # force several chunks
    yield request.param


# ------------------------------------------------------------------------ keys
def test_canonical_json_is_sorted_compact_ascii() -> None:
    assert canonical_json({"b": 1, "a": [1, 2.5, None, True], "c": "é"}) == (
        '{"a":[1,2.5,null,true],"b":1,"c":"\\u00e9"}'
    )
    assert canonical_json((1, 2)) == canonical_json([1, 2])


def test_make_key_ignores_dict_order_and_tracks_every_field() -> None:
    base = make_key("fp", "ps", "m", {"a": 1, "b": {"x": 1, "y": 2}})
    assert base == make_key("fp", "ps", "m", {"b": {"y": 2, "x": 1}, "a": 1})
    assert len(base) == 64 and int(base, 16) >= 0
    variants = {
        base,
        make_key("fp", "ps", "m", {"a": 2, "b": {"x": 1, "y": 2}}),
        make_key("fp2", "ps", "m", {"a": 1, "b": {"x": 1, "y": 2}}),
        make_key("fp", "ps2", "m", {"a": 1, "b": {"x": 1, "y": 2}}),
        make_key("fp", "ps", "m2", {"a": 1, "b": {"x": 1, "y": 2}}),
        make_key("fp", "ps", "m", {"a": 1, "b": {"x": 1, "y": 2}}, schema_version=SCHEMA_VERSION + 1),
    }
    assert len(variants) == 6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_canonical_json_rejects_non_finite_floats(bad: float) -> None:
    with pytest.raises(ValueError, match=r"non-finite float .* at \$\['params'\]\['lr'\]"):
        canonical_json({"params": {"lr": bad}})
    with pytest.raises(ValueError, match="non-finite"):
        make_key("fp", "ps", "m", {"lr": bad})


@pytest.mark.parametrize(
    ("bad", "needle"),
    [({1, 2}, "set"), (object(), "object"), ({1: "x"}, "dict key 1"), (b"x", "bytes")],
)
def test_canonical_json_rejects_non_json_types(bad: object, needle: str) -> None:
    with pytest.raises(TypeError, match=needle):
        canonical_json({"v": bad})


def test_make_key_validates_arguments() -> None:
    with pytest.raises(TypeError, match="params must be a Mapping"):
        make_key("fp", "ps", "m", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method must not be empty"):
        make_key("fp", "ps", "", {})


def test_hash_prompt_set() -> None:
    items = [{"a": 1, "b": 2, "text": "1+1="}, {"a": 3, "b": 4, "text": "3+4="}]
    reordered_keys = [{"text": "1+1=", "b": 2, "a": 1}, {"b": 4, "a": 3, "text": "3+4="}]
    assert hash_prompt_set(items) == hash_prompt_set(iter(reordered_keys))
    assert hash_prompt_set(items) != hash_prompt_set(list(reversed(items)))
    with pytest.raises(TypeError, match="item 1"):
        hash_prompt_set([{"a": 1}, "nope"])  # type: ignore[list-item]


# ----------------------------------------------------------------------- paths
def test_path_from_env_var_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "deep" / "dir" / "c.duckdb"
    monkeypatch.setenv("ARITHLAB_CACHE", str(target))
    c = ResultCache()
    assert c.path == target
    put_run(c, "r", make_rows(3))
    assert target.exists() and c.lock_path.exists()
    monkeypatch.delenv("ARITHLAB_CACHE")
    assert ResultCache().path == REPO_ROOT / ".cache" / "results.duckdb"


# ------------------------------------------------------------------ round trip
def test_round_trip_rows_and_artifacts(db: Path, bulk_path: bool) -> None:
    special = [0.1, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308, float("nan"), float("inf"), -float("inf")]
    rows = make_rows(3500) + [ResultRow(None, None, None, "special", v) for v in special]
    rows.append(ResultRow(layer=-(2**31), head=2**31 - 1, label="ünï\"'", metric="m", value=1))
    artifacts = {"model": {"n_layers": 12, "d_model": 768, "name": "tiny"}, "prompts": [["1+1=", 2]], "none": None}
    c = ResultCache(db)
    stored = put_run(c, "run-1", rows, artifacts=artifacts)
    got = c.get("run-1")
    assert got is not None
    assert rows_equal(got.rows, rows)
    assert math.copysign(1.0, got.rows[3500 + 2].value) == -1.0  # -0.0 kept
    assert got.artifacts == {"model": artifacts["model"], "prompts": [["1+1=", 2]], "none": None}
    assert got.params == {"run": "run-1"} and got.method == "patching"
    assert got.model_fingerprint == "fp-tiny" and got.prompt_set_hash == "ps-1"
    assert got.created_at.tzinfo is not None and got.created_at == stored.created_at
    assert rows_equal(stored.rows, got.rows) and stored.artifacts == got.artifacts
    assert c.get("missing") is None


def test_rows_accept_mappings_and_records_helper(db: Path) -> None:
    c = ResultCache(db)
    rows = [{"metric": "acc", "value": 1}, {"layer": 2, "head": 1, "metric": "x", "value": 0.5}]
    c.put("m", **META, params={}, rows=rows)
    got = c.get("m")
    assert got is not None
    assert (
        rows_as_records(got)
        == got.records()
        == [
            {"layer": None, "head": None, "label": None, "metric": "acc", "value": 1.0},
            {"layer": 2, "head": 1, "label": None, "metric": "x", "value": 0.5},
        ]
    )


@pytest.mark.parametrize(
    ("rows", "exc", "needle"),
    [
        ([{"metric": "a"}], ValueError, "row 0"),
        ([ResultRow(1, 1, None, "a", 1.0), {"metric": "a", "value": "x"}], TypeError, "row 1"),
        ([{"metric": "a", "value": 1, "layer": True}], TypeError, "layer"),
        ([{"metric": "a", "value": 1, "head": 2**31}], ValueError, "32-bit"),
    ],
)
def test_invalid_rows_rejected_before_writing(db: Path, rows: list[Any], exc: type[Exception], needle: str) -> None:
    c = ResultCache(db)
    with pytest.raises(exc, match=needle):
        c.put("bad", **META, params={}, rows=rows)
    with pytest.raises(ValueError, match=r"artifact 'a'.*non-finite"):
        c.put("bad", **META, params={}, rows=[], artifacts={"a": {"x": float("nan")}})
    assert c.get("bad") is None


def test_upsert_replaces_whole_run(db: Path) -> None:
    c = ResultCache(db)
    put_run(c, "keep", make_rows(10, "k"), artifacts={"a": 1})
    put_run(c, "r", make_rows(500, "old"), artifacts={"a": 1, "b": 2})
    c.put("r", **META, params={"v": 2}, rows=make_rows(20, "new"), artifacts={"c": 3})
    got = c.get("r")
    assert got is not None
    assert rows_equal(got.rows, make_rows(20, "new"))
    assert got.artifacts == {"c": 3} and got.params == {"v": 2}
    kept = c.get("keep")
    assert kept is not None and rows_equal(kept.rows, make_rows(10, "k"))
    assert [s.run_id for s in c.list_runs()] == ["r", "keep"]


def test_list_runs_and_delete(db: Path) -> None:
    c = ResultCache(db)
    assert c.list_runs() == [] and c.delete("nothing") is False
    put_run(c, "a", make_rows(4))
    c.put("b", **{**META, "method": "probe"}, params={}, rows=make_rows(6))
    summaries = {s.run_id: s for s in c.list_runs()}
    assert summaries["a"].n_rows == 4 and summaries["b"].method == "probe"
    assert [s.run_id for s in c.list_runs(method="probe")] == ["b"]
    assert c.delete("a") is True and c.delete("a") is False
    assert c.get("a") is None and c.get("b") is not None
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM results WHERE run_id = 'a'").fetchone() == (0,)


def test_schema_version_bump_ignores_old_rows(db: Path) -> None:
    old = ResultCache(db)
    put_run(old, "r", make_rows(5))
    new = ResultCache(db, schema_version=SCHEMA_VERSION + 1)
    assert new.get("r") is None and new.list_runs() == []
    run, computed = new.get_or_compute("r", lambda: (make_rows(7), None), **META, params={})
    assert computed and len(run.rows) == 7
    assert new.get("r") is not None and old.get("r") is None  # the upsert replaced the stale run
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION + 1),
        )


# -------------------------------------------------------------- get_or_compute
def test_get_or_compute_in_process(db: Path) -> None:
    c = ResultCache(db)
    calls: list[int] = []

    def compute() -> tuple[list[ResultRow], dict[str, Any]]:
        calls.append(1)
        return make_rows(30), {"facts": {"n": 1}}

    first, computed1 = c.get_or_compute("k", compute, **META, params={})
    second, computed2 = c.get_or_compute("k", compute, **META, params={})
    assert (computed1, computed2) == (True, False) and len(calls) == 1
    assert rows_equal(first.rows, second.rows) and first.artifacts == second.artifacts
    assert (db.parent / "results.duckdb.keys" / "k.lock").exists()
    with pytest.raises(TypeError, match=r"tuple \(rows, artifacts\)"):
        c.get_or_compute("k2", lambda: make_rows(1), **META, params={})  # type: ignore[arg-type,return-value]


def _compute_once_worker(db: str, marker: str, barrier: Any, out: Any) -> None:
    def compute() -> tuple[list[ResultRow], dict[str, Any]]:
        time.sleep(1.0)
        with open(marker, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")
        return make_rows(200), {"who": os.getpid()}

    try:  # a failure in the child reaches the test as its message, not as an empty queue
        c = ResultCache(db)
        barrier.wait(timeout=300)  # a spawned child may take long to start on a loaded 2-core machine
        run, computed = c.get_or_compute("same-key", compute, **META, params={"p": 1})
        out.put((computed, [r.as_record() for r in run.rows], run.artifacts))
    except BaseException as exc:
        out.put(("failed", repr(exc), None))


def test_compute_once_across_processes(db: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    barrier = SPAWN.Barrier(2)
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_compute_once_worker, args=(str(db), str(marker), barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results: list = []
    deadline = time.monotonic() + 600  # a spawned child may take long to start on a loaded 2-core machine
    while len(results) < len(procs) and time.monotonic() < deadline:
        try:
            results.append(out.get(timeout=5))
        except queue.Empty:  # a child that died before its target ran puts nothing: say so, do not wait
            dead = [p.exitcode for p in procs if not p.is_alive()]
            assert len(dead) < len(procs) or not out.empty() or len(results) == len(procs), \
                f"the children exited ({dead}) without a result: did one fail to start?"
    assert len(results) == len(procs) and not [r for r in results if r[0] == "failed"], results
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(marker.read_text().splitlines()) == 1
    assert sorted(r[0] for r in results) == [False, True]
    assert results[0][1] == results[1][1] == rows_as_records(make_rows(200))
    assert results[0][2] == results[1][2]


# ----------------------------------------------------------------- concurrency
def _concurrency_worker(db: str, worker: int, n_ops: int) -> list[str]:
    c = ResultCache(db, timeout=30)
    written: list[str] = []
    for i in range(n_ops):
        key = f"w{worker}-{i}" if i % 2 == 0 else f"shared-{i % 3}"
        n_rows = 50 + 10 * worker
        c.put(key, **META, params={"k": key}, rows=make_rows(n_rows, f"w{worker}_"), artifacts={"writer": worker})
        written.append(key)
        other = f"shared-{(i + worker) % 3}" if i % 2 == 0 else f"w{(worker + 1) % 4}-{i - 1}"
        for probe in (key, other):
            got = c.get(probe)
            if probe == key and got is None:
                raise AssertionError(f"{key} vanished right after put")
            if got is not None:  # a complete, self-consistent run from one writer
                writer = got.artifacts["writer"]
                if not rows_equal(got.rows, make_rows(50 + 10 * writer, f"w{writer}_")):
                    raise AssertionError(f"{probe}: rows do not match writer {writer}")
    return written


def test_concurrent_processes(db: Path) -> None:
    with SPAWN.Pool(4) as pool:
        results = pool.starmap(_concurrency_worker, [(str(db), w, 20) for w in range(4)])
    expected = {key for keys in results for key in keys}
    assert len(expected) == 4 * 10 + 3
    c = ResultCache(db)
    assert {s.run_id for s in c.list_runs()} == expected
    assert all(c.get(k) is not None for k in expected)


def test_threads_share_one_cache(db: Path) -> None:
    import threading

    c = ResultCache(db)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(8):
                key = f"t{t}-{i}" if i % 2 else "shared"
                c.put(key, **META, params={}, rows=make_rows(20 + t), artifacts={"writer": t})
                got = c.get(key)
                if got is None or not rows_equal(got.rows, make_rows(20 + got.artifacts["writer"])):
                    raise AssertionError(f"bad read of {key}")
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []
    assert len(c.list_runs()) == 4 * 4 + 1


def _forked_child(db: str) -> None:
    c = ResultCache(db)
    if c.get("parent") is None:
        raise SystemExit(3)
    put_run(c, "child", make_rows(5))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_usable_after_fork(db: Path) -> None:
    c = ResultCache(db)
    put_run(c, "parent", make_rows(5))  # the parent's in-memory DuckDB instance now exists
    child = mp.get_context("fork").Process(target=_forked_child, args=(str(db),))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert c.get("child") is not None


# ---------------------------------------------------------------- crash safety
_CRASH_CHILD = """
    import os, sys, time, pathlib
    import cache, cache.bulk as bulk
    from cache import ResultCache, ResultRow
    db, marker, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    rows = [ResultRow(i % 12, i % 8, "big", "m", float(i)) for i in range(200_000)]
    if mode == "pause":  # deterministic: stop after 3 of 10 chunks, inside the transaction
        bulk.CHUNK_ROWS = 20_000
        original, done = bulk._insert_chunk, []
        def slow(con, run_id, chunk):
            original(con, run_id, chunk)
            done.append(1)
            if len(done) == 3:
                marker.write_text("mid-write")
                time.sleep(60)
        bulk._insert_chunk = slow
    else:
        marker.write_text("starting")
    ResultCache(db).put("big", model_fingerprint="f", prompt_set_hash="p", method="m", params={}, rows=rows)
    marker.write_text("done")
"""


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()}")
        if time.monotonic() > end:
            raise AssertionError("child never reached the marker")
        time.sleep(0.01)


@pytest.mark.parametrize("mode, delay", [("pause", 0.0), ("timed", 0.15), ("timed", 0.6)])
def test_sigkill_mid_write_leaves_all_or_nothing(db: Path, tmp_path: Path, mode: str, delay: float) -> None:
    c = ResultCache(db)
    put_run(c, "before", make_rows(100))
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CRASH_CHILD), str(db), str(marker), mode],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(marker, proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    big = c.get("big")
    if mode == "pause":
        assert big is None
    else:  # killed at some unknown point: absent or complete, never partial
        assert big is None or len(big.rows) == 200_000
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT count(*) FROM runs WHERE run_id = 'big'").fetchone()
        rows = con.execute("SELECT count(*) FROM results WHERE run_id = 'big'").fetchone()
    assert (runs, rows) in {((0,), (0,)), ((1,), (200_000,))}
    before = c.get("before")
    assert before is not None and rows_equal(before.rows, make_rows(100))
    put_run(c, "after", make_rows(10))
    assert c.get("after") is not None


# ------------------------------------------------------------- corrupt files
def _write_truncated_db(db: Path) -> None:
    c = ResultCache(db)
    put_run(c, "x", make_rows(20_000))
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize("damage", ["random", "truncated", "empty"])
@pytest.mark.parametrize("first_op", ["get", "put"])
def test_corrupt_file_is_moved_aside(db: Path, damage: str, first_op: str) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    if damage == "random":
        db.write_bytes(os.urandom(64 * 1024))
    elif damage == "truncated":
        _write_truncated_db(db)
    else:
        db.write_bytes(b"")
    damaged = db.read_bytes()
    c = ResultCache(db)
    if first_op == "get":
        assert c.get("x") is None
    else:
        put_run(c, "new", make_rows(5))
    assert c.last_warning is not None and "moved aside" in c.last_warning
    aside = list(db.parent.glob("results.duckdb.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert str(aside[0]) in c.last_warning
    put_run(c, "fresh", make_rows(3))
    got = c.get("fresh")
    assert got is not None and len(got.rows) == 3
    assert c.clear_warning() is not None and c.last_warning is None


# ------------------------------------------------------- read-only and ENOSPC
def test_unwritable_location_simulated(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = ResultCache(db)
    put_run(c, "a", make_rows(8))
    real_connect = cache.connection.connect

    def read_only_fs(path: Path, *, read_only: bool) -> cache.connection.Attached:
        if not read_only:
            raise duckdb.IOException(f'IO Error: Cannot open file "{path}": Permission denied')
        return real_connect(path, read_only=read_only)

    monkeypatch.setattr(cache.connection, "connect", read_only_fs)
    with pytest.raises(CacheWriteError, match="ARITHLAB_CACHE") as info:
        put_run(c, "b", make_rows(3))
    assert str(db) in str(info.value) and isinstance(info.value, CacheError)
    got = c.get("a")
    assert got is not None and rows_equal(got.rows, make_rows(8))
    # get_or_compute still answers; the failure to cache becomes a warning
    run, computed = c.get_or_compute("b", lambda: (make_rows(2), None), **META, params={})
    assert computed and len(run.rows) == 2 and c.last_warning is not None and "not cached" in c.last_warning
    assert c.get("b") is None


def _permissions_enforced(tmp_path: Path) -> bool:
    """False for root with CAP_DAC_OVERRIDE (chmod cannot make anything read-only for it)."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0o444)
    try:
        with open(probe, "a", encoding="utf-8"):
            return False
    except PermissionError:
        return True
    finally:
        probe.chmod(0o644)


def test_unwritable_location_real_chmod(db: Path, tmp_path: Path) -> None:
    if not _permissions_enforced(tmp_path):
        pytest.skip("running as root with CAP_DAC_OVERRIDE: file permissions are not enforced")
    c = ResultCache(db)
    put_run(c, "a", make_rows(8))
    db.chmod(0o444)
    db.parent.chmod(0o555)
    try:
        with pytest.raises(CacheWriteError, match="ARITHLAB_CACHE"):
            put_run(c, "b", make_rows(3))
        got = c.get("a")
        assert got is not None and rows_equal(got.rows, make_rows(8))
    finally:
        db.parent.chmod(0o755)
        db.chmod(0o644)
    # A copy in a read-only directory that has no lock file yet: reads still work.
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    (ro_dir / "results.duckdb").write_bytes(db.read_bytes())
    ro_dir.chmod(0o555)
    try:
        ro = ResultCache(ro_dir / "results.duckdb")
        got = ro.get("a")
        assert got is not None and rows_equal(got.rows, make_rows(8))
        with pytest.raises(CacheWriteError, match="not writable"):
            put_run(ro, "b", make_rows(3))
        _, computed = ro.get_or_compute("c", lambda: (make_rows(1), None), **META, params={})
        assert computed and ro.last_warning is not None
    finally:
        ro_dir.chmod(0o755)


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        duckdb.IOException('IO Error: Could not write file "results.duckdb.wal": No space left on device'),
        duckdb.IOException("IO Error: unexpected failure writing block"),
    ],
    ids=["oserror-enospc", "duckdb-no-space", "duckdb-io"],
)
def test_disk_full_during_write(db: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    c = ResultCache(db)
    put_run(c, "old", make_rows(50, "v1"))
    put_run(c, "same", make_rows(40, "v1"))
    calls: list[int] = []

    def full_disk(con: duckdb.DuckDBPyConnection, run_id: str, chunk: Any) -> None:
        calls.append(1)
        raise error

    monkeypatch.setattr(cache.bulk, "_insert_chunk", full_disk)
    with pytest.raises(CacheWriteError, match="Results cached earlier are unaffected"):
        put_run(c, "new", make_rows(10))
    with pytest.raises(CacheWriteError):
        put_run(c, "same", make_rows(10, "v2"))  # a failed upsert keeps the old version
    assert calls
    monkeypatch.undo()
    assert c.get("new") is None
    same = c.get("same")
    assert same is not None and rows_equal(same.rows, make_rows(40, "v1"))
    old = c.get("old")
    assert old is not None and rows_equal(old.rows, make_rows(50, "v1"))
    put_run(c, "later", make_rows(5))
    assert c.get("later") is not None


# ----------------------------------------------------------------- busy locks
def test_lock_timeout_raises_cache_busy(db: Path) -> None:
    c = ResultCache(db, timeout=0.3)
    put_run(c, "a", make_rows(3))
    fd = os.open(c.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another "process" writing
        start = time.monotonic()
        with pytest.raises(CacheBusyError, match="timeout"):
            c.get("a")
        with pytest.raises(CacheBusyError):
            put_run(c, "b", make_rows(3))
        assert time.monotonic() - start < 5
        fcntl.flock(fd, fcntl.LOCK_SH)  # readers share, writers wait
        assert c.get("a") is not None
        with pytest.raises(CacheBusyError):
            put_run(c, "b", make_rows(3))
    finally:
        os.close(fd)
    put_run(c, "b", make_rows(3))


def test_foreign_duckdb_holder_is_retried(db: Path) -> None:
    put_run(ResultCache(db), "a", make_rows(3))
    holder = run_python(
        f"""
        import duckdb, time
        con = duckdb.connect({str(db)!r})  # ignores our flock, holds DuckDB's own lock
        print("held", flush=True)
        time.sleep(1.5)
        con.close()
        """
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheBusyError, match="stayed unavailable"):
            ResultCache(db, timeout=0.2).get("a")
        put_run(ResultCache(db, timeout=30), "b", make_rows(3))  # succeeds once the holder exits
    finally:
        holder.wait(timeout=30)
    assert ResultCache(db).get("b") is not None


def test_package_imports_neither_streamlit_nor_torch() -> None:
    proc = run_python(
        """
        import sys, cache
        print(sorted(m for m in ("torch", "streamlit", "pandas") if m in sys.modules))
        """
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "[]"
