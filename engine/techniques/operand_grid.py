"""Operand grid: one component's behaviour over every operand pair (A, B) of one template (beyond the paper).

The paper reads a head off its mean over a prompt set; circuit-tracer draws a feature over a 100 x 100 operand grid
and Nikankin et al. (2025) classify neurons by the operand and result ranges they fire for.  Here, for one template
``t`` of the prompt set (its first, or one named) and every (A, B) of the set's operand range valid for t's
operation -- all of them, no sampling or balancing -- the pair (X_r, X_c) is built with the set's counterfactual, and
per pair:

1. **right**: whether the model's top first token is the answer's (the accuracy filter's scoring);
2. **effect**: the path-patching value (:mod:`engine.techniques.path_patching`, exact: the sender's END output from
   X_c, every other head frozen at X_r) of every MLP and of the heads asked for, in the metric the heatmap ranks by
   (relative effect, or the logit difference when the effect guard says so).  Heads asked for: the one typed, else
   the ``n_heads`` heads that path attribution patching (:func:`engine.techniques.attribution.path_atp`, a first-order
   estimate over the grid's pairs, mean in the same metric) ranks first -- and of those, the one whose exact mean
   value is the most negative is the grid's default head (:meth:`OperandGrid.top_head`).  Exact path patching of
   every head costs one END chain per head and pair (about 9 TFLOP on a 0.5B model's 81-pair grid); the estimate
   only picks which heads get their exact values;
3. **attention**: every head's END-row attention mass on the tokens of A and on those of B (the token roles of
   :func:`engine.techniques.attention.token_roles`);
3b. **direct**: every head's and MLP's direct effect on the answer's logit at END of X_r: logit(x) - logit(x - c),
   x the last residual stream at END and c what the component adds to the stream at END (an MLP: its output; a
   head: o_h = z_h W_O[h], or, where a norm follows the attention, attn_branch(a) - attn_branch(a - o_h) with a
   the attention module's output) -- the component removed from the direct path to the logits only, the final
   norm (and any logit soft cap) recomputed; direct logit attribution with the norm's scale frozen is its first
   order;
4. **activation**: for the neurons asked for, the MLP's hidden activation at END (hook ``mlp_post``).

Every pair is kept, answered right or not (a grid with holes hides its structure); the view marks the wrong ones
and overlays the answer's structure (sum, difference, carry).  One batched pass per quantity: path patching and the
attention patterns as the pages compute them (cached), the direct effects in one ``run_with_cache_at`` per batch and
the attribution-patching ranking (cached with them), the neurons' activations in one ``run_with_cache`` per batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery import end_chain
from engine.machinery.batching import pad, pad_id
from engine.machinery.components import parse_site
from engine.progress import ProgressFn, Stages, note
from engine.prompts.pairs import (
    ANY_CARRY,
    CARRY_SETS,
    PromptError,
    PromptPair,
    build_pairs,
    column_carry,
    make_problem,
    template_operands,
)
from engine.prompts.templates import TEMPLATES_BY_ID, Template, templates_for

#: Most pairs one grid holds (0..99 x 0..99 of an addition is 10 000).
MAX_GRID_PAIRS = 10_000


@dataclass(frozen=True)
class Component:
    """A head (``3.1``), an MLP (``3.mlp``) or one MLP neuron (``3.mlp.120``)."""

    layer: int
    head: int | None = None
    neuron: int | None = None

    @property
    def kind(self) -> str:
        return "head" if self.head is not None else "neuron" if self.neuron is not None else "mlp"

    @property
    def name(self) -> str:
        if self.head is not None:
            return f"{self.layer}.{self.head}"
        return f"{self.layer}.mlp" + (f".{self.neuron}" if self.neuron is not None else "")


def parse_component(text: str, n_layers: int, n_heads: int, d_mlp: int | None = None) -> Component:
    """``3.1`` / ``3.mlp`` / ``3.mlp.120`` -> :class:`Component`; PromptError saying what the model has."""
    try:
        kind, layer, index = parse_site(text, n_layers, n_heads, d_mlp)
    except ValueError as e:
        raise PromptError(str(e)) from None
    return Component(layer, head=index if kind == "head" else None, neuron=index if kind == "neuron" else None)


def grid_templates(spec) -> list[Template]:
    """The templates a grid of ``spec`` can use: its written ones, else its families' for its operations."""
    return [w.template for w in spec.written] or templates_for(list(spec.ops), list(spec.families))


def grid_template(spec, template_id: str | None = None) -> Template:
    """The template of the grid: ``template_id`` (one of the set's), else the set's first (a written one first)."""
    pool = grid_templates(spec)
    if not pool:
        raise PromptError(f"the prompt set's templates ({', '.join(spec.families)}) have none for "
                          f"{', '.join(spec.ops)}: pick other operations or other templates")
    if template_id is None:
        return pool[0]
    t = next((t for t in pool if t.id == template_id), None) or TEMPLATES_BY_ID.get(template_id)
    if t is None:
        raise PromptError(f"unknown template {template_id!r}: choose from {', '.join(t.id for t in pool[:8])} ...")
    return t


def grid_pairs(tokenizer, spec, template: Template) -> list[PromptPair]:
    """Every (A, B) of the set's operand range valid for ``template`` as a pair with the set's counterfactual (slot
    words and fillers seeded by the set's seed); the ones with no counterfactual of equal length are left out."""
    r = spec.operand_range
    operands = template_operands(template, r)
    if spec.carry != ANY_CARRY:  # the set's carry choice: only those cells
        operands = [(a, b) for a, b in operands if column_carry(template.op, a, b) is (spec.carry == "yes")]
        if not operands:
            raise PromptError(f"no {template.op} problem of operands {r.lo}..{r.hi} is {CARRY_SETS[spec.carry]}: "
                              f"choose another carry in the sidebar or widen the operands")
    if len(operands) > MAX_GRID_PAIRS:
        raise PromptError(f"{len(operands)} operand pairs: a grid holds at most {MAX_GRID_PAIRS}; narrow the operand "
                          f"range")
    rng = random.Random(spec.seed)
    problems = [make_problem(template, a, b, rng, r.decimals) for a, b in operands]
    pairs, dropped = build_pairs(tokenizer, problems, spec.counterfactual, r, spec.digit)  # read at the set's digit
    if not pairs:
        raise PromptError(f"no pair of template {template.id} could be built: "
                          f"{dropped[0][1] if dropped else 'no operands'}")
    return pairs


@dataclass
class OperandGrid:
    """Per pair of one template's grid: the operands, the answer, right, and every component's values."""

    template: str
    op: str
    metric: str                  # the path-patching metric of ``head_effect`` / ``mlp_effect``
    candidates: list[tuple[int, int]]  # the heads attribution patching ranks first (their exact values computed)
    a: list[float]
    b: list[float]
    answer: list[float]
    right: list[bool]
    head_effect: torch.Tensor    # [P, L, H]  NaN for the heads not computed
    mlp_effect: torch.Tensor     # [P, L]
    attn_a: torch.Tensor         # [P, L, H]  END-row mass on A's tokens
    attn_b: torch.Tensor         # [P, L, H]  END-row mass on B's tokens
    direct_head: torch.Tensor    # [P, L, H]  direct effect on the answer logit
    direct_mlp: torch.Tensor     # [P, L]
    neurons: dict[str, list[float]]  # neuron name -> [P] activation at END
    fallback: str | None = None  # why the textbook loop computed the direct effects (None: the fast path, checked)

    def top_head(self) -> Component:
        """Of the heads computed, the one with the most negative mean path-patching value over the grid."""
        done = ~self.head_effect.isnan().all(0)                      # [L, H]
        mean = torch.where(done, self.head_effect.nanmean(0).nan_to_num(), torch.full_like(done, 1e30, dtype=float))
        layer, head = divmod(int(mean.argmin()), mean.shape[1])
        return Component(layer, head=head)

    def rows(self, component: Component) -> list[dict]:
        """One row per pair for ``component``: a, b, answer, right, carry, effect, direct (+ attn_a / attn_b for a
        head, act for a neuron; a neuron's effect and direct are its MLP's)."""
        from engine.prompts.pairs import column_carry
        out = []
        for i in range(len(self.a)):
            row = {"a": self.a[i], "b": self.b[i], "answer": self.answer[i], "right": self.right[i],
                   "carry": column_carry(self.op, self.a[i], self.b[i])}
            if component.kind == "head":
                row.update(effect=float(self.head_effect[i, component.layer, component.head]),
                           direct=float(self.direct_head[i, component.layer, component.head]),
                           attn_a=float(self.attn_a[i, component.layer, component.head]),
                           attn_b=float(self.attn_b[i, component.layer, component.head]))
            else:
                row["effect"] = float(self.mlp_effect[i, component.layer])
                row["direct"] = float(self.direct_mlp[i, component.layer])
                if component.kind == "neuron":
                    row["act"] = self.neurons[component.name][i]
            out.append(row)
        return out


#: the quantities of a grid row that :func:`units_rows` averages
ROW_VALUES = ("effect", "direct", "attn_a", "attn_b", "act")


def units_rows(rows: Sequence[dict], op: str) -> list[dict]:
    """The grid's rows (:meth:`OperandGrid.rows`, whole-number operands) folded onto the operands' units digits: one row
    per (A mod 10, B mod 10) with the mean of each quantity over its pairs (every tens digit), ``n`` its pairs,
    ``right_share`` the share answered right and ``right`` when at least half are, and ``carry`` whether the units
    column carries into the tens (addition) or borrows from them (subtraction; None for the other operations)."""
    from engine.prompts.pairs import units_carry
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((int(r["a"]) % 10, int(r["b"]) % 10), []).append(r)
    out = []
    for (a, b), mine in sorted(groups.items()):
        share = sum(bool(r["right"]) for r in mine) / len(mine)
        row = {"a": a, "b": b, "n": len(mine), "right_share": share, "right": share >= 0.5,
               "carry": units_carry(op, a, b) if op in ("add", "sub") else None}
        for q in ROW_VALUES:
            vals = [r[q] for r in mine if q in r and r[q] == r[q]]  # NaN left out
            if any(q in r for r in mine):
                row[q] = sum(vals) / len(vals) if vals else float("nan")
        out.append(row)
    return out


def check_hidden(backend: ModelBackend, act: torch.Tensor) -> torch.Tensor:
    """``act`` (hook ``mlp_post``, [..., features]) when it is an MLP's hidden layer of the model's ``d_mlp`` neurons;
    else MissingActivation: a mixture of experts has no one hidden layer (its hook holds the block's output), and its
    "neurons" would be something else."""
    from engine.backends.base import MissingActivation
    f = backend.facts
    if act.shape[-1] != f.d_mlp:
        raise MissingActivation(f"{f.architecture}'s MLP has no hidden layer of {f.d_mlp} neurons to read (its "
                                f"activation has {act.shape[-1]} features: a mixture of experts has one per expert); "
                                f"neurons are read on dense MLPs only")
    return act


@torch.no_grad()
def neuron_activations(backend: ModelBackend, pairs: Sequence[PromptPair], neurons: Sequence[Component], *,
                       batch_size: int = 64) -> dict[str, list[float]]:
    """Each neuron's MLP hidden activation at END of X_r, per pair (one ``run_with_cache`` per batch)."""
    layers = sorted({n.layer for n in neurons})
    names = [hooks.mlp_post(layer) for layer in layers]
    out: dict[str, list[float]] = {n.name: [] for n in neurons}
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_id(backend))
        c = backend.activations(ids, mask, names)  # no logits read: one position unembedded
        rows = torch.arange(len(chunk))
        for n in neurons:
            act = check_hidden(backend, c[hooks.mlp_post(n.layer)])  # [batch, pos, d_mlp]
            out[n.name] += act[rows, end.to(act.device)][:, n.neuron].float().cpu().tolist()
    return out


def removal_effects(backend: ModelBackend, x: torch.Tensor, answer: torch.Tensor, clean: torch.Tensor,
                    parts: torch.Tensor) -> torch.Tensor:
    """clean - logit(x - part) of the answer for each of n parts (``clean`` = logit(x) [b]): x [b, d_model], parts
    [b, n, d_model] -> [b, n]."""
    b, n, d = parts.shape
    gone = backend.answer_logits((x[:, None] - parts).reshape(b * n, d), answer.repeat_interleave(n)).reshape(b, n)
    return (clean[:, None] - gone).float().cpu()


@dataclass
class DirectEffects:
    """Every head's and MLP's direct effect on the answer logit at END of X_r (module docstring, 3b), per pair."""

    head: torch.Tensor          # [P, L, H]
    mlp: torch.Tensor           # [P, L]
    fallback: str | None = None  # why the textbook loop computed them (None: the fast path, checked)


def direct_hooks(n_layers: int) -> list:
    """What the fast path of :func:`direct_effects` reads: the last stream, and per layer the stream entering it, the
    heads' outputs z, the attention module's output and contribution, and the MLP's contribution."""
    return [hooks.resid_post(n_layers - 1)] + [n for j in range(n_layers) for n in (
        hooks.resid_pre(j), hooks.attn_z(j), hooks.attn_proj_out(j), hooks.attn_out(j), hooks.mlp_out(j))]


@torch.no_grad()
def direct_effects(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32) -> DirectEffects:
    """Every head's and MLP's direct effect on the answer logit at END of X_r (module docstring, 3b) -- exact: read
    off one cached pass where its self-check holds (:func:`check_direct_reads`), else the textbook loop
    (:func:`direct_effects_loop`), which says so (``fallback``)."""
    from engine.machinery.shortcut import ShortcutMismatch, fallback_note
    try:
        return _direct_effects_cached(backend, pairs, batch_size=batch_size)
    except ShortcutMismatch as e:
        out = direct_effects_loop(backend, pairs, batch_size=batch_size)
        out.fallback = fallback_note("direct effects", str(e))
        return out


def direct_effects_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32):
    """The forward work of :func:`direct_effects` (``engine.cost.Work``): one padded pass per batch -- or, where the
    model's blocks cannot be run piece by piece (known before it runs), the textbook loop's: per batch X_r and X_c,
    then every head and MLP as a variant of the whole prompts (path patching's loop, the same passes)."""
    from engine.cost import padded_passes
    from engine.techniques.path_patching import path_patching_loop_work
    if backend.components_fail():
        return path_patching_loop_work(backend, pairs, batch_size=batch_size)
    return padded_passes([p.ref_ids for p in pairs], batch_size)


def check_direct_reads(backend: ModelBackend, acts: end_chain.EndActs, W_O: Sequence[torch.Tensor],
                       x: torch.Tensor, clean: torch.Tensor, end_logits: torch.Tensor, answer: torch.Tensor) -> None:
    """The self-check of :func:`direct_effects`' fast path (ShortcutMismatch on a miss), on one batch:

    * ``clean`` = logit(x), the last stream x [b, d_model] through the final norm, the unembedding and the logits'
      transform, is the model's own answer logit (``end_logits`` [b, vocab], the same forward pass);
    * x is the stream entering layer 0 plus every block's attention and MLP contribution at END (removing a
      component's write from the stream is subtracting it);
    * the block model of the heads (:func:`engine.machinery.end_chain.check_block_model`): the heads reach the
      attention module's output linearly through W_O (``acts``' second point is the position before END, so
      zeroing one head's z removes exactly z_h W_O[h]) and the attention branch gives back the contribution."""
    from engine.machinery.shortcut import check_reproduces, logit_scale
    dtype = backend.facts.dtype
    rows = torch.arange(len(answer), device=end_logits.device)
    check_reproduces("the last residual stream through the final norm and the unembedding", clean,
                     end_logits[rows, answer.to(end_logits.device)], logit_scale(end_logits), dtype)
    writes = acts.pre[0].float() + sum(a.float() + m.float() for a, m in zip(acts.attn, acts.mlp))
    err = (writes - x.float()).norm(dim=-1)
    check_reproduces("the last residual stream as the sum of every block's writes", err, torch.zeros_like(err),
                     x.float().norm(dim=-1), dtype)
    end_chain.check_block_model(backend, acts, W_O, dtype)


def direct_acts(c: dict, end: torch.Tensor, n_layers: int) -> tuple[end_chain.EndActs, torch.Tensor]:
    """(the END rows of :func:`direct_hooks`' cache ``c`` as ``EndActs`` -- its second point, read as X_c, the
    position before END -- and the last stream at END [b, d_model])."""
    rows = torch.arange(len(end))

    def at(name, shift: int = 0):  # [b, ...] the rows at END (shift -1: the position before)
        return c[name][rows, (end + shift).to(c[name].device)]

    def per_layer(name, shift: int = 0):
        return [at(name(j), shift) for j in range(n_layers)]
    acts = end_chain.EndActs(per_layer(hooks.resid_pre), per_layer(hooks.attn_proj_out), per_layer(hooks.attn_out),
                             per_layer(hooks.mlp_out), per_layer(hooks.attn_z), per_layer(hooks.attn_z, -1),
                             per_layer(hooks.attn_proj_out, -1), per_layer(hooks.mlp_out, -1))
    return acts, at(hooks.resid_post(n_layers - 1))


def _direct_effects_cached(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int) -> DirectEffects:
    """The fast path: one ``run_with_cache_at`` per batch, every component's write at END removed from the last
    stream (module docstring, 3b), after :func:`check_direct_reads`."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    end_chain.check_components(backend)
    names = direct_hooks(L)
    W_O = [backend.W_O(j) for j in range(L)]  # [H, d_head, d_model] each
    heads, mlps = torch.zeros(len(pairs), L, H), torch.zeros(len(pairs), L)
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_id(backend))
        lg, c = backend.run_with_cache_at(ids, mask, names, end[:, None])  # lg [b, 1, vocab]; c: every position
        acts, x = direct_acts(c, end, L)
        answer = torch.tensor([p.answer_id for p in chunk], device=x.device)
        clean = backend.answer_logits(x, answer)  # [b]
        check_direct_reads(backend, acts, W_O, x, clean, lg[:, 0].float(), answer)
        for j in range(L):
            o = torch.einsum("bhd,hdm->bhm", acts.z[j].to(W_O[j].dtype), W_O[j])  # [b, H, d_model]
            if not backend.attn_branch_is_identity:  # a norm after the attention: attn_branch(a) - attn_branch(a - o_h)
                a = acts.a[j][:, None]  # [b, 1, d_model]
                o = end_chain.attn_branch(backend, j, a) - end_chain.attn_branch(backend, j, a - o)
            heads[s:s + len(chunk), j] = removal_effects(backend, x, answer, clean, o)
            mlps[s:s + len(chunk), j] = removal_effects(backend, x, answer, clean, acts.mlp[j][:, None])[:, 0]
    return DirectEffects(heads, mlps)


@torch.no_grad()
def direct_effects_loop(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 32,
                        rows_per_pass: int = 128) -> DirectEffects:
    """The textbook loop of :func:`direct_effects`, exact on any architecture: per component one hooked forward pass
    of X_r (components stacked as rows) with every head's z and every MLP's output frozen at X_r, at every position,
    and the component's own write at END removed -- a head's z at END zeroed (its layer's attention module and branch
    recompute the rest), an MLP's output at END zeroed -- the model's own final norm and unembedding reading the
    answer logit; the direct effect is the model's answer logit minus that."""
    from engine.machinery.batching import batches
    from engine.machinery.patch_rows import Slot, chain, patch_rows, prepare, take
    from engine.machinery.patch_rows import replace as frozen_at
    from engine.techniques.path_patching import all_senders, placed, sender_hooks, sender_slots
    L, H = backend.facts.n_layers, backend.facts.n_heads
    senders = all_senders(L, H)
    slots = sender_slots([list(range(H))] * L, H)
    heads, mlps = [], []
    for idx in batches(len(pairs), batch_size):
        run = prepare(backend, [pairs[i] for i in idx], sender_hooks(L), [])

        def edits(group, run=run):
            S, out = len(group), []
            for j in range(L):
                for name, kind in ((hooks.attn_z(j), "head"), (hooks.mlp_out(j), "mlp")):
                    mine = [Slot(s, run.end, snd.head if kind == "head" else None) for s, snd in enumerate(group)
                            if snd.component == kind and snd.layer == j]
                    fns = [frozen_at(run.stacked(run.ref_cache[name], S))]  # X_r's, at every position
                    if mine:
                        fns.append(take(torch.zeros_like(run.ref_cache[name]), mine, run.n))  # removed at END
                    out.append((name, chain(*fns)))
            return out
        patched = patch_rows(backend, run, senders, edits, rows_per_pass=rows_per_pass)  # [senders, P]
        per = placed((run.logit_o[None] - patched).T.reshape(-1), slots, L, H)  # [P, L, H + 1]
        heads.append(per[:, :, :H])
        mlps.append(per[:, :, H])
    return DirectEffects(torch.cat(heads), torch.cat(mlps))


def operand_attention(backend: ModelBackend, pairs: Sequence[PromptPair], *, progress: ProgressFn | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's END-row mass on A's tokens and on B's tokens, per pair: ([P, L, H], [P, L, H])."""
    from engine.techniques.attention import end_row_patterns, token_roles
    L, H = backend.facts.n_layers, backend.facts.n_heads
    a = torch.zeros(len(pairs), L, H)
    b = torch.zeros(len(pairs), L, H)
    for i, (p, row) in enumerate(zip(pairs, end_row_patterns(backend, pairs, progress=progress))):
        roles = token_roles(backend, p)                           # row: [L, H, pos]
        for out, role in ((a, "operand A"), (b, "operand B")):
            idx = [j for j, r in enumerate(roles) if r == role]
            if idx:
                out[i] = row[:, :, idx].sum(-1)
    return a, b


def atp_candidates(backend: ModelBackend, pairs: Sequence[PromptPair], k: int) -> list[tuple[int, int]]:
    """The k heads with the most negative mean path-AtP value over ``pairs`` (in the ranking metric), best first."""
    from engine.techniques.attribution import path_atp
    raw = path_atp(backend, pairs)
    heads, _ = raw.per_pair(raw.ranking_metric())                   # [P, L, H]
    mean = heads.double().nanmean(0).nan_to_num(nan=1e30)            # [L, H]
    order = mean.flatten().argsort()[:k].tolist()
    return [divmod(int(i), mean.shape[1]) for i in order]


def operand_grid_work(backend: ModelBackend, spec, *, template: str | None = None,
                      component: Component | None = None, neurons: Sequence[Component] = (), cache=None):
    """The forward work of :func:`operand_grid` (``engine.cost.Work``) and the grid's pairs (the cost's unit): the
    grid's own passes unless cached (scoring, attention, direct effects, path AtP), the path patching of its heads
    (the typed head, else ``n_heads`` candidates) unless cached, and the neurons' activations."""
    from engine.cost import NO_WORK, padded_passes, unless_cached
    from engine.results import run_cached
    from engine.techniques.accuracy import scoring_work
    from engine.techniques.attention import end_rows_work
    from engine.techniques.attribution import path_atp_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    t = grid_template(spec, template)
    pairs = grid_pairs(backend.tokenizer, replace(spec, balance=False), t)
    k = backend.facts.n_heads
    ref = [p.ref_ids for p in pairs]
    params = grid_params(backend)
    w = unless_cached(lambda: run_cached(backend, pairs, "operand_grid", params, lambda: ([], {}), cache),
                      lambda: scoring_work(backend, pairs) + end_rows_work(backend, pairs)
                      + direct_effects_work(backend, pairs) + path_atp_work(backend, pairs))
    typed = [(component.layer, component.head)] if component is not None and component.kind == "head" else None
    probe_heads = typed or [(backend.facts.n_layers - 1, h) for h in range(k)]
    w += unless_cached(lambda: cached_path_patching(backend, pairs, cache=cache, heads=typed) if typed else
                       _cached_candidates_patching(backend, pairs, params, cache),
                       lambda: path_patching_work(backend, pairs, heads=probe_heads))
    return (w + (padded_passes(ref, 64) if neurons else NO_WORK)), pairs


def grid_params(backend: ModelBackend) -> dict:
    """The cache parameters of the grid's own passes (its candidates: as many heads as a layer has)."""
    return {"dtype": backend.facts.dtype, "v": 4, "candidates": backend.facts.n_heads}


def _cached_candidates_patching(backend: ModelBackend, pairs: Sequence[PromptPair], params: dict, cache):
    """The grid's candidates' path patching from the cache (NotCached when the grid or it is missing)."""
    from engine.results import run_cached
    from engine.techniques.path_patching import cached_path_patching
    _, art, _ = run_cached(backend, pairs, "operand_grid", params, lambda: ([], {}), cache)
    return cached_path_patching(backend, pairs, cache=cache, heads=[(int(a), int(b)) for a, b in art["candidates"]])


def operand_grid(backend: ModelBackend, spec, *, template: str | None = None, component: Component | None = None,
                 neurons: Sequence[Component] = (), cache=None, progress: ProgressFn | None = None) -> OperandGrid:
    """The grid of one template of ``spec`` (module docstring): exact path-patching values of every MLP and of
    ``component`` (a head), else of the heads attribution patching ranks first; cached."""
    from engine.results import run_cached
    from engine.techniques.accuracy import score_pairs
    from engine.techniques.path_patching import cached_path_patching
    t = grid_template(spec, template)
    pairs = grid_pairs(backend.tokenizer, replace(spec, balance=False), t)
    stages = Stages(progress, (len(pairs), len(pairs), len(pairs)))
    k = backend.facts.n_heads

    def compute():
        right = [s.first_ok for s in score_pairs(backend, pairs)]
        att_a, att_b = operand_attention(backend, pairs, progress=stages.stage(0))
        direct = direct_effects(backend, pairs)
        return [], {"right": right, "attn_a": att_a.tolist(), "attn_b": att_b.tolist(),
                    "direct_head": direct.head.tolist(), "direct_mlp": direct.mlp.tolist(),
                    "direct_fallback": direct.fallback or "",
                    "candidates": [list(h) for h in atp_candidates(backend, pairs, k)]}

    _, art, _ = run_cached(backend, pairs, "operand_grid", grid_params(backend), compute, cache)
    if art.get("direct_fallback"):
        note(art["direct_fallback"])
    stages.finish(0)
    candidates = [(int(a), int(b)) for a, b in art["candidates"]]
    heads = [(component.layer, component.head)] if component is not None and component.kind == "head" else candidates
    table, _ = cached_path_patching(backend, pairs, cache=cache, heads=heads, progress=stages.stage(1))
    stages.finish(1)
    metric = table.ranking_metric()
    head_effect, mlp_effect = table.per_pair.per_pair(metric)
    acts = neuron_activations(backend, pairs, neurons) if neurons else {}
    stages.finish(2)
    return OperandGrid(t.id, t.op, metric, candidates, [p.a for p in pairs], [p.b for p in pairs],
                       [p.answer for p in pairs], list(art["right"]), head_effect.float(), mlp_effect.float(),
                       torch.tensor(art["attn_a"]), torch.tensor(art["attn_b"]), torch.tensor(art["direct_head"]),
                       torch.tensor(art["direct_mlp"]), acts, art.get("direct_fallback") or None)


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine operand-grid``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """One component over the operand grid of one template -> CSV (a row per operand pair)."""
    f = ctx.model.facts
    comp = parse_component(args.component, f.n_layers, f.n_heads, f.d_mlp) if args.component else None
    with ctx.progress("operand grid") as bar:
        grid = operand_grid(ctx.model, ctx.spec(), template=args.grid_template, component=comp,
                            neurons=[comp] if comp is not None and comp.kind == "neuron" else (), cache=ctx.cache,
                            progress=bar)
    comp = comp or grid.top_head()
    rows = grid.rows(comp)
    ctx.write_csv(args.out, rows)
    right = sum(r["right"] for r in rows)
    return {"out": str(args.out), "component": comp.name, "template": grid.template, "metric": grid.metric,
            "pairs": len(rows), "answered_right": right, "fallback": grid.fallback,
            "mean_effect": sum(r["effect"] for r in rows if r["effect"] == r["effect"]) / max(1, len(rows))}
