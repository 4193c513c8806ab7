"""THE per-architecture table: where each piece of a decoder lives in the Hugging Face module tree.

One entry per architecture family, shared by everything that reaches into a plain HF model: the
nnsight backend maps TransformerLens hook names onto these modules (:mod:`engine.backends.nnsight`),
and precise SFT slices the Q/K/V/O projections of the key heads and picks LoRA's targets
(:mod:`engine.finetune.train`).  Adding an architecture = one :class:`Layout` row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.spec import ModelLoadError


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
    ln2: str
    mlp: str
    mlp_up: str        # the projection whose output is mlp.hook_pre (gate for SwiGLU)
    mlp_down: str      # the projection whose input is mlp.hook_post
    qkv: tuple[str, str, str] | str  # separate q/k/v projections, or one fused projection
    qkv_style: str = "separate"      # "separate" | "gpt2" (q|k|v blocks) | "neox" (per-head q|k|v)
    conv1d: bool = False             # GPT-2 Conv1D weights are [in, out]
    parallel_attr: str | None = None  # config flag for parallel attention + MLP (GPT-NeoX)
    end_rows: bool = True  # the final norm may run on some positions only (GPT-2 reshapes its output: no)


LLAMA = Layout(layers="model.layers", embed="model.embed_tokens", final_norm="model.norm", lm_head="lm_head",
                attn="self_attn", o_proj="self_attn.o_proj", ln2="post_attention_layernorm", mlp="mlp",
                mlp_up="mlp.gate_proj", mlp_down="mlp.down_proj",
                qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
GPT2 = Layout(layers="transformer.h", embed="transformer.wte", final_norm="transformer.ln_f", lm_head="lm_head",
               attn="attn", o_proj="attn.c_proj", ln2="ln_2", mlp="mlp", mlp_up="mlp.c_fc", mlp_down="mlp.c_proj",
               qkv="attn.c_attn", qkv_style="gpt2", conv1d=True, end_rows=False)
NEOX = Layout(layers="gpt_neox.layers", embed="gpt_neox.embed_in", final_norm="gpt_neox.final_layer_norm",
               lm_head="lm_head", attn="attention", o_proj="attention.dense", ln2="post_attention_layernorm",
               mlp="mlp", mlp_up="mlp.dense_h_to_4h", mlp_down="mlp.dense_4h_to_h", qkv="attention.query_key_value",
               qkv_style="neox", parallel_attr="use_parallel_residual")

# Hugging Face model_type -> layout.  Llama-style covers every model whose decoder layer is
# (input_layernorm, self_attn{q,k,v,o}_proj, post_attention_layernorm, mlp{gate,up,down}_proj).
LAYOUTS: dict[str, Layout] = {
    "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA, "gemma": LLAMA,
    "gpt2": GPT2, "gpt_neox": NEOX,
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
    :meth:`engine.backends.base.ModelBackend.logits_at`); architectures not in the table are assumed to."""
    layout = LAYOUTS.get(model_type)
    return layout is None or layout.end_rows
