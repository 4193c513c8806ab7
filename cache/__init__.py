"""Result cache of the arithmetic-circuits lab (DuckDB, multi-process safe).

Expensive computations (patching sweeps, probes, ...) are stored in one
DuckDB file, keyed by :func:`make_key` over (model fingerprint, prompt-set
hash, method, params, schema version), in long format
(``run_id, layer, head, label, metric, value``) plus small JSON artifacts.

Public API::

    ResultCache(path=None, *, timeout=60.0, compute_timeout=None, schema_version=None, on_warning=None)
        .get(run_id) -> CachedRun | None
        .put(run_id, *, model_fingerprint, prompt_set_hash, method, params, rows, artifacts=None) -> CachedRun
        .get_or_compute(run_id, compute, *, model_fingerprint, prompt_set_hash, method, params)
            -> tuple[CachedRun, bool]
        .delete(run_id) -> bool
        .list_runs(method=None) -> list[RunSummary]
        .pin(fingerprint, component, note="") / .unpin(fingerprint, component) / .pins(fingerprint) -> list[Pin]
        .save_workspace(name, fingerprint, state_json) / .delete_workspace(name) / .workspaces() -> list[Workspace]
        .last_warning: str | None
    make_key, canonical_json, hash_prompt_set, rows_as_records
    ResultRow, CachedRun, RunSummary
    CacheError > CacheBusyError, CacheWriteError, CacheReadError

``$ARITHLAB_TRACE`` (off by default) names a file that gets one JSON line per computation
started and stored -- see :mod:`cache.trace`.

This package imports neither streamlit nor torch.
"""

from __future__ import annotations

from .annotations import MAX_NOTE_CHARS, NoteError, Pin, Workspace
from .errors import CacheBusyError, CacheError, CacheReadError, CacheWriteError
from .keys import canonical_json, hash_prompt_set, make_key
from .models import CachedRun, ResultRow, RowLike, RunSummary, rows_as_records
from .paths import ENV_VAR, default_db_path
from .schema import SCHEMA_VERSION
from .store import DEFAULT_TIMEOUT, ComputeResult, ResultCache

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_VAR",
    "SCHEMA_VERSION",
    "CacheBusyError",
    "CacheError",
    "CacheReadError",
    "CacheWriteError",
    "CachedRun",
    "MAX_NOTE_CHARS",
    "NoteError",
    "Pin",
    "Workspace",
    "ComputeResult",
    "ResultCache",
    "ResultRow",
    "RowLike",
    "RunSummary",
    "canonical_json",
    "default_db_path",
    "hash_prompt_set",
    "make_key",
    "rows_as_records",
]
