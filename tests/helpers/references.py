"""Plain references the exactness tests compare the product's fast paths with.

Each is the method as written, one full forward pass at a time with full ``[batch, pos, vocab]``
logits, and no batching trick: slow, obviously right.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.techniques.batching import pad, pad_id
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
