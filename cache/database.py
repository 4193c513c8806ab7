"""Short-lived, lock-guarded access to the DuckDB file.

DuckDB lets one process hold a database file read-write *or* many processes
hold it read-only, never both.  So the file is open only for the duration of
one operation (see :mod:`cache.connection` for how it is attached):

* **read**: shared ``flock`` on ``<db>.lock`` -> attach ``READ_ONLY`` ->
  query -> detach -> unlock.  Many processes read at once.
* **write**: exclusive ``flock`` on ``<db>.lock`` -> attach read-write ->
  ``BEGIN`` -> statements -> ``COMMIT`` -> detach (DuckDB checkpoints) -> unlock.

Within one process a per-file ``threading.Lock`` serialises operations
(DuckDB cannot attach one file twice in an instance); flock is per open
file description, so it also separates threads.

Waiting for the flock, and DuckDB's own lock conflicts (a foreign process
such as the DuckDB CLI holding the file), are retried with jittered backoff
until ``timeout``; then :class:`CacheBusyError` is raised.

A file DuckDB refuses to open as a database is moved aside to
``<name>.corrupt-<UTC timestamp>`` (under the exclusive lock) and replaced by
a fresh database; the message goes to the ``arithlab.cache`` logger and to
the ``on_warning`` callback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TypeVar

import duckdb

from . import connection as _conn
from .connection import ErrorKind
from .errors import CacheBusyError, CacheError, CacheReadError, CacheWriteError
from .locking import Backoff, Deadline, FileLock, LockFileUnavailable
from .paths import ENV_VAR, corrupt_target_for, lock_path_for, wal_path_for
from .schema import ensure_schema

__all__ = ["CacheDatabase"]

logger = logging.getLogger("arithlab.cache")

T = TypeVar("T")
Query = Callable[[duckdb.DuckDBPyConnection], T]

_MAX_RECOVERIES = 2

_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(path: Path) -> threading.Lock:
    """Process-local lock per database: one process never attaches a file twice at once."""
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(path.resolve(), threading.Lock())


def _reset_thread_locks_after_fork() -> None:
    global _THREAD_LOCKS_GUARD
    _THREAD_LOCKS_GUARD = threading.Lock()
    _THREAD_LOCKS.clear()  # locks held by other threads at fork time would never be released


os.register_at_fork(after_in_child=_reset_thread_locks_after_fork)


FileIdentity = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)


def _identity(path: Path) -> FileIdentity | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Corrupt(Exception):
    """Internal: DuckDB cannot read the file as a database.

    Raised while the file lock is held; ``identity`` pins down *which* file
    failed so that recovery never moves aside a file another process has
    already replaced.
    """

    def __init__(self, cause: BaseException, path: Path) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.identity: FileIdentity | None = _identity(path)


class CacheDatabase:
    """Runs read and write callbacks against *path* with the locking protocol above."""

    def __init__(
        self,
        path: Path,
        *,
        timeout: float,
        schema_version: int,
        on_warning: Callable[[str], None],
    ) -> None:
        self.path: Path = path
        self.lock_path: Path = lock_path_for(path)
        self.timeout: float = timeout
        self.schema_version: int = schema_version
        self._warn = on_warning

    # ------------------------------------------------------------------ reads
    def read(self, query: Query[T], default: T) -> T:
        """Run *query* on a read-only connection; *default* if there is no (usable) database."""
        if not self.path.exists():
            return default
        deadline = Deadline(self.timeout)
        with self._in_process(deadline):
            for _ in range(_MAX_RECOVERIES + 1):
                try:
                    return self._read_once(query, default, deadline)
                except _Corrupt as corrupt:
                    if not self._recover(corrupt, deadline, raise_on_failure=False):
                        return default
        return default

    def _in_process(self, deadline: Deadline) -> AbstractContextManager[object]:
        lock = _thread_lock(self.path)
        remaining = deadline.remaining()
        if not lock.acquire(timeout=-1 if remaining is None else remaining):
            raise CacheBusyError(
                f"result cache {self.path} is busy: other threads of this process kept using it "
                f"for {self.timeout:g} s (timeout). Try again or raise ResultCache(timeout=...)."
            )
        return _Released(lock)

    def _read_once(self, query: Query[T], default: T, deadline: Deadline) -> T:
        with self._read_lock(deadline):
            if not self.path.exists():
                return default
            att = self._open(read_only=True, deadline=deadline)
            try:
                att.con.execute("BEGIN TRANSACTION")
                return query(att.con)
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                # Tables missing or laid out differently: nothing usable cached.
                logger.info("result cache %s has no usable tables (%s); treating as empty", self.path, exc)
                return default
            except duckdb.Error as exc:
                if _conn.classify(exc) is ErrorKind.CORRUPT:
                    raise _Corrupt(exc, self.path) from exc
                raise CacheReadError(f"reading the result cache {self.path} failed: {exc}") from exc
            finally:
                problem = _conn.close_quietly(att)
                if problem is not None:
                    logger.warning("closing result cache %s after reading failed: %s", self.path, problem)

    def _read_lock(self, deadline: Deadline) -> AbstractContextManager[object]:
        lock = FileLock(self.lock_path, shared=True, deadline=deadline, what=f"result cache {self.path}")
        try:
            lock.acquire()
        except (LockFileUnavailable, FileNotFoundError) as exc:
            # Read-only location without a lock file (or no directory at all):
            # nobody can write here through this cache either, so reading
            # without the lock is safe enough.
            logger.info("reading %s without inter-process lock: %s", self.path, exc)
            return nullcontext()
        except OSError as exc:
            raise CacheReadError(f"Cannot lock the result cache {self.path} for reading: {exc}") from exc
        return lock

    # ----------------------------------------------------------------- writes
    def write(self, body: Query[T], *, action: str) -> T:
        """Run *body* in one transaction on a read-write connection.

        Either everything *body* did is committed or nothing is.  Raises
        :class:`CacheWriteError` when the location is not writable or the disk
        is full, :class:`CacheBusyError` after ``timeout`` of lock contention.
        """
        deadline = Deadline(self.timeout)
        self._make_parent(action)
        with self._in_process(deadline):
            lock = FileLock(self.lock_path, shared=False, deadline=deadline, what=f"result cache {self.path}")
            try:
                lock.acquire()
            except OSError as exc:  # includes LockFileUnavailable
                raise self._write_error(action, exc) from exc
            with lock:
                return self._write_with_recovery(body, action, deadline)

    def _write_with_recovery(self, body: Query[T], action: str, deadline: Deadline) -> T:
        """Retry *body* after moving a corrupt file aside (exclusive lock held)."""
        for _ in range(_MAX_RECOVERIES + 1):
            try:
                return self._write_once(body, action, deadline)
            except _Corrupt as corrupt:
                self._recover(corrupt, deadline, raise_on_failure=True, lock_held=True)
        raise CacheError(f"could not {action}: {self.path} stays unreadable after recreating it")

    def _write_once(self, body: Query[T], action: str, deadline: Deadline) -> T:
        att = self._open(read_only=False, deadline=deadline, action=action)
        try:
            try:
                att.con.execute("BEGIN TRANSACTION")
                ensure_schema(att.con, self.schema_version)
            except duckdb.Error as exc:
                if _conn.classify(exc) is ErrorKind.CORRUPT:
                    raise _Corrupt(exc, self.path) from exc
                raise
            result = body(att.con)
            att.con.execute("COMMIT")
            return result
        except _Corrupt:
            raise
        except BaseException as exc:
            _rollback_quietly(att.con)
            kind = _conn.classify(exc)
            if isinstance(exc, (OSError, duckdb.IOException)) or kind in (
                ErrorKind.NO_SPACE,
                ErrorKind.NOT_WRITABLE,
            ):
                raise self._write_error(action, exc) from exc
            if isinstance(exc, duckdb.Error):
                raise CacheError(f"could not {action} in {self.path}: {exc}") from exc
            raise
        finally:
            problem = _conn.close_quietly(att)
            if problem is not None:
                # The commit (if any) is in the WAL; DuckDB replays it on next open.
                logger.warning("closing result cache %s failed: %s", self.path, problem)

    def _make_parent(self, action: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._write_error(action, exc) from exc

    def _write_error(self, action: str, exc: BaseException) -> CacheWriteError:
        kind = _conn.classify(exc)
        if kind is ErrorKind.NO_SPACE:
            reason = "the disk (or quota) is full"
            advice = "free some space"
        elif kind is ErrorKind.NOT_WRITABLE:
            reason = "the location is not writable"
            advice = f"point the environment variable {ENV_VAR} to a writable file path"
        else:
            reason = "an I/O error occurred"
            advice = f"check the file system, or set {ENV_VAR} to another file path"
        return CacheWriteError(
            f"Could not {action}: {reason} ({exc}). Cache file: {self.path}. "
            f"Results cached earlier are unaffected; to keep caching, {advice}."
        )

    # ------------------------------------------------------------ connections
    def _open(self, *, read_only: bool, deadline: Deadline, action: str = "read") -> _conn.Attached:
        backoff = Backoff(deadline)
        while True:
            try:
                return _conn.connect(self.path, read_only=read_only)
            except (duckdb.Error, OSError) as exc:
                kind = _conn.classify(exc)
                if kind is ErrorKind.CORRUPT:
                    raise _Corrupt(exc, self.path) from exc
                if kind in (ErrorKind.NOT_WRITABLE, ErrorKind.NO_SPACE):
                    if read_only:
                        raise CacheReadError(
                            f"Cannot read the result cache {self.path}: {exc}. "
                            f"Fix its permissions or set {ENV_VAR} to another file path."
                        ) from exc
                    raise self._write_error(action, exc) from exc
                if kind not in (ErrorKind.LOCK_CONFLICT, ErrorKind.OTHER_IO):
                    raise CacheError(f"Cannot open the result cache {self.path}: {exc}") from exc
                if deadline.expired():
                    raise CacheBusyError(
                        f"Result cache {self.path} stayed unavailable for {self.timeout:g} s: {exc}. "
                        "Another program (not using this cache's lock) may hold the file; close it "
                        "or construct ResultCache(timeout=...) with a larger timeout."
                    ) from exc
                backoff.sleep()

    # --------------------------------------------------------------- recovery
    def _recover(
        self,
        corrupt: _Corrupt,
        deadline: Deadline,
        *,
        raise_on_failure: bool,
        lock_held: bool = False,
    ) -> bool:
        """Move a corrupt file aside and create a fresh database; ``False`` if impossible."""
        lock: AbstractContextManager[object] = nullcontext()
        if not lock_held:
            file_lock = FileLock(self.lock_path, shared=False, deadline=deadline, what=f"result cache {self.path}")
            try:
                file_lock.acquire()
            except OSError as exc:  # includes LockFileUnavailable
                return self._recovery_failed(corrupt, exc, raise_on_failure)
            lock = file_lock
        with lock:
            # Unless we held the exclusive lock all along, someone else may have
            # replaced the file while we waited for the lock.
            current = _identity(self.path)
            if current is not None and (lock_held or current == corrupt.identity):
                target = corrupt_target_for(self.path)
                try:
                    os.replace(self.path, target)
                    wal = wal_path_for(self.path)
                    if wal.exists():
                        os.replace(wal, wal_path_for(target))
                except OSError as exc:
                    return self._recovery_failed(corrupt, exc, raise_on_failure)
                self._create_fresh(deadline)
                message = (
                    f"The result cache {self.path} was damaged ({corrupt.cause}). It was moved aside "
                    f"to {target} and a fresh, empty cache was started; results will be recomputed."
                )
                logger.warning(message)
                self._warn(message)
        return True

    def _create_fresh(self, deadline: Deadline) -> None:
        """Create an empty database with the schema (caller holds the exclusive lock)."""
        try:
            att = self._open(read_only=False, deadline=deadline, action="create a fresh cache")
        except (CacheError, _Corrupt) as exc:
            logger.warning("could not create a fresh result cache at %s: %s", self.path, exc)
            return
        try:
            att.con.execute("BEGIN TRANSACTION")
            ensure_schema(att.con, self.schema_version)
            att.con.execute("COMMIT")
        except duckdb.Error as exc:
            logger.warning("could not create a fresh result cache at %s: %s", self.path, exc)
        finally:
            _conn.close_quietly(att)

    def _recovery_failed(self, corrupt: _Corrupt, exc: BaseException, raise_on_failure: bool) -> bool:
        message = (
            f"The result cache {self.path} is damaged ({corrupt.cause}) and could not be moved aside "
            f"({exc}). Nothing can be cached; delete the file or set {ENV_VAR} to another file path."
        )
        logger.warning(message)
        self._warn(message)
        if raise_on_failure:
            raise CacheWriteError(message) from exc
        return False


class _Released(AbstractContextManager[object]):
    """Context manager that releases an already acquired ``threading.Lock``."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def _rollback_quietly(con: duckdb.DuckDBPyConnection) -> None:
    # The transaction may already be gone (e.g. a failed COMMIT ends it).
    with contextlib.suppress(Exception):
        con.execute("ROLLBACK")
