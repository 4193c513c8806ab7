"""A number's direction in the residual stream: its class mean, or its logistic probe's weights.

**5. Direction of a number.**  At layer l (≥ 0), position END, over a prompt set's reference prompts (the
residual pass of :mod:`.activations`, shared with the probes): μ_v is the mean of x[l, END] over the prompts
whose answer C = v, μ the mean over every prompt of the set, and the direction of v is

    d_v = (μ_v − μ) / ||μ_v − μ||.

It is the direction the causal check moves along (:mod:`.causal`: μ_c' − μ_c = (μ_c' − μ) − (μ_c − μ)), read for
one value: Intervene adds it to a residual stream or an MLP's output at a strength in units of the component's own
norm at END.  A value needs at least ``MIN_PROMPTS`` prompts with that answer; fewer is refused, naming the
values the set has.  Exact (float64 means of the model's own activations), no fit.

**6. A probe's direction of a number.**  The Numbers page's logistic probe of the answer C at layer l, END --
``StandardScaler`` + ``LogisticRegression(C=LOGREG_C)`` -- fitted once on every prompt of the set whose answer
the set has at least ``MIN_PROMPTS`` times (no held-out fold: the probe's own weights, not its score).  With
z = (x − m) / s its standardisation and W [K, d_model] its class weights (binary: the one row w gives the classes
−w/2 and +w/2, the same model), the probe's logit of v relative to the others' mean is linear in x,

    g_v(x) = (W_v − mean_k W_k) · (x − m) / s  + const,

and its direction is its gradient made unit: d_v = ((W_v − mean_k W_k) / s) / ||·||, the way x moves to raise the
probe's belief that the answer is v fastest.  It needs two values or more; a value outside them is refused, naming
the values the set has.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.prompts.pairs import PromptPair
from engine.techniques.numbers.activations import POSITIONS, residual_pass, target_values
from engine.techniques.numbers.probes import LOGREG_C

MIN_PROMPTS = 2
#: the probe's fit converges this tightly (scikit-learn's default, 1e-4, leaves the direction's last digits to the
#: solver's path)
PROBE_TOL = 1e-8


def answer_counts(pairs: Sequence[PromptPair]) -> dict[int, int]:
    """{answer value: prompts with it} of the set, values with at least ``MIN_PROMPTS`` prompts, by value."""
    c = Counter(float(v) for v in target_values(pairs)["C"])
    return {int(v): n for v, n in sorted(c.items()) if n >= MIN_PROMPTS and float(v).is_integer()}


def end_residual(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int) -> np.ndarray:
    """x [P, d_model] float64: each reference prompt's residual stream at END leaving ``layer``."""
    hooks.validate_layer(layer, backend.facts.n_layers)
    if not pairs:
        raise ValueError("the prompt set is empty: a number's direction is read from its prompts")
    X, _ = residual_pass(backend, pairs)
    return X[layer + 1, POSITIONS.index("END")]  # layer l's resid_post is row l + 1 (row 0: the embedding)


def too_few(pairs: Sequence[PromptPair], value: int, have_n: int) -> ValueError:
    have = answer_counts(pairs)
    shown = ", ".join(f"{v} ({n})" for v, n in list(have.items())[:12]) or "none"
    return ValueError(f"{have_n} prompt(s) of the set answer {value}: its direction needs at least {MIN_PROMPTS}; "
                      f"choose one the set answers often enough (its prompts): {shown}")


def class_mean_direction(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, value: int
                         ) -> tuple[np.ndarray, int]:
    """(d_v [d_model] float64 of unit length, the prompts whose answer is ``value``) at ``layer`` (module
    docstring); ValueError when the set has fewer than ``MIN_PROMPTS`` prompts answering ``value``."""
    if not pairs:
        raise ValueError("the prompt set is empty: a number's direction is a mean over its prompts")
    c = target_values(pairs)["C"]
    mine = c == float(value)
    if int(mine.sum()) < MIN_PROMPTS:
        hooks.validate_layer(layer, backend.facts.n_layers)
        raise too_few(pairs, value, int(mine.sum()))
    x = end_residual(backend, pairs, layer)  # [P, d_model]
    d = x[mine].mean(0) - x.mean(0)
    norm = float(np.linalg.norm(d))
    if norm == 0.0:
        raise ValueError(f"every prompt of the set answers {value}: the mean of its class is the set's mean")
    return d / norm, int(mine.sum())


def probe_direction(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, value: int
                    ) -> tuple[np.ndarray, int]:
    """(d_v [d_model] float64 of unit length, the prompts whose answer is ``value``): the logistic probe's direction
    at ``layer`` (module docstring, 6.); ValueError when ``value`` or a second value has too few prompts."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    if not pairs:
        raise ValueError("the prompt set is empty: a probe is fitted on its prompts")
    c = target_values(pairs)["C"]
    have = answer_counts(pairs)
    if value not in have:
        hooks.validate_layer(layer, backend.facts.n_layers)
        raise too_few(pairs, value, int((c == float(value)).sum()))
    if len(have) < 2:
        raise ValueError(f"every prompt the probe can use answers {value}: a probe needs two answers or more")
    keep = np.isin(c, [float(v) for v in have])
    x = end_residual(backend, pairs, layer)[keep]  # [P', d_model]
    scaler = StandardScaler().fit(x)
    fit = LogisticRegression(C=LOGREG_C, solver="newton-cg", tol=PROBE_TOL, max_iter=10_000).fit(
        scaler.transform(x), c[keep])
    W = fit.coef_ if len(fit.classes_) > 2 else np.vstack([-fit.coef_[0] / 2, fit.coef_[0] / 2])  # [K, d_model]
    k = int(np.flatnonzero(fit.classes_ == float(value))[0])
    d = (W[k] - W.mean(0)) / scaler.scale_
    norm = float(np.linalg.norm(d))
    if norm == 0.0:
        raise ValueError(f"the probe's weights for {value} equal the others' mean: it has no direction")
    return d / norm, int(have[value])


#: a number's direction over a set, by the name the page, the command and the notebook give it
DIRECTIONS = {"class-mean": class_mean_direction, "probe": probe_direction}


def number_direction(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, value: int, kind: str
                     ) -> tuple[np.ndarray, int]:
    """``DIRECTIONS[kind]``: (the unit direction of ``value`` at ``layer``, the prompts that answer it)."""
    if kind not in DIRECTIONS:
        raise ValueError(f"no direction {kind!r}: one of {', '.join(DIRECTIONS)}")
    return DIRECTIONS[kind](backend, pairs, layer, value)
