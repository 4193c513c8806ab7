"""Layer x position activation patching of the residual stream (Stolfo et al., EMNLP 2023 style).

Where do the operands and the operator travel to the last token?  For every layer l and position p,
the residual stream entering block l at position p is taken from the counterfactual run X_c (the
operation removed) while everything else runs on X_r, and we read the answer token's logit at END::

    logit_p(l, p) = logit_C( X_r  with  resid_pre[l][p] := resid_pre[l][p] on X_c )
    logit_diff    = logit_p - logit_o
    restored      = (logit_p - logit_o) / (logit_c - logit_o)    (1 = as bad as X_c itself)

``logit_o`` / ``logit_c`` are the answer logits on X_r / X_c.  At layer 0 only the operator's
position matters (X_r and X_c differ only there); in later layers the information shows up where
it has been moved -- in the paper's models, at the last token in the middle layers.  ``restored``
is left out (nan) where |logit_c - logit_o| < 1e-3: the counterfactual does not move the logit.

Positions are counted from END (``0`` = END, ``1`` = the token before, ...) so prompts of different
lengths line up; a template's cells are labelled with its first prompt's tokens, a mixed group's
(an operation, all prompts) with ``END``, ``END-1``, ...  Cells where X_r and X_c have
the same residual vector for every prompt (every position before the first differing token, in
every layer) are exactly 0 and need no forward pass; the others are batched, several (l, p) cells
per pass, one row of the batch per prompt and cell.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.prompts.pairs import PromptPair
from engine.techniques.batching import batches, check_pairs, pad, pad_id

ProgressFn = Callable[[int, int], None]
METHOD = "layer_position_patching"
RESTORED_MIN_GAP = 1e-3


@dataclass
class PositionRaw:
    """Per pair: the answer logit with resid_pre[l] at END-relative position p from X_c."""

    pairs: list[PromptPair]
    logit_o: torch.Tensor   # [P]
    logit_c: torch.Tensor   # [P]
    patched: torch.Tensor   # [P, L, W]  (nan where the prompt is shorter than p + 1)

    def metric(self, name: str) -> torch.Tensor:
        """[P, L, W] values of ``logit_diff`` or ``restored``."""
        diff = self.patched - self.logit_o[:, None, None]
        if name == "logit_diff":
            return diff
        if name == "restored":
            gap = (self.logit_c - self.logit_o)[:, None, None]
            return torch.where(gap.abs() >= RESTORED_MIN_GAP, diff / gap, torch.full_like(diff, float("nan")))
        raise ValueError(f"unknown metric {name!r}: choose logit_diff or restored")


@torch.no_grad()
def layer_position_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 128,
                            progress: ProgressFn | None = None) -> PositionRaw:
    """Patch resid_pre[l] at every END-relative position p from X_c, for every layer l (exact)."""
    f = backend.facts
    L = f.n_layers
    check_pairs(pairs, f.vocab_size)
    P = len(pairs)
    ref, mask, end = pad([p.ref_ids for p in pairs], pad_id(backend))
    cf, _, _ = pad([p.cf_ids for p in pairs], pad_id(backend))
    W = int(end.max()) + 1
    rows = torch.arange(P)
    answer = torch.tensor([p.answer_id for p in pairs])
    names = [hooks.resid_pre(layer) for layer in range(L)]
    lg_r, c_r = backend.run_with_cache(ref, mask, names)
    lg_c, c_c = backend.run_with_cache(cf, mask, names)
    logit_o = lg_r[rows, end, answer.to(lg_r.device)].float().cpu()
    logit_c = lg_c[rows, end, answer.to(lg_c.device)].float().cpu()
    patched = torch.full((P, L, W), float("nan"))
    cells = []
    for layer in range(L):
        for rel in range(W):
            pos = end - rel  # [P]
            valid = pos >= 0
            if not bool(valid.any()):
                continue
            r, c = c_r[names[layer]], c_c[names[layer]]
            same = torch.equal(r[rows[valid], pos[valid]], c[rows[valid], pos[valid]])
            if same:  # nothing to patch: exactly the unpatched logit
                patched[valid, layer, rel] = logit_o[valid]
            else:
                cells.append((layer, rel))
    per_pass = max(1, rows_per_pass // P)
    groups = batches(len(cells), per_pass)
    for gi, grp in enumerate(groups):
        group = [cells[i] for i in grp]
        S = len(group)
        edits = []
        for layer in sorted({lyr for lyr, _ in group}):
            slots = [(s, rel) for s, (lyr, rel) in enumerate(group) if lyr == layer]
            edits.append((names[layer], _patch_positions(slots, c_c[names[layer]], end, P)))
        with backend.hooks(edits):
            out = backend.logits(ref.repeat(S, 1), mask.repeat(S, 1))  # row s * P + i
        vals = out[torch.arange(S * P).to(out.device), end.repeat(S).to(out.device),
                   answer.repeat(S).to(out.device)].float().cpu().reshape(S, P)
        for s, (layer, rel) in enumerate(group):
            valid = end - rel >= 0
            patched[valid, layer, rel] = vals[s, valid]
        if progress is not None:
            progress(gi + 1, len(groups))
    return PositionRaw(list(pairs), logit_o, logit_c, patched)


def _patch_positions(slots: list[tuple[int, int]], resid_c: torch.Tensor, end: torch.Tensor, P: int):
    """Hook: row s * P + i gets X_c's residual vector at position end[i] - rel of its slot."""
    def fn(act: torch.Tensor) -> torch.Tensor:  # [S * P, pos, d_model]
        for s, rel in slots:
            pos = end - rel
            ok = torch.nonzero(pos >= 0)[:, 0]
            act[(ok + s * P).to(act.device), pos[ok].to(act.device)] = resid_c[ok, pos[ok]].to(act.device, act.dtype)
        return act
    return fn


@dataclass(frozen=True)
class PositionCell:
    group: str     # "op:add" or "template:<id>" or "*"
    layer: int
    rel: int       # 0 = END
    token: str     # label of that position (from the group's first prompt)
    logit_diff: float
    restored: float


def summarize(raw: PositionRaw, tokens: Callable[[Sequence[int]], list[str]]) -> list[PositionCell]:
    """Mean of both metrics per cell, for all pairs, per operation and per template.

    ``tokens(ids)`` gives the human-readable token strings of a prompt (for the x-axis labels)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(raw.pairs):
        groups["*"].append(i)
        groups[f"op:{p.op}"].append(i)
        groups[f"template:{p.template}"].append(i)
    diff, rest = raw.metric("logit_diff"), raw.metric("restored")
    out = []
    for g, idx in groups.items():
        ix = torch.tensor(idx)
        # one template: its first prompt's tokens; mixed templates: END-relative names
        labels = (list(reversed(tokens(raw.pairs[idx[0]].ref_ids))) if g.startswith("template:")
                  else [rel_label(rel) for rel in range(diff.shape[2])])
        d, r = _nanmean(diff[ix]), _nanmean(rest[ix])  # [L, W]
        for layer in range(d.shape[0]):
            for rel in range(d.shape[1]):
                if torch.isnan(d[layer, rel]):
                    continue
                label = labels[rel] if rel < len(labels) else ""
                out.append(PositionCell(g, layer, rel, label, float(d[layer, rel]), float(r[layer, rel])))
    return out


def rel_label(rel: int) -> str:
    """``END``, ``END-1``, ... for a position counted from END."""
    return "END" if rel == 0 else f"END-{rel}"


def _nanmean(t: torch.Tensor) -> torch.Tensor:
    """Mean over dim 0 ignoring nan (nan where every value is nan)."""
    ok = ~torch.isnan(t)
    s = torch.where(ok, t, torch.zeros_like(t)).double().sum(0)
    n = ok.sum(0)
    return torch.where(n > 0, s / n.clamp_min(1), torch.full_like(s, float("nan")))


def cached_layer_position_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                                   tokens: Callable[[Sequence[int]], list[str]],
                                   progress: ProgressFn | None = None) -> tuple[list[PositionCell], bool]:
    """Layer x position patching through the result cache: (cells, computed)."""
    from engine.results import run_cached_rows

    params = {"dtype": backend.facts.dtype, "stream": "resid_pre", "positions": "from END"}

    def compute():
        return summarize(layer_position_patching(backend, pairs, progress=progress), tokens), None

    cells, _, computed = run_cached_rows(backend, pairs, METHOD, params, compute, PositionCell,
                                         ("logit_diff", "restored"), cache)
    return sorted(cells, key=lambda c: (c.group, c.layer, c.rel)), computed
