"""THE per-architecture table: where each piece of a decoder lives, and how its blocks update the residual stream.

One :class:`Layout` per architecture family, shared by everything that reaches into a plain Hugging Face
model: the nnsight backend maps TransformerLens hook names onto these modules and builds its exact
components from them (:mod:`engine.backends.nnsight`), precise SFT slices the Q/K/V/O projections of the
key heads and picks LoRA's targets (:mod:`engine.finetune.slices`).  The bridge backend reads the same
facts off TransformerLens's own adapter of the architecture (its ``ln1_post`` / ``ln2`` / ``ln2_post``
components, its parallel flag, its residual scale and its output-logits transform);
``tests/integration/test_architectures.py`` checks that the two agree on every architecture both map.

**The block model** (:class:`Block`), what the exact END chains of fast path patching and attribution
compute (docs/methods.md, "Components on any block")::

    a    = o_proj(z)                          the heads' outputs through W_O (+ b_O)        hooks.attn_proj_out
    attn = s * post_attn_norm(a)              the attention's contribution to the stream    hooks.attn_out
    sequential:  mid = x + attn;   x' = mid + s * post_mlp_norm(MLP(pre_mlp_norm(mid)))      hooks.mlp_out
    parallel:    x'  = x + attn + s * post_mlp_norm(MLP(pre_mlp_norm(x)))

A missing norm is the identity and ``s`` (a residual multiplier, Granite) is 1 unless the config says
otherwise; the final logits are ``transform(final_norm(x) @ W_U + b_U)`` (:class:`FinalLogits`: a scale,
a divisor, a soft cap).  Adding an architecture = one :class:`Layout` row here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from engine.models.spec import ModelLoadError


@dataclass(frozen=True)
class Block:
    """How one decoder block updates the residual stream (module docstring).  Norm paths are relative to
    the decoder layer; ``None`` is no such norm."""

    mlp_pre_norm: str | None = "post_attention_layernorm"  # the MLP's input norm (None: it reads the stream)
    attn_post_norm: str | None = None   # a norm of the attention output before the add (Gemma 2/3, OLMo 2/3)
    mlp_post_norm: str | None = None    # a norm of the MLP output before the add
    parallel: bool | str = False        # the MLP reads the block input; a str: the config flag that says so

    def is_parallel(self, config: Any) -> bool:
        if isinstance(self.parallel, str):
            return bool(getattr(config, self.parallel, False))
        return self.parallel


@dataclass(frozen=True)
class FinalLogits:
    """What a model does to ``final_norm(x) @ W_U + b_U`` before returning its logits: config attributes
    holding a factor (Cohere's ``logit_scale``), a divisor (Granite's ``logits_scaling``) and a soft cap
    (Gemma 2's ``final_logit_softcapping``: ``cap * tanh(logits / cap)``).  None: not done."""

    multiply: str | None = None
    divide: str | None = None
    softcap: str | None = None

    def transform(self, config: Any) -> "LogitTransform":
        def value(attr: str | None) -> float | None:
            v = getattr(config, attr, None) if attr else None
            return None if v is None else float(v)
        scale = (value(self.multiply) or 1.0) / (value(self.divide) or 1.0)
        return LogitTransform(scale, value(self.softcap))


@dataclass(frozen=True)
class LogitTransform:
    """``softcap * tanh(scale * lg / softcap)`` (no soft cap: ``scale * lg``), elementwise."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, lg):
        if self.scale != 1.0:
            lg = lg * self.scale
        if self.softcap is not None and self.softcap > 0 and math.isfinite(self.softcap):
            lg = self.softcap * (lg / self.softcap).tanh()
        return lg


@dataclass(frozen=True)
class Layout:
    """Where the pieces of one decoder architecture live in the Hugging Face module tree.

    Paths are relative to the causal-LM model (``layers``/``embed``/``final_norm``/``lm_head``) or to
    one decoder layer (everything else)."""

    layers: str
    embed: str
    final_norm: str
    lm_head: str
    attn: str
    o_proj: str
    mlp: str
    mlp_up: str        # the projection whose output is mlp.hook_pre (gate for SwiGLU)
    mlp_down: str      # the projection whose input is mlp.hook_post
    qkv: tuple[str, str, str] | str  # separate q/k/v projections, or one fused projection
    qkv_style: str = "separate"      # "separate" | "gpt2" (q|k|v blocks) | "neox" (per-head q|k|v)
    conv1d: bool = False             # GPT-2 Conv1D weights are [in, out]
    end_rows: bool = True  # the final norm may run on some positions only (GPT-2 reshapes its output: no)
    block: Block = field(default_factory=Block)
    logits: FinalLogits = field(default_factory=FinalLogits)


LLAMA = Layout(layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", lm_head="lm_head",
               attn="self_attn", o_proj="self_attn.o_proj", mlp="mlp", mlp_up="mlp.gate_proj",
               mlp_down="mlp.down_proj", qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
# Gemma 2 / 3: the attention and the MLP output are each normalised before the residual add;
# Gemma 2 soft-caps its final logits (Gemma 3's config leaves the cap at None)
GEMMA2 = replace(LLAMA, block=Block(mlp_pre_norm="pre_feedforward_layernorm", attn_post_norm="post_attention_layernorm",
                                    mlp_post_norm="post_feedforward_layernorm"),
                 logits=FinalLogits(softcap="final_logit_softcapping"))
# OLMo 2 / 3, EXAONE 4: no norm before the attention or the MLP, one after each
OLMO2 = replace(LLAMA, block=Block(mlp_pre_norm=None, attn_post_norm="post_attention_layernorm",
                                   mlp_post_norm="post_feedforward_layernorm"))
GPT2 = Layout(layers="transformer.h", embed="transformer.wte", final_norm="transformer.ln_f", lm_head="lm_head",
              attn="attn", o_proj="attn.c_proj", mlp="mlp", mlp_up="mlp.c_fc", mlp_down="mlp.c_proj",
              qkv="attn.c_attn", qkv_style="gpt2", conv1d=True, end_rows=False, block=Block(mlp_pre_norm="ln_2"))
NEOX = Layout(layers="gpt_neox.layers", embed="gpt_neox.embed_in", final_norm="gpt_neox.final_layer_norm",
              lm_head="lm_head", attn="attention", o_proj="attention.dense", mlp="mlp", mlp_up="mlp.dense_h_to_4h",
              mlp_down="mlp.dense_4h_to_h", qkv="attention.query_key_value", qkv_style="neox",
              block=Block(mlp_pre_norm="post_attention_layernorm", parallel="use_parallel_residual"))
# GPT-J: attention and MLP both read ln_1 of the block input (parallel); its output is reshaped after ln_f
GPTJ = Layout(layers="transformer.h", embed="transformer.wte", final_norm="transformer.ln_f", lm_head="lm_head",
              attn="attn", o_proj="attn.out_proj", mlp="mlp", mlp_up="mlp.fc_in", mlp_down="mlp.fc_out",
              qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), end_rows=False,
              block=Block(mlp_pre_norm="ln_1", parallel=True))

# Hugging Face model_type -> layout.  Llama-style covers every model whose decoder layer is
# (input_layernorm, self_attn{q,k,v,o}_proj, post_attention_layernorm, mlp{gate,up,down}_proj).
LAYOUTS: dict[str, Layout] = {
    "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA, "gemma": LLAMA,
    "gemma2": GEMMA2, "gemma3_text": GEMMA2, "olmo2": OLMO2, "olmo3": OLMO2,
    "gpt2": GPT2, "gpt_neox": NEOX, "gptj": GPTJ,
}


def layout_for(model_type: str) -> Layout:
    """The module layout of ``model_type``, or a ModelLoadError naming the supported ones."""
    if model_type not in LAYOUTS:
        raise ModelLoadError(
            f"the nnsight backend has no module map for model_type {model_type!r}; it supports "
            f"{', '.join(sorted(LAYOUTS))} -- use --backend bridge for other architectures")
    return LAYOUTS[model_type]


def final_norm_takes_rows(model_type: str) -> bool:
    """Whether the final norm and the unembedding may run on a few positions of each row (the END-only logits of
    :meth:`engine.backends.base.ModelBackend.logits_at`) by the table; architectures not in it are tried once
    and checked (:meth:`engine.backends.base.ModelBackend.check_end_rows`)."""
    layout = LAYOUTS.get(model_type)
    return layout is None or layout.end_rows
