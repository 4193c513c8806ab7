"""The SQL the cache runs, one small function per statement group.

All functions take an open connection and run inside whatever transaction
the caller (``database.CacheDatabase``) has started.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import duckdb

from . import bulk
from .models import CachedRun, ResultRow, RunSummary

__all__ = ["PreparedRun", "delete_run", "fetch_run", "fetch_summaries", "insert_run"]

logger = logging.getLogger("arithlab.cache")


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A fully validated and serialised run, ready to be written."""

    run_id: str
    model_fingerprint: str
    prompt_set_hash: str
    method: str
    params_json: str
    schema_version: int
    created_at: datetime  # naive UTC, as stored in the TIMESTAMP column
    rows: Sequence[ResultRow]
    artifacts_json: Mapping[str, str]

    def to_cached_run(self) -> CachedRun:
        """The :class:`CachedRun` a later ``get`` of this run returns."""
        return CachedRun(
            run_id=self.run_id,
            method=self.method,
            params=json.loads(self.params_json),
            rows=list(self.rows),
            artifacts={name: json.loads(text) for name, text in self.artifacts_json.items()},
            created_at=self.created_at.replace(tzinfo=timezone.utc),
            model_fingerprint=self.model_fingerprint,
            prompt_set_hash=self.prompt_set_hash,
            schema_version=self.schema_version,
        )


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def fetch_run(con: duckdb.DuckDBPyConnection, run_id: str, schema_version: int) -> CachedRun | None:
    """The run stored under *run_id* with *schema_version*, else ``None``."""
    head = con.execute(
        "SELECT method, params_json, model_fingerprint, prompt_set_hash, created_at "
        "FROM runs WHERE run_id = ? AND schema_version = ?",
        [run_id, schema_version],
    ).fetchone()
    if head is None:
        return None
    method, params_json, model_fingerprint, prompt_set_hash, created_at = head
    # DuckDB keeps insertion order for filtered scans (preserve_insertion_order).
    raw_rows = con.execute(
        "SELECT layer, head, label, metric, value FROM results WHERE run_id = ?", [run_id]
    ).fetchall()
    raw_artifacts = con.execute("SELECT name, json FROM artifacts WHERE run_id = ?", [run_id]).fetchall()
    try:
        params = json.loads(params_json)
        artifacts: dict[str, Any] = {name: json.loads(text) for name, text in raw_artifacts}
        rows = [ResultRow(*r) for r in raw_rows]
    except (TypeError, ValueError) as exc:
        logger.warning("cached run %s is unreadable (%s); treating it as a cache miss", run_id, exc)
        return None
    return CachedRun(
        run_id=run_id,
        method=method,
        params=params,
        rows=rows,
        artifacts=artifacts,
        created_at=_utc(created_at),
        model_fingerprint=model_fingerprint,
        prompt_set_hash=prompt_set_hash,
        schema_version=schema_version,
    )


def fetch_summaries(con: duckdb.DuckDBPyConnection, method: str | None, schema_version: int) -> list[RunSummary]:
    """Runs of the current schema version (optionally one method), newest first."""
    sql = (
        "SELECT r.run_id, r.method, r.params_json, r.model_fingerprint, r.prompt_set_hash, "
        "r.schema_version, r.created_at, "
        "(SELECT count(*) FROM results x WHERE x.run_id = r.run_id) AS n_rows "
        "FROM runs r WHERE r.schema_version = ?"
    )
    args: list[Any] = [schema_version]
    if method is not None:
        sql += " AND r.method = ?"
        args.append(method)
    sql += " ORDER BY r.created_at DESC, r.run_id"
    out: list[RunSummary] = []
    for run_id, meth, params_json, fp, psh, ver, created_at, n_rows in con.execute(sql, args).fetchall():
        try:
            params = json.loads(params_json)
        except (TypeError, ValueError):
            logger.warning("cached run %s has unreadable params; skipping it", run_id)
            continue
        out.append(RunSummary(run_id, meth, params, fp, psh, ver, _utc(created_at), int(n_rows)))
    return out


def delete_run(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    """Remove every trace of *run_id*; ``True`` if a ``runs`` row existed."""
    row = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()
    existed = bool(row and row[0])
    con.execute("DELETE FROM results WHERE run_id = ?", [run_id])
    con.execute("DELETE FROM artifacts WHERE run_id = ?", [run_id])
    con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])
    return existed


def insert_run(con: duckdb.DuckDBPyConnection, run: PreparedRun) -> None:
    """Replace *run.run_id* wholly with *run* (caller provides the transaction)."""
    delete_run(con, run.run_id)
    con.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            run.run_id,
            run.model_fingerprint,
            run.prompt_set_hash,
            run.method,
            run.params_json,
            run.schema_version,
            run.created_at,
        ],
    )
    bulk.insert_results(con, run.run_id, run.rows)
    if run.artifacts_json:
        con.executemany(
            "INSERT INTO artifacts VALUES (?, ?, ?)",
            [[run.run_id, name, text] for name, text in run.artifacts_json.items()],
        )
