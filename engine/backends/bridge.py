"""The TransformerBridge backend (transformer-lens 4): hooks by TransformerLens name on the bridged model."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from engine.backends.base import HookFn, ModelBackend, in_cpu_chunks, select_rows
from engine.models.load import LoadedModel


class BridgeBackend(ModelBackend):
    """TransformerLens 4 ``TransformerBridge`` over the raw Hugging Face model."""

    name = "bridge"

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.bridge = loaded.bridge
        self.facts = loaded.facts
        self.tokenizer = loaded.tokenizer
        # One model object serves every browser session: hooks are global to it, so any forward
        # pass and any hooked block holds this (re-entrant) lock.
        self._lock = threading.RLock()

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        from engine.models.load import logits
        with self._lock:
            out = logits(self.loaded, input_ids, attention_mask).to(self.device)
        self.meter.record(input_ids, out)
        return out

    def run_with_cache(self, input_ids, attention_mask, names):
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(self.device)}
        wanted = set(names)
        with self._lock:
            logits, cache = self.bridge.run_with_cache(input_ids.to(self.device),
                                                       names_filter=lambda n: n in wanted,
                                                       return_type="logits", **kwargs)
        self.meter.record(input_ids, logits)
        missing = wanted - set(cache.keys())
        if missing:
            raise KeyError(f"the model exposes no activation(s) {sorted(missing)}")
        # under a device_map each layer's activations sit on its own GPU: gather them
        return logits.to(self.device), {n: cache[n].detach().to(self.device) for n in names}

    @contextmanager
    def hooks(self, edits):
        def wrap(fn: HookFn):
            def hook(act, hook=None):  # TransformerLens passes (tensor, hook=HookPoint)
                out = fn(act)
                return act if out is None else out
            return hook
        with self._lock, self.bridge.hooks(fwd_hooks=[(n, wrap(fn)) for n, fn in edits]):
            yield

    @property
    def continues(self) -> bool:
        return True

    def prefix(self, input_ids: torch.Tensor) -> object:
        with self._lock, torch.no_grad():
            lg, cache = self.bridge(input_ids.to(self.device), return_type="logits_and_cache", use_cache=True)
        self.meter.record(input_ids, lg)
        return cache

    def continue_end_logits(self, prefix, rows, input_ids, *, start=None):
        cache = select_rows(prefix, rows, start)
        with self._lock, self.last_position_only(input_ids.shape[1]):
            lg = self.bridge(input_ids.to(self.device), return_type="logits", past_key_values=cache)
        self.meter.record(input_ids, lg)
        return lg[:, -1].to(self.device)  # [n, vocab]

    @property
    def parallel_attn_mlp(self) -> bool:
        return bool(getattr(self.bridge.cfg, "parallel_attn_mlp", False))

    def W_O(self, layer: int) -> torch.Tensor:
        attn = self.bridge.blocks[layer].attn
        with _aligned(attn):  # offloaded (device_map "cpu"/"disk") weights are meta until aligned
            return attn.W_O.detach().to(self.device)

    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        block = self.bridge.blocks[layer]
        dev = _module_device(block.ln2, x.device)

        def branch(rows: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, d_model]
            return block.mlp(block.ln2(rows[:, None, :].to(dev)))[:, 0, :].to(x.device)

        with self._lock:  # the components carry hook points too
            return in_cpu_chunks(branch, x, dev)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.bridge.ln_final
        dev = _module_device(norm, x.device)
        with self._lock:
            return in_cpu_chunks(lambda rows: norm(rows[:, None, :].to(dev))[:, 0, :].to(x.device), x, dev)

    def unembed(self):
        with _aligned(self.bridge.unembed):
            W_U = self.bridge.unembed.W_U.detach().to(self.device)
            b_U = getattr(self.bridge.unembed, "b_U", None)
            if b_U is not None and not bool(b_U.any()):
                b_U = None
            return W_U, (None if b_U is None else b_U.detach().to(self.device))


def _original(module: torch.nn.Module) -> torch.nn.Module:
    return module._modules.get("_original_component", module)


def _aligned(module: torch.nn.Module):
    """accelerate's ``align_module_device`` for every offloaded module under ``module`` (no-op otherwise)."""
    from contextlib import ExitStack
    stack = ExitStack()
    hooked = [m for m in module.modules() if getattr(getattr(m, "_hf_hook", None), "offload", False)]
    if hooked:
        from accelerate.utils import align_module_device
        for m in hooked:
            stack.enter_context(align_module_device(m))
    return stack


def _module_device(module: torch.nn.Module, default: torch.device) -> torch.device:
    """Where ``module`` computes (its accelerate hook's device, else its weights')."""
    for m in (module, _original(module)):
        hook = getattr(m, "_hf_hook", None)
        if hook is not None and getattr(hook, "execution_device", None) is not None:
            return torch.device(hook.execution_device)
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return default
