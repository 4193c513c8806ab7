"""Plain references the exactness tests compare the product's fast paths with.

Each is the method as written, one full forward pass at a time with full ``[batch, pos, vocab]``
logits, and no batching trick: slow, obviously right.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.machinery.batching import pad, pad_id
from engine.techniques.knockout import Knockout, MeanActivations, knocked_out
from engine.techniques.knockout_curve import CurvePoint, curve_knockouts


@torch.no_grad()
def knockout_accuracy_full_logits(backend, pairs, ko: Knockout, means: MeanActivations) -> float:
    """First-token accuracy under ``ko``: one prompt at a time, full logits, then the END row."""
    right = 0
    for p in pairs:
        ids, mask, end = pad([p.ref_ids], pad_id(backend))
        with knocked_out(backend, ko, means, [p.template], end.tolist()):
            lg = backend.logits(ids, mask)  # [1, pos, vocab]
        right += int(int(lg[0, int(end[0])].argmax()) == p.answer_id)
    return right / len(pairs)


def knockout_curve_full_logits(backend, pairs, ranked_heads: Sequence[tuple[int, int]], means: MeanActivations, *,
                               k_max: int, draws: int, seed: int = 0) -> list[CurvePoint]:
    """Fig. 3's curve with every (k, draw) evaluated on its own (duplicates included)."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    out = []
    for k, top, rand in curve_knockouts(L, H, ranked_heads, k_max=k_max, draws=draws, seed=seed):
        t = torch.tensor([knockout_accuracy_full_logits(backend, pairs, ko, means) for ko in rand])
        out.append(CurvePoint(k, knockout_accuracy_full_logits(backend, pairs, top, means), float(t.mean()),
                              float(t.std(unbiased=False)), float(t.min()), float(t.max())))
    return out


@torch.no_grad()
def interchange_margin_full_logits(backend, pair, ko: Knockout) -> tuple[bool, float]:
    """One pair with the heads and MLPs of ``ko`` set to their values on the pair's own X_c at every position
    (interchange ablation), written out with plain hooks: (first answer token right, answer logit - mean logit)."""
    from engine.backends import hooks
    L = backend.facts.n_layers
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    _, cf = backend.run_with_cache(torch.tensor([pair.cf_ids]), None, names)
    edits = []
    for layer, head in ko.heads:
        def z(act, layer=layer, head=head):  # [1, pos, H, d_head]
            act = act.clone()
            act[:, :, head] = cf[hooks.attn_z(layer)][:, :, head].to(act.dtype)
            return act
        edits.append((hooks.attn_z(layer), z))
    for layer in ko.mlps:
        edits.append((hooks.mlp_out(layer), lambda act, layer=layer: cf[hooks.mlp_out(layer)].to(act.dtype)))
    with backend.hooks(edits):
        lg = backend.logits(torch.tensor([pair.ref_ids]))[0, -1].float()  # [vocab] at END
    return int(lg.argmax()) == pair.answer_id, float(lg[pair.answer_id] - lg.mean())


@torch.no_grad()
def mean_ablated_margin_full_logits(backend, pair, ko: Knockout, means: MeanActivations) -> tuple[bool, float]:
    """One pair under the mean-ablation knockout ``ko``, full logits: (right, answer logit - mean logit)."""
    ids, mask, end = pad([pair.ref_ids], pad_id(backend))
    with knocked_out(backend, ko, means, [pair.template], end.tolist()):
        lg = backend.logits(ids, mask)[0, int(end[0])].float()
    return int(lg.argmax()) == pair.answer_id, float(lg[pair.answer_id] - lg.mean())


def continued_readouts_equal_reference(backend, pairs, kos):
    """Counterfactual knockouts continue X_r's shared prefix (positions before the first token X_r and X_c differ
    in): the readouts equal the per-pair full-logits loop, and positions were continued, not rerun."""
    from engine.techniques.knockout import first_difference, knockout_end
    assert all(first_difference([p]) >= 1 for p in pairs)
    calls = []
    cont = backend.continue_end_logits

    def spy(prefix, rows, ids, **kw):
        calls.append((int(ids.shape[1]), kw.get("start")))
        return cont(prefix, rows, ids, **kw)
    backend.continue_end_logits = spy
    try:
        out = knockout_end(backend, pairs, kos, None, sets_per_pass=4)
    finally:
        del backend.continue_end_logits
    assert calls and all(start >= 1 for _, start in calls)
    for s, ko in enumerate(kos):
        for i, p in enumerate(pairs):
            right, margin = interchange_margin_full_logits(backend, p, ko)
            assert bool(out.right[s, i]) == right
            assert abs(float(out.margin[s, i]) - margin) < 1e-4 * max(1.0, abs(margin)), (s, i)
    return out



@torch.no_grad()
def prompt_knockout_full_logits(backend, ids, answer_id: int, ko: Knockout, means: MeanActivations
                                ) -> tuple[float, int]:
    """One typed prompt (no template: the mean over every X_c) under ``ko``, full logits: (P(answer), top token)."""
    with knocked_out(backend, ko, means, [None], [len(ids) - 1]):
        probs = torch.softmax(backend.logits(torch.tensor([list(ids)]))[0, -1].float(), -1)  # [vocab] at END
    return float(probs[answer_id]), int(probs.argmax())
