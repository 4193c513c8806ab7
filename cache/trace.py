"""Optional trace of the computations the cache runs (a diagnostic and test hook).

When the environment variable ``ARITHLAB_TRACE`` names a file, every computation that
:meth:`cache.ResultCache.get_or_compute` actually runs appends JSON lines to it::

    {"event": "compute-start", "run_id": ..., "method": ..., "pid": ..., "t": ...}
    {"event": "stored" | "not-stored" | "compute-failed", ...}

Nothing else is written (no params, no rows, no environment), and the trace is off unless the
variable is set.  The reliability tests use it to check that concurrent sessions compute each
result once and to SIGKILL a sweep while it is computing.  A trace file that cannot be written is
ignored: tracing never breaks a computation.
"""

from __future__ import annotations

import json
import os
import time
from typing import Final

__all__ = ["TRACE_ENV_VAR", "trace_event"]

TRACE_ENV_VAR: Final[str] = "ARITHLAB_TRACE"


def trace_event(event: str, run_id: str, method: str) -> None:
    """Append one event line to ``$ARITHLAB_TRACE`` (a no-op when the variable is unset)."""
    path = os.environ.get(TRACE_ENV_VAR, "").strip()
    if not path:
        return
    line = json.dumps({"event": event, "run_id": run_id, "method": method, "pid": os.getpid(),
                       "t": round(time.time(), 3)}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))  # one O_APPEND write: lines never interleave
        finally:
            os.close(fd)
    except OSError:
        pass
