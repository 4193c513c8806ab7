"""The number methods' command line (``python -m engine numbers``) and their sentence of the circuit summary
(both registered in :mod:`engine.registry`, through the package).
"""

from __future__ import annotations

from engine.techniques.numbers.activations import check_layers
from engine.techniques.numbers.causal import cached_causal_check, causal_layer
from engine.techniques.numbers.fourier import cached_number_spectrum, dominant_periods
from engine.techniques.numbers.probes import DECODE_THRESHOLD, MIN_FOLDS, cached_number_probes, first_decode_layer

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine numbers``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def parse_layers(text: str | None, n_layers: int) -> list[int] | None:
    """--layers: None / "all" -> None (every layer), else a comma list such as -1,0,5."""
    if text is None or text.strip() == "all":
        return None
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers {text!r} is not a comma list of layer numbers, e.g. -1,0,5") from None
    return check_layers(layers, n_layers)


def cli(args, ctx) -> dict:
    """Probe + helix rows -> CSV (``--spectrum-out``: the DFT rows); prints l*, the causal check, the periods."""
    model, pairs = ctx.model, ctx.pairs
    layers = parse_layers(args.layers, model.facts.n_layers)
    with ctx.progress("number probes") as bar:
        rows, computed = cached_number_probes(model, pairs, layers=layers, cache=ctx.cache,
                                              progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    res: dict = {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
                 "answer_tokens": ctx.answer_tokens(pairs), "decode_threshold": DECODE_THRESHOLD}
    res["first_layer_C_decodes_at_END"] = first_decode_layer(rows)
    res["first_layer_A_decodes_at_A"] = first_decode_layer(rows, "A", "A")
    res["first_layer_B_decodes_at_B"] = first_decode_layer(rows, "B", "B")
    last = max(r.layer for r in rows)
    res["last_layer"] = {f"{r.target}@{r.position}": {"accuracy": round(r.score, 4), "shuffled": round(r.baseline, 4),
                                                      "n_prompts": r.n_prompts, "n_classes": r.n_classes}
                         for r in rows if r.layer == last and r.method == "logistic"}
    spec, _ = cached_number_spectrum(model, pairs, cache=ctx.cache)
    if args.spectrum_out is not None:
        ctx.write_csv(args.spectrum_out, [r.__dict__ for r in spec])
        res["spectrum_out"] = str(args.spectrum_out)
    res["number_tokens"] = max(r.k for r in spec) * 2 if spec else 0
    res["dominant_periods"] = {s: dominant_periods(spec, s) for s in ("embedding", "unembedding")}
    if not args.no_causal:
        try:
            layer = causal_layer(rows)
        except ValueError as e:  # C has too few prompts per value: the other results stand
            res["causal_check"] = str(e)
            return res
        with ctx.progress("causal check") as bar:
            causal, _ = cached_causal_check(model, pairs, layer, cache=ctx.cache, progress=bar)
        res["causal_check"] = [r.__dict__ for r in causal]
    return res


# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def finding(model, pairs, cache, table) -> str | None:
    """Where C decodes from the END residual (the probe), and whether the model uses that direction."""
    from engine.results import NotCached
    try:
        rows, _ = cached_number_probes(model, pairs, cache=cache)
    except NotCached:
        return None
    first = first_decode_layer(rows)
    end_c = {r.layer: r for r in rows if r.method == "logistic" and r.target == "C" and r.position == "END"}
    if not end_c:  # a small set: no value of C occurs MIN_FOLDS times for two values (the probe was not fitted)
        return (f"A linear probe of C was not fitted on these {len(pairs)} prompts: it needs at least {MIN_FOLDS} "
                f"prompts for each of two answers or more; use more prompts per operation.")
    if first is None:
        best = max(end_c.values(), key=lambda r: r.score)
        return (f"A linear probe never reads C from the last token's residual stream at accuracy "
                f"{DECODE_THRESHOLD:.0%} (best: {best.score:.0%} after layer {best.layer}, "
                f"shuffled {best.baseline:.0%}).")
    r = end_c[first]
    text = (f"A linear probe reads C from the last token's residual stream from "
            f"{'the embedding' if first < 0 else f'layer {first}'} on (held-out accuracy {r.score:.0%}, "
            f"shuffled labels {r.baseline:.0%}, {r.n_classes} values).")
    try:
        causal, _ = cached_causal_check(model, pairs, causal_layer(rows), seed=0, cache=cache)
    except (NotCached, ValueError):
        return text
    moved = next(c for c in causal if c.method == "class-means")
    rand = next(c for c in causal if c.method == "random")
    return text + (f" Moving it there by the difference of the class means turns the answer into the new value for "
                   f"{moved.success:.0%} of the prompts (a random direction of the same norm: {rand.success:.0%}).")
