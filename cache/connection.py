"""Attaching the DuckDB file and classifying the errors DuckDB/the OS raise.

Creating a DuckDB instance is slow (it spawns its thread pool), so
each process keeps **one in-memory instance** and every cache operation
``ATTACH``es the file, works on it and ``DETACH``es it again.  DETACH closes
the file, releases DuckDB's own file lock and checkpoints the WAL, exactly
like closing a dedicated connection would, and costs little per read.  Nothing
keeps the file open between operations.  The instance is recreated after a
``fork`` and after DuckDB reports a fatal error.

DuckDB reports lock conflicts, corrupt files, permission problems and a full
disk all as ``duckdb.IOException`` (or other ``duckdb.Error`` subclasses);
the only way to tell them apart is the message, so the patterns live here in
one place.  :func:`connect` is the single entry point to DuckDB so tests can
monkeypatch it.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import errno
import itertools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import duckdb

__all__ = ["Attached", "ErrorKind", "classify", "close_quietly", "connect", "reset_engine"]


class ErrorKind(enum.Enum):
    """Coarse category of a failure while opening or writing the database."""

    LOCK_CONFLICT = "lock conflict"  # another process holds DuckDB's own file lock
    CORRUPT = "corrupt"  # not a (readable) DuckDB database
    NOT_WRITABLE = "not writable"  # permissions / read-only file system
    NO_SPACE = "no space"  # disk or quota full
    OTHER_IO = "other io"  # any other I/O error
    OTHER = "other"  # not an I/O problem at all


_LOCK_PATTERNS: Final[tuple[str, ...]] = ("could not set lock", "conflicting lock", "file handle conflict")
_CORRUPT_PATTERNS: Final[tuple[str, ...]] = (
    "not a valid duckdb database",
    "could not read enough bytes",
    "corrupt",
    "checksum",
    "database file with version number",
    "serialization error",
    "invalid magic",
)
_NOT_WRITABLE_PATTERNS: Final[tuple[str, ...]] = (
    "permission denied",
    "read-only file system",
    "operation not permitted",
    "access is denied",
)
_NO_SPACE_PATTERNS: Final[tuple[str, ...]] = ("no space left", "disk full", "quota exceeded", "not enough space")
_NOT_WRITABLE_ERRNOS: Final[frozenset[int]] = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_NO_SPACE_ERRNOS: Final[frozenset[int]] = frozenset({errno.ENOSPC, errno.EDQUOT})


def classify(exc: BaseException) -> ErrorKind:
    """Map an exception raised by DuckDB or the OS to an :class:`ErrorKind`."""
    if isinstance(exc, OSError):
        if exc.errno in _NO_SPACE_ERRNOS:
            return ErrorKind.NO_SPACE
        if exc.errno in _NOT_WRITABLE_ERRNOS:
            return ErrorKind.NOT_WRITABLE
        return ErrorKind.OTHER_IO
    if not isinstance(exc, duckdb.Error):
        return ErrorKind.OTHER
    message = str(exc).lower()
    if any(p in message for p in _LOCK_PATTERNS):
        return ErrorKind.LOCK_CONFLICT
    if any(p in message for p in _NO_SPACE_PATTERNS):
        return ErrorKind.NO_SPACE
    if any(p in message for p in _NOT_WRITABLE_PATTERNS):
        return ErrorKind.NOT_WRITABLE
    if any(p in message for p in _CORRUPT_PATTERNS):
        return ErrorKind.CORRUPT
    if isinstance(exc, duckdb.IOException):
        return ErrorKind.OTHER_IO
    return ErrorKind.OTHER


@dataclass(slots=True)
class Attached:
    """The cache file attached to a private cursor of the process-wide instance.

    ``con`` has the file as its default catalog (``USE``), so SQL refers to
    ``runs``/``results``/... unqualified.
    """

    con: duckdb.DuckDBPyConnection
    alias: str
    path: Path

    def close(self) -> None:
        """Detach the file (checkpointing it and releasing DuckDB's file lock)."""
        try:
            # DETACH is refused inside an open transaction; normally none is open.
            with contextlib.suppress(duckdb.TransactionException):
                self.con.execute("ROLLBACK")
            self.con.execute("USE memory")
            self.con.execute(f"DETACH {self.alias}")
        except BaseException:
            # Still attached (e.g. the checkpoint failed): abandon this instance
            # so the file is released once its last cursor is gone.
            reset_engine()
            raise
        finally:
            self.con.close()


# Instances inherited through fork(): never used or destroyed in the child
# (their destructor would wait for threads that do not exist there).
_ABANDONED: list[duckdb.DuckDBPyConnection] = []


class _Engine:
    """The per-process in-memory DuckDB instance that files are attached to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: duckdb.DuckDBPyConnection | None = None
        self._pid: int = os.getpid()
        self._aliases = itertools.count()

    def cursor(self) -> tuple[duckdb.DuckDBPyConnection, str]:
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
            if self._base is None:
                self._base = duckdb.connect(":memory:")
            return self._base.cursor(), f"arithlab_cache_{next(self._aliases)}"

    def _forget_inherited(self) -> None:
        if self._base is not None:
            _ABANDONED.append(self._base)
        self._base = None
        self._pid = os.getpid()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # may have been held by another thread at fork time
        self._forget_inherited()

    def reset(self) -> None:
        with self._lock:
            base, self._base = self._base, None
            if base is not None and self._pid == os.getpid():
                close_quietly(base)


_ENGINE = _Engine()
os.register_at_fork(after_in_child=_ENGINE.after_fork_in_child)
# Close the instance before interpreter teardown (otherwise nanobind reports leaked DuckDB objects).
atexit.register(lambda: _ENGINE.reset())


def reset_engine() -> None:
    """Drop the process-wide instance (after a fatal DuckDB error); the next call makes a new one."""
    _ENGINE.reset()


def connect(path: Path, *, read_only: bool) -> Attached:
    """Attach *path* (read-only or read-write); the only place the cache opens the file."""
    cursor, alias = _ENGINE.cursor()
    mode = " (READ_ONLY)" if read_only else ""
    quoted = str(path).replace("'", "''")
    try:
        cursor.execute(f"ATTACH '{quoted}' AS {alias}{mode}")
        cursor.execute(f"USE {alias}")
    except BaseException as exc:
        close_quietly(cursor)
        if _is_fatal(exc):
            reset_engine()
        raise
    return Attached(cursor, alias, path)


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.FatalException) or "invalidated" in str(exc).lower()


def close_quietly(con: Attached | duckdb.DuckDBPyConnection) -> BaseException | None:
    """Close/detach *con*; return (not raise) any error so cleanup never masks the real one."""
    try:
        con.close()
    except Exception as exc:  # returned, not swallowed
        if _is_fatal(exc):
            reset_engine()
        return exc
    return None
