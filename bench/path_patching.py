"""Benchmark: fast exact path patching vs the textbook one-forward-per-sender reference.

Prints a table: model, senders, prompts, fast seconds and forward-equivalents, reference seconds and
forward-equivalents, ratio, max relative difference (|logit_p fast - logit_p reference| / |logit_o|, over
every sender the reference ran), and whether the fast path held (its self-check) or gave way to the loop.

On models too large to run the reference for every sender on a CPU, the reference is timed on a
spread sample of senders (``--ref-senders``) and its time scaled to all senders -- the table says so.
End to end: both sides plus the seconds of a whole ``python -m engine info`` process (interpreter,
imports, the model opened), as a command-line run of either would pay them.  Forward-equivalents
(:mod:`bench.work`): one padded forward pass of the prompt set = 1.

    .venv/bin/python bench/path_patching.py            # bundled model, Qwen2.5-0.5B and Gemma 3 270M shapes
    .venv/bin/python bench/path_patching.py --models gemma3-270m --prompts 32
    .venv/bin/python bench/path_patching.py --quick    # smaller models (a smoke run)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.work import Counter, fe
from engine.backends import open_model
from engine.organism.recipe import build_tokenizer
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.path_patching import Sender, all_senders, path_patching, path_patching_reference


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


def gemma3_shaped(out: Path, quick: bool) -> Path:
    """Random-init Gemma 3 with Gemma 3 270M's shape (18 layers, 4 heads, 1 KV head, head_dim 256, d640, mlp 2048,
    vocab 262,144, sliding windows of 512 in 5 of every 6 layers): post-norms on both branches."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    tok = build_tokenizer()
    layers = 18 if not quick else 6
    cfg = Gemma3TextConfig(vocab_size=262144 if not quick else 4096, hidden_size=640, intermediate_size=2048,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                           query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
                           layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                        for i in range(layers)],
                           tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Gemma3ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


SHAPES = {
    "qwen0.5b": (qwen_shaped, "random Qwen2.5-0.5B shape (24L, 14H/2KV, d896, mlp4864)", "random Qwen2 (6L, quick)"),
    "gemma3-270m": (gemma3_shaped, "random Gemma 3 270M shape (18L, 4H/1KV, dh256, d640, mlp2048, vocab 262k)",
                    "random Gemma 3 (6L, quick)"),
}


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
    counter = Counter()
    counter.attach(model)
    unit = len(pairs) * max(len(p.ref_ids) for p in pairs)  # one padded pass of the set
    t0 = time.perf_counter()
    fast = path_patching(model, pairs, batch_size=n_prompts)
    t_fast = time.perf_counter() - t0
    fe_fast = fe(model.facts, unit, counter.body, counter.unembed, counter.mlp_rows)
    sample = senders if ref_senders is None else spread(senders, ref_senders)
    b0 = counter.snapshot()
    t0 = time.perf_counter()
    ref = path_patching_reference(model, pairs, sample, batch_size=n_prompts)
    t_ref = (time.perf_counter() - t0) * len(senders) / len(sample)
    b1 = counter.snapshot()
    fe_ref = fe(model.facts, unit, b1[0] - b0[0], b1[1] - b0[1]) * len(senders) / len(sample)
    scale = fast.logit_o.abs().clamp_min(1e-3)
    worst = 0.0
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        worst = max(worst, float(((f - v).abs() / scale).max()))
    t_open = open_seconds(spec)
    notes = ([] if len(sample) == len(senders) else [f"reference timed on {len(sample)} senders, scaled"])
    notes += ["fast path held" if fast.fallback is None else "FELL BACK to the loop"]
    return {"model": name, "senders": len(senders), "prompts": len(pairs), "fast_s": t_fast, "ref_s": t_ref,
            "fast_fe": fe_fast, "ref_fe": fe_ref,
            "ratio": t_ref / t_fast, "max_rel_diff": worst, "open_s": t_open,
            "e2e_ratio": (t_open + t_ref) / (t_open + t_fast), "note": "; ".join(notes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--ref-senders", type=int, default=12, help="reference sample on the big models")
    ap.add_argument("--models", default="organism,qwen0.5b,gemma3-270m",
                    help=f"comma list of organism, {', '.join(SHAPES)}")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    rows = [bench(organism_label(), "organism", args.prompts, None)] if "organism" in wanted else []
    for key in (m for m in wanted if m in SHAPES):
        build, label, quick_label = SHAPES[key]
        with tempfile.TemporaryDirectory() as d:
            path = build(Path(d) / key, args.quick)
            rows.append(bench(quick_label if args.quick else label, str(path), args.prompts, args.ref_senders))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32\n")
    print("| model | senders | prompts | fast s | fast FE | reference s | reference FE | ratio | max rel diff | open s "
          "| end-to-end ratio | note |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['senders']} | {r['prompts']} | {r['fast_s']:.2f} | {r['fast_fe']:.1f} | "
              f"{r['ref_s']:.1f} | {r['ref_fe']:.0f} | {r['ratio']:.0f}x | {r['max_rel_diff']:.1e} | "
              f"{r['open_s']:.1f} | {r['e2e_ratio']:.0f}x | {r['note']} |")


if __name__ == "__main__":
    main()
