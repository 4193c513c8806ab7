"""Precise SFT's unit: the Q/K/V/O slices of chosen attention heads (the paper's §4.3).

For head h of layer l, its slices are the rows ``h*d_head:(h+1)*d_head`` of W_Q, and of W_K / W_V
for its key/value group (grouped-query attention: a KV group serves several query heads, see
:func:`kv_groups`), and the same *columns* of W_O.  :class:`HeadSlices` makes exactly those slices
trainable parameters (the rest of each matrix stays frozen) and merges them back into the weights;
:func:`attn_layout` finds the projections through the one per-architecture table,
:data:`engine.backends.layouts.LAYOUTS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.backends.layouts import LAYOUTS, LLAMA, Layout
from engine.finetune.errors import FinetuneError

Head = tuple[int, int]  # (layer, head)
#: GQA: tune a KV group when "any" / "all" of its query heads are selected, or "none"
KV_RULES: tuple[str, ...] = ("any", "all", "none")


# ---------------------------------------------------------------------------------------------
# attention layouts: where the Q/K/V/O projections of layer l live
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttnLayout:
    """Sizes plus the architecture's row of :data:`engine.backends.layouts.LAYOUTS` (module paths)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    modules: Layout

    @property
    def fused_qkv(self) -> bool:  # one projection producing q, k and v (GPT-2, GPT-NeoX): see fused_rows
        return self.modules.qkv_style != "separate"

    def attn(self, model: nn.Module, layer: int) -> nn.Module:
        return model.get_submodule(f"{self.modules.layers}.{layer}.{self.modules.attn}")

    def mlp(self, model: nn.Module, layer: int) -> nn.Module:
        return model.get_submodule(f"{self.modules.layers}.{layer}.{self.modules.mlp}")

    def projection_names(self) -> tuple[str, str, str, str] | tuple[str, str]:
        """Attribute names (on the attention module) of q, k, v, o -- or of the fused qkv and o."""
        own = lambda path: path.rpartition(".")[2]  # noqa: E731
        if self.fused_qkv:
            return own(str(self.modules.qkv)), own(self.modules.o_proj)
        q, k, v = self.modules.qkv
        return own(q), own(k), own(v), own(self.modules.o_proj)

    def lora_targets(self) -> list[str]:
        # peft matches a target by module-name suffix: GPT-2's MLP has a ``c_proj`` too (mlp.c_proj),
        # so the fused attention modules are named with their parent to keep LoRA on attention only.
        if self.fused_qkv:
            return [str(self.modules.qkv), self.modules.o_proj]
        return list(self.projection_names())


def attn_layout(model: nn.Module) -> AttnLayout:
    """The attention layout of a plain HF model: its row of the layout table (Llama-style q/k/v/o_proj where
    the table has none) and its sizes from the config; FinetuneError where the modules are not there."""
    cfg = model.config
    mt = getattr(cfg, "model_type", "")
    modules = LAYOUTS.get(mt, LLAMA)
    projections = (modules.qkv,) if isinstance(modules.qkv, str) else tuple(modules.qkv)
    layers = model.get_submodule(modules.layers) if _has_module(model, modules.layers) else None
    if layers is not None and len(layers) and all(_has_module(layers[0], p) for p in (*projections, modules.o_proj)):
        n_heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        d_model = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
        n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
        d_head = int(getattr(cfg, "head_dim", None) or d_model // n_heads)
        return AttnLayout(len(layers), n_heads, n_kv, d_head, d_model, modules)
    raise FinetuneError(f"precise SFT does not know the attention layout of model type {mt!r}; "
                        f"supported: Llama-style q/k/v/o_proj (Llama, Mistral, Qwen2, Gemma ...), GPT-2, GPT-J "
                        f"and GPT-NeoX")


def fused_rows(layout: AttnLayout, heads: Sequence[int], kv: Sequence[int]) -> torch.Tensor:
    """Output rows of a fused q/k/v projection for ``heads``' queries and the KV groups ``kv``' keys and values:
    GPT-2 stacks the blocks [q (H d_head) | k (KV d_head) | v (KV d_head)], GPT-NeoX interleaves them per head
    [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]."""
    dh = layout.d_head
    if layout.modules.qkv_style == "neox":
        return torch.cat([torch.arange((3 * h + part) * dh, (3 * h + part + 1) * dh, dtype=torch.long)
                          for part, hs in ((0, heads), (1, kv), (2, kv)) for h in hs])
    q_size, kv_size = layout.n_heads * dh, layout.n_kv_heads * dh
    return torch.cat([_rows(heads, dh), _rows(kv, dh, q_size), _rows(kv, dh, q_size + kv_size)])


def _has_module(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def parse_heads(text: str) -> tuple[Head, ...]:
    """"3.1,5.0" -> ((3, 1), (5, 0)) (:func:`engine.techniques.knockout.parse_heads`, at least one head)."""
    from engine.techniques.knockout import parse_heads as parse_head_list
    try:
        return parse_head_list(text, required=True)
    except ValueError as e:
        raise FinetuneError(str(e)) from None


def check_selection(layout: AttnLayout, heads: Sequence[Head], mlps: Sequence[int]) -> None:
    for layer, head in heads:
        if not 0 <= layer < layout.n_layers or not 0 <= head < layout.n_heads:
            raise FinetuneError(f"head {layer}.{head} does not exist: the model has {layout.n_layers} layers "
                                f"x {layout.n_heads} heads (0-based)")
    for m in mlps:
        if not 0 <= m < layout.n_layers:
            raise FinetuneError(f"MLP layer {m} does not exist: the model has {layout.n_layers} layers")


def kv_groups(layout: AttnLayout, heads_of_layer: Sequence[int], rule: str = "any") -> list[int]:
    """The GQA rule (module docstring): the KV groups tuned for these selected query heads."""
    if rule not in KV_RULES:
        raise FinetuneError(f"unknown kv_rule {rule!r}: choose from {', '.join(KV_RULES)}")
    if rule == "none":
        return []
    group = layout.n_heads // layout.n_kv_heads
    selected = set(heads_of_layer)
    touched = sorted({h // group for h in selected})
    if rule == "any":
        return touched
    return [g for g in touched if all(q in selected for q in range(g * group, (g + 1) * group))]


# ---------------------------------------------------------------------------------------------
# head slices as real parameters
# ---------------------------------------------------------------------------------------------

def weight_out_in(module: nn.Module) -> torch.Tensor:
    """The projection's weight as [out_features, in_features] (a view for GPT-2's Conv1D)."""
    return module.weight if isinstance(module, nn.Linear) else module.weight.t()


class _RowSliced(nn.Module):
    """A frozen projection whose output features ``rows`` come from a trainable slice.

    forward(x) = base(x) with out[..., rows] = x @ slice.T (+ bias slice)
    """

    def __init__(self, base: nn.Module, rows: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("rows", rows, persistent=False)
        W = weight_out_in(base)  # [out, in]
        self.weight_slice = nn.Parameter(W.detach()[rows].clone())  # [len(rows), in]
        b = getattr(base, "bias", None)
        self.bias_slice = None if b is None else nn.Parameter(b.detach()[rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        W = weight_out_in(self.base).detach()
        b = getattr(self.base, "bias", None)
        out = F.linear(x, W, None if b is None else b.detach())  # [..., out]
        part = F.linear(x, self.weight_slice, self.bias_slice)  # [..., len(rows)]
        return out.index_copy(out.ndim - 1, self.rows, part)

    @torch.no_grad()
    def merge(self) -> nn.Module:
        weight_out_in(self.base)[self.rows] = self.weight_slice.detach()
        if self.bias_slice is not None:
            self.base.bias[self.rows] = self.bias_slice.detach()
        return self.base


class _ColSliced(nn.Module):
    """A frozen output projection whose input features ``cols`` are read by a trainable slice.

    forward(x) = x_rest @ W_rest.T + x[..., cols] @ slice.T + b
    """

    def __init__(self, base: nn.Module, cols: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("cols", cols, persistent=False)
        W = weight_out_in(base)  # [out, in]
        self.weight_slice = nn.Parameter(W.detach()[:, cols].clone())  # [out, len(cols)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        W = weight_out_in(self.base).detach()
        b = getattr(self.base, "bias", None)
        rest = x.index_fill(x.ndim - 1, self.cols, 0.0)
        out = F.linear(rest, W, None if b is None else b.detach())
        return out + F.linear(x.index_select(x.ndim - 1, self.cols), self.weight_slice)

    @torch.no_grad()
    def merge(self) -> nn.Module:
        weight_out_in(self.base)[:, self.cols] = self.weight_slice.detach()
        return self.base


def _rows(heads: Sequence[int], d_head: int, offset: int = 0) -> torch.Tensor:
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(offset + h * d_head, offset + (h + 1) * d_head) for h in heads])


@dataclass
class SliceSpec:
    """Which rows/columns of layer ``layer`` are tuned, and the gradient factor H/h_l."""

    layer: int
    heads: list[int]
    kv: list[int]
    scale: float


def slice_plan(layout: AttnLayout, heads: Sequence[Head], rescale: bool = True,
               kv_rule: str = "any") -> list[SliceSpec]:
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    plan = []
    for layer in sorted(by_layer):
        hs = sorted(set(by_layer[layer]))
        scale = layout.n_heads / len(hs) if rescale else 1.0
        plan.append(SliceSpec(layer, hs, kv_groups(layout, hs, kv_rule), scale))
    return plan


class HeadSlices:
    """Installs trainable per-head slices into a plain HF model; ``merge()`` writes them back.

    Use as a context manager: leaving the block always restores the model's own modules (merged).
    """

    def __init__(self, model: nn.Module, heads: Sequence[Head], mlps: Sequence[int] = (),
                 rescale: bool = True, kv_rule: str = "any") -> None:
        self.model = model
        self.layout = attn_layout(model)
        check_selection(self.layout, heads, mlps)
        self.plan = slice_plan(self.layout, heads, rescale, kv_rule)
        self.mlps = tuple(sorted(set(mlps)))
        self._installed: list[tuple[nn.Module, str, nn.Module]] = []  # (parent, attr, sliced)
        self._hooks: list = []
        self._mlp_params: list[nn.Parameter] = []

    # -- install / merge ---------------------------------------------------------------------------
    def install(self) -> "HeadSlices":
        for p in self.model.parameters():
            p.requires_grad_(False)
        lay = self.layout
        for spec in self.plan:
            attn = lay.attn(self.model, spec.layer)
            q_rows = _rows(spec.heads, lay.d_head)
            kv_rows = _rows(spec.kv, lay.d_head)
            if lay.fused_qkv:
                qkv, o = lay.projection_names()
                rows = fused_rows(lay, spec.heads, spec.kv)
                fused, out = getattr(attn, qkv), getattr(attn, o)
                self._swap(attn, qkv, _RowSliced(fused, rows.to(fused.weight.device)), spec)
                self._swap(attn, o, _ColSliced(out, q_rows.to(out.weight.device)), spec)
            else:
                q, k, v, o = lay.projection_names()
                dev = getattr(attn, q).weight.device
                self._swap(attn, q, _RowSliced(getattr(attn, q), q_rows.to(dev)), spec)
                if spec.kv:
                    self._swap(attn, k, _RowSliced(getattr(attn, k), kv_rows.to(dev)), spec)
                    self._swap(attn, v, _RowSliced(getattr(attn, v), kv_rows.to(dev)), spec)
                self._swap(attn, o, _ColSliced(getattr(attn, o), q_rows.to(dev)), spec)
        for m in self.mlps:
            for p in lay.mlp(self.model, m).parameters():
                p.requires_grad_(True)
                self._mlp_params.append(p)
        return self

    def _swap(self, parent: nn.Module, attr: str, sliced: nn.Module, spec: SliceSpec) -> None:
        setattr(parent, attr, sliced)
        self._installed.append((parent, attr, sliced))
        if spec.scale != 1.0:
            for p in sliced.parameters(recurse=False):
                self._hooks.append(p.register_hook(lambda g, s=spec.scale: g * s))

    def parameters(self) -> list[nn.Parameter]:
        out: list[nn.Parameter] = []
        for _, _, sliced in self._installed:
            out.extend(sliced.parameters(recurse=False))
        return out + self._mlp_params

    def merge(self) -> None:
        """Write the slices into the full matrices and put the original modules back."""
        for parent, attr, sliced in reversed(self._installed):
            setattr(parent, attr, sliced.merge())
        self._installed.clear()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for p in self.model.parameters():
            p.requires_grad_(True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Only the tuned slices (named by module path), for the small ``tuned_slices`` file."""
        names = {id(m): n for n, m in self.model.named_modules()}
        out: dict[str, torch.Tensor] = {}
        for _, _, sliced in self._installed:
            base = names[id(sliced)]
            for pname, p in sliced.named_parameters(recurse=False):
                out[f"{base}.{pname}"] = p.detach().cpu().contiguous()
            idx = sliced.rows if isinstance(sliced, _RowSliced) else sliced.cols
            out[f"{base}.{'rows' if isinstance(sliced, _RowSliced) else 'cols'}"] = idx.cpu().clone()
        for m in self.mlps:
            for pname, p in self.layout.mlp(self.model, m).named_parameters():
                out[f"mlp.{m}.{pname}"] = p.detach().cpu().contiguous()
        return out

    def __enter__(self) -> "HeadSlices":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.merge()


