"""Benchmark: opening a model -- the lab's ``python -m engine info`` against a plain transformers load.

Whole processes on the same model directory, alternated run by run so each pair shares the
machine's state (``--runs`` pairs; the table gives medians and the median of the paired ratios):

* **plain** -- ``AutoTokenizer.from_pretrained`` + ``AutoModelForCausalLM.from_pretrained(dtype=float32)``
  + ``eval()`` (safetensors are mapped lazily: no weight is read until the first forward pass; a
  ``.gguf`` file is read and de-quantized, as the lab does);
* **lab** -- ``python -m engine info``: the same load, the weights fingerprint (every weight read and
  hashed), the TransformerBridge, the facts printed as JSON.

Then, in one fresh process, where the lab's time goes: imports, the plain load, the fingerprint,
the bridge (``bridge_plain``: facts and boot), and one batched forward pass of 32 prompts -- the unit
of the forward-equivalents column (seconds / that forward).

    .venv/bin/python bench/model_open.py              # bundled model + Qwen2.5-0.5B-shaped random init
    .venv/bin/python bench/model_open.py --runs 3 --model PATH
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.peers import timed

PLAIN = ("import sys, torch\n"
         "from pathlib import Path\n"
         "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
         "p = Path(sys.argv[1])\n"
         "where, kw = (p.parent, {'gguf_file': p.name}) if p.suffix == '.gguf' else (p, {})\n"
         "AutoTokenizer.from_pretrained(where, **kw)\n"
         "AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()\n")


def phases(spec: str) -> dict[str, float]:
    """Seconds of each step of opening ``spec`` in this (fresh) process, and of one batched forward."""
    out: dict[str, float] = {}
    t = time.perf_counter()
    import torch
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401 - the lazy modeling import plain HF pays
    out["import torch + transformers"] = time.perf_counter() - t
    t = time.perf_counter()
    import transformer_lens.model_bridge  # noqa: F401
    out["import transformer-lens"] = time.perf_counter() - t
    from engine.backends.bridge import BridgeBackend
    from engine.machinery.batching import pad, pad_id
    from engine.models.fingerprint import weights_fingerprint
    from engine.models.load import bridge_plain, load_plain
    from engine.prompts.promptsets import PromptSetSpec, generate
    t = time.perf_counter()
    plain = load_plain(spec, device="cpu")
    out["plain load (config, tokenizer, weights: mapped, or read and de-quantized)"] = time.perf_counter() - t
    t = time.perf_counter()
    weights_fingerprint(plain.hf_model)
    out["weights fingerprint (BLAKE3)"] = time.perf_counter() - t
    t = time.perf_counter()
    model = BridgeBackend(bridge_plain(plain))
    out["bridge (facts incl. fingerprint, boot)"] = time.perf_counter() - t
    pairs, _ = generate(model.tokenizer, PromptSetSpec(n=32, seed=0))
    ids, mask, _ = pad([p.ref_ids for p in pairs[:32]], pad_id(model))
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            t = time.perf_counter()
            model.logits(ids, mask)
            best = min(best, time.perf_counter() - t)
    out["one batched forward (32 prompts)"] = best
    return out


def bench(label: str, spec: str, runs: int) -> dict:
    plain, lab = [], []
    for _ in range(runs):
        plain.append(timed([sys.executable, "-c", PLAIN, spec]))
        lab.append(timed([sys.executable, "-m", "engine", "info", "--model", spec, "--device", "cpu"]))
    r = subprocess.run([sys.executable, __file__, "--phases", spec], capture_output=True, text=True, check=True)
    steps = json.loads(r.stdout.splitlines()[-1])
    return {"model": label, "plain": plain, "lab": lab, "phases": steps,
            "ratio": statistics.median(b / a for a, b in zip(plain, lab))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="paired whole-process runs per model")
    ap.add_argument("--model", help="one model (a directory or .gguf) instead of the default two")
    ap.add_argument("--phases", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phases:
        print(json.dumps(phases(args.phases)))
        return
    from engine.models.spec import ORGANISM_DIR
    rows = []
    with tempfile.TemporaryDirectory() as d:
        if args.model:
            rows.append(bench(args.model, args.model, args.runs))
        else:
            from bench.path_patching import organism_label, qwen_shaped
            rows.append(bench(organism_label(), str(ORGANISM_DIR), args.runs))
            rows.append(bench("random Qwen2.5-0.5B shape (24L, 14H/2KV, d896, vocab 151936)",
                              str(qwen_shaped(Path(d) / "qwen", quick=False)), args.runs))
    print(f"\n{args.runs} paired whole-process runs per model; medians\n")
    print("| model | plain load s | lab `engine info` s | lab / plain (paired) | forward-equivalents (lab) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        fwd = r["phases"]["one batched forward (32 prompts)"]
        print(f"| {r['model']} | {statistics.median(r['plain']):.2f} | {statistics.median(r['lab']):.2f} | "
              f"{r['ratio']:.2f}x | {statistics.median(r['lab']) / fwd:.0f} |")
    for r in rows:
        print(f"\nWhere the lab's time goes, {r['model']} (one fresh process):\n")
        print("| step | s |")
        print("| --- | ---: |")
        for step, s in r["phases"].items():
            print(f"| {step} | {s:.2f} |")


if __name__ == "__main__":
    main()
