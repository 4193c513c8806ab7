"""``python -m engine evaluate --bench ...``: Table 1's accuracy on the math and commonsense benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.cli.context import model_args
from engine.registry import nonneg_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="Table 1: accuracy on GSM8K, AddSub, SingleEq, SVAMP, MMLU, CSQA -> JSON")
    model_args(p)
    p.add_argument("--bench", required=True,
                   help="gsm8k, addsub, singleeq, svamp, mmlu, csqa, a comma list, or all")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder laid out like ../shared/data (default: $ARITHLAB_DATA, else ../shared/data, "
                        "else the Hugging Face hub when `datasets` is installed)")
    p.add_argument("--split", default=None, help="split to evaluate (default: test; csqa: dev)")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N items of each set")
    p.add_argument("--few-shot", type=nonneg_int, default=0, help="k solved exemplars before each question")
    p.add_argument("--seed", type=int, default=0, help="seed of the exemplar draw")
    p.add_argument("--max-new-tokens", type=positive_int, default=16, help="greedy tokens for math sets")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--base", default=None, help="also evaluate this base model and print Table 1 rows (Acc, Δ)")
    p.add_argument("--out", type=Path, help="also write the JSON, with every item's prediction, here")


def run(args, ctx) -> int:
    from engine.evaluation.benchmarks import parse_benches
    from engine.evaluation.evaluate import evaluate_cached, load_eval_set, table1, table1_markdown
    benches = parse_benches(args.bench)
    for b in benches:  # bad data fails before a model is loaded
        load_eval_set(b, data_dir=args.data_dir, split=args.split, limit=args.limit, few_shot=args.few_shot,
                      seed=args.seed)
    cache = ctx.cache

    def results(model) -> dict[str, Any]:
        out = {}
        for b in benches:
            res, computed = evaluate_cached(model, b, data_dir=args.data_dir, split=args.split, limit=args.limit,
                                            few_shot=args.few_shot, seed=args.seed,
                                            max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                            cache=cache)
            out[b] = {**res.to_json(), "cached": not computed}
        return out

    model = ctx.model
    full: dict[str, Any] = {"model": model.facts.spec, "fingerprint": model.facts.fingerprint,
                            "results": results(model)}
    if args.base:
        base = ctx.open_model(args.base)  # same backend, device map and remote choice as the tuned model
        full["base"] = {"model": base.facts.spec, "fingerprint": base.facts.fingerprint, "results": results(base)}
        rows = table1({b: r["accuracy"] for b, r in full["base"]["results"].items()},
                      {args.model: {b: r["accuracy"] for b, r in full["results"].items()}}, base_name=args.base)
        full["table1"] = [r.__dict__ for r in rows]
        full["table1_markdown"] = table1_markdown(rows)
    ctx.write_json(args.out, full)

    def brief(res: dict[str, Any]) -> dict[str, Any]:
        return {b: {k: v for k, v in r.items() if k != "records"} for b, r in res.items()}
    shown = {**full, "results": brief(full["results"])}
    if "base" in full:
        shown["base"] = {**full["base"], "results": brief(full["base"]["results"])}
    ctx.print(shown)
    return 0
