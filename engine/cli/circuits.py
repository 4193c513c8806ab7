"""Subcommands beyond the paper's own techniques (registered by ``engine.cli.main``)::

    python -m engine attribution    --model SPEC (--prompts F | --op ... --n ...) --out atp.csv
    python -m engine position-patch --model SPEC (--prompts F | --op ... --n ...) --out lp.csv [--group op:add]
    python -m engine logit-lens     --model SPEC (--prompts F | --op ... --n ...) --out lens.csv
    python -m engine patch --receiver 3.1:q ... --out h2h.csv     (head -> head path patching)
    python -m engine report --model SPEC [--op ... --n ...] --out report.html [--images DIR]

``attribution`` writes one row per sender -- ``component, layer, head, exact, atp, abs_error`` and
the activation-patching pair ``exact_total, atp_total`` (mean relative effect over the pairs) --
and prints how well AtP ranks the senders (Spearman, top-5/10 overlap, missed / invented heads)
and the seconds each took.  Every result goes through the result cache like the other subcommands.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class CliTools:
    """What ``engine.cli.main`` lends these subcommands: model loading, cache, prompt pairs, output."""

    model: Callable[[argparse.Namespace], Any]
    cache: Callable[[argparse.Namespace], Any]
    pairs: Callable[[argparse.Namespace, Any, Any], list]
    write_csv: Callable[[Path, list[dict[str, Any]]], None]
    print: Callable[[Any], None]
    spec: Callable[[argparse.Namespace], Any]


def add_parsers(sub, model_args: Callable, set_args: Callable) -> None:
    p = sub.add_parser("attribution", help="attribution patching (AtP) beside exact path / activation patching -> CSV")
    model_args(p)
    set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path, help="output .csv, one row per sender")
    p.add_argument("--metric", choices=("effect", "logit_diff"), default="effect")
    p.add_argument("--no-total", action="store_true",
                   help="skip the activation-patching pair (exact_total, atp_total): one forward per sender")

    p = sub.add_parser("position-patch", help="layer x position activation patching of the residual stream -> CSV")
    model_args(p)
    set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path, help="output .csv, one row per group, layer and position")
    p.add_argument("--group", default=None,
                   help="only this group: '*', op:add, template:<id> (default: every group)")

    p = sub.add_parser("report", help="one self-contained HTML report of the analysis (opens offline)")
    model_args(p)
    set_args(p, "paper", with_file=False)
    p.add_argument("--out", required=True, type=Path, help="output .html")
    p.add_argument("--images", type=Path, default=None, help="also write every chart as SVG and PNG in this folder")
    p.add_argument("--k-max", type=int, default=10, help="knockout curve up to k heads (default 10)")
    p.add_argument("--draws", type=int, default=5, help="random draws per k of the knockout curve (default 5)")

    p = sub.add_parser("reproduce", help="the paper's findings, one row each, on this model -> one offline HTML file")
    model_args(p)
    set_args(p, "paper", with_file=False)
    p.add_argument("--out", required=True, type=Path, help="output .html")
    p.add_argument("--compare", default=None, metavar="MODEL",
                   help="a second model for Fig. 12 (same forms as --model)")

    p = sub.add_parser("logit-lens", help="the answer's probability and rank at END after every layer -> CSV")
    model_args(p)
    set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path, help="output .csv, one row per group and layer")


def cmd_attribution(args, tools: CliTools) -> int:
    from engine.techniques.attribution import agreement, cached_attribution
    model = tools.model(args)
    cache = tools.cache(args)
    pairs = tools.pairs(args, model, cache)
    table, computed = cached_attribution(model, pairs, cache=cache, total=not args.no_total)
    rows = table.rows[args.metric]
    out = []
    for r in rows:
        row = {"component": r.component, "layer": r.layer, "head": r.head, "exact": r.values["exact"],
               "atp": r.values["atp"], "abs_error": abs(r.values["exact"] - r.values["atp"])}
        if "exact_total" in r.values:
            row.update(exact_total=r.values["exact_total"], atp_total=r.values["atp_total"])
        out.append(row)
    tools.write_csv(args.out, out)
    comparisons = [("exact", "atp")] + ([("exact_total", "atp_total")] if not args.no_total else [])
    summary = {}
    for exact, est in comparisons:
        ag = agreement(rows, exact, est)
        summary[f"{est} vs {exact}"] = {"spearman": ag.spearman, "top5_overlap": ag.overlap[5],
                                        "top10_overlap": ag.overlap[10], "missed_top10": ag.missed[10],
                                        "invented_top10": ag.invented[10], "max_abs_error": ag.max_abs_error}
    tools.print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "metric": args.metric,
                 "senders": len(out), "agreement (heads)": summary, "seconds": table.seconds})
    return 0


def cmd_position_patch(args, tools: CliTools) -> int:
    from engine.techniques.position_patching import cached_layer_position_patching
    model = tools.model(args)
    cache = tools.cache(args)
    pairs = tools.pairs(args, model, cache)
    tok = model.tokenizer
    cells, computed = cached_layer_position_patching(
        model, pairs, cache=cache, tokens=lambda ids: tok.convert_ids_to_tokens(list(ids)))
    groups = sorted({c.group for c in cells})
    if args.group is not None and args.group not in groups:
        raise ValueError(f"--group {args.group!r} is not in this set: choose from {', '.join(groups)}")
    rows = [c.__dict__ for c in cells if args.group is None or c.group == args.group]
    tools.write_csv(args.out, rows)
    top = sorted((c for c in cells if c.group == (args.group or "*")), key=lambda c: c.logit_diff)[:5]
    tools.print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "groups": groups,
                 "cells": len(rows), "largest_drops": [c.__dict__ for c in top]})
    return 0


def cmd_logit_lens(args, tools: CliTools) -> int:
    from engine.techniques.logit_lens import cached_logit_lens
    model = tools.model(args)
    cache = tools.cache(args)
    pairs = tools.pairs(args, model, cache)
    rows, computed = cached_logit_lens(model, pairs, cache=cache)
    tools.write_csv(args.out, [r.__dict__ for r in rows])
    overall = [r for r in rows if r.group == "*"]
    first = next((r.layer for r in overall if r.top1 >= 0.5), None)
    tools.print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
                 "first_layer_answer_is_top1_for_half": first,
                 "per_layer": [r.__dict__ for r in overall]})
    return 0


def cmd_head_patch(args, tools: CliTools) -> int:
    """``patch --receiver L.H[:q|k|v]``: every earlier sender's effect through that head's input."""
    from engine.techniques.head_patching import cached_head_path_patching, parse_receiver
    model = tools.model(args)
    receiver = parse_receiver(args.receiver, model.facts.n_layers, model.facts.n_heads)
    cache = tools.cache(args)
    pairs = tools.pairs(args, model, cache)
    vals, computed = cached_head_path_patching(model, pairs, receiver, cache=cache)
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    for v in vals:
        if v.group == "*" and v.component in ("head", "mlp"):
            rows.setdefault((v.component, v.layer, v.head), {"component": v.component, "layer": v.layer,
                                                              "head": v.head})[v.metric] = v.value
    out = sorted(rows.values(), key=lambda r: (r["layer"], r["component"] == "mlp", r["head"]))
    tools.write_csv(args.out, out)
    top = sorted((r for r in out if r["component"] == "head"), key=lambda r: r["logit_diff"])[:5]
    tools.print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "receiver": str(receiver),
                 "senders": len(out), "top_senders": top})
    return 0


def cmd_report(args, tools: CliTools) -> int:
    """``report``: every number of the paper's steps on the set, as one HTML file (+ chart images)."""
    from engine.report import build_report
    from views.report import chart_images, render_html  # the dashboard's own charts (no Streamlit there)
    if args.k_max < 1 or args.draws < 1:
        raise ValueError("--k-max and --draws must be at least 1")
    model = tools.model(args)
    cache = tools.cache(args)
    rep = build_report(model, tools.spec(args), cache, k_max=args.k_max, draws=args.draws)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_html(rep), encoding="utf-8")
    images = [str(p) for p in chart_images(rep, args.images)] if args.images else []
    tools.print({"out": str(args.out), "bytes": args.out.stat().st_size, "prompt_set": rep.prompt_set,
                 "top_heads": rep.top_heads[:3], "images": images})
    return 0


def cmd_reproduce(args, tools: CliTools) -> int:
    """``reproduce``: the report with the paper's findings first (holds / does not hold / why not)."""
    from engine.backends import open_model
    from engine.report import build_report
    from views.report import render_html
    model = tools.model(args)
    second = open_model(args.compare, device=model.facts.device) if args.compare else None
    rep = build_report(model, tools.spec(args), tools.cache(args), paper=True, second=second)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_html(rep), encoding="utf-8")
    tools.print({"out": str(args.out), "bytes": args.out.stat().st_size,
                 "findings": [{k: r[k] for k in ("figure", "lab", "holds", "note")} for r in rep.paper]})
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, CliTools], int]] = {
    "attribution": cmd_attribution, "position-patch": cmd_position_patch, "logit-lens": cmd_logit_lens,
    "head-patch": cmd_head_patch, "report": cmd_report, "reproduce": cmd_reproduce,
}
