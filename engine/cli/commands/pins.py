"""``python -m engine pins --model M [--pin L.H --note TEXT] [--unpin L.H]``: a model's pins and notes as JSON.

Pins are kept per model (its weights fingerprint) in the result cache (:mod:`engine.findings.notes`); the
dashboard shows them on the Path patching heatmap, the circuit JSON labels its nodes with them."""

from __future__ import annotations

from engine.cli.context import model_args


def register(sub) -> None:
    p = sub.add_parser("pins", help="list, add or remove pinned components and their notes -> JSON")
    model_args(p)
    p.add_argument("--pin", metavar="COMPONENT", help="pin a head 1.3, an MLP 1.mlp, a neuron 1.mlp.120 or an edge "
                   "1.3->5.5 (with --note: its note, replacing the one kept)")
    p.add_argument("--note", default="", help="the pin's note: plain text, at most 1,000 characters")
    p.add_argument("--unpin", metavar="COMPONENT", help="remove this pin and its note")


def run(args, ctx) -> int:
    from engine.findings.notes import pin, pins, unpin
    cache = ctx.cache
    if cache is None:
        raise ValueError("pins are kept in the result cache: drop --no-cache")
    if args.note and not args.pin:
        raise ValueError("--note goes with --pin COMPONENT")
    out: dict = {"model": ctx.model.facts.spec, "fingerprint": ctx.model.facts.fingerprint}
    if args.pin:
        out["pinned"] = pin(ctx.model, args.pin, args.note, cache).component
    if args.unpin:
        out["unpinned"] = args.unpin if unpin(ctx.model, args.unpin, cache) else None
    out["pins"] = [{"component": p.component, "note": p.note, "updated_at": p.updated_at.isoformat()}
                   for p in pins(ctx.model, cache)]
    ctx.print(out)
    return 0
