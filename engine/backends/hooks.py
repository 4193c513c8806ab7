"""Typed builders for the TransformerLens hook names of a ``TransformerBridge`` (transformer-lens 4.3.0).

Every technique in the engine names activations through these functions instead of formatting or
parsing strings itself, so a typo is an ``AttributeError`` at import time, not a silently empty
cache.  The names are the ones the installed ``TransformerBridge`` exposes in ``bridge.hook_dict``
for the decoder-only models the lab loads (Llama/GQA, Mistral, Qwen2, GPT-2, ...); the integration
test ``tests/integration/test_models.py`` checks every builder against a live bridge.

Shapes (``n_kv_heads < n_heads`` for grouped-query attention)::

    embed()                 # [batch, pos, d_model]      token embeddings (hook_embed)
    resid_pre(l)            # [batch, pos, d_model]      residual stream entering block l
    resid_mid(l)            # [batch, pos, d_model]      after attention, before the MLP  (see note)
    resid_post(l)           # [batch, pos, d_model]      residual stream leaving block l
    attn_q(l)               # [batch, pos, head, d_head]
    attn_k(l), attn_v(l)    # [batch, pos, kv_head, d_head]   (not repeated to n_heads)
    attn_scores(l)          # [batch, head, q_pos, k_pos]     pre-softmax, masked
    attn_pattern(l)         # [batch, head, q_pos, k_pos]     post-softmax
    attn_z(l)               # [batch, pos, head, d_head]      per-head output before W_O
    attn_result(l)          # [batch, pos, head, d_model]     per-head output after W_O   (flag)
    attn_proj_out(l)        # [batch, pos, d_model]           the attention module's output: o_proj(z)
    attn_out(l)             # [batch, pos, d_model]           the attention's contribution to the stream
    q_input(l)              # [batch, pos, head, d_model]     per-head query input        (flag)
    k_input(l), v_input(l)  # [batch, pos, kv_head, d_model]  per-kv-head key/value input (flag)
    mlp_in(l)               # [batch, pos, d_model]      MLP-branch input (pre-ln2)
    mlp_pre(l)              # [batch, pos, d_mlp]        pre-activation (gate projection for SwiGLU)
    mlp_post(l)             # [batch, pos, d_mlp]        post-activation (input of the down projection)
    mlp_out(l)              # [batch, pos, d_model]      MLP output
    ln_final_in()           # [batch, pos, d_model]      final norm's input (the last residual stream)
    ln_final_out()          # [batch, pos, d_model]      final norm's input normalised, before its weight
    unembed_out()           # [batch, pos, d_vocab]      logits

Flags: ``attn_result`` fires only after ``bridge.set_use_attn_result(True)``; ``q_input``/``k_input``/
``v_input`` only after ``bridge.set_use_split_qkv_input(True)``; ``mlp_in`` only after
``bridge.set_use_hook_mlp_in(True)`` (``engine.models.load.load_model`` turns that one on).

Note on writing (patching) hooks in transformer-lens 4.3.0: ``resid_mid(l)`` is an alias of
``blocks.{l}.ln2.hook_in``.  *Reading* it gives the true mid-block residual stream, but a hook that
*replaces* it changes only the MLP branch, not the residual skip connection -- i.e. it behaves
exactly like ``mlp_in(l)``.  To overwrite the whole residual stream, patch ``resid_pre``/``resid_post``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NewType

HookName = NewType("HookName", str)

__all__ = [
    "HookName", "REQUIRES_FLAG", "attn_k", "attn_out", "attn_pattern", "attn_proj_out", "attn_q", "attn_result",
    "attn_scores", "attn_v", "attn_z", "embed", "k_input", "ln_final_in", "ln_final_out", "mlp_in", "mlp_out",
    "mlp_post", "mlp_pre", "q_input", "resid_mid", "resid_post", "resid_pre", "unembed_out",
    "v_input", "layer_of", "validate_layer",
]


def validate_layer(layer: int, n_layers: int | None = None) -> int:
    """``layer`` as an int; TypeError for non-ints (bools too), ValueError when out of range."""
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
    if layer < 0:
        raise ValueError(f"layer must be >= 0, got {layer}; count layers from 0 (no negative indexing)")
    if n_layers is not None and layer >= n_layers:
        raise ValueError(f"layer {layer} is out of range: the model has {n_layers} layers (0..{n_layers - 1})")
    return layer


def _block(layer: int, suffix: str) -> HookName:
    return HookName(f"blocks.{validate_layer(layer)}.{suffix}")


def layer_of(name: HookName) -> int | None:
    """The block a hook name built here lies in (``blocks.{l}. ...`` -> l); None for the embedding and the output."""
    head, _, rest = str(name).partition(".")
    number = rest.partition(".")[0]
    return int(number) if head == "blocks" and number.isdigit() else None


# --- residual stream -------------------------------------------------------------------------

def embed() -> HookName:
    """Token embeddings.  # [batch, pos, d_model]"""
    return HookName("hook_embed")


def resid_pre(layer: int) -> HookName:
    """Residual stream entering block ``layer``.  # [batch, pos, d_model]"""
    return _block(layer, "hook_resid_pre")


def resid_mid(layer: int) -> HookName:
    """Residual stream between attention and MLP.  # [batch, pos, d_model]

    Read-only in practice: writing it only affects the MLP branch (see module docstring)."""
    return _block(layer, "hook_resid_mid")


def resid_post(layer: int) -> HookName:
    """Residual stream leaving block ``layer``.  # [batch, pos, d_model]"""
    return _block(layer, "hook_resid_post")


# --- attention -------------------------------------------------------------------------------

def attn_q(layer: int) -> HookName:
    """Queries (after projection, before rotary).  # [batch, pos, head, d_head]"""
    return _block(layer, "attn.hook_q")


def attn_k(layer: int) -> HookName:
    """Keys, one per key/value head.  # [batch, pos, kv_head, d_head]"""
    return _block(layer, "attn.hook_k")


def attn_v(layer: int) -> HookName:
    """Values, one per key/value head.  # [batch, pos, kv_head, d_head]"""
    return _block(layer, "attn.hook_v")


def attn_scores(layer: int) -> HookName:
    """Pre-softmax attention scores.  # [batch, head, q_pos, k_pos]"""
    return _block(layer, "attn.hook_attn_scores")


def attn_pattern(layer: int) -> HookName:
    """Attention probabilities.  # [batch, head, q_pos, k_pos]"""
    return _block(layer, "attn.hook_pattern")


def attn_z(layer: int) -> HookName:
    """Per-head attention output before W_O.  # [batch, pos, head, d_head]"""
    return _block(layer, "attn.hook_z")


def attn_result(layer: int) -> HookName:
    """Per-head output after W_O (needs ``bridge.set_use_attn_result(True)``).  # [batch, pos, head, d_model]"""
    return _block(layer, "attn.hook_result")


def attn_proj_out(layer: int) -> HookName:
    """The attention module's output: every head's output through W_O, summed (+ b_O), before a
    post-attention norm or a residual scale (Gemma 2/3, OLMo 2/3, Granite).  # [batch, pos, d_model]"""
    return _block(layer, "attn.hook_out")


def attn_out(layer: int) -> HookName:
    """What the attention adds to the residual stream: :func:`attn_proj_out` after the block's post-attention
    norm and residual scale, where it has them (equal to it otherwise).  # [batch, pos, d_model]"""
    return _block(layer, "hook_attn_out")


def q_input(layer: int) -> HookName:
    """Per-head query input (needs ``bridge.set_use_split_qkv_input(True)``).  # [batch, pos, head, d_model]"""
    return _block(layer, "hook_q_input")


def k_input(layer: int) -> HookName:
    """Per-kv-head key input (needs ``set_use_split_qkv_input(True)``).  # [batch, pos, kv_head, d_model]"""
    return _block(layer, "hook_k_input")


def v_input(layer: int) -> HookName:
    """Per-kv-head value input (needs ``set_use_split_qkv_input(True)``).  # [batch, pos, kv_head, d_model]"""
    return _block(layer, "hook_v_input")


# --- MLP -------------------------------------------------------------------------------------

def in_attention(name: HookName) -> bool:
    """Whether ``name`` is an activation of its block's attention (q, k, v, scores, pattern, z, result, output),
    read before the block's MLP."""
    layer = layer_of(name)
    return layer is not None and str(name) in {
        str(f(layer)) for f in (attn_q, attn_k, attn_v, attn_scores, attn_pattern, attn_z, attn_result, attn_proj_out,
                                attn_out)}


def mlp_in(layer: int) -> HookName:
    """The residual stream the MLP branch reads, before its norm: the mid-block stream, or the block input in a
    parallel block (needs ``set_use_hook_mlp_in(True)``).  # [batch, pos, d_model]"""
    return _block(layer, "hook_mlp_in")


def mlp_pre(layer: int) -> HookName:
    """MLP pre-activation (the gate projection for gated MLPs).  # [batch, pos, d_mlp]"""
    return _block(layer, "mlp.hook_pre")


def mlp_post(layer: int) -> HookName:
    """MLP hidden activation, the input of the down projection.  # [batch, pos, d_mlp]"""
    return _block(layer, "mlp.hook_post")


def mlp_out(layer: int) -> HookName:
    """What the MLP adds to the residual stream (after a post-MLP norm and a residual scale, where the
    block has them).  # [batch, pos, d_model]"""
    return _block(layer, "hook_mlp_out")


# --- output ----------------------------------------------------------------------------------

def ln_final_in() -> HookName:
    """The final norm's input: the residual stream after the last block.  # [batch, pos, d_model]

    An edit may return fewer positions ([batch, m, d_model]): the final norm and the unembedding
    then run on those m positions only, and the logits are [batch, m, d_vocab]
    (:meth:`engine.backends.base.ModelBackend.logits_at`)."""
    return HookName("ln_final.hook_in")


def ln_final_out() -> HookName:
    """The final norm's input, normalised but not yet scaled by the norm's weight (and bias):
    transformer-lens' ``hook_normalized``, so not exactly what the unembedding reads.  # [batch, pos, d_model]"""
    return HookName("ln_final.hook_normalized")


def unembed_out() -> HookName:
    """Logits.  # [batch, pos, d_vocab]"""
    return HookName("hook_unembed")


# Builders whose hook only fires after a bridge flag is switched on: builder name -> bridge method.
REQUIRES_FLAG: Mapping[str, str] = MappingProxyType({
    "attn_result": "set_use_attn_result",
    "q_input": "set_use_split_qkv_input",
    "k_input": "set_use_split_qkv_input",
    "v_input": "set_use_split_qkv_input",
    "mlp_in": "set_use_hook_mlp_in",
})
