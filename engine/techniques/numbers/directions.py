"""A number's class-mean direction: where the residual stream moves when the answer is v.

**5. Direction of a number.**  At layer l (≥ 0), position END, over a prompt set's reference prompts (the
residual pass of :mod:`.activations`, shared with the probes): μ_v is the mean of x[l, END] over the prompts
whose answer C = v, μ the mean over every prompt of the set, and the direction of v is

    d_v = (μ_v − μ) / ||μ_v − μ||.

It is the direction the causal check moves along (:mod:`.causal`: μ_c' − μ_c = (μ_c' − μ) − (μ_c − μ)), read for
one value: Intervene adds it to a residual stream or an MLP's output at a strength in units of the component's own
norm at END.  A value needs at least ``MIN_PROMPTS`` prompts with that answer; fewer is refused, naming the
values the set has.  Exact (float64 means of the model's own activations), no fit.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.prompts.pairs import PromptPair
from engine.techniques.numbers.activations import POSITIONS, residual_pass, target_values

MIN_PROMPTS = 2


def answer_counts(pairs: Sequence[PromptPair]) -> dict[int, int]:
    """{answer value: prompts with it} of the set, values with at least ``MIN_PROMPTS`` prompts, by value."""
    c = Counter(float(v) for v in target_values(pairs)["C"])
    return {int(v): n for v, n in sorted(c.items()) if n >= MIN_PROMPTS and float(v).is_integer()}


def class_mean_direction(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, value: int
                         ) -> tuple[np.ndarray, int]:
    """(d_v [d_model] float64 of unit length, the prompts whose answer is ``value``) at ``layer`` (module
    docstring); ValueError when the set has fewer than ``MIN_PROMPTS`` prompts answering ``value``."""
    hooks.validate_layer(layer, backend.facts.n_layers)
    if not pairs:
        raise ValueError("the prompt set is empty: a number's direction is a mean over its prompts")
    c = target_values(pairs)["C"]
    mine = c == float(value)
    if int(mine.sum()) < MIN_PROMPTS:
        have = answer_counts(pairs)
        shown = ", ".join(f"{v} ({n})" for v, n in list(have.items())[:12]) or "none"
        raise ValueError(f"{int(mine.sum())} prompt(s) of the set answer {value}: its direction needs at least "
                         f"{MIN_PROMPTS}; choose one the set answers often enough (its prompts): {shown}")
    X, _ = residual_pass(backend, pairs)
    x = X[layer + 1, POSITIONS.index("END")]  # [P, d_model]: layer l's resid_post is row l + 1 (-1: embedding)
    d = x[mine].mean(0) - x.mean(0)
    norm = float(np.linalg.norm(d))
    if norm == 0.0:
        raise ValueError(f"every prompt of the set answers {value}: the mean of its class is the set's mean")
    return d / norm, int(mine.sum())
