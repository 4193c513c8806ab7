"""Shifts at END: a vector added to the residual stream leaving a layer at one position of each prompt, the rest
of the model run, the answer read out -- the causal check's (:mod:`engine.techniques.numbers.causal`) and helix
patching's (:mod:`engine.techniques.helix_patch`).

At END, where it is less work, each shift continues X_r's keys and values before END
(:func:`engine.techniques.numbers.activations.prefixes`, computed once per prompt set) with END alone, after
checking that the unshifted continuation gives back the prompts' END logits; else every shift is a full pass.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from engine.backends.base import ModelBackend
from engine.machinery.batching import batches, pad, pad_id
from engine.prompts.pairs import PromptPair
from engine.techniques.numbers.activations import CONTINUE_ROWS, continuation_pays, prefixes, resid_hook


@torch.no_grad()
def shifted_readout(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, at: Sequence[int] | None,
                    shift: np.ndarray, tokens: np.ndarray | None = None, batch_size: int = 64
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt run with ``shift[i]`` [d] added to the residual stream leaving ``layer`` (-1: the embedding) at
    position ``at[i]`` (None: its END): (top next token at END [P], END logits of ``tokens[i]`` [P, m])."""
    top, picked = [], []
    for idx in batches(len(pairs), batch_size):
        ids, mask, end = pad([pairs[i].ref_ids for i in idx], pad_id(backend))
        where = end if at is None else torch.tensor([at[i] for i in idx])
        delta = torch.tensor(shift[list(idx)])

        def add(act: torch.Tensor, where=where, delta=delta) -> torch.Tensor:  # [b, pos, d_model]
            act = act.clone()
            rows = torch.arange(act.shape[0], device=act.device)
            act[rows, where.to(act.device)] += delta.to(act.device, act.dtype)
            return act

        with backend.hooks([(resid_hook(layer), add)]):
            logits = backend.end_logits(ids, mask, end)  # [b, vocab]
        top.append(logits.argmax(-1).cpu().numpy())
        if tokens is not None:
            want = torch.as_tensor(tokens[list(idx)], device=logits.device)  # [b, m]
            picked.append(logits.gather(1, want).double().cpu().numpy())
    return np.concatenate(top), (np.concatenate(picked) if tokens is not None else np.zeros((len(pairs), 0)))


def shifted_readouts(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, at: Sequence[int] | None,
                     shifts: Sequence[np.ndarray], tokens: np.ndarray | None = None,
                     end_logits: torch.Tensor | None = None, idx: Sequence[int] | None = None
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`shifted_readout` of each of ``shifts`` for the prompts ``idx`` of ``pairs`` (default all; ``at``,
    ``shift`` and ``tokens`` have one row per prompt of ``idx``).  At END (``at`` None) with the unshifted END
    logits of every pair ``end_logits`` [P, vocab] at hand, X_r's keys and values before END are computed once per
    prompt set (:func:`prefixes`) and each shift continues them with END alone (:func:`continued_readouts`) where
    that is less work; else full passes."""
    idx = list(range(len(pairs))) if idx is None else list(idx)
    if at is None and end_logits is not None and continuation_pays(backend, pairs, len(shifts)):
        done = continued_readouts(backend, pairs, layer, shifts, tokens, end_logits, idx)
        if done is not None:
            return done
    moved = [pairs[i] for i in idx]
    return [shifted_readout(backend, moved, layer, at, s, tokens) for s in shifts]


@torch.no_grad()
def continued_readouts(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, shifts: Sequence[np.ndarray],
                       tokens: np.ndarray | None, end_logits: torch.Tensor, idx: Sequence[int] | None = None
                       ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """:func:`shifted_readouts` at END from X_r's prefixes (:func:`prefixes`): the unshifted continuation must
    reproduce ``end_logits`` [P, vocab] (else None: the caller runs full passes); then each shift continues the
    prompts ``idx`` (default all) with END alone, ``shift[j]`` added to the residual of prompt ``idx[j]``."""
    from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, logit_scale
    idx = list(range(len(pairs))) if idx is None else list(idx)
    chunks = prefixes(backend, pairs)
    if chunks is None:
        return None
    row_of = {i: j for j, i in enumerate(idx)}  # prompt -> its row in shifts / tokens
    m = 0 if tokens is None else tokens.shape[1]
    out = [(np.zeros(len(idx), dtype=np.int64), np.zeros((len(idx), m))) for _ in shifts]
    for c in chunks:
        want = end_logits[c.idx]
        try:
            check_reproduces("continuing the prompts' END token from their own keys and values", c.clean, want,
                             logit_scale(want)[:, None].expand_as(want), backend.facts.dtype)
        except ShortcutMismatch:
            return None
        mine = [r for r, i in enumerate(c.idx) if i in row_of]  # rows of the chunk that are shifted
        if not mine:
            continue
        rows, to = torch.tensor(mine), [row_of[c.idx[r]] for r in mine]
        T = len(pairs[c.idx[0]].ref_ids)
        per_call = max(1, CONTINUE_ROWS // len(mine))  # shifts continued together: one call, their rows stacked
        for g in range(0, len(shifts), per_call):
            group = list(range(g, min(g + per_call, len(shifts))))
            delta = torch.cat([torch.tensor(shifts[k][to]) for k in group])  # [len(group) * n, d_model]

            def add(act: torch.Tensor, delta=delta) -> torch.Tensor:  # [len(group) * n, 1, d_model]: END alone
                act = act.clone()
                act[:, 0] += delta.to(act.device, act.dtype)
                return act

            with backend.hooks([(resid_hook(layer), add)]):
                lg = backend.continue_end_logits(c.cache, rows.repeat(len(group)), c.end_ids[rows].repeat(
                    len(group), 1), start=T - 1)  # [len(group) * n, vocab]
            for j, k in enumerate(group):
                part = lg[j * len(mine):(j + 1) * len(mine)]
                top, picked = out[k]
                top[to] = part.argmax(-1).cpu().numpy()
                if tokens is not None:
                    picked[to] = part.gather(1, torch.as_tensor(tokens[to], device=part.device)).double().cpu().numpy()
    return out


def shifted_top_tokens(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, shift: np.ndarray,
                       batch_size: int = 64) -> np.ndarray:
    """Top next token at END of each prompt with ``shift[i]`` added to resid_post[layer] at its END. [P]"""
    return shifted_readout(backend, pairs, layer, None, shift, batch_size=batch_size)[0]


def shifts_work(backend: ModelBackend, pairs: Sequence[PromptPair], n_shifts: int):
    """The forward work of :func:`shifted_readouts` of ``n_shifts`` shifts at END after
    :func:`.activations.residual_pass` (``engine.cost.Work``), at most: one END-only pass of the prompts per shift."""
    from engine.cost import padded_passes
    return padded_passes([p.ref_ids for p in pairs], 64) * n_shifts
