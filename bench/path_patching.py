"""Benchmark: fast exact path patching vs the textbook one-forward-per-sender reference.

Prints a table: model, senders, prompts, fast seconds, reference seconds, ratio, max relative
difference (|logit_p fast - logit_p reference| / |logit_o|, over every sender the reference ran).

On models too large to run the reference for every sender on a CPU, the reference is timed on a
spread sample of senders (``--ref-senders``) and its time scaled to all senders -- the table says so.
End to end: both sides plus the seconds of a whole ``python -m engine info`` process (interpreter,
imports, the model opened), as a command-line run of either would pay them.

    .venv/bin/python bench/path_patching.py            # bundled model + Qwen2.5-0.5B-shaped random init
    .venv/bin/python bench/path_patching.py --quick    # smaller second model (for a smoke run)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from engine.backends import open_model
from engine.organism.recipe import build_tokenizer
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.patching import Sender, all_senders, path_patching, path_patching_reference


def organism_label(vocab: bool = False) -> str:
    """The bundled model's row label, read from its config ("organism (8L, 8H/2KV, d128)")."""
    import json

    from engine.models.spec import ORGANISM_DIR
    c = json.loads((ORGANISM_DIR / "config.json").read_text())
    tail = f", vocab {c['vocab_size']}" if vocab else ""
    return (f"organism ({c['num_hidden_layers']}L, {c['num_attention_heads']}H/{c['num_key_value_heads']}KV, "
            f"d{c['hidden_size']}{tail})")


def qwen_shaped(out: Path, quick: bool) -> Path:
    """Random-init Qwen2 with Qwen2.5-0.5B's shape (24 layers, 14 heads, 2 KV heads, 896, 4864)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=151936 if not quick else 4096, hidden_size=896, intermediate_size=4864,
                      num_hidden_layers=24 if not quick else 6, num_attention_heads=14, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=True, use_sliding_window=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def spread(senders: list[Sender], k: int) -> list[Sender]:
    if k >= len(senders):
        return senders
    step = len(senders) / k
    return [senders[int(i * step)] for i in range(k)]


def open_seconds(spec: str) -> float:
    """Seconds of a whole ``python -m engine info`` process: interpreter start, imports, the model opened."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "engine", "info", "--model", spec, "--device", "cpu"], check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def bench(name: str, spec: str, n_prompts: int, ref_senders: int | None) -> dict:
    torch.manual_seed(0)
    model = open_model(spec, device="cpu")
    L, H = model.facts.n_layers, model.facts.n_heads
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=n_prompts, seed=0))
    pairs = pairs[:n_prompts] if len(pairs) >= n_prompts else pairs
    senders = all_senders(L, H)
    t0 = time.perf_counter()
    fast = path_patching(model, pairs, batch_size=n_prompts)
    t_fast = time.perf_counter() - t0
    sample = senders if ref_senders is None else spread(senders, ref_senders)
    t0 = time.perf_counter()
    ref = path_patching_reference(model, pairs, sample, batch_size=n_prompts)
    t_ref = (time.perf_counter() - t0) * len(senders) / len(sample)
    scale = fast.logit_o.abs().clamp_min(1e-3)
    worst = 0.0
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        worst = max(worst, float(((f - v).abs() / scale).max()))
    t_open = open_seconds(spec)
    return {"model": name, "senders": len(senders), "prompts": len(pairs), "fast_s": t_fast, "ref_s": t_ref,
            "ratio": t_ref / t_fast, "max_rel_diff": worst, "open_s": t_open,
            "e2e_ratio": (t_open + t_ref) / (t_open + t_fast),
            "note": "" if len(sample) == len(senders) else f"reference timed on {len(sample)} senders, scaled"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--ref-senders", type=int, default=12, help="reference sample on the big model")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [bench(organism_label(), "organism", args.prompts, None)]
    with tempfile.TemporaryDirectory() as d:
        path = qwen_shaped(Path(d) / "qwen", args.quick)
        label = ("random Qwen2.5-0.5B shape (24L, 14H/2KV, d896, mlp4864)" if not args.quick
                 else "random Qwen2 (6L, quick)")
        rows.append(bench(label, str(path), args.prompts, args.ref_senders))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32\n")
    print("| model | senders | prompts | fast s | reference s | ratio | max rel diff | open s | end-to-end ratio "
          "| note |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['senders']} | {r['prompts']} | {r['fast_s']:.2f} | {r['ref_s']:.1f} | "
              f"{r['ratio']:.0f}x | {r['max_rel_diff']:.1e} | {r['open_s']:.1f} | {r['e2e_ratio']:.0f}x | "
              f"{r['note']} |")


if __name__ == "__main__":
    main()
