"""The patching core: S variants of the reference run, stacked as rows, one hooked forward pass each group.

Every exact patching technique of the lab that is not at a shortcut's floor is the same loop over
reference / counterfactual pairs (X_r, X_c):

1. Right-pad X_r and X_c (same lengths: one mask, one END index) and run both once, caching the
   activations the variants read (:func:`prepare`).
2. A *variant* is one patched version of the X_r run: a sender's END output from X_c (path and
   activation patching), a (layer, position) residual from X_c (layer x position patching), a
   sender seen through one receiver's input (head -> head).  S variants of P pairs are stacked as
   S * P rows: row ``s * P + i`` is pair i under variant s.
3. The technique says, for one group of variants, which activations each row's hook edits
   (``edits(group) -> [(hook name, fn)]``); the hooks below do the editing.
4. One forward pass per group, the unembedding applied at END only (``backend.end_logits``); the
   answer token's logit of every row is read: ``[S, P]`` patched logits, beside ``logit_o`` (and
   ``logit_c``) of the unpatched runs.

**From the first patched position** (:func:`from_position`, :func:`at_end`).  When every variant of a
group leaves the positions before p exactly as in X_r (a patch at p or later, every head frozen at
X_r), the rows need not run those positions: X_r's keys and values are kept once per prompt length
(``backend.prefix``, the model's own KV cache) and each row runs positions p .. END alone against
them (``backend.continue_end_logits``) -- the END token alone for a patch at END -- the same numbers.
That rests on the model's KV cache giving back what a whole forward pass gives, so :func:`patch_rows`
checks it first (:mod:`engine.machinery.shortcut`): the prompts continued with no edit at all must
give back the model's answer logits, else it raises ``ShortcutMismatch`` and the technique runs whole
prompts instead (:func:`whole_prompts`).

:func:`patch_rows` is exact: each row is computed exactly as if its variant were run alone
(rows do not interact in a transformer's forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

import torch

from engine.backends.base import ModelBackend
from engine.backends.hooks import HookName
from engine.machinery.batching import batches, check_pairs, pad, pad_id
from engine.machinery.shortcut import check_reproduces, logit_scale
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair

V = TypeVar("V")
HookFn = Callable[[torch.Tensor], torch.Tensor]
Edit = tuple[HookName, HookFn]


@dataclass
class PatchRun:
    """X_r and X_c of P pairs, right-padded, with their cached activations and unpatched answer logits."""

    pairs: list[PromptPair]
    ref: torch.Tensor      # [P, pos]  X_r ids
    mask: torch.Tensor     # [P, pos]  shared by X_r and X_c
    end: torch.Tensor      # [P]       END index
    answer: torch.Tensor   # [P]       answer token ids
    ref_cache: dict        # hook name -> [P, pos, ...] on X_r
    cf_cache: dict         # hook name -> [P, pos, ...] on X_c
    logit_o: torch.Tensor  # [P]  answer logit on X_r
    logit_c: torch.Tensor  # [P]  answer logit on X_c
    prefix: object = None  # X_r's keys and values (from_position), or None: rows run whole prompts
    start: int = 0         # with a prefix: ``ref`` continues its first ``start`` positions
    scale: torch.Tensor | None = None   # [P]  largest |logit| at END on X_r (the self-check's scale)
    prob_o: torch.Tensor | None = None  # [P]  answer probability on X_r
    whole: "PatchRun | None" = None     # with a prefix: the same run over whole prompts (the fallback)

    @property
    def n(self) -> int:
        return len(self.pairs)

    @property
    def rows(self) -> torch.Tensor:
        return torch.arange(self.n)

    def stacked(self, t: torch.Tensor, S: int) -> torch.Tensor:
        """``[P, ...]`` -> ``[S * P, ...]``: row s * P + i is ``t[i]``."""
        return t.repeat(S, *([1] * (t.dim() - 1)))


@torch.no_grad()
def prepare(backend: ModelBackend, pairs: Sequence[PromptPair], ref_names: Sequence[HookName],
            cf_names: Sequence[HookName]) -> PatchRun:
    """Step 1: pad the pairs, run X_r caching ``ref_names`` and X_c caching ``cf_names`` (only END unembedded)."""
    check_pairs(pairs, backend.facts.vocab_size)
    pid = pad_id(backend)
    ref, mask, end = pad([p.ref_ids for p in pairs], pid)
    cf, _, _ = pad([p.cf_ids for p in pairs], pid)
    answer = torch.tensor([p.answer_id for p in pairs])
    rows = torch.arange(len(pairs))
    lg_r, c_r = backend.run_with_cache_at(ref, mask, list(ref_names), end[:, None])  # [P, 1, vocab]
    end_r = lg_r[:, 0].float()                                                       # [P, vocab]
    logit_o = end_r[rows.to(end_r.device), answer.to(end_r.device)].cpu()
    prob_o = torch.softmax(end_r, -1)[rows.to(end_r.device), answer.to(end_r.device)].cpu()
    scale = logit_scale(end_r).cpu()
    del lg_r, end_r
    lg_c, c_c = backend.run_with_cache_at(cf, mask, list(cf_names), end[:, None])   # [P, 1, vocab]
    logit_c = lg_c[rows.to(lg_c.device), 0, answer.to(lg_c.device)].float().cpu()
    return PatchRun(list(pairs), ref, mask, end, answer, c_r, c_c, logit_o, logit_c, scale=scale, prob_o=prob_o)


def prepare_work(pairs: Sequence[PromptPair]):
    """The forward work of :func:`prepare` (``engine.cost.Work``): X_r and X_c padded, END unembedded."""
    from engine.cost import one_pass
    n, width = len(pairs), max(len(p.ref_ids) for p in pairs)
    return one_pass(n, width) * 2


def patch_rows_work(n_variants: int, n_prompts: int, width: int, *, rows_per_pass: int = 128, start: int = 0):
    """The forward work of :func:`patch_rows` (``engine.cost.Work``): ``n_variants`` variants of ``n_prompts``
    prompts of ``width`` positions, at most ``rows_per_pass`` rows per pass, END unembedded; ``start`` > 0: continued
    from a prefix of ``start`` positions (its self-check pass included)."""
    from engine.cost import NO_WORK, one_pass
    per = max(1, rows_per_pass // max(1, n_prompts))
    w = one_pass(n_prompts, width - start) if start else NO_WORK
    for g in range(0, n_variants, per):
        w += one_pass(min(per, n_variants - g) * n_prompts, width - start)
    return w


@torch.no_grad()
def from_position(backend: ModelBackend, run: PatchRun, start: int, prefix: object = None) -> PatchRun:
    """``run`` seen from position ``start`` on: ids, mask and caches of positions ``start ..`` END, X_r's keys
    and values of the positions before (``prefix``: ``backend.prefix`` of X_r without its END token, computed
    when not given).  The pairs must share one length (no padding); 1 <= start < length."""
    T = run.ref.shape[1]
    if not 1 <= start < T or not bool(run.mask.all()):
        raise ValueError("from_position needs prompts of one length (see batching.length_chunks) and "
                         f"1 <= start < {T}, got start={start}")

    def tail(cache: dict) -> dict:
        return {n: v[:, start:] for n, v in cache.items()}  # [P, T - start, ...]
    if prefix is None:
        prefix = backend.prefix(run.ref[:, :T - 1])
    return PatchRun(run.pairs, run.ref[:, start:], run.mask[:, start:], run.end - start, run.answer,
                    tail(run.ref_cache), tail(run.cf_cache), run.logit_o, run.logit_c, prefix=prefix, start=start,
                    scale=run.scale, prob_o=run.prob_o, whole=run)


def at_end(backend: ModelBackend, run: PatchRun) -> PatchRun:
    """``run`` seen from END alone (:func:`from_position` at the last position)."""
    return from_position(backend, run, run.ref.shape[1] - 1)


@torch.no_grad()
def patch_rows(backend: ModelBackend, run: PatchRun, variants: Sequence[V],
               edits: Callable[[Sequence[V]], list[Edit]], *, rows_per_pass: int = 128,
               progress: ProgressFn | None = None, with_prob: bool = False
               ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-4: the answer logit at END under every variant, ``[S, P]`` (exact); with ``with_prob`` also
    the answer's probability ``[S, P]`` (softmax over the vocabulary).

    ``edits(group)`` returns the hooks of one group of variants, whose rows are ``s * P + i`` with s
    the variant's index in the group; at most ``rows_per_pass`` rows (at least one variant) per pass.
    A run continued from a prefix is checked first (module docstring; ShortcutMismatch)."""
    if run.prefix is not None:
        check_continuation(backend, run)
    P = run.n
    out = torch.empty(len(variants), P)
    probs = torch.empty(len(variants), P) if with_prob else None
    groups = batches(len(variants), max(1, rows_per_pass // max(1, P)))
    for gi, grp in enumerate(groups):
        group = [variants[i] for i in grp]
        S = len(group)
        with backend.hooks(edits(group)):
            lg = _end_logits(backend, run, S)  # [S * P, vocab]
        ans = run.answer.repeat(S).to(lg.device)
        rows = torch.arange(S * P, device=lg.device)
        out[list(grp)] = lg[rows, ans].float().cpu().reshape(S, P)
        if probs is not None:
            probs[list(grp)] = torch.softmax(lg.float(), -1)[rows, ans].cpu().reshape(S, P)
        if progress is not None:
            progress(gi + 1, len(groups))
    return out if probs is None else (out, probs)


def _end_logits(backend: ModelBackend, run: PatchRun, S: int) -> torch.Tensor:
    """END logits of S stacked copies of the run's rows (under whatever hooks are active).  # [S * P, vocab]"""
    if run.prefix is None:
        return backend.end_logits(run.stacked(run.ref, S), run.stacked(run.mask, S), run.end.repeat(S))
    return backend.continue_end_logits(run.prefix, run.rows.repeat(S), run.stacked(run.ref, S), start=run.start)


def check_continuation(backend: ModelBackend, run: PatchRun) -> None:
    """The self-check of a continued run: its prompts, continued from X_r's keys and values with no edit at all,
    must give back the model's answer logits (ShortcutMismatch otherwise)."""
    lg = _end_logits(backend, run, 1)
    got = lg[torch.arange(run.n, device=lg.device), run.answer.to(lg.device)]
    scale = run.scale if run.scale is not None else run.logit_o.abs()
    check_reproduces(f"continuing the prompts from position {run.start} with the model's keys and values",
                     got, run.logit_o, scale, backend.facts.dtype)


def whole_prompts(run: PatchRun) -> PatchRun:
    """The run over whole prompts (itself when it is not continued from a prefix): the fallback."""
    return run.whole if run.whole is not None else run


# ---------------------------------------------------------------------------------------------
# the hooks: each edits an activation [S * P, pos, ...] in place and returns it
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slot(Generic[V]):
    """Rows ``s * P + i`` take the source's value at ``positions[i]`` (rows with a negative position are left);
    ``head``: only that head (an activation ``[.., pos, head, d_head]``)."""

    s: int
    positions: torch.Tensor  # [P]
    head: int | None = None


def replace(value: torch.Tensor) -> HookFn:
    """The whole activation becomes ``value`` (e.g. every head frozen at X_r)."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        act[...] = value.to(act.device, act.dtype)
        return act
    return fn


def replace_except_head(value: torch.Tensor, head: int) -> HookFn:
    """Every head becomes ``value`` but ``head``, which keeps what the pass computed.  # [S * P, pos, H, d_head]"""
    def fn(act: torch.Tensor) -> torch.Tensor:
        keep = act[:, :, head].clone()
        act[...] = value.to(act.device, act.dtype)
        act[:, :, head] = keep
        return act
    return fn


def take(source: torch.Tensor, slots: Sequence[Slot], P: int) -> HookFn:
    """Each slot's rows take ``source`` ([P, pos, ...], e.g. X_c's cache) at the slot's positions."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        for sl in slots:
            ok = torch.nonzero(sl.positions >= 0)[:, 0]
            pos = sl.positions[ok]
            r, p = (ok + sl.s * P).to(act.device), pos.to(act.device)
            if sl.head is None:
                act[r, p] = source[ok, pos].to(act.device, act.dtype)
            else:
                act[r, p, sl.head] = source[ok, pos, sl.head].to(act.device, act.dtype)
        return act
    return fn


def chain(*fns: HookFn) -> HookFn:
    """Several edits of one activation, in order."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        for f in fns:
            act = f(act)
        return act
    return fn
