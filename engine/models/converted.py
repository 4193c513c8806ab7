"""A GGUF opened once is kept as a safetensors copy: later opens read the copy in seconds.

Opening a ``.gguf`` makes transformers parse every metadata field (a 262k-token vocabulary and its merges for
Gemma 3) and dequantize every tensor: about 10 s for SmolLM2-135M and 22 s for Gemma 3 270M on two cores, every
time -- in each CLI run, each dashboard, each test module.  The first float32 open of a GGUF therefore saves what
it produced -- the dequantized weights (``save_pretrained``, safetensors), the config and the tokenizer -- in a
folder of ``converted_root()`` (``ARITHLAB_CONVERTED``, default ``<repo>/.cache/converted``; ``off`` keeps
nothing), and a later float32 open of the same file loads that folder instead.

The copy is the GGUF's own dequantization, stored: the same tensors, so the same weights fingerprint (which also
hashes the config) and the same logits; the same tokenizer (its serialized form, vocabulary and special tokens).
``tests/integration/test_converted.py`` checks all of these on both real models against an open with the copy off.
The folder's name is a hash of what could change the result: the file's real path, size and modification time,
and the versions of transformers and gguf that converted it -- a new file under the same path, or a new
transformers, is converted afresh.  A copy is written to a temporary folder and renamed into place (two
processes converting at once: one copy wins, the other is dropped); a copy that fails to open is removed and
the GGUF opened as before.  Other precisions read the GGUF itself; a ``device_map`` open reads a copy but
never writes one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.models.spec import ResolvedSpec, SourceKind, resolve_spec
from engine.paths import REPO_ROOT

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ENV_VAR = "ARITHLAB_CONVERTED"
#: what the copy's folder records of its source (and what its name hashes)
MANIFEST = "converted_from.json"
#: the only precision a copy is kept in (the GGUF's dequantization, unrounded)
DTYPE = "float32"
#: tokenizer flags a GGUF's tokenizer holds from the file's metadata but ``save_pretrained`` does not keep (Gemma 3's
#: reloaded with ``add_bos_token`` False, its template still prepending ``<bos>``): kept in the manifest, passed back
TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token")


def converted_root() -> Path | None:
    """Where copies are kept; None when ``ARITHLAB_CONVERTED=off``."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in {"off", "0", "no", "false"}:
        return None
    return Path(value) if value else REPO_ROOT / ".cache" / "converted"


def source_record(resolved: ResolvedSpec) -> dict[str, Any]:
    """What the copy of ``resolved`` depends on: the file (real path, size, mtime) and the converting versions."""
    import gguf
    import transformers
    path = Path(resolved.location).resolve()
    st = path.stat()
    return {"gguf": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "transformers": transformers.__version__, "gguf_package": getattr(gguf, "__version__", "?")}


def copy_folder(resolved: ResolvedSpec) -> Path | None:
    """The folder that holds (or would hold) the copy of the GGUF ``resolved``; None for other kinds or when off."""
    root = converted_root()
    if root is None or resolved.kind is not SourceKind.GGUF:
        return None
    record = source_record(resolved)
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return root / f"{Path(record['gguf']).stem}-{digest}"


def existing_copy(resolved: ResolvedSpec, dtype_name: str) -> ResolvedSpec | None:
    """The copy of ``resolved`` to open in its place, resolved as a model folder (its safety checks run), or None:
    not a GGUF, another precision, no copy yet, or a copy that no longer passes the checks (then removed)."""
    folder = copy_folder(resolved) if dtype_name == DTYPE else None
    if folder is None or not (folder / MANIFEST).is_file():
        return None
    try:
        return resolve_spec(str(folder))
    except Exception:  # noqa: BLE001 - a damaged copy: drop it, the GGUF is opened as before
        discard(folder)
        return None


def tokenizer_kwargs(copy: ResolvedSpec) -> dict[str, bool]:
    """The ``from_pretrained`` arguments the copy's tokenizer needs to be the GGUF's (``TOKENIZER_FLAGS``)."""
    return json.loads((Path(copy.location) / MANIFEST).read_text()).get("tokenizer_flags", {})


def discard(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def keep_copy(resolved: ResolvedSpec, dtype_name: str, hf_model: "PreTrainedModel",
              tokenizer: "PreTrainedTokenizerBase") -> Path | None:
    """Save the just-dequantized ``hf_model`` and its ``tokenizer`` as the copy of ``resolved`` (float32 only);
    its folder, or None when nothing was kept (off, another kind or precision, or the save failed: the copy is an
    optimisation, never an error)."""
    folder = copy_folder(resolved) if dtype_name == DTYPE else None
    if folder is None or (folder / MANIFEST).is_file():
        return None
    tmp: Path | None = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the copy from the checkout's other users
        hf_model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        record = source_record(resolved) | {"tokenizer_flags": {
            flag: value for flag in TOKENIZER_FLAGS if isinstance(value := getattr(tokenizer, flag, None), bool)}}
        (tmp / MANIFEST).write_text(json.dumps(record, indent=1))
    except Exception:  # noqa: BLE001 - a full disk, a read-only folder: open from the GGUF next time too
        if tmp is not None:
            discard(tmp)
        return None
    try:
        os.rename(tmp, folder)  # atomic; fails when another process's copy landed first
    except OSError:
        discard(tmp)
    return folder

