"""The TransformerBridge backend (transformer-lens 4): hooks by TransformerLens name on the bridged model.

Its exact components follow the block model of :mod:`engine.backends.layouts`, read off the bridge's own
blocks -- TransformerLens's adapter of the architecture names each block's ``ln1_post`` (a post-attention
norm), ``ln2`` (the MLP's pre-norm; in a parallel block without one the MLP reads ``ln1``), ``ln2_post``
(a post-MLP norm), its parallel flag, its residual scale (``residual_contribution_scale``, Granite) and the
transform of the output logits (``adapter.apply_output_logits_transform``)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable

import torch

from engine.backends import hooks as hook_names
from engine.backends.base import (
    BlockCalls,
    HookFn,
    MissingActivation,
    ModelBackend,
    PassStopped,
    in_cpu_chunks,
    last_block,
    select_rows,
)
from engine.models.load import LoadedModel


class BridgeBackend(ModelBackend):
    """TransformerLens 4 ``TransformerBridge`` over the raw Hugging Face model."""

    name = "bridge"

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.bridge = loaded.bridge
        self.facts = loaded.facts
        self.tokenizer = loaded.tokenizer
        check_hooks(self.bridge, self.facts)
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
        asked = list(names)
        read = [self._alias(n) for n in asked]
        wanted = set(read)
        with self._lock:
            logits, cache = self.bridge.run_with_cache(input_ids.to(self.device),
                                                       names_filter=lambda n: n in wanted,
                                                       return_type="logits", **kwargs)
        self.meter.record(input_ids, logits)
        missing = wanted - set(cache.keys())
        if missing:
            raise MissingActivation(f"{self.facts.architecture} exposes no activation(s) {sorted(missing)} (its "
                                    f"TransformerBridge adapter has no such hook point on this model)")
        # under a device_map each layer's activations sit on its own GPU: gather them
        return logits.to(self.device), {a: cache[n].detach().to(self.device) for a, n in zip(asked, read)}

    def _alias(self, name):
        """A parallel block's MLP reads the block input: there ``hooks.mlp_in(l)`` is ``hooks.resid_pre(l)``."""
        if self.parallel_attn_mlp and str(name).endswith(".hook_mlp_in"):
            return hook_names.resid_pre(int(str(name).split(".")[1]))
        return name

    def _point(self, name: str):
        """The bridge's HookPoint of a TransformerLens hook name, resolved once per backend by the bridge's own rules
        (its aliases; a hook point this model never fires refused)."""
        if "_points" not in self.__dict__:  # the bridge's hook points and aliases, read once
            from transformer_lens.model_bridge.bridge_core import build_alias_to_canonical_map
            hook_dict = self.bridge.hook_dict
            self._hook_index = (build_alias_to_canonical_map(hook_dict), hook_dict)
            self._points = {}
        if name not in self._points:
            self._points[name] = self.bridge._resolve_hook_point(name, *self._hook_index)[1]
        return self._points[name]

    @contextmanager
    def hooks(self, edits):
        """The edits in place for the block; MissingActivation after a block that ran the model but never fired
        one of them (a hook point the adapter names but this model does not run: the edit would change nothing)."""
        fired: set[str] = set()

        def wrap(name: str, fn: HookFn):
            def hook(act, hook=None):  # TransformerLens passes (tensor, hook=HookPoint)
                fired.add(str(name))
                out = fn(act)
                return act if out is None else out
            return hook
        if getattr(self.bridge, "compatibility_mode", False):  # its hooks are called once per alias name
            with self._lock, self.bridge.hooks(fwd_hooks=[(n, wrap(n, fn)) for n, fn in edits]):
                yield
        else:  # as the bridge's own ``hooks`` does it, the names resolved once (it rebuilds its alias map per call)
            with self._lock:
                level = getattr(self.bridge, "context_level", 0) + 1
                self.bridge.context_level = level
                added = []
                try:
                    for n, fn in edits:
                        point = self._point(str(n))
                        added.append((point, point.add_hook(wrap(n, fn), dir="fwd", level=level)))
                    yield
                finally:
                    for point, handle in added:
                        self.bridge._remove_temporary_hook(point, "fwd", handle)
                    self.bridge.context_level = level - 1
        silent = {str(n) for n, _ in edits} - fired
        if fired and silent:
            raise MissingActivation(f"{self.facts.architecture} never runs hook point(s) {sorted(silent)[:4]} (its "
                                    f"TransformerBridge adapter names them, this model does not fire them)")

    @property
    def stops_early(self) -> bool:
        return True

    def activations_upto(self, input_ids, attention_mask, names):
        asked = list(names)
        last = last_block(asked)
        got: dict = {}

        def keep(name):
            def fn(act):  # after the active edits of the same hook point (registered before it)
                got[name] = act.detach()
            return fn

        def stop(act):
            raise PassStopped
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(self.device)}
        try:
            with torch.no_grad(), self.hooks([(self._alias(n), keep(n)) for n in asked]
                                             + [(hook_names.resid_post(last), stop)]):
                self.bridge(input_ids.to(self.device), return_type="logits", **kwargs)
        except PassStopped:
            self.meter.record_upto(input_ids, last + 1)
        else:
            raise MissingActivation(f"{self.facts.architecture}'s block {last} never fired its output hook")
        return {n: got[n].to(self.device) for n in asked}

    @property
    def runs_one_block(self) -> bool:
        return True

    def block_calls(self, input_ids, attention_mask):
        taken: dict[int, tuple] = {}

        def take(layer: int):
            def pre(module, args, kwargs):  # the block's call as the model made it
                rest = tuple(args[1:])
                kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                taken[layer] = (rest, kw, bool(args))
            return pre
        handles = [b.register_forward_pre_hook(take(j), with_kwargs=True) for j, b in enumerate(self.bridge.blocks)]
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(self.device)}
        try:
            with self._lock, torch.no_grad():
                lg = self.bridge(input_ids.to(self.device), return_type="logits", **kwargs)
        finally:
            for h in handles:
                h.remove()
        self.meter.record(input_ids, lg)
        if sorted(taken) != list(range(self.facts.n_layers)):
            raise MissingActivation(f"{self.facts.architecture}: the pass called blocks {sorted(taken)}, not each of "
                                    f"its {self.facts.n_layers} once")
        return BlockCalls(int(input_ids.shape[0]), tuple(taken[j] for j in range(self.facts.n_layers)))

    def block_activations(self, calls, layer, resid_pre, names, *, stop=False):
        rest, kw, positional = calls.calls[layer]
        S = resid_pre.shape[0] // calls.rows
        rest = _repeated(rest, calls.rows, S)
        kw = {k: _repeated(v, calls.rows, S) for k, v in kw.items()}
        if "use_cache" in kw:
            kw["use_cache"] = False
        asked = list(names)
        got: dict = {}

        def keep(name):
            def fn(act):
                got[name] = act.detach()
                if stop and len(got) == len(asked):
                    raise PassStopped
            return fn
        x = resid_pre.to(self.device, next(self.bridge.parameters()).dtype)
        try:
            with self.hooks([(self._alias(n), keep(n)) for n in asked]):  # in the caller's grad mode
                block = self.bridge.blocks[layer]
                if positional:
                    block(x, *rest, **kw)
                else:
                    block(hidden_states=x, **kw)
        except PassStopped:
            pass
        self.meter.record_block(x, attention_only=stop and all(hook_names.in_attention(n) for n in asked))
        missing = set(asked) - set(got)
        if missing:
            raise MissingActivation(f"{self.facts.architecture}'s block {layer} run alone fired no {sorted(missing)}")
        return {n: got[n].to(self.device) for n in asked}

    @property
    def continues(self) -> bool:
        return True

    def prefix(self, input_ids: torch.Tensor) -> object:
        with self._lock, torch.no_grad(), self.last_position_only(input_ids.shape[1]):  # the keys and values only
            lg, cache = self.bridge(input_ids.to(self.device), return_type="logits_and_cache", use_cache=True)
        self.meter.record(input_ids, lg)
        return cache

    def prefix_with_cache_at(self, input_ids, names, positions):
        got: dict = {}
        pos = positions.to(torch.long)

        def keep(name):
            def fn(act):  # [n, T, ...]: read the rows' positions, change nothing
                got[name] = act[torch.arange(act.shape[0], device=act.device)[:, None], pos.to(act.device)].detach()
            return fn
        T = input_ids.shape[1]
        with self._lock, torch.no_grad(), self.hooks([(self._alias(n), keep(n)) for n in names]), \
                self.last_position_only(T):
            lg, cache = self.bridge(input_ids.to(self.device), return_type="logits_and_cache", use_cache=True)
        self.meter.record(input_ids, lg)
        missing = set(names) - set(got)
        if missing:
            raise MissingActivation(f"{self.facts.architecture} exposes no activation(s) {sorted(missing)} (its "
                                    f"TransformerBridge adapter has no such hook point on this model)")
        return cache, lg[:, -1].to(self.device), {n: got[n].to(self.device) for n in names}

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

    def block_parts(self, layer: int) -> dict[str, object]:
        """The block's pieces of the block model: ``attn_post_norm``, ``mlp_pre_norm``, ``mlp_post_norm``
        (bridge components or None), ``mlp`` and ``scale`` (the residual multiplier)."""
        block = self.bridge.blocks[layer]
        sub = getattr(block, "submodules", None) or {}
        pre = sub.get("ln2")
        if pre is None and self.parallel_attn_mlp:
            pre = sub.get("ln1")  # GPT-J, Cohere, Phi: one norm feeds the attention and the MLP
        return {"attn_post_norm": sub.get("ln1_post"), "mlp_pre_norm": pre, "mlp_post_norm": sub.get("ln2_post"),
                "mlp": sub.get("mlp"), "scale": float(getattr(block, "residual_contribution_scale", 1.0))}

    @property
    def attn_branch_is_identity(self) -> bool:
        if "_identity" not in self.__dict__:
            parts = [self.block_parts(layer) for layer in range(self.facts.n_layers)]
            self._identity = all(p["attn_post_norm"] is None and p["scale"] == 1.0 for p in parts)
        return self._identity

    def attn_branch(self, layer: int, a: torch.Tensor) -> torch.Tensor:
        parts = self.block_parts(layer)
        norm, scale = parts["attn_post_norm"], parts["scale"]
        if norm is None and scale == 1.0:
            return a
        dev = _module_device(norm, a.device) if norm is not None else a.device

        def branch(rows: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, d_model]
            h = rows[:, None, :].to(dev)
            h = _first(norm(h)) if norm is not None else h
            return (h * scale if scale != 1.0 else h)[:, 0, :].to(a.device)

        with self._lock:
            return in_cpu_chunks(branch, a, dev)

    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        parts = self.block_parts(layer)
        pre, mlp, post, scale = parts["mlp_pre_norm"], parts["mlp"], parts["mlp_post_norm"], parts["scale"]
        dev = _module_device(pre if pre is not None else mlp, x.device)

        def branch(rows: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, d_model]
            h = rows[:, None, :].to(dev)
            if pre is not None:
                h = _first(pre(h))
            h = _first(mlp(h))
            if post is not None:
                h = _first(post(h))
            return (h * scale if scale != 1.0 else h)[:, 0, :].to(x.device)

        with self._lock:  # the components carry hook points too
            return in_cpu_chunks(branch, x, dev)

    @property
    def logit_transform(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.bridge.adapter.apply_output_logits_transform  # the adapter's own account of the architecture

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


#: what every layer must expose for the lab's techniques to be exact: (hook name builder, what it is)
REQUIRED_HOOKS = ((hook_names.attn_z, "per-head attention outputs"), (hook_names.attn_proj_out, "attention output"),
                  (hook_names.attn_out, "attention contribution to the residual stream"),
                  (hook_names.mlp_out, "MLP contribution to the residual stream"),
                  (hook_names.resid_pre, "residual stream"), (hook_names.attn_pattern, "attention pattern"))


def check_hooks(bridge, facts) -> None:
    """ModelLoadError, up front, unless every layer of the bridged model exposes :data:`REQUIRED_HOOKS`
    (a state-space or hybrid layer has no heads; some adapters expose no per-head output)."""
    from engine.models.spec import ModelLoadError
    have = set(getattr(bridge, "hook_dict", {}))
    for build, what in REQUIRED_HOOKS:
        missing = [layer for layer in range(facts.n_layers) if build(layer) not in have]
        if missing:
            layers = ", ".join(map(str, missing[:6])) + (" ..." if len(missing) > 6 else "")
            raise ModelLoadError(f"{facts.architecture} cannot be studied exactly here: TransformerBridge exposes no "
                                 f"{what} ({build(missing[0])}) in layer(s) {layers} -- the lab patches attention "
                                 f"heads and MLPs, and not all of this architecture's layers have them")


def _first(out):
    """A module's tensor output (MoE MLPs return (hidden, router logits))."""
    return out[0] if isinstance(out, (tuple, list)) else out


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


def _repeated(value, rows: int, times: int):
    """A block argument for ``times`` repeats of its ``rows`` rows: a tensor of two or more dimensions whose first is
    the rows repeated (repeat-major), tuples and lists element by element, anything else as it is (a tensor shared
    by the rows -- a leading 1, or a 1-d one such as the cache positions -- broadcasts).  The pass's key / value
    cache is not this run's: None in its place (a block run alone attends within its rows)."""
    from transformers.cache_utils import Cache
    if isinstance(value, Cache):
        return None
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == rows:
        return value.repeat(times, *([1] * (value.dim() - 1)))
    if isinstance(value, (tuple, list)):
        return type(value)(_repeated(v, rows, times) for v in value)
    return value
