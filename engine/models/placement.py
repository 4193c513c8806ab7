"""Placement: where a model's weights go -- one device, or accelerate's ``device_map`` spread over
several GPUs with CPU/disk offload -- and where its inputs must be sent."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.models.spec import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def parse_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch.device (None: CUDA when available, else CPU); ModelLoadError if unusable."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"invalid device {device!r} ({e}); use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available; use device='cpu' "
                             f"or leave device=None to pick automatically")
    return dev



@dataclasses.dataclass(frozen=True)
class DevicePlacement:
    """Where the weights go: one ``device``, or accelerate's ``device_map`` (several GPUs, offload)."""

    device: torch.device | None
    device_map: str | dict[str, Any] | None = None
    max_memory: dict[Any, str] | None = None
    offload_folder: str | None = None

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        if self.device_map is None:
            return {}
        kwargs: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory is not None:
            kwargs["max_memory"] = self.max_memory
        if self.offload_folder is not None:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_placement(device: str | torch.device | None, device_map: str | dict[str, Any] | None,
                     max_memory: dict[Any, str] | None, offload_folder: str | Path | None) -> DevicePlacement:
    """Check the placement arguments of ``load_model`` / ``load_plain`` (ModelLoadError if inconsistent)."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise ModelLoadError("max_memory / offload_folder only apply together with a device_map")
        return DevicePlacement(parse_device(device))
    if device is not None:
        raise ModelLoadError(f"pass either device ({device!r}) or device_map, not both: a device_map "
                             f"places every module itself")
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ModelLoadError(f"unknown device_map {device_map!r}: use one of "
                                 f"{', '.join(DEVICE_MAP_STRATEGIES)} or a dict module -> device")
    elif not isinstance(device_map, dict) or not device_map:
        raise ModelLoadError(f"device_map must be a strategy name or a non-empty dict module -> device, "
                             f"got {device_map!r}")
    else:
        for target in device_map.values():
            if str(target) == "meta":
                raise ModelLoadError("device_map target 'meta' holds no weights; use a GPU index, "
                                     "'cpu' or 'disk'")
            if str(target) == "disk" and offload_folder is None:
                raise ModelLoadError("device_map offloads to 'disk': pass offload_folder as well")
            if str(target) not in ("cpu", "disk"):
                parse_device(target if not isinstance(target, int) else f"cuda:{target}")
    try:
        import accelerate  # noqa: F401
    except ImportError as e:  # pragma: no cover - pinned in requirements.txt
        raise ModelLoadError("device_map needs the accelerate package; run `make setup`") from e
    return DevicePlacement(None, device_map, max_memory,
                           None if offload_folder is None else str(offload_folder))


def place(hf_model: "PreTrainedModel", placement: DevicePlacement) -> torch.device:
    """Move the model (single device) or leave accelerate's placement; eval mode; its input device."""
    if placement.device is not None:
        hf_model.to(placement.device)
    hf_model.eval()
    return input_device(hf_model)


def input_device(hf_model: "PreTrainedModel") -> torch.device:
    """Where input ids must go: the input embedding's execution device (accelerate-aware)."""
    emb = hf_model.get_input_embeddings()
    hook = getattr(emb, "_hf_hook", None)
    if hook is not None and getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    device_map = getattr(hf_model, "hf_device_map", None) or {}
    for name, target in device_map.items():  # hooks sit on the map's modules, maybe above the embedding
        if str(target) not in ("disk", "meta"):
            mod = hf_model.get_submodule(name) if name else hf_model
            if any(m is emb for m in mod.modules()):
                return torch.device(f"cuda:{target}" if isinstance(target, int) else str(target))
    for p in emb.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")

