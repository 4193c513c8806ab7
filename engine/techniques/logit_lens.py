"""Logit lens of the answer: from which layer on does the residual stream at END already say C?

The logit lens (nostalgebraist 2020) reads an intermediate residual stream as if it were the last
one: for every layer l, the END position's ``resid_post[l]`` goes through the model's final norm and
unembedding (and whatever the model does to its logits after that: Gemma 2's soft cap, Cohere's
scale), and we read the answer token's probability and rank among the whole vocabulary::

    p_l(C)    = softmax(transform(LN_final(resid_post[l, END]) @ W_U + b_U))[C]
    rank_l(C) = 1 + #{tokens t : logit_l(t) > logit_l(C)}

It is the residual-stream counterpart of the paper's Figure 6 (MLP projections on the number
tokens, :mod:`engine.techniques.mlp_projections`): in the paper's models the answer appears in the middle-to-late
layers, after the key heads have moved the operands to END and as the MLPs write it.  Layer ``-1``
is the embedding (``resid_pre[0]``).  One forward pass per batch; the unembedding is applied to the
END rows only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import batches, check_pairs, pad, pad_id
from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, fallback_note, logit_scale
from engine.progress import ProgressFn, note
from engine.prompts.pairs import PromptPair, groups_of

METHOD = "logit_lens"


@dataclass
class LensRaw:
    """Per pair and layer: the answer's probability and rank at END.  Layers -1 (embedding) .. L-1."""

    pairs: list[PromptPair]
    layers: list[int]
    prob: torch.Tensor   # [P, L + 1]
    rank: torch.Tensor   # [P, L + 1]  (1 = top token)
    top_id: torch.Tensor  # [P, L + 1]  the top token's id
    fallback: str | None = None  # why the model's own last steps computed it (None: the backend's components)


@torch.no_grad()
def logit_lens_ids(backend: ModelBackend, seqs: Sequence[Sequence[int]], answers: Sequence[int]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str | None]:
    """(prob, rank, top_id), each [n, L + 1], of ``answers[i]`` at the last position of ``seqs[i]``, and the
    fallback note (None when the backend's final components reproduce the model's own last logits)."""
    L = backend.facts.n_layers
    names = [hooks.resid_pre(0)] + [hooks.resid_post(layer) for layer in range(L)]
    ids, mask, end = pad(seqs, pad_id(backend))
    rows = torch.arange(len(seqs))
    lg_model, cache = backend.run_with_cache_at(ids, mask, names, end[:, None])  # only END unembedded
    model_end = lg_model[:, 0].float()  # [n, vocab]
    del lg_model
    xs = [cache[name][rows.to(cache[name].device), end.to(cache[name].device)] for name in names]  # [n, d_model]
    answer = torch.tensor(list(answers), device=backend.device)
    fallback = None
    try:  # the final norm, the unembedding, its soft cap / scale -- checked on the last stream
        lens = [backend.final_logits(x).float() for x in xs]
        check_reproduces("the final norm and unembedding on the last residual stream",
                         lens[-1][torch.arange(len(seqs)), answer.to(lens[-1].device)],
                         model_end[torch.arange(len(seqs)), answer.to(model_end.device)], logit_scale(model_end),
                         backend.facts.dtype)
    except ShortcutMismatch as e:
        lens = _hooked_lens(backend, ids, mask, end, xs)
        fallback = fallback_note("logit lens", str(e))
    prob, rank, top = [], [], []
    for lg in lens:  # [n, vocab]
        a = lg.gather(1, answer[:, None].to(lg.device))  # [n, 1]
        prob.append(torch.softmax(lg, -1).gather(1, answer[:, None].to(lg.device))[:, 0].cpu())
        rank.append(((lg > a).sum(-1) + 1).cpu())
        top.append(lg.argmax(-1).cpu())
    return torch.stack(prob, 1), torch.stack(rank, 1), torch.stack(top, 1), fallback


def _hooked_lens(backend: ModelBackend, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor,
                 xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The lens through the model's own last steps: one row per (stream, prompt) whose final norm reads that
    stream at END (``hooks.ln_final_in`` replaced), the logits at END.  # S of [n, vocab]"""
    S, n = len(xs), ids.shape[0]
    stacked = torch.cat(list(xs))  # [S * n, d_model]
    ends = end.repeat(S)

    def put(act: torch.Tensor) -> torch.Tensor:  # [S * n, pos, d_model]
        act[torch.arange(S * n, device=act.device), ends.to(act.device)] = stacked.to(act.device, act.dtype)
        return act
    try:
        with backend.hooks([(hooks.ln_final_in(), put)]):
            lg = backend.end_logits(ids.repeat(S, 1), mask.repeat(S, 1), ends).float()  # [S * n, vocab]
    except KeyError as e:
        raise ValueError(f"the logit lens needs the model's final norm as a hook point, and this model has none "
                         f"({e})") from None
    return list(lg.reshape(S, n, -1))


def logit_lens_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32):
    """The forward work of :func:`logit_lens` (``engine.cost.Work``): one pass per batch (END unembedded), and the
    final norm and unembedding of every layer's END stream."""
    from engine.cost import padded_passes
    w = padded_passes([p.ref_ids for p in pairs], batch_size)
    return w + type(w)(unembed=len(pairs) * (backend.facts.n_layers + 1))


def logit_lens(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
               progress: ProgressFn | None = None) -> LensRaw:
    """The answer's probability and rank at END after every layer, for every reference prompt."""
    check_pairs(pairs, backend.facts.vocab_size)
    prob, rank, top = [], [], []
    fallback = None
    chunks = batches(len(pairs), batch_size)
    for ci, idx in enumerate(chunks):
        chunk = [pairs[i] for i in idx]
        p, r, t, why = logit_lens_ids(backend, [c.ref_ids for c in chunk], [c.answer_id for c in chunk])
        fallback = fallback or why
        prob.append(p)
        rank.append(r)
        top.append(t)
        if progress is not None:
            progress(ci + 1, len(chunks))
    L = backend.facts.n_layers
    return LensRaw(list(pairs), list(range(-1, L)), torch.cat(prob), torch.cat(rank), torch.cat(top), fallback)


@dataclass(frozen=True)
class LensRow:
    layer: int          # -1 = embedding
    group: str          # "*", "op:add", ...
    mean_prob: float
    median_rank: float
    top1: float         # fraction of prompts whose top token is the answer


def summarize(raw: LensRaw) -> list[LensRow]:
    """Mean probability, median rank and top-1 rate per layer, for all pairs and per operation."""
    out = []
    for g, idx in groups_of(raw.pairs, by=("op",)).items():
        ix = torch.tensor(idx)
        for j, layer in enumerate(raw.layers):
            out.append(LensRow(layer, g, float(raw.prob[ix, j].double().mean()),
                               float(raw.rank[ix, j].double().median()), float((raw.rank[ix, j] == 1).double().mean())))
    return out


def cached_logit_lens(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                      progress: ProgressFn | None = None) -> tuple[list[LensRow], bool]:
    """Logit lens summary through the result cache: (rows, computed)."""
    from engine.results import run_cached_rows

    params = {"dtype": backend.facts.dtype, "position": "END", "stream": "resid_post"}

    def compute():
        raw = logit_lens(backend, pairs, progress=progress)
        return summarize(raw), {"n_layers": backend.facts.n_layers, "fallback": raw.fallback or ""}

    rows, art, computed = run_cached_rows(backend, pairs, METHOD, params, compute, LensRow,
                                          ("mean_prob", "median_rank", "top1"), cache)
    if art.get("fallback"):
        note(art["fallback"])
    return sorted(rows, key=lambda r: (r.group != "*", r.group, r.layer)), computed

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine logit-lens``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """One CSV row per group and layer; prints where the answer first tops half of the prompts."""
    pairs = ctx.pairs
    with ctx.progress("logit lens") as bar:
        rows, computed = cached_logit_lens(ctx.model, pairs, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    overall = [r for r in rows if r.group == "*"]
    first = first_top1_layer(overall)
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
            "first_layer_answer_is_top1_for_half": None if first is None else first.layer,
            "per_layer": [r.__dict__ for r in overall]}

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def first_top1_layer(rows: Sequence[LensRow]) -> LensRow | None:
    """The first layer (in order) where the answer is the top token for at least half of the prompts."""
    return next((r for r in rows if r.top1 >= 0.5), None)


def top1_words(rows: Sequence[LensRow]) -> str:
    """Where the answer is the top token for at least half of the prompts, in words true of every layer of ``rows``
    (one group's, in order): "from layer L on" only when no later layer falls below half again; otherwise the
    first such layer, how many of the later ones keep it, and the last layer's share."""
    first = first_top1_layer(rows)
    if first is None:
        return "the answer never tops the lens for half of the prompts"
    where = "the embedding" if first.layer < 0 else f"layer {first.layer}"
    later = [r for r in rows if r.layer > first.layer]
    kept = sum(r.top1 >= 0.5 for r in later)
    if kept == len(later):
        return f"the answer is the top token for at least half of the prompts from {where} on"
    share = f"{rows[-1].top1:.0%} of them"
    after = (f"but not at the last layer: {share}" if len(later) == 1 else
             f"{'but at none' if kept == 0 else f'and at {kept}'} of the {len(later)} layers after it; "
             f"{share} after the last layer")
    return f"the answer is the top token for at least half of the prompts first at {where} ({after})"


def finding(model, pairs, cache, table) -> str | None:
    """Where the answer appears in the residual stream (the logit lens of Fig. 6's story)."""
    from engine.results import NotCached
    try:
        rows, _ = cached_logit_lens(model, pairs, cache=cache)
    except NotCached:
        return None
    overall = [r for r in rows if r.group == "*"]
    first, last = first_top1_layer(overall), overall[-1]
    if first is None:
        return "Read through the logit lens, the answer never tops the last token's prediction for half of the prompts."
    return (f"Read through the logit lens, the answer becomes the top token for half of the prompts after "
            f"{'the embedding' if first.layer < 0 else f'layer {first.layer}'} (P = {first.mean_prob:.2f}), "
            f"and reaches P = {last.mean_prob:.2f} after the last layer.")
