"""The second backend: nnsight over the plain Hugging Face model, locally or on NDIF.

:class:`NnsightBackend` implements :class:`engine.backends.base.ModelBackend` with `nnsight
<https://nnsight.net>`_ (0.8) instead of TransformerBridge.  Techniques do not know which one they
talk to: they name activations with the TransformerLens hook names of :mod:`engine.backends.hooks`, and this
module maps each name onto a module of the un-bridged model -- its input or output, reshaped to
the bridge's shape -- through the per-architecture table :data:`engine.backends.layouts.LAYOUTS`::

    hook name                Llama/Mistral/Qwen/Gemma        Gemma 2/3 (post-norms)             GPT-2 / GPT-J
    hook_embed               model.embed_tokens.output        model.embed_tokens.output          wte.output
    blocks.L.hook_resid_pre  layers[L].input                  layers[L].input                    h[L].input
    attn.hook_q / _k / _v    q_proj / k_proj / v_proj .output idem                               c_attn split / q_proj
    attn.hook_z              self_attn.o_proj.input           self_attn.o_proj.input             c_proj / out_proj .in
    attn.hook_out            self_attn.output[0]              self_attn.output[0]                attn.output[0]
    attn.hook_pattern        self_attn.output[1] (eager)      self_attn.output[1]                attn.output[1]
    hook_attn_out            self_attn.output[0]              post_attention_layernorm.output    attn.output[0]
    hook_mlp_in (_resid_mid) post_attention_layernorm.input   pre_feedforward_layernorm.input    ln_2.in / h[L].in
    mlp.hook_pre / _post     gate_proj.output, down_proj.input idem                              c_fc.out, c_proj.in
    hook_mlp_out             mlp.output                       post_feedforward_layernorm.output  mlp.output
    hook_resid_post          layers[L].output                 layers[L].output                   h[L].output
    ln_final.hook_in         model.norm.input                 model.norm.input                   ln_f.input
    hook_unembed             lm_head.output                   lm_head.output (before soft-cap)   lm_head.output

The columns are rows of the block model's table (:class:`engine.backends.layouts.Block`): where a
block normalises a branch before the residual add (Gemma 2/3, OLMo 2/3), ``hook_attn_out`` and
``hook_mlp_out`` are the branch's contribution *after* that norm -- what the block adds to the stream,
the same definition as the bridge's -- while ``attn.hook_z`` stays the input of the output projection; a
parallel block (GPT-J, GPT-NeoX) has its MLP read the block's input.

(per-head tensors are ``[batch, pos, head, d_head]``, exactly as the bridge gives them; the
integration test ``tests/integration/test_backends.py`` checks every name against
:class:`engine.backends.bridge.BridgeBackend` to 1e-4).  ``attn.hook_attn_scores``, ``attn.hook_result`` and
the split q/k/v *inputs* are not mapped (no technique uses them), nor ``hook_resid_mid`` of a
parallel attention + MLP block (the bridge has none either): asking for them raises a ``MissingActivation`` (a KeyError)
that says to use the bridge backend.  ``attn.hook_pattern`` and ``ln_final.hook_normalized`` (the
final norm's input normalised, before its weight -- transformer-lens' definition) can be read, not
edited.

Edits (``hooks``) follow the bridge's semantics: the edit function gets a copy of the activation in
the bridge's shape, may change it in place or return a new tensor, and the result replaces the
module's input/output for the rest of the forward pass.  As in transformer-lens, writing
``hook_mlp_in`` / ``hook_resid_mid`` changes only the MLP branch, not the residual stream.

**Remote execution.**  With ``remote=True`` the model is nnsight's meta-device copy of a Hugging
Face hub model (no weights here) and every forward pass is one request to NDIF (``api.ndif.us`` or
``NDIF_HOST``) authenticated with the key in ``$NDIF_API_KEY`` -- read when a request is built, sent
in the ``ndif-api-key`` header and nowhere else (never in facts, cache entries, logs or errors).
The per-layer components (W_O, the unembedding) are downloaded once; MLP and final-norm calls of
fast path patching are one small request each.  ``remote="local"`` runs the same serialised request
in this process against local weights (nnsight's dry run of the remote path).

**Device maps.**  Models spread over several GPUs (or offloaded) by ``device_map`` work too: inputs
go to the embedding's device, cached activations, weights and component outputs are returned on that
device, and offloaded weights are materialised per layer with accelerate's ``align_module_device``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from engine.backends.base import HookFn, MissingActivation, ModelBackend, in_cpu_chunks, select_rows
from engine.backends.hooks import HookName
from engine.backends.layouts import Layout, LogitTransform, layout_for
from engine.models.facts import ModelFacts
from engine.models.spec import ModelLoadError


def ship_the_lab() -> None:
    """The lab's own code travels with each remote request (by value): NDIF does not have it installed.

    nnsight ships by value only the modules it finds "local" -- importable from the working tree but
    not from a pip install -- and ``make setup`` installs the lab (editable), so name it explicitly
    (``nnsight.register`` adds the name to cloudpickle's set: calling it again changes nothing)."""
    import nnsight
    nnsight.register("engine")

NDIF_KEY_ENV = "NDIF_API_KEY"
NDIF_HOST_ENV = "NDIF_HOST"
DEFAULT_NDIF_HOST = "https://api.ndif.us"


# ---------------------------------------------------------------------------------------------
# hook names -> sites
# ---------------------------------------------------------------------------------------------

# (execution rank within a layer, module key, "input" | "output", tuple index, reshape)
# reshape: None | "heads" | "kv_heads" | "q" | "k" | "v" (fused projections split per head)
# key: a Layout field, "layer", "q"/"k"/"v", or a part of the block model (:func:`_part` resolves it)
_LAYER_SITES: dict[str, tuple[int, str, str, Any, str | None]] = {
    "hook_resid_pre": (0, "layer", "input", None, None),
    "attn.hook_q": (1, "q", "output", None, "q"),
    "attn.hook_k": (2, "k", "output", None, "k"),
    "attn.hook_v": (3, "v", "output", None, "v"),
    "attn.hook_z": (4, "o_proj", "input", None, "heads"),
    "attn.hook_out": (5, "attn", "output", 0, None),
    "attn.hook_pattern": (5, "attn", "output", 1, None),
    "hook_attn_out": (6, "attn_contribution", "", None, None),
    "hook_resid_mid": (7, "mlp_entry", "", None, None),
    "hook_mlp_in": (7, "mlp_entry", "", None, None),
    "mlp.hook_pre": (8, "mlp_up", "output", None, None),
    "mlp.hook_post": (9, "mlp_down", "input", None, None),
    "hook_mlp_out": (10, "mlp_contribution", "", None, None),
    "hook_resid_post": (11, "layer", "output", "first", None),
}
_PARTS = ("attn_contribution", "mlp_entry", "mlp_contribution")


def _part(key: str, layout: Layout, parallel: bool, rank: int) -> tuple[str, str, Any, int]:
    """A part of the block model (:mod:`engine.backends.layouts`) as (path relative to the layer, "" for the
    layer itself; "input" | "output"; tuple index; execution rank)."""
    block = layout.block
    if key == "attn_contribution":  # what the attention adds to the stream
        return (block.attn_post_norm, "output", None, rank) if block.attn_post_norm else (layout.attn, "output", 0, 5)
    if key == "mlp_entry":  # the stream the MLP branch reads (a parallel block's: the block input)
        if parallel:
            return "", "input", None, 0
        return (block.mlp_pre_norm or layout.mlp), "input", None, rank
    # mlp_contribution: what the MLP adds to the stream
    return (block.mlp_post_norm, "output", None, rank) if block.mlp_post_norm else (layout.mlp, "output", "first", rank)


_GLOBAL_SITES: dict[str, tuple[int, str, str, Any, str | None]] = {
    "hook_embed": (-1, "embed", "output", None, None),
    "ln_final.hook_in": (10**6, "final_norm", "input", None, None),
    "ln_final.hook_normalized": (10**6, "final_norm", "input", None, "normalized"),
    "hook_unembed": (10**6 + 1, "lm_head", "output", None, None),
}
_READ_ONLY = {"attn.hook_pattern", "ln_final.hook_normalized"}


@dataclass(frozen=True)
class Site:
    """Where one hook name's activation lives: a module's input or output, possibly reshaped."""

    name: str
    order: tuple[int, int]        # (layer, rank): the order the forward pass reaches it
    path: str                     # module path from the model root
    attr: str                     # "input" | "output"
    index: Any                    # None | 0 | 1 | "first" (element of a tuple output)
    reshape: str | None
    heads: int                    # heads for "heads"/"q"; kv heads for "k"/"v"
    n_heads: int
    d_head: int
    style: str                    # qkv style
    norm: str = "rms"             # "normalized" sites: "rms" | "layer" norm ...
    eps: float = 1e-5             # ... and its epsilon


def _site(name: HookName, layout: Layout, facts: ModelFacts, norm: tuple[str, float] = ("rms", 1e-5),
          parallel: bool = False) -> Site:
    text = str(name)
    if text in _GLOBAL_SITES:
        rank, key, attr, index, reshape = _GLOBAL_SITES[text]
        return Site(text, (-1 if rank < 0 else facts.n_layers, rank), getattr(layout, key), attr, index,
                    reshape, 0, facts.n_heads, facts.d_head, "separate", norm[0], norm[1])
    parts = text.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in _LAYER_SITES:
        layer = int(parts[1])
        if layer >= facts.n_layers:
            raise MissingActivation(f"{text}: layer {layer} is out of range (the model has {facts.n_layers} layers)")
        rank, key, attr, index, reshape = _LAYER_SITES[parts[2]]
        if parts[2] == "hook_resid_mid" and parallel:
            raise MissingActivation(f"{text}: a parallel attention + MLP block has no mid-block residual stream")
        base = f"{layout.layers}.{layer}"
        if key == "layer":
            path = base
        elif key in ("q", "k", "v"):
            fused = isinstance(layout.qkv, str)
            path = f"{base}.{layout.qkv if fused else layout.qkv['qkv'.index(key)]}"
            if fused:
                rank = 1  # one module output serves q, k and v
        elif key in _PARTS:
            rel, attr, index, rank = _part(key, layout, parallel, rank)
            path = f"{base}.{rel}" if rel else base
        else:
            path = f"{base}.{getattr(layout, key)}"
        heads = facts.n_kv_heads if key in ("k", "v") else facts.n_heads
        return Site(text, (layer, rank), path, attr, index, reshape, heads, facts.n_heads, facts.d_head,
                    layout.qkv_style)
    raise MissingActivation(f"the nnsight backend does not map the hook {text!r}; it maps "
                            f"{', '.join(sorted(set(_LAYER_SITES) | set(_GLOBAL_SITES)))} -- use --backend bridge "
                            f"for the others")


# These two run inside nnsight trace blocks, possibly on the NDIF server (nnsight ships them by
# value), so they use nothing but torch and their arguments.

def _site_read(raw: Any, site: Site) -> torch.Tensor:
    """The activation in the bridge's shape, from a module's raw input/output."""
    x = raw
    if site.index == "first":
        x = x[0] if isinstance(x, (tuple, list)) else x
    elif site.index is not None:
        x = x[site.index]
    if site.reshape is None:
        return x
    if site.reshape == "normalized":  # as transformer-lens' hook_normalized: before the norm's weight
        h = x.float()
        if site.norm == "layer":
            h = h - h.mean(-1, keepdim=True)
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + site.eps)).to(x.dtype)
    b, p = x.shape[0], x.shape[1]
    if site.reshape == "heads" or site.style == "separate":
        return x.reshape(b, p, site.heads, site.d_head)
    which = "qkv".index(site.reshape)
    if site.style == "gpt2":  # [q | k | v], each n_heads * d_head wide
        width = site.n_heads * site.d_head
        return x[..., which * width:(which + 1) * width].reshape(b, p, site.n_heads, site.d_head)
    # neox: per head [q | k | v]
    return x.reshape(b, p, site.n_heads, 3 * site.d_head)[..., which * site.d_head:(which + 1) * site.d_head]


def _site_write(raw: Any, value: torch.Tensor, site: Site) -> Any:
    """``raw`` with the site's activation replaced by ``value`` (bridge shape)."""
    if site.index == "first" and not isinstance(raw, (tuple, list)):
        inner = raw
    elif site.index is not None:
        i = 0 if site.index == "first" else site.index
        inner = raw[i]
    else:
        inner = raw
    if site.reshape == "normalized":
        raise ValueError(f"{site.name} can be read but not edited on the nnsight backend")
    if site.reshape is None:
        new = value.to(inner.dtype)
    else:
        b, p = inner.shape[0], inner.shape[1]
        if site.reshape == "heads" or site.style == "separate":
            new = value.reshape(b, p, -1).to(inner.dtype)
        else:
            which = "qkv".index(site.reshape)
            new = inner.clone()
            if site.style == "gpt2":
                width = site.n_heads * site.d_head
                new[..., which * width:(which + 1) * width] = value.reshape(b, p, width).to(inner.dtype)
            else:
                view = new.view(b, p, site.n_heads, 3 * site.d_head)
                view[..., which * site.d_head:(which + 1) * site.d_head] = value.to(inner.dtype)
    if site.index is None or (site.index == "first" and not isinstance(raw, (tuple, list))):
        return new
    i = 0 if site.index == "first" else site.index
    items = list(raw)
    items[i] = new
    return tuple(items) if isinstance(raw, tuple) else items


@dataclass
class _Group:
    """All reads and edits of one module input/output, in the order they apply."""

    path: str
    attr: str
    order: tuple[int, int]
    items: list[tuple[Site, list[HookFn], bool]]  # (site, edit fns, read?)


def _plan(reads: Sequence[Site], edits: Sequence[tuple[Site, HookFn]]) -> list[_Group]:
    groups: dict[tuple[str, str], _Group] = {}
    per_site: dict[str, tuple[Site, list[HookFn], bool]] = {}
    for site, fn in edits:
        if site.name.split(".", 2)[-1] in _READ_ONLY or site.name in _READ_ONLY:
            raise ValueError(f"{site.name} can be read but not edited on the nnsight backend "
                             f"(use the bridge backend to edit it)")
        s, fns, read = per_site.get(site.name, (site, [], False))
        per_site[site.name] = (s, fns + [fn], read)
    for site in reads:
        s, fns, _ = per_site.get(site.name, (site, [], True))
        per_site[site.name] = (s, fns, True)
    for site, fns, read in per_site.values():
        g = groups.setdefault((site.path, site.attr), _Group(site.path, site.attr, site.order, []))
        g.order = min(g.order, site.order)
        g.items.append((site, fns, read))
    return sorted(groups.values(), key=lambda g: g.order)


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------

class NnsightBackend(ModelBackend):
    """nnsight ``TransformersModel`` behind the lab's narrow interface (local, device-mapped or NDIF)."""

    name = "nnsight"

    def __init__(self, model: Any, tokenizer: Any, facts: ModelFacts, *, remote: bool | str = False,
                 host: str | None = None) -> None:
        self.model = model  # nnsight.modeling.transformers.TransformersModel
        self.tokenizer = tokenizer
        self.facts = facts
        self.layout = layout_for(facts.model_type)
        self.remote = remote
        self.host = host
        config = model._module.config
        self._parallel = self.layout.block.is_parallel(config)
        norm = self.hf_model.get_submodule(self.layout.final_norm)
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-5
        self._norm = ("layer" if isinstance(norm, torch.nn.LayerNorm) else "rms", float(eps))
        self._lock = threading.RLock()
        self._active: list[list[tuple[Site, HookFn]]] = []
        self._weights: dict[str, torch.Tensor] = {}
        self.requests_sent = 0  # remote requests (or forward traces) issued, for tests and benchmarks

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def hf_model(self) -> torch.nn.Module:
        """The wrapped Hugging Face model (meta tensors when remote)."""
        return self.model._module

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.remote is True else torch.device(self.facts.device)

    def _trace_kwargs(self) -> dict[str, Any]:
        if self.remote:
            ship_the_lab()
        if self.remote is True:
            return {"backend": remote_backend(self.model, self.host)}
        if self.remote:
            return {"remote": self.remote}  # "local": nnsight's serialise-deserialise dry run
        return {}

    @contextmanager
    def _remote_errors(self) -> Iterator[None]:
        """A failed NDIF request (server error, no network, bad key) as one NdifError, key never shown."""
        if self.remote is not True:
            yield
            return
        try:
            yield
        except Exception as e:  # noqa: BLE001 - classified below
            if _is_remote_failure(e):
                raise NdifError(f"the NDIF request for {self.facts.spec} failed: "
                                f"{_scrub(f'{type(e).__name__}: {e}')[:400]}") from None
            raise

    def _inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        from engine.models.load import validate_inputs
        validate_inputs(input_ids, attention_mask, self.facts.vocab_size)
        dev = self.device
        ids = input_ids.to(device=dev, dtype=torch.long)
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(device=dev, dtype=torch.long)}
        return ids, kwargs

    def _sites(self, names: Sequence[HookName]) -> list[Site]:
        return [_site(n, self.layout, self.facts, self._norm, self._parallel) for n in names]

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 names: Sequence[HookName], past: Any = None) -> dict[str, Any]:
        """One traced forward pass with the active edits; returns {"logits": ..., name: act}.
        ``past``: a KV cache the new positions continue (:meth:`continue_end_logits`)."""
        reads = self._sites(names)
        edits = [e for block in self._active for e in block]
        plan = _plan(reads, edits)
        ids, kwargs = self._inputs(input_ids, attention_mask)
        if past is not None:
            kwargs["past_key_values"] = past
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(ids, **kwargs, **self._trace_kwargs()):
                for group in plan:
                    envoy = model.get(group.path)
                    raw = envoy.input if group.attr == "input" else envoy.output
                    changed = False
                    for site, fns, read in group.items:
                        if fns:
                            value = _site_read(raw, site)
                            for fn in fns:
                                act = value.clone()
                                out = fn(act)
                                value = act if out is None else out
                            raw = _site_write(raw, value, site)
                            changed = True
                        if read:
                            res[site.name] = _site_read(raw, site).detach()
                    if changed:
                        if group.attr == "input":
                            envoy.input = raw
                        else:
                            envoy.output = raw
                res["logits"] = model.output.logits
                nnsight_save(res)
        self.meter.record(ids, res["logits"])
        return res

    # -- ModelBackend ----------------------------------------------------------------------------
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(input_ids, attention_mask, [])["logits"].to(self.device)

    def run_with_cache(self, input_ids, attention_mask, names):
        res = self._forward(input_ids, attention_mask, list(names))
        dev = self.device
        return res["logits"].to(dev), {n: res[str(n)].to(dev) for n in names}

    @contextmanager
    def hooks(self, edits: Sequence[tuple[HookName, HookFn]]) -> Iterator[None]:
        block = [(_site(n, self.layout, self.facts, self._norm, self._parallel), fn) for n, fn in edits]
        _plan([], block)  # refuse read-only sites now, not at the next forward pass
        with self._lock:
            self._active.append(block)
            try:
                yield
            finally:
                self._active.remove(block)

    @property
    def continues(self) -> bool:
        return not self.remote

    def prefix(self, input_ids: torch.Tensor) -> object:
        if self.remote:
            return super().prefix(input_ids)
        ids, _ = self._inputs(input_ids, None)
        with self._lock, torch.no_grad():
            out = self.hf_model(ids, use_cache=True)
        self.meter.record(ids, out.logits)
        return out.past_key_values

    def continue_end_logits(self, prefix, rows, input_ids, *, start=None):
        if self.remote:
            return super().continue_end_logits(prefix, rows, input_ids, start=start)
        with self.last_position_only(input_ids.shape[1]):
            lg = self._forward(input_ids, None, [], past=select_rows(prefix, rows, start))["logits"]
        return lg[:, -1].to(self.device)  # [n, vocab]

    @property
    def parallel_attn_mlp(self) -> bool:
        return self._parallel

    def W_O(self, layer: int) -> torch.Tensor:
        f = self.facts
        w = self._weight(f"{self.layout.layers}.{layer}.{self.layout.o_proj}.weight")
        if not self.layout.conv1d:  # nn.Linear: [d_model, H*d_head]
            w = w.T
        return w.reshape(f.n_heads, f.d_head, f.d_model)

    @property
    def attn_branch_is_identity(self) -> bool:
        return self.layout.block.attn_post_norm is None

    def attn_branch(self, layer: int, a: torch.Tensor) -> torch.Tensor:
        norm = self.layout.block.attn_post_norm
        return a if norm is None else self._apply([f"{self.layout.layers}.{layer}.{norm}"], a)

    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        base = f"{self.layout.layers}.{layer}"
        block = self.layout.block
        parts = [block.mlp_pre_norm, self.layout.mlp, block.mlp_post_norm]
        return self._apply([f"{base}.{p}" for p in parts if p], x)

    @property
    def logit_transform(self) -> LogitTransform:
        return self.layout.logits.transform(self.hf_model.config)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply([self.layout.final_norm], x)

    def unembed(self):
        W_U = self._weight(f"{self.layout.lm_head}.weight").T
        b_U = self._weight(f"{self.layout.lm_head}.bias", optional=True)
        if b_U is not None and not bool(b_U.any()):
            b_U = None
        return W_U, b_U

    # -- components ------------------------------------------------------------------------------
    def _weight(self, path: str, optional: bool = False) -> torch.Tensor | None:
        """A parameter by its Hugging Face name, detached, on ``self.device`` (memoised when remote)."""
        if path in self._weights:
            return self._weights[path]
        module_path, _, leaf = path.rpartition(".")
        module = self.hf_model.get_submodule(module_path)
        if getattr(module, leaf, None) is None:
            if optional:
                return None
            raise KeyError(f"the model has no parameter {path}")
        if self.remote is True:
            value = self._remote_weights([path])[path]
        else:
            with _materialized(self.hf_model, module_path):
                value = getattr(module, leaf).detach().to(self.device, copy=True)
        if self.remote is True or _has_offload(self.hf_model):
            self._weights[path] = value  # a download / a disk read: keep it
        return value

    def _apply(self, paths: list[str], x: torch.Tensor) -> torch.Tensor:
        """x -> module_n(...module_1(x)) for residual vectors x [n, d_model] (shape [n, 1, d] inside)."""
        if self.remote:
            return self._remote_apply(paths, x)

        def apply(rows: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, d_model]
            h = rows[:, None, :]
            for path in paths:
                module = self.hf_model.get_submodule(path)
                with _materialized(self.hf_model, path):
                    h = module(h.to(_execution_device(self.hf_model, path)))
                h = h[0] if isinstance(h, tuple) else h
            return h[:, 0, :].to(x.device)

        with self._lock:
            return in_cpu_chunks(apply, x, _execution_device(self.hf_model, paths[0]))

    def _dummy(self) -> torch.Tensor:
        tok = self.tokenizer
        first = next((t for t in (getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None))
                      if t is not None), 0)
        return torch.tensor([[int(first)]])

    def server_dtype(self) -> str:
        """The dtype the (remote) model's weights are held in, as a DTYPES name (one request when remote)."""
        path = f"{self.layout.lm_head}.weight"
        if self.remote is not True:
            return str(self.hf_model.get_parameter(path).dtype).removeprefix("torch.")
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                res["dtype"] = str(model.get(path).dtype)
                nnsight_save(res)
        return res["dtype"].removeprefix("torch.")

    def _remote_weights(self, paths: list[str]) -> dict[str, torch.Tensor]:
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                for path in paths:
                    res[path] = model.get(path).detach().to("cpu")
                nnsight_save(res)
        return {k: v.to(self.device) for k, v in res.items()}

    def _remote_apply(self, paths: list[str], x: torch.Tensor) -> torch.Tensor:
        model = self.model
        res: dict[str, Any] = {}
        h0 = x[:, None, :].detach().to("cpu")
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                h = h0
                for path in paths:
                    module = model.get(path)
                    h = module(h.to(module.device) if module.device is not None else h)
                    h = h[0] if isinstance(h, tuple) else h
                res["out"] = h.detach().to("cpu")
                nnsight_save(res)
        return res["out"][:, 0, :].to(x.device)


class NdifError(ModelLoadError):
    """A remote (NDIF) request failed; the message says why (and never holds the API key)."""


def _is_remote_failure(e: BaseException) -> bool:
    from nnsight.intervention.backends.remote import RemoteError
    if isinstance(e, (RemoteError, ConnectionError, TimeoutError)):
        return True
    module = type(e).__module__ or ""
    return module.startswith(("httpx", "httpcore", "websocket", "ssl", "socket"))


def _scrub(text: str) -> str:
    key = os.environ.get(NDIF_KEY_ENV, "").strip()
    return text.replace(key, "***") if key else text


def nnsight_save(value: Any) -> Any:
    """``nnsight.save`` (marks a value a trace block returns -- from NDIF too)."""
    import nnsight
    return nnsight.save(value)


# ---------------------------------------------------------------------------------------------
# device maps and offload
# ---------------------------------------------------------------------------------------------

def _has_offload(model: torch.nn.Module) -> bool:
    return any(getattr(m, "_hf_hook", None) is not None and getattr(m._hf_hook, "offload", False)
               for m in model.modules())


def _owners(model: torch.nn.Module, path: str) -> Iterator[torch.nn.Module]:
    """``model``, then each module on the way down to ``path``."""
    yield model
    mod = model
    for part in path.split(".") if path else []:
        mod = getattr(mod, part)
        yield mod


def _materialized(model: torch.nn.Module, path: str) -> contextlib.AbstractContextManager:
    """Offloaded weights of the module at ``path`` (or of the layer holding it) on their device."""
    for mod in _owners(model, path):
        hook = getattr(mod, "_hf_hook", None)
        if hook is not None and getattr(hook, "offload", False):
            from accelerate.utils import align_module_device
            return align_module_device(mod)
    return contextlib.nullcontext()


def _execution_device(model: torch.nn.Module, path: str) -> torch.device:
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


# ---------------------------------------------------------------------------------------------
# opening models
# ---------------------------------------------------------------------------------------------

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

