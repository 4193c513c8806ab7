"""NDIF, the remote side of the nnsight backend: the API key, the request backend, the lab's code shipped with each
request, remote failures as one error that never shows the key, and a remote model's cache identity.

**Remote execution.**  With ``remote=True`` the model is nnsight's meta-device copy of a Hugging
Face hub model (no weights here) and every forward pass is one request to NDIF (``api.ndif.us`` or
``NDIF_HOST``) authenticated with the key in ``$NDIF_API_KEY`` -- read when a request is built, sent
in the ``ndif-api-key`` header and nowhere else (never in facts, cache entries, logs or errors).
The per-layer components (W_O, the unembedding) are downloaded once; MLP and final-norm calls of
fast path patching are one small request each.  ``remote="local"`` runs the same serialised request
in this process against local weights (nnsight's dry run of the remote path).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from engine.models.spec import ModelLoadError

NDIF_KEY_ENV = "NDIF_API_KEY"
NDIF_HOST_ENV = "NDIF_HOST"
DEFAULT_NDIF_HOST = "https://api.ndif.us"


def ship_the_lab() -> None:
    """The lab's own code travels with each remote request (by value): NDIF does not have it installed.

    nnsight ships by value only the modules it finds "local" -- importable from the working tree but
    not from a pip install -- and ``make setup`` installs the lab (editable), so name it explicitly
    (``nnsight.register`` adds the name to cloudpickle's set: calling it again changes nothing)."""
    import nnsight
    nnsight.register("engine")


class NdifError(ModelLoadError):
    """A remote (NDIF) request failed; the message says why (and never holds the API key)."""


def is_remote_failure(e: BaseException) -> bool:
    from nnsight.intervention.backends.remote import RemoteError
    if isinstance(e, (RemoteError, ConnectionError, TimeoutError)):
        return True
    module = type(e).__module__ or ""
    return module.startswith(("httpx", "httpcore", "websocket", "ssl", "socket"))


def scrub(text: str) -> str:
    key = os.environ.get(NDIF_KEY_ENV, "").strip()
    return text.replace(key, "***") if key else text


def remote_fingerprint(repo_id: str, revision: str | None, config: Any, dtype: str, *, length: int = 16) -> str:
    """Cache identity of a model whose weights live on NDIF: hub id, revision, config and dtype.

    The weights cannot be read from here, so this cannot equal ``weights_fingerprint`` of a local
    copy; it is stable across runs and machines, so remote results are cached and reused."""
    from engine.models.fingerprint import canonical_config_json
    h = hashlib.sha256()
    h.update(b"arith-lab-remote-v1\0")
    h.update(json.dumps({"repo_id": repo_id, "revision": revision or "main", "dtype": dtype}, sort_keys=True).encode())
    h.update(canonical_config_json(config).encode())
    return h.hexdigest()[:length]


def ndif_api_key() -> str:
    """The NDIF API key from ``$NDIF_API_KEY`` (never printed); ModelLoadError when unset."""
    key = os.environ.get(NDIF_KEY_ENV, "").strip()
    if not key:
        raise ModelLoadError(f"remote execution needs an NDIF API key in the environment variable {NDIF_KEY_ENV} "
                             f"(sign up at https://ndif.us, then `read -rs {NDIF_KEY_ENV} && export {NDIF_KEY_ENV}`)")
    return key


def remote_backend(model: Any, host: str | None = None) -> Any:
    """nnsight's RemoteBackend for one request: key from the environment, status display off
    (the CLI prints JSON on stdout), host from ``host`` / ``$NDIF_HOST`` / api.ndif.us."""
    from nnsight.intervention.backends.remote import RemoteBackend
    backend = RemoteBackend(model.to_model_key(), host=host or os.environ.get(NDIF_HOST_ENV) or DEFAULT_NDIF_HOST,
                            api_key=ndif_api_key(), env=model._remoteable_get_env(), blocking=True)
    backend.display.enabled = False
    return backend
