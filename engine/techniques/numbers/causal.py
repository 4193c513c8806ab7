"""The causal check: does moving the END residual along a class-mean direction move the answer?

**4. Causal check.**  At the layer l* where C first decodes at END (logistic score ≥ ``DECODE_THRESHOLD``;
the best layer when none reaches it; never the embedding), with μ_c the mean of x[l*, END] over the
prompts whose C = c (values kept as for the probe, :func:`class_folds`): for each prompt i (C_i = c), a target
c' drawn (seeded) among the kept values whose first answer token differs from c's, the END residual leaving layer l* is
replaced by x + (μ_c' - μ_c) (a hook on ``resid_post[l*]`` at END only), and the rest of the model runs.
success = fraction of prompts whose top next token is c's' first answer token; stays = fraction whose
top token is still C's first token.  Control (``random``): the same norm ||μ_c' - μ_c|| along a random
Gaussian direction (seeded).  relative_norm = mean ||μ_c' - μ_c|| / ||x[l*, END]||.  A probe can read
C from directions the model does not use; a shift that moves the answer shows a direction it does.  Whether the
model uses the *helix* (not only a class-mean direction) is :mod:`engine.techniques.helix_patch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair, answer_tokens
from engine.prompts.templates import TEMPLATES_BY_ID
from engine.techniques.numbers.activations import (
    METHOD,
    POSITIONS,
    VERSION,
    residual_pass,
    residual_pass_work,
    target_values,
)
from engine.techniques.numbers.probes import FOLDS, MIN_FOLDS, NumberRow, class_folds, first_decode_layer
from engine.techniques.numbers.shifts import shifted_readouts, shifts_work


@dataclass(frozen=True)
class CausalRow:
    layer: int
    method: str          # class-means (μ_c' - μ_c) | random (same norm, random direction)
    n_prompts: int
    success: float       # top token becomes C''s first token
    stays: float         # top token stays C's first token
    relative_norm: float  # mean ||shift|| / ||x[l*, END]||


def value_token(backend: ModelBackend, pair: PromptPair, value: float) -> int:
    """The first token of ``value`` as the answer of ``pair``'s prompt (the answer-token rule)."""
    tpl = TEMPLATES_BY_ID.get(pair.template)
    v = int(value) if float(value).is_integer() else value
    return answer_tokens(backend.tokenizer, pair.ref_text, v, getattr(tpl, "answer_sep", " ")).answer_id


@dataclass
class CausalPlan:
    """Which prompts are moved where: prompt indices, their C' and token ids, and the shifts [n, d]."""

    idx: list[int]
    target: list[float]
    target_token: list[int]
    shift: np.ndarray   # [n, d] class-mean shift
    random: np.ndarray  # [n, d] same norms, random directions


def causal_plan(backend: ModelBackend, pairs: Sequence[PromptPair], X: np.ndarray, seed: int = 0) -> CausalPlan:
    """X [P, d]: the END residual at l*.  C' per prompt and the shifts (module docstring, 4)."""
    c = target_values(pairs)["C"]
    keep = class_folds(c)[1]
    vals = np.unique(c[keep])
    mu = {float(v): X[c == v].mean(0) for v in vals}
    tok = {float(v): value_token(backend, pairs[int(np.flatnonzero(c == v)[0])], float(v)) for v in vals}
    rng = np.random.default_rng(seed)
    idx, tgt, ttok, shift = [], [], [], []
    for i in np.flatnonzero(keep):
        ci = float(c[i])
        cand = [float(v) for v in vals if float(v) != ci and tok[float(v)] != pairs[i].answer_id]
        if not cand:
            continue
        cp = cand[int(rng.integers(len(cand)))]
        idx.append(int(i))
        tgt.append(cp)
        ttok.append(value_token(backend, pairs[i], cp))
        shift.append(mu[cp] - mu[ci])
    if not idx:
        raise ValueError("no prompt has another answer value with a different first token: the causal check "
                         "needs answers that start with different tokens (use more prompts per operation or add "
                         "operations)")
    S = np.stack(shift)
    G = rng.standard_normal(S.shape)
    G *= (np.linalg.norm(S, axis=1) / np.linalg.norm(G, axis=1))[:, None]
    return CausalPlan(idx, tgt, ttok, S, G)


def causal_check(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, *, seed: int = 0,
                 progress: ProgressFn | None = None) -> list[CausalRow]:
    """The causal check of the module docstring at ``layer`` (≥ 0)."""
    hooks.validate_layer(layer, backend.facts.n_layers)
    X, lg = residual_pass(backend, pairs)
    X = X[layer + 1, POSITIONS.index("END")]  # [P, d]
    plan = causal_plan(backend, pairs, X, seed)
    moved = [pairs[i] for i in plan.idx]
    clean = np.array([p.answer_id for p in moved])
    want = np.array(plan.target_token)
    rel = float((np.linalg.norm(plan.shift, axis=1) / np.linalg.norm(X[plan.idx], axis=1)).mean())
    runs = shifted_readouts(backend, pairs, layer, None, [plan.shift, plan.random], end_logits=lg, idx=plan.idx)
    out = [CausalRow(layer, name, len(moved), float((top == want).mean()), float((top == clean).mean()), rel)
           for name, (top, _) in zip(("class-means", "random"), runs)]
    if progress is not None:
        progress(2, 2)
    return out


def causal_check_work(backend: ModelBackend, pairs: Sequence[PromptPair]):
    """The forward work of :func:`causal_check` (``engine.cost.Work``): the residual pass and two shifts."""
    return residual_pass_work(backend, pairs) + shifts_work(backend, pairs, 2)


def causal_layer(rows: Sequence[NumberRow]) -> int:
    """l*: the first layer ≥ 0 where C decodes at END, else the best such layer."""
    mine = [r for r in rows if r.method == "logistic" and r.target == "C" and r.position == "END" and r.layer >= 0]
    if not mine:
        raise ValueError("the causal check needs the probe of C at END on at least one layer >= 0")
    first = first_decode_layer(mine)
    return first if first is not None else max(mine, key=lambda r: (r.score, -r.layer)).layer


def cached_causal_check(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, *, seed: int = 0,
                        cache=None, progress: ProgressFn | None = None) -> tuple[list[CausalRow], bool]:
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "layer": layer, "seed": seed,
              "folds": [MIN_FOLDS, FOLDS]}
    rows, _, computed = run_cached_rows(backend, pairs, METHOD + "_causal", params,
                                        lambda: (causal_check(backend, pairs, layer, seed=seed, progress=progress),
                                                 None),
                                        CausalRow, ("success", "stays", "relative_norm"), cache)
    return rows, computed
