"""Table layout of the cache database and the schema version.

Bump :data:`SCHEMA_VERSION` whenever the meaning or layout of cached results
changes: it is part of every cache key and stored with every run, and runs
written under another version are ignored (treated as cache misses).
"""

from __future__ import annotations

from typing import Final

import duckdb

__all__ = ["DDL", "SCHEMA_VERSION", "ensure_schema"]

#: Current schema version; stored in ``meta`` and in ``runs.schema_version``.
#: 2: ``results.label`` holds the canonical JSON of engine.results' codec (1: ad-hoc ``a|b`` labels).
SCHEMA_VERSION: Final[int] = 2

DDL: Final[tuple[str, ...]] = (
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id VARCHAR PRIMARY KEY,
        model_fingerprint VARCHAR,
        prompt_set_hash VARCHAR,
        method VARCHAR,
        params_json VARCHAR,
        schema_version INTEGER,
        created_at TIMESTAMP
    )""",
    # Long format: one row per (run, layer, head, label, metric).
    """CREATE TABLE IF NOT EXISTS results (
        run_id VARCHAR,
        layer INTEGER,
        head INTEGER,
        label VARCHAR,
        metric VARCHAR,
        value DOUBLE
    )""",
    "CREATE TABLE IF NOT EXISTS artifacts (run_id VARCHAR, name VARCHAR, json VARCHAR)",
)


def ensure_schema(con: duckdb.DuckDBPyConnection, schema_version: int) -> None:
    """Create missing tables and record *schema_version* in ``meta`` (inside the caller's transaction)."""
    for statement in DDL:
        con.execute(statement)
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None or row[0] != str(schema_version):
        con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(schema_version)])
