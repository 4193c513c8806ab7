"""Attribution patching (AtP): the gradient estimate of patching, side by side with the exact answer.

Attribution patching (Nanda 2023; Kramár et al. 2024, "AtP*") estimates the effect of replacing an
activation ``a_r`` (reference run X_r) by ``a_c`` (counterfactual run X_c) on a metric m to first
order::

    m(a_c) - m(a_r)  ~  grad_a m(a_r) . (a_c - a_r)

Here m is the answer token's logit at END and the activations are the senders of the paper's path
patching (:mod:`engine.techniques.path_patching`): every head's END output and every MLP's END output.  Two
quantities are estimated, each beside its exact value:

**Path AtP -- the estimate of path patching (Algorithm 1, every other head frozen).**  With every
other head frozen at X_r, a change of head (l, h)'s END output reaches the logit only through the
END position's MLPs and norms: the exact END chain of :mod:`engine.machinery.end_chain`, the fast path of
path patching.  So the gradient is that of the frozen END chain, taken once at the X_r residual stream::

    g_l  = d logit / d a_l      a_l: the attention module's END output at layer l (o_proj(z), before
                                the block's post-attention norm, if any), through the chain
                                a -> attn_branch_l -> + MLP_l -> + attn_out_r[l+1] -> ... -> the logits
    g'_l = d logit / d resid_post[l]  (END)
    AtP(head l, h) = g_l  . ((z_c - z_r)[l, END, h] @ W_O[l, h])
    AtP(MLP l)     = g'_l . (mlp_c - mlp_r)[l, END]

Cost per batch: the 2 forward passes of path patching (X_r, X_c) plus one backward pass through
the END chain (L single-position MLP evaluations) -- for every head and MLP at once.  The chain checks
itself first (its own answer logit must be the model's, and the block model must hold:
:func:`engine.machinery.end_chain.check_block_model`); where it does not, the same gradient is taken
through the model itself, every head frozen at X_r by hooks (one forward and backward pass per batch),
and the result says so (``fallback``).

**Total AtP -- the estimate of plain activation patching (nothing frozen).**  Only the sender's
END output comes from X_c; every later head and MLP is recomputed::

    AtP_total(head l, h) = d logit / d z[l, END, h] . (z_c - z_r)[l, END, h]    (one full backward on X_r)
    AtP_total(MLP l)     = d logit / d mlp_out[l, END] . (mlp_c - mlp_r)[l, END]

and the exact value runs one hooked forward pass per sender (senders batched as rows).

Both estimates are linear in the patch: where a sender's effect goes through a saturated softmax
or a non-linear MLP, AtP over- or under-shoots.  The comparison report gives, per set, Spearman's
rank correlation between exact and AtP effects, the top-k overlap (k = 5, 10) and the senders AtP
misses or invents in the exact top-k -- so a user sees how far the cheap estimate can be trusted on
this model before relying on it for a bigger one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from scipy.stats import spearmanr

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery import end_chain
from engine.machinery.batching import in_pair_order, pair_batches
from engine.machinery.components import Component, wide_rows
from engine.machinery.patch_rows import patch_rows, prepare
from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, fallback_note, logit_scale
from engine.progress import ProgressFn, note
from engine.prompts.pairs import PromptPair
from engine.techniques.path_patching import PatchingRaw, Sender, path_patching, sender_edits, sender_hooks

METHOD = "attribution_patching"
#: the four estimates, as (name, what it is)
KINDS: tuple[tuple[str, str], ...] = (
    ("exact", "exact path patching (other heads frozen)"),
    ("atp", "attribution patching of the same quantity"),
    ("exact_total", "exact activation patching (nothing frozen)"),
    ("atp_total", "attribution patching of activation patching"),
)


@dataclass
class AttributionRaw:
    """Per-pair patched answer logits of every sender, exact and estimated.  P pairs, L layers, H heads."""

    exact: PatchingRaw
    atp: PatchingRaw
    exact_total: PatchingRaw | None = None
    atp_total: PatchingRaw | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def kinds(self) -> dict[str, PatchingRaw]:
        out = {"exact": self.exact, "atp": self.atp}
        if self.exact_total is not None and self.atp_total is not None:
            out.update(exact_total=self.exact_total, atp_total=self.atp_total)
        return out


# ---------------------------------------------------------------------------------------------
# path AtP: gradient of the frozen END chain
# ---------------------------------------------------------------------------------------------

def path_atp(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
             progress: ProgressFn | None = None) -> PatchingRaw:
    """AtP estimate of path patching for every head and MLP (patched logit = logit_o + grad . delta): the END
    chain's gradient where the chain checks out, else the same gradient through the hooked model."""
    L = backend.facts.n_layers
    try:
        end_chain.check_components(backend)
        return _path_atp(backend, pairs, batch_size, progress, end_chain.chain_hooks(L), _chain_gradients)
    except ShortcutMismatch as e:
        raw = _path_atp(backend, pairs, batch_size, progress, (sender_hooks(L), sender_hooks(L)), _hooked_gradients)
        raw.fallback = fallback_note("path attribution patching", str(e))
        return raw


def path_atp_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32):
    """The forward work of :func:`path_atp` (``engine.cost.Work``): the END batches of path patching (X_r and X_c,
    END unembedded) and, per pair, the unchanged END chain and its gradient (about three MLP rows per layer) --
    or, where the model's blocks cannot be run piece by piece (known before it runs), the gradient through the
    hooked model: one full-logits pass of X_r and its backward pass."""
    from engine.cost import NO_WORK, Work
    hooked = bool(backend.components_fail())
    w = NO_WORK
    for b in pair_batches(backend, pairs, batch_size):
        n, width = b.ref.shape
        w += Work(2, 2 * n * width, 2 * n, 0 if hooked else 3 * n * backend.facts.n_layers)
        if hooked:
            w += Work(1, n * width, n * width, backward=n * width)
    return w


def _path_atp(backend: ModelBackend, pairs: Sequence[PromptPair], batch_size: int, progress: ProgressFn | None,
              names, gradients) -> PatchingRaw:
    L, H = backend.facts.n_layers, backend.facts.n_heads
    logit_o, head_logit, mlp_logit, index = [], [], [], []
    for eb in end_chain.end_batches(backend, pairs, batch_size, names, progress):
        b, P = eb.batch, len(eb.batch.pairs)
        index.append(b.index)
        lo = eb.model_logit  # [P] the model's answer logit
        head_dot, g_mlp = gradients(backend, b, eb.c_r, eb.c_c, lo, logit_scale(eb.logits))
        lo = lo.cpu()
        logit_o.append(lo)
        hl = torch.empty(P, L, H)
        ml = torch.empty(P, L)
        for j in range(L):
            hl[:, j] = lo[:, None] + head_dot[j].float().cpu()
            dm = (b.end_rows(eb.c_c[hooks.mlp_out(j)]) - b.end_rows(eb.c_r[hooks.mlp_out(j)])).float()  # [P, d_model]
            ml[:, j] = lo + (dm * g_mlp[j].float().to(dm.device)).sum(-1).cpu()
        head_logit.append(hl)
        mlp_logit.append(ml)
    return PatchingRaw(list(pairs), *(in_pair_order(index, x) for x in (logit_o, head_logit, mlp_logit)))


def _chain_gradients(backend: ModelBackend, b, c_r: dict, c_c: dict, lo: torch.Tensor, scale: torch.Tensor):
    """Per layer, (grad . delta of each head [P, H], d logit / d MLP contribution [P, d_model]) from the END chain,
    after its self-check (ShortcutMismatch)."""
    f = backend.facts
    W_O = [backend.W_O(layer) for layer in range(f.n_layers)]  # [H, d_head, d_model] each
    acts = end_chain.EndActs.of(c_r, c_c, b.end_rows, f.n_layers)
    end_chain.check_block_model(backend, acts, W_O, f.dtype)
    g_head, g_mlp, chain_lo = end_chain.chain_gradients(backend, acts, b.answer.to(backend.device))
    check_reproduces("the unchanged END chain", chain_lo, lo, scale, f.dtype)
    head_dot = [torch.einsum("phm,pm->ph", acts.head_deltas(j, W_O[j]).float(), g_head[j].float())
                for j in range(f.n_layers)]
    return head_dot, g_mlp


def _hooked_gradients(backend: ModelBackend, b, c_r: dict, c_c: dict, lo: torch.Tensor, scale: torch.Tensor):
    """The same through the model itself, every head's output frozen at X_r (so a change at END reaches the
    logit only along the END chain): :func:`probe_gradients`, one forward and backward pass."""
    L = backend.facts.n_layers
    _, g_z, g_mlp = probe_gradients(backend, b, c_r, frozen=True)
    # d logit / d z_h . (z_c - z_r)_h  ==  g_a . ((z_c - z_r)_h @ W_O[h]): the same estimate
    dz = [(b.end_rows(c_c[hooks.attn_z(j)]) - b.end_rows(c_r[hooks.attn_z(j)])).float().cpu() for j in range(L)]
    return [(g_z[j] * dz[j]).sum(-1) for j in range(L)], g_mlp


def probe_gradients(backend: ModelBackend, b, c_r: dict, *, frozen: bool
                    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(answer logit [P], d logit / d z at END [L] of [P, H, d_head], d logit / d MLP contribution at END [L] of
    [P, d_model]) of batch ``b``'s X_r: zero probes added at each row's END to every head's output and every MLP's
    contribution, one forward and one backward pass.  ``frozen``: every head's output is first replaced by its
    X_r value from ``c_r`` (Algorithm 1's freezing: path AtP), else recomputed (total AtP)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    P, rows, end = len(b.pairs), b.rows, b.end
    z_probe = [torch.zeros(P, H, f.d_head, requires_grad=True) for _ in range(L)]
    m_probe = [torch.zeros(P, f.d_model, requires_grad=True) for _ in range(L)]
    edits = []
    for layer in range(L):
        add = _add_at_end(z_probe[layer], rows, end)
        if frozen:
            edits.append((hooks.attn_z(layer), _frozen_plus_probe(c_r[hooks.attn_z(layer)].detach(), add)))
        else:
            edits.append((hooks.attn_z(layer), add))
        edits.append((hooks.mlp_out(layer), _add_at_end(m_probe[layer], rows, end)))
    with torch.enable_grad(), backend.hooks(edits):
        lg = backend.logits(b.ref, b.mask)
        lo = lg[rows.to(lg.device), end.to(lg.device), b.answer.to(lg.device)].float()  # [P]
        grads = torch.autograd.grad(lo.sum(), z_probe + m_probe)
    return lo.detach(), [g.float().cpu() for g in grads[:L]], [g.float().cpu() for g in grads[L:]]


def _frozen_plus_probe(frozen: torch.Tensor, add):
    """Hook replacing the activation with ``frozen`` (X_r's), then ``add`` (the probe) applied to it."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        return add(frozen.to(act.device, act.dtype))
    return fn


# ---------------------------------------------------------------------------------------------
# activation patching (nothing frozen): exact and AtP
# ---------------------------------------------------------------------------------------------

def total_atp(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 16,
              progress: ProgressFn | None = None) -> PatchingRaw:
    """AtP estimate of activation patching each head's / MLP's END output (one forward + backward per batch)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    cf_names = sender_hooks(L)
    logit_o, head_logit, mlp_logit = [], [], []
    chunks = pair_batches(backend, pairs, batch_size)
    index = [b.index for b in chunks]
    for ci, b in enumerate(chunks):
        P, rows, end = len(b.pairs), b.rows, b.end
        with torch.no_grad():
            c_r = backend.activations(b.ref, b.mask, cf_names)
            c_c = backend.activations(b.cf, b.mask, cf_names)
        lo, g_z, g_mlp = probe_gradients(backend, b, c_r, frozen=False)
        lo = lo.cpu()
        hl = torch.empty(P, L, H)
        ml = torch.empty(P, L)
        for layer in range(L):
            dz = (c_c[hooks.attn_z(layer)] - c_r[hooks.attn_z(layer)])[rows, end].float().cpu()  # [P, H, d_head]
            hl[:, layer] = lo[:, None] + (g_z[layer] * dz).sum(-1)
            dm = (c_c[hooks.mlp_out(layer)] - c_r[hooks.mlp_out(layer)])[rows, end].float().cpu()  # [P, d_model]
            ml[:, layer] = lo + (g_mlp[layer] * dm).sum(-1)
        logit_o.append(lo)
        head_logit.append(hl)
        mlp_logit.append(ml)
        if progress is not None:
            progress(ci + 1, len(chunks))
    return PatchingRaw(list(pairs), *(in_pair_order(index, x) for x in (logit_o, head_logit, mlp_logit)))


def total_atp_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 16):
    """The forward work of :func:`total_atp` (``engine.cost.Work``): per batch, X_r's and X_c's activations, then
    one full-logits pass with its backward pass."""
    from engine.cost import NO_WORK, Work
    w = NO_WORK
    for b in pair_batches(backend, pairs, batch_size):
        n, width = b.ref.shape
        w += Work(3, 3 * n * width, 2 * n + n * width, backward=n * width)
    return w


def activation_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 64):
    """The forward work of :func:`activation_patching` (``engine.cost.Work``): X_r and X_c cached, then every
    head and MLP as a variant of the whole prompts."""
    from engine.machinery.patch_rows import patch_rows_work, prepare_work
    L, H = backend.facts.n_layers, backend.facts.n_heads
    width = max(len(p.ref_ids) for p in pairs)
    return prepare_work(pairs) + patch_rows_work(L * (H + 1), len(pairs), width, rows_per_pass=rows_per_pass)


def attribution_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, total: bool = True):
    """The forward work of :func:`attribution` (``engine.cost.Work``): exact path patching and its AtP estimate,
    and with ``total`` exact activation patching and its AtP estimate."""
    from engine.techniques.path_patching import path_patching_work
    w = path_patching_work(backend, pairs) + path_atp_work(backend, pairs)
    if total:
        w += activation_patching_work(backend, pairs) + total_atp_work(backend, pairs)
    return w


def activation_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 64,
                        progress: ProgressFn | None = None) -> PatchingRaw:
    """Exact activation patching of each head's / MLP's END output from X_c (nothing frozen).

    Senders are batched as rows on the patching core: the hook of layer l replaces only the END output
    of the rows whose sender is at layer l."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    run = prepare(backend, pairs, sender_hooks(L), sender_hooks(L))
    senders = ([Sender("head", layer, h) for layer in range(L) for h in range(H)]
               + [Sender("mlp", layer) for layer in range(L)])
    patched = patch_rows(backend, run, senders, lambda grp: sender_edits(run, grp, L, freeze=False),
                         rows_per_pass=rows_per_pass, progress=progress)  # [S, P]
    P = run.n
    head_logit = patched[:L * H].reshape(L, H, P).permute(2, 0, 1).contiguous()  # [P, L, H]
    mlp_logit = patched[L * H:].reshape(L, P).T.contiguous()  # [P, L]
    return PatchingRaw(list(pairs), run.logit_o, head_logit, mlp_logit)


def _add_at_end(probe: torch.Tensor, rows: torch.Tensor, end: torch.Tensor):
    """Hook adding ``probe[i]`` to row i's END position (a zero: only its gradient matters)."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        add = torch.zeros_like(act)
        add = add.index_put((rows.to(act.device), end.to(act.device)), probe.to(act.device, act.dtype))
        return act + add
    return fn


# ---------------------------------------------------------------------------------------------
# all four, and how far AtP can be trusted
# ---------------------------------------------------------------------------------------------

def attribution(backend: ModelBackend, pairs: Sequence[PromptPair], *, total: bool = True,
                progress: ProgressFn | None = None) -> AttributionRaw:
    """Exact path patching, its AtP estimate and (``total``) exact / AtP activation patching, timed."""
    steps = 4 if total else 2
    done = [0]

    def step(fn, *a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        done[0] += 1
        if progress is not None:
            progress(done[0], steps)
        return out, time.perf_counter() - t0

    exact, t_exact = step(path_patching, backend, pairs)
    atp, t_atp = step(path_atp, backend, pairs)
    res = AttributionRaw(exact, atp, seconds={"exact": t_exact, "atp": t_atp})
    if total:
        res.exact_total, res.seconds["exact_total"] = step(activation_patching, backend, pairs)
        res.atp_total, res.seconds["atp_total"] = step(total_atp, backend, pairs)
    return res


@dataclass(frozen=True)
class SenderRow(Component):
    values: dict[str, float]  # kind -> mean metric over pairs


def sender_rows(raw: AttributionRaw, metric: str = "effect") -> list[SenderRow]:
    """One row per sender (heads layer-major, then that layer's MLP) with every kind's mean ``metric``."""
    means = {}
    for kind, r in raw.kinds().items():
        h, m = r.per_pair(metric)
        means[kind] = (h.double().nanmean(0), m.double().nanmean(0))  # [L, H], [L]; the guard's NaN pairs left out
    L, H = raw.exact.head_logit.shape[1:]
    out = []
    for layer in range(L):
        for head in range(H):
            out.append(SenderRow("head", layer, head, {k: float(v[0][layer, head]) for k, v in means.items()}))
        out.append(SenderRow("mlp", layer, -1, {k: float(v[1][layer]) for k, v in means.items()}))
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties: :func:`scipy.stats.spearmanr`); nan when either side is
    constant."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


@dataclass(frozen=True)
class Agreement:
    """How well an estimate ranks the senders like the exact values do (most negative effect first)."""

    exact: str
    estimate: str
    spearman: float
    overlap: dict[int, int]        # k -> |top-k exact ∩ top-k estimate|
    missed: dict[int, list[str]]   # k -> in the exact top-k, not in the estimate's
    invented: dict[int, list[str]] # k -> in the estimate's top-k, not in the exact one
    max_abs_error: float


def agreement(rows: Sequence[SenderRow], exact: str = "exact", estimate: str = "atp",
              ks: Sequence[int] = (5, 10), components: Sequence[str] = ("head",)) -> Agreement:
    """Spearman and top-k agreement of ``estimate`` with ``exact`` over the senders of ``components``."""
    sel = [r for r in rows if r.component in components]
    e = [r.values[exact] for r in sel]
    a = [r.values[estimate] for r in sel]

    def top(key: str, k: int) -> list[str]:
        return [r.name for r in sorted(sel, key=lambda r: r.values[key])[:k]]

    overlap, missed, invented = {}, {}, {}
    for k in ks:
        te, ta = top(exact, k), top(estimate, k)
        overlap[k] = len(set(te) & set(ta))
        missed[k] = [n for n in te if n not in ta]
        invented[k] = [n for n in ta if n not in te]
    err = max((abs(x - y) for x, y in zip(e, a)), default=0.0)
    return Agreement(exact, estimate, spearman(e, a), overlap, missed, invented, err)


# ---------------------------------------------------------------------------------------------
# cached run (CLI and pages)
# ---------------------------------------------------------------------------------------------

@dataclass
class AttributionTable:
    """Per-sender means of every kind and metric, as stored in the result cache, with the timings."""

    n_layers: int
    n_heads: int
    n_pairs: int
    rows: dict[str, list[SenderRow]]  # metric -> rows
    seconds: dict[str, float]

    def kinds(self) -> list[str]:
        first = next(iter(self.rows.values()))
        return list(first[0].values) if first else []


@dataclass(frozen=True)
class KindValue(Component):
    """One stored number of an :class:`AttributionTable`: a sender's mean ``metric`` under one kind."""

    kind: str
    metric: str
    value: float


def cached_attribution(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None, total: bool = True,
                       progress: ProgressFn | None = None) -> tuple[AttributionTable, bool]:
    """Attribution vs exact patching through the result cache: (table, computed)."""
    from engine.results import run_cached_rows

    f = backend.facts
    metrics = ("effect", "logit_diff")
    params = {"dtype": f.dtype, "total": total, "position": "END", "metrics": list(metrics)}

    def compute():
        raw = attribution(backend, pairs, total=total, progress=progress)
        out = [KindValue(r.component, r.layer, r.head, kind, metric, v)
               for metric in metrics for r in sender_rows(raw, metric) for kind, v in r.values.items()]
        fallbacks = [r.fallback for r in raw.kinds().values() if r.fallback]
        return out, {"n_layers": f.n_layers, "n_heads": f.n_heads, "n_pairs": len(pairs),
                     "seconds": raw.seconds, "fallback": " ".join(fallbacks)}

    stored, art, computed = run_cached_rows(backend, pairs, METHOD, params, compute, KindValue, cache=cache)
    if art.get("fallback"):
        note(art["fallback"])
    rows: dict[str, list[SenderRow]] = {}
    for r in wide_rows(stored, column="kind", first=lambda v: {"metric": v.metric}):
        metric, component, layer, head = (r.pop(k) for k in ("metric", "component", "layer", "head"))
        rows.setdefault(metric, []).append(SenderRow(component, layer, head, r))
    return (AttributionTable(int(art["n_layers"]), int(art["n_heads"]), int(art["n_pairs"]), rows,
                             {k: float(v) for k, v in dict(art.get("seconds", {})).items()}), computed)

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine attribution``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """One CSV row per sender (exact, AtP, error); prints how well AtP ranks the senders and the seconds."""
    pairs = ctx.pairs
    with ctx.progress("attribution") as bar:
        table, computed = cached_attribution(ctx.model, pairs, cache=ctx.cache, total=not args.no_total,
                                             progress=bar)
    rows = table.rows[args.metric]
    out = []
    for r in rows:
        row = {"component": r.component, "layer": r.layer, "head": r.head, "exact": r.values["exact"],
               "atp": r.values["atp"], "abs_error": abs(r.values["exact"] - r.values["atp"])}
        if "exact_total" in r.values:
            row.update(exact_total=r.values["exact_total"], atp_total=r.values["atp_total"])
        out.append(row)
    ctx.write_csv(args.out, out)
    comparisons = [("exact", "atp")] + ([("exact_total", "atp_total")] if not args.no_total else [])
    summary = {}
    for exact, est in comparisons:
        ag = agreement(rows, exact, est)
        summary[f"{est} vs {exact}"] = {"spearman": ag.spearman, "top5_overlap": ag.overlap[5],
                                        "top10_overlap": ag.overlap[10], "missed_top10": ag.missed[10],
                                        "invented_top10": ag.invented[10], "max_abs_error": ag.max_abs_error}
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "metric": args.metric,
            "senders": len(out), "agreement (heads)": summary, "seconds": table.seconds}
