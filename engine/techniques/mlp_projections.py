"""MLP projections onto number tokens: where the answer is built (Zhang et al. 2024, §4.2, Fig. 6).

At the END position of each reference prompt and each layer l:

* ``mlp_in``: the MLP's input residual stream (before its norm), ``hook_mlp_in`` = resid_mid[l];
* ``contribution``: what the MLP adds to the residual stream, MLP_out - MLP_in =
  resid_post[l] - resid_mid[l], which is ``hook_mlp_out`` for sequential blocks.

Against the **unembedding vectors** w_t = W_U[:, t] of number tokens -- A, B and C being the first
tokens the model would emit for the operands and the answer (the answer-token rule) -- we report

* ``cos_in_A``  = cos(mlp_in, w_A),  ``cos_in_B`` = cos(mlp_in, w_B): do the operands arrive?
* ``cos_out_C`` = cos(contribution, w_C): does the MLP write the answer?
* ``cos_out_other`` = mean over the other number tokens n != C of cos(contribution, w_n): a baseline.

All cosines use the raw vectors (no final norm, no centring): cos(x, w) = x.w / (|x| |w|).
"Number tokens" are the distinct first tokens of the numbers 0..99 under the same rule.

Null of random directions (the Paper row's control, :func:`projections_with_pairs`): per layer, the mean over
the pairs of cos(contribution, r) for a random Gaussian direction r drawn per pair, ``RANDOM_DIRECTIONS``
times (seeded); its 95th percentile is what a direction unrelated to the answer reaches on this sample.
For one prompt, :func:`top_number_tokens` lists each layer's number tokens with the largest raw
projection contribution . w_n (Fig. 6c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import pad, pad_id
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptError, PromptPair, answer_tokens

METHOD = "mlp_projection"
METRICS: tuple[str, ...] = ("cos_in_A", "cos_in_B", "cos_out_C", "cos_out_other")


def number_token(backend: ModelBackend, prompt: str, n: int) -> int:
    """The first token the model would write for number ``n`` after ``prompt``."""
    return answer_tokens(backend.tokenizer, prompt, n).answer_id


def number_tokens(backend: ModelBackend, prompt: str, upto: int = 99) -> dict[int, int]:
    """{token id: smallest number whose first token it is} for 0..upto."""
    out: dict[int, int] = {}
    for n in range(upto + 1):
        try:
            t = number_token(backend, prompt, n)
        except PromptError:
            continue
        out.setdefault(t, n)
    return out


def _cos(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """cos between rows: x [..., d], w [..., d] -> [...]"""
    return (x * w).sum(-1) / (x.norm(dim=-1) * w.norm(dim=-1)).clamp_min(1e-12)


@dataclass(frozen=True)
class LayerProjection:
    layer: int
    metric: str
    value: float  # mean over pairs
    std: float


def projections_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64):
    """The forward work of :func:`projections_with_pairs` (``engine.cost.Work``): one pass per batch whose logits
    nobody reads (one position unembedded per row)."""
    from engine.cost import padded_passes
    return padded_passes([p.ref_ids for p in pairs], batch_size)


def mlp_projections(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64,
                    progress: ProgressFn | None = None) -> list[LayerProjection]:
    """Per-layer means (and spreads) of the four cosines of the module docstring."""
    return projections_with_pairs(backend, pairs, batch_size=batch_size, progress=progress)[0]


RANDOM_DIRECTIONS = 200


@torch.no_grad()
def projections_with_pairs(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64,
                           progress: ProgressFn | None = None
                           ) -> tuple[list[LayerProjection], dict[str, torch.Tensor], torch.Tensor]:
    """:func:`mlp_projections`'s rows, each pair's cosines {metric: [P, L]} (the intervals' input) and the
    null of random directions, [L] (module docstring)."""
    if not pairs:
        raise ValueError("no prompt pairs")
    L = backend.facts.n_layers
    W_U, _ = backend.unembed()
    W_U = W_U.float()
    names = [n for layer in range(L) for n in (hooks.mlp_in(layer), hooks.mlp_out(layer))]
    nums = torch.tensor(sorted(number_tokens(backend, pairs[0].ref_text)))
    vals: dict[str, list[torch.Tensor]] = {m: [] for m in METRICS}
    gen = torch.Generator().manual_seed(0)
    random_sum = torch.zeros(L, RANDOM_DIRECTIONS, dtype=torch.float64)
    pad_token = pad_id(backend)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_token)
        c = backend.activations(ids, mask, names)
        rows = torch.arange(len(chunk))
        x_in = torch.stack([c[hooks.mlp_in(j)][rows, end] for j in range(L)], 1).float().cpu()   # [b, L, d]
        x_out = torch.stack([c[hooks.mlp_out(j)][rows, end] for j in range(L)], 1).float().cpu()  # [b, L, d]
        a = torch.tensor([number_token(backend, p.ref_text, p.a) for p in chunk])
        b = torch.tensor([number_token(backend, p.ref_text, p.b) for p in chunk])
        cc = torch.tensor([p.answer_id for p in chunk])
        W = W_U.cpu()
        vals["cos_in_A"].append(_cos(x_in, W[:, a].T[:, None, :]))
        vals["cos_in_B"].append(_cos(x_in, W[:, b].T[:, None, :]))
        vals["cos_out_C"].append(_cos(x_out, W[:, cc].T[:, None, :]))
        wn = W[:, nums].T  # [N, d]
        cos_all = (x_out @ wn.T) / (x_out.norm(dim=-1, keepdim=True) * wn.norm(dim=-1)).clamp_min(1e-12)  # [b, L, N]
        other = nums[None, :] != cc[:, None]  # [b, N]
        vals["cos_out_other"].append((cos_all * other[:, None, :]).sum(-1) / other.sum(-1).clamp_min(1)[:, None])
        r = torch.randn(len(chunk), RANDOM_DIRECTIONS, x_out.shape[-1], generator=gen)  # [b, R, d]
        cos_r = torch.einsum("bld,brd->blr", x_out, r) / (
            x_out.norm(dim=-1)[:, :, None] * r.norm(dim=-1)[:, None, :]).clamp_min(1e-12)  # [b, L, R]
        random_sum += cos_r.double().sum(0)
        if progress is not None:
            progress(min(s + batch_size, len(pairs)), len(pairs))
    out, per_pair = [], {}
    for m in METRICS:
        t = per_pair[m] = torch.cat(vals[m])  # [P, L]
        for layer in range(L):
            out.append(LayerProjection(layer, m, float(t[:, layer].mean()), float(t[:, layer].std(unbiased=False))))
    null = torch.quantile(random_sum / len(pairs), 0.95, dim=1)  # [L]
    return out, per_pair, null


@dataclass(frozen=True)
class TopToken:
    layer: int
    rank: int          # 1 = the number this layer's MLP pushes most
    token: str
    number: int
    score: float
    answer: bool = False  # the answer's first token (listed with its rank even when it is not in the top k)


@torch.no_grad()
def top_number_tokens(backend: ModelBackend, prompt: str, ids: Sequence[int], *, k: int = 5,
                      answer_id: int | None = None) -> list[TopToken]:
    """For one prompt: each layer's k number tokens with the largest contribution . w_n (Fig. 6c).  With
    ``answer_id`` (the answer's first token, a number token of the prompt's table) that token is marked, and a
    layer whose top k misses it lists it too, with its rank among all the number tokens."""
    if not ids:
        raise ValueError("empty prompt")
    L = backend.facts.n_layers
    W_U, _ = backend.unembed()
    table = number_tokens(backend, prompt)
    nums = torch.tensor(sorted(table))
    names = [hooks.mlp_out(layer) for layer in range(L)]
    _, c = backend.run_with_cache(torch.tensor([list(ids)]), None, names)
    toks = backend.tokenizer.convert_ids_to_tokens(nums.tolist())
    where = (nums == answer_id).nonzero().flatten().tolist() if answer_id is not None else []
    out = []
    for layer in range(L):
        contrib = c[hooks.mlp_out(layer)][0, -1].float().cpu()
        scores = contrib @ W_U.float().cpu()[:, nums]  # [N]
        order = scores.argsort(descending=True, stable=True).tolist()
        shown = order[:min(k, len(nums))] + [i for i in where if i not in order[:k]]
        for i in shown:
            out.append(TopToken(layer, order.index(i) + 1, str(toks[i]), table[int(nums[i])], float(scores[i]),
                                i in where))
    return out


def cached_mlp_projections(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                           progress: ProgressFn | None = None) -> tuple[list[LayerProjection], bool]:
    """:func:`mlp_projections` through the result cache: (values, computed)."""
    rows, _, computed = _cached(backend, pairs, cache, progress)
    return sorted(rows, key=lambda v: (v.layer, v.metric)), computed


def cached_answer_cosines(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                          progress: ProgressFn | None = None):
    """(cos_out_C [P, L], cos_out_other [P, L], random-direction null [L]) as numpy arrays, through the cache
    (the same cached result as :func:`cached_mlp_projections`)."""
    from engine.results import decode_array
    art = _cached(backend, pairs, cache, progress)[1]
    return decode_array(art["cos_out_C"]), decode_array(art["cos_out_other"]), decode_array(art["random_null"])


def _cached(backend: ModelBackend, pairs: Sequence[PromptPair], cache, progress: ProgressFn | None):
    from engine.results import encode_array, run_cached_rows

    def compute():
        rows, per_pair, null = projections_with_pairs(backend, pairs, progress=progress)
        return rows, {"cos_out_C": encode_array(per_pair["cos_out_C"]),
                      "cos_out_other": encode_array(per_pair["cos_out_other"]), "random_null": encode_array(null)}

    params = {"metrics": list(METRICS), "dtype": backend.facts.dtype,
              "per_pair": ["cos_out_C", "cos_out_other"], "random_directions": RANDOM_DIRECTIONS}
    return run_cached_rows(backend, pairs, METHOD, params, compute, LayerProjection, ("value", "std"), cache)

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def answer_mlp(cos_c: np.ndarray, cos_o: np.ndarray):
    """(the MLP whose contribution is most aligned with the answer's unembedding on average, its cosine's 95 %
    interval over the pairs, the interval of its gap over the other numbers' cosine) from ``cos_c`` / ``cos_o``
    [P, L] (:func:`cached_answer_cosines`): what the summary sentence and the Paper page's check judge."""
    from engine.numerics.intervals import interval
    best = int(np.argmax(cos_c.mean(0)))
    c = interval(lambda idx: float(cos_c[idx, best].mean()), len(cos_c))
    gap = interval(lambda idx: float((cos_c[idx, best] - cos_o[idx, best]).mean()), len(cos_c))
    return best, c, gap


def finding(model, pairs, cache, table) -> str:
    """The MLPs that write the answer (path patching's MLP senders; Fig. 6's projections when cached): the MLP
    whose contribution is most aligned with the answer's unembedding, and whether it is more aligned with the
    answer than with the other numbers (the gap's 95 % interval over the pairs, as the Paper page judges it)."""
    from engine.results import NotCached
    mlps = [v for v in table.values if v.component == "mlp" and v.metric == "effect" and v.group == "*"]
    strongest = min(mlps, key=lambda v: v.value)
    text = (f"MLP {strongest.layer}'s output at the last token matters most: patching it alone changes the "
            f"answer logit by {strongest.value:+.2f} (relative).")
    try:
        cos_c, cos_o, _ = cached_answer_cosines(model, pairs, cache=cache)  # [P, L] each
    except NotCached:
        return text
    best, _, gap = answer_mlp(cos_c, cos_o)
    a, b = float(cos_c[:, best].mean()), float(cos_o[:, best].mean())
    if gap.above(0.0):
        return text + (f" MLP {best}'s contribution points most towards the answer's unembedding (cos {a:.2f} vs "
                       f"{b:.2f} for other numbers; gap {gap.text('{:+.2f}')}).")
    return text + (f" MLP {best}'s contribution is the most aligned with the answer's unembedding (cos {a:.2f}), "
                   f"but not shown to be more than with the other numbers' ({b:.2f}; gap {gap.text('{:+.2f}')}, "
                   f"95 % interval over the pairs).")

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine mlp-projections``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Per layer: MLP in/out cosines with W_U of A, B, C -> CSV; ``--text``: that prompt's top number tokens."""
    typed = ctx.typed(args.text)
    pairs = ctx.pairs
    with ctx.progress("MLP projections") as bar:
        vals, computed = cached_mlp_projections(ctx.model, pairs, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [v.__dict__ for v in vals])
    res: dict = {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
                 "answer_tokens": ctx.answer_tokens(pairs), "per_layer": [v.__dict__ for v in vals]}
    if typed is not None:
        res.update(ctx.typed_summary(typed))
        res["top_number_tokens"] = [t.__dict__ for t in top_number_tokens(ctx.model, args.text, typed.ids)]
    return res
