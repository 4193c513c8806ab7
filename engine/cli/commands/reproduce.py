"""``python -m engine reproduce --out p.html``: the paper's findings one row each (holds / does not hold /
inconclusive / why not), then the report, as one offline HTML file."""

from __future__ import annotations

from pathlib import Path

from engine.cli.context import model_args, set_args

#: what to do where a finding has no number yet, in the CLI's words
GO_TO = {"models": " (give one with --compare MODEL)", "sft": " (python -m engine finetune)"}


def row_timer(bar):
    """``on_row`` for the bar: a line with each finished row's seconds (the first: the report's analyses and the
    prompt sets), and the bar named after the next row."""
    import time

    from engine.findings.paper import checked_steps
    keys = ["inputs"] + [s.key for s in checked_steps()]  # "inputs": the prompt sets, before the first row
    last = [time.perf_counter()]

    def done(key: str) -> None:
        now = time.perf_counter()
        bar.note(f"{'the report and the prompt sets' if key == 'inputs' else key}: {now - last[0]:.1f} s")
        last[0] = now
        i = keys.index(key) + 1
        if i < len(keys):
            bar.relabel(f"reproduce: {keys[i]}")
    return done


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="the paper's findings, one row each, on this model -> one offline HTML file")
    model_args(p)
    set_args(p, "paper", with_file=False)
    p.add_argument("--out", required=True, type=Path, help="output .html")
    p.add_argument("--compare", default=None, metavar="MODEL",
                   help="a second model for Fig. 12 (same forms as --model)")


def run(args, ctx) -> int:
    from engine.findings.report import build_report
    from views.report import render_html
    second = ctx.open_model(args.compare) if args.compare else None
    with ctx.progress("reproduce: the report's analyses") as bar:
        rep = build_report(ctx.model, ctx.spec(), ctx.cache, paper=True, second=second, paper_progress=bar,
                           on_row=row_timer(bar))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_html(rep), encoding="utf-8")
    ctx.print({"out": str(args.out), "bytes": args.out.stat().st_size,
               "findings": [{**{k: r[k] for k in ("figure", "lab", "verdict", "holds")},
                             "note": r["note"] + (GO_TO[r["key"]] if not r["lab"] and r["key"] in GO_TO else "")}
                            for r in rep.paper]})
    return 0
