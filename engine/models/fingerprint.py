"""Weights fingerprint: a hash of every parameter and persistent buffer under its plain Hugging
Face name, plus the config, so a cached result is tied to the exact weights that produced it --
the same for a model and its bridged self, for offloaded weights, and for a saved-and-reloaded copy.

The hash is BLAKE3 on every core (a cryptographic hash like sha256, but tree-shaped, so it runs in
parallel): a model's weights are read once at load time, several times faster than with sha256
(docs/benchmarks.md, opening a model).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import blake3
import torch

# config keys that say how a model was loaded or saved, not what it computes ("architectures" is
# None for GGUF configs and is filled in by save_pretrained, in place, on the live config)
VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "name_or_path", "dtype", "torch_dtype", "quantization_config", "architectures",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "attn_implementation",
})

# The process whose BLAKE3 thread pool has started.  The pool does not survive fork(): a forked
# child that hashes on it waits forever, so a child of that process hashes on one thread.
_THREADED_IN: int | None = None


def _hasher() -> "blake3.blake3":
    global _THREADED_IN
    if _THREADED_IN not in (None, os.getpid()):
        return blake3.blake3()
    _THREADED_IN = os.getpid()
    return blake3.blake3(max_threads=blake3.blake3.AUTO)


def _is_bridge_wrapper(module: torch.nn.Module) -> bool:
    return "_original_component" in module._modules and type(module).__module__.startswith(
        "transformer_lens.")


def canonical_tensors(module: torch.nn.Module, prefix: str, out: dict[str, torch.Tensor]) -> None:
    """Parameters and persistent buffers under their plain Hugging Face names.

    TransformerBridge wraps submodules (``layer._original_component.self_attn...``) and adds
    alias children (``self_attn.q`` for ``q_proj``); following only ``_original_component``
    through wrappers gives exactly the names of the un-bridged model.  The bridge also registers
    a persistent all-zero ``bias`` *buffer* on a bias-free ``lm_head``; an all-zero Linear bias
    buffer computes nothing, so it is left out (a non-zero one is hashed)."""
    if _is_bridge_wrapper(module):
        for name, p in module._parameters.items():  # weights a wrapper owns itself (none by default)
            if p is not None:
                out[f"{prefix}<bridge>.{name}"] = p
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                out[f"{prefix}<bridge>.{name}"] = b
        canonical_tensors(module._modules["_original_component"], prefix, out)
        return
    for name, p in module._parameters.items():
        if p is not None:
            out[prefix + name] = p
    for name, b in module._buffers.items():
        if b is None or name in module._non_persistent_buffers_set:
            continue
        if name == "bias" and isinstance(module, torch.nn.Linear) and not bool(b.any()):
            continue  # the bridge's synthetic zero unembedding bias: same function as no bias
        out[prefix + name] = b
    for name, child in module._modules.items():
        if child is not None:
            canonical_tensors(child, f"{prefix}{name}.", out)


def canonical_config_json(config: Any) -> str:
    """The config as canonical JSON without the keys that say how it was loaded or saved."""
    def clean(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items()
                    if not str(k).startswith("_") and k not in VOLATILE_CONFIG_KEYS}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    data = config.to_dict() if hasattr(config, "to_dict") else {}
    return json.dumps(clean(data), sort_keys=True, separators=(",", ":"), default=str)


def weights_fingerprint(model: Any, *, length: int = 16) -> str:
    """BLAKE3 (hex, first ``length`` chars) of every parameter and persistent buffer plus the config.

    ``model``: a LoadedModel, a TransformerBridge or a (bridged or plain) HF model -- a model
    and its bridged self give the same fingerprint.  Tensors are hashed in name order as
    (name, dtype, shape, raw bytes); tied tensors are hashed once and recorded as aliases.  Any
    change to any weight element changes the fingerprint.
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 64:
        raise ValueError(f"length must be an int in 1..64, got {length!r}")
    model = getattr(model, "hf_model", model)  # a LoadedModel or a PlainModel
    bridge_mod = sys.modules.get("transformer_lens.model_bridge")
    if bridge_mod is not None and isinstance(model, bridge_mod.TransformerBridge):
        model = model.original_model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weights_fingerprint needs a LoadedModel, TransformerBridge or nn.Module, "
                        f"got {type(model).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    canonical_tensors(model, "", tensors)
    offloaded = _offloaded_owners(model)
    h = _hasher()
    h.update(b"arith-lab-fingerprint-v2\0")
    h.update(canonical_config_json(getattr(model, "config", None)).encode())
    seen: dict[tuple[Any, ...], str] = {}
    with torch.no_grad(), OffloadReader(offloaded) as reader:
        for name in sorted(tensors):
            t = tensors[name].detach()
            if t.device.type == "meta":  # accelerate offload (device_map with "cpu"/"disk" targets)
                key: tuple[Any, ...] = ("meta", id(tensors[name]))  # tied weights are one Parameter
            else:
                key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                       t.stride(), t.dtype)
            h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
            if key in seen:
                h.update(f"alias-of\0{seen[key]}".encode())
                continue
            seen[key] = name
            if t.device.type == "meta":
                t = reader.value(name)
            flat = t.to("cpu").contiguous().reshape(-1)
            if flat.numel():
                h.update(flat.view(torch.uint8).numpy())  # raw bytes; bf16 etc. are viewed, not cast
    return h.hexdigest()[:length]


def _offloaded_owners(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Canonical name prefix -> module whose accelerate hook holds offloaded weights (none usually)."""
    modules: dict[str, torch.nn.Module] = {}
    _canonical_modules(model, "", modules)
    if not any(getattr(m, "_hf_hook", None) is not None for m in modules.values()):
        return {}
    from accelerate.utils import has_offloaded_params
    return {prefix: m for prefix, m in modules.items() if has_offloaded_params(m)}


def _canonical_modules(module: torch.nn.Module, prefix: str, out: dict[str, torch.nn.Module]) -> None:
    """Modules under their plain Hugging Face name prefixes (bridge wrappers skipped, as in
    ``canonical_tensors``)."""
    if _is_bridge_wrapper(module):
        _canonical_modules(module._modules["_original_component"], prefix, out)
        return
    out[prefix] = module
    for name, child in module._modules.items():
        if child is not None:
            _canonical_modules(child, f"{prefix}{name}.", out)


class OffloadReader:
    """Reads offloaded (meta) weights by materializing their owner module on the CPU, one at a time."""

    def __init__(self, owners: dict[str, torch.nn.Module]) -> None:
        self.owners = owners
        self._open: tuple[str, Any, dict[str, torch.Tensor]] | None = None

    def __enter__(self) -> "OffloadReader":
        return self

    def value(self, name: str) -> torch.Tensor:
        prefix = max((p for p in self.owners if name.startswith(p)), key=len, default=None)
        if prefix is None:
            raise ValueError(f"weight {name} is on the meta device and no accelerate hook holds it; "
                             f"the model has no data to fingerprint")
        if self._open is None or self._open[0] != prefix:
            self._close()
            from accelerate.utils import align_module_device
            ctx = align_module_device(self.owners[prefix], torch.device("cpu"))
            ctx.__enter__()
            real: dict[str, torch.Tensor] = {}
            self._open = (prefix, ctx, real)
            canonical_tensors(self.owners[prefix], prefix, real)
        return self._open[2][name].detach()

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].__exit__(None, None, None)
            self._open = None

    def __exit__(self, *exc: Any) -> None:
        self._close()
