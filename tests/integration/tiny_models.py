"""Random-init models of several architectures, built and saved locally (no hub), for exactness tests."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.organism.recipe import build_tokenizer


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
