"""Edge attribution patching (EAP) and EAP with integrated gradients (EAP-IG): gradient estimates of edge patching.

EAP (Syed, Rager & Conmy 2023, "Attribution Patching Outperforms Automated Circuit Discovery") scores an edge
u -> v of the residual graph (:mod:`engine.techniques.edges`) by the first-order estimate of patching it::

    EAP(u -> v) = sum over positions of  d_u . dm/dx_v          (on X_r)

with ``d_u = value_u(X_c) - value_u(X_r)`` the sender's difference (what exact edge patching sends, every
position) and ``x_v`` what receiver v reads: a head's query, key or value input, an MLP's input, the final
stream; m is the answer token's logit at END, so EAP estimates ``logit_p - logit_o`` of
:func:`engine.techniques.edges.edge_patching`.

EAP-IG (Hanna, Pezzelle & Belinkov 2024, "Have Faith in Faithfulness"; MIB's strongest edge method,
"EAP-IG-inputs") averages the gradient over ``steps`` points between X_c and X_r on the inputs: the embedding
stream entering the first block is ``x_c + (k / steps) (x_r - x_c)`` for k = 1 .. steps (EAP-IG's
``input_interpolation_hook``), every later activation recomputed there::

    EAP-IG(u -> v) = sum over positions of  d_u . mean_k dm/dx_v (k / steps)

With one step the only point is X_r itself: EAP-IG equals EAP (``tests/integration/test_eap.py``).

**By token role** (``by_role``; position-aware edge attribution, Haklay et al., ACL 2025): the sum over positions
is split into one per role of :data:`engine.techniques.attention.CIRCUIT_ROLES` (operand A, operator, operand B,
END, other) -- the estimate of patching the edge at that role's positions only; the roles' scores add up to the
edge's.  Under a counterfactual that changes only the operator, every position before it has d_u = 0: an operand
written before the operator scores exactly 0 there.

**The gradients.**  A head's three inputs are one stream (the layer's input) read three times, so its
gradient through one of them is not a hook's gradient.  Per point: (1) one forward and backward pass with zero
probes on every head's output z, every MLP's output and the final stream: dm/dz[l, h], dm/dmlp_out[l], dm/dx
at the logits; (2) per layer l, one forward and backward pass with the layer's heads x (q, k, v) as 3 H row
blocks, a zero probe on the layer's input and, in each block, the two other inputs detached: the gradient of
``z[l, h] . dm/dz[l, h]`` with respect to the probe is dm/dx through head h's input x (the chain rule: x reaches
m only through z[l, h] along the edge).  An MLP's input gradient comes from a probe on the MLP branch's input
(``hooks.mlp_in``, in pass 1); a parallel block's MLP reads the block input, shared with the attention, so there
it is the vector-Jacobian product of the block model's MLP branch (``backend.mlp_branch``) with dm/dmlp_out,
checked first against the model's own MLP output.  Cost per point: 1 + L forward and backward
passes, the layer passes 3 H rows per pair; the senders' differences L passes of H rows per pair
(:func:`eap_work`).  A layer's pass needs only that layer: where the backend runs a block alone
(``ModelBackend.block_activations``) it runs block l alone on the point's own stream entering it (kept from pass
(1)), the probe added to it, and ends it at z (m depends on the block only through z there: the MLP is not run)
-- checked first: the block's z at a zero probe must be pass (1)'s (1e-4 of its scale in float32); the senders'
differences likewise run block l alone on X_r's stream, up to the attention's output, with one row block left
unpatched that must give X_r's (:func:`engine.techniques.edges.sender_differences`); else whole passes, and the
result's ``note`` says so.  Last, per pair and token role, one product of the senders' differences with the
receivers' gradients over those positions gives every edge's sum at once (:func:`_edge_sums`).  Checked against
autograd through hand-patched runs of a plain model (``tests/helpers/plain_edges.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.backends import hooks
from engine.backends.base import BlockCalls, ModelBackend
from engine.machinery.patch_rows import PatchRun
from engine.machinery.shortcut import TOLERANCE, ShortcutMismatch, check_same, fallback_note
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
from engine.techniques.edges import (
    QKV,
    Edge,
    edge_graph,
    head_senders_per_layer,
    prepared,
    sender_differences,
    sender_differences_work,
)

METHOD = "eap"


@dataclass
class Gradients:
    """dm/dx of every receiver's input, averaged over the points of one run.  P pairs, T positions."""

    logits: torch.Tensor       # [P, T, d]        the final stream
    mlp: list[torch.Tensor]    # [L] of [P, T, d]  each MLP's input
    heads: dict[int, torch.Tensor]  # layer -> [P, T, H, 3, d]  each head's q, k, v input

    def of(self, edge: Edge) -> torch.Tensor:
        v = edge.receiver
        if v.kind == "logits":
            return self.logits
        if v.kind == "mlp":
            return self.mlp[v.layer]
        return self.heads[v.layer][:, :, v.head, QKV.index(edge.qkv)]


@dataclass
class EapRaw:
    """Per-pair estimates of each edge's ``logit_p - logit_o``.  E edges, P pairs."""

    pairs: list[PromptPair]
    edges: list[Edge]
    scores: torch.Tensor  # [E, P], or [E, R, P] split by token role (``eap(by_role=True)``)
    steps: int            # 0: EAP, else EAP-IG's points
    note: str | None = None  # the layers' blocks could not be run alone: whole passes computed it (same numbers)

    def effects(self) -> torch.Tensor:
        """Mean estimate per edge (per edge and role).  # [E] or [E, R]"""
        return self.scores.double().mean(-1)


def eap(backend: ModelBackend, pairs: Sequence[PromptPair], edges: Sequence[Edge] | None = None, *,
        steps: int = 0, by_role: bool = False, progress: ProgressFn | None = None) -> EapRaw:
    """EAP (``steps`` 0) or EAP-IG with ``steps`` points of every edge (default all; module docstring);
    ``by_role``: the sum over positions split by token role (scores [E, R, P], module docstring)."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0 (0: EAP, n: EAP-IG with n points), got {steps}")
    edges = list(edges) if edges is not None else edge_graph(backend)
    run = prepared(backend, pairs)
    layers = sorted({e.receiver.layer for e in edges if e.receiver.kind == "head"})
    calls = backend.block_calls(run.ref, run.mask) if _blocks_alone(backend, edges) else None
    diffs, note = sender_differences(backend, run, list({e.sender: None for e in edges}), calls)
    if note is not None:  # a block alone missed the model: whole passes for the gradients too
        calls = None
    points = [1.0] if steps <= 1 else [k / steps for k in range(1, steps + 1)]
    total = None
    for i, alpha in enumerate(points):
        try:
            g = gradients(backend, run, layers, alpha, calls)
        except (ShortcutMismatch, RuntimeError, TypeError) as e:
            # the block alone did not reproduce the model, or could not be called so (an argument of another
            # shape than its rows': MPT's ALiBi): whole passes from here on (a failure of those raises again)
            calls, note = None, fallback_note("EAP, a layer's block alone", str(e))
            g = gradients(backend, run, layers, alpha, None)
        total = g if total is None else _summed(total, g)
        if progress is not None:
            progress(i + 1, len(points))
    if not by_role:
        everywhere = torch.ones(run.ref.shape, dtype=torch.bool)[None]  # [1, P, T]
        return EapRaw(list(pairs), edges, _edge_sums(diffs, total, edges, everywhere)[:, 0] / len(points), steps,
                      note)  # [E, P]
    roles = circuit_roles(backend, pairs, run.ref.shape[1])  # [P, T]
    at = torch.stack([roles == r for r in range(len(CIRCUIT_ROLES))])  # [R, P, T]
    return EapRaw(list(pairs), edges, _edge_sums(diffs, total, edges, at) / len(points), steps, note)  # [E, R, P]


def _edge_sums(diffs: dict[str, torch.Tensor], total: Gradients, edges: Sequence[Edge], at: torch.Tensor
               ) -> torch.Tensor:
    """For every edge u -> v, pair p and group g of positions (``at`` [G, P, T], disjoint): the sum over g's
    positions of d_u . dm/dx_v -- per pair and group one product of the senders' differences with the receivers'
    gradients over those positions (U x V sums, the edges read from it).  -> [E, G, P]"""
    senders = {s: i for i, s in enumerate(dict.fromkeys(e.sender.name for e in edges))}
    receivers: dict[tuple, int] = {}
    grads = []
    for e in edges:
        if (e.receiver, e.qkv) not in receivers:
            receivers[e.receiver, e.qkv] = len(grads)
            grads.append(total.of(e))
    D = torch.stack([diffs[s] for s in senders])  # [U, P, T, d]
    G = torch.stack(grads)                         # [V, P, T, d]
    u = torch.tensor([senders[e.sender.name] for e in edges])
    v = torch.tensor([receivers[e.receiver, e.qkv] for e in edges])
    out = torch.zeros(len(edges), at.shape[0], D.shape[1])
    for g in range(at.shape[0]):
        for p in range(D.shape[1]):
            t = at[g, p]
            if t.any():
                sums = D[:, p, t].reshape(len(D), -1) @ G[:, p, t].reshape(len(G), -1).T  # [U, V]
                out[:, g, p] = sums[u, v]
    return out


def _blocks_alone(backend: ModelBackend, edges: Sequence[Edge]) -> bool:
    """Whether :func:`eap` runs layers' blocks alone: the backend can, and some edge has a head receiver (the
    gradients' layer passes) or a head sender (the senders' differences)."""
    return backend.runs_one_block and (any(e.receiver.kind == "head" for e in edges)
                                       or bool(head_senders_per_layer(edges)))


def _summed(a: Gradients, b: Gradients) -> Gradients:
    return Gradients(a.logits + b.logits, [x + y for x, y in zip(a.mlp, b.mlp)],
                     {j: a.heads[j] + b.heads[j] for j in a.heads})


def _interpolated(run: PatchRun, alpha: float):
    """The edit of the point ``alpha`` between X_c (0) and X_r (1) on the embedding stream (X_r itself: none)."""
    if alpha == 1.0:
        return []
    x_r, x_c = run.ref_cache[hooks.resid_pre(0)], run.cf_cache[hooks.resid_pre(0)]
    point = x_c + alpha * (x_r - x_c)  # [P, T, d]

    def fn(act: torch.Tensor) -> torch.Tensor:  # [S * P, T, d]
        return point.repeat(act.shape[0] // point.shape[0], 1, 1).to(act.device, act.dtype)
    return [(hooks.resid_pre(0), fn)]


def _add(probe: torch.Tensor):
    def fn(act: torch.Tensor) -> torch.Tensor:
        return act + probe.to(act.device, act.dtype)
    return fn


def gradients(backend: ModelBackend, run: PatchRun, head_layers: Sequence[int], alpha: float = 1.0,
              calls: BlockCalls | None = None) -> Gradients:
    """Every receiver input's gradient at the point ``alpha`` (module docstring): 1 + len(head_layers) passes, the
    layers' passes a block alone each where ``calls`` are given (ShortcutMismatch where that misses)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    P, T = run.ref.shape
    point = _interpolated(run, alpha)
    z_p = [torch.zeros(P, T, H, f.d_head, requires_grad=True) for _ in range(L)]
    m_p = [torch.zeros(P, T, f.d_model, requires_grad=True) for _ in range(L)]
    x_p = torch.zeros(P, T, f.d_model, requires_grad=True)
    edits = list(point) + [(hooks.resid_post(L - 1), _add(x_p))]
    for j in range(L):
        edits += [(hooks.attn_z(j), _add(z_p[j])), (hooks.mlp_out(j), _add(m_p[j]))]
    sequential = not backend.parallel_attn_mlp
    i_p = [torch.zeros(P, T, f.d_model, requires_grad=True) for _ in range(L)] if sequential else []
    # a sequential block: a probe on the MLP's input (a write there reaches the MLP branch only); a parallel one
    # reads the block input, shared with the attention: that stream and the MLP's output in this pass are kept for
    # the branch's VJP instead
    seen: dict[tuple[str, int], torch.Tensor] = {}

    def keep(what: str, j: int):
        def fn(act: torch.Tensor) -> torch.Tensor:
            seen[what, j] = act.detach()
            return act
        return fn
    if calls is not None:  # each head layer's stream entering it, and its z (the block's check)
        edits += [e for j in head_layers
                  for e in ((hooks.resid_pre(j), keep("pre", j)), (hooks.attn_z(j), keep("z", j)))]
    if sequential:
        edits += [(hooks.mlp_in(j), _add(i_p[j])) for j in range(L)]
    else:
        edits += [e for j in range(L) for e in ((hooks.resid_pre(j), keep("in", j)),
                                                (hooks.mlp_out(j), keep("out", j)))]
    with torch.enable_grad(), backend.hooks(edits):
        lg = backend.logits(run.ref, run.mask)
        m = lg[torch.arange(P, device=lg.device), run.end.to(lg.device), run.answer.to(lg.device)].float()
        grads = torch.autograd.grad(m.sum(), [x_p, *z_p, *m_p, *i_p])
    g_x, g_z = grads[0].float().cpu(), [g.float().cpu() for g in grads[1:L + 1]]
    if sequential:
        mlp = [g.float().cpu() for g in grads[2 * L + 1:]]
    else:
        mlp = [_mlp_vjp(backend, j, seen["in", j], seen["out", j], grads[L + 1 + j]) for j in range(L)]
    heads = {j: _head_input_gradients(backend, run, j, g_z[j], point,
                                      None if calls is None else (calls, seen["pre", j], seen["z", j]))
             for j in head_layers}
    return Gradients(g_x, mlp, heads)


def _mlp_vjp(backend: ModelBackend, layer: int, x: torch.Tensor, own: torch.Tensor, cot: torch.Tensor
             ) -> torch.Tensor:
    """(d mlp_branch(x) / dx)^T cot: dm through a parallel block's MLP input ``x`` (the block input), by the block
    model's MLP branch -- checked first: it must give back ``own``, the model's MLP output in the same pass
    (ShortcutMismatch otherwise).  x, own, cot: [P, T, d] -> [P, T, d]"""
    flat = x.reshape(-1, x.shape[-1]).to(backend.device).requires_grad_(True)
    with torch.enable_grad():
        out = backend.mlp_branch(layer, flat)
        want = own.reshape(out.shape).float()
        err = float((out.detach().float().cpu() - want.cpu()).abs().max() / want.abs().max().clamp_min(1e-6))
        if not err <= TOLERANCE.get(backend.facts.dtype, 1e-4) * 10:
            raise ShortcutMismatch(f"the block model's MLP branch misses layer {layer}'s MLP output by {err:.2g} of "
                                   f"its scale: EAP cannot take the MLP's input gradient on this parallel block")
        (g,) = torch.autograd.grad(out, flat, cot.reshape(flat.shape).to(out.device, out.dtype))
    return g.float().cpu().reshape(x.shape)


def _detached_rows(keep: Sequence[bool], P: int):
    """Hook: the row blocks with ``keep`` False are cut from the graph (their value unchanged)."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        parts = [act[s * P:(s + 1) * P] if k else act[s * P:(s + 1) * P].detach() for s, k in enumerate(keep)]
        return torch.cat(parts)
    return fn


def _head_input_gradients(backend: ModelBackend, run: PatchRun, layer: int, g_z: torch.Tensor, point,
                          alone: tuple[BlockCalls, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """dm/dx through each head's q, k and v input at ``layer``: one pass, 3 H row blocks.  ``alone`` = (the blocks'
    calls, the point's stream entering the layer [P, T, d], the whole pass's z there): block ``layer`` run alone on
    that stream instead of a whole pass -- ShortcutMismatch unless its z at a zero probe is that z.
    -> [P, T, H, 3, d]"""
    f = backend.facts
    H = f.n_heads
    P, T = run.ref.shape
    blocks = [(h, x) for h in range(H) for x in QKV]
    S = len(blocks)
    probe = torch.zeros(S * P, T, f.d_model, requires_grad=True)
    seen: dict[str, torch.Tensor] = {}

    def record(act: torch.Tensor) -> torch.Tensor:
        seen["z"] = act
        return act
    names = {"q": hooks.attn_q(layer), "k": hooks.attn_k(layer), "v": hooks.attn_v(layer)}
    edits = [] if alone else list(point) + [(hooks.resid_pre(layer), _add(probe))]
    edits += [(name, _detached_rows([x == inp for _, x in blocks], P)) for inp, name in names.items()]
    edits.append((hooks.attn_z(layer), record))
    with torch.enable_grad(), backend.hooks(edits):
        if alone is None:
            backend.logits(run.stacked(run.ref, S), run.stacked(run.mask, S))
        else:
            calls, stream, z_ref = alone
            backend.block_activations(calls, layer, stream.repeat(S, 1, 1) + probe.to(stream.device, stream.dtype),
                                      [hooks.attn_z(layer)], stop=True)  # m depends on the block only through z
        z = seen["z"].float()  # [S * P, T, H, dh]
        if alone is not None:
            check_same(f"block {layer} run alone misses the model's z", z, z_ref.repeat(S, 1, 1, 1), f.dtype)
        head = torch.tensor([h for h, _ in blocks]).repeat_interleave(P).to(z.device)
        zh = z[torch.arange(S * P, device=z.device), :, head]  # [S * P, T, dh]
        obj = (zh * g_z.repeat(S, 1, 1, 1)[torch.arange(S * P), :, head.cpu()].to(z.device)).sum()
        (g,) = torch.autograd.grad(obj, probe)
    return g.float().reshape(H, 3, P, T, f.d_model).permute(2, 3, 0, 1, 4).contiguous()


def eap_work(backend: ModelBackend, pairs: Sequence[PromptPair], edges: Sequence[Edge] | None = None, *,
             steps: int = 0):
    """The forward and backward work of :func:`eap` (``engine.cost.Work``): X_r and X_c, the heads' differences (a
    pass per layer with head senders), and per point one full-logits pass of the prompts and one of 3 H rows per
    layer with head receivers, each with its backward pass."""
    from engine.cost import BACKWARD_FACTOR, Work, one_pass
    from engine.machinery.patch_rows import prepare_work
    f = backend.facts
    edges = list(edges) if edges is not None else edge_graph(backend)
    n, width = len(pairs), max(len(p.ref_ids) for p in pairs)
    head_layers = {e.receiver.layer for e in edges if e.receiver.kind == "head"}
    alone = _blocks_alone(backend, edges)  # (assumed to pass its check)
    w = prepare_work(pairs) + sender_differences_work(backend, edges, n, width, alone=alone)
    per_point = Work(1, n * width, n * width, backward=n * width)
    rows = 3 * f.n_heads * n
    for _ in head_layers:  # a block alone up to z: forward and backward through its attention (BACKWARD_FACTOR x)
        per_point += (Work(1, attention=rows * width * (1 + BACKWARD_FACTOR)) if alone
                      else Work(1, rows * width, rows * width, backward=rows * width))
    return w + (one_pass(n, width, n * width) if alone else Work()) + per_point * max(1, steps)
