"""``python -m engine report --out r.html``: every number of the paper's steps on one set (generated, or a file of
pairs: ``--pairs`` / ``--prompts``), one offline HTML file."""

from __future__ import annotations

from pathlib import Path

from engine.cli.context import model_args, set_args


def register(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report of the analysis (opens offline)")
    model_args(p)
    set_args(p, "paper")
    p.add_argument("--out", required=True, type=Path, help="output .html")
    p.add_argument("--images", type=Path, default=None, help="also write every chart as SVG and PNG in this folder")
    p.add_argument("--k-max", type=int, default=10, help="knockout curve up to k heads (default 10)")
    p.add_argument("--draws", type=int, default=5, help="random draws per k of the knockout curve (default 5)")


def run(args, ctx) -> int:
    from engine.findings.report import build_report
    from views.report import chart_images, render_html  # the dashboard's own charts (no Streamlit there)
    if args.k_max < 1 or args.draws < 1:
        raise ValueError("--k-max and --draws must be at least 1")
    given = args.pairs or args.prompts  # a file of pairs instead of a generated set
    if given is not None:
        rep = build_report(ctx.model, None, ctx.cache, k_max=args.k_max, draws=args.draws, pairs=ctx.pairs,
                           source={"file": given.name, "n_in_file": ctx.n_given})
    else:
        rep = build_report(ctx.model, ctx.spec(), ctx.cache, k_max=args.k_max, draws=args.draws)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_html(rep), encoding="utf-8")
    images = [str(p) for p in chart_images(rep, args.images)] if args.images else []
    ctx.print({"out": str(args.out), "bytes": args.out.stat().st_size, "prompt_set": rep.prompt_set,
               "top_heads": rep.top_heads[:3], "images": images})
    return 0
