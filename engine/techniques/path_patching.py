"""Path patching: which attention heads (and MLPs) carry the arithmetic (Zhang et al. 2024, §4.1).

Algorithm 1 of the paper, for a sender component s (an attention head or an MLP) and the answer
logit as receiver, over reference / counterfactual prompt pairs (X_r, X_c):

1. Run X_r and X_c; cache every head's output and every MLP's output.
2. Run X_r again, with
   * the sender's output **at the END (last) position** replaced by its value on X_c,
   * every other head's output frozen at its X_r value, at every position,
   * the residual stream and the MLPs recomputed.
3. Read the answer token's logit at END: ``logit_p`` (patched) vs ``logit_o`` (original).

Metrics, averaged over prompt pairs:
  * ``effect``     -- the paper's relative change, (logit_p - logit_o) / logit_o;
  * ``logit_diff`` -- logit_p - logit_o (always available);
  * ``prob_diff``  -- p_p - p_o of the answer token (softmax over the whole vocabulary; optional).
A key head has a strongly negative effect: without the operation's information it routes, the
answer's logit collapses.  Ranking "by effect" means most negative first.

**Guard of the relative effect.**  Dividing by logit_o flips the sign when logit_o < 0 and explodes
when it is near 0, silently.  A pair whose unpatched answer logit is below ``EFFECT_MIN_LOGIT`` is
left out of the effect's mean (its logit_diff still counts); the number left out is stored per group
(component ``guard``, metric ``effect_excluded``, next to ``pairs``).  When more than
``EFFECT_MAX_EXCLUDED`` of a group's pairs are left out, the effect of that group is not a fair summary:
:meth:`PatchingTable.ranking_metric` then ranks by ``logit_diff`` instead, and
:meth:`PatchingTable.effect_note` says so (shown by the CLI and the Patching page).

**Exact fast path.**  With all other heads frozen, the patch at END can reach the logits only
through the END position's MLPs and norms: attention outputs are frozen everywhere, and no later
position exists.  So after one X_r and one X_c forward pass per batch, each sender needs only a
chain of END-position evaluations from its layer to the top, after the block model of the
architecture (:mod:`engine.machinery.end_chain` -- pre- and post-norms, parallel blocks, residual
scales, the logits' soft cap)::

    a_l  = o_proj(z_r)[l, END] + (z_c - z_r)[l, END, h] @ W_O[l, h]   # head sender (l, h)
    x    = resid_pre[l] + attn_branch_l(a_l);  x = x + MLP_l(x)       # (a parallel block: + mlp_r[l])
    x    = resid_post[l] + (mlp_c[l] - mlp_r[l])                      # MLP sender l (skips its own MLP)
    for j in l+1 .. L-1:  x = x + attn_out_r[j];  x = x + MLP_j(x)
    logit_p = transform(LN_final(x) . W_U[:, answer] (+ b_U[answer]))

All senders of all layers are advanced together, one batched MLP call per layer, and only the answer
token's unembedding column is computed.  Each batch first checks the block model against the model
itself (the heads' outputs reach the attention output linearly; one unchanged chain gives back the
model's answer logit); where it does not hold, the technique runs the textbook loop instead and says so
(``PatchingRaw.fallback``, the table's ``fallback``, one line in the CLI, a note on the page).
:func:`path_patching_reference` is the textbook version -- one hooked forward pass per sender, on the
patching core (:mod:`engine.machinery.patch_rows`) -- kept for verification and benchmarks; the two
agree to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.backends.hooks import HookName
from engine.machinery import end_chain
from engine.machinery.batching import batches, in_pair_order, pair_batches
from engine.machinery.components import Component, grid, wide_rows
from engine.machinery.patch_rows import (
    Edit,
    PatchRun,
    Slot,
    chain,
    patch_rows,
    patch_rows_work,
    prepare,
    prepare_work,
    replace,
    replace_except_head,
    take,
)
from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, fallback_note, logit_scale
from engine.numerics.intervals import NULL_QUANTILE, Interval, interval, shuffled_null, top_share
from engine.progress import ProgressFn, note
from engine.prompts.pairs import PromptPair, groups_with_carry

METHOD = "path_patching"
METRICS: tuple[str, ...] = ("effect", "logit_diff", "prob_diff")
#: Pairs whose unpatched answer logit is below this are left out of the relative effect (module docstring).
EFFECT_MIN_LOGIT = 1.0
#: A group whose share of left-out pairs exceeds this is ranked by logit_diff instead of effect.
EFFECT_MAX_EXCLUDED = 0.5
GUARD = "guard"  # component of the per-group guard counts
Grid = tuple[list[list[float]], list[float]]  # (heads [L][H], mlps [L]) of a heatmap


@dataclass
class PatchingRaw:
    """Per-pair patched logits of every sender.  P pairs, L layers, H heads."""

    pairs: list[PromptPair]
    logit_o: torch.Tensor      # [P]          answer logit on X_r, unpatched
    head_logit: torch.Tensor   # [P, L, H]    answer logit with head (l, h) patched
    mlp_logit: torch.Tensor    # [P, L]       answer logit with MLP l patched
    prob_o: torch.Tensor | None = None      # [P]
    head_prob: torch.Tensor | None = None   # [P, L, H]
    mlp_prob: torch.Tensor | None = None    # [P, L]
    fallback: str | None = None             # why the textbook loop computed this (None: the fast path)

    def per_pair(self, metric: str) -> tuple[torch.Tensor, torch.Tensor]:
        """([P, L, H], [P, L]) values of ``metric`` for each pair."""
        if metric == "effect":  # NaN for the pairs the guard leaves out
            lo = torch.where(self.effect_excluded(), torch.full_like(self.logit_o, float("nan")), self.logit_o)
            return ((self.head_logit - lo[:, None, None]) / lo[:, None, None],
                    (self.mlp_logit - lo[:, None]) / lo[:, None])
        if metric == "logit_diff":
            return self.head_logit - self.logit_o[:, None, None], self.mlp_logit - self.logit_o[:, None]
        if metric == "prob_diff":
            if self.head_prob is None:
                raise ValueError("prob_diff was not computed: pass with_prob=True")
            return self.head_prob - self.prob_o[:, None, None], self.mlp_prob - self.prob_o[:, None]
        raise ValueError(f"unknown metric {metric!r}: choose from {', '.join(METRICS)}")

    def effect_excluded(self) -> torch.Tensor:
        """[P] bool: pairs left out of the relative effect (unpatched answer logit < EFFECT_MIN_LOGIT)."""
        return ~(self.logit_o >= EFFECT_MIN_LOGIT)  # NaN logits are left out too

    def ranking_metric(self) -> str:
        """The metric heads are ranked by over all the pairs (:meth:`PatchingTable.ranking_metric` of group ``*``)."""
        return ranking_metric_of(int(self.effect_excluded().sum()), len(self.logit_o))

    def metrics(self) -> tuple[str, ...]:
        return METRICS if self.head_prob is not None else METRICS[:2]

    def groups(self) -> dict[str, list[int]]:
        """Pair indices of each breakdown group: ``*`` (all), ``op:add``, ``template:add.qa.0`` ..., and
        ``carry:yes`` / ``carry:no`` when the set has pairs of each (``engine.prompts.pairs.groups_with_carry``)."""
        return groups_with_carry(self.pairs)


def ranking_metric_of(excluded: int, n: int) -> str:
    """``effect``, or ``logit_diff`` when the guard left out more than EFFECT_MAX_EXCLUDED of the n pairs."""
    return "logit_diff" if n and excluded > EFFECT_MAX_EXCLUDED * n else "effect"


@dataclass(frozen=True)
class SenderValue(Component):
    group: str
    metric: str
    value: float


def summarize(raw: PatchingRaw) -> list[SenderValue]:
    """Mean of every metric per sender, for all pairs and per op / template / carry, and the effect guard's
    counts per group (component ``guard``: metrics ``pairs`` and ``effect_excluded``)."""
    out: list[SenderValue] = []
    groups = raw.groups()
    excluded = raw.effect_excluded()
    for group, idx in groups.items():
        out.append(SenderValue(GUARD, -1, -1, group, "pairs", float(len(idx))))
        out.append(SenderValue(GUARD, -1, -1, group, "effect_excluded", float(excluded[torch.tensor(idx)].sum())))
    for metric in raw.metrics():
        heads, mlps = raw.per_pair(metric)
        for group, idx in groups.items():
            ix = torch.tensor(idx)
            h = heads[ix].double().nanmean(0)  # [L, H]; NaN only where the guard left every pair out
            m = mlps[ix].double().nanmean(0)   # [L]
            for layer in range(h.shape[0]):
                for head in range(h.shape[1]):
                    out.append(SenderValue("head", layer, head, group, metric, float(h[layer, head])))
                out.append(SenderValue("mlp", layer, -1, group, metric, float(m[layer])))
    return out


# ---------------------------------------------------------------------------------------------
# fast exact path patching
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
                  with_prob: bool = False, heads: Sequence[tuple[int, int]] | None = None,
                  progress: ProgressFn | None = None) -> PatchingRaw:
    """Every head (``heads``: only those (layer, head), the others NaN) and every MLP as sender, answer logit as
    receiver -- exact: the END chains where the model's block model checks out (module docstring), the textbook
    loop where it does not (``fallback`` says why)."""
    try:
        return _path_patching_chains(backend, pairs, batch_size=batch_size, with_prob=with_prob, heads=heads,
                                     progress=progress)
    except ShortcutMismatch as e:
        raw = path_patching_loop(backend, pairs, with_prob=with_prob, heads=heads, progress=progress)
        raw.fallback = fallback_note("path patching", str(e))
        return raw


def path_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
                       heads: Sequence[tuple[int, int]] | None = None):
    """The forward work of :func:`path_patching` (the END chains), counted without running it
    (``engine.cost.Work``): per batch of :func:`pair_batches`, one pass of X_r and one of X_c (END unembedded), and
    the chains' MLP rows -- at layer j, every chain started below it and the layer's own head senders (the
    unchanged chain counted as a head sender of layer 0).  Where the model's blocks cannot be run piece by piece
    (known before it runs), the textbook loop it falls back to: :func:`path_patching_loop_work`."""
    from engine.cost import NO_WORK, Work
    if backend.components_fail():
        return path_patching_loop_work(backend, pairs, heads=heads)
    f = backend.facts
    per_layer = heads_per_layer(heads, f.n_layers, f.n_heads)
    rows, alive = 0, 0  # MLP rows per pair; chains started below the current layer
    for j, hs in enumerate(per_layer):
        rows += alive + len(hs) + (1 if j == 0 else 0)
        alive += len(hs) + 1 + (1 if j == 0 else 0)
    w = NO_WORK
    for b in pair_batches(backend, pairs, batch_size):
        n, width = b.ref.shape
        w += Work(2, 2 * n * width, 2 * n, n * rows)
    return w


def heads_per_layer(heads: Sequence[tuple[int, int]] | None, n_layers: int, n_heads: int) -> list[list[int]]:
    """[l] -> the heads of layer l among ``heads`` (None: all), sorted."""
    if heads is None:
        return [list(range(n_heads)) for _ in range(n_layers)]
    return [sorted({h for layer, h in heads if layer == j}) for j in range(n_layers)]


def sender_slots(per_layer: Sequence[Sequence[int]], n_heads: int) -> torch.Tensor:
    """Each sender's flat place in [L, H + 1], senders layer-major (the layer's heads ``per_layer[l]``, then its MLP:
    the order of the END chains and of :func:`all_senders`)."""
    return torch.tensor([j * (n_heads + 1) + h for j, hs in enumerate(per_layer) for h in [*hs, n_heads]])


def _path_patching_chains(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int,
                          with_prob: bool, heads: Sequence[tuple[int, int]] | None,
                          progress: ProgressFn | None) -> PatchingRaw:
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    end_chain.check_components(backend)
    per_layer = heads_per_layer(heads, L, H)
    slots = sender_slots(per_layer, H)
    W_O = [backend.W_O(layer) for layer in range(L)]  # [H, d_head, d_model] each
    logit_o, head_logit, mlp_logit = [], [], []
    prob_o, head_prob, mlp_prob = [], [], []
    index = []
    for eb in end_chain.end_batches(backend, pairs, batch_size, end_chain.chain_hooks(L), progress):
        P, answer, lo = len(eb.batch.pairs), eb.answer, eb.logits  # lo: [P, vocab]
        index.append(eb.batch.index)
        acts = end_chain.EndActs.checked(backend, eb, W_O)
        x, check = end_chain.run_chains(backend, acts, W_O, per_layer)  # [P, chains, d_model], [P, d_model]
        check_reproduces("the unchanged END chain", backend.answer_logits(check, answer), eb.model_logit,
                         logit_scale(lo), f.dtype)
        logit_o.append(eb.model_logit.cpu())
        if with_prob:
            prob_o.append(torch.softmax(lo, -1)[torch.arange(P), answer].cpu())
        n_chains = x.shape[1]
        flat = x.reshape(P * n_chains, -1)
        ans = answer.repeat_interleave(n_chains)

        lp = placed(backend.answer_logits(flat, ans), slots, L, H)
        head_logit.append(lp[:, :, :H])
        mlp_logit.append(lp[:, :, H])
        if with_prob:
            pp = placed(_answer_probs(backend, flat, ans), slots, L, H)
            head_prob.append(pp[:, :, :H])
            mlp_prob.append(pp[:, :, H])
    return _joined(pairs, (logit_o, head_logit, mlp_logit), (prob_o, head_prob, mlp_prob) if with_prob else None,
                   index)


def placed(v: torch.Tensor, slots: torch.Tensor, n_layers: int, n_heads: int) -> torch.Tensor:
    """[P * chains] (pair-major) -> [P, L, H + 1]: chain c of a pair at flat place ``slots[c]``, NaN elsewhere."""
    out = torch.full((v.numel() // len(slots), n_layers * (n_heads + 1)), float("nan"))
    out[:, slots] = v.float().reshape(-1, len(slots)).cpu()
    return out.reshape(-1, n_layers, n_heads + 1)


def _joined(pairs: Sequence[PromptPair], logits: tuple[list, list, list], probs: tuple[list, list, list] | None,
            index: list[torch.Tensor] | None = None) -> PatchingRaw:
    """PatchingRaw of per-batch (logit_o, head, mlp) lists, and of the probabilities' where computed; ``index``:
    the batches' places among the pairs (None: consecutive batches in order)."""
    def join(parts: list) -> torch.Tensor:
        return torch.cat(parts) if index is None else in_pair_order(index, parts)
    p = [join(x) for x in probs] if probs is not None else [None, None, None]
    return PatchingRaw(list(pairs), *[join(x) for x in logits], *p)


def _answer_probs(backend: ModelBackend, x: torch.Tensor, answer: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """Softmax probability of ``answer[i]`` for residual ``x[i]`` (full vocabulary, in row chunks)."""
    out = []
    for s in range(0, x.shape[0], rows):
        lg = backend.final_logits(x[s:s + rows])
        out.append(torch.softmax(lg.float(), -1).gather(1, answer[s:s + rows, None])[:, 0])
    return torch.cat(out)


# ---------------------------------------------------------------------------------------------
# textbook reference: one hooked forward pass per sender
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sender:
    component: str  # "head" | "mlp"
    layer: int
    head: int = -1


def all_senders(n_layers: int, n_heads: int) -> list[Sender]:
    return [s for layer in range(n_layers)
            for s in ([Sender("head", layer, h) for h in range(n_heads)] + [Sender("mlp", layer)])]


def sender_edits(run: PatchRun, group: Sequence[Sender], n_layers: int, *, freeze: bool = True,
                 keep: tuple[int, int] | None = None) -> list[Edit]:
    """Hooks of one group of senders (row block s = ``group[s]``): the sender's END output from X_c.

    ``freeze``: every head's output, at every position and layer, is frozen at X_r (Algorithm 1);
    ``keep`` = (layer, head): that head keeps what the pass computes (a receiver, see head_patching)."""
    P, S, end = run.n, len(group), run.end
    out: list[Edit] = []
    for layer in range(n_layers):
        z = hooks.attn_z(layer)
        heads = [Slot(s, end, snd.head) for s, snd in enumerate(group)
                 if snd.component == "head" and snd.layer == layer]
        fns = []
        if freeze:
            frozen = run.stacked(run.ref_cache[z], S)  # [S * P, pos, H, d_head]
            fns.append(replace_except_head(frozen, keep[1]) if keep and keep[0] == layer else replace(frozen))
        if heads:
            fns.append(take(run.cf_cache[z], heads, P))
        if fns:
            out.append((z, chain(*fns)))
        mlps = [Slot(s, end) for s, snd in enumerate(group) if snd.component == "mlp" and snd.layer == layer]
        if mlps:
            out.append((hooks.mlp_out(layer), take(run.cf_cache[hooks.mlp_out(layer)], mlps, P)))
    return out


def sender_hooks(n_layers: int) -> list[HookName]:
    """What :func:`sender_edits` reads: every head's output and every MLP's output."""
    return [n for layer in range(n_layers) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]


@torch.no_grad()
def path_patching_loop_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
                            rows_per_pass: int = 128, heads: Sequence[tuple[int, int]] | None = None):
    """The forward work of :func:`path_patching_loop` (``engine.cost.Work``): per batch, X_r and X_c, then every
    sender as a variant of the whole prompts."""
    from engine.cost import NO_WORK
    f = backend.facts
    n_senders = sum(len(hs) + 1 for hs in heads_per_layer(heads, f.n_layers, f.n_heads))  # heads, and each MLP
    w = NO_WORK
    for idx in batches(len(pairs), batch_size):
        chunk = [pairs[i] for i in idx]
        width = max(len(p.ref_ids) for p in chunk)
        w += prepare_work(chunk) + patch_rows_work(n_senders, len(chunk), width, rows_per_pass=rows_per_pass)
    return w


def path_patching_loop(backend: ModelBackend, pairs: Sequence[PromptPair], *, with_prob: bool = False,
                       batch_size: int = 32, rows_per_pass: int = 128, heads: Sequence[tuple[int, int]] | None = None,
                       progress: ProgressFn | None = None) -> PatchingRaw:
    """Algorithm 1 as written, every sender's own hooked forward pass (senders stacked as rows; ``heads``: only
    those head senders, the others NaN): the fallback of :func:`path_patching` where the END chains do not
    reproduce the model.  Exact on any architecture."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    per_layer = heads_per_layer(heads, L, H)
    senders = [s for s in all_senders(L, H) if s.component == "mlp" or s.head in per_layer[s.layer]]
    slots = sender_slots(per_layer, H)
    logit_o, head_logit, mlp_logit, prob_o, head_prob, mlp_prob = [], [], [], [], [], []
    chunks = batches(len(pairs), batch_size)
    for ci, idx in enumerate(chunks):
        run = prepare(backend, [pairs[i] for i in idx], sender_hooks(L), sender_hooks(L))
        got = patch_rows(backend, run, senders, lambda grp, run=run: sender_edits(run, grp, L),
                         rows_per_pass=rows_per_pass, with_prob=with_prob)
        lg, pr = got if with_prob else (got, None)
        for values, heads, mlps in ((lg, head_logit, mlp_logit), (pr, head_prob, mlp_prob)):
            if values is None:
                continue
            per = placed(values.T.reshape(-1), slots, L, H)  # values [senders, P] -> [P, L, H + 1]
            heads.append(per[:, :, :H])
            mlps.append(per[:, :, H])
        logit_o.append(run.logit_o)
        prob_o.append(run.prob_o)
        if progress is not None:
            progress(ci + 1, len(chunks))
    return _joined(pairs, (logit_o, head_logit, mlp_logit), (prob_o, head_prob, mlp_prob) if with_prob else None)


def path_patching_reference(backend: ModelBackend, pairs: Sequence[PromptPair],
                            senders: Sequence[Sender] | None = None, *, batch_size: int = 32
                            ) -> dict[Sender, torch.Tensor]:
    """Patched answer logit [P] of each sender, one hooked forward pass per sender (Algorithm 1 as written)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    senders = list(senders) if senders is not None else all_senders(L, H)
    out: dict[Sender, list[torch.Tensor]] = {s: [] for s in senders}
    for idx in batches(len(pairs), batch_size):
        run = prepare(backend, [pairs[i] for i in idx], sender_hooks(L), sender_hooks(L))
        patched = patch_rows(backend, run, senders, lambda grp, run=run: sender_edits(run, grp, L),
                             rows_per_pass=1)
        for s, v in zip(senders, patched):
            out[s].append(v)
    return {s: torch.cat(v) for s, v in out.items()}


# ---------------------------------------------------------------------------------------------
# cached run (CLI and pages)
# ---------------------------------------------------------------------------------------------

@dataclass
class PatchingTable:
    """Aggregated path-patching results, as read from (or written to) the result cache."""

    n_layers: int
    n_heads: int
    n_pairs: int
    values: list[SenderValue] = field(default_factory=list)
    fallback: str | None = None  # why the textbook loop computed it (None: the fast path, checked)
    per_pair: PatchingRaw | None = None  # the per-pair patched logits (the intervals' input)

    def groups(self) -> list[str]:
        return sorted({v.group for v in self.values})

    def heatmap(self, metric: str = "effect", group: str = "*") -> tuple[list[list[float]], list[float]]:
        """(heads [L][H], mlps [L]) of one metric and group."""
        return grid(((v.component, v.layer, v.head, v.value) for v in self.values
                     if v.metric == metric and v.group == group), self.n_layers, self.n_heads)

    def guard_counts(self, group: str = "*") -> tuple[int, int]:
        """(pairs left out of the relative effect, pairs) of a group (module docstring: guard)."""
        got = {v.metric: int(v.value) for v in self.values if v.component == GUARD and v.group == group}
        return got.get("effect_excluded", 0), got.get("pairs", 0)

    def ranking_metric(self, group: str = "*") -> str:
        """``effect``, or ``logit_diff`` when the guard left out more than EFFECT_MAX_EXCLUDED of the pairs."""
        return ranking_metric_of(*self.guard_counts(group))

    def effect_note(self, group: str = "*") -> str | None:
        """What the reader must know about the relative effect of a group (None when every pair counts)."""
        excluded, n = self.guard_counts(group)
        if not excluded:
            return None
        note = (f"{excluded} of {n} prompt pairs have an unpatched answer logit below {EFFECT_MIN_LOGIT:g} and are "
                f"left out of the relative effect (dividing by it would flip or explode the sign); "
                f"logit_diff uses every pair.")
        if self.ranking_metric(group) == "logit_diff":
            note += " That is more than half of them: heads are ranked by logit_diff instead."
        return note

    def heatmap_intervals(self, metric: str = "effect", group: str = "*") -> tuple[Grid, Grid] | None:
        """((heads, mlps) low, (heads, mlps) high): each cell of :meth:`heatmap` with its 95 % percentile bootstrap
        interval over the group's pairs, every cell from the same resamples, from the stored per-pair results (no
        forward pass; :func:`engine.numerics.intervals.mean_intervals`).  None: no per-pair results stored."""
        from engine.numerics.intervals import mean_intervals
        if self.per_pair is None:
            return None
        heads, mlps = self.per_pair.per_pair(metric)
        idx = torch.tensor(self.per_pair.groups()[group])
        x = torch.cat([heads, mlps[:, :, None]], 2)[idx].double().numpy()  # [P, L, H + 1]
        _, low, high = mean_intervals(x)
        H = self.n_heads
        return (low[:, :H].tolist(), low[:, H].tolist()), (high[:, :H].tolist(), high[:, H].tolist())

    def top_heads(self, k: int, metric: str | None = None, group: str = "*") -> list[tuple[int, int, float]]:
        """The k heads with the most negative ``metric`` (the key heads): (layer, head, value).

        ``metric`` None: :meth:`ranking_metric` (effect, or logit_diff when the guard falls back)."""
        metric = metric or self.ranking_metric(group)
        hs = [(v.layer, v.head, v.value) for v in self.values
              if v.component == "head" and v.metric == metric and v.group == group and v.value == v.value]
        return sorted(hs, key=lambda t: t[2])[:max(0, k)]


def cached_path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                         with_prob: bool = False, batch_size: int = 32, heads: Sequence[tuple[int, int]] | None = None,
                         progress: ProgressFn | None = None) -> tuple[PatchingTable, bool]:
    """Path patching through the result cache: (table, computed); ``heads``: only those head senders (every MLP)."""
    from engine.results import run_cached_rows

    f = backend.facts
    heads = None if heads is None else sorted({(int(a), int(b)) for a, b in heads})
    params = {"with_prob": with_prob, "dtype": f.dtype, "senders": "heads+mlps", "position": "END",
              "effect_guard": {"min_logit": EFFECT_MIN_LOGIT, "max_excluded": EFFECT_MAX_EXCLUDED},
              "per_pair": "f32"}
    if heads is not None:
        params["senders"] = {"heads": [list(h) for h in heads], "mlps": "all"}

    def compute():
        raw = path_patching(backend, pairs, batch_size=batch_size, with_prob=with_prob, heads=heads,
                            progress=progress)
        return summarize(raw), {"n_layers": f.n_layers, "n_heads": f.n_heads, "n_pairs": len(pairs),
                                "fallback": raw.fallback or "", "per_pair": per_pair_artifact(raw)}

    values, art, computed = run_cached_rows(backend, pairs, METHOD, params, compute, SenderValue, cache=cache)
    if art.get("fallback"):
        note(art["fallback"])
    return PatchingTable(int(art["n_layers"]), int(art["n_heads"]), int(art["n_pairs"]), values,
                         art.get("fallback") or None, raw_of(pairs, art["per_pair"])), computed


PER_PAIR = ("logit_o", "head_logit", "mlp_logit", "prob_o", "head_prob", "mlp_prob")


def per_pair_artifact(raw: PatchingRaw) -> dict:
    """The per-pair tensors of ``raw`` as a cache artifact (float32, exact)."""
    from engine.results import encode_array
    return {n: encode_array(getattr(raw, n)) for n in PER_PAIR if getattr(raw, n) is not None}


def raw_of(pairs: Sequence[PromptPair], art: dict) -> PatchingRaw:
    """The :class:`PatchingRaw` that :func:`per_pair_artifact` stored."""
    from engine.results import decode_array
    got = {n: torch.from_numpy(decode_array(art[n])) if n in art else None for n in PER_PAIR}
    return PatchingRaw(list(pairs), **got)

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine path-patching``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Every head and MLP as sender: one CSV row per sender (and per op / template / carry with ``--by``)."""
    model, pairs = ctx.model, ctx.pairs
    with ctx.progress("path patching") as bar:
        table, computed = cached_path_patching(model, pairs, cache=ctx.cache, with_prob=args.with_prob,
                                               batch_size=args.batch_size, progress=bar)
    metrics = ["effect", "logit_diff"] + (["prob_diff"] if args.with_prob else [])
    counts = {g: len(idx) for g, idx in groups_with_carry(pairs).items()}
    prefix = {"all": "*", "op": "op:", "template": "template:", "carry": "carry:"}[args.by]
    out = wide_rows(table.values,
                    keep=lambda v: v.metric in metrics and (v.group == "*" if args.by == "all"
                                                            else v.group.startswith(prefix)),
                    first=lambda v: {} if args.by == "all" else {"group": v.group.split(":", 1)[1]})
    for r in out:
        r["n"] = counts.get(f"{prefix}{r['group']}" if "group" in r else "*", 0)
    ctx.write_csv(args.out, ctx.with_pins(out))  # each pinned component's note, when the model has pins
    ranking = table.ranking_metric()
    top = table.top_heads(5, ranking)
    excluded, _ = table.guard_counts()
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "senders": len(out),
            "answer_tokens": ctx.answer_tokens(pairs), "fallback": table.fallback,
            "effect_guard": {"excluded_pairs": excluded, "ranked_by": ranking, "note": table.effect_note()},
            "top_heads": [{"layer": layer, "head": h, ranking: e} for layer, h, e in top]}

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

#: "a small fraction (< 5%) of attention heads": the top share of the heads whose part of the effect is measured
TOP_HEADS = 0.05


@dataclass(frozen=True)
class Sparsity:
    """How much of the heads' effect the top ``k`` heads carry (scale-free: a share), against chance."""

    k: int              # the top TOP_HEADS of the heads (at least one)
    n: int              # all heads
    share: Interval     # their share of sum over heads |mean logit_diff|, with its bootstrap interval
    null: float         # the same share's NULL_QUANTILE with each pair's head labels shuffled
    pairs: int          # the prompt pairs it is measured on

    def holds(self) -> bool | None:
        """True: the share's whole interval lies above the null's quantile; False: the share itself does not
        exceed it (what effects spread over the heads give); None: the share does, its interval does not -- or
        there is one pair, whose shuffled labels give its own share back (the null cannot be told apart)."""
        if self.pairs < 2:
            return None
        if self.share.value <= self.null:
            return False
        return self.share.above(self.null) or None

    def text(self) -> str:
        return (f"the top {100 * TOP_HEADS:.0f} % of the heads ({self.k} of {self.n}) carry "
                f"{self.share.scaled(100).text('{:.0f}', ' %')} of "
                f"the heads' total effect on the answer logit (shuffled head labels: {100 * self.null:.0f} %"
                + ("; one pair: shuffling its labels gives the same share, no verdict)" if self.pairs < 2 else ")"))


def head_sparsity(raw: PatchingRaw) -> Sparsity:
    """:class:`Sparsity` of the per-pair ``logit_diff`` of every head ([pairs, heads]; every pair counts)."""
    heads, _ = raw.per_pair("logit_diff")
    d = heads.reshape(heads.shape[0], -1).double().numpy()  # [P, L * H]
    n = d.shape[1]
    k = max(1, round(TOP_HEADS * n))
    share = interval(lambda idx: top_share(d[idx], k), d.shape[0])
    null = float(np.quantile(shuffled_null(lambda x: top_share(x, k), d), NULL_QUANTILE))
    return Sparsity(k, n, share, null, d.shape[0])


def finding(model, pairs, cache, table: PatchingTable) -> str:
    """Key heads (§4.1): the top heads by effect, and how much of the effect the top 5 % of the heads carry."""
    top = table.top_heads(3)
    # small effects to two significant digits: -0.0080 and -0.0076 both read "-0.01" to two decimals
    fmt = "{:+.2f}" if max((abs(e) for _, _, e in top), default=1.0) >= 0.1 else "{:+.2g}"
    names = ", ".join(f"{layer}.{h} ({fmt.format(e)})" for layer, h, e in top)
    out = f"Path patching on {table.n_pairs} prompt pairs: the top heads are {names}"
    if table.per_pair is None:
        return out + "."
    return out + f"; {head_sparsity(table.per_pair).text()}."
