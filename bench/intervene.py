"""Benchmark: a live intervention on the bundled model, engine side (what one move of a slider costs).

The first call on a prompt runs X (and X' for a patch) once; a change of the action or its strength then
runs the intervened pass alone.  Prints, per intervention, the median wall-clock seconds over repeats, the
median CPU seconds of this process (all its threads: what the call costs, whatever else the machine runs) and
the forward passes of the warm call (X and X' memoised).  Target: < 300 ms warm.

    .venv/bin/python bench/intervene.py
"""

from __future__ import annotations

import statistics
import time

from engine.backends import open_model
from engine.techniques.intervene import Intervention, forget, intervene, number_token, parse_targets
from engine.techniques.promptlab import typed_pair


def main(repeats: int = 9) -> None:
    model = open_model("organism", device="cpu")
    f = model.facts
    text = "Q: What is 7 plus 8? A:"
    pair = typed_pair(model.tokenizer, text)
    t = lambda s: parse_targets(s, f.n_layers, f.n_heads, f.d_mlp)  # noqa: E731
    cases = [
        ("patch 1.3 from X_c at END, others frozen", Intervention("patch", t("1.3"), source=tuple(pair.cf_ids),
                                                                  freeze=True)),
        ("patch 3 heads everywhere", Intervention("patch", t("1.3,1.1,0.2"), "all", source=tuple(pair.cf_ids))),
        ("scale 1.3 by 2", Intervention("scale", t("1.3"), factor=2.0)),
        ("zero 2 MLPs", Intervention("zero", t("0.mlp,1.mlp"), "all")),
        ("add 9's unembedding at the last residual", Intervention(
            "add", t(f"{f.n_layers - 1}.resid"), strength=2.0,
            direction_token=number_token(model.tokenizer, text, 9))),
    ]
    forget()
    t0 = time.perf_counter()
    cold = intervene(model, pair.ref_ids, cases[0][1], watch=pair.answer_id)
    print(f"cold (X and X_c run and memoised): {time.perf_counter() - t0:.3f} s, {cold.forward_passes} forward passes")
    print(f"{'intervention':45s} {'warm median s':>14s} {'CPU s':>7s} {'passes':>7s}")
    for label, iv in cases:
        intervene(model, pair.ref_ids, iv, watch=pair.answer_id)  # warm: X and X' memoised
        times, cpu, passes = [], [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            res = intervene(model, pair.ref_ids, iv, watch=pair.answer_id)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            passes.append(res.forward_passes)
        print(f"{label:45s} {statistics.median(times):14.4f} {statistics.median(cpu):7.4f} {max(passes):7d}")


if __name__ == "__main__":
    main()
