"""Mean-ablation knockouts: does accuracy collapse without the key heads? (Zhang et al. 2024, §4.1, Fig. 3)

A knocked-out component's output is replaced by its **mean over the counterfactual prompts** X_c,
so that it carries no information about the operation while keeping its typical magnitude.

Averaging rule.  Activations are averaged position by position with prompts **aligned at the END**
(right-aligned: offset 0 is the last prompt token, offset 1 the one before ...), separately for each
template; prompts of one template then line up token for token even when a name or object takes a
different number of tokens.  A prompt whose template is not in the set (a typed prompt) gets the
mean over all counterfactual prompts, END-aligned.  An offset that some prompts lack is averaged
over those that have it; one that no prompt has keeps the prompt's own activation.

For heads, the ablated activation is the head's output before W_O (``hook_z``, [batch, pos, head,
d_head]); for MLPs, the MLP output (``hook_mlp_out``).

Validation (Fig. 3): knock out the top-k heads by path-patching effect and compare the accuracy with
knocking out k random heads (many draws: mean and spread), k = 0..K.
"""

from __future__ import annotations

import random
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from engine import hooks
from engine.backend import ModelBackend
from engine.patching import _pad, _pad_id
from engine.prompts import PromptPair

ProgressFn = Callable[[int, int], None]
ALL = "*"


@dataclass(frozen=True)
class Knockout:
    """What to ablate: heads as (layer, head) and whole MLP layers."""

    heads: tuple[tuple[int, int], ...] = ()
    mlps: tuple[int, ...] = ()

    def validate(self, n_layers: int, n_heads: int) -> "Knockout":
        for layer, head in self.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(f"head {layer}.{head} does not exist: layers 0..{n_layers - 1}, "
                                 f"heads 0..{n_heads - 1}")
        for layer in self.mlps:
            if not 0 <= layer < n_layers:
                raise ValueError(f"MLP {layer} does not exist: layers 0..{n_layers - 1}")
        return Knockout(tuple(sorted(set(self.heads))), tuple(sorted(set(self.mlps))))

    @property
    def empty(self) -> bool:
        return not self.heads and not self.mlps


def parse_heads(text: str) -> tuple[tuple[int, int], ...]:
    """``"3.1,5.0"`` -> ((3, 1), (5, 0))."""
    out = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        try:
            layer, head = (int(x) for x in part.split("."))
        except ValueError:
            raise ValueError(f"head {part!r} is not LAYER.HEAD, e.g. 3.1") from None
        out.append((layer, head))
    return tuple(out)


def parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split(",") if p.strip())
    except ValueError:
        raise ValueError(f"MLP list {text!r} is not comma-separated layer numbers, e.g. 4,5") from None


@dataclass
class MeanActivations:
    """END-aligned means over X_c, per template and over all (``*``), stacked by group."""

    groups: list[str]      # group names; index 0 is ``*``
    z: torch.Tensor        # [G, L, T, H, d_head]; offset t counts back from END
    mlp: torch.Tensor      # [G, L, T, d_model]
    count: torch.Tensor    # [G, T] number of prompts that have offset t

    def index(self, template: str | None) -> int:
        try:
            return self.groups.index(template) if template is not None else 0
        except ValueError:
            return 0


_MEMO: dict[tuple[str, str], MeanActivations] = {}


@torch.no_grad()
def mean_activations(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64
                     ) -> MeanActivations:
    """Means of every head's z and every MLP's output over the counterfactual prompts.

    Memoized per (model fingerprint, prompt-set hash): a knockout page re-run reuses them.
    """
    from engine.prompts import prompt_set_hash
    if not pairs:
        raise ValueError("no prompt pairs to average over")
    key = (backend.facts.fingerprint, prompt_set_hash(pairs))
    if key in _MEMO:
        return _MEMO[key]
    L = backend.facts.n_layers
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    T = max(len(p.cf_ids) for p in pairs)
    groups = [ALL] + sorted({p.template for p in pairs})
    gi = {g: i for i, g in enumerate(groups)}
    sums_z: torch.Tensor | None = None
    sums_m: torch.Tensor | None = None
    counts = torch.zeros(len(groups), T)
    pad = _pad_id(backend)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = _pad([p.cf_ids for p in chunk], pad)
        _, c = backend.run_with_cache(ids, mask, names)
        z = torch.stack([c[hooks.attn_z(layer)] for layer in range(L)], 1).float().cpu()  # [b, L, pos, H, dh]
        m = torch.stack([c[hooks.mlp_out(layer)] for layer in range(L)], 1).float().cpu()  # [b, L, pos, d]
        if sums_z is None:
            sums_z = torch.zeros((len(groups), L, T) + tuple(z.shape[3:]))
            sums_m = torch.zeros((len(groups), L, T, m.shape[-1]))
        for i, p in enumerate(chunk):
            n = int(end[i]) + 1
            zi = z[i, :, :n].flip(1)  # [L, n, H, dh], offset 0 = END
            mi = m[i, :, :n].flip(1)
            for g in (0, gi[p.template]):
                sums_z[g, :, :n] += zi
                sums_m[g, :, :n] += mi
                counts[g, :n] += 1
    denom = counts.clamp_min(1)
    out = MeanActivations(groups, sums_z / denom[:, None, :, None, None], sums_m / denom[:, None, :, None], counts)
    if len(_MEMO) > 16:
        _MEMO.clear()
    _MEMO[key] = out
    return out


def _replacement(mean: torch.Tensor, count: torch.Tensor, gidx: torch.Tensor, ends: torch.Tensor,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """END-aligned mean values for a batch, and where they apply.

    mean: [G, T, ...] (one layer), count: [G, T], gidx/ends: [b] -> ([b, width, ...], mask [b, width])
    """
    T = mean.shape[1]
    offs = ends[:, None] - torch.arange(width)[None, :]          # [b, width]: offset from END
    ok = (offs >= 0) & (offs < T)
    offs_c = offs.clamp(0, T - 1)
    ok &= count[gidx[:, None], offs_c] > 0
    return mean[gidx[:, None], offs_c], ok


@contextmanager
def knocked_out(backend: ModelBackend, ko: Knockout, means: MeanActivations,
                templates: Sequence[str | None], ends: Sequence[int]) -> Iterator[None]:
    """Within the block, forward passes of a batch (one template / END index per row) run ablated."""
    ko = ko.validate(backend.facts.n_layers, backend.facts.n_heads)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in ko.heads:
        by_layer[layer].append(head)
    gidx = torch.tensor([means.index(t) for t in templates])
    end_t = torch.tensor(list(ends))

    def z_edit(layer: int, heads: list[int]):
        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, H, d_head]
            repl, ok = _replacement(means.z[:, layer][:, :, heads], means.count, gidx, end_t, act.shape[1])
            ok = ok.to(act.device)[:, :, None, None]
            act[:, :, heads] = torch.where(ok, repl.to(act.device, act.dtype), act[:, :, heads])
            return act
        return fn

    def mlp_edit(layer: int):
        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model]
            repl, ok = _replacement(means.mlp[:, layer], means.count, gidx, end_t, act.shape[1])
            return torch.where(ok.to(act.device)[:, :, None], repl.to(act.device, act.dtype), act)
        return fn

    edits = [(hooks.attn_z(layer), z_edit(layer, hs)) for layer, hs in sorted(by_layer.items())]
    edits += [(hooks.mlp_out(layer), mlp_edit(layer)) for layer in ko.mlps]
    with backend.hooks(edits):
        yield


@torch.no_grad()
def knockout_accuracy(backend: ModelBackend, pairs: Sequence[PromptPair], ko: Knockout,
                      means: MeanActivations, *, batch_size: int = 128) -> float:
    """First-token accuracy of the reference prompts with ``ko`` ablated."""
    if not pairs:
        raise ValueError("no prompt pairs")
    pad = _pad_id(backend)
    right = 0
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = _pad([p.ref_ids for p in chunk], pad)
        with knocked_out(backend, ko, means, [p.template for p in chunk], end.tolist()):
            lg = backend.logits(ids, mask)
        pred = lg[torch.arange(len(chunk)), end.to(lg.device)].argmax(-1).cpu()
        right += int((pred == torch.tensor([p.answer_id for p in chunk])).sum())
    return right / len(pairs)


@dataclass(frozen=True)
class TokenProb:
    token: str
    token_id: int
    prob: float


@torch.no_grad()
def top_next_tokens(backend: ModelBackend, ids: Sequence[int], *, k: int = 5, ko: Knockout | None = None,
                    means: MeanActivations | None = None) -> list[TokenProb]:
    """The k most likely next tokens after ``ids`` (optionally under a knockout)."""
    x = torch.tensor([list(ids)])
    if ko is not None and not ko.empty:
        if means is None:
            raise ValueError("a knockout needs mean activations")
        with knocked_out(backend, ko, means, [None], [len(ids) - 1]):
            lg = backend.logits(x)
    else:
        lg = backend.logits(x)
    p = torch.softmax(lg[0, -1].float(), -1)
    vals, idx = p.topk(min(k, p.shape[0]))
    toks = backend.tokenizer.convert_ids_to_tokens(idx.tolist())
    return [TokenProb(str(t), int(i), float(v)) for t, i, v in zip(toks, idx.tolist(), vals.tolist())]


@dataclass(frozen=True)
class CurvePoint:
    k: int
    top_accuracy: float
    random_mean: float
    random_std: float
    random_min: float
    random_max: float


def knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]],
                   means: MeanActivations, *, k_max: int, draws: int = 10, seed: int = 0,
                   progress: ProgressFn | None = None) -> list[CurvePoint]:
    """Fig. 3: accuracy after knocking out the top-k heads (effect rank) vs k random heads."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    if k_max < 0:
        raise ValueError("k_max must be >= 0")
    if k_max > L * H:
        raise ValueError(f"k_max={k_max} exceeds the model's {L * H} heads")
    if draws < 1:
        raise ValueError("draws must be >= 1")
    rng = random.Random(seed)
    every = [(layer, h) for layer in range(L) for h in range(H)]
    out = []
    total = (k_max + 1) * (draws + 1)
    done = 0
    for k in range(k_max + 1):
        top = knockout_accuracy(backend, pairs, Knockout(tuple(ranked_heads[:k])), means)
        rand = []
        for _ in range(draws):
            rand.append(knockout_accuracy(backend, pairs, Knockout(tuple(rng.sample(every, k))), means))
            done += 1
        done += 1
        t = torch.tensor(rand)
        out.append(CurvePoint(k, top, float(t.mean()), float(t.std(unbiased=False)), float(t.min()),
                              float(t.max())))
        if progress is not None:
            progress(done, total)
    return out


def cached_knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair],
                          ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                          cache=None, progress: ProgressFn | None = None) -> tuple[list[CurvePoint], bool]:
    """:func:`knockout_curve` through the result cache: (points, computed)."""
    from cache import ResultRow
    from engine.cached import run_cached

    def compute():
        pts = knockout_curve(backend, pairs, ranked_heads, mean_activations(backend, pairs), k_max=k_max,
                             draws=draws, seed=seed, progress=progress)
        return [ResultRow(layer=p.k, head=None, label=None, metric=m, value=getattr(p, m))
                for p in pts for m in ("top_accuracy", "random_mean", "random_std", "random_min", "random_max")], None

    params = {"ranked": [list(h) for h in ranked_heads[:k_max]], "k_max": k_max, "draws": draws, "seed": seed,
              "dtype": backend.facts.dtype, "ablation": "mean over X_c, per template, END-aligned"}
    rows, _, computed = run_cached(backend, pairs, "knockout_curve", params, compute, cache)
    by_k: dict[int, dict[str, float]] = defaultdict(dict)
    for r in rows:
        by_k[int(r.layer)][r.metric] = float(r.value)
    return [CurvePoint(k, **v) for k, v in sorted(by_k.items())], computed
