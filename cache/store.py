"""``ResultCache``: the public face of the DuckDB result cache.

Typical use::

    cache = ResultCache()                      # $ARITHLAB_CACHE or <repo>/.cache/results.duckdb
    run_id = make_key(fp, prompts_hash, "attn_patching", params)
    run, computed = cache.get_or_compute(
        run_id, lambda: (rows, {"model": facts}),
        model_fingerprint=fp, prompt_set_hash=prompts_hash,
        method="attn_patching", params=params,
    )

Every call attaches the DuckDB file only for its own duration, under a
sidecar flock (see :mod:`cache.database`), so any number of processes can
share one cache.
``get_or_compute`` additionally serialises the *computation* of one run id
across processes with a per-key flock, so an uncached result is computed
once while other keys stay readable and writable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeAlias

from . import annotations, queries
from . import schema as _schema
from .database import CacheDatabase
from .errors import CacheWriteError
from .keys import canonical_json
from .keys import require_str as _check_str
from .locking import Deadline, FileLock
from .models import CachedRun, RowLike, RunSummary, coerce_rows
from .paths import key_lock_path, keys_dir_for, lock_path_for, resolve_db_path
from .trace import trace_event

__all__ = ["DEFAULT_TIMEOUT", "ComputeResult", "ResultCache"]

logger = logging.getLogger("arithlab.cache")

#: Seconds an operation waits for locks held by other processes.
DEFAULT_TIMEOUT: float = 60.0

#: What a ``get_or_compute`` callback returns: (rows, artifacts or None).
ComputeResult: TypeAlias = tuple[Iterable[RowLike], Mapping[str, Any] | None]


class ResultCache:
    """Cache of analysis runs in one DuckDB file, safe for concurrent processes.

    Args:
        path: database file; ``None`` means ``$ARITHLAB_CACHE`` or
            ``<repo root>/.cache/results.duckdb``.  Parent directories are
            created on the first write.
        timeout: seconds to wait for other processes' locks before
            :class:`~cache.errors.CacheBusyError` (default 60).
        compute_timeout: seconds ``get_or_compute`` waits for another process
            that is computing the same run id (``None`` = as long as it takes;
            a crashed computer releases its lock automatically).
        schema_version: runs stored under any other version are ignored
            (``None``: the current :data:`cache.schema.SCHEMA_VERSION`).
        on_warning: also called with each :attr:`last_warning` message as it
            happens (the dashboard shows it on the page that hit the problem).

    Attributes:
        last_warning: the latest non-fatal problem (e.g. a corrupt file that was
            moved aside) as a user-facing sentence, or ``None``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        compute_timeout: float | None = None,
        schema_version: int | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        if schema_version is None:  # read now, not at import: a version bump takes effect everywhere
            schema_version = _schema.SCHEMA_VERSION
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout must be a number >= 0, got {timeout!r}")
        if compute_timeout is not None and (
            isinstance(compute_timeout, bool) or not isinstance(compute_timeout, (int, float)) or compute_timeout < 0
        ):
            raise ValueError(f"compute_timeout must be a number >= 0 or None, got {compute_timeout!r}")
        if isinstance(schema_version, bool) or not isinstance(schema_version, int):
            raise TypeError(f"schema_version must be int, not {type(schema_version).__name__}")
        if on_warning is not None and not callable(on_warning):
            raise TypeError(f"on_warning must be callable or None, not {type(on_warning).__name__}")
        self.last_warning: str | None = None
        self._on_warning = on_warning
        self.compute_timeout: float | None = compute_timeout
        self._db = CacheDatabase(
            resolve_db_path(path),
            timeout=float(timeout),
            schema_version=schema_version,
            on_warning=self._set_warning,
        )

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r})"

    # -------------------------------------------------------------- properties
    @property
    def path(self) -> Path:
        """Absolute path of the DuckDB file."""
        return self._db.path

    @property
    def lock_path(self) -> Path:
        """Sidecar flock file guarding every open of :attr:`path`."""
        return lock_path_for(self.path)

    @property
    def keys_dir(self) -> Path:
        """Directory of per-run-id compute locks."""
        return keys_dir_for(self.path)

    @property
    def schema_version(self) -> int:
        return self._db.schema_version

    @property
    def timeout(self) -> float:
        return self._db.timeout

    # ----------------------------------------------------------------- reading
    def get(self, run_id: str) -> CachedRun | None:
        """The complete cached run, or ``None`` (missing or other schema version)."""
        _check_str("run_id", run_id)
        return self._db.read(lambda con: queries.fetch_run(con, run_id, self.schema_version), None)

    def list_runs(self, method: str | None = None) -> list[RunSummary]:
        """Cached runs of the current schema version, newest first."""
        if method is not None:
            _check_str("method", method)
        return self._db.read(lambda con: queries.fetch_summaries(con, method, self.schema_version), [])

    # ----------------------------------------------------------------- writing
    def put(
        self,
        run_id: str,
        *,
        model_fingerprint: str,
        prompt_set_hash: str,
        method: str,
        params: Mapping[str, Any],
        rows: Iterable[RowLike],
        artifacts: Mapping[str, Any] | None = None,
    ) -> CachedRun:
        """Store a run, replacing any run with the same id wholly (one transaction).

        Returns the run exactly as a later :meth:`get` returns it.

        Raises:
            TypeError/ValueError: invalid rows, params or artifacts (nothing written).
            CacheWriteError: location not writable or disk full (old data intact).
            CacheBusyError: other processes held the cache longer than ``timeout``.
        """
        prepared = self._prepare(run_id, model_fingerprint, prompt_set_hash, method, params, rows, artifacts)
        self._db.write(lambda con: queries.insert_run(con, prepared), action=f"store run {run_id!r}")
        return prepared.to_cached_run()

    def delete(self, run_id: str) -> bool:
        """Remove a run (rows and artifacts too); ``True`` if it existed."""
        _check_str("run_id", run_id)
        if not self.path.exists():
            return False
        return self._db.write(lambda con: queries.delete_run(con, run_id), action=f"delete run {run_id!r}")

    # ------------------------------------------------------- pins, notes, workspaces (cache.annotations)
    def pins(self, model_fingerprint: str) -> list[annotations.Pin]:
        """The pinned components of one model (by weights fingerprint) with their notes, by component."""
        _check_str("model_fingerprint", model_fingerprint)
        return self._db.read(lambda con: annotations.fetch_pins(con, model_fingerprint), [])

    def pin(self, model_fingerprint: str, component: str, note: str = "") -> annotations.Pin:
        """Pin ``component`` of the model with ``note`` (plain text; replaces its note).  NoteError (nothing
        written) for a bad component or a note over ``annotations.MAX_NOTE_CHARS`` characters."""
        _check_str("model_fingerprint", model_fingerprint)
        c, text = annotations.check_component(component), annotations.clean_note(note)
        self._db.write(lambda con: annotations.put_pin(con, model_fingerprint, c, text), action=f"pin {c}")
        return next(p for p in self.pins(model_fingerprint) if p.component == c)

    def labels(self, model_fingerprint: str) -> dict[str, str]:
        """Component -> its note ("pinned" for a pin without one): what a chart or an export labels."""
        return {p.component: p.note or "pinned" for p in self.pins(model_fingerprint)}

    def unpin(self, model_fingerprint: str, component: str) -> bool:
        """Remove a pin and its note; True when it was pinned."""
        c = annotations.check_component(component)
        if not self.path.exists():
            return False
        return self._db.write(lambda con: annotations.delete_pin(con, model_fingerprint, c), action=f"unpin {c}")

    def workspaces(self) -> list[annotations.Workspace]:
        """The saved workspaces, newest first."""
        return self._db.read(annotations.fetch_workspaces, [])

    def save_workspace(self, name: str, model_fingerprint: str, state_json: str) -> None:
        """Keep ``state_json`` under ``name`` (replacing a workspace of that name)."""
        n = annotations.check_name(name)
        self._db.write(lambda con: annotations.put_workspace(con, n, model_fingerprint, state_json),
                       action=f"save workspace {n!r}")

    def delete_workspace(self, name: str) -> bool:
        """Remove a saved workspace; True when it existed."""
        n = annotations.check_name(name)
        if not self.path.exists():
            return False
        return self._db.write(lambda con: annotations.delete_workspace(con, n), action=f"delete workspace {n!r}")

    def get_or_compute(
        self,
        run_id: str,
        compute: Callable[[], ComputeResult],
        *,
        model_fingerprint: str,
        prompt_set_hash: str,
        method: str,
        params: Mapping[str, Any],
    ) -> tuple[CachedRun, bool]:
        """Return ``(run, computed)``: the cached run, or compute, store and return it.

        While *compute* runs, this process holds only the per-key lock
        ``<db>.keys/<run_id>.lock`` (never the database lock), so a second
        process asking for the same id waits and then reads the stored result
        instead of computing it again.  If the result cannot be stored
        (:class:`CacheWriteError`), it is still returned, and the problem is
        logged and put in :attr:`last_warning`.
        """
        _check_str("run_id", run_id)
        if not callable(compute):
            raise TypeError(f"compute must be callable, not {type(compute).__name__}")
        hit = self.get(run_id)
        if hit is not None:
            return hit, False
        with self._key_lock(run_id):
            hit = self.get(run_id)  # another process may have finished meanwhile
            if hit is not None:
                return hit, False
            trace_event("compute-start", run_id, method)
            try:
                rows, artifacts = _unpack(compute())
                prepared = self._prepare(run_id, model_fingerprint, prompt_set_hash, method, params, rows,
                                         artifacts)
            except BaseException:
                trace_event("compute-failed", run_id, method)
                raise
            try:
                self._db.write(lambda con: queries.insert_run(con, prepared), action=f"store run {run_id!r}")
            except CacheWriteError as exc:
                trace_event("not-stored", run_id, method)
                self._set_warning(f"The result was computed but not cached: {exc}")
                logger.warning("%s", exc)
            else:
                trace_event("stored", run_id, method)
        return prepared.to_cached_run(), True

    # ---------------------------------------------------------------- helpers
    def clear_warning(self) -> str | None:
        """Return :attr:`last_warning` and reset it to ``None``."""
        warning, self.last_warning = self.last_warning, None
        return warning

    def _set_warning(self, message: str) -> None:
        self.last_warning = message
        if self._on_warning is not None:
            self._on_warning(message)

    def _key_lock(self, run_id: str) -> AbstractContextManager[object]:
        """The acquired per-key compute lock (a no-op where no lock file can be made)."""
        lock_file = key_lock_path(self.path, run_id)
        lock = FileLock(
            lock_file,
            shared=False,
            deadline=Deadline(self.compute_timeout),
            what=f"computation of run {run_id!r}",
        )
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError as exc:
            # Cannot coordinate (read-only location): compute without the lock.
            logger.info("no compute lock for %s (%s); computing without it", run_id, exc)
            return nullcontext()
        return lock

    def _prepare(
        self,
        run_id: str,
        model_fingerprint: str,
        prompt_set_hash: str,
        method: str,
        params: Mapping[str, Any],
        rows: Iterable[RowLike],
        artifacts: Mapping[str, Any] | None,
    ) -> queries.PreparedRun:
        """Validate and serialise everything before any lock is taken."""
        _check_str("run_id", run_id)
        _check_str("model_fingerprint", model_fingerprint)
        _check_str("prompt_set_hash", prompt_set_hash)
        _check_str("method", method)
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a Mapping, not {type(params).__name__}")
        if artifacts is None:
            artifacts = {}
        elif not isinstance(artifacts, Mapping):
            raise TypeError(f"artifacts must be a Mapping or None, not {type(artifacts).__name__}")
        artifacts_json: dict[str, str] = {}
        for name, value in artifacts.items():
            _check_str("artifact name", name)
            try:
                artifacts_json[name] = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"artifact {name!r}: {exc}") from exc
        return queries.PreparedRun(
            run_id=run_id,
            model_fingerprint=model_fingerprint,
            prompt_set_hash=prompt_set_hash,
            method=method,
            params_json=canonical_json(params),
            schema_version=self.schema_version,
            created_at=datetime.now(timezone.utc).replace(tzinfo=None),
            rows=coerce_rows(rows),
            artifacts_json=artifacts_json,
        )


def _unpack(result: object) -> tuple[Iterable[RowLike], Mapping[str, Any] | None]:
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(
            "compute() must return a tuple (rows, artifacts) with artifacts a Mapping or None, "
            f"got {type(result).__name__}"
        )
    rows, artifacts = result
    return rows, artifacts
