"""The second backend: nnsight over the plain Hugging Face model, locally or on NDIF.

:class:`NnsightBackend` implements :class:`engine.backends.base.ModelBackend` with `nnsight
<https://nnsight.net>`_ (0.8) instead of TransformerBridge.  Techniques do not know which one they
talk to: they name activations with the TransformerLens hook names of :mod:`engine.backends.hooks`, and the
backend maps each name onto a module of the un-bridged model -- its input or output, reshaped to
the bridge's shape -- through the per-architecture table :data:`engine.backends.layouts.LAYOUTS`.  One module
per concern, each opening with its part:

* :mod:`.sites` -- the map from hook names to sites (the table, edit semantics), reading and writing a site in
  the bridge's shape, and the plan of one traced pass;
* :mod:`.backend` -- :class:`NnsightBackend`: traced forward passes with the active edits, prefixes, components;
* :mod:`.offload` -- device maps and offloaded weights;
* :mod:`.ndif` -- remote execution on NDIF: the API key, the request backend, errors that never show the key;
* :mod:`.opening` -- opening a model: local (``open_local``, ``wrap``) or on NDIF (``open_remote``).

The package re-exports what other modules, tests and benchmarks use (``from engine.backends.nnsight import ...``).
"""

from __future__ import annotations

from engine.backends.nnsight.backend import NnsightBackend, nnsight_save
from engine.backends.nnsight.ndif import (
    DEFAULT_NDIF_HOST,
    NDIF_HOST_ENV,
    NDIF_KEY_ENV,
    NdifError,
    ndif_api_key,
    remote_backend,
    remote_fingerprint,
    ship_the_lab,
)
from engine.backends.nnsight.opening import open_local, open_remote, wrap
from engine.backends.nnsight.sites import Site

__all__ = [
    "NnsightBackend", "nnsight_save", "DEFAULT_NDIF_HOST", "NDIF_HOST_ENV", "NDIF_KEY_ENV", "NdifError",
    "ndif_api_key", "remote_backend", "remote_fingerprint", "ship_the_lab", "open_local", "open_remote", "wrap",
    "Site",
]
