"""The narrow interface every technique and page talks to (cf. llm-transparency-tool's TransparentLlm).

Techniques never touch TransformerBridge (or nnsight) directly: they call a :class:`ModelBackend`,
which offers exactly what the paper's methods need --

* ``logits`` / ``run_with_cache`` / ``hooks`` -- forward passes, cached activations by TransformerLens
  hook name (built with :mod:`engine.hooks`), and interventions in a ``with`` block that always
  removes its hooks (the loaded model is shared by every browser session);
* ``logits_at`` / ``end_logits`` -- the final norm and the unembedding at chosen positions only
  (the END row of each prompt), never the full ``[batch, pos, vocab]`` tensor: an edit of the final
  norm's input keeps those positions (``hooks.ln_final_in``), so it works on every backend;
* per-layer *components* for exact single-position computations: the per-head output projection
  W_O, the MLP branch (its norm included) and the final norm + unembedding.  Fast path patching
  (:mod:`engine.patching`) chains these at the END position only.

``open_model(spec, backend="bridge" | "nnsight")`` is the one entry point the CLI and pages use:
``bridge`` is TransformerBridge (transformer-lens 4), ``nnsight`` the nnsight wrapper of the plain
Hugging Face model (:mod:`engine.nnsight_backend`), which can also run on NDIF (``remote=True``).
Both give the same numbers (``tests/integration/test_backends.py``) and the same weights
fingerprint, so their results share the cache entries.  ``device_map`` spreads a model over
several GPUs (accelerate); activations, weights and component outputs come back on the
embedding's device either way.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine import hooks as hook_names
from engine.hooks import HookName
from engine.models import LoadedModel, ModelFacts, load_model

HookFn = Callable[[torch.Tensor], torch.Tensor | None]

BACKENDS: tuple[str, ...] = ("bridge", "nnsight")


@dataclass
class WorkMeter:
    """Work a backend has done, for benchmarks and tests (never used for results).

    ``forward_calls`` counts forward passes; ``body_tokens`` the positions they carried through
    every block (padding included); ``unembed_rows`` the positions that went through the final norm
    and the unembedding (``batch * pos`` for full logits, ``batch`` for END-only logits).
    """

    forward_calls: int = 0
    body_tokens: int = 0
    unembed_rows: int = 0

    def record(self, input_ids: torch.Tensor, logits: torch.Tensor) -> None:
        self.forward_calls += 1
        self.body_tokens += int(input_ids.numel())
        self.unembed_rows += int(logits.shape[:-1].numel())


def macs_per_position(facts: ModelFacts) -> tuple[float, float, float]:
    """Multiply-accumulates per position: (all blocks, the unembedding, one MLP branch).

    Blocks: the q/k/v/o projections (grouped-query k/v counted at their width) and the MLP (three
    matrices when gated, two otherwise); attention scores are left out.  The unit of the lab's
    forward-equivalent counts (``bench/sweeps.py``, the Knockout page's cost estimate)."""
    d = facts.d_model
    attn = 2 * d * facts.d_head * (facts.n_heads + facts.n_kv_heads)
    gated = facts.model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma")
    mlp = (3 if gated else 2) * d * facts.d_mlp
    return float(facts.n_layers * (attn + mlp)), float(d * facts.vocab_size), float(mlp)


class ModelBackend(ABC):
    """A loaded causal LM seen through the lab's narrow interface."""

    name: str
    facts: ModelFacts
    tokenizer: object

    @property
    def meter(self) -> WorkMeter:
        """Forward passes and tokens so far (see :class:`WorkMeter`); reset by assigning a new one."""
        if "_meter" not in self.__dict__:
            self._meter = WorkMeter()
        return self._meter

    @meter.setter
    def meter(self, value: WorkMeter) -> None:
        self._meter = value

    @abstractmethod
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """# [batch, pos, vocab]"""

    @abstractmethod
    def run_with_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       names: Sequence[HookName]) -> tuple[torch.Tensor, dict[HookName, torch.Tensor]]:
        """Logits and the named activations (detached)."""

    @abstractmethod
    def hooks(self, edits: Sequence[tuple[HookName, HookFn]]) -> AbstractContextManager[None]:
        """Forward hooks active inside the ``with`` block; ``fn(act)`` may edit in place or return."""

    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  positions: torch.Tensor) -> torch.Tensor:
        """Logits at ``positions[i]`` of row i only: the final norm and the unembedding run on those.

        positions: [batch, m] -> [batch, m, vocab].  Active ``hooks`` apply as in :meth:`logits`.
        """
        pos = positions.to(torch.long)

        def keep(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model] -> [batch, m, d_model]
            rows = torch.arange(act.shape[0], device=act.device)[:, None]
            return act[rows, pos.to(act.device)]

        with self.hooks([(hook_names.ln_final_in(), keep)]):
            return self.logits(input_ids, attention_mask)

    def end_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   end: torch.Tensor) -> torch.Tensor:
        """Next-token logits at each row's END position only.  end: [batch] -> [batch, vocab]"""
        return self.logits_at(input_ids, attention_mask, end.reshape(-1, 1))[:, 0]

    # -- components for exact END-position chains ------------------------------------------------
    @property
    @abstractmethod
    def parallel_attn_mlp(self) -> bool:
        """True when the MLP reads the block input (GPT-J/NeoX), not the post-attention stream."""

    @abstractmethod
    def W_O(self, layer: int) -> torch.Tensor:
        """Per-head output projection. # [head, d_head, d_model]"""

    @abstractmethod
    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """MLP(norm2(x)) for residual vectors x. # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm. # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def unembed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W_U # [d_model, vocab], b_U # [vocab] or None)."""

    def answer_logits(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Logit of ``token_ids[i]`` for residual vector ``x[i]`` (only those columns are computed).

        x: [n, d_model], token_ids: [n] -> [n]
        """
        W_U, b_U = self.unembed()
        h = self.final_norm(x)
        out = (h * W_U[:, token_ids].T).sum(-1)
        if b_U is not None:
            out = out + b_U[token_ids]
        return out

    @property
    def device(self) -> torch.device:
        return torch.device(self.facts.device)


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
        from engine.models import logits
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
    def parallel_attn_mlp(self) -> bool:
        return bool(getattr(self.bridge.cfg, "parallel_attn_mlp", False))

    def W_O(self, layer: int) -> torch.Tensor:
        attn = self.bridge.blocks[layer].attn
        with _aligned(attn):  # offloaded (device_map "cpu"/"disk") weights are meta until aligned
            return attn.W_O.detach().to(self.device)

    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        block = self.bridge.blocks[layer]
        with self._lock:  # the components carry hook points too
            h = x[:, None, :].to(_module_device(block.ln2, x.device))
            return block.mlp(block.ln2(h))[:, 0, :].to(x.device)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            h = x[:, None, :].to(_module_device(self.bridge.ln_final, x.device))
            return self.bridge.ln_final(h)[:, 0, :].to(x.device)

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


def open_model(spec: str = "organism", *, device: str | None = None, dtype: str = "float32",
               backend: str = "bridge", device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | None = None, remote: bool | str = False,
               ndif_host: str | None = None) -> ModelBackend:
    """Load ``spec`` and wrap it in the chosen backend (``bridge`` or ``nnsight``).

    ``device_map`` ("auto", ... or a dict; see ``engine.models.load_model``) spreads the model over
    several GPUs instead of ``device``.  ``remote=True`` (nnsight only) runs a hub model on NDIF
    with the key in ``$NDIF_API_KEY`` (``dtype`` does not apply: NDIF serves its deployment's dtype,
    which ``facts.dtype`` reports); ``remote="local"`` sends every trace through nnsight's
    serialise/deserialise dry run of a remote request, on local weights."""
    from engine.models import ModelLoadError
    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    if remote and backend != "nnsight":
        raise ModelLoadError("remote execution (NDIF) needs the nnsight backend: pass --backend nnsight")
    if backend == "nnsight":
        from engine import nnsight_backend
        if remote is True:
            if device is not None or device_map is not None:
                raise ModelLoadError("a remote model runs on NDIF's GPUs: drop --device / --device-map")
            return nnsight_backend.open_remote(spec, host=ndif_host)  # NDIF picks the dtype; facts say which
        return nnsight_backend.open_local(spec, device=device, dtype=dtype, device_map=device_map,
                                          max_memory=max_memory, offload_folder=offload_folder, remote=remote)
    return BridgeBackend(load_model(spec, device=device, dtype=dtype, device_map=device_map,
                                    max_memory=max_memory, offload_folder=offload_folder))
