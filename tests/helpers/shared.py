"""The folder an xdist run's workers share (created by tests/conftest.py's controller, removed at the end): the
result cache of the browser tests' dashboards (one per worker, tests/e2e/conftest.py) and the architecture matrix's
results (tests/integration/arch_matrix.py: stored_result) live there, so each result is made once per run."""

from __future__ import annotations

import os
from pathlib import Path

#: set by tests/conftest.py on an xdist run
SHARED_ENV = "ARITHLAB_TEST_SHARED"


def shared_folder() -> Path | None:
    """The run's shared folder in an xdist worker, else None (one process: nothing to share)."""
    shared = os.environ.get(SHARED_ENV)
    return Path(shared) if shared and os.environ.get("PYTEST_XDIST_WORKER") else None
