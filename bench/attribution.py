"""Benchmark: attribution patching vs exact patching, head -> head, layer x position, logit lens.

Prints one table per model: each technique's seconds and **forward-equivalents** (its seconds divided
by the seconds of one batched forward pass of the same reference prompts, median of 3), so the
figures survive a busy machine.  Targets (issue "Beyond path patching"): AtP for every head and MLP
<= 4 forward-equivalents per batch; exact path patching <= 15 on the Qwen2.5-0.5B shape; head -> head
for one receiver at its floor (the END token alone per row) beside its textbook loop.

    .venv/bin/python bench/attribution.py                     # bundled model, SmolLM2-135M, Qwen2.5-0.5B shape
    .venv/bin/python bench/attribution.py --models organism   # one model
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.path_patching import qwen_shaped
from engine.backends import open_model
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attribution import (
    AttributionRaw,
    activation_patching,
    agreement,
    path_atp,
    sender_rows,
    total_atp,
)
from engine.techniques.head_patching import Receiver, head_path_patching, head_path_patching_reference
from engine.techniques.logit_lens import logit_lens
from engine.techniques.path_patching import path_patching
from engine.techniques.position_patching import layer_position_patching
from tests.helpers.smollm2 import smollm2_gguf_path


def forward_seconds(model, pairs) -> float:
    ids, mask, _ = pad([p.ref_ids for p in pairs], pad_id(model))
    times = []
    with torch.no_grad():
        for _ in range(3):
            t0 = time.perf_counter()
            model.logits(ids, mask)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed(fn, *a, **k):
    t0 = time.perf_counter()
    out = fn(*a, **k)
    return out, time.perf_counter() - t0


def bench(name: str, spec: str, per_op: int, with_total: bool, with_h2h: bool) -> tuple[str, list[tuple], str]:
    model = open_model(spec, device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=per_op, seed=0))
    P = len(pairs)
    fwd = forward_seconds(model, pairs)
    rows = []
    exact, t = timed(path_patching, model, pairs, batch_size=P)
    rows.append(("path patching, exact (every head + MLP)", t))
    atp, t = timed(path_atp, model, pairs, batch_size=P)
    rows.append(("path patching, AtP (every head + MLP)", t))
    raw = AttributionRaw(exact, atp)
    if with_total:
        ex_t, t = timed(activation_patching, model, pairs)
        rows.append(("activation patching, exact (one forward per sender)", t))
        at_t, t = timed(total_atp, model, pairs, batch_size=P)
        rows.append(("activation patching, AtP (1 forward + 1 backward)", t))
        raw.exact_total, raw.atp_total = ex_t, at_t
    if with_h2h:
        rec = Receiver(model.facts.n_layers // 2, 0, "q")
        n_send = rec.layer * (model.facts.n_heads + 1)
        _, t = timed(head_path_patching, model, pairs, rec)
        rows.append((f"head -> head, receiver {rec} ({n_send} senders), END token alone per row", t))
        _, t = timed(head_path_patching_reference, model, pairs, rec)
        rows.append((f"head -> head, receiver {rec}, textbook loop (whole prompts per row)", t))
    _, t = timed(layer_position_patching, model, pairs)
    rows.append(("layer x position patching (exact)", t))
    _, t = timed(logit_lens, model, pairs, batch_size=P)
    rows.append(("logit lens", t))
    ag = agreement(sender_rows(raw), "exact", "atp")
    note = (f"AtP vs exact path patching (heads): Spearman {ag.spearman:.3f}, top-5 overlap {ag.overlap[5]}/5, "
            f"top-10 overlap {ag.overlap[10]}/10")
    if with_total:
        ag2 = agreement(sender_rows(raw), "exact_total", "atp_total")
        note += (f"; AtP vs exact activation patching: Spearman {ag2.spearman:.3f}, "
                 f"top-10 overlap {ag2.overlap[10]}/10")
    f = model.facts
    head = (f"{name} ({f.n_layers}L, {f.n_heads}H/{f.n_kv_heads}KV): {P} prompts, "
            f"one batched forward {fwd:.3f} s")
    return head, [(label, s, s / fwd) for label, s in rows], note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-op", type=int, default=16, help="prompts per operation (default 16)")
    ap.add_argument("--models", default="organism,smollm2,qwen", help="comma list of organism, smollm2, qwen")
    args = ap.parse_args()
    wanted = args.models.split(",")
    tables = []
    with tempfile.TemporaryDirectory() as d:
        if "organism" in wanted:
            tables.append(bench("bundled model", "organism", args.per_op, True, True))
        if "smollm2" in wanted:
            tables.append(bench("SmolLM2-135M", str(smollm2_gguf_path()), args.per_op, True, True))
        if "qwen" in wanted:
            path = qwen_shaped(Path(d) / "qwen", quick=False)
            tables.append(bench("random Qwen2.5-0.5B shape (vocab 151,936)", str(path), args.per_op,
                                False, False))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32")
    for head, rows, note in tables:
        print(f"\n{head}\n")
        print("| technique | seconds | forward-equivalents |")
        print("| --- | ---: | ---: |")
        for label, s, fe in rows:
            print(f"| {label} | {s:.2f} | {fe:.1f} |")
        exact_fe, atp_fe = rows[0][2], rows[1][2]
        print(f"\nAtP / exact path patching: {atp_fe / exact_fe:.2f} of the cost. {note}")


if __name__ == "__main__":
    main()
