"""How far bfloat16 / float16 results move from float32: logits, path patching, key heads.

Loads the model once per dtype (same device, same backend) and compares, over the correctly
answered prompts of a small set:

* END logits: max |difference| (in logits), and how often the argmax (the predicted token) agrees;
* path patching: the per-sender mean ``effect`` ((logit_p - logit_o) / logit_o) and ``logit_diff``
  (logit_p - logit_o): max |difference| over every head and MLP;
* the key heads: overlap of the top-10 heads by effect, and the Spearman rank correlation of all
  head effects.

On a GPU (the paper's setting: bf16 weights and activations)::

    .venv/bin/python bench/precision.py --device cuda --model meta-llama/Llama-2-7b-hf
    .venv/bin/python bench/precision.py --device cuda --smollm2

On CPU (bf16 and fp16 are emulated in software: slow, but the same numerics questions)::

    .venv/bin/python bench/precision.py                 # the bundled model
    .venv/bin/python bench/precision.py --smollm2       # the real SmolLM2-135M (Q4_1 GGUF, dequantized)
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.backends import open_model
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import keep_correct
from engine.techniques.attribution import spearman
from engine.techniques.path_patching import path_patching


def run(spec: str, device: str | None, dtypes: list[str], n: int, backend: str, batch_size: int) -> list[dict]:
    ref_model = open_model(spec, device=device, dtype="float32", backend=backend)
    pairs, _ = generate(ref_model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=n, seed=0))
    pairs = keep_correct(ref_model, pairs)
    if not pairs:
        raise SystemExit("the model answers none of the prompts right in float32")
    ids, mask, end = pad([p.ref_ids for p in pairs], pad_id(ref_model))
    rows_idx = torch.arange(len(pairs))

    def measure(model) -> tuple[torch.Tensor, object, float]:
        t0 = time.perf_counter()
        with torch.no_grad():
            lg = model.logits(ids, mask)[rows_idx, end.to(model.device)].float().cpu()
        raw = path_patching(model, pairs, batch_size=batch_size)
        return lg, raw, time.perf_counter() - t0

    lg32, raw32, t32 = measure(ref_model)
    eff32 = raw32.per_pair("effect")[0].mean(0).flatten()     # [L*H]
    ld32 = raw32.per_pair("logit_diff")[0].mean(0).flatten()
    meff32 = raw32.per_pair("effect")[1].mean(0)
    top32 = set(eff32.argsort()[:10].tolist())
    out = [{"dtype": "float32", "pairs": len(pairs), "seconds": t32}]
    del ref_model
    for dt in dtypes:
        model = open_model(spec, device=device, dtype=dt, backend=backend)
        lg, raw, t = measure(model)
        eff = raw.per_pair("effect")[0].mean(0).flatten()
        ld = raw.per_pair("logit_diff")[0].mean(0).flatten()
        meff = raw.per_pair("effect")[1].mean(0)
        out.append({
            "dtype": dt, "pairs": len(pairs), "seconds": t,
            "logit_max": float((lg - lg32).abs().max()),
            "logit_scale": float(lg32.abs().max()),
            "argmax_agree": float((lg.argmax(-1) == lg32.argmax(-1)).double().mean()),
            "effect_max": float(torch.cat([(eff - eff32).abs(), (meff - meff32).abs()]).max()),
            "effect_range": float(eff32.abs().max()),
            "logit_diff_max": float((ld - ld32).abs().max()),
            "top10_overlap": len(top32 & set(eff.argsort()[:10].tolist())),
            "spearman": spearman(eff.tolist(), eff32.tolist()),
        })
        del model
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="organism", help="organism | a local directory | a .gguf | a hub id")
    ap.add_argument("--smollm2", action="store_true", help="use the real SmolLM2-135M-Instruct (GGUF from PyPI)")
    ap.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda when present)")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--n", type=int, default=12, help="prompts per operation before the correctness filter")
    ap.add_argument("--backend", default="nnsight", choices=("bridge", "nnsight"))
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    spec = args.model
    if args.smollm2:
        from tests.helpers.smollm2 import smollm2_gguf_path
        spec = str(smollm2_gguf_path())
    rows = run(spec, args.device, [d for d in args.dtypes.split(",") if d], args.n, args.backend, args.batch_size)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = "SmolLM2-135M-Instruct" if args.smollm2 else spec
    print(f"\n{name} on {dev} ({torch.cuda.get_device_name() if dev.startswith('cuda') else 'CPU'}), "
          f"{args.backend} backend, torch {torch.__version__}, {rows[0]['pairs']} correctly answered prompts; "
          f"float32 logits up to {rows[1]['logit_scale'] if len(rows) > 1 else float('nan'):.1f}, "
          f"|effect| up to {rows[1]['effect_range'] if len(rows) > 1 else float('nan'):.3f}\n")
    print("| dtype | max abs END-logit diff | argmax agrees | max abs effect diff | max abs logit_diff diff | "
          "top-10 heads shared | Spearman (head effects) | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["dtype"] == "float32":
            print(f"| float32 (reference) | 0 | 100% | 0 | 0 | 10/10 | 1.000 | {r['seconds']:.1f} |")
            continue
        print(f"| {r['dtype']} | {r['logit_max']:.3g} | {r['argmax_agree']:.0%} | {r['effect_max']:.3g} | "
              f"{r['logit_diff_max']:.3g} | {r['top10_overlap']}/10 | {r['spearman']:.3f} | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
