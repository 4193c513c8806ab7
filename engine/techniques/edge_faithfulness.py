"""Edge faithfulness: how much of the answer does a circuit of *edges* keep, every other edge fed X_c?

MIB's edge ablation (Mueller et al. 2025; Hanna et al. 2024, ``evaluate_graph`` in EAP-IG's
``src/eap/evaluate.py``) on the residual graph of :mod:`engine.techniques.edges`.  A circuit is a set of kept
edges; the run is X_r in which every receiver v reads

    x_v = (its input in this run) + sum over the edges u -> v NOT in the circuit of (value_u(X_c) - value_u(run))

-- the sender's counterfactual value replaces its current one on exactly the ablated edges.  The senders' values
are those of the run being computed, so an ablation upstream reaches v through the kept edges too.  With **mean**
ablation (``ablation="mean"``, MIB's other intervention) value_u(X_c) is replaced by the sender's mean over the
counterfactual prompts of the pair's template, END-aligned (the knockouts' mean, :func:`sender_means`), taken over
the whole set whatever subset a pass runs.  The values
(as in :mod:`engine.techniques.edges`): the embedding stream for ``input``; an MLP's contribution
(``hooks.mlp_out``); a head's contribution ``attn_out(z with head h from X_c) - attn_out(z)``, the layer's other
heads as this run computed them (the block's post-attention norm and residual scale applied; with no such norm
``(z_c[h] - z[h]) W_O[h]``).  Receivers: the final stream (logits, ``hooks.resid_post`` of the last layer), an
MLP's input (``hooks.mlp_in``; a parallel block's MLP through the block model's ``mlp_branch``) and each head's
query, key and value input separately: head h's z is computed from its own three inputs (a layer's q, k, v
computed from ``resid_pre`` plus each distinct correction, then the head's q, k and v put together; grouped-query
attention: head h's key and value heads are computed from *its* inputs, only its z is taken).

**At token positions** (``kept`` [C, E, R]; :mod:`engine.techniques.circuit_units`): an edge is kept or ablated
at each token role of :data:`engine.techniques.attention.CIRCUIT_ROLES` (operand A, operator, operand B, END,
other) separately, so the sum above runs, at each position, over the edges ablated at that position's role.  A
receiver's correction is then one per role, laid over the positions (:class:`Plan`: a receiver's key is its ablated
senders per role); everything else is as below.

**The computation** is layer by layer (:func:`edge_circuits`): at layer l each circuit's stream entering the layer
is its state -- the block run alone on it where the backend can (``ModelBackend.block_activations``, checked:
the blocks chained alone on X_r's embedding must give X_r's stream after every layer; each circuit's stream is
then the stream after the layer in pass (E) -- a parallel block's, whose MLP output is corrected after that pass,
advanced through the layer with its heads' z and MLP output written; a pass that reads the attention only ends
there), else a pass from the input with the
circuit's earlier heads' z and MLP outputs written back (the same numbers, a pass at layer l l + 1 blocks long;
the result's ``note`` says so) -- then (B) one block of rows per distinct correction of the layer's
q / k / v inputs, (C) one block per distinct (q, k, v) triple of corrections a head mixes, (D) the heads'
differences (a block per head with an ablated out-edge and a base block, unless the attention branch is linear:
then ``(z_c[h] - z[h]) W_O[h]``, no pass), (E) the MLP with its input's correction; last, the final stream with
its correction, END's logits read.  Circuits and pairs are
rows of the same passes; :func:`edge_circuits_work` counts the same plan.  The empty circuit is the X_c run and
the full one X_r (each receiver then reads X_c's, resp. X_r's values) when the heads' differences add up to the
layer's, i.e. with no norm after the attention; with one (Gemma 2 / 3) a head's difference is taken with the
others as they are and the empty circuit is not exactly X_c.

**Faithfulness** (as :mod:`engine.techniques.faithfulness` scores node circuits): m = the answer logit at END
minus the mean logit over the vocabulary, averaged over the pairs; f = (m(C) - m(empty)) / (m(model) -
m(empty)).  Circuits: the top k = floor(x E) edges by |score| (MIB's ``apply_topn(absolute=True)``) of a
ranking of :mod:`engine.techniques.edge_scores` (exact edge patching, EAP, EAP-IG) for the sizes x of
``faithfulness.SIZES``; and the **random** ranking, the baseline a ranking has to beat: ``RANDOM_DRAWS``
seeded random orders of the edges, pair i read under order i mod ``RANDOM_DRAWS`` (as the node circuits' random
ranking: its cost is one ranking's, its curve the mean over the pairs like the others'), so every ranking's CPR
has its gap to random with an interval (:func:`engine.techniques.faithfulness.summarize`).  Exact against a
plain-transformers loop (``tests/helpers/plain_edges.py``: ``edge_circuit``, every ablated edge added by hand,
one hooked run per head input) within 1e-4
(``tests/integration/test_edge_faithfulness.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import BlockCalls, MissingActivation, ModelBackend
from engine.machinery.batching import pad, pad_id
from engine.machinery.shortcut import ShortcutMismatch, check_same, fallback_note
from engine.numerics.intervals import LEVEL, RESAMPLES, SEED
from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import PromptPair
from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
from engine.techniques.circuit_units import Units, units_of
from engine.techniques.edges import QKV, Edge, as_graph, edge_graph
from engine.techniques.faithfulness import (
    ABLATIONS,
    FAITH_POINT,
    FAITH_SCORE,
    RANDOM_DRAWS,
    SIZES,
    Circuit,
    FaithPoint,
    FaithScore,
    FaithTable,
    kept_count,
    summarize,
)
from engine.techniques.knockout import MeanActivations, end_aligned, mean_activations, mean_activations_work

METHOD = "edge_faithfulness"
VERSION = 3
#: the cache key's words for each ablation (the counterfactual one as it was before mean ablation existed)
ABLATION_KEYS = {
    "counterfactual": "MIB edge ablation: each edge outside the circuit sends its sender's X_c value minus its value "
                      "in the ablated run",
    "mean": "MIB edge ablation with means: each edge outside the circuit sends its sender's mean over X_c (the "
            "pair's template, END-aligned, over the whole set) minus its value in the ablated run"}
#: the baseline ranking every edge curve is drawn beside
RANDOM = "random"


# ---------------------------------------------------------------------------------------------
# the plan: which senders each circuit ablates into each receiver
# ---------------------------------------------------------------------------------------------

def sender_names(backend: ModelBackend) -> list[str]:
    """Every sender in graph order: ``input``, then each layer's heads and its MLP."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    return ["input"] + [n for j in range(L) for n in [f"a{j}.h{h}" for h in range(H)] + [f"m{j}"]]


@dataclass
class Plan:
    """Per circuit (C of them): for each receiver key (``("head", l, h, x)``, ``("mlp", l)``, ``("logits",)``)
    with an ablated edge, per token role (R: 1 when the circuits are not resolved by position) the senders whose
    edge into it is ablated there, as a tuple of sender names; and the senders with some ablated edge.  Each
    distinct tuple of senders per role is numbered once (``keys``; 0: nothing ablated), and the passes compare and
    look up these numbers (``ids``), not the tuples -- a tuple of a few hundred sender names per role is hashed
    again at every use."""

    ablated: list[dict[tuple, tuple[tuple[str, ...], ...]]]
    senders: list[frozenset[str]]
    roles: int = 1
    ids: list[dict[tuple, int]] = field(default_factory=list)  # [C] of {receiver: its number in keys}
    keys: list[tuple[tuple[str, ...], ...]] = field(default_factory=list)  # the distinct ablated senders per role

    def key(self, c: int, receiver: tuple) -> int:
        """The number of circuit c's ablated senders into ``receiver``, per role (``keys``; 0: none)."""
        return self.ids[c].get(receiver, 0)

    def layer_keys(self, c: int, layer: int, n_heads: int) -> dict[tuple[int, str], int]:
        """{(head, x): the number of its ablated senders per role} of circuit c's heads at ``layer``."""
        return {(h, x): self.key(c, ("head", layer, h, x)) for h in range(n_heads) for x in QKV}

    def needs_difference(self, c: int, sender: str) -> bool:
        """Whether some ablated edge of circuit c leaves ``sender``."""
        return sender in self.senders[c]


def plan_of(edges: Sequence[Edge], kept: np.ndarray) -> Plan:
    """``kept`` [C, E] bool over ``edges``, or [C, E, R] per token role -> the plan (per receiver, its edges read
    in sender-name order)."""
    graph = as_graph(edges)
    groups, (codes, names_of) = graph.by_receiver, graph.sender_codes
    kept = _by_role(kept, len(edges))  # [C, E, R]
    R = kept.shape[2]
    ablated, senders = [], []
    for row in kept:  # [E, R]
        ab: dict[tuple, tuple[tuple[str, ...], ...]] = {}
        for key, at, names in groups:
            off = ~row[at]  # [edges into this receiver, R]
            if off.any():
                ab[key] = tuple(tuple(names[off[:, r]]) for r in range(R))
        ablated.append(ab)
        senders.append(frozenset(names_of[i] for i in np.unique(codes[~row.all(1)])))
    number = {((),) * R: 0}  # each distinct tuple hashed once here
    ids = [{receiver: number.setdefault(t, len(number)) for receiver, t in ab.items()} for ab in ablated]
    return Plan(ablated, senders, R, ids, list(number))


def _by_role(kept: np.ndarray, n_edges: int) -> np.ndarray:
    """Kept edges [C, E] (or [E]) or per role [C, E, R] -> [C, E, R] bool (R = 1 for the former)."""
    kept = np.asarray(kept, dtype=bool)
    return kept.reshape(-1, n_edges, kept.shape[-1] if kept.ndim == 3 else 1)


def _blocks_b(plan: Plan, C: int, layer: int, H: int) -> list[tuple[int, int]]:
    """Pass (B) of a layer: (circuit, ablated senders' number) per distinct correction of its heads' inputs."""
    out = []
    for c in range(C):
        out += [(c, k) for k in dict.fromkeys(plan.layer_keys(c, layer, H).values())]
    return out


def _blocks_c(plan: Plan, C: int, layer: int, H: int) -> list[tuple[int, tuple[int, int, int]]]:
    """Pass (C): (circuit, its (q, k, v) corrections' numbers) per distinct triple of a head whose three differ."""
    out = []
    for c in range(C):
        keys = plan.layer_keys(c, layer, H)
        triples = [tuple(keys[(h, x)] for x in QKV) for h in range(H)]
        out += [(c, t) for t in dict.fromkeys(t for t in triples if len(set(t)) > 1)]
    return out


def _diff_heads(plan: Plan, C: int, layer: int, H: int) -> list[tuple[int, int]]:
    """(circuit, head) pairs whose head difference is needed (an ablated out-edge)."""
    return [(c, h) for c in range(C) for h in range(H) if plan.needs_difference(c, f"a{layer}.h{h}")]


# ---------------------------------------------------------------------------------------------
# the computation
# ---------------------------------------------------------------------------------------------

def sender_value_names(n_layers: int) -> list[str]:
    """The hook points whose X_c values the edges' senders send: the embedding stream, every head's z, every MLP's
    output."""
    return [hooks.resid_pre(0)] + [n for j in range(n_layers) for n in (hooks.attn_z(j), hooks.mlp_out(j))]


def sender_means(means: MeanActivations, pairs: Sequence[PromptPair], end: torch.Tensor, width: int
                 ) -> dict[str, torch.Tensor]:
    """Each sender's mean over X_c (:func:`engine.techniques.knockout.mean_activations`: the pair's template,
    END-aligned) laid out like a padded batch of ``pairs`` (END at ``end`` [P], ``width`` positions; zeros after
    END).  # {name: [P, width, ...]}"""
    L = means.z.shape[1]
    gidx = torch.tensor([means.index(p.template) for p in pairs])  # [P]
    by_name = {hooks.resid_pre(0): means.embed}
    for j in range(L):
        by_name[hooks.attn_z(j)], by_name[hooks.mlp_out(j)] = means.z[:, j], means.mlp[:, j]  # [G, T, ...]
    out = {}
    for name, mean in by_name.items():
        value, ok = end_aligned(mean, means.count, gidx, end, width)  # [P, width, ...], [P, width]
        out[name] = value * ok.reshape(*ok.shape, *([1] * (value.dim() - 2)))
    return out


@dataclass
class CircuitReadout:
    """Per circuit and pair, END of X_r with the circuit's edges kept and every other edge ablated."""

    logit: torch.Tensor   # [C, P] the answer token's logit
    margin: torch.Tensor  # [C, P] the answer logit minus the mean logit over the vocabulary
    right: torch.Tensor   # [C, P] bool: the answer is the top token
    logit_o: torch.Tensor  # [P] on X_r
    logit_c: torch.Tensor  # [P] on X_c
    note: str | None = None  # the blocks could not be run alone here: whole passes computed it (same numbers)


class _Runner:
    """X_r / X_c of the pairs and the passes of :func:`edge_circuits` (rows: blocks of P pairs)."""

    def __init__(self, backend: ModelBackend, pairs: Sequence[PromptPair], rows_per_pass: int,
                 means: MeanActivations | None = None, roles: int = 1) -> None:
        if roles not in (1, len(CIRCUIT_ROLES)):
            raise ValueError(f"a circuit resolved by position keeps each edge at {len(CIRCUIT_ROLES)} token roles "
                             f"({', '.join(CIRCUIT_ROLES)}), not {roles}")
        self.b = backend
        L = backend.facts.n_layers
        ids, self.mask, self.end = pad([p.ref_ids for p in pairs], pad_id(backend))
        cf, _, _ = pad([p.cf_ids for p in pairs], pad_id(backend))
        self.ref, self.cf = ids, cf
        self.answer = torch.tensor([p.answer_id for p in pairs])
        self.P = len(pairs)
        names = sender_value_names(L)
        held = [n for j in range(L) for n in (hooks.attn_q(j), hooks.attn_k(j), hooks.attn_v(j), hooks.attn_out(j))]
        held += [hooks.resid_post(j) for j in range(L)] if backend.runs_one_block else []  # the blocks' check
        moved = [hooks.resid_pre(j) for j in range(1, L)]  # what heads_read_only_qkv reads
        r_lg, self.r = backend.run_with_cache(ids, self.mask, names + held)
        c_lg, self.c = backend.run_with_cache(cf, self.mask, names + moved)
        rows = torch.arange(self.P)
        self.logit_o = r_lg[rows, self.end.to(r_lg.device), self.answer.to(r_lg.device)].float().cpu()
        self.logit_c = c_lg[rows, self.end.to(c_lg.device), self.answer.to(c_lg.device)].float().cpu()
        self.per = max(1, rows_per_pass // max(1, self.P))
        self.where: torch.Tensor | None = None  # [R, P, pos, 1]: the positions of each token role (R > 1)
        if roles > 1:
            at = torch.nn.functional.one_hot(circuit_roles(backend, pairs, ids.shape[1]), roles)  # [P, pos, R]
            self.where = at.permute(2, 0, 1)[..., None].float()
        if means is not None:  # mean ablation: the senders send their means, not X_c's values
            for name, v in sender_means(means, pairs, self.end, ids.shape[1]).items():
                self.c[name] = v.to(self.c[name].device, self.c[name].dtype).reshape(self.c[name].shape)
        self.note: str | None = None
        self.blocks: BlockCalls | None = self._one_block()
        self.resid: list[torch.Tensor] = []  # [C] of [P, pos, d]: each circuit's stream entering the current layer

    def _one_block(self) -> BlockCalls | None:
        """The blocks' calls when a layer's passes may run that block alone on each circuit's stream, checked:
        the blocks chained alone from X_r's embedding (twice over, as the passes repeat their rows) must give X_r's
        stream after every layer (:data:`engine.machinery.shortcut.TOLERANCE`).  None -- and a note -- where the
        backend cannot or the check fails: the passes then run from the input with the circuit's earlier layers
        written back (the same numbers, layer l's passes l + 1 blocks long)."""
        if not self.b.runs_one_block:
            return None
        try:
            calls = self.b.block_calls(self.ref, self.mask)
            x = self.r[hooks.resid_pre(0)].repeat(2, 1, 1)
            for j in range(self.b.facts.n_layers):
                x = self.b.block_activations(calls, j, x, [hooks.resid_post(j)])[hooks.resid_post(j)]
                check_same(f"block {j} run alone misses the model's stream", x,
                           self.r[hooks.resid_post(j)].repeat(2, 1, 1), self.b.facts.dtype)
        except (ShortcutMismatch, MissingActivation, NotImplementedError, RuntimeError, TypeError) as e:
            # a block that cannot be called alone (an argument it needs this way is missing or of the wrong shape)
            self.note = fallback_note("edge circuits, a block at a time", str(e))
            return None
        return calls

    def state_edits(self, z: list[list], mlp: list[list], cs: Sequence[int], upto: int) -> list:
        """Circuits ``cs``' heads' z and MLP outputs of layers < ``upto`` written back (their run so far)."""
        edits = []
        for j in range(upto):
            edits.append((hooks.attn_z(j), _setter(torch.cat([z[c][j] for c in cs]))))
            edits.append((hooks.mlp_out(j), _setter(torch.cat([mlp[c][j] for c in cs]))))
        return edits

    def passes(self, layer: int, circuits: Sequence[int], edits_of, names: Sequence[str], state: tuple | None
               ) -> list[dict]:
        """Run blocks 0 .. n - 1 of layer ``layer`` (block i: circuit ``circuits[i]``; ``edits_of(block indices)``
        -> that layer's edits), ``per`` blocks a pass; each block's ``names`` activations (the layer's).  The block
        alone on each circuit's stream (:attr:`blocks`), ended once ``names`` are read (an attention pass skips the
        MLP), or a pass from the input with ``state`` -- the circuits'
        (z, mlp) -- written back in the layers before (None: nothing before matters), stopped after the layer
        where the backend can.  # [n] of {name: [P, ...]}"""
        out: list[dict] = []
        n_blocks = len(circuits)
        for g in range(0, n_blocks, self.per):
            ix = list(range(g, min(n_blocks, g + self.per)))
            S, cs = len(ix), [circuits[i] for i in ix]
            if self.blocks is not None:
                with self.b.hooks(edits_of(ix)):
                    acts = self.b.block_activations(self.blocks, layer, torch.cat([self.resid[c] for c in cs]),
                                                    list(names), stop=True)  # ends once they are read
            else:
                before = [] if state is None else self.state_edits(*state, cs, layer)
                with self.b.hooks(before + edits_of(ix)):
                    acts = self.b.activations_upto(self.ref.repeat(S, 1), self.mask.repeat(S, 1), list(names))
            for s in range(S):
                out.append({n: acts[n][s * self.P:(s + 1) * self.P].float().cpu() for n in names})
        return out

    def advance(self, layer: int, z: list[list], mlp: list[list]) -> None:
        """Each circuit's stream past block ``layer``, its heads' z and its MLP output written (one block alone per
        ``per`` circuits; nothing to do where the passes run from the input).  A sequential block's streams come
        from pass (E) instead, which computes them."""
        if self.blocks is None:
            return
        post, C = hooks.resid_post(layer), len(self.resid)
        new: list[torch.Tensor] = []
        for g in range(0, C, self.per):
            cs = list(range(g, min(C, g + self.per)))
            edits = [(hooks.attn_z(layer), _setter(torch.cat([z[c][layer] for c in cs]))),
                     (hooks.mlp_out(layer), _setter(torch.cat([mlp[c][layer] for c in cs])))]
            with self.b.hooks(edits):
                x = self.b.block_activations(self.blocks, layer, torch.cat([self.resid[c] for c in cs]), [post])[post]
            new += [x[s * self.P:(s + 1) * self.P] for s in range(len(cs))]
        self.resid = new

    def end_logits(self, edits: list, S: int) -> torch.Tensor:
        """END logits of S blocks under ``edits``.  # [S * P, vocab]"""
        with self.b.hooks(edits):
            return self.b.end_logits(self.ref.repeat(S, 1), self.mask.repeat(S, 1), self.end.repeat(S)).float().cpu()


def heads_read_only_qkv(backend: ModelBackend, run: _Runner) -> None:
    """MIB's graph joins the stream to a head through its q, k and v only.  Checked in one pass: with every layer's
    q, k and v held at X_r's values and every layer's input taken from X_c, each attention output must stay X_r's.
    A head that reads the stream elsewhere too (an output gate computed from the layer input) has an input the graph
    does not name, and an edge circuit would leave it at a value no definition fixes: MissingActivation (refused)."""
    L = backend.facts.n_layers
    qkv = [n for j in range(L) for n in (hooks.attn_q(j), hooks.attn_k(j), hooks.attn_v(j))]
    outs = [hooks.attn_out(j) for j in range(L)]
    r, c = run.r, run.c  # X_r's q, k, v and attention outputs, X_c's layer inputs: cached by the runner
    edits = [(n, _setter(r[n])) for n in qkv] + [(hooks.resid_pre(j), _setter(c[hooks.resid_pre(j)]))
                                                  for j in range(L)]
    with backend.hooks(edits):
        got = backend.activations(run.ref, run.mask, outs)
    for j, n in enumerate(outs):
        want = r[n].float().cpu()
        err = float((got[n].float().cpu() - want).abs().max() / want.abs().max().clamp_min(1e-6))
        if not err <= 1e-4:
            raise MissingActivation(f"{backend.facts.architecture}'s attention reads the residual stream beyond its "
                                    f"heads' q, k and v (layer {j}'s output moves by {err:.2g} of its scale with them "
                                    f"held: an output gate?) -- MIB's graph has no edge for that input, so edge "
                                    f"circuits are not defined exactly here")


def _setter(value: torch.Tensor):
    def fn(act: torch.Tensor) -> torch.Tensor:
        return value.to(act.device, act.dtype).reshape(act.shape)
    return fn


def _adder(value: torch.Tensor):
    def fn(act: torch.Tensor) -> torch.Tensor:
        return act + value.to(act.device, act.dtype).reshape(act.shape)
    return fn


@torch.no_grad()
def edge_circuits(backend: ModelBackend, pairs: Sequence[PromptPair], kept: np.ndarray, *,
                  edges: Sequence[Edge] | None = None, rows_per_pass: int = 256, means: MeanActivations | None = None,
                  progress: ProgressFn | None = None) -> CircuitReadout:
    """END of X_r under each circuit (``kept`` [C, E] bool over ``edges``, default :func:`edge_graph`; or
    [C, E, R], each edge kept or not at each token role of :data:`CIRCUIT_ROLES`): every edge outside it ablated
    (module docstring; at a role, at that role's positions only) -- to X_c's values, or with ``means`` to the
    senders' means."""
    edges = list(edges) if edges is not None else edge_graph(backend)
    kept = _by_role(kept, len(edges))
    C = kept.shape[0]
    L, H = backend.facts.n_layers, backend.facts.n_heads
    plan = plan_of(edges, kept)
    run = _Runner(backend, pairs, rows_per_pass, means, plan.roles)
    heads_read_only_qkv(backend, run)
    P = run.P
    linear = backend.attn_branch_is_identity
    z: list[list] = [[None] * L for _ in range(C)]    # [C][L] of [P, pos, H, dh]: the circuit's heads' outputs
    mlp: list[list] = [[None] * L for _ in range(C)]  # [C][L] of [P, pos, d]
    # the senders' differences, value_u(X_c) - value_u(run) per circuit, each kept as its rows at each token role's
    # positions (R = 1: every position): a receiver's correction at a role sums only that role's rows
    roles = ([] if run.where is None else  # [R] of [P, pos] bool: a partition of the positions
             [run.where[r, ..., 0] > 0 for r in range(run.where.shape[0])])

    def split(d: torch.Tensor) -> list[torch.Tensor]:  # [P, pos, d] -> [R] of [positions of the role, d]
        return [d[m] for m in roles] if roles else [d]

    x_in = (run.c[hooks.resid_pre(0)] - run.r[hooks.resid_pre(0)]).float().cpu()  # [P, pos, d]
    diff: list[dict] = [{"input": split(x_in)} for _ in range(C)]  # [C] of {sender: [R] of [n_r, d]}
    run.resid = [run.r[hooks.resid_pre(0)]] * C  # every circuit enters layer 0 with X_r's embedding
    state = (z, mlp)

    total = [[t.clone() for t in d["input"]] for d in diff]  # [C][R]: the sum of every difference in diff[c]

    def send(c: int, sender: str, d: torch.Tensor) -> None:
        diff[c][sender] = parts = split(d)
        for t, x in zip(total[c], parts):
            t += x

    def summed(c: int, r: int, senders: tuple[str, ...]) -> torch.Tensor:
        """The senders' differences summed at role r's positions -- or, where most of the differences known so far
        are among them, their total less the others' (fewer sums: a small circuit ablates nearly every edge)."""
        if 2 * len(senders) <= len(diff[c]) + 1:
            return sum((diff[c][s][r] for s in senders), torch.zeros_like(total[c][r]))
        out, skip = total[c][r].clone(), set(senders)
        for s, d in diff[c].items():  # (in the order they were sent: the same sums every run)
            if s not in skip:
                out -= d[r]
        return out

    def correction(c: int, number: int) -> torch.Tensor:
        """What the ablated edges add to a receiver's input: per role, its senders' differences there (``number``:
        the receiver's ablated senders per role, :attr:`Plan.keys`).  # [P, pos, d]"""
        key = plan.keys[number]
        if run.where is None:
            return summed(c, 0, key[0])
        d = torch.zeros_like(x_in)
        for r, senders in enumerate(key):
            if senders:  # a role's senders summed over its positions only, then laid there
                d[roles[r]] += summed(c, r, senders)
        return d

    def mlp_correction(c: int, layer: int) -> torch.Tensor:
        return correction(c, plan.key(c, ("mlp", layer)))

    def step(layer: int) -> None:
        """Layer ``layer`` of every circuit: its heads' z, their differences, its MLP."""
        q_, k_, v_, z_ = (hooks.attn_q(layer), hooks.attn_k(layer), hooks.attn_v(layer), hooks.attn_z(layer))
        # (B) the layer's q, k, v (and z) per distinct correction of its heads' inputs
        bb = _blocks_b(plan, C, layer, H)
        got_b = run.passes(layer, [c for c, _ in bb], lambda ix: [
            (hooks.resid_pre(layer), _adder(torch.cat([correction(*bb[i]) for i in ix])))], [q_, k_, v_, z_], state)
        at_b = {blk: got for blk, got in zip(bb, got_b)}
        # (C) heads whose q, k and v read different corrections
        bc = _blocks_c(plan, C, layer, H)

        def edits_c(ix):
            return [(name, _setter(torch.cat([at_b[(bc[i][0], bc[i][1][n])][name] for i in ix])))
                    for n, name in enumerate((q_, k_, v_))]
        got_c = run.passes(layer, [c for c, _ in bc], edits_c, [z_], None)  # z reads q, k and v only
        at_c = {blk: got[z_] for blk, got in zip(bc, got_c)}
        for c in range(C):
            keys = plan.layer_keys(c, layer, H)
            zz = torch.empty_like(run.r[z_].float().cpu())
            for h in range(H):
                t = tuple(keys[(h, x)] for x in QKV)
                src = at_b[(c, t[0])][z_] if len(set(t)) == 1 else at_c[(c, t)]
                zz[:, :, h] = src[:, :, h]
            z[c][layer] = zz
        # (D) the heads' differences: a block per head with an ablated out-edge and a base block per circuit
        zc = run.c[z_].float().cpu()
        if linear:
            W_O = backend.W_O(layer).float().cpu()  # [H, dh, d]
            for c in range(C):
                for h in range(H):
                    if plan.needs_difference(c, f"a{layer}.h{h}"):
                        send(c, f"a{layer}.h{h}", (zc[:, :, h] - z[c][layer][:, :, h]) @ W_O[h])
        dh = [] if linear else _diff_heads(plan, C, layer, H)
        blocks_d = [(c, h) for c, h in dh] + [(c, -1) for c in dict.fromkeys(c for c, _ in dh)]

        def edits_d(ix):
            zs = []
            for i in ix:
                c, h = blocks_d[i]
                zv = z[c][layer].clone()
                if h >= 0:
                    zv[:, :, h] = zc[:, :, h]
                zs.append(zv)
            return [(z_, _setter(torch.cat(zs)))]
        got_d = run.passes(layer, [c for c, _ in blocks_d], edits_d, [hooks.attn_out(layer)], state)
        base = {c: got[hooks.attn_out(layer)] for (c, h), got in zip(blocks_d, got_d) if h < 0}
        for (c, h), got in zip(blocks_d, got_d):
            if h >= 0:
                send(c, f"a{layer}.h{h}", got[hooks.attn_out(layer)] - base[c])
        # (E) the MLP, its input plus its correction (a parallel block: through the block model's branch)
        parallel = backend.parallel_attn_mlp

        def edits_e(ix):
            e = [(z_, _setter(torch.cat([z[c][layer] for c in ix])))]
            if not parallel:
                e.append((hooks.mlp_in(layer), _adder(torch.cat([mlp_correction(c, layer) for c in ix]))))
            return e
        # a sequential block's MLP output here is the circuit's own, so is the stream after it: each circuit's
        # stream is advanced by this pass (a parallel block's MLP output is corrected below: advanced after it)
        post = hooks.resid_post(layer) if run.blocks is not None and not parallel else None
        names_e = [hooks.mlp_out(layer)] + ([hooks.resid_pre(layer)] if parallel else []) + ([post] if post else [])
        advanced = []
        for c, got in enumerate(run.passes(layer, list(range(C)), edits_e, names_e, state)):
            out = got[hooks.mlp_out(layer)]
            if parallel and plan.ablated[c].get(("mlp", layer)):
                out = out + _branch_change(backend, layer, got[hooks.resid_pre(layer)], mlp_correction(c, layer))
            mlp[c][layer] = out
            send(c, f"m{layer}", run.c[hooks.mlp_out(layer)].float().cpu() - out)
            if post:
                advanced.append(got[post])
        if post:
            run.resid = advanced
        else:
            run.advance(layer, z, mlp)
    steps = Stages(progress, [1] * (L + 1))
    for layer in range(L):
        bar = steps.stage(layer)
        step(layer)
        if bar is not None:
            bar(1, 1)
    # the final stream with its correction, END's logits
    bar = steps.stage(L)
    logit, margin, right = (torch.empty(C, P), torch.empty(C, P), torch.empty(C, P, dtype=torch.bool))
    rows_all = torch.arange(P)
    for g in range(0, C, run.per):
        cs = list(range(g, min(C, g + run.per)))
        add = torch.cat([correction(c, plan.key(c, ("logits",))) for c in cs])
        lg = run.end_logits(run.state_edits(z, mlp, cs, L) + [(hooks.resid_post(L - 1), _adder(add))], len(cs))
        for s, c in enumerate(cs):
            block = lg[s * P:(s + 1) * P]
            a = block[rows_all, run.answer]
            logit[c], margin[c], right[c] = a, a - block.mean(-1), block.argmax(-1) == run.answer
    if bar is not None:
        bar(1, 1)
    return CircuitReadout(logit, margin, right, run.logit_o, run.logit_c, run.note)


def _branch_change(backend: ModelBackend, layer: int, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """A parallel block's MLP output change when its input x [P, pos, d] gets ``d`` (the block model's branch)."""
    def branch(v: torch.Tensor) -> torch.Tensor:
        flat = v.reshape(-1, v.shape[-1]).to(backend.device)
        return backend.mlp_branch(layer, flat).float().cpu().reshape(v.shape)
    return branch(x + d) - branch(x)


def edge_circuits_work(backend: ModelBackend, pairs: Sequence[PromptPair], kept: np.ndarray, *,
                       edges: Sequence[Edge] | None = None, rows_per_pass: int = 256):
    """The forward work of :func:`edge_circuits` (``engine.cost.Work``): X_r and X_c, the check that heads read
    the stream through q, k and v only (one pass), then per layer the
    blocks of passes (B) to (E) (a parallel block: its MLP branch twice per circuit with an ablated edge into the
    MLP), and the final pass, ``rows_per_pass`` rows at most per pass; a layer's passes run its block alone where
    the backend can (``engine.cost.block_pass``: (B) to (D) its attention only; the blocks' calls, their check and
    a parallel block's streams advanced through the layer added), else stop after it where the backend can
    (``engine.cost.pass_upto``)."""
    from engine.cost import NO_WORK, Work, block_pass, one_pass, pass_upto
    edges = list(edges) if edges is not None else edge_graph(backend)
    kept = _by_role(kept, len(edges))
    C = kept.shape[0]
    L, H = backend.facts.n_layers, backend.facts.n_heads
    plan = plan_of(edges, kept)
    n, width = len(pairs), max(len(p.ref_ids) for p in pairs)
    per = max(1, rows_per_pass // max(1, n))
    alone = backend.runs_one_block  # (assumed to pass its check: else the passes run from the input)
    w = one_pass(n, width, n * width) * 2
    if alone:  # the blocks' calls (full logits) and the check: every block alone on X_r's stream, twice over
        w += one_pass(n, width, n * width) + block_pass(2 * n, width) * L
    w += one_pass(n, width)  # heads_read_only_qkv's pass (it reads X_r and X_c from the two above)

    def blocks(count: int, layer: int | None, attention_only: bool = False) -> Work:  # ``count`` blocks of n rows
        out = NO_WORK  # (``per`` a pass)
        for g in range(0, count, per):
            rows = min(per, count - g) * n
            out += (one_pass(rows, width) if layer is None else block_pass(rows, width, attention_only) if alone
                    else pass_upto(backend, rows, width, layer))
        return out
    for layer in range(L):
        dh = [] if backend.attn_branch_is_identity else _diff_heads(plan, C, layer, H)
        # (B), (C) and (D) read the attention only (a block alone stops there), (E) the MLP's output
        stages = ((len(_blocks_b(plan, C, layer, H)), True), (len(_blocks_c(plan, C, layer, H)), True),
                  (len(dh) + len({c for c, _ in dh}), True), (C, False))
        for count, attention_only in stages:
            if count:
                w += blocks(count, layer, attention_only)
        if alone and backend.parallel_attn_mlp:  # a parallel block's streams advanced
            w += blocks(C, layer)
        if backend.parallel_attn_mlp:
            w += Work(mlp_rows=2 * n * width * sum(1 for c in range(C) if plan.ablated[c].get(("mlp", layer))))
    return w + blocks(C, None)  # the final pass: END's logits


# ---------------------------------------------------------------------------------------------
# circuits of a ranking, and the faithfulness curve
# ---------------------------------------------------------------------------------------------

def top_edges(scores: np.ndarray, k: int) -> np.ndarray:
    """The circuit of the top ``k`` edges by |score| (ties in graph order).  # [E] bool"""
    return top_edges_of_sizes(scores, [k])[0]


def top_edges_of_sizes(scores: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """:func:`top_edges` for each k of ``ks``, the edges sorted once for all of them.  # [K, E] bool"""
    order = np.argsort(-np.abs(np.asarray(scores, dtype=np.float64)), kind="stable")
    keep = np.zeros((len(ks), len(scores)), dtype=bool)
    for i, k in enumerate(ks):
        keep[i, order[:k]] = True
    return keep


def plan_circuits(scores: dict[str, np.ndarray], sizes: Sequence[float] = SIZES
                  ) -> tuple[list[Circuit], np.ndarray, np.ndarray]:
    """(circuits: the model, the empty circuit, then each ranking's top-k edges per size; the distinct kept
    masks [D, E]; each circuit's row among them [S]).  Every ranking's circuits of size 0 and 1 are the empty
    circuit and the model: computed once."""
    E = len(next(iter(scores.values())))
    circuits = [Circuit("model", 0, 1.0, E), Circuit("empty", 0, 0.0, 0)]
    masks = [np.ones(E, bool), np.zeros(E, bool)]
    for name, s in scores.items():
        ks = [kept_count(x, E) for x in sizes]
        circuits += [Circuit(name, 0, x, k) for x, k in zip(sizes, ks)]
        masks += list(top_edges_of_sizes(s, ks))
    at: dict[bytes, int] = {}
    distinct, row = [], []
    for m in masks:
        key = np.packbits(m).tobytes()
        if key not in at:
            at[key] = len(distinct)
            distinct.append(m)
        row.append(at[key])
    return circuits, np.stack(distinct), np.array(row)


def random_edge_scores(n_edges: int, draws: int, seed: int = SEED) -> list[np.ndarray]:
    """``draws`` seeded random scores of the edges: the top k of one is a uniformly random circuit of k edges.
    # [draws] of [E]"""
    rng = np.random.default_rng(seed)
    return [rng.random(n_edges) for _ in range(draws)]


def random_draw_of(n_pairs: int, draws: int) -> np.ndarray:
    """[P] the random order each pair is read under: pair i under order i mod ``draws``."""
    return np.arange(n_pairs) % draws


def random_runs(n_edges: int, n_pairs: int, draws: int, seed: int, sizes: Sequence[float]
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The random ranking's runs: per draw that some pair is read under, (its pairs' indices [p], its circuits of
    each size [X, E] bool)."""
    draw = random_draw_of(n_pairs, draws)
    out = []
    for d, s in enumerate(random_edge_scores(n_edges, draws, seed)):
        g = np.nonzero(draw == d)[0]
        if len(g):
            out.append((g, top_edges_of_sizes(s, [kept_count(x, n_edges) for x in sizes])))
    return out


@torch.no_grad()
def edge_faithfulness(backend: ModelBackend, pairs: Sequence[PromptPair], scores: dict[str, np.ndarray], *,
                      draws: int = RANDOM_DRAWS, seed: int = SEED, sizes: Sequence[float] = SIZES,
                      rows_per_pass: int = 256, ablation: str = ABLATIONS[0], units: Units | None = None,
                      progress: ProgressFn | None = None) -> tuple[list[Circuit], np.ndarray, np.ndarray]:
    """(circuits, right [S, P], margin [S, P]) of every ranking's top-edge circuits (``scores``: {ranking: [E] in
    :func:`engine.techniques.edges.edge_graph`'s order}) and, ``draws`` > 0, of the random ranking (one row per
    size, each pair read under its own draw's circuit: the draw's pairs run with the draw's circuits), for
    :func:`engine.techniques.faithfulness.summarize`.  ``ablation``: an ablated edge sends its sender's X_c value
    (``counterfactual``) or its mean over the set's X_c (``mean``: the knockouts' means, over all of ``pairs``).
    ``units``: the circuits are made of these (:mod:`engine.techniques.circuit_units`: edges or nodes at token
    roles; ``scores`` then [U] in their order); None: of the edges."""
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}: choose from {', '.join(ABLATIONS)}")
    means = mean_activations(backend, pairs) if ablation == "mean" else None
    circuits, masks, row = plan_circuits(scores, sizes)
    E = masks.shape[1]  # the units
    expand = _expander(units)
    runs = random_runs(E, len(pairs), draws, seed, sizes) if draws else []
    stage = Stages(progress, [len(pairs)] + [len(g) for g, _ in runs]).stage  # one count over the runs
    out = edge_circuits(backend, pairs, expand(masks), rows_per_pass=rows_per_pass, means=means, progress=stage(0))
    right, margin = out.right.numpy()[row], out.margin.numpy()[row]
    if not runs:
        return circuits, right, margin
    r_right = np.zeros((len(sizes), len(pairs)), dtype=right.dtype)      # [X, P]
    r_margin = np.zeros((len(sizes), len(pairs)), dtype=margin.dtype)    # [X, P]
    for i, (g, kept) in enumerate(runs):  # a draw's pairs under the draw's circuits  # kept: [X, E]
        o = edge_circuits(backend, [pairs[j] for j in g], expand(kept), rows_per_pass=rows_per_pass, means=means,
                          progress=stage(i + 1))
        r_right[:, g], r_margin[:, g] = o.right.numpy(), o.margin.numpy()
    circuits = circuits + [Circuit(RANDOM, 0, x, kept_count(x, E)) for x in sizes]
    return circuits, np.concatenate([right, r_right]), np.concatenate([margin, r_margin])


def _expander(units: Units | None) -> Callable[[np.ndarray], np.ndarray]:
    """Kept units [C, U] -> what :func:`edge_circuits` reads (the edges, per role where resolved)."""
    return (lambda kept: kept) if units is None else units.edges_kept


def random_circuit(n_edges: int, size: float, pair: int, draws: int = RANDOM_DRAWS, seed: int = SEED) -> np.ndarray:
    """The random ranking's circuit of ``size`` that pair number ``pair`` is read under.  # [E] bool"""
    s = random_edge_scores(n_edges, draws, seed)[int(random_draw_of(pair + 1, draws)[pair])]
    return top_edges(s, kept_count(size, n_edges))


def cached_edge_faithfulness(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: Sequence[str],
                             scores: Callable[[], dict[str, np.ndarray]], *, steps: int = 0,
                             sizes: Sequence[float] = SIZES, ablation: str = ABLATIONS[0], resolution: str = "edge",
                             cache=None, progress: ProgressFn | None = None) -> tuple[FaithTable, dict, bool]:
    """:func:`edge_faithfulness` of ``rankings`` through the result cache: (table -- curves and CPR / CMD with
    bootstrap intervals, as the node circuits' --, artifacts {seconds, forward_equivalents}, computed).
    ``scores()``: {ranking: [E]}, called only when the curves are not cached (the edge scores' own cache:
    :func:`engine.techniques.edge_scores.graph_scores`); ``steps``: EAP-IG's, part of the key; ``ablation``: as
    :func:`edge_faithfulness`; ``resolution``: what the circuits are made of
    (:data:`engine.techniques.circuit_units.RESOLUTIONS`; ``scores()`` then gives each unit's score)."""
    from engine.results import decode_rows, encode_rows, run_cached
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}: choose from {', '.join(ABLATIONS)}")
    f = backend.facts
    params = {"version": VERSION, "sizes": list(sizes), "rankings": list(rankings), "dtype": f.dtype,
              "steps": steps if "eap-ig" in rankings else 0,
              "ablation": ABLATION_KEYS[ablation], "circuits": "top floor(x E) edges by |score|",
              "random": {"draws": RANDOM_DRAWS, "seed": SEED, "read": "pair i under draw i mod draws"},
              "metric": "answer logit - mean logit; accuracy", "resamples": RESAMPLES, "level": LEVEL}
    units = None if resolution == "edge" else units_of(backend, resolution)
    if units is not None:  # the edge circuits' key is as it was before the resolutions
        params |= {"resolution": resolution, "roles": list(CIRCUIT_ROLES),
                   "circuits": "top floor(x U) units by |score|"}

    def compute():
        by_ranking = scores()
        t = time.perf_counter()
        circuits, right, margin = edge_faithfulness(backend, pairs, by_ranking, sizes=sizes, ablation=ablation,
                                                    units=units, progress=progress)
        seconds = time.perf_counter() - t
        fe = edge_faithfulness_work(backend, pairs, by_ranking, sizes=sizes, ablation=ablation,
                                    units=units).fe(backend, pairs)
        pts, sc = summarize(right, margin, circuits, sizes)
        return encode_rows(pts, FAITH_POINT) + encode_rows(sc, FAITH_SCORE), {
            "n_layers": f.n_layers, "n_heads": f.n_heads, "n_pairs": len(pairs), "edges": circuits[0].k,
            "resolution": resolution,
            "seconds": seconds, "forward_equivalents": fe}

    rows, art, computed = run_cached(backend, pairs, METHOD, params, compute, cache)
    table = FaithTable(int(art["n_layers"]), int(art["n_heads"]), int(art["n_pairs"]),
                       decode_rows(FaithPoint, [r for r in rows if r.metric in FAITH_POINT], FAITH_POINT),
                       decode_rows(FaithScore, [r for r in rows if r.metric in FAITH_SCORE], FAITH_SCORE), {})
    return table, art, computed


def edge_faithfulness_work(backend: ModelBackend, pairs: Sequence[PromptPair], scores: dict[str, np.ndarray], *,
                           draws: int = RANDOM_DRAWS, seed: int = SEED, sizes: Sequence[float] = SIZES,
                           rows_per_pass: int = 256, ablation: str = ABLATIONS[0], units: Units | None = None):
    """The forward work of :func:`edge_faithfulness` once the rankings' scores are known (``engine.cost.Work``);
    mean ablation adds the means' passes of X_c (none once they are memoised)."""
    from engine.cost import NO_WORK
    _, masks, _ = plan_circuits(scores, sizes)
    expand = _expander(units)
    w = mean_activations_work(backend, pairs) if ablation == "mean" else NO_WORK
    w += edge_circuits_work(backend, pairs, expand(masks), rows_per_pass=rows_per_pass)
    for g, kept in random_runs(masks.shape[1], len(pairs), draws, seed, sizes) if draws else []:
        w += edge_circuits_work(backend, [pairs[j] for j in g], expand(kept), rows_per_pass=rows_per_pass)
    return w
