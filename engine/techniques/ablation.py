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
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.progress import ProgressFn, current_check
from engine.prompts.pairs import PromptPair
from engine.techniques.batching import TOKENS_PER_PASS, length_chunks, pad, pad_id

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


def parse_heads(text: str, *, required: bool = False) -> tuple[tuple[int, int], ...]:
    """``"3.1,5.0"`` -> ((3, 1), (5, 0)); repeats dropped.  ``required``: an empty list is an error too.

    The one parser of head lists (CLI knockout/finetune, pages); a ValueError names the bad part."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        bits = part.split(".")
        if len(bits) != 2 or not all(b.isdigit() for b in bits):
            raise ValueError(f"bad head {part!r}: write heads as LAYER.HEAD, e.g. 3.1,5.0")
        out.append((int(bits[0]), int(bits[1])))
    if required and not out:
        raise ValueError("no heads given: write heads as LAYER.HEAD, e.g. 3.1,5.0")
    return tuple(dict.fromkeys(out))


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
    from engine.prompts.pairs import prompt_set_hash
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
    pad_token = pad_id(backend)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.cf_ids for p in chunk], pad_token)
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


def head_masks(kos: Sequence[Knockout], n_layers: int, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which heads / MLPs each knockout ablates: ([n, L, H] bool, [n, L] bool)."""
    heads = torch.zeros(len(kos), n_layers, n_heads, dtype=torch.bool)
    mlps = torch.zeros(len(kos), n_layers, dtype=torch.bool)
    for i, ko in enumerate(kos):
        for layer, head in ko.heads:
            heads[i, layer, head] = True
        for layer in ko.mlps:
            mlps[i, layer] = True
    return heads, mlps


@contextmanager
def knocked_out_rows(backend: ModelBackend, head_mask: torch.Tensor, mlp_mask: torch.Tensor,
                     means: MeanActivations, templates: Sequence[str | None], ends: Sequence[int]
                     ) -> Iterator[None]:
    """Within the block, forward passes run with a knockout **per row** of the batch.

    head_mask: [batch, L, H] bool (row r ablates head (l, h) where True); mlp_mask: [batch, L];
    templates / ends: one per row (which means apply, END-aligned).  Rows of one batch may carry
    different knockouts, so several knockout sets share one forward pass.
    """
    gidx = torch.tensor([means.index(t) for t in templates])
    end_t = torch.tensor(list(ends))
    L = backend.facts.n_layers

    def z_edit(layer: int):
        rows_heads = head_mask[:, layer]  # [batch, H]

        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, H, d_head]
            repl, ok = _replacement(means.z[:, layer], means.count, gidx, end_t, act.shape[1])
            where = (ok[:, :, None] & rows_heads[:, None, :]).to(act.device)[..., None]  # [batch, pos, H, 1]
            return torch.where(where, repl.to(act.device, act.dtype), act)
        return fn

    def mlp_edit(layer: int):
        rows_on = mlp_mask[:, layer]  # [batch]

        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model]
            repl, ok = _replacement(means.mlp[:, layer], means.count, gidx, end_t, act.shape[1])
            where = (ok & rows_on[:, None]).to(act.device)[:, :, None]  # [batch, pos, 1]
            return torch.where(where, repl.to(act.device, act.dtype), act)
        return fn

    edits = [(hooks.attn_z(layer), z_edit(layer)) for layer in range(L) if bool(head_mask[:, layer].any())]
    edits += [(hooks.mlp_out(layer), mlp_edit(layer)) for layer in range(L) if bool(mlp_mask[:, layer].any())]
    check = current_check()
    if check is not None:  # a stop request ends the pass at the next layer, not at its end

        def probe(act: torch.Tensor) -> None:
            check()
        edits += [(hooks.resid_pre(layer), probe) for layer in range(L)]
    with backend.hooks(edits):
        yield


@contextmanager
def knocked_out(backend: ModelBackend, ko: Knockout, means: MeanActivations,
                templates: Sequence[str | None], ends: Sequence[int]) -> Iterator[None]:
    """Within the block, forward passes of a batch (one template / END index per row) run ablated."""
    ko = ko.validate(backend.facts.n_layers, backend.facts.n_heads)
    heads, mlps = head_masks([ko], backend.facts.n_layers, backend.facts.n_heads)
    n = len(templates)
    with knocked_out_rows(backend, heads.expand(n, -1, -1), mlps.expand(n, -1), means, templates, ends):
        yield


CALL_MACS_PER_LAYER = 15e6  # a forward call's fixed cost (hook dispatch, per layer), in multiply-accumulates


def _padding_pays(backend: ModelBackend, pairs: Sequence[PromptPair], n_sets: int, n_chunks: int,
                  tokens_per_pass: int) -> bool:
    """True when one padded pass of every set costs less than one pass per prompt length: the work
    fits one pass and the padding's multiply-accumulates are fewer than the calls it saves (a small
    model, where a call's fixed cost dominates)."""
    from engine.backends.base import macs_per_position
    width = max(len(p.ref_ids) for p in pairs)
    if n_chunks <= 1 or n_sets * len(pairs) * width > tokens_per_pass:
        return False
    body, _, _ = macs_per_position(backend.facts)
    waste = n_sets * (len(pairs) * width - sum(len(p.ref_ids) for p in pairs)) * body
    return waste < (n_chunks - 1) * backend.facts.n_layers * CALL_MACS_PER_LAYER


def distinct_knockouts(kos: Sequence[Knockout], n_layers: int, n_heads: int) -> list[Knockout]:
    """The distinct knockout sets among ``kos`` (validated, so order and repeats do not matter)."""
    return list(dict.fromkeys(ko.validate(n_layers, n_heads) for ko in kos))


@torch.no_grad()
def knockout_accuracies(backend: ModelBackend, pairs: Sequence[PromptPair], kos: Sequence[Knockout],
                        means: MeanActivations, *, sets_per_pass: int | None = None,
                        tokens_per_pass: int = TOKENS_PER_PASS,
                        progress: ProgressFn | None = None) -> list[float]:
    """First-token accuracy of the reference prompts under each knockout of ``kos``.

    Each **distinct** knockout set is evaluated once, reading only the END position's logits.  The
    prompts go in chunks of equal length (no padding, see :func:`length_chunks`), and several sets
    share one forward pass (the chunk repeated, each copy with its own head mask): ``sets_per_pass``
    of them, or as many as fit ``tokens_per_pass``.  So the forward passes number, per chunk,
    ceil(distinct sets / sets per pass).  Work that fits one pass anyway (every set x every prompt,
    padded, within ``tokens_per_pass``; ``sets_per_pass`` not given) is one padded pass when the
    padding costs less than the calls it saves (:func:`_padding_pays`: a small model).
    ``progress(done, total)`` is called after every pass
    (chunk x knockout-set evaluations so far); an exception raised there stops the computation.
    """
    if not pairs:
        raise ValueError("no prompt pairs")
    L, H = backend.facts.n_layers, backend.facts.n_heads
    valid = [ko.validate(L, H) for ko in kos]
    distinct = distinct_knockouts(valid, L, H)
    if not distinct:
        return []
    answers = torch.tensor([p.answer_id for p in pairs])
    right = torch.zeros(len(distinct), dtype=torch.long)
    heads_all, mlps_all = head_masks(distinct, L, H)
    chunks = length_chunks(pairs, tokens_per_pass)
    if sets_per_pass is None and _padding_pays(backend, pairs, len(distinct), len(chunks), tokens_per_pass):
        chunks = [list(range(len(pairs)))]  # small work on a small model: one padded pass
    pad_token = pad_id(backend)
    total, done = len(distinct) * len(chunks), 0
    for idx in chunks:
        chunk = [pairs[i] for i in idx]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_token)  # [n, width]; no padding within a length chunk
        n, width = ids.shape
        if bool(mask.all()):
            mask = None
        per_pass = sets_per_pass or max(1, tokens_per_pass // (n * width))
        for g in range(0, len(distinct), per_pass):
            m = min(per_pass, len(distinct) - g)
            hm = heads_all[g:g + m].repeat_interleave(n, 0)  # [m * n, L, H]: set-major rows
            mm = mlps_all[g:g + m].repeat_interleave(n, 0)
            with knocked_out_rows(backend, hm, mm, means, [p.template for p in chunk] * m, end.tolist() * m):
                lg = backend.end_logits(ids.repeat(m, 1), None if mask is None else mask.repeat(m, 1),
                                        end.repeat(m))  # [m * n, vocab]
            pred = lg.argmax(-1).cpu().view(m, n)
            right[g:g + m] += (pred == answers[idx][None, :]).sum(1)
            done += m
            if progress is not None:
                progress(done, total)
    acc = {ko: float(r) / len(pairs) for ko, r in zip(distinct, right.tolist())}
    return [acc[ko] for ko in valid]


def knockout_accuracy(backend: ModelBackend, pairs: Sequence[PromptPair], ko: Knockout,
                      means: MeanActivations) -> float:
    """First-token accuracy of the reference prompts with ``ko`` ablated (one END-only evaluation)."""
    return knockout_accuracies(backend, pairs, [ko], means)[0]


@dataclass(frozen=True)
class TokenProb:
    token: str
    token_id: int
    prob: float


@torch.no_grad()
def next_token_probs(backend: ModelBackend, ids: Sequence[int], *, ko: Knockout | None = None,
                     means: MeanActivations | None = None) -> torch.Tensor:
    """The next-token distribution after ``ids`` ([vocab]), optionally under a knockout: one END-only pass."""
    x = torch.tensor([list(ids)])
    end = torch.tensor([len(ids) - 1])
    if ko is not None and not ko.empty:
        if means is None:
            raise ValueError("a knockout needs mean activations")
        with knocked_out(backend, ko, means, [None], [len(ids) - 1]):
            lg = backend.end_logits(x, None, end)  # [1, vocab]
    else:
        lg = backend.end_logits(x, None, end)
    return torch.softmax(lg[0].float(), -1)


def top_of(backend: ModelBackend, probs: torch.Tensor, k: int = 5) -> list[TokenProb]:
    """The k most likely tokens of a next-token distribution ``probs`` ([vocab])."""
    vals, idx = probs.topk(min(k, probs.shape[0]))
    toks = backend.tokenizer.convert_ids_to_tokens(idx.tolist())
    return [TokenProb(str(t), int(i), float(v)) for t, i, v in zip(toks, idx.tolist(), vals.tolist())]


def top_next_tokens(backend: ModelBackend, ids: Sequence[int], *, k: int = 5, ko: Knockout | None = None,
                    means: MeanActivations | None = None) -> list[TokenProb]:
    """The k most likely next tokens after ``ids`` (optionally under a knockout)."""
    return top_of(backend, next_token_probs(backend, ids, ko=ko, means=means), k)


@dataclass(frozen=True)
class CurvePoint:
    k: int
    top_accuracy: float
    random_mean: float
    random_std: float
    random_min: float
    random_max: float


def curve_knockouts(n_layers: int, n_heads: int, ranked_heads: Sequence[tuple[int, int]], *, k_max: int,
                    draws: int, seed: int = 0) -> list[tuple[int, Knockout, list[Knockout]]]:
    """The knockout sets of the Fig. 3 curve: for k = 0..k_max, (k, top-k set, ``draws`` random k-sets).

    The random draws are the same for a given seed whatever the evaluation order."""
    if k_max < 0:
        raise ValueError("k_max must be >= 0")
    if k_max > n_layers * n_heads:
        raise ValueError(f"k_max={k_max} exceeds the model's {n_layers * n_heads} heads")
    if draws < 1:
        raise ValueError("draws must be >= 1")
    rng = random.Random(seed)
    every = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    return [(k, Knockout(tuple(ranked_heads[:k])), [Knockout(tuple(rng.sample(every, k))) for _ in range(draws)])
            for k in range(k_max + 1)]


def knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]],
                   means: MeanActivations, *, k_max: int, draws: int = 10, seed: int = 0,
                   progress: ProgressFn | None = None, sets_per_pass: int | None = None,
                   ks: Sequence[int] | None = None) -> list[CurvePoint]:
    """Fig. 3: accuracy after knocking out the top-k heads (effect rank) vs k random heads.

    Every distinct knockout set (k = 0 once, repeated draws once) is evaluated once, END-only, several
    per forward pass (:func:`knockout_accuracies`).
    """
    L, H = backend.facts.n_layers, backend.facts.n_heads
    plan = [x for x in curve_knockouts(L, H, ranked_heads, k_max=k_max, draws=draws, seed=seed)
            if ks is None or x[0] in ks]  # ks: only these points (the same draws as the whole curve's)
    flat = [ko for _, top, rand in plan for ko in [top, *rand]]
    accs = dict(zip([ko.validate(L, H) for ko in flat],
                    knockout_accuracies(backend, pairs, flat, means, sets_per_pass=sets_per_pass,
                                        progress=progress)))
    out = []
    for k, top, rand in plan:
        t = torch.tensor([accs[ko.validate(L, H)] for ko in rand])
        out.append(CurvePoint(k, accs[top.validate(L, H)], float(t.mean()), float(t.std(unbiased=False)),
                              float(t.min()), float(t.max())))
    return out


def _curve_params(backend: ModelBackend, ranked_heads: Sequence[tuple[int, int]], k_max: int, draws: int,
                  seed: int) -> dict:
    return {"ranked": [list(h) for h in ranked_heads[:k_max]], "k_max": k_max, "draws": draws, "seed": seed,
            "dtype": backend.facts.dtype, "ablation": "mean over X_c, per template, END-aligned"}


CURVE_METRICS = ("top_accuracy", "random_mean", "random_std", "random_min", "random_max")  # stored per k


def _curve_points(rows) -> list[CurvePoint]:
    from engine.results import decode_rows
    return sorted(decode_rows(CurvePoint, rows, CURVE_METRICS), key=lambda p: p.k)


def cached_knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair],
                          ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                          cache=None, progress: ProgressFn | None = None) -> tuple[list[CurvePoint], bool]:
    """:func:`knockout_curve` through the result cache: (points, computed)."""
    from engine.results import encode_rows, run_cached

    def compute():
        pts = knockout_curve(backend, pairs, ranked_heads, mean_activations(backend, pairs), k_max=k_max,
                             draws=draws, seed=seed, progress=progress)
        return encode_rows(pts, CURVE_METRICS), None

    params = _curve_params(backend, ranked_heads, k_max, draws, seed)
    rows, _, computed = run_cached(backend, pairs, "knockout_curve", params, compute, cache)
    return _curve_points(rows), computed


def cached_knockout_points(backend: ModelBackend, pairs: Sequence[PromptPair],
                           ranked_heads: Sequence[tuple[int, int]], ks: Sequence[int], *, k_max: int,
                           draws: int = 10, seed: int = 0, cache=None,
                           progress: ProgressFn | None = None) -> list[CurvePoint]:
    """The points at ``ks`` of :func:`cached_knockout_curve`'s curve (same arguments, same draws): read from
    the stored curve when the cache holds it, else only those points' knockout sets are evaluated."""
    from engine.results import encode_rows, run_cached
    whole = stored_knockout_curve(backend, pairs, ranked_heads, k_max=k_max, draws=draws, seed=seed, cache=cache)
    if whole is not None:
        return [p for p in whole if p.k in ks]

    def compute():
        pts = knockout_curve(backend, pairs, ranked_heads, mean_activations(backend, pairs), k_max=k_max,
                             draws=draws, seed=seed, progress=progress, ks=ks)
        return encode_rows(pts, CURVE_METRICS), None

    params = {**_curve_params(backend, ranked_heads, k_max, draws, seed), "ks": sorted(set(ks))}
    rows, _, _ = run_cached(backend, pairs, "knockout_points", params, compute, cache)
    return _curve_points(rows)


def stored_knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair],
                          ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                          cache=None) -> list[CurvePoint] | None:
    """The curve of :func:`cached_knockout_curve` if the cache holds it, else None (no forward pass)."""
    from engine.results import stored
    hit = stored(backend, pairs, "knockout_curve", _curve_params(backend, ranked_heads, k_max, draws, seed), cache)
    return None if hit is None else _curve_points(hit[0])


def curve_cost(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]], *,
               k_max: int, draws: int, seed: int = 0) -> float:
    """Forward-equivalents the curve costs: distinct knockout sets x one END-only pass of the prompts
    (the blocks at every real token, the unembedding at END), relative to one padded full-logits pass."""
    from engine.backends.base import macs_per_position
    f = backend.facts
    plan = curve_knockouts(f.n_layers, f.n_heads, ranked_heads, k_max=k_max, draws=draws, seed=seed)
    n_sets = len(distinct_knockouts([ko for _, top, rand in plan for ko in [top, *rand]], f.n_layers, f.n_heads))
    body, unembed, _ = macs_per_position(f)
    real = sum(len(p.ref_ids) for p in pairs)
    padded = len(pairs) * max(len(p.ref_ids) for p in pairs)
    return n_sets * (real * body + len(pairs) * unembed) / (padded * (body + unembed))

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

#: the Knockout page's defaults: its curve is the one the circuit summary and the Paper page quote
KNOCKOUT_K, KNOCKOUT_DRAWS = 10, 10


def finding(model, pairs, cache, table) -> str | None:
    """Fig. 3: accuracy after knocking out the top-3 heads vs 3 random heads (the Knockout page's curve)."""
    f = model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(layer, h) for layer, h, _ in table.top_heads(k_max)]
    pts = stored_knockout_curve(model, pairs, ranked, k_max=k_max, draws=KNOCKOUT_DRAWS, cache=cache)
    if not pts:
        return None
    at = next((p for p in pts if p.k == 3), pts[-1])
    return (f"Knocking out the top {at.k} heads leaves {at.top_accuracy:.0%} first-token accuracy "
            f"(from {pts[0].top_accuracy:.0%}), {at.k} random heads {at.random_mean:.0%} "
            f"(mean of {KNOCKOUT_DRAWS} draws): a gap of {100 * (at.random_mean - at.top_accuracy):.0f} points.")

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine knockout, knockout-curve``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli_knockout(args, ctx) -> dict:
    """Accuracy before / after mean-ablating ``--heads`` / ``--mlps`` (and ``--text``'s top-5 next tokens)."""
    model = ctx.model
    ko = Knockout(parse_heads(args.heads), parse_layers(args.mlps)).validate(model.facts.n_layers,
                                                                            model.facts.n_heads)
    if ko.empty:
        raise ValueError("nothing to knock out: give --heads LAYER.HEAD,... and/or --mlps LAYER,...")
    typed = ctx.typed(args.text)
    pairs = ctx.pairs

    def compute(progress) -> dict:
        means = mean_activations(model, pairs)
        before, after = knockout_accuracies(model, pairs, [Knockout(), ko], means, progress=progress)
        res = {"heads": [f"{a}.{b}" for a, b in ko.heads], "mlps": list(ko.mlps), "n_pairs": len(pairs),
               "accuracy_before": before, "accuracy_after": after}
        if typed is not None:
            res["text"] = args.text
            res.update(ctx.typed_summary(typed))
            res["top5_before"] = [t.__dict__ for t in top_next_tokens(model, typed.ids)]
            res["top5_after"] = [t.__dict__ for t in top_next_tokens(model, typed.ids, ko=ko, means=means)]
        return res

    # text_rule: --text is read after the answer-token rule (results of the raw reading never come back)
    params = {"heads": [list(h) for h in ko.heads], "mlps": list(ko.mlps), "text": args.text or "",
              "text_ids": typed.ids if typed is not None else [], "text_rule": ctx.text_rule,
              "dtype": model.facts.dtype}
    with ctx.progress("knockout") as bar:
        res, computed = ctx.cached_json("knockout", params, lambda: compute(bar))
    res = {**res, "cached": not computed, "answer_tokens": ctx.answer_tokens(pairs)}
    ctx.write_json(args.out, res)
    return res


def cli_curve(args, ctx) -> dict:
    """Fig. 3's curve -> CSV: top-k heads (path-patching rank) vs k random heads, k = 0 .. --k-max."""
    from engine.techniques.patching import cached_path_patching
    model = ctx.model
    n_heads = model.facts.n_layers * model.facts.n_heads
    if args.k_max > n_heads:
        raise ValueError(f"--k-max {args.k_max} exceeds the model's {n_heads} heads")
    pairs = ctx.pairs
    with ctx.progress("path patching") as bar:
        table, _ = cached_path_patching(model, pairs, cache=ctx.cache, progress=bar)
    ranked = [(layer, h) for layer, h, _ in table.top_heads(args.k_max)]
    with ctx.progress("knockout sets") as bar:
        pts, computed = cached_knockout_curve(model, pairs, ranked, k_max=args.k_max, draws=args.draws,
                                              seed=args.seed, cache=ctx.cache, progress=bar)
    points = [p.__dict__ for p in pts]
    ctx.write_csv(args.out, points)
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
            "answer_tokens": ctx.answer_tokens(pairs), "ranked_by": table.ranking_metric(),
            "effect_note": table.effect_note(), "ranked_heads": [f"{a}.{b}" for a, b in ranked], "points": points}
