"""Random-init models of many architectures, built from ``transformers`` configs and saved locally (no hub).

:func:`build_tiny_model` builds the lab's long-standing test shapes (Llama, Qwen2, Mistral, GPT-2, GPT-NeoX,
Qwen3, Gemma); :func:`build_tiny` builds any causal-LM ``model_type`` transformers knows from
``AutoConfig.for_model`` with 3 layers, 4 heads (2 KV heads where the architecture has them), d_model 64 and
the organism's word-level tokenizer -- the architecture matrix (``test_architectures.py``) runs on these.
Weights are random with non-zero biases and norm weights away from 1, so every piece of a block shows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.organism.recipe import build_tokenizer

#: the shape every tiny model shares (fields a config does not have are left out)
SIZES = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=0.1)

#: per model_type: the config fields that differ from :data:`SIZES` (other names, or what the class needs)
OVERRIDES: dict[str, dict] = {
    "gpt2": dict(n_embd=64, n_layer=3, n_head=4, n_positions=128, initializer_range=0.1),
    "gpt_bigcode": dict(n_embd=64, n_layer=3, n_head=4, n_positions=128, initializer_range=0.1),
    "openai-gpt": dict(n_embd=64, n_layer=3, n_head=4, n_positions=128, initializer_range=0.1),
    "gptj": dict(n_embd=64, n_layer=3, n_head=4, n_positions=128, rotary_dim=8, initializer_range=0.1),
    "codegen": dict(n_embd=64, n_layer=3, n_head=4, n_positions=128, n_ctx=128, rotary_dim=8, initializer_range=0.1),
    "falcon": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, initializer_range=0.1),
    "bloom": dict(hidden_size=64, n_layer=3, n_head=4, initializer_range=0.1),
    "opt": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=160, word_embed_proj_dim=64,
                max_position_embeddings=128, init_std=0.1),
    "xglm": dict(d_model=64, num_layers=3, attention_heads=4, ffn_dim=160, max_position_embeddings=128, init_std=0.1),
    "mpt": dict(d_model=64, n_layers=3, n_heads=4, max_seq_len=128),
    "gpt_neo": dict(hidden_size=64, num_layers=3, num_heads=4, max_position_embeddings=128,
                    attention_types=[[["global", "local"], 1], [["global"], 1]], initializer_range=0.1),
    "gpt_neox": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                     max_position_embeddings=128, initializer_range=0.1, rotary_pct=0.25),
    # LFM2 as released: short convolutions in most layers, attention in a few
    "lfm2": dict(SIZES, layer_types=["conv", "full_attention", "conv"]),
    "deepseek_v2": dict(SIZES, num_experts_per_tok=2, n_routed_experts=4, moe_intermediate_size=32),
    "deepseek_v3": dict(SIZES, num_experts_per_tok=2, n_routed_experts=4, moe_intermediate_size=32),
}

#: mixture-of-experts configs: few, small experts (the defaults make tiny models of tens of MB)
MOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32, moe_k=2, moe_num_experts=4, top_k=2)


def tiny_config(model_type: str, tok):
    """A 3-layer, d_model 64 config of ``model_type`` for the organism tokenizer ``tok``."""
    from transformers import AutoConfig
    base = AutoConfig.for_model(model_type)
    wanted = dict(OVERRIDES.get(model_type, SIZES))
    kw = {k: v for k, v in wanted.items() if model_type in OVERRIDES or hasattr(base, k)}
    kw.update({k: v for k, v in MOE.items() if hasattr(base, k) and getattr(base, k) is not None})
    cfg = AutoConfig.for_model(model_type, **kw, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if hasattr(cfg, "tie_word_embeddings"):
        cfg.tie_word_embeddings = False
    return cfg


def build_tiny(model_type: str, out_dir: Path, seed: int = 0) -> Path:
    """Save a random-init ``model_type`` model (with the organism's word-level tokenizer) to ``out_dir``."""
    from transformers import AutoModelForCausalLM
    tok = build_tokenizer()
    cfg = tiny_config(model_type, tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # non-zero biases and norm weights away from 1: every piece of a block shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.dim() == 1 and ("norm" in name or any(part.startswith("ln") for part in name.split(".")[:-1])):
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


def _config(arch: str, vocab: int, tok):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config
    common = dict(vocab_size=vocab, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if arch == "llama":
        return LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1,
                           tie_word_embeddings=False, **common)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1,
                           tie_word_embeddings=False, use_sliding_window=False, **common)
    if arch == "mistral":
        return MistralConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=1, max_position_embeddings=128, initializer_range=0.1,
                             sliding_window=None, tie_word_embeddings=False, **common)
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=128, initializer_range=0.1, **common)
    if arch in ("gpt_neox", "gpt_neox_sequential"):  # Pythia layout; parallel attention + MLP by default
        from transformers import GPTNeoXConfig
        return GPTNeoXConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                             max_position_embeddings=128, initializer_range=0.1, rotary_pct=0.25,
                             use_parallel_residual=arch == "gpt_neox", tie_word_embeddings=False, **common)
    if arch == "qwen3":
        from transformers import Qwen3Config
        return Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=0.1,
                           tie_word_embeddings=False, use_sliding_window=False, **common)
    if arch == "gemma":
        from transformers import GemmaConfig
        return GemmaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=16, max_position_embeddings=128, initializer_range=0.1,
                           **common)
    raise ValueError(arch)


def build_tiny_model(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """Save a random-init ``arch`` model (with the organism's word-level tokenizer) to ``out_dir``."""
    from transformers import AutoModelForCausalLM
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, len(tok), tok))
    with torch.no_grad():  # non-zero biases, so that bias handling is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir
