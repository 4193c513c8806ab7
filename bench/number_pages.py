"""Benchmark: the first visit of the Numbers and Atlas pages, step by step.

Runs what each page computes on a first visit, on a fresh result cache and the sidebar's default prompt set
(the paper's four operations, 40 prompts each), and prints one line per step: wall seconds and
**forward-equivalents** (:class:`bench.work.Counter`: one padded full-logits pass of the prompt set = 1).

* Numbers: the probes of every layer (classification, scalar, per-digit, mod T, helix, PCA), the number tokens'
  spectrum, the helix circle, helix-subspace patching of C at END (the page's default selection) and the
  class-mean causal check.
* Atlas: the operand grid of the default template (every operand pair, path patching per pair), the heuristic
  neurons of the grid's strongest MLP, and their circuit check when any is tagged.

    .venv/bin/python bench/number_pages.py                          # SmolLM2, Gemma 3 270M, Qwen2.5-0.5B shape
    .venv/bin/python bench/number_pages.py --models qwen-shape

A random model answers nothing, so on ``qwen-shape`` every generated prompt is kept (``--keep-all``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.reproduce import MODELS, open_bench_model
from bench.work import Counter, fe, print_table


def steps(model, spec, cache, keep_all: bool):
    """[(step, callable)] of the two pages' first visits, in the pages' order."""
    from engine.prompts.pairs import PromptError
    from engine.prompts.promptsets import generate
    from engine.techniques import numbers as N
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.helix_patch import cached_helix_patch
    from engine.techniques.heuristic_neurons import heuristic_neurons, neuron_circuit
    from engine.techniques.operand_grid import grid_template, operand_grid
    pairs = generate(model.tokenizer, spec)[0] if keep_all else kept_pairs(model, spec, cache=cache)[0]
    state: dict = {}

    def probes():
        state["rows"] = N.cached_number_probes(model, pairs, cache=cache)[0]
        state["layer"] = N.default_layer(state["rows"])

    def helix_patch():
        cached_helix_patch(model, pairs, state["layer"], "END", "C", cache=cache)

    def causal():
        try:
            layer = N.causal_layer(state["rows"])
        except ValueError:
            return
        N.cached_causal_check(model, pairs, layer, cache=cache)

    template = grid_template(spec).id

    def neurons():
        tags, _ = heuristic_neurons(model, spec, template=template, cache=cache)
        if any(t.tagged for t in tags):
            try:
                neuron_circuit(model, spec, tags, template=template)
            except PromptError:  # the model answers too few of the grid right (a random one): the page says so
                pass

    return pairs, [
        ("Numbers: probes", probes),
        ("Numbers: spectrum", lambda: N.cached_number_spectrum(model, pairs, cache=cache)),
        ("Numbers: helix circle", lambda: N.cached_helix_circle(model, pairs, state["layer"], cache=cache)),
        ("Numbers: helix patching", helix_patch),
        ("Numbers: causal check", causal),
        ("Atlas: operand grid", lambda: operand_grid(model, spec, template=template, cache=cache)),
        ("Atlas: heuristic neurons", neurons),
    ]


def bench(name: str, keep_all: bool) -> list[tuple[str, float, float]]:
    from cache import ResultCache
    from engine.prompts.promptsets import PromptSetSpec
    from engine.prompts.templates import PAPER_OPS
    with tempfile.TemporaryDirectory() as tmp:
        model = open_bench_model(name, Path(tmp))
        cache = ResultCache(Path(tmp) / "results.duckdb")
        spec = PromptSetSpec(ops=tuple(PAPER_OPS), n=40)
        pairs, todo = steps(model, spec, cache, keep_all)
        counter = Counter()
        counter.attach(model)
        unit = len(pairs) * max(len(p.ref_ids) for p in pairs)
        rows, page = [], {"Numbers": [0.0, 0.0], "Atlas": [0.0, 0.0]}
        for key, run in todo:
            before, t = counter.snapshot(), time.perf_counter()
            run()
            s = time.perf_counter() - t
            f = fe(model.facts, unit, *(a - b for a, b in zip(counter.snapshot()[:3], before[:3])))
            rows.append((key, s, f))
            page[key.split(":")[0]][0] += s
            page[key.split(":")[0]][1] += f
    rows += [(f"{p} page, total ({len(pairs)} pairs)", s, f) for p, (s, f) in page.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)} or a model spec")
    ap.add_argument("--keep-all", action="store_true", help="keep every prompt, answered right or not")
    args = ap.parse_args()
    for name in args.models.split(","):
        keep_all = args.keep_all or name == "qwen-shape"
        rows = bench(name, keep_all)
        print_table(f"{name}  (the sidebar's default set{', every prompt kept' if keep_all else ''})", "step", rows, 40)


if __name__ == "__main__":
    main()
