"""Opening a model for the nnsight backend: a local (or device-mapped) Hugging Face model wrapped for nnsight, or a hub
model's meta-device copy run on NDIF.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from engine.backends.layouts import layout_for
from engine.backends.nnsight.backend import NnsightBackend
from engine.backends.nnsight.ndif import ndif_api_key, remote_fingerprint
from engine.models.facts import ModelFacts
from engine.models.spec import ModelLoadError


def open_local(spec: str, *, device: str | None = None, dtype: str = "float32",
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | None = None, remote: bool | str = False) -> NnsightBackend:
    """Load ``spec`` (any spec ``load_model`` takes) as a plain HF model and wrap it for nnsight.

    ``remote="local"`` sends every trace through nnsight's serialise / deserialise dry run of a
    remote request (a test of the remote path with local weights)."""
    from engine.models.load import load_plain, plain_facts
    plain = load_plain(spec, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory,
                       offload_folder=offload_folder)
    layout_for(str(getattr(plain.hf_model.config, "model_type", "")))  # fail before wrapping
    model = wrap(plain.hf_model, plain.tokenizer)
    return NnsightBackend(model, plain.tokenizer, plain_facts(plain), remote=remote)


def wrap(hf_model: torch.nn.Module, tokenizer: Any) -> Any:
    """An nnsight ``TransformersModel`` around an already loaded HF causal LM (weights untouched)."""
    from nnsight.modeling.transformers import TransformersModel
    with _tokenizer_kept(tokenizer):
        return TransformersModel(hf_model, tokenizer=tokenizer, task="text-generation")


@contextmanager
def _tokenizer_kept(tokenizer: Any) -> Iterator[None]:
    """nnsight sets a pad token and left padding for its own text inputs; the lab passes token ids it
    padded itself and shares the tokenizer with everything else: leave it as it was."""
    pad = tokenizer.pad_token
    side = getattr(tokenizer, "padding_side", None)
    try:
        yield
    finally:
        if pad is None and tokenizer.pad_token is not None:
            tokenizer.pad_token = None
        if side is not None:
            tokenizer.padding_side = side


def open_remote(spec: str, *, host: str | None = None, revision: str | None = None,
                probe: bool = True) -> NnsightBackend:
    """A hub model run on NDIF: config and tokenizer here (from the hub or the local HF cache),
    weights and compute on the server.  Needs ``$NDIF_API_KEY``; raises ModelLoadError otherwise.

    NDIF runs its deployment in the dtype it chose; one small request (``probe``) asks which, so
    ``facts.dtype`` -- part of every cache key -- says what really computed the results."""
    from engine.models.facts import facts_from_config
    from engine.models.load import load_config, load_tokenizer
    from engine.models.spec import SourceKind, check_architecture, resolve_spec
    resolved = resolve_spec(spec)
    if resolved.kind is not SourceKind.HUB:
        what = {SourceKind.ORGANISM: "the bundled model", SourceKind.LOCAL_DIR: "a local directory",
                SourceKind.GGUF: "a .gguf file"}.get(resolved.kind, resolved.kind.value)
        raise ModelLoadError(f"remote execution runs hub models on NDIF's servers, and {spec!r} is {what}: pass "
                             f"a hub id NDIF hosts, such as meta-llama/Llama-3.1-8B (docs/scaling.md), or "
                             f"drop --remote to run it here")
    ndif_api_key()  # fail early, before anything is loaded
    try:
        config = load_config(resolved)
    except ModelLoadError as e:
        raise ModelLoadError(f"{e} (a remote run still reads the model's config and tokenizer from the hub: "
                             f"allow network access, or fetch them once into the HF cache)") from e
    architecture = check_architecture(config)
    layout_for(str(getattr(config, "model_type", "")))
    tokenizer = load_tokenizer(resolved)
    from nnsight.modeling.transformers import TransformersModel
    try:
        with _tokenizer_kept(tokenizer):
            model = TransformersModel(resolved.repo_id, revision=revision, task="text-generation", config=config,
                                      tokenizer=tokenizer, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"nnsight could not build the meta model of {spec!r} "
                             f"({type(e).__name__}: {str(e)[:300]})") from e
    n_params = sum(p.numel() for p in model._module.parameters())
    vocab = int(model._module.get_input_embeddings().weight.shape[0])

    def facts(dtype_name: str) -> ModelFacts:
        return facts_from_config(resolved, architecture, config, dtype_name, "remote", n_params,
                                 remote_fingerprint(resolved.repo_id, revision, config, dtype_name), vocab_size=vocab)

    backend = NnsightBackend(model, tokenizer, facts("unknown"), remote=True, host=host)
    if probe:
        backend.facts = facts(backend.server_dtype())
    return backend
