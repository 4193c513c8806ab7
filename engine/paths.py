"""Where the repository is: the one root every module resolves its files from."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The environment variable naming the evaluation data folder (laid out like ``../shared/data``).
ENV_DATA_DIR = "ARITHLAB_DATA"


def default_data_dir() -> Path:
    """``$ARITHLAB_DATA`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get(ENV_DATA_DIR, "").strip()
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"
