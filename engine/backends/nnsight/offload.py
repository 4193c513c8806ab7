"""Device maps and offload for the nnsight backend: where a module of a spread or offloaded model computes, and its
offloaded weights materialised while it is used.

**Device maps.**  Models spread over several GPUs (or offloaded) by ``device_map`` work too: inputs
go to the embedding's device, cached activations, weights and component outputs are returned on that
device, and offloaded weights are materialised per layer with accelerate's ``align_module_device``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def has_offload(model: torch.nn.Module) -> bool:
    return any(getattr(m, "_hf_hook", None) is not None and getattr(m._hf_hook, "offload", False)
               for m in model.modules())


def _owners(model: torch.nn.Module, path: str) -> Iterator[torch.nn.Module]:
    """``model``, then each module on the way down to ``path``."""
    yield model
    mod = model
    for part in path.split(".") if path else []:
        mod = getattr(mod, part)
        yield mod


def materialized(model: torch.nn.Module, path: str) -> contextlib.AbstractContextManager:
    """Offloaded weights of the module at ``path`` (or of the layer holding it) on their device."""
    for mod in _owners(model, path):
        hook = getattr(mod, "_hf_hook", None)
        if hook is not None and getattr(hook, "offload", False):
            from accelerate.utils import align_module_device
            return align_module_device(mod)
    return contextlib.nullcontext()


def execution_device(model: torch.nn.Module, path: str) -> torch.device:
    """Where the module at ``path`` computes: its accelerate hook's device, else its weights'."""
    device = None
    for mod in _owners(model, path):
        hook = getattr(mod, "_hf_hook", None)
        if hook is not None and getattr(hook, "execution_device", None) is not None:
            device = torch.device(hook.execution_device)
    if device is not None:
        return device
    module = model.get_submodule(path)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")
