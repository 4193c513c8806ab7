"""Benchmark: the paper's Table 1, 2 and 5 on a real model, on CPU -- does precise SFT of key heads help?

For each seed, starting every run from the same base weights:

* **arith arm** -- training data: :mod:`engine.finetune.heldout`'s ``train`` split (five of the eight
  Figure 8 templates per operation plus the ``extended`` family, on two thirds of the operand
  pairs; ``--n-train`` per operation, drawn with the seed).  Evaluation: the three held-out
  Figure 8 templates per operation on the held-out operand pairs (``fig8 held-out``: first-token
  accuracy, mean of the four operations) and the Figure 10 word problems (``word``), never trained on.
* **gsm8k arm** -- training data: GSM8K train in the evaluation's zero-shot format ("Question: ...
  Answer: The answer is" -> " 72"), ``--gsm8k-steps`` steps; evaluation: GSM8K / AddSub / SingleEq
  / SVAMP (``--math-limit`` items each, a seeded sample; greedy, 8 new tokens).
* **generic** -- MMLU and CSQA (first ``--choice-limit`` items each), the next-token loss on held-out
  general text (MMLU test questions with their right answer, items never evaluated) and the
  control facts (:mod:`engine.evaluation.facts`: the share of the facts the base model knows that
  the tuned model still knows).

Methods: full SFT, LoRA (rank 8), precise SFT of the top-k heads of the base model's cached
path-patching run (k = 8, 16, 32, 64: Table 2), top-32 heads + the top-1 / top-3 MLPs (Table 5, MLPs
ranked by the same run), and the control the paper lacks: k random heads (seeded by the run seed).
Every method trains with the default recipe (``engine.finetune.recipe``) -- its learning rate per
method was picked by ``--sweep``: a few learning rates per method on seed 0, scored on the
``val`` split (training templates, held-out operand pairs), never on the test split.

Columns: every evaluation, samples/s, trainable parameters, optimizer state (numbers), wall seconds of
training; mean over the seeds and (in brackets) half the range.  Claims judged at the end: precise
reaches >= 90 % (the Paper page's criterion) of full SFT's math gain; it loses at most a third of full
SFT's generic drop; it trains faster per sample with a fraction of the optimizer state.

    .venv/bin/python bench/improve.py --model .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --seeds 0,1
    .venv/bin/python bench/improve.py --model ... --sweep        # the learning-rate sweep (seed 0)
    # one process per seed, one thread each, then the table of both:
    .venv/bin/python bench/improve.py --model ... --seeds 0 --threads 1 --out s0.json &
    .venv/bin/python bench/improve.py --model ... --seeds 1 --threads 1 --out s1.json; wait
    .venv/bin/python bench/improve.py --merge s0.json s1.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.backends.nnsight import NnsightBackend, wrap
from engine.evaluation.benchmarks import load_benchmark
from engine.evaluation.evaluate import evaluate
from engine.evaluation.facts import FACTS, fact_hits, text_loss
from engine.findings.checks import PRECISE_SHARE
from engine.finetune.heldout import split_problems
from engine.finetune.recipe import default_recipe
from engine.finetune.train import SFTExample, TrainConfig, train
from engine.models.load import load_plain, plain_facts
from engine.prompts.pairs import build_pairs
from engine.techniques.accuracy import score_pairs

ROOT = Path(__file__).resolve().parents[1]

MATH = ("gsm8k", "addsub", "singleeq", "svamp")
GENERIC = ("mmlu", "csqa")
SWEEP = {"precise": (3e-4, 1e-3, 3e-3), "full": (2e-5, 6e-5, 2e-4, 6e-4), "lora": (1e-3, 3e-3, 1e-2)}


class Bench:
    """One loaded model, its base weights kept aside, and the evaluation sets."""

    def __init__(self, args) -> None:
        self.args = args
        self.plain = load_plain(args.model)
        self.tok = self.plain.tokenizer
        self.base = {k: v.detach().clone() for k, v in self.plain.hf_model.state_dict().items()}
        self.n_params = sum(p.numel() for p in self.plain.hf_model.parameters())
        self.sets = {s: build_pairs(self.tok, split_problems(s, n=n, seed=1000))[0]
                     for s, n in (("val", 40), ("test", None), ("word", 60))}
        sample = random.Random(0)  # fixed evaluation items: a seeded sample of each set (MMLU is sorted by subject)
        self.items = {}
        for b, k in [(b, args.choice_limit) for b in GENERIC] + [(b, args.math_limit) for b in MATH]:
            every = load_benchmark(b, data_dir=args.data_dir)
            self.items[b] = sample.sample(every, min(k, len(every)))
        mmlu = load_benchmark("mmlu", data_dir=args.data_dir)
        used = {it.id for it in self.items["mmlu"]}
        text_items = sample.sample([it for it in mmlu if it.id not in used], args.text_items)
        self.texts = [f"{it.question} {it.choices['ABCDE'.index(it.answer)]}" for it in text_items]
        self.facts_known: list[tuple[str, str]] | None = None

    def reset(self) -> None:
        self.plain.hf_model.load_state_dict(self.base)
        self.plain.hf_model.eval()

    def backend(self) -> NnsightBackend:
        """The current weights behind the lab's interface (fresh fingerprint: nothing memoized leaks)."""
        return NnsightBackend(wrap(self.plain.hf_model, self.tok), self.tok, plain_facts(self.plain))

    def first_token(self, model, split: str) -> float:
        """First-token accuracy of a split, mean over the operations present."""
        pairs = self.sets[split]
        scores = score_pairs(model, pairs)
        by_op: dict[str, list[bool]] = {}
        for p, s in zip(pairs, scores):
            by_op.setdefault(p.op, []).append(s.first_ok)
        return statistics.mean(sum(v) / len(v) for v in by_op.values())

    def evaluate(self, *, math: bool, quick: bool = False) -> dict[str, float]:
        model = self.backend()
        if quick:
            return {"val": self.first_token(model, "val")}
        out = {"fig8 held-out": self.first_token(model, "test"), "word": self.first_token(model, "word")}
        for b in GENERIC + (MATH if math else ()):
            out[b] = evaluate(model, b, self.items[b], max_new_tokens=8).accuracy
        out["text loss"] = text_loss(model, self.texts)
        if self.facts_known is None:  # the base model: which facts it knows
            self.facts_known = [f for f, ok in zip(FACTS, fact_hits(model)) if ok]
            print(f"base model knows {len(self.facts_known)} of {len(FACTS)} control facts", flush=True)
        out["facts"] = (sum(fact_hits(model, self.facts_known)) / len(self.facts_known) if self.facts_known
                        else float("nan"))  # a model that knows none of them (the bundled one)
        return out

    def train(self, config: TrainConfig, examples: list[SFTExample]) -> dict:
        self.reset()
        t0 = time.perf_counter()
        r = train(self.plain.hf_model, self.tok, examples, config)
        self.plain.hf_model.eval()
        return {"samples/s": r.samples_per_s, "trainable": r.trainable_params, "opt state": r.optimizer_state_numel,
                "train s": time.perf_counter() - t0, "steps": r.steps, "lr": r.config["lr"],
                "loss": [r.losses[0], r.losses[-1]]}


def ranking(args) -> tuple[list[tuple[int, int]], list[int], int, int]:
    """Heads (best first), MLP layers (best first), n_layers, n_heads of the base model's path patching."""
    from cache import ResultCache
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching

    model = open_model(args.model)
    pairs, _ = kept_pairs(model, PromptSetSpec(), cache=ResultCache())
    table, _ = cached_path_patching(model, pairs, cache=ResultCache())
    heads = [(a, b) for a, b, _ in table.top_heads(table.n_layers * table.n_heads)]
    _, mlps = table.heatmap(table.ranking_metric())
    mlp_order = sorted((m for m in range(table.n_layers) if mlps[m] == mlps[m]), key=lambda m: mlps[m])
    return heads, mlp_order, table.n_layers, table.n_heads


def arith_examples(n: int, seed: int) -> list[SFTExample]:
    return [SFTExample(p.ref_text, str(p.answer)) for p in split_problems("train", n=n, seed=seed)]


def gsm8k_examples(data_dir) -> list[SFTExample]:
    from engine.evaluation.benchmarks import sft_examples
    return [SFTExample(r["prompt"], r["answer"]) for r in sft_examples("gsm8k", data_dir=data_dir)]


def methods(heads, mlps, n_layers, n_heads, seed, ks) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    every = [(a, b) for a in range(n_layers) for b in range(n_heads)]
    out = [("full", {"method": "full"}), ("LoRA r8", {"method": "lora"})]
    out += [(f"precise top-{k}", {"method": "precise", "heads": tuple(heads[:k])}) for k in ks]
    out += [(f"precise top-32 + top-{m} MLP", {"method": "precise", "heads": tuple(heads[:32]),
                                                "mlps": tuple(mlps[:m])}) for m in (1, 3)]
    out += [(f"precise random-{k}", {"method": "precise", "heads": tuple(sorted(rng.sample(every, k)))})
            for k in (32,)]
    return out


def sweep(bench: Bench, args, done: dict) -> dict:
    """Validation accuracy of each (method, lr) of SWEEP not in ``done`` (an earlier sweep's results)."""
    heads, _, _, _ = ranking(args)
    examples = arith_examples(args.n_train, 0)
    out = dict(done)
    if "base" not in out:
        bench.reset()
        out["base"] = {"val": bench.evaluate(math=False, quick=True)["val"]}
    for method in args.sweep.split(","):
        for lr in SWEEP[method]:
            if f"{method} {lr:g}" in out:
                continue
            extra = {"heads": tuple(heads[:32])} if method == "precise" else {}
            info = bench.train(TrainConfig(method=method, lr=lr, seed=0, **extra), examples)
            val = bench.evaluate(math=False, quick=True)["val"]
            out[f"{method} {lr:g}"] = {"val": val, **info}
            print(f"sweep {method:8s} lr {lr:<8g} val {val:.3f}  steps {info['steps']}  "
                  f"loss {info['loss'][0]:.3f} -> {info['loss'][1]:.3f}  {info['train s']:.0f}s", flush=True)
    return out


def fmt(values: list[float], pct: bool) -> str:
    if any(v != v for v in values):
        return "n/a"
    m = statistics.mean(values)
    half = (max(values) - min(values)) / 2
    return f"{100 * m:.1f} (±{100 * half:.1f})" if pct else f"{m:.3f} (±{half:.3f})"


def table(rows: dict[str, list[dict]], cols: list[str]) -> str:
    pct = {c: c not in ("text loss",) for c in cols}
    head = "| run | " + " | ".join(cols) + " | samples/s | trainable | optimizer state | train s |\n"
    head += "|---|" + "---:|" * (len(cols) + 4) + "\n"
    lines = []
    for name, runs in rows.items():
        cells = [fmt([r[c] for r in runs], pct[c]) if c in runs[0] else "" for c in cols]
        if "samples/s" in runs[0]:
            cells += [f"{statistics.mean(r['samples/s'] for r in runs):.1f}", f"{runs[0]['trainable']:,}",
                      f"{runs[0]['opt state']:,}", f"{statistics.mean(r['train s'] for r in runs):.0f}"]
        else:
            cells += ["", "", "", ""]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def claims(rows: dict[str, list[dict]], math_col: str, generic_cols: list[str]) -> list[str]:
    def mean(name, col):
        return statistics.mean(r[col] for r in rows[name])

    out = []
    gain_full = mean("full", math_col) - mean("base", math_col)
    gain_prec = mean("precise top-32", math_col) - mean("base", math_col)
    share = gain_prec / gain_full if gain_full else float("nan")
    out.append(f"precise top-32 gains {100 * gain_prec:+.1f} points on {math_col}, full SFT {100 * gain_full:+.1f}: "
               f"{100 * share:.0f} % of full SFT's gain -> "
               f"{'holds' if share >= PRECISE_SHARE else 'does not hold'} (>= {PRECISE_SHARE:.0%})")
    for col in generic_cols:
        sign = -1 if col == "text loss" else 1
        drop_full = sign * (mean("base", col) - mean("full", col))
        drop_prec = sign * (mean("base", col) - mean("precise top-32", col))
        holds = drop_prec <= max(drop_full, 0) / 3 + 1e-12
        out.append(f"{col}: full SFT changes it by {-sign * drop_full:+.3f}, precise by {-sign * drop_prec:+.3f} -> "
                   f"{'holds' if holds else 'does not hold'} (precise loses at most a third of full's drop)")
    sp = mean("precise top-32", "samples/s") / mean("full", "samples/s")
    st = rows["precise top-32"][0]["opt state"] / rows["full"][0]["opt state"]
    out.append(f"precise top-32 trains {sp:.2f}x as many samples/s as full SFT with {100 * st:.2f} % of its "
               f"optimizer state -> {'holds' if sp > 1 and st < 0.05 else 'does not hold'}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model spec (e.g. the SmolLM2 .gguf); not needed with --merge")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--ks", default="8,16,32,64", help="top-k heads (Table 2)")
    ap.add_argument("--n-train", type=int, default=100, help="arith training examples per operation")
    ap.add_argument("--gsm8k-steps", type=int, default=50)
    ap.add_argument("--arms", default="arith,gsm8k", help="arith, gsm8k, or base (only the base model's row)")
    ap.add_argument("--math-limit", type=int, default=50)
    ap.add_argument("--choice-limit", type=int, default=100)
    ap.add_argument("--text-items", type=int, default=100)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweep", nargs="?", const=",".join(SWEEP), default=None, metavar="METHODS",
                    help="only the learning-rate sweep on the val split (of these methods; default all); "
                         "results already in the sweep file are kept")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                    help="print the table of earlier runs' --out files together (e.g. one process per seed)")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench" / "improve.json")
    args = ap.parse_args(argv)
    if args.merge:
        print(render([json.loads(p.read_text()) for p in args.merge]))
        return 0
    if not args.model:
        ap.error("--model is required (except with --merge)")
    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    bench = Bench(args)
    if args.sweep:
        path = args.out.with_name("improve_sweep.json")
        res = sweep(bench, args, json.loads(path.read_text()) if path.exists() else {})
        path.write_text(json.dumps(res, indent=2))
        for method in SWEEP:
            if not any(k.startswith(method + " ") for k in res):
                continue
            best = max((k for k in res if k.startswith(method + " ")), key=lambda k: res[k]["val"])
            print(f"best {method}: lr {best.split()[1]} (val {res[best]['val']:.3f}); recipe has "
                  f"{default_recipe(method, bench.n_params).lr:g}")
        return 0
    heads, mlps, n_layers, n_heads = ranking(args)
    print(f"{bench.n_params / 1e6:.1f} M parameters; top-8 heads {heads[:8]}; top-3 MLPs {mlps[:3]}", flush=True)
    ks = [int(k) for k in args.ks.split(",")]
    arms = args.arms.split(",")
    rows: dict[str, list[dict]] = {"base": []}
    gsm_rows: dict[str, list[dict]] = {"base": []}
    report = {"model": args.model, "n_params": bench.n_params, "seeds": args.seeds, "threads": args.threads,
              "heads": heads[:64], "mlps": mlps[:3], "arith": rows if {"arith", "base"} & set(arms) else {},
              "gsm8k": gsm_rows if "gsm8k" in arms else {}, "gsm8k_steps": args.gsm8k_steps,
              "math_limit": args.math_limit, "wall_s": 0.0,
              "recipes": {m: default_recipe(m, bench.n_params).reason for m in ("precise", "full", "lora")}}

    def record(arm: str, name: str, res: dict) -> None:
        """Keep a run's row, log it and rewrite --out: a run cut short still leaves every finished row."""
        (rows if arm == "arith" else gsm_rows).setdefault(name, []).append(res)
        print(f"{arm} {name}: " + json.dumps(res), flush=True)
        report["wall_s"] = time.perf_counter() - t_start
        args.out.write_text(json.dumps(report, indent=2))

    bench.reset()
    base_eval = bench.evaluate(math="gsm8k" in arms)
    gsm = gsm8k_examples(args.data_dir) if "gsm8k" in arms else []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in ("arith", "gsm8k"):
            if arm in arms or (arm == "arith" and "base" in arms):
                record(arm, "base", base_eval)
        if "arith" in arms:
            examples = arith_examples(args.n_train, seed)
            for name, kw in methods(heads, mlps, n_layers, n_heads, seed, ks):
                info = bench.train(TrainConfig(seed=seed, **kw), examples)
                record("arith", name, {**bench.evaluate(math=False), **info, "seed": seed})
        if "gsm8k" in arms:
            rng = random.Random(seed)
            random_32 = tuple(sorted(rng.sample([(a, b) for a in range(n_layers) for b in range(n_heads)], 32)))
            for name, kw in (("full", {"method": "full"}), ("precise top-32", {"method": "precise",
                                                                                "heads": tuple(heads[:32])}),
                             ("precise random-32", {"method": "precise", "heads": random_32})):
                info = bench.train(TrainConfig(seed=seed, max_steps=args.gsm8k_steps, **kw), gsm)
                record("gsm8k", name, {**bench.evaluate(math=True), **info, "seed": seed})
    print(render([report]))
    return 0


def merge(reports: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """Rows of several runs (e.g. one process per seed) put together, per arm."""
    out: dict[str, dict[str, list[dict]]] = {"arith": {}, "gsm8k": {}}
    for arm in out:
        for rep in reports:
            for name, runs in rep[arm].items():
                out[arm].setdefault(name, []).extend(runs)
    return out


def render(reports: list[dict]) -> str:
    rows = merge(reports)
    gen = ["mmlu", "csqa", "text loss", "facts"]
    seeds = ",".join(r["seeds"] for r in reports)
    text = [f"{reports[0]['model']} ({reports[0]['n_params'] / 1e6:.1f} M parameters), seeds {seeds}; mean "
            f"(± half the range); accuracy in %, text loss in nats/token; facts: share of the "
            f"{'control facts the base model knows'} still known\n"]
    if rows["arith"]:
        text.append("**arith arm** (train: 5 Figure 8 templates + extended, train operands; evaluate: 3 held-out "
                    "Figure 8 templates x held-out operands, Figure 10 word problems)\n")
        text.append(table(rows["arith"], ["fig8 held-out", "word"] + gen))
        if {"full", "precise top-32"} <= set(rows["arith"]):
            text += [f"- {c}" for c in claims(rows["arith"], "fig8 held-out", gen)]
    if {"full", "precise top-32"} <= set(rows["gsm8k"]):
        g = rows["gsm8k"]
        text.append(f"\n**gsm8k arm** (train: GSM8K train, {reports[0]['gsm8k_steps']} steps; evaluate: "
                    f"{reports[0]['math_limit']} sampled items of each math set, greedy)\n")
        text.append(table(g, list(MATH) + gen))
        for runs in g.values():
            for r in runs:
                r["mean math"] = statistics.mean(r[b] for b in MATH)
        text += [f"- {c}" for c in claims(g, "mean math", gen)]
    text.append("\nwall time " + " + ".join(f"{r['wall_s']:.0f} s" for r in reports)
                + f" ({reports[0]['threads']} thread(s) a process)")
    return "\n".join(text)


if __name__ == "__main__":
    sys.exit(main())
