"""Location of the cache database and of its sidecar files.

Layout for a database at ``<dir>/results.duckdb``::

    <dir>/results.duckdb            the DuckDB file
    <dir>/results.duckdb.wal        DuckDB's write-ahead log (managed by DuckDB)
    <dir>/results.duckdb.lock       inter-process flock (shared read / exclusive write)
    <dir>/results.duckdb.keys/      one flock file per run id, held while computing
    <dir>/results.duckdb.corrupt-<UTC timestamp>   a damaged file moved aside
"""

from __future__ import annotations

import hashlib
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Final

__all__ = [
    "ENV_VAR",
    "corrupt_target_for",
    "default_db_path",
    "key_lock_path",
    "keys_dir_for",
    "lock_path_for",
    "resolve_db_path",
    "wal_path_for",
]

#: Environment variable that overrides the database location.
ENV_VAR: Final[str] = "ARITHLAB_CACHE"

_REPO_ROOT: Final[Path] = Path(__file__).resolve().parent.parent
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def default_db_path() -> Path:
    """``<repo root>/.cache/results.duckdb`` (repo root = parent of ``cache/``)."""
    return _REPO_ROOT / ".cache" / "results.duckdb"


def resolve_db_path(path: str | os.PathLike[str] | None) -> Path:
    """Absolute database path: explicit *path*, else ``$ARITHLAB_CACHE``, else the default."""
    if path is None:
        env = os.environ.get(ENV_VAR, "").strip()
        chosen = Path(env) if env else default_db_path()
    elif isinstance(path, (str, os.PathLike)):
        chosen = Path(path)
        if not str(chosen).strip():
            raise ValueError("cache path must not be empty")
    else:
        raise TypeError(f"cache path must be str, os.PathLike or None, not {type(path).__name__}")
    return chosen.expanduser().absolute()


def lock_path_for(db_path: Path) -> Path:
    """Sidecar file whose flock guards every open of *db_path*."""
    return db_path.with_name(db_path.name + ".lock")


def wal_path_for(db_path: Path) -> Path:
    """DuckDB's write-ahead log that belongs to *db_path*."""
    return db_path.with_name(db_path.name + ".wal")


def keys_dir_for(db_path: Path) -> Path:
    """Directory holding the per-run-id compute locks."""
    return db_path.with_name(db_path.name + ".keys")


def key_lock_path(db_path: Path, run_id: str) -> Path:
    """``<db>.keys/<run_id>.lock``; run ids that are not file-name safe are hashed."""
    name = run_id if _SAFE_NAME.fullmatch(run_id) else hashlib.sha256(run_id.encode("utf-8")).hexdigest()
    return keys_dir_for(db_path) / f"{name}.lock"


def corrupt_target_for(db_path: Path, now: datetime | None = None) -> Path:
    """A not-yet-existing ``<name>.corrupt-<UTC timestamp>[-n]`` path next to *db_path*."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = db_path.with_name(f"{db_path.name}.corrupt-{stamp}")
    candidate, n = base, 0
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate
