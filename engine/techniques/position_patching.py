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
every layer) are exactly 0 and need no forward pass; the others are batched on the patching core
(:mod:`engine.machinery.patch_rows`), several (l, p) cells per pass, one row per prompt and cell.
A patch at position p leaves every position before p as in X_r's run, so (prompts grouped by length)
a cell's rows run positions p .. END alone against X_r's cached keys and values.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.backends.hooks import HookName
from engine.machinery.batching import TOKENS_PER_PASS, check_pairs, length_chunks
from engine.machinery.patch_rows import PatchRun, Slot, from_position, patch_rows, prepare, take
from engine.machinery.shortcut import ShortcutMismatch, fallback_note
from engine.progress import ProgressFn, Stages, note
from engine.prompts.pairs import PromptPair, groups_of

METHOD = "layer_position_patching"
RESTORED_MIN_GAP = 1e-3


@dataclass
class PositionRaw:
    """Per pair: the answer logit with resid_pre[l] at END-relative position p from X_c."""

    pairs: list[PromptPair]
    logit_o: torch.Tensor   # [P]
    logit_c: torch.Tensor   # [P]
    patched: torch.Tensor   # [P, L, W]  (nan where the prompt is shorter than p + 1)
    fallback: str | None = None  # why whole prompts were run (None: continued from X_r's keys and values)

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
    """Patch resid_pre[l] at every END-relative position p from X_c, for every layer l (exact).

    The prompts go by length; a cell at position p runs positions p .. END alone, against X_r's keys and
    values of the positions before p (:func:`engine.machinery.patch_rows.from_position`: nothing
    before p differs from X_r's run).  A backend that cannot keep keys and values runs whole prompts."""
    check_pairs(pairs, backend.facts.vocab_size)
    if backend.continues:
        try:
            return _layer_position_patching(backend, pairs, True, rows_per_pass, progress)
        except ShortcutMismatch as e:
            raw = _layer_position_patching(backend, pairs, False, rows_per_pass, progress)
            raw.fallback = fallback_note("layer x position patching", str(e))
            return raw
    return _layer_position_patching(backend, pairs, False, rows_per_pass, progress)


def position_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 128):
    """The forward work of :func:`layer_position_patching` (``engine.cost.Work``), at most: every (layer, position)
    cell counted (the cells whose X_r and X_c residuals agree are skipped when it runs); per chunk of one length
    X_r and X_c cached, X_r's keys and values, and each position's cells continued from it."""
    from engine.cost import NO_WORK, one_pass
    from engine.machinery.patch_rows import patch_rows_work, prepare_work
    L = backend.facts.n_layers
    if not backend.continues:
        T = max(len(p.ref_ids) for p in pairs)
        return prepare_work(pairs) + patch_rows_work(L * T, len(pairs), T, rows_per_pass=rows_per_pass)
    w = NO_WORK
    for idx in length_chunks(pairs, TOKENS_PER_PASS):
        chunk = [pairs[i] for i in idx]
        n, T = len(chunk), len(chunk[0].ref_ids)
        w += prepare_work(chunk) + one_pass(n, T - 1)
        w += patch_rows_work(L, n, T, rows_per_pass=rows_per_pass)  # position 0: whole prompts
        for start in range(1, T):
            w += patch_rows_work(L, n, T, rows_per_pass=rows_per_pass, start=start)
    return w


def _layer_position_patching(backend: ModelBackend, pairs: Sequence[PromptPair], continues: bool,
                             rows_per_pass: int, progress: ProgressFn | None) -> PositionRaw:
    L = backend.facts.n_layers
    names = [hooks.resid_pre(layer) for layer in range(L)]
    chunks = length_chunks(pairs, TOKENS_PER_PASS) if continues else [list(range(len(pairs)))]
    W = max(len(p.ref_ids) for p in pairs)
    patched = torch.full((len(pairs), L, W), float("nan"))  # [P, L, W]
    logit_o, logit_c = torch.empty(len(pairs)), torch.empty(len(pairs))
    steps = Stages(progress, [len(idx) for idx in chunks])
    for ci, idx in enumerate(chunks):
        run = prepare(backend, [pairs[i] for i in idx], names, names)
        logit_o[idx], logit_c[idx] = run.logit_o, run.logit_c
        cells = _cells(run, names, patched, idx)
        by_start: dict[int, list[tuple[int, int]]] = defaultdict(list)
        T = run.ref.shape[1]
        for layer, rel in cells:  # one length: a cell's position is T - 1 - rel for every prompt
            by_start[T - 1 - rel if continues else 0].append((layer, rel))
        prefix = backend.prefix(run.ref[:, :T - 1]) if any(st > 0 for st in by_start) else None
        parts = Stages(steps.stage(ci), [len(c) for c in by_start.values()])
        for si, (start, group_cells) in enumerate(sorted(by_start.items())):
            sub = from_position(backend, run, start, prefix) if start > 0 else run
            vals = patch_rows(backend, sub, group_cells, _edits(sub, names), rows_per_pass=rows_per_pass,
                              progress=parts.stage(si))  # [cells, P]
            for (layer, rel), v in zip(group_cells, vals):
                valid = run.end - rel >= 0
                patched[torch.tensor(idx)[valid], layer, rel] = v[valid]
    return PositionRaw(list(pairs), logit_o, logit_c, patched)


def _cells(run: PatchRun, names: Sequence[HookName], patched: torch.Tensor, idx: list[int]) -> list[tuple[int, int]]:
    """The (layer, rel) cells where some prompt's X_r and X_c residuals differ; the others are exactly the
    unpatched logit (written into ``patched`` at the prompts ``idx``)."""
    end, rows = run.end, run.rows
    cells = []
    for layer, name in enumerate(names):
        r, c = run.ref_cache[name], run.cf_cache[name]
        for rel in range(int(end.max()) + 1):
            valid = end - rel >= 0  # [P]
            pos = (end - rel)[valid]
            if torch.equal(r[rows[valid], pos], c[rows[valid], pos]):  # nothing to patch: the unpatched logit
                patched[torch.tensor(idx)[valid], layer, rel] = run.logit_o[valid]
            else:
                cells.append((layer, rel))
    return cells


def _edits(run: PatchRun, names: Sequence[HookName]):
    """Hooks of a group of (layer, rel) cells: row block s takes X_c's resid_pre[layer] at END - rel."""
    def edits(group: Sequence[tuple[int, int]]):
        return [(names[layer], take(run.cf_cache[names[layer]],
                                    [Slot(s, run.end - rel) for s, (lyr, rel) in enumerate(group) if lyr == layer],
                                    run.n))
                for layer in sorted({lyr for lyr, _ in group})]
    return edits


@dataclass(frozen=True)
class PositionCell:
    group: str     # "op:add" or "template:<id>" or "*"
    layer: int
    rel: int       # 0 = END
    token: str     # label of that position (from the group's first prompt)
    logit_diff: float
    restored: float


def group_pairs(pairs: Sequence[PromptPair], group: str) -> list[PromptPair]:
    """The pairs of one group; ValueError naming the set's groups when ``group`` is not one of them."""
    groups = groups_of(pairs)
    if group not in groups:
        raise ValueError(f"group {group!r} is not in this set: choose from {', '.join(sorted(groups))}")
    return [pairs[i] for i in groups[group]]


def summarize(raw: PositionRaw, tokens: Callable[[Sequence[int]], list[str]]) -> list[PositionCell]:
    """Mean of both metrics per cell, for all pairs, per operation and per template.

    ``tokens(ids)`` gives the human-readable token strings of a prompt (for the x-axis labels)."""
    groups = groups_of(raw.pairs)
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
                                   tokens: Callable[[Sequence[int]], list[str]], group: str | None = None,
                                   progress: ProgressFn | None = None) -> tuple[list[PositionCell], bool]:
    """Layer x position patching through the result cache: (cells, computed).

    ``group`` (``*``, ``op:add``, ``template:<id>``): only that group's pairs are patched and only its
    cells returned -- a template of a large set costs its own few prompts, not the whole set."""
    from engine.results import run_cached_rows

    params = {"dtype": backend.facts.dtype, "stream": "resid_pre", "positions": "from END"}
    mine = list(pairs) if group in (None, "*") else group_pairs(pairs, group)

    def compute():
        raw = layer_position_patching(backend, mine, progress=progress)
        return summarize(raw, tokens), {"fallback": raw.fallback or ""}

    cells, art, computed = run_cached_rows(backend, mine, METHOD, params, compute, PositionCell,
                                           ("logit_diff", "restored"), cache)
    if art.get("fallback"):
        note(art["fallback"])
    if group is not None:
        cells = [c for c in cells if c.group == group]
    return sorted(cells, key=lambda c: (c.group, c.layer, c.rel)), computed

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine position-patching``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Every (layer, END-relative position) cell, per group; ``--group`` patches only that group's pairs."""
    model, pairs = ctx.model, ctx.pairs
    tok = model.tokenizer
    groups = sorted(groups_of(pairs))
    if args.group is not None and args.group not in groups:
        raise ValueError(f"--group {args.group!r} is not in this set: choose from {', '.join(groups)}")
    with ctx.progress("layer x position patching") as bar:
        cells, computed = cached_layer_position_patching(
            model, pairs, cache=ctx.cache, tokens=lambda ids: tok.convert_ids_to_tokens(list(ids)),
            group=args.group, progress=bar)
    rows = [c.__dict__ for c in cells]
    ctx.write_csv(args.out, rows)
    top = sorted((c for c in cells if c.group == (args.group or "*")), key=lambda c: c.logit_diff)[:5]
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
            "patched_pairs": len(groups_of(pairs)[args.group or "*"]), "groups": groups,
            "cells": len(rows), "largest_drops": [c.__dict__ for c in top]}
