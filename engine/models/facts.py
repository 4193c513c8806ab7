"""Model facts: what the dashboard, the techniques and the result cache need to know about a
loaded model (sizes, precision, device, parameter count, weights fingerprint), built in one place
from the Hugging Face config."""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.models.spec import ResolvedSpec


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the dashboard and the result cache need to know about a loaded model."""

    spec: str
    source_kind: str  # SourceKind value
    source: str  # resolved path or hub id
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama"
    n_layers: int
    n_heads: int
    n_kv_heads: int  # < n_heads for grouped-query attention
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int  # rows of the embedding matrix (the tokenizer may know fewer tokens)
    dtype: str  # "float32" | "bfloat16" | "float16"
    device: str
    n_params: int  # unique parameters (tied embeddings counted once)
    fingerprint: str  # weights_fingerprint(model), 16 hex chars

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable copy."""
        return dataclasses.asdict(self)



def facts_from_config(resolved: ResolvedSpec, architecture: str, config: Any, dtype_name: str, device: Any,
                      n_params: int, fingerprint: str, vocab_size: int | None = None) -> ModelFacts:
    """ModelFacts from a Hugging Face config alone (also for models whose weights are remote)."""
    cfg = getattr(config, "text_config", None) or config

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            value = getattr(cfg, name, None)
            if value is not None:
                return value
        return default

    heads = first("num_attention_heads", "n_head", "num_heads")
    if not heads:
        from engine.models.spec import ModelLoadError
        raise ModelLoadError(f"{architecture} cannot be studied here: its config names no attention heads "
                             f"(num_attention_heads) -- the lab patches attention heads, and this model has none")
    d_model = int(first("hidden_size", "n_embd", "d_model"))
    n_heads = int(heads)
    n_kv = int(first("num_key_value_heads", "num_kv_heads", default=n_heads))
    d_head = int(first("head_dim", default=d_model // n_heads))
    d_mlp = int(first("intermediate_size", "n_inner", "ffn_dim", default=4 * d_model))
    return ModelFacts(
        spec=resolved.spec,
        source_kind=resolved.kind.value,
        source=resolved.location,
        architecture=architecture,
        model_type=str(getattr(config, "model_type", "")),
        n_layers=int(first("num_hidden_layers", "n_layer", "num_layers")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_model=d_model,
        d_head=d_head,
        d_mlp=d_mlp,
        vocab_size=int(vocab_size if vocab_size is not None else first("vocab_size")),
        dtype=dtype_name,
        device=str(device),
        n_params=int(n_params),
        fingerprint=fingerprint,
    )
