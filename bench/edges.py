"""Benchmark: EAP and EAP-IG against exact edge patching, per model, with seconds and forward-equivalents.

For each model: exact edge patching of the edges (all of them, or ``--sample`` edges spread over the graph where
all would take hours on a CPU), EAP and EAP-IG (``--steps``) of the same edges, on addition and subtraction
pairs.  Prints one table per model: each ranking's seconds, its forward-equivalents counted from the code
(``engine.cost``: one padded full-logits pass of the set = 1; a backward position counted as two forward ones),
and the agreement of each estimate with the exact scores over the scored edges -- Spearman's and Pearson's
correlation, the overlap of the top 1 % and 5 % of the edges by |score|.  The cost of each ranking on *every*
edge is printed beside it (counted, and in seconds at the measured seconds per forward-equivalent).

    .venv/bin/python bench/edges.py                         # bundled model (every edge), SmolLM2, Gemma 3
    .venv/bin/python bench/edges.py --models organism --n 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attribution import spearman
from engine.techniques.eap import eap, eap_work
from engine.techniques.edges import edge_graph, edge_patching, edge_patching_work


def spec_of(name: str) -> str:
    if name == "smollm2":
        from tests.helpers.smollm2 import smollm2_gguf_path
        return str(smollm2_gguf_path())
    if name == "gemma3":
        from tests.helpers.gemma3 import gemma3_gguf_path
        return str(gemma3_gguf_path())
    return name


def top_overlap(a: np.ndarray, b: np.ndarray, share: float) -> tuple[int, int]:
    """(|top-k of a ∩ top-k of b| by |score|, k) with k = ceil(share x n)."""
    k = max(1, int(np.ceil(share * len(a))))
    ta, tb = set(np.argsort(-np.abs(a), kind="stable")[:k]), set(np.argsort(-np.abs(b), kind="stable")[:k])
    return len(ta & tb), k


def bench(name: str, n: int, sample: int | None, steps: int) -> str:
    model = open_model(spec_of(name), device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub"), n=n, seed=11))
    every = edge_graph(model)
    edges = every if sample is None or sample >= len(every) else every[::max(1, len(every) // sample)][:sample]
    out = {}
    for label, fn, work in (
            ("exact edge patching", lambda: edge_patching(model, pairs, edges).effects().numpy(),
             lambda es: edge_patching_work(model, pairs, es)),
            ("EAP", lambda: eap(model, pairs, edges).effects().numpy(), lambda es: eap_work(model, pairs, es)),
            (f"EAP-IG ({steps} steps)", lambda: eap(model, pairs, edges, steps=steps).effects().numpy(),
             lambda es: eap_work(model, pairs, es, steps=steps))):
        t = time.perf_counter()
        scores = fn()
        seconds = time.perf_counter() - t
        fe, fe_all = work(edges).fe(model, pairs), work(every).fe(model, pairs)
        out[label] = (scores, seconds, fe, fe_all)
    exact = out["exact edge patching"][0]
    lines = [f"### {name}: {len(pairs)} pairs (addition, subtraction), {len(edges)} of {len(every)} edges scored",
             "", "| ranking | seconds | FE (these edges) | FE (every edge), est. seconds | Spearman | Pearson | "
             "top 1 % | top 5 % |", "|---|---|---|---|---|---|---|---|"]
    for label, (scores, seconds, fe, fe_all) in out.items():
        per_fe = seconds / max(fe, 1e-9)
        agree = "| — | — | — | — |" if label.startswith("exact") else (
            f"| {spearman(exact, scores):.2f} | {float(np.corrcoef(exact, scores)[0, 1]):.2f} | "
            "{}/{} | {}/{} |".format(*top_overlap(exact, scores, 0.01), *top_overlap(exact, scores, 0.05)))
        lines.append(f"| {label} | {seconds:.1f} | {fe:,.0f} | {fe_all:,.0f}, ~{fe_all * per_fe:,.0f} s {agree}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="organism,smollm2,gemma3")
    ap.add_argument("--n", type=int, default=4, help="prompts per operation (addition, subtraction)")
    ap.add_argument("--sample", type=int, default=300, help="edges scored on the real models (bundled: every edge)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG's points")
    a = ap.parse_args()
    for name in a.models.split(","):
        print(bench(name, a.n, None if name == "organism" else a.sample, a.steps), flush=True)
        print()


if __name__ == "__main__":
    main()
