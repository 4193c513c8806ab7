"""Model backends behind one narrow interface (:class:`engine.backends.base.ModelBackend`).

``open_model`` is the one entry point: ``bridge`` (:mod:`engine.backends.bridge`, TransformerBridge)
or ``nnsight`` (:mod:`engine.backends.nnsight`, also remote on NDIF).
"""

from __future__ import annotations

from engine.backends.base import BACKENDS, ModelBackend
from engine.backends.bridge import BridgeBackend
from engine.models.load import load_model


def open_model(spec: str = "organism", *, device: str | None = None, dtype: str = "float32",
               backend: str = "bridge", device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | None = None, remote: bool | str = False,
               ndif_host: str | None = None) -> ModelBackend:
    """Load ``spec`` and wrap it in the chosen backend (``bridge`` or ``nnsight``).

    ``device_map`` ("auto", ... or a dict; see ``engine.models.load.load_model``) spreads the model over
    several GPUs instead of ``device``.  ``remote=True`` (nnsight only) runs a hub model on NDIF
    with the key in ``$NDIF_API_KEY`` (``dtype`` does not apply: NDIF serves its deployment's dtype,
    which ``facts.dtype`` reports); ``remote="local"`` sends every trace through nnsight's
    serialise/deserialise dry run of a remote request, on local weights."""
    from engine.models.spec import ModelLoadError
    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    if remote and backend != "nnsight":
        raise ModelLoadError("remote execution (NDIF) needs the nnsight backend: pass --backend nnsight")
    if backend == "nnsight":
        from engine.backends import nnsight as nnsight_backend
        if remote is True:
            if device is not None or device_map is not None:
                raise ModelLoadError("a remote model runs on NDIF's GPUs: drop --device / --device-map")
            return nnsight_backend.open_remote(spec, host=ndif_host)  # NDIF picks the dtype; facts say which
        opened: ModelBackend = nnsight_backend.open_local(spec, device=device, dtype=dtype, device_map=device_map,
                                                          max_memory=max_memory, offload_folder=offload_folder,
                                                          remote=remote)
    else:
        opened = BridgeBackend(load_model(spec, device=device, dtype=dtype, device_map=device_map,
                                          max_memory=max_memory, offload_folder=offload_folder))
    opened.check_end_rows()  # also: a model the backend cannot run at all is refused here, in one line
    opened.check_shapes()
    return opened
