"""Benchmark: the two backends against plain transformers (the overhead each adds).

Prints a table per model: one forward pass (logits), one forward pass caching the activations fast
path patching reads (attn_z, attn_out, resid_pre, mlp_out of every layer), and a whole fast path
patching run, for

* plain transformers -- the Hugging Face model called directly, activations taken with
  ``register_forward_(pre_)hook`` (the floor: no interpretability library at all);
* ``bridge`` -- TransformerBridge (transformer-lens 4);
* ``nnsight`` -- nnsight 0.8 over the plain model (local).

Times are the best of ``--reps`` interleaved repetitions (path patching: a third of them, at least
one) on a right-padded batch of ``--prompts`` arithmetic prompts; "x plain" is the ratio to plain
transformers.  ``--only organism`` skips the second model.

    .venv/bin/python bench/backends.py            # bundled model + Qwen2.5-0.5B-shaped random init
    .venv/bin/python bench/backends.py --quick    # smaller second model (smoke run)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.path_patching import organism_label, qwen_shaped
from engine.backends import hooks as H
from engine.backends import open_model
from engine.machinery.batching import pad as pad_ids
from engine.models.load import load_plain
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.path_patching import path_patching


def best_times(fns: dict, reps: int) -> dict:
    """Fastest of ``reps`` runs of each function, repetitions interleaved: other load on the machine
    hits every variant alike, and the minimum is the least disturbed estimate of the cost itself."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def plain_cache(model, layers: str, ids, mask) -> dict:
    """Plain transformers: the same activations as the backends' run_with_cache, with torch hooks."""
    out, handles = {}, []
    for i, layer in enumerate(model.get_submodule(layers)):
        handles.append(layer.register_forward_pre_hook(
            lambda m, a, i=i: out.__setitem__(f"pre{i}", a[0].detach())))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, i=i: out.__setitem__(f"z{i}", a[0].detach())))
        handles.append(layer.self_attn.register_forward_hook(
            lambda m, a, o, i=i: out.__setitem__(f"attn{i}", o[0].detach())))
        handles.append(layer.mlp.register_forward_hook(
            lambda m, a, o, i=i: out.__setitem__(f"mlp{i}", o.detach())))
    try:
        out["logits"] = model(ids, attention_mask=mask).logits
    finally:
        for h in handles:
            h.remove()
    return out


def bench(label: str, spec: str, n_prompts: int, reps: int) -> list[dict]:
    torch.manual_seed(0)
    plain = load_plain(spec, device="cpu")
    backends = {"bridge": open_model(spec, device="cpu"), "nnsight": open_model(spec, device="cpu", backend="nnsight")}
    tok = backends["bridge"].tokenizer
    pairs, _ = generate(tok, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=n_prompts, seed=0))
    pairs = pairs[:n_prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids, mask, _ = pad_ids([p.ref_ids for p in pairs], pad)
    L = backends["bridge"].facts.n_layers
    names = [n for layer in range(L) for n in (H.attn_z(layer), H.attn_out(layer), H.resid_pre(layer),
                                               H.mlp_out(layer))]
    rows = []
    with torch.no_grad():
        fwd = best_times({"plain": lambda: plain.hf_model(ids, attention_mask=mask).logits,
                            **{k: (lambda b=b: b.logits(ids, mask)) for k, b in backends.items()}}, reps)
        cache = best_times({"plain": lambda: plain_cache(plain.hf_model, "model.layers", ids, mask),
                              **{k: (lambda b=b: b.run_with_cache(ids, mask, names)) for k, b in backends.items()}},
                             reps)
        patching = best_times({k: (lambda b=b: path_patching(b, pairs, batch_size=n_prompts))
                                 for k, b in backends.items()}, max(1, reps // 3))
        rows.append({"model": label, "backend": "plain transformers", "forward": fwd["plain"],
                     "cache": cache["plain"], "patching": None})
        for name in backends:
            rows.append({"model": label, "backend": name, "forward": fwd[name], "cache": cache[name],
                         "patching": patching[name], "fwd_x": fwd[name] / fwd["plain"],
                         "cache_x": cache[name] / cache["plain"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a 6-layer, small-vocabulary second model")
    ap.add_argument("--only", choices=("organism",), help="only the bundled model")
    args = ap.parse_args()
    rows = bench(organism_label(), "organism", args.prompts, args.reps)
    with tempfile.TemporaryDirectory() as d:
        if args.only:
            d = None
        if d is not None:
            path = qwen_shaped(Path(d) / "qwen", args.quick)
            label = "random Qwen2.5-0.5B shape (24L, 14H/2KV, d896)" if not args.quick else "random Qwen2 (6L, quick)"
            rows += bench(label, str(path), args.prompts, args.reps)
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32, "
          f"{args.prompts} prompts per batch, best of {args.reps}\n")
    print("| model | backend | forward ms | x plain | run_with_cache ms | x plain | path patching s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        fx = f"{r['fwd_x']:.2f}" if "fwd_x" in r else "1.00"
        cx = f"{r['cache_x']:.2f}" if "cache_x" in r else "1.00"
        pp = f"{r['patching']:.2f}" if r["patching"] is not None else "-"
        print(f"| {r['model']} | {r['backend']} | {r['forward'] * 1e3:.1f} | {fx} | {r['cache'] * 1e3:.1f} | {cx} | "
              f"{pp} |")


if __name__ == "__main__":
    main()
