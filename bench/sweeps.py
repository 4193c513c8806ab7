"""Benchmark: every sweep's cost in forward-equivalents and seconds, against its floor.

For the bundled model, SmolLM2-135M and a random-init Qwen2.5-0.5B-shaped model (full 151,936-token
vocabulary), on ``--n`` prompts per operation (default 16, ``--ops add``), prints per technique:
seconds (wall and process CPU), **forward-equivalents** (FE) and the floor they are measured
against.  (The implementations these replaced -- full ``[batch, pos, vocab]`` logits, one pass per
knockout set -- are measured at the commit docs/benchmarks.md names; run this script there to compare.)

Forward-equivalent: one batched forward pass of the prompt set (right-padded, full logits) = 1.
The work of every forward call is *counted* (positions through the blocks, positions through the
final norm + unembedding, MLP-branch rows of path patching's END chains) by wrapping the backend's
methods, and weighted by multiply-accumulates per position from the model's shape (attention
projections + MLP per block, d_model x vocab for the unembedding); attention scores are left out.

    .venv/bin/python bench/sweeps.py                   # all three models
    .venv/bin/python bench/sweeps.py --models organism,smollm2
    .venv/bin/python bench/sweeps.py --models llama7b --device cuda --dtype bfloat16 --ops add,sub,mul,div --n 16
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from bench.path_patching import organism_label
from bench.path_patching import qwen_shaped as build_qwen_shaped
from bench.work import Counter, fe
from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import score_pairs
from engine.techniques.knockout import Knockout, distinct_knockouts, knockout_accuracies, mean_activations
from engine.techniques.knockout_curve import curve_knockouts, knockout_curve
from engine.techniques.path_patching import cached_path_patching


@dataclass
class Row:
    model: str
    technique: str
    after_s: float
    after_cpu: float
    after_fe: float
    floor_fe: float
    floor: str
    note: str = ""


def measure(counter: Counter, fn: Callable[[], object]) -> tuple[float, float, tuple[int, int, int, int]]:
    b0 = counter.snapshot()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    b1 = counter.snapshot()
    return t, c, tuple(x - y for x, y in zip(b1, b0))


def bench_model(label: str, spec: str, ops: tuple[str, ...], n: int, *, device: str = "cpu",
                dtype: str = "float32") -> list[Row]:
    torch.manual_seed(0)
    model = open_model(spec, device=device, dtype=dtype)
    f = model.facts
    L, H = f.n_layers, f.n_heads
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=ops, n=n, seed=0))
    pairs = pairs[:n * len(ops)]
    unit = len(pairs) * max(len(p.ref_ids) for p in pairs)
    c = Counter()
    c.attach(model)
    rows: list[Row] = []

    def row(name, measured, floor_fe, floor, note=""):
        t, cpu, w = measured
        rows.append(Row(label, name, t, cpu, fe(f, unit, w[0], w[1], w[2]), floor_fe, floor, note))

    # -- accuracy: the prompt filter + the accuracy table -----------------------------------------
    t = measure(c, lambda: (score_pairs(model, pairs), score_pairs(model, pairs)))
    ans_tokens = sum(len(p.ref_ids) + len(p.answer_ids) for p in pairs)
    floor = fe(f, unit, ans_tokens, sum(len(p.answer_ids) + 1 for p in pairs))
    row("filter + accuracy", t, floor, "1 pass over prompt+answer, unembedding at END..")

    # -- mean activations (once per prompt set and model, memoized) --------------------------------
    t = measure(c, lambda: mean_activations(model, pairs))
    means = mean_activations(model, pairs)
    row("mean activations (X_c)", t, fe(f, unit, unit, unit), "1 forward over X_c")

    # -- path patching --------------------------------------------------------------------------
    tables = []
    t = measure(c, lambda: tables.append(cached_path_patching(model, pairs)[0]))
    ranked_all = [(layer, h) for layer, h, _ in tables[0].top_heads(20)]
    row("path patching (all heads + MLPs)", t, fe(f, unit, 2 * unit, 2 * unit), "2 forwards (+ END MLP chains)")

    # -- live knockout: accuracy before + after (3 heads) -------------------------------------------
    ko = Knockout(tuple(ranked_all[:3]))
    t = measure(c, lambda: knockout_accuracies(model, pairs, [Knockout(), ko], means))
    real = sum(len(p.ref_ids) for p in pairs)
    row("knockout (none and 3 heads)", t, fe(f, unit, 2 * real, 2 * len(pairs)), "2 END-only evaluations")

    # -- knockout curve, k_max 10, 5 draws -----------------------------------------------------------
    k_max, draws = 10, 5
    ranked = ranked_all[:k_max]
    plan = curve_knockouts(L, H, ranked, k_max=k_max, draws=draws)
    n_distinct = len(distinct_knockouts([k for _, t_, r in plan for k in [t_, *r]], L, H))
    t = measure(c, lambda: knockout_curve(model, pairs, ranked, means, k_max=k_max, draws=draws))
    row(f"knockout curve (k<={k_max}, {draws} draws)", t, fe(f, unit, n_distinct * real, n_distinct * len(pairs)),
        f"{n_distinct} distinct sets x 1 END-only evaluation")

    # -- transfer: the knockouts of one set (patching as above) -----------------------------------------
    own, other = Knockout(tuple(ranked_all[:10])), Knockout(tuple(ranked_all[10:20]))
    t = measure(c, lambda: knockout_accuracies(model, pairs, [Knockout(), own, other], means))
    row("transfer knockouts (per set: none, own, other)", t, fe(f, unit, 3 * real, 3 * len(pairs)),
        "3 END-only evaluations (+ path patching, as above)")
    return rows


def qwen_shaped(out: Path) -> Path:
    return build_qwen_shaped(out, quick=False)


def llama7b_shaped(out: Path, device: str) -> Path:
    """Random-init Llama-2-7B shape (32 layers, 32 heads, d_model 4096, d_mlp 11008, vocab 32000), bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.organism.recipe import build_tokenizer
    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="organism,smollm2,qwen0.5b",
                    help="comma list of organism, smollm2, qwen0.5b, llama7b (the GPU run: use --device cuda)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--ops", default="add")
    ap.add_argument("--n", type=int, default=16, help="prompts per operation")
    args = ap.parse_args()
    ops = tuple(o.strip() for o in args.ops.split(","))
    rows: list[Row] = []
    wanted = args.models.split(",")
    if "organism" in wanted:
        rows += bench_model(organism_label(vocab=True), "organism", ops, args.n)
    if "smollm2" in wanted:
        from tests.helpers.smollm2 import smollm2_gguf_path
        rows += bench_model("SmolLM2-135M (30L, 9H/3KV, d576, vocab 49152)", str(smollm2_gguf_path()), ops,
                            args.n)
    if "qwen0.5b" in wanted:
        with tempfile.TemporaryDirectory() as d:
            path = qwen_shaped(Path(d) / "qwen")
            rows += bench_model("random Qwen2.5-0.5B shape (24L, 14H/2KV, d896, vocab 151936)", str(path), ops,
                                args.n, device=args.device, dtype=args.dtype)
    if "llama7b" in wanted:
        with tempfile.TemporaryDirectory() as d:
            path = llama7b_shaped(Path(d) / "llama", args.device)
            rows += bench_model("random Llama-2-7B shape (32L, 32H, d4096, mlp 11008, vocab 32000)", str(path), ops,
                                args.n, device=args.device, dtype=args.dtype)
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.device}, {args.dtype}, "
          f"{args.n} prompts per op "
          f"({args.ops}); FE = forward-equivalents (1 = one padded full-logits pass of the prompts); "
          f"s = wall seconds, cpu = process CPU seconds\n")
    print("| model | technique | s (cpu) | FE | floor FE | FE / floor | floor | note |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        print(f"| {r.model} | {r.technique} | {r.after_s:.2f} ({r.after_cpu:.2f}) | {r.after_fe:.1f} | "
              f"{r.floor_fe:.1f} | {r.after_fe / max(r.floor_fe, 1e-9):.2f} | {r.floor} | {r.note} |")


if __name__ == "__main__":
    main()
