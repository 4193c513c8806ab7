"""Exception hierarchy of the result cache.

Every exception raised deliberately by :mod:`cache` derives from
:class:`CacheError`, so callers (e.g. the dashboard) can catch one type and
show its message.  Invalid *arguments* (wrong types, NaN in a key) raise the
built-in ``TypeError`` / ``ValueError`` instead, because they are programming
errors rather than cache failures.
"""

from __future__ import annotations

__all__ = [
    "CacheBusyError",
    "CacheError",
    "CacheReadError",
    "CacheWriteError",
]


class CacheError(Exception):
    """Base class of all result-cache failures."""


class CacheBusyError(CacheError):
    """The cache stayed locked by other processes for longer than the timeout."""


class CacheWriteError(CacheError):
    """A result could not be written (read-only location, disk full, ...).

    Whatever was cached before the failed write is still intact.
    """


class CacheReadError(CacheError):
    """The cache file exists but cannot be read (e.g. no read permission)."""
