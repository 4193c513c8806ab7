"""Benchmark: a live knockout on the bundled model, engine side (what one click on the Knockout page costs).

One "live knockout" = the typed prompt's top-5 before and after + the 100-prompt set's accuracy
before and after (the counterfactual mean activations are computed once per prompt set and reused;
their one-off cost is printed too).  Prints a table of the
median over repeats for several knockout sizes.  Target: < 300 ms.

    .venv/bin/python bench/knockout.py
"""

from __future__ import annotations

import statistics
import time

from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import keep_correct
from engine.techniques.knockout import Knockout, knockout_accuracy, mean_activations
from engine.techniques.promptlab import analyse_prompt


def main(repeats: int = 7) -> None:
    model = open_model("organism", device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(n=40, seed=0))
    pairs = keep_correct(model, pairs)[:100]
    text = "Q: What is 7 times 8? A:"
    t0 = time.perf_counter()
    mean_activations(model, pairs)  # once per prompt set, then memoized per (fingerprint, prompt-set hash)
    first_means_ms = (time.perf_counter() - t0) * 1000
    rows = []
    for label, ko in (("1 head", Knockout(((0, 6),))), ("3 heads", Knockout(((0, 6), (0, 5), (0, 4)))),
                      ("3 heads + 2 MLPs", Knockout(((0, 6), (0, 5), (0, 4)), (0, 5))),
                      ("10 heads", Knockout(tuple((layer, h) for layer in range(2) for h in range(5))))):
        parts: dict[str, list[float]] = {"means": [], "prompt": [], "accuracy": [], "total": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            means = mean_activations(model, pairs)
            t1 = time.perf_counter()
            analyse_prompt(model, text)
            analyse_prompt(model, text, ko=ko, means=means)
            t2 = time.perf_counter()
            knockout_accuracy(model, pairs, Knockout(), means)
            knockout_accuracy(model, pairs, ko, means)
            t3 = time.perf_counter()
            for k, v in (("means", t1 - t0), ("prompt", t2 - t1), ("accuracy", t3 - t2), ("total", t3 - t0)):
                parts[k].append(v * 1000)
        rows.append((label, {k: statistics.median(v) for k, v in parts.items()}))
    print(f"\nbundled model, {len(pairs)} prompts, median of {repeats} runs, CPU; the X_c mean activations are "
          f"computed once per prompt set ({first_means_ms:.0f} ms), then reused\n")
    print("| knockout | mean activations ms | typed prompt before+after ms | set accuracy before+after ms | total ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, m in rows:
        print(f"| {label} | {m['means']:.0f} | {m['prompt']:.0f} | {m['accuracy']:.0f} | {m['total']:.0f} |")


if __name__ == "__main__":
    main()
