"""Inter-process locks built on ``fcntl.flock`` plus deadline/backoff helpers.

flock locks belong to an open file description, so two :class:`FileLock`
objects conflict even inside one process (threads), and the kernel drops
the lock when a process dies, so a crashed writer never leaves the cache
locked.

Why not the ``filelock`` package (installed with huggingface_hub): its ``FileLock`` is exclusive
only, and its shared/exclusive ``ReadWriteLock`` (SQLite, filelock 4.2) coordinates processes, not
threads -- a thread asking for the write lock while another thread of the same process reads gets
``RuntimeError: Cannot acquire write lock ... another thread holds a read lock`` instead of waiting
(tried on filelock 4.2.11).  The dashboard serves every browser session as a thread of one process,
and ``tests/unit/test_cache.py::test_threads_share_one_cache`` checks exactly that case; a lock file
in a read-only cache directory (opened read-only here) is the other case it does not cover.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import time
from pathlib import Path
from types import TracebackType
from typing import Final

from .errors import CacheBusyError

__all__ = ["Backoff", "Deadline", "FileLock", "LockFileUnavailable"]

_NOT_WRITABLE_ERRNOS: Final[frozenset[int]] = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class Deadline:
    """A point in time *timeout* seconds from construction (``None`` = never)."""

    def __init__(self, timeout: float | None) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        self.timeout: float | None = timeout
        self._end: float | None = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (never negative), or ``None`` for an infinite deadline."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        return self._end is not None and time.monotonic() >= self._end


class Backoff:
    """Jittered exponential sleeps, never sleeping past a :class:`Deadline`."""

    def __init__(self, deadline: Deadline, *, first: float = 0.005, cap: float = 0.25) -> None:
        self._deadline = deadline
        self._delay = first
        self._cap = cap

    def sleep(self) -> None:
        delay = self._delay * random.uniform(0.5, 1.0)
        remaining = self._deadline.remaining()
        if remaining is not None:
            delay = min(delay, remaining)
        if delay > 0:
            time.sleep(delay)
        self._delay = min(self._cap, self._delay * 2)


class LockFileUnavailable(OSError):
    """The lock file can neither be created nor opened (read-only location)."""


class FileLock:
    """A shared or exclusive flock on *path*, acquired with a timeout.

    The lock file is created if missing (mode 0666 minus umask so that other
    users of the same cache can lock it too).  If it cannot be created because
    the location is read-only, an existing lock file is opened read-only
    (flock works on any descriptor); if there is none,
    :class:`LockFileUnavailable` is raised and the caller decides.
    """

    def __init__(self, path: Path, *, shared: bool, deadline: Deadline, what: str) -> None:
        self.path: Path = path
        self.shared: bool = shared
        self._deadline = deadline
        self._what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held by this object")
        fd = self._open()
        mode = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        backoff = Backoff(self._deadline, first=0.002, cap=0.1)
        try:
            while True:
                try:
                    fcntl.flock(fd, mode)
                    break
                except BlockingIOError:
                    if self._deadline.expired():
                        kind = "shared" if self.shared else "exclusive"
                        raise CacheBusyError(
                            f"{self._what} is busy: could not get a {kind} lock on {self.path} "
                            f"within {self._deadline.timeout:g} s because other processes kept it "
                            "locked (probably writing a large result). Try again later or "
                            "construct ResultCache(timeout=...) with a larger timeout."
                        ) from None
                    backoff.sleep()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FileLock:
        """Acquire (unless :meth:`acquire` was already called) and return the lock."""
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno not in _NOT_WRITABLE_ERRNOS:
                raise
            try:
                return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise LockFileUnavailable(exc.errno, f"cannot create lock file {self.path}: {exc.strerror}") from exc
