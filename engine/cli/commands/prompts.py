"""``python -m engine prompts --out F.jsonl``: the (X_r, X_c) pairs the model answers right, as JSONL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.cli.context import model_args, set_args


def register(sub) -> None:
    p = sub.add_parser("prompts", help="write the correctly answered (X_r, X_c) pairs as JSONL")
    model_args(p)
    set_args(p, "paper", with_file=False)
    p.add_argument("--out", required=True, type=Path, help="output .jsonl file")
    p.add_argument("--keep-all", action="store_true", help="also keep prompts the model gets wrong")
    p.add_argument("--show-dropped", action="store_true",
                   help="also list every dropped prompt with its reason (the model's token when it answered wrong)")


def run(args, ctx) -> int:
    import dataclasses
    from collections import Counter

    from engine.prompts.pairs import write_jsonl
    from engine.prompts.promptsets import generate_set
    from engine.techniques.accuracy import score_pairs
    from engine.techniques.knockout import top_next_tokens
    spec = ctx.spec()
    model = ctx.model
    tok = model.tokenizer
    gen = generate_set(tok, spec)
    with ctx.progress("checking answers") as bar:
        scores = score_pairs(model, gen.pairs, progress=bar)
    kept = gen.pairs if args.keep_all else [p for p, s in zip(gen.pairs, scores) if s.first_ok]
    dropped: list[dict[str, Any]] = [{"ref_text": prob.ref_text, "reason": why} for prob, why in gen.dropped]
    if not args.keep_all:
        for p, s in zip(gen.pairs, scores):
            if not s.first_ok:
                said = top_next_tokens(model, p.ref_ids, k=1)[0].token
                dropped.append({"ref_text": p.ref_text, "reason": "wrong answer", "model_token": said,
                                "answer_token": str(tok.convert_ids_to_tokens([p.answer_id])[0])})
    # informative, not a filter: X_c whose top token is still the answer (the operator was not needed)
    cf_scores = score_pairs(model, [dataclasses.replace(p, ref_ids=p.cf_ids) for p in kept]) if kept else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    n = write_jsonl(str(args.out), kept)
    res: dict[str, Any] = {
        "out": str(args.out), "balanced": spec.balance, "candidates": gen.candidates,
        "generated": len(gen.pairs), "kept": n, "dropped": len(dropped),
        "dropped_by_reason": dict(Counter(d["reason"] for d in dropped).most_common()),
        "kept_counterfactual_still_answers": sum(s.first_ok for s in cf_scores)}
    if kept:
        res["answer_tokens"] = ctx.answer_tokens(kept)
    if args.show_dropped:
        res["dropped_prompts"] = dropped
        res["kept_counterfactual_still_answers_prompts"] = [p.cf_text for p, s in zip(kept, cf_scores) if s.first_ok]
    print(json.dumps(res))
    return 0
