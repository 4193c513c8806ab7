"""``python -m engine accuracy``: first-token and full-answer accuracy per operation and template."""

from __future__ import annotations

from engine.cli.context import model_args, set_args


def register(sub) -> None:
    p = sub.add_parser("accuracy", help="first-token and full-answer accuracy per op and template")
    model_args(p)
    set_args(p, "paper", with_file=False)


def run(args, ctx) -> int:
    from engine.prompts.promptsets import generate
    from engine.techniques.accuracy import accuracy_report
    spec = ctx.spec()
    model = ctx.model
    with ctx.progress("accuracy") as bar:
        rows, computed = accuracy_report(model, spec, cache=ctx.cache, progress=bar)
    pairs, _ = generate(model.tokenizer, spec)
    per_op = {r.op: {"n": r.n, "first_token": r.first_token, "full_answer": r.full_answer}
              for r in rows if r.template == "*"}
    per_template = [{"op": r.op, "template": r.template, "n": r.n, "first_token": r.first_token,
                     "full_answer": r.full_answer, "mean_p_answer": r.mean_p_answer}
                    for r in rows if r.template != "*"]
    ctx.print({"model": model.facts.spec, "fingerprint": model.facts.fingerprint, "cached": not computed,
               "answer_tokens": ctx.answer_tokens(pairs), "per_op": per_op, "per_template": per_template})
    return 0
