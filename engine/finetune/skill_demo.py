"""Base vs tuned comparison, and the demonstration: teach the bundled model a skill it lacks.

**Comparison** (``compare``): for a base and a tuned model, the accuracy on

* ``skill (held-out)`` -- first-token accuracy on the held-out third of the ``notation`` family
  ("7 × 8 =", "9 over 3 =", "compute 8 − 5 :"; never in any training data);
* ``arithmetic (paper templates)`` -- the paper's Figure 8 templates (32), operands 1..9 (never in the SFT
  data: the ability precise SFT should not disturb);
* ``control facts`` -- the organism's synthetic facts ("Anna lives in" -> Oslo), the organism's
  stand-in for MMLU / CSQA, for models whose tokenizer knows those words; for other (real) models
  common-knowledge completions (``engine.evaluation.facts``: "The capital of France is" -> Paris);
* ``arithmetic (held-out split)`` / ``word problems (Figure 10)`` -- first-token accuracy on
  ``engine.finetune.heldout``'s test split (three Figure 8 templates per operation on held-out
  operand pairs: never in its training split) and on the Figure 10 word problems;

plus Δ (points).  Accuracies go through the result cache keyed by each model's fingerprint.

**Demonstration** (``python -m engine.finetune.skill_demo``): precise SFT of the base model's top-k path-patching
heads, full SFT and LoRA, on the same data and schedule, each saved as a model directory, then
compared with the base model -- the paper's Table 1 in miniature.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from engine.finetune.recipe import default_recipe
from engine.finetune.train import TrainConfig
from engine.paths import REPO_ROOT

#: The demonstration trains with the default recipe (``engine.finetune.recipe``), whose first anchor
#: is this demonstration's schedule: the paper's lr 2e-5 / batch 128 / 2 epochs is for 7B models and
#: thousands of examples; the 1.2M-parameter organism and 261 examples need larger steps (lr 3e-3,
#: batch 32, 30 epochs, warm-up 5 %, no weight decay).
DEMO_DATA = "notation+replay"
DEMO_K = 8
TASKS: tuple[str, ...] = ("skill (held-out)", "arithmetic (paper templates)", "arithmetic (held-out split)",
                          "word problems (Figure 10)", "control facts")


@dataclass(frozen=True)
class CompareRow:
    task: str
    n: int
    base: float
    tuned: float

    @property
    def delta(self) -> float:
        return 100.0 * (self.tuned - self.base)


@dataclass(frozen=True)
class SkillAccuracy:
    """The cached skill score: first-token accuracy on one family's split (``notation``, ``test``)."""

    family: str
    split: str
    first_token: float


def _knows_facts(model) -> bool:
    from engine.organism.recipe import control_prompts

    tok = model.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    prompt, answer = control_prompts(0)[0]
    ids = tok(prompt)["input_ids"] + tok(answer, add_special_tokens=False)["input_ids"]
    return unk is not None and unk not in ids and len(tok(answer, add_special_tokens=False)["input_ids"]) == 1


def task_accuracies(model, *, cache=None) -> dict[str, tuple[int, float]]:
    """{task: (n, accuracy)} for one model (see module docstring)."""
    from engine.finetune.data import skill_pairs
    from engine.finetune.heldout import split_problems
    from engine.prompts.pairs import build_pairs
    from engine.prompts.promptsets import PromptSetSpec
    from engine.results import run_cached_rows
    from engine.techniques.accuracy import accuracy_report, score_pairs

    out: dict[str, tuple[int, float]] = {}
    pairs = skill_pairs(model.tokenizer, "notation", "test")

    def compute_skill():
        scores = score_pairs(model, pairs)
        return [SkillAccuracy("notation", "test", sum(s.first_ok for s in scores) / len(scores))], None

    rows, _, _ = run_cached_rows(model, pairs, "skill_accuracy", {"dtype": model.facts.dtype}, compute_skill,
                                 SkillAccuracy, ("first_token",), cache)
    out[TASKS[0]] = (len(pairs), rows[0].first_token)
    report, _ = accuracy_report(model, PromptSetSpec(), cache=cache)
    n = sum(r.n for r in report)
    out[TASKS[1]] = (n, sum(r.first_token * r.n for r in report) / n)
    for task, split in ((TASKS[2], "test"), (TASKS[3], "word")):
        held, _ = build_pairs(model.tokenizer, split_problems(split))
        if held:
            out[task] = (len(held), sum(s.first_ok for s in score_pairs(model, held)) / len(held))
    if _knows_facts(model):
        from engine.organism.card import control_accuracy
        from engine.organism.recipe import control_prompts
        out[TASKS[4]] = (len(control_prompts(0)), control_accuracy(model))
    else:  # a real model: common-knowledge completions ("The capital of France is" -> " Paris")
        from engine.evaluation.facts import FACTS, fact_hits
        out[TASKS[4]] = (len(FACTS), sum(fact_hits(model)) / len(FACTS))
    return out


def compare(base, tuned, *, cache=None) -> list[CompareRow]:
    """Accuracy of ``base`` and ``tuned`` (backends) on every task both can be scored on."""
    a = task_accuracies(base, cache=cache)
    b = task_accuracies(tuned, cache=cache)
    return [CompareRow(t, a[t][0], a[t][1], b[t][1]) for t in TASKS if t in a and t in b]


def compare_markdown(columns: dict[str, list[CompareRow]]) -> str:
    """Table 1 layout: one row per method, Acc (Δ) per task."""
    tasks = [r.task for r in next(iter(columns.values()))]
    base = {r.task: r.base for r in next(iter(columns.values()))}
    head = "| model | " + " | ".join(tasks) + " |\n|---|" + "---|" * len(tasks) + "\n"
    lines = ["| base | " + " | ".join(f"{100 * base[t]:.1f}" for t in tasks) + " |"]
    for name, rows in columns.items():
        by = {r.task: r for r in rows}
        lines.append(f"| {name} | " + " | ".join(f"{100 * by[t].tuned:.1f} ({by[t].delta:+.1f})" for t in tasks) + " |")
    return head + "\n".join(lines) + "\n"


def run_demo(out_dir: Path, *, data: str = DEMO_DATA, k: int = DEMO_K,
             methods: Sequence[str] = ("precise", "full", "lora"),
             log: Callable[[str], None] = print, cache=None) -> dict:
    """Train every method on ``data`` with the default recipe, save under ``out_dir/<method>``, compare."""
    from engine.backends import open_model
    from engine.finetune.run import FinetuneRequest, run_finetune, top_heads

    heads = top_heads("organism", k, cache=cache)
    log(f"top-{k} heads of the organism's path-patching run: {', '.join(f'{a}.{b}' for a, b in heads)}")
    base = open_model("organism")
    columns: dict[str, list[CompareRow]] = {}
    records = {}
    for method in methods:
        cfg = TrainConfig(method=method, heads=heads if method == "precise" else ())
        target = out_dir / method
        rec = run_finetune(FinetuneRequest(spec="organism", config=cfg, data=data, out_dir=str(target)))
        r = rec["result"]
        log(f"{method}: {r['steps']} steps, {r['samples_per_s']:.0f} samples/s, "
            f"{r['trainable_params']} trainable parameters, loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}")
        columns[method] = compare(base, open_model(str(target)), cache=cache)
        records[method] = {k2: v for k2, v in r.items() if k2 != "losses"}
    table = compare_markdown(columns)
    log(table)
    recipes = {m: default_recipe(m, base.facts.n_params).reason for m in methods}
    report = {"data": data, "k": k, "heads": [list(h) for h in heads], "recipes": recipes,
              "runs": records, "compare": {m: [asdict(r) | {"delta": r.delta} for r in rows]
                                           for m, rows in columns.items()},
              "table": table}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.finetune.skill_demo",
                                 description="Teach the bundled model the 'notation' skill with precise SFT, "
                                             "full SFT and LoRA; print the comparison table.")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / ".cache" / "skill_demo")
    ap.add_argument("--data", default=DEMO_DATA, help="notation+replay (default) or notation (no replay)")
    ap.add_argument("--k", type=int, default=DEMO_K, help="top-k heads for precise SFT")
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args(argv)
    cache = None
    if not args.no_cache:
        from cache import ResultCache
        cache = ResultCache()
    args.out.mkdir(parents=True, exist_ok=True)
    run_demo(args.out, data=args.data, k=args.k, cache=cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
