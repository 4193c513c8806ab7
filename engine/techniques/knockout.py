"""Mean-ablation knockouts: does accuracy collapse without the key heads? (Zhang et al. 2024, §4.1, Fig. 3)

A knocked-out component's output is replaced by its **mean over the counterfactual prompts** X_c,
so that it carries no information about the operation while keeping its typical magnitude.

Averaging rule.  Activations are averaged position by position with prompts **aligned at the END**
(right-aligned: offset 0 is the last prompt token, offset 1 the one before ...), separately for each
template; prompts of one template then line up token for token even when a name or object takes a
different number of tokens.  A prompt whose template is not in the set (a typed prompt) gets the
mean over all counterfactual prompts, END-aligned.  An offset that some prompts lack is averaged
over those that have it; one that no prompt has keeps the prompt's own activation.

For heads, the ablated activation is the head's output before W_O (``hook_z``, [batch, pos, head,
d_head]); for MLPs, the MLP output (``hook_mlp_out``).

The validation curve built on it (Fig. 3: top-k vs k random heads) is :mod:`engine.techniques.knockout_curve`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import CALL_MACS_PER_LAYER, TOKENS_PER_PASS, length_chunks, pad, pad_id
from engine.progress import ProgressFn, current_check
from engine.prompts.pairs import PromptPair

ALL = "*"


@dataclass(frozen=True)
class Knockout:
    """What to ablate: heads as (layer, head) and whole MLP layers."""

    heads: tuple[tuple[int, int], ...] = ()
    mlps: tuple[int, ...] = ()

    def validate(self, n_layers: int, n_heads: int) -> "Knockout":
        for layer, head in self.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(f"head {layer}.{head} does not exist: layers 0..{n_layers - 1}, "
                                 f"heads 0..{n_heads - 1}")
        for layer in self.mlps:
            if not 0 <= layer < n_layers:
                raise ValueError(f"MLP {layer} does not exist: layers 0..{n_layers - 1}")
        return Knockout(tuple(sorted(set(self.heads))), tuple(sorted(set(self.mlps))))

    @property
    def empty(self) -> bool:
        return not self.heads and not self.mlps


def parse_heads(text: str, *, required: bool = False) -> tuple[tuple[int, int], ...]:
    """``"3.1,5.0"`` -> ((3, 1), (5, 0)); repeats dropped.  ``required``: an empty list is an error too.

    The one parser of head lists (CLI knockout/finetune, pages); a ValueError names the bad part."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        bits = part.split(".")
        if len(bits) != 2 or not all(b.isdigit() for b in bits):
            raise ValueError(f"bad head {part!r}: write heads as LAYER.HEAD, e.g. 3.1,5.0")
        out.append((int(bits[0]), int(bits[1])))
    if required and not out:
        raise ValueError("no heads given: write heads as LAYER.HEAD, e.g. 3.1,5.0")
    return tuple(dict.fromkeys(out))


def parse_mlps(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split(",") if p.strip())
    except ValueError:
        raise ValueError(f"MLP list {text!r} is not comma-separated layer numbers, e.g. 4,5") from None


@dataclass
class MeanActivations:
    """END-aligned means over X_c, per template and over all (``*``), stacked by group."""

    groups: list[str]      # group names; index 0 is ``*``
    z: torch.Tensor        # [G, L, T, H, d_head]; offset t counts back from END
    mlp: torch.Tensor      # [G, L, T, d_model]
    count: torch.Tensor    # [G, T] number of prompts that have offset t
    embed: torch.Tensor    # [G, T, d_model] the embedding stream (layer 0's input): edge circuits' ``input`` node

    def index(self, template: str | None) -> int:
        try:
            return self.groups.index(template) if template is not None else 0
        except ValueError:
            return 0


_MEMO: dict[tuple[str, str], MeanActivations] = {}


@torch.no_grad()
def forget_means() -> None:
    """Empty the memo of :func:`mean_activations` (the next call for a set runs its pass)."""
    _MEMO.clear()


def mean_activations_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64):
    """The forward work of :func:`mean_activations` (``engine.cost.Work``): none when it is memoised."""
    from engine.cost import NO_WORK, padded_passes
    from engine.prompts.pairs import prompt_set_hash
    if (backend.facts.fingerprint, prompt_set_hash(pairs)) in _MEMO:
        return NO_WORK
    return padded_passes([p.cf_ids for p in pairs], batch_size)


def mean_activations(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64
                     ) -> MeanActivations:
    """Means of every head's z, every MLP's output and the embedding stream over the counterfactual prompts.

    Memoized per (model fingerprint, prompt-set hash): a knockout page re-run reuses them.
    """
    from engine.prompts.pairs import prompt_set_hash
    if not pairs:
        raise ValueError("no prompt pairs to average over")
    key = (backend.facts.fingerprint, prompt_set_hash(pairs))
    if key in _MEMO:
        return _MEMO[key]
    L = backend.facts.n_layers
    names = [hooks.resid_pre(0)] + [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    T = max(len(p.cf_ids) for p in pairs)
    groups = [ALL] + sorted({p.template for p in pairs})
    gi = {g: i for i, g in enumerate(groups)}
    sums_z: torch.Tensor | None = None
    sums_m: torch.Tensor | None = None
    sums_e: torch.Tensor | None = None
    counts = torch.zeros(len(groups), T)
    pad_token = pad_id(backend)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.cf_ids for p in chunk], pad_token)
        c = backend.activations(ids, mask, names)
        z = torch.stack([c[hooks.attn_z(layer)] for layer in range(L)], 1).float().cpu()  # [b, L, pos, H, dh]
        m = torch.stack([c[hooks.mlp_out(layer)] for layer in range(L)], 1).float().cpu()  # [b, L, pos, d]
        e = c[hooks.resid_pre(0)].float().cpu()  # [b, pos, d]
        if sums_z is None:
            sums_z = torch.zeros((len(groups), L, T) + tuple(z.shape[3:]))
            sums_m = torch.zeros((len(groups), L, T, m.shape[-1]))
            sums_e = torch.zeros((len(groups), T, e.shape[-1]))
        for i, p in enumerate(chunk):
            n = int(end[i]) + 1
            zi = z[i, :, :n].flip(1)  # [L, n, H, dh], offset 0 = END
            mi = m[i, :, :n].flip(1)
            ei = e[i, :n].flip(0)
            for g in (0, gi[p.template]):
                sums_z[g, :, :n] += zi
                sums_m[g, :, :n] += mi
                sums_e[g, :n] += ei
                counts[g, :n] += 1
    denom = counts.clamp_min(1)
    out = MeanActivations(groups, sums_z / denom[:, None, :, None, None], sums_m / denom[:, None, :, None], counts,
                          sums_e / denom[:, :, None])
    if len(_MEMO) >= 16:
        _MEMO.pop(next(iter(_MEMO)))  # the oldest entry: the means just computed for another set stay
    _MEMO[key] = out
    return out


def end_aligned(mean: torch.Tensor, count: torch.Tensor, gidx: torch.Tensor, ends: torch.Tensor,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """END-aligned mean values for a batch, and where they apply.

    mean: [G, T, ...] (one layer), count: [G, T], gidx/ends: [b] -> ([b, width, ...], mask [b, width])
    """
    T = mean.shape[1]
    offs = ends[:, None] - torch.arange(width)[None, :]          # [b, width]: offset from END
    ok = (offs >= 0) & (offs < T)
    offs_c = offs.clamp(0, T - 1)
    ok &= count[gidx[:, None], offs_c] > 0
    return mean[gidx[:, None], offs_c], ok


def head_masks(kos: Sequence[Knockout], n_layers: int, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which heads / MLPs each knockout ablates: ([n, L, H] bool, [n, L] bool)."""
    heads = torch.zeros(len(kos), n_layers, n_heads, dtype=torch.bool)
    mlps = torch.zeros(len(kos), n_layers, dtype=torch.bool)
    for i, ko in enumerate(kos):
        for layer, head in ko.heads:
            heads[i, layer, head] = True
        for layer in ko.mlps:
            mlps[i, layer] = True
    return heads, mlps


Replacement = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (layer, width) -> (values, where)


@contextmanager
def replaced_rows(backend: ModelBackend, head_mask: torch.Tensor, mlp_mask: torch.Tensor, z_values: Replacement,
                  mlp_values: Replacement) -> Iterator[None]:
    """Within the block, forward passes replace masked heads' and MLPs' outputs **per row** of the batch.

    head_mask: [batch, L, H] bool (row r replaces head (l, h) where True); mlp_mask: [batch, L];
    ``z_values(layer, width)``: ([batch, width, H, d_head] values, [batch, width] bool where they apply);
    ``mlp_values(layer, width)``: ([batch, width, d_model], [batch, width]).  Rows of one batch may carry
    different masks, so several knockout sets share one forward pass.
    """
    L = backend.facts.n_layers

    def z_edit(layer: int):
        rows_heads = head_mask[:, layer]  # [batch, H]

        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, H, d_head]
            repl, ok = z_values(layer, act.shape[1])
            where = (ok[:, :, None] & rows_heads[:, None, :]).to(act.device)[..., None]  # [batch, pos, H, 1]
            return torch.where(where, repl.to(act.device, act.dtype), act)
        return fn

    def mlp_edit(layer: int):
        rows_on = mlp_mask[:, layer]  # [batch]

        def fn(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, d_model]
            repl, ok = mlp_values(layer, act.shape[1])
            where = (ok & rows_on[:, None]).to(act.device)[:, :, None]  # [batch, pos, 1]
            return torch.where(where, repl.to(act.device, act.dtype), act)
        return fn

    edits = [(hooks.attn_z(layer), z_edit(layer)) for layer in range(L) if bool(head_mask[:, layer].any())]
    edits += [(hooks.mlp_out(layer), mlp_edit(layer)) for layer in range(L) if bool(mlp_mask[:, layer].any())]
    check = current_check()
    if check is not None:  # a stop request ends the pass at the next layer, not at its end

        def probe(act: torch.Tensor) -> None:
            check()
        edits += [(hooks.resid_pre(layer), probe) for layer in range(L)]
    with backend.hooks(edits):
        yield


@contextmanager
def knocked_out_rows(backend: ModelBackend, head_mask: torch.Tensor, mlp_mask: torch.Tensor,
                     means: MeanActivations, templates: Sequence[str | None], ends: Sequence[int]
                     ) -> Iterator[None]:
    """Within the block, forward passes run with a mean-ablation knockout **per row** of the batch
    (:func:`replaced_rows`); templates / ends: one per row (which means apply, END-aligned)."""
    gidx = torch.tensor([means.index(t) for t in templates])
    end_t = torch.tensor(list(ends))
    with replaced_rows(backend, head_mask, mlp_mask,
                       lambda layer, width: end_aligned(means.z[:, layer], means.count, gidx, end_t, width),
                       lambda layer, width: end_aligned(means.mlp[:, layer], means.count, gidx, end_t, width)):
        yield


@contextmanager
def counterfactual_rows(backend: ModelBackend, head_mask: torch.Tensor, mlp_mask: torch.Tensor,
                        z_cf: torch.Tensor, mlp_cf: torch.Tensor, prompt_of: torch.Tensor, start: int = 0
                        ) -> Iterator[None]:
    """Within the block, the masked heads and MLPs of each row take their values on that row's own
    counterfactual prompt X_c, at every position (interchange ablation; X_r and X_c have the same length).

    z_cf: [n, L, pos, H, d_head]; mlp_cf: [n, L, pos, d_model]: the X_c activations of n prompts; ``prompt_of``
    [batch]: which of them each row of the batch is; ``start``: the forward passes run positions ``start ..``
    only (a continued prefix)."""
    every = torch.ones(len(prompt_of), z_cf.shape[2], dtype=torch.bool)

    def rows(x: torch.Tensor) -> torch.Tensor:  # [n, pos, ...] -> [batch, pos, ...]
        return x[prompt_of]
    with replaced_rows(backend, head_mask, mlp_mask,
                       lambda layer, width: (rows(z_cf[:, layer, start:start + width]), every[:, :width]),
                       lambda layer, width: (rows(mlp_cf[:, layer, start:start + width]), every[:, :width])):
        yield


@contextmanager
def knocked_out(backend: ModelBackend, ko: Knockout, means: MeanActivations,
                templates: Sequence[str | None], ends: Sequence[int]) -> Iterator[None]:
    """Within the block, forward passes of a batch (one template / END index per row) run ablated."""
    ko = ko.validate(backend.facts.n_layers, backend.facts.n_heads)
    heads, mlps = head_masks([ko], backend.facts.n_layers, backend.facts.n_heads)
    n = len(templates)
    with knocked_out_rows(backend, heads.expand(n, -1, -1), mlps.expand(n, -1), means, templates, ends):
        yield



def _padding_pays(backend: ModelBackend, pairs: Sequence[PromptPair], n_sets: int, n_chunks: int,
                  tokens_per_pass: int) -> bool:
    """True when one padded pass of every set costs less than one pass per prompt length: the work
    fits one pass and the padding's multiply-accumulates are fewer than the calls it saves (a small
    model, where a call's fixed cost dominates)."""
    from engine.backends.base import macs_per_position
    width = max(len(p.ref_ids) for p in pairs)
    if n_chunks <= 1 or n_sets * len(pairs) * width > tokens_per_pass:
        return False
    body, _, _ = macs_per_position(backend.facts)
    waste = n_sets * (len(pairs) * width - sum(len(p.ref_ids) for p in pairs)) * body
    return waste < (n_chunks - 1) * backend.facts.n_layers * CALL_MACS_PER_LAYER


def distinct_knockouts(kos: Sequence[Knockout], n_layers: int, n_heads: int) -> list[Knockout]:
    """The distinct knockout sets among ``kos`` (validated, so order and repeats do not matter)."""
    return list(dict.fromkeys(ko.validate(n_layers, n_heads) for ko in kos))


@torch.no_grad()
def knockout_accuracies(backend: ModelBackend, pairs: Sequence[PromptPair], kos: Sequence[Knockout],
                        means: MeanActivations, *, sets_per_pass: int | None = None,
                        tokens_per_pass: int = TOKENS_PER_PASS,
                        progress: ProgressFn | None = None) -> list[float]:
    """First-token accuracy of the reference prompts under each knockout of ``kos`` (:func:`knockout_correct`)."""
    right = knockout_correct(backend, pairs, kos, means, sets_per_pass=sets_per_pass,
                             tokens_per_pass=tokens_per_pass, progress=progress)
    return [float(r.sum()) / len(pairs) for r in right]


@torch.no_grad()
def knockout_correct(backend: ModelBackend, pairs: Sequence[PromptPair], kos: Sequence[Knockout],
                     means: MeanActivations, *, sets_per_pass: int | None = None,
                     tokens_per_pass: int = TOKENS_PER_PASS,
                     progress: ProgressFn | None = None) -> torch.Tensor:
    """[len(kos), P] bool: whether each reference prompt's first answer token is the top token under each
    knockout of ``kos`` (:func:`knockout_end`)."""
    return knockout_end(backend, pairs, kos, means, sets_per_pass=sets_per_pass, tokens_per_pass=tokens_per_pass,
                        progress=progress).right


@dataclass
class EndReadout:
    """What the END position says under each knockout set: K sets, P prompts."""

    right: torch.Tensor   # [K, P] bool: the first answer token is the top token
    margin: torch.Tensor  # [K, P] float32: the answer token's logit minus the mean logit over the vocabulary


@torch.no_grad()
def knockout_end(backend: ModelBackend, pairs: Sequence[PromptPair], kos: Sequence[Knockout],
                 means: MeanActivations | None, *, cells: torch.Tensor | None = None,
                 sets_per_pass: int | None = None, tokens_per_pass: int = TOKENS_PER_PASS,
                 progress: ProgressFn | None = None) -> EndReadout:
    """Each reference prompt's END readout (right or not, answer-logit margin) under each knockout of ``kos``;
    ``cells`` [len(kos), P] bool: only these (knockout, prompt) readouts (the others: not right, margin NaN).

    ``means`` None: **counterfactual** ablation -- a knocked-out component takes its value on the prompt's own
    X_c (:func:`counterfactual_rows`; one extra pass of X_c per chunk) instead of the mean over X_c.  X_r and
    X_c agree on every token before the first one they differ in (d), so every activation there is the same in
    both and no ablation changes it: the chunks then group prompts of one length *and* one d, and the sets'
    passes continue X_r's keys and values of the first d positions (``backend.prefix``), running only positions
    d .. END (:func:`_continued`; checked first on X_c, the textbook passes otherwise).

    Each **distinct** knockout set is evaluated once, reading only the END position's logits.  The
    prompts go in chunks of equal length (no padding, see :func:`length_chunks`), and several sets
    share one forward pass (the chunk's rows repeated, each copy with its own head mask): ``sets_per_pass``
    of them, or as many as fit ``tokens_per_pass``.  So the forward passes number, per chunk,
    ceil(distinct sets / sets per pass) (fewer with ``cells``: a pass carries as many rows).  Work that fits
    one pass anyway (every set x every prompt, padded, within ``tokens_per_pass``; ``sets_per_pass`` not given)
    is one padded pass when the padding costs less than the calls it saves (:func:`_padding_pays`: a small
    model).
    ``progress(done, total)`` is called after every pass (readouts so far, of every asked one); an exception
    raised there stops the computation.
    """
    if not pairs:
        raise ValueError("no prompt pairs")
    L, H = backend.facts.n_layers, backend.facts.n_heads
    valid = [ko.validate(L, H) for ko in kos]
    distinct = distinct_knockouts(valid, L, H)
    if not distinct:
        return EndReadout(torch.zeros(0, len(pairs), dtype=torch.bool), torch.zeros(0, len(pairs)))
    answers = torch.tensor([p.answer_id for p in pairs])
    right = torch.zeros(len(distinct), len(pairs), dtype=torch.bool)
    margin = torch.full((len(distinct), len(pairs)), float("nan"))
    heads_all, mlps_all = head_masks(distinct, L, H)
    at = {ko: i for i, ko in enumerate(distinct)}
    row = [at[ko] for ko in valid]  # each knockout's distinct set
    want = torch.zeros(len(distinct), len(pairs), dtype=torch.bool)  # the (distinct set, prompt) readouts asked
    for k, j in enumerate(row):
        want[j] |= True if cells is None else cells[k].to(torch.bool)
    continues = means is None and backend.continues
    chunks = shared_prefix_chunks(pairs, tokens_per_pass) if continues else length_chunks(pairs, tokens_per_pass)
    if sets_per_pass is None and _padding_pays(backend, pairs, len(distinct), len(chunks), tokens_per_pass):
        chunks, continues = [list(range(len(pairs)))], False  # small work on a small model: one padded pass
    pad_token = pad_id(backend)
    total, done = int(want.sum()), 0
    for idx in chunks:
        chunk = [pairs[i] for i in idx]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_token)  # [n, width]; no padding within a length chunk
        n, width = ids.shape
        if bool(mask.all()):
            mask = None
        start = first_difference(chunk) if continues and mask is None else 0
        per_pass = sets_per_pass or max(1, tokens_per_pass // (n * (width - start)))
        if means is None:  # the chunk's own X_c activations (and its END logits, for the continuation's check)
            cf, _, _ = pad([p.cf_ids for p in chunk], pad_token)
            lg_c, z_cf, mlp_cf = cf_activations(backend, cf, mask, end)
        run = _continued(backend, ids, cf, lg_c, start, len(distinct)) if start else None
        sets, prompts = want[:, idx].nonzero(as_tuple=True)  # [rows]: set-major (distinct set, chunk prompt)
        columns = torch.tensor(idx)  # [n]: the chunk's prompts among all pairs
        for g in range(0, len(sets), per_pass * n):
            js, ps = sets[g:g + per_pass * n], prompts[g:g + per_pass * n]  # [rows] each
            hm, mm = heads_all[js], mlps_all[js]  # [rows, L, H], [rows, L]
            ablated = (knocked_out_rows(backend, hm, mm, means, [chunk[i].template for i in ps.tolist()],
                                        end[ps].tolist())
                       if means is not None
                       else counterfactual_rows(backend, hm, mm, z_cf, mlp_cf, ps, 0 if run is None else start))
            with ablated:
                if run is None:
                    lg = backend.end_logits(ids[ps], None if mask is None else mask[ps], end[ps]).float()
                else:  # positions start .. END of every row, after X_r's first ``start`` keys and values
                    lg = backend.continue_end_logits(run, ps, ids[ps, start:], start=start).float()  # [rows, vocab]
            cols = columns[ps]
            ans = answers[cols].to(lg.device)  # [rows]
            right[js, cols] = (lg.argmax(-1) == ans).cpu()
            margin[js, cols] = (lg.gather(1, ans[:, None])[:, 0] - lg.mean(-1)).cpu()
            done += len(js)
            if progress is not None:
                progress(done, total)
    return EndReadout(right[row], margin[row])


def knockout_end_work(backend: ModelBackend, pairs: Sequence[PromptPair], kos: Sequence[Knockout], *,
                      mean: bool = True, cells: torch.Tensor | None = None, sets_per_pass: int | None = None,
                      tokens_per_pass: int = TOKENS_PER_PASS):
    """The forward work of :func:`knockout_end` (``mean``: mean ablation, else counterfactual), counted without
    running it (``engine.cost.Work``): the same chunks, continuations and passes, one call each.  A continuation
    is counted as taken where it is worth taking (its check, against X_c's own logits, is assumed to pass)."""
    from engine.cost import NO_WORK, Work
    L, H = backend.facts.n_layers, backend.facts.n_heads
    valid = [ko.validate(L, H) for ko in kos]
    distinct = distinct_knockouts(valid, L, H)
    if not distinct or not pairs:
        return NO_WORK
    at = {ko: i for i, ko in enumerate(distinct)}
    want = torch.zeros(len(distinct), len(pairs), dtype=torch.bool)
    for k, ko in enumerate(valid):
        want[at[ko]] |= True if cells is None else cells[k].to(torch.bool)
    continues = not mean and backend.continues
    chunks = shared_prefix_chunks(pairs, tokens_per_pass) if continues else length_chunks(pairs, tokens_per_pass)
    if sets_per_pass is None and _padding_pays(backend, pairs, len(distinct), len(chunks), tokens_per_pass):
        chunks, continues = [list(range(len(pairs)))], False
    w = NO_WORK
    for idx in chunks:
        chunk = [pairs[i] for i in idx]
        n, width = len(chunk), max(len(p.ref_ids) for p in chunk)
        unpadded = all(len(p.ref_ids) == width for p in chunk)
        start = first_difference(chunk) if continues and unpadded else 0
        per_pass = sets_per_pass or max(1, tokens_per_pass // (n * (width - start)))
        if not mean:  # cf_activations
            w += Work(1, n * width, n)
        if not (1 <= start < width and len(distinct) * start > 2 * width):  # _continued: not worth it
            start = 0
        if start:  # the prefix, and the check continuing X_c
            w += Work(2, n * start + n * (width - start), 2 * n)
        rows = int(want[:, idx].sum())
        for g in range(0, rows, per_pass * n):
            r = min(per_pass * n, rows - g)
            w += Work(1, r * (width - start), r)
    return w


def cf_activations(backend: ModelBackend, cf_ids: torch.Tensor, mask: torch.Tensor | None, end: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The END logits, every head's z and every MLP's output on the counterfactual prompts ``cf_ids`` [n, pos]
    (``end`` [n]): ([n, vocab], [n, L, pos, H, d_head], [n, L, pos, d_model])."""
    L = backend.facts.n_layers
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    lg, c = backend.run_with_cache_at(cf_ids, mask, names, end.reshape(-1, 1))
    return (lg[:, 0].float(), torch.stack([c[hooks.attn_z(layer)] for layer in range(L)], 1),
            torch.stack([c[hooks.mlp_out(layer)] for layer in range(L)], 1))


def first_difference(pairs: Sequence[PromptPair]) -> int:
    """The first position at which some pair's X_r and X_c differ (every position before it is shared)."""
    return min(next((i for i, (r, c) in enumerate(zip(p.ref_ids, p.cf_ids)) if r != c), len(p.ref_ids) - 1)
               for p in pairs)


def shared_prefix_chunks(pairs: Sequence[PromptPair], tokens_per_pass: int) -> list[list[int]]:
    """:func:`length_chunks` cut further by :func:`first_difference`, so each chunk shares its prefix length."""
    out = []
    for idx in length_chunks(pairs, tokens_per_pass):
        by_start: dict[int, list[int]] = {}
        for i in idx:
            by_start.setdefault(first_difference([pairs[i]]), []).append(i)
        out += [by_start[k] for k in sorted(by_start)]
    return out


def _continued(backend: ModelBackend, ref: torch.Tensor, cf: torch.Tensor, lg_c: torch.Tensor, start: int,
               n_sets: int) -> object | None:
    """X_r's keys and values of its first ``start`` positions (``ref`` [n, width], unpadded), when continuing
    them saves work for ``n_sets`` sets and reproduces X_c's END logits ``lg_c`` [n, vocab] from X_c's own
    positions ``start ..`` (X_c shares them); None: the textbook passes (not worth it, or not reproduced)."""
    from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, logit_scale
    n, width = ref.shape
    if not 1 <= start < width or n_sets * start <= 2 * width:  # prefix + check: about one pass, in two calls
        return None
    prefix = backend.prefix(ref[:, :start])
    got = backend.continue_end_logits(prefix, torch.arange(n), cf[:, start:], start=start).float()
    try:
        check_reproduces(f"continuing the counterfactual prompts from position {start} with X_r's keys and values",
                         got, lg_c, logit_scale(lg_c)[:, None].expand_as(lg_c), backend.facts.dtype)
    except ShortcutMismatch:
        return None
    return prefix


def knockout_accuracy(backend: ModelBackend, pairs: Sequence[PromptPair], ko: Knockout,
                      means: MeanActivations) -> float:
    """First-token accuracy of the reference prompts with ``ko`` ablated (one END-only evaluation)."""
    return knockout_accuracies(backend, pairs, [ko], means)[0]


@dataclass(frozen=True)
class TokenProb:
    token: str
    token_id: int
    prob: float


@torch.no_grad()
def next_token_probs(backend: ModelBackend, ids: Sequence[int], *, ko: Knockout | None = None,
                     means: MeanActivations | None = None) -> torch.Tensor:
    """The next-token distribution after ``ids`` ([vocab]), optionally under a knockout: one END-only pass."""
    x = torch.tensor([list(ids)])
    end = torch.tensor([len(ids) - 1])
    if ko is not None and not ko.empty:
        if means is None:
            raise ValueError("a knockout needs mean activations")
        with knocked_out(backend, ko, means, [None], [len(ids) - 1]):
            lg = backend.end_logits(x, None, end)  # [1, vocab]
    else:
        lg = backend.end_logits(x, None, end)
    return torch.softmax(lg[0].float(), -1)


def top_of(backend: ModelBackend, probs: torch.Tensor, k: int = 5) -> list[TokenProb]:
    """The k most likely tokens of a next-token distribution ``probs`` ([vocab])."""
    vals, idx = probs.topk(min(k, probs.shape[0]))
    toks = backend.tokenizer.convert_ids_to_tokens(idx.tolist())
    return [TokenProb(str(t), int(i), float(v)) for t, i, v in zip(toks, idx.tolist(), vals.tolist())]


def top_next_tokens(backend: ModelBackend, ids: Sequence[int], *, k: int = 5, ko: Knockout | None = None,
                    means: MeanActivations | None = None) -> list[TokenProb]:
    """The k most likely next tokens after ``ids`` (optionally under a knockout)."""
    return top_of(backend, next_token_probs(backend, ids, ko=ko, means=means), k)


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine knockout``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Accuracy before / after mean-ablating ``--heads`` / ``--mlps`` (and ``--text``'s top-5 next tokens)."""
    model = ctx.model
    ko = Knockout(parse_heads(args.heads), parse_mlps(args.mlps)).validate(model.facts.n_layers,
                                                                            model.facts.n_heads)
    if ko.empty:
        raise ValueError("nothing to knock out: give --heads LAYER.HEAD,... and/or --mlps LAYER,...")
    typed = ctx.typed(args.text)
    pairs = ctx.pairs

    def compute(progress) -> dict:
        means = mean_activations(model, pairs)
        before, after = knockout_accuracies(model, pairs, [Knockout(), ko], means, progress=progress)
        res = {"heads": [f"{a}.{b}" for a, b in ko.heads], "mlps": list(ko.mlps), "n_pairs": len(pairs),
               "accuracy_before": before, "accuracy_after": after}
        if typed is not None:
            res["text"] = args.text
            res.update(ctx.typed_summary(typed))
            res["top5_before"] = [t.__dict__ for t in top_next_tokens(model, typed.ids)]
            res["top5_after"] = [t.__dict__ for t in top_next_tokens(model, typed.ids, ko=ko, means=means)]
        return res

    # text_rule: --text is read after the answer-token rule (results of the raw reading never come back)
    params = {"heads": [list(h) for h in ko.heads], "mlps": list(ko.mlps), "text": args.text or "",
              "text_ids": typed.ids if typed is not None else [], "text_rule": ctx.text_rule,
              "dtype": model.facts.dtype}
    with ctx.progress("knockout") as bar:
        res, computed = ctx.cached_json("knockout", params, lambda: compute(bar))
    res = {**res, "cached": not computed, "answer_tokens": ctx.answer_tokens(pairs)}
    ctx.write_json(args.out, res)
    return res
