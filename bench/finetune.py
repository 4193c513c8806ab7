"""Benchmark: precise SFT of key heads vs full SFT vs LoRA (engine.finetune.train.train), per model.

For each model and method: training throughput (samples/s of the fastest timed step, and the
median step time -- on a shared machine the fastest step is the least disturbed one; the first step
-- optimizer-state allocation, slice set-up -- is a warm-up and is excluded), peak memory *above the
loaded model* while training, trainable parameters and optimizer-state elements.

* models: (a) the bundled organism, precise SFT on its top-k heads of a path-patching run
  (``engine.techniques.path_patching.cached_path_patching`` on the default prompt set, filtered to correct
  answers, through the result cache unless ``--no-cache``); (b) a random-init Qwen2 shaped like
  Qwen2.5-0.5B (24 layers, 14 heads / 2 KV heads, d 896, MLP 4864, tied embeddings, vocab
  ``--vocab``), precise SFT on its first k heads in (layer, head) order -- with no circuit to find,
  these sit in the lowest layers, the worst case for precise SFT (the backward pass runs down to
  layer 0).
* data: ``--batch`` sequences of ``--seq`` tokens (few-shot strings of the built-in ``notation``
  set, trimmed to length; the loss covers the last answer + EOS); one optimizer step per batch (no
  gradient accumulation); the paper's lr 2e-5 and weight decay 0.1, no warm-up.
* memory: CUDA -- ``torch.cuda.max_memory_allocated`` during ``train`` minus the memory allocated
  before it; CPU -- each (model, method) runs in a fresh child process whose resident set size
  (``/proc/self/statm``) is sampled every millisecond by a thread during ``train``; the peak minus
  the RSS just before ``train`` is reported (a fresh process, so no allocator reuse from another
  run; spikes shorter than the sampling interval can be missed).
* targets checked: precise >= 2x full SFT in samples/s; precise optimizer state <= 5 % of full's.

    .venv/bin/python bench/finetune.py                        # CPU, float32, both models
    .venv/bin/python bench/finetune.py --vocab 32000 --steps 2  # smaller embedding (say so when reporting)
    .venv/bin/python bench/finetune.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import torch

from engine.finetune.train import (
    SFTExample,
    TrainConfig,
    TrainProgress,
    encode_examples,
    train,
)
from engine.models.load import load_plain

ROOT = Path(__file__).resolve().parents[1]

METHODS = ("precise", "full", "lora")
MiB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# models, heads and data
# ---------------------------------------------------------------------------------------------

def qwen_shaped(out: Path, vocab: int, layers: int = 24) -> Path:
    """Random-init Qwen2 with Qwen2.5-0.5B's shape, the organism's tokenizer (ids < its 191 words)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.organism.recipe import build_tokenizer
    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, use_sliding_window=False, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def organism_n_heads() -> int:
    """Every attention head of the bundled model (layers x heads, from its config)."""
    import json

    from engine.models.spec import ORGANISM_DIR
    c = json.loads((ORGANISM_DIR / "config.json").read_text())
    return int(c["num_hidden_layers"]) * int(c["num_attention_heads"])


def organism_top_heads(k: int, device: str, use_cache: bool) -> list[tuple[int, int]]:
    """The organism's top-k heads of path patching on the default prompt set (correct answers)."""
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching

    cache = None
    if use_cache:
        from cache import ResultCache
        cache = ResultCache()
    model = open_model("organism", device=device)
    pairs, _ = kept_pairs(model, PromptSetSpec(), cache=cache)
    table, _ = cached_path_patching(model, pairs, cache=cache)
    return [(layer, h) for layer, h, _ in table.top_heads(k)]


def first_heads(n_layers: int, n_heads: int, k: int) -> list[tuple[int, int]]:
    return [(layer, h) for layer in range(n_layers) for h in range(n_heads)][:k]


def make_examples(tokenizer, n: int, seq: int, seed: int = 0) -> list[SFTExample]:
    """n few-shot examples of the 'notation' set, each trimmed (from the front) to ``seq`` tokens."""
    from engine.finetune.data import load_sft_data

    pool = load_sft_data("notation")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shots = rng.sample(pool, 12)
        words = " ".join(f"{ex.prompt} {ex.answer}" for ex in shots[:-1]).split() + shots[-1].prompt.split()
        answer = shots[-1].answer
        while len(words) > 1 and len(encode_examples(tokenizer, [SFTExample(" ".join(words), answer)])[0][0]) > seq:
            words = words[1:]
        out.append(SFTExample(" ".join(words), answer))
    return out


# ---------------------------------------------------------------------------------------------
# one (model, method) run -- in a child process on CPU
# ---------------------------------------------------------------------------------------------

class RssSampler:
    """Peak resident set size of this process while running (a thread reading /proc/self/statm)."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.interval_s)

    def __enter__(self) -> Self:
        self.start = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def run_one(job: dict) -> dict:
    torch.manual_seed(0)
    pm = load_plain(job["spec"], device=job["device"], dtype=job["dtype"])
    model, tok = pm.hf_model, pm.tokenizer
    examples = make_examples(tok, job["batch"], job["seq"])
    lengths = [len(ids) for ids, _ in encode_examples(tok, examples)]
    n_steps = job["steps"] + 1  # one batch is the whole data set here: one step per epoch
    heads = tuple(tuple(h) for h in job["heads"]) if job["method"] == "precise" else ()
    cfg = TrainConfig(method=job["method"], heads=heads,
                      lr=2e-5, batch_size=job["batch"], micro_batch=job["batch"], epochs=float(n_steps),
                      max_steps=n_steps, warmup=0.0, weight_decay=0.1, lora_r=job["lora_r"])
    with torch.no_grad():  # page the (memory-mapped) weights in, so that they count as "the model"
        for t in list(model.parameters()) + list(model.buffers()):
            t.sum()
    seen: list[TrainProgress] = []
    cuda = job["device"].startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    with RssSampler() as rss:
        res = train(model, tok, examples, cfg, progress=seen.append)
    if cuda:
        peak_delta = int(res.peak_memory_bytes) - before
    else:
        peak_delta = rss.peak - rss.start
    ends = [p.elapsed_s for p in seen]
    step_s = [b - a for a, b in itertools.pairwise(ends)]  # steps 2.. (step 1 is the warm-up)
    best = min(step_s)
    return {"method": job["method"], "steps": res.steps, "step_s": step_s, "best_step_s": best,
            "median_step_s": statistics.median(step_s), "samples_per_s": job["batch"] / best,
            "warmup_s": ends[0], "trainable": res.trainable_params,
            "optimizer_state": res.optimizer_state_numel, "total": res.total_params,
            "peak_delta_bytes": peak_delta, "peak_abs_bytes": res.peak_memory_bytes,
            "tokens": sum(lengths) / len(lengths), "loss0": res.losses[0], "threads": torch.get_num_threads()}


def run_child(job: dict) -> dict:
    """run_one in a fresh interpreter (clean RSS / allocator state per run)."""
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                       cwd=ROOT, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{job['method']} on {job['spec']} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# table
# ---------------------------------------------------------------------------------------------

def fmt_n(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps (plus one warm-up step)")
    ap.add_argument("--organism-steps", type=int, default=20, help="timed steps on the (fast) organism")
    ap.add_argument("--k", type=int, default=32, help="heads tuned by precise SFT (all heads if fewer)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary of the Qwen2.5-0.5B-shaped model")
    ap.add_argument("--layers", type=int, default=24, help="layers of the Qwen2.5-0.5B-shaped model")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--models", default="organism,qwen", help="comma-separated: organism, qwen")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--repeats", type=int, default=1, help="runs of each method (round robin), steps pooled")
    ap.add_argument("--organism-repeats", type=int, default=3, help="--repeats on the organism")
    ap.add_argument("--organism-extra-k", type=lambda t: [int(x) for x in t.split(",") if x.strip()], default=[8],
                    help="further precise rows on the organism with these k (default 8: the Improve demonstration's "
                         "top-8); empty string for none")
    ap.add_argument("--no-last", action="store_true",
                    help="skip the extra precise row on the last k heads of the Qwen-shaped model")
    ap.add_argument("--no-cache", action="store_true", help="compute the organism's path patching uncached")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return
    if min(args.steps, args.organism_steps, args.repeats, args.organism_repeats) < 1:
        ap.error("--steps, --organism-steps, --repeats and --organism-repeats must be >= 1")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if any(m not in METHODS for m in methods):
        ap.error(f"--methods: choose from {', '.join(METHODS)}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    job = {"device": args.device, "dtype": args.dtype, "batch": args.batch, "seq": args.seq, "lora_r": args.lora_r}
    tables = []  # (model label, rows); a row: (method label, result)
    with tempfile.TemporaryDirectory() as d:
        for name in models:
            runs = []  # (method, label, heads)
            if name == "organism":
                from path_patching import organism_label
                n_heads = organism_n_heads()
                ranked = organism_top_heads(n_heads, args.device, not args.no_cache)
                label, spec, steps = organism_label(vocab=True), "organism", args.organism_steps
                k_max = min(args.k, n_heads)
                for k in dict.fromkeys([k_max] + [k for k in args.organism_extra_k if k < k_max]):
                    heads = ranked[:k]
                    runs.append(("precise", f"precise: top {len(heads)} heads of path patching ({_layers(heads)})",
                                 heads))
            elif name == "qwen":
                spec = str(qwen_shaped(Path(d) / "qwen", args.vocab, args.layers))
                label = (f"random Qwen2.5-0.5B shape ({args.layers}L, 14H/2KV, d896, mlp4864, "
                         f"vocab {args.vocab}, tied)")
                steps = args.steps
                heads = first_heads(args.layers, 14, args.k)
                runs.append(("precise", f"precise: first {len(heads)} heads ({_layers(heads)})", heads))
                if not args.no_last and "precise" in methods:
                    last = first_heads(args.layers, 14, args.layers * 14)[-args.k:]
                    runs.append(("precise", f"precise: last {len(last)} heads ({_layers(last)})", last))
            else:
                ap.error(f"unknown model {name!r}: choose from organism, qwen")
            runs = [r for r in runs if r[0] in methods] + [(m, m, []) for m in methods if m != "precise"]
            results: dict[str, list[dict]] = {mlabel: [] for _, mlabel, _ in runs}
            for _ in range(args.organism_repeats if name == "organism" else args.repeats):
                for method, mlabel, hs in runs:  # round robin: load changes hit every method alike
                    r = run_child({**job, "spec": spec, "method": method, "heads": hs, "steps": steps})
                    print(f"  {name} / {mlabel}: {r['samples_per_s']:.2f} samples/s (steps "
                          f"{[round(x, 3) for x in r['step_s']]})", file=sys.stderr, flush=True)
                    results[mlabel].append(r)
            tables.append((label, [(mlabel, _merge(rs, args.batch)) for mlabel, rs in results.items()]))
    if not tables:
        return
    first = tables[0][1][0][1]
    cuda = args.device.startswith("cuda")
    mem = ("CUDA max_memory_allocated during training minus allocated before" if cuda
           else "peak RSS during training minus RSS before, weights paged in (1 ms sampling, fresh process per run)")
    print(f"\ntorch {torch.__version__}, {args.device} ({first['threads']} threads), {args.dtype}; batch {args.batch} "
          f"sequences x {first['tokens']:.0f} tokens (loss on the answer + EOS tokens); AdamW; LoRA r={args.lora_r} on "
          f"q/k/v/o; one warm-up step, then {args.steps} timed steps x {args.repeats} run(s) per method "
          f"({args.organism_steps} x {args.organism_repeats} on the organism), runs interleaved round robin: "
          f"samples/s from the fastest step, s/step = fastest / median; memory: {mem}\n")
    print("| model | method | trainable params | % of model | optimizer state | samples/s | s/step (min / median) | "
          "peak memory above model | speed vs full | optimizer state vs full |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdicts = []
    for label, rows in tables:
        full = next((r for m, r in rows if m == "full"), None)
        for m, r in rows:
            speed = f"{r['samples_per_s'] / full['samples_per_s']:.2f}x" if full else "-"
            state = f"{100 * r['optimizer_state'] / full['optimizer_state']:.2f} %" if full else "-"
            print(f"| {label} | {m} | {fmt_n(r['trainable'])} | {100 * r['trainable'] / r['total']:.2f} % | "
                  f"{fmt_n(r['optimizer_state'])} | {r['samples_per_s']:.2f} | "
                  f"{r['best_step_s']:.3g} / {r['median_step_s']:.3g} | {r['peak_delta_bytes'] / MiB:.0f} MiB | "
                  f"{speed} | {state} |")
            if m.startswith("precise") and full:
                s_ = r["samples_per_s"] / full["samples_per_s"]
                o = r["optimizer_state"] / full["optimizer_state"]
                verdicts.append(f"- {label}, {m}: {s_:.2f}x full SFT's samples/s (target >= 2x: "
                                f"{'met' if s_ >= 2 else 'NOT met'}); optimizer state {100 * o:.2f} % of full's "
                                f"(target <= 5 %: {'met' if o <= 0.05 else 'NOT met'})")
    print()
    print("\n".join(verdicts))


def _merge(runs: list[dict], batch: int) -> dict:
    """Repeated runs of one method: every timed step pooled, the largest memory peak."""
    out = dict(runs[0])
    out["step_s"] = [x for r in runs for x in r["step_s"]]
    out["best_step_s"] = min(out["step_s"])
    out["median_step_s"] = statistics.median(out["step_s"])
    out["samples_per_s"] = batch / out["best_step_s"]
    out["peak_delta_bytes"] = max(r["peak_delta_bytes"] for r in runs)
    return out


def _layers(heads) -> str:
    ls = sorted({layer for layer, _ in heads})
    return ("layer " if len(ls) == 1 else "layers ") + ", ".join(map(str, ls))


if __name__ == "__main__":
    main()
