"""Benchmark: where the time of ``engine reproduce`` goes, row by row.

Runs :func:`engine.findings.paper.reproduce` (the Paper page's and ``reproduce``'s computation) on a fresh result
cache and prints, per model, one line per Paper row: wall seconds and **forward-equivalents** (the forward work
counted by :class:`bench.work.Counter` -- positions through the blocks and the unembedding, END-chain MLP rows --
weighted by multiply-accumulates and divided by one padded full-logits pass of the kept pairs; backward passes
are not counted), then the total.  ``inputs`` is the gathering before the first row: the prompt sets of every
format, which of them the model answers right, GSM8K.

    .venv/bin/python bench/reproduce.py                              # SmolLM2, Gemma 3 270M, Qwen2.5-0.5B shape
    .venv/bin/python bench/reproduce.py --models smollm2 --n 40
    .venv/bin/python bench/reproduce.py --models qwen-shape --keep-all   # a random model answers nothing: keep all

``--keep-all`` (always on for ``qwen-shape``) keeps every generated prompt instead of the correctly answered ones.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.work import Counter, fe, print_table
from engine.backends import open_model

MODELS = ("smollm2", "gemma3", "qwen-shape")


def open_bench_model(name: str, tmp: Path):
    if name == "smollm2":
        from tests.helpers.smollm2 import open_smollm2
        return open_smollm2()
    if name == "gemma3":
        from tests.helpers.gemma3 import open_gemma3
        return open_gemma3()
    if name == "qwen-shape":
        from bench.path_patching import qwen_shaped
        return open_model(str(qwen_shaped(tmp / "qwen", quick=False)), device="cpu")
    return open_model(name, device="cpu")


def bench(name: str, ops: tuple[str, ...], n: int, keep_all: bool) -> list[tuple[str, float, float]]:
    """[(row, seconds, forward-equivalents)] of one reproduce run on a fresh cache, the total last."""
    from cache import ResultCache
    from engine.findings.paper import reproduce
    from engine.prompts.promptsets import PromptSetSpec, generate
    from engine.techniques.accuracy import kept_pairs
    with tempfile.TemporaryDirectory() as tmp:
        model = open_bench_model(name, Path(tmp))
        cache = ResultCache(Path(tmp) / "results.duckdb")
        spec = PromptSetSpec(ops=ops, n=n)
        counter = Counter()
        counter.attach(model)
        marks: list[tuple[str, float, tuple]] = []
        t0 = time.perf_counter()
        reproduce(model, spec, cache, keep_all=keep_all,
                  on_row=lambda key: marks.append((key, time.perf_counter(), counter.snapshot())))
        pairs = generate(model.tokenizer, spec)[0] if keep_all else kept_pairs(model, spec, cache=cache)[0]
    unit = len(pairs) * max(len(p.ref_ids) for p in pairs)
    rows, last_t, last_c = [], t0, (0, 0, 0, 0)
    for key, t, c in marks:
        rows.append((key, t - last_t, fe(model.facts, unit, *(a - b for a, b in zip(c[:3], last_c[:3])))))
        last_t, last_c = t, c
    rows.append((f"total ({len(pairs)} pairs)", last_t - t0, fe(model.facts, unit, *last_c[:3])))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)} or a model spec")
    ap.add_argument("--op", default="add,sub,mul,div")
    ap.add_argument("--n", type=int, default=40, help="prompts per operation (default 40, as the Paper page)")
    ap.add_argument("--keep-all", action="store_true", help="keep every prompt, answered right or not")
    args = ap.parse_args()
    for name in args.models.split(","):
        rows = bench(name, tuple(args.op.split(",")), args.n, args.keep_all or name == "qwen-shape")
        print_table(f"{name}  (reproduce --op {args.op} --n {args.n}{', every prompt kept' if args.keep_all else ''})",
                    "row", rows)


if __name__ == "__main__":
    main()
