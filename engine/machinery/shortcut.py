"""A fast path's self-check: before its numbers are reported, the shortcut must reproduce the model.

Every fast path of the lab rests on an assumption about the model -- how a block updates the residual
stream (the END chains of path patching and path AtP), that a prompt continued from the model's own keys
and values gives the same logits (head -> head and layer x position patching).  Each checks its own
unpatched result against the model's answer logit at END, for every pair, before it reports anything;
on a mismatch it raises :class:`ShortcutMismatch` and the technique runs its textbook loop instead (which
only freezes and replaces activations, so it is exact on any architecture), saying so in its result.

Tolerance: relative to each pair's logit scale (the largest |logit| at END), ``1e-4`` in float32 and the
dtype's rounding in 16-bit precision, where the shortcut and the textbook loop agree only to rounding
(docs/scaling.md, "Precision").  A wrong block model misses by tens of percent.
"""

from __future__ import annotations

import torch

#: relative tolerance of the self-check per dtype name (module docstring)
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2}


class ShortcutMismatch(RuntimeError):
    """A fast path did not reproduce the model's own result: the message says where and by how much."""


def check_reproduces(what: str, got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, dtype: str) -> None:
    """ShortcutMismatch unless ``got`` [P, ...] equals ``want`` [P] within the tolerance of ``dtype``,
    relative to ``scale`` [P] (each pair's largest |logit| at END)."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    scale = scale.detach().float().cpu().clamp_min(1e-6)
    want = want.reshape(want.shape + (1,) * (got.dim() - want.dim()))
    scale = scale.reshape(want.shape)
    rel = ((got - want).abs() / scale)
    worst = float(rel.nan_to_num(float("inf")).max()) if rel.numel() else 0.0
    tol = TOLERANCE.get(dtype, 1e-4)
    if not worst <= tol:
        raise ShortcutMismatch(f"{what} misses the model's answer logit by {worst:.2g} of the logit scale "
                               f"(tolerance {tol:g})")


def check_same(miss: str, got: torch.Tensor, want: torch.Tensor, dtype: str) -> None:
    """ShortcutMismatch unless ``got`` equals ``want`` (any shape) within the tolerance of ``dtype``, relative to
    ``want``'s largest |value|; the message is ``miss`` ("block 3 run alone misses the model's stream") and by how
    much."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
    if not err <= TOLERANCE.get(dtype, 1e-4):
        raise ShortcutMismatch(f"{miss} by {err:.2g} of its scale")


def logit_scale(end_logits: torch.Tensor) -> torch.Tensor:
    """Each row's largest |logit|: [P, vocab] -> [P]."""
    return end_logits.detach().float().abs().amax(-1)


def fallback_note(technique: str, why: str) -> str:
    """The one line a fallback adds to a result (CLI, page, cached artifacts)."""
    return (f"{technique}: the fast path did not reproduce this model ({why}); the textbook loop computed "
            f"these numbers instead (exact, slower)")
