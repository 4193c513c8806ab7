"""The nnsight backend's map from hook names to sites: where each TransformerLens hook name's activation lives in the
un-bridged model, how it is read and written in the bridge's shape, and the plan of one traced pass.

Each name maps onto a module of the plain model -- its input or output, reshaped to the bridge's shape --
through the per-architecture table :data:`engine.backends.layouts.LAYOUTS`::

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from engine.backends.base import HookFn, MissingActivation
from engine.backends.hooks import HookName
from engine.backends.layouts import Layout
from engine.models.facts import ModelFacts

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


def site_of(name: HookName, layout: Layout, facts: ModelFacts, norm: tuple[str, float] = ("rms", 1e-5),
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

def read_site(raw: Any, site: Site) -> torch.Tensor:
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


def write_site(raw: Any, value: torch.Tensor, site: Site) -> Any:
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


def plan_groups(reads: Sequence[Site], edits: Sequence[tuple[Site, HookFn]]) -> list[_Group]:
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
