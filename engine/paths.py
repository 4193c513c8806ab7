"""Where the repository is: the one root every module resolves its files from."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
