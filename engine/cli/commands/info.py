"""``python -m engine info --model M``: the model's facts (architecture, sizes, fingerprint) as JSON."""

from __future__ import annotations

from engine.cli.context import model_args


def register(sub) -> None:
    model_args(sub.add_parser("info", help="model facts as JSON"))


def run(args, ctx) -> int:
    ctx.print(ctx.model.facts.to_dict())
    return 0
