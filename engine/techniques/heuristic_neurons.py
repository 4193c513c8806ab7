"""Heuristic neurons: which MLP neurons react to the operation, and what over the operand grid predicts them.

Nikankin et al. (ICLR 2025) explain arithmetic in LLMs as "a bag of heuristics": sparse MLP neurons each firing for
an operand or result range, a result modulo k, a digit pattern.  Here, on the operand grid of one template
(:mod:`engine.techniques.operand_grid`: every (A, B) of the set's range, the set's counterfactual):

1. **Layer.**  The MLP whose mean path-patching value over the grid is the most negative (or the one given).
2. **Neurons.**  Its hidden activations at END on X_r and on X_c (hook ``mlp_post``, one pass each per batch); the
   neurons ranked by the mean |act(X_r) - act(X_c)| over the grid -- those that react to the operation -- top ``n``.
3. **Tags.**  Each heuristic h is a feature map phi_h(A, B) of the grid (C = the answer): ``result range`` and
   ``operand A range`` / ``operand B range`` (the indicator of the best window [lo, hi], chosen on the fitting
   half), ``result mod k`` for k in 2, 5, 10 (one-hot), ``result tens digit`` (one-hot), ``result value`` (one-hot
   of C: any function of the result, the most general result heuristic), ``identical operands``
   (A = B), and ``linear`` (A, B, C).  The activation over the grid is fitted by least squares on phi_h (with an
   intercept) on a seeded half of the pairs and scored by R^2 on the other half; a neuron's tag is the heuristic
   with the highest held-out R^2, *tagged* when that R^2 >= :data:`TAG_R2`.

Exact in what it computes (activations from the model's own forward; plain least squares, numpy); the tags are a
description fitted to half the grid and scored on the rest, not a causal claim.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import pad, pad_id
from engine.numerics.intervals import Interval
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptError, PromptPair

#: A neuron whose best heuristic reaches this held-out R^2 is tagged (the issue's threshold).
TAG_R2 = 0.5
SPLIT_SEED = 0


@dataclass(frozen=True)
class NeuronTag:
    layer: int
    neuron: int
    reaction: float   # mean |act(X_r) - act(X_c)| at END over the grid
    tag: str          # the heuristic with the highest held-out R^2
    r2: float         # its held-out R^2
    tagged: bool      # r2 >= TAG_R2


def _window(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The window [lo, hi] of x whose indicator best fits y (least squares, on the given rows)."""
    vals = np.unique(x)
    best, arg = -np.inf, (vals[0], vals[-1])
    for i, lo in enumerate(vals):
        for hi in vals[i:]:
            ind = ((x >= lo) & (x <= hi)).astype(float)
            if ind.std() == 0:
                continue
            r = np.corrcoef(ind, y)[0, 1] ** 2
            if r > best:
                best, arg = r, (lo, hi)
    return arg


def _onehot(v: np.ndarray, values: np.ndarray) -> np.ndarray:
    return (v[:, None] == values[None, :]).astype(float)


def heuristics(a: np.ndarray, b: np.ndarray, c: np.ndarray
               ) -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """name -> features(rows, y): the feature matrix of the grid rows ``rows``; windows are chosen on the fitting rows
    (``y`` their activations), then applied to every row."""
    def window(x: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def features(fit: np.ndarray, y: np.ndarray) -> np.ndarray:
            lo, hi = _window(x[fit], y)
            return ((x >= lo) & (x <= hi)).astype(float)[:, None]
        return features

    def fixed(m: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        return lambda fit, y: m
    out = {"result range": window(c), "operand A range": window(a), "operand B range": window(b)}
    for k in (2, 5, 10):
        out[f"result mod {k}"] = fixed(_onehot(np.mod(c, k), np.arange(k)))
    out["result tens digit"] = fixed(_onehot((np.abs(c) // 10) % 10, np.arange(10)))
    out["result value"] = fixed(_onehot(c, np.unique(c)))
    out["identical operands"] = fixed((a == b).astype(float)[:, None])
    out["linear"] = fixed(np.stack([a, b, c], 1).astype(float))
    return out


def held_out_r2(features: np.ndarray, y: np.ndarray, fit: np.ndarray, test: np.ndarray) -> float:
    """R^2 on ``test`` of the least-squares fit of y on the features (and an intercept) over ``fit``: the fitting rows
    centred, the minimum-norm solution, so a test row of a class the fitting half lacks gets the fitting mean."""
    x_mean, y_mean = features[fit].mean(0), y[fit].mean()
    coef, *_ = np.linalg.lstsq(features[fit] - x_mean, y[fit] - y_mean, rcond=None)
    resid = y[test] - (y_mean + (features[test] - x_mean) @ coef)
    ss = ((y[test] - y[test].mean()) ** 2).sum()
    return float(1 - (resid ** 2).sum() / ss) if ss > 0 else float("nan")


def tag_neuron(a: np.ndarray, b: np.ndarray, c: np.ndarray, y: np.ndarray, seed: int = SPLIT_SEED
               ) -> tuple[str, float]:
    """(heuristic, held-out R^2) of the best heuristic for activations ``y`` over the grid (a, b, c)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    fit, test = np.sort(order[: len(y) // 2]), np.sort(order[len(y) // 2:])
    scores = {name: held_out_r2(f(fit, y[fit]), y, fit, test) for name, f in heuristics(a, b, c).items()}
    scores = {k: v for k, v in scores.items() if v == v}
    if not scores:
        return "none", float("nan")
    name = max(scores, key=scores.get)
    return name, scores[name]


@torch.no_grad()
def end_activations(backend: ModelBackend, ids: Sequence[Sequence[int]], layer: int, *, batch_size: int = 64
                    ) -> torch.Tensor:
    """The MLP's hidden activation at END of each prompt: [P, d_mlp]."""
    from engine.techniques.operand_grid import check_hidden
    out = []
    for s in range(0, len(ids), batch_size):
        chunk = ids[s:s + batch_size]
        x, mask, end = pad(chunk, pad_id(backend))
        c = backend.activations(x, mask, [hooks.mlp_post(layer)])  # no logits read: one position unembedded
        act = check_hidden(backend, c[hooks.mlp_post(layer)])           # [batch, pos, d_mlp]
        out.append(act[torch.arange(len(chunk)), end.to(act.device)].float().cpu())
    return torch.cat(out)


def heuristic_neurons(backend: ModelBackend, spec, *, layer: int | None = None, top: int = 20,
                      template: str | None = None, cache=None, progress: ProgressFn | None = None
                      ) -> tuple[list[NeuronTag], int]:
    """The top ``top`` neurons of ``layer`` (default: the grid's strongest MLP) with their tags; and the layer.
    Through the result cache (the grid's pairs, the layer and ``top``)."""
    from dataclasses import replace

    from engine.results import run_cached
    from engine.techniques.operand_grid import grid_pairs, grid_template, operand_grid
    grid = operand_grid(backend, spec, template=template, cache=cache, progress=progress)
    if layer is None:
        layer = int(grid.mlp_effect.nan_to_num().mean(0).argmin())
    if not 0 <= layer < backend.facts.n_layers:
        raise PromptError(f"the model has layers 0-{backend.facts.n_layers - 1}, not {layer}")
    pairs: list[PromptPair] = grid_pairs(backend.tokenizer, replace(spec, balance=False),
                                         grid_template(spec, template))

    def compute():
        act_r = end_activations(backend, [p.ref_ids for p in pairs], layer)            # [P, d_mlp]
        act_c = end_activations(backend, [p.cf_ids for p in pairs], layer)
        reaction = (act_r - act_c).abs().mean(0)                                        # [d_mlp]
        a, b, c = (np.array(v, dtype=float) for v in (grid.a, grid.b, grid.answer))
        out = []
        for n in torch.argsort(reaction, descending=True)[:top].tolist():
            tag, r2 = tag_neuron(a, b, c, act_r[:, n].double().numpy())
            out.append(NeuronTag(layer, n, float(reaction[n]), tag, r2, bool(r2 >= TAG_R2)))
        return [], {"tags": [{k: stored(v) for k, v in asdict(t).items()} for t in out]}

    _, art, _ = run_cached(backend, pairs, "heuristic_neurons", tags_params(backend, layer, top), compute, cache)
    tags = [NeuronTag(**{k: read(v) if k in ("reaction", "r2") else v for k, v in t.items()}) for t in art["tags"]]
    return tags, layer


def stored(x):
    """A number as the cache's JSON holds it: NaN as null."""
    return None if isinstance(x, float) and x != x else x


def read(x) -> float:
    """:func:`stored`'s number back: null as NaN."""
    return float("nan") if x is None else float(x)


def tags_params(backend: ModelBackend, layer: int, top: int) -> dict:
    """The cache parameters of :func:`heuristic_neurons`' tags."""
    return {"layer": layer, "top": top, "tag_r2": TAG_R2, "split_seed": SPLIT_SEED, "dtype": backend.facts.dtype}


def heuristic_neurons_work(backend: ModelBackend, spec, *, layer: int | None = None, top: int = 20,
                           template: str | None = None, cache=None):
    """The forward work of :func:`heuristic_neurons` (``engine.cost.Work``) and the grid's pairs: the grid's
    (:func:`~engine.techniques.operand_grid.operand_grid_work`) and, unless cached, one pass of X_r and one of X_c
    for the layer's activations (END unembedded) (the layer: the one given, else counted once the grid is cached)."""
    from engine.cost import padded_passes, unless_cached
    from engine.results import NotCached, cache_only, run_cached
    from engine.techniques.operand_grid import operand_grid, operand_grid_work
    w, pairs = operand_grid_work(backend, spec, template=template, cache=cache)
    passes = padded_passes([p.ref_ids for p in pairs], 64) + padded_passes([p.cf_ids for p in pairs], 64)
    if layer is None:
        try:
            with cache_only():
                grid = operand_grid(backend, spec, template=template, cache=cache)
            layer = int(grid.mlp_effect.nan_to_num().mean(0).argmin())
        except NotCached:
            return w + passes, pairs
    return w + unless_cached(lambda: run_cached(backend, pairs, "heuristic_neurons", tags_params(backend, layer, top),
                                                lambda: ([], {}), cache),
                             lambda: passes), pairs


# ---------------------------------------------------------------------------------------------
# the tagged neurons as a circuit: faithfulness and steering
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NeuronCircuit:
    """The tagged neurons of one layer as a circuit, on the grid's pairs the model answers right."""

    layer: int
    neurons: tuple[int, ...]
    n_pairs: int
    faithfulness: Interval  # f = (m(C) - m(0)) / (m(M) - m(0)), m = answer logit - mean logit at END
    n_steer: int
    steering: Interval      # share of pairs whose first answer token becomes the target's
    layer_effect: Interval  # m(M) - m(0): what mean-ablating every neuron of the layer at END costs the margin

    @property
    def measurable(self) -> bool:
        """f divides by ``layer_effect``: it means something only where that interval lies wholly above 0 (the layer's
        neurons matter at END at all); else f is a ratio of noise to about nothing and is not reported as a result."""
        return self.layer_effect.above(0.0) is True


@torch.no_grad()
def end_margins(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int,
                 replace_end: torch.Tensor | None, *, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, (answer logit - mean logit, the top first token) at END, with the layer's hidden activation at END
    replaced by ``replace_end`` [P, d_mlp] where it is not NaN (None: the model as it is)."""
    margins, tops = [], []
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_id(backend))
        rows = torch.arange(len(chunk))
        edits = []
        if replace_end is not None:
            new = replace_end[s:s + len(chunk)]

            def fn(act: torch.Tensor, new=new, end=end, rows=rows) -> torch.Tensor:  # act: [batch, pos, d_mlp]
                act = act.clone()
                cur = act[rows, end.to(act.device)]
                val = new.to(act.device, act.dtype)
                act[rows, end.to(act.device)] = torch.where(torch.isnan(val), cur, val)
                return act
            edits = [(hooks.mlp_post(layer), fn)]
        with backend.hooks(edits):
            lg = backend.logits_at(ids, mask, end[:, None])[:, 0].float().cpu()  # [batch, vocab]: END unembedded
        ans = torch.tensor([p.answer_id for p in chunk])
        margins.append((lg[rows, ans] - lg.mean(-1)).double().numpy())
        tops.append(lg.argmax(-1).numpy())
    return np.concatenate(margins), np.concatenate(tops)


def neuron_circuit_work(backend: ModelBackend, spec, tags: Sequence[NeuronTag], *, template: str | None = None,
                        cache=None):
    """The forward work of :func:`neuron_circuit` (``engine.cost.Work``) and the grid's pairs: unless cached, the
    layer's activations on X_r and X_c and four passes for the margins (at most every pair each; END unembedded)."""
    from dataclasses import replace

    from engine.cost import padded_passes, unless_cached
    from engine.techniques.operand_grid import grid_pairs, grid_template
    pairs = grid_pairs(backend.tokenizer, replace(spec, balance=False), grid_template(spec, template))
    ref = padded_passes([p.ref_ids for p in pairs], 64)
    return unless_cached(lambda: neuron_circuit(backend, spec, tags, template=template, cache=cache),
                         lambda: ref * 5 + padded_passes([p.cf_ids for p in pairs], 64)), pairs


def neuron_circuit(backend: ModelBackend, spec, tags: Sequence[NeuronTag], *, template: str | None = None,
                   cache=None) -> NeuronCircuit:
    """The tagged neurons of ``tags`` as a circuit, on the grid's pairs the model answers right.

    * **Faithfulness.**  Every other neuron of the layer takes its mean activation over the grid's X_c at END (mean
      ablation over the counterfactuals, at the position the answer is read); the tagged ones keep their own.  m =
      answer logit - mean logit at END; f = (m(C) - m(0)) / (m(M) - m(0)) with 0 = every neuron of the layer
      mean-ablated and M = the model, means over the pairs, its interval a bootstrap over the pairs.  It is
      :attr:`NeuronCircuit.measurable` only where the interval of m(M) - m(0) lies above 0.
    * **Steering.**  For each pair, the target is the next answer of the grid (in grid order) with another first
      token; the tagged neurons are set to their mean activation at END over the grid's X_r with that answer; a
      success is the model's top first token becoming the target's.  The share and its bootstrap interval.

    Through the result cache (the grid's pairs, the layer and the tagged neurons).
    """
    from dataclasses import replace

    from engine.results import run_cached
    from engine.techniques.operand_grid import grid_pairs, grid_template
    neurons = tuple(t.neuron for t in tags if t.tagged)
    if not neurons:
        raise PromptError(f"no neuron is tagged at R² ≥ {TAG_R2}: there is no circuit to check")
    layer = tags[0].layer
    all_pairs = grid_pairs(backend.tokenizer, replace(spec, balance=False), grid_template(spec, template))

    def compute():
        c = _neuron_circuit(backend, all_pairs, layer, neurons)
        parts = (("faithfulness", c.faithfulness), ("steering", c.steering), ("layer_effect", c.layer_effect))
        return [], {"n_pairs": c.n_pairs, "n_steer": c.n_steer,
                    **{name: [stored(i.value), stored(i.low), stored(i.high)] for name, i in parts}}

    params = {"layer": layer, "neurons": list(neurons), "dtype": backend.facts.dtype, "v": 1}
    _, art, _ = run_cached(backend, all_pairs, "neuron_circuit", params, compute, cache)
    faith, steer, effect = (Interval(*(read(x) for x in art[k])) for k in ("faithfulness", "steering", "layer_effect"))
    return NeuronCircuit(layer, neurons, int(art["n_pairs"]), faith, int(art["n_steer"]), steer, effect)


def _neuron_circuit(backend: ModelBackend, all_pairs: Sequence[PromptPair], layer: int, neurons: tuple[int, ...]
                    ) -> NeuronCircuit:
    """:func:`neuron_circuit`'s computation on the grid's pairs ``all_pairs``."""
    from engine.numerics.intervals import interval, mean_intervals
    act_r = end_activations(backend, [p.ref_ids for p in all_pairs], layer)        # [P, d_mlp]
    act_c = end_activations(backend, [p.cf_ids for p in all_pairs], layer)
    m_full, top = end_margins(backend, all_pairs, layer, None)
    right = np.array([t == p.answer_id for t, p in zip(top, all_pairs)])
    pairs = [p for p, ok in zip(all_pairs, right) if ok]
    if len(pairs) < 2:
        raise PromptError("the model answers fewer than 2 pairs of the grid right: no faithfulness to measure")
    idx = torch.tensor(np.flatnonzero(right))
    mean_c = act_c.mean(0)                                                          # [d_mlp]
    empty = mean_c.expand(len(pairs), -1).clone()
    circuit = empty.clone()
    keep = torch.tensor(neurons)
    circuit[:, keep] = act_r[idx][:, keep]
    m_m = m_full[right]
    m_0, _ = end_margins(backend, pairs, layer, empty)
    m_c, _ = end_margins(backend, pairs, layer, circuit)

    def f(i: np.ndarray) -> float:
        den = m_m[i].mean() - m_0[i].mean()
        return float((m_c[i].mean() - m_0[i].mean()) / den) if den != 0 else float("nan")
    faith = interval(f, len(pairs))
    layer_effect = interval(lambda i: float(m_m[i].mean() - m_0[i].mean()), len(pairs))

    by_answer: dict = {}
    for i, p in enumerate(all_pairs):
        by_answer.setdefault(p.answer, []).append(i)
    steer_pairs, targets = [], []
    n_all = len(all_pairs)
    for i in np.flatnonzero(right):
        p = all_pairs[i]
        j = next((k for k in range(1, n_all) if all_pairs[(i + k) % n_all].answer_id != p.answer_id), None)
        if j is not None:
            steer_pairs.append(p)
            targets.append(all_pairs[(i + j) % n_all])
    if not steer_pairs:
        raise PromptError("every pair of the grid has the same answer token at the digit read, so there is no other "
                          "answer to steer towards: read another answer digit or choose other operands")
    new = torch.full((len(steer_pairs), act_r.shape[1]), float("nan"))
    for i, t in enumerate(targets):
        new[i, keep] = act_r[by_answer[t.answer]][:, keep].mean(0)
    _, top_s = end_margins(backend, steer_pairs, layer, new)
    success = np.array([int(t == g.answer_id) for t, g in zip(top_s, targets)], dtype=float)
    mean, lo, hi = mean_intervals(success[:, None])
    return NeuronCircuit(layer, neurons, len(pairs), faith, len(steer_pairs),
                         Interval(float(mean[0]), float(lo[0]), float(hi[0])), layer_effect)


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine heuristic-neurons``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """The top neurons of one MLP layer with their heuristic tags -> CSV."""
    with ctx.progress("heuristic neurons") as bar:
        rows, layer = heuristic_neurons(ctx.model, ctx.spec(), layer=args.layer, top=args.top,
                                        template=args.grid_template, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    tagged = [r for r in rows if r.tagged]
    out = {"out": str(args.out), "layer": layer, "neurons": len(rows), "tagged": len(tagged),
           "tags": sorted({r.tag for r in tagged}), "threshold_r2": TAG_R2}
    if tagged:
        c = neuron_circuit(ctx.model, ctx.spec(), rows, template=args.grid_template)
        out["circuit"] = {"neurons": list(c.neurons), "pairs": c.n_pairs,
                          "faithfulness": [c.faithfulness.value, c.faithfulness.low, c.faithfulness.high],
                          "layer_effect": [c.layer_effect.value, c.layer_effect.low, c.layer_effect.high],
                          "faithfulness_measurable": c.measurable,
                          "steering_pairs": c.n_steer,
                          "steering_success": [c.steering.value, c.steering.low, c.steering.high]}
    return out
