"""Edges: MIB's residual graph of a model, and exact edge patching (each edge's X_c value reaching one receiver).

**The graph** (MIB, Mueller et al. 2025; Hanna et al. 2024, EAP-IG's ``Graph.from_model``): the nodes are
``input`` (the token embeddings), every head ``a{l}.h{h}``, every MLP ``m{l}`` and ``logits``.  An *edge*
u -> v joins a sender u to what a receiver v reads: a head's query, key or value input (``<q>``, ``<k>``,
``<v>``), an MLP's input, the logits.  A head reads every earlier node; an MLP reads those and, in a
sequential block, its own layer's heads (a parallel block's MLP reads the block input:
``backend.parallel_attn_mlp``, read from the lab's block model, :mod:`engine.backends.layouts`); the logits
read every node (:func:`engine.techniques.faithfulness.mib_edges` lists them, MIB's order and names).

**A sender's value** is what it adds to the residual stream, at every position: the embedding stream for
``input`` (``resid_pre(0)``), a head's contribution (the attention's output with only that head's output from
the run in question, the block's post-attention norm and residual scale applied:
``hooks.attn_out``), an MLP's output (``hooks.mlp_out``).  Its *difference*
``d_u = value_u(X_c) - value_u(X_r)`` is what patching the edge sends.

**Exact edge patching** (the ground truth MIB's edge attributions estimate): run X_r with receiver v's input
replaced by its X_r value plus ``d_u`` -- the sender's X_c value reaching only that receiver; every other
path, the receiver's other inputs included, stays clean -- and everything after v recomputed.  Read the
answer token's logit at END: ``logit_p - logit_o`` is the edge's effect.

* receiver ``logits``: the final stream plus ``d_u`` (one pass, every such edge a row);
* receiver ``m{l}``: the MLP branch's input plus ``d_u`` (``hooks.mlp_in``: a write there changes the MLP
  branch only), one pass; a parallel block's MLP input is the block input, there the MLP's new output is
  computed with the block model's ``mlp_branch`` and written into ``hooks.mlp_out``;
* receiver ``a{l}.h{h}<x>`` (x = q, k or v): two passes.  (A) X_r with layer l's input plus ``d_u`` and the
  layer's other two of q / k / v frozen at X_r -- only input x sees the patched stream -- from which head h's
  output z is read; (B) X_r with head h's output at layer l replaced by it.  Grouped-query attention: the
  key and value heads are shared, but only head h's output is taken, so only that head sees the edge.

Each pass carries many edges as rows (:func:`engine.machinery.patch_rows.patch_rows`).  Cost: one row per
edge and pair for the logits and MLP receivers, two for the heads' -- ~2 E forward passes of the prompts for
E edges (6,637 on the bundled model); :func:`edge_patching_work` counts them.  Exact against a plain
transformers loop (``tests/integration/test_edges.py``: one hooked model per edge, written without the lab's
backends) on the bundled model and a sample of edges on three architectures of the matrix.  There is no
shortcut yet: every edge runs whole prompts.

**At token positions** (the exact rankings of :mod:`engine.techniques.circuit_units`' position resolutions):

* an edge at a token role (``edge_patching(by_role=True)``): as above with ``d_u`` sent at that role's positions
  only (zero elsewhere) -- R rows where there was one (R = 5 roles of
  :data:`engine.techniques.attention.CIRCUIT_ROLES`, less the roles that cannot reach END: :func:`live_roles`);
* a node at a token role (:func:`node_patching`): X_r with the node's X_c output at that role's positions --
  ``d_u`` there added where it enters the residual stream (``hooks.attn_out``: the head's own difference;
  ``hooks.mlp_out``), everything after recomputed.  This is the node-position circuit's unit ablated alone: every
  edge out of the node at that role reads the node's X_c value, and every receiver of the node is such an edge.
  One row per node, live role and pair.

A role whose positions in every pair precede the first token where X_r and X_c differ, or follow END, sends a zero
difference (the model is causal): its rows are not run and keep X_r's logit, an effect of exactly 0
(:func:`live_roles`).  Only a whole role across the set is skipped: in "1 + 4 =" against "1 > 4 =" operand A and the
first token (2 of the 5 roles); in a set that also holds "The addition of 6 and 6 is" (operand A after the operator)
none.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import BlockCalls, ModelBackend
from engine.machinery.batching import batches
from engine.machinery.patch_rows import Edit, HookFn, PatchRun, patch_rows, prepare
from engine.machinery.shortcut import ShortcutMismatch, check_same, fallback_note
from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import PromptPair
from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
from engine.techniques.faithfulness import component_names, mib_edges

METHOD = "edge_patching"
QKV: tuple[str, ...] = ("q", "k", "v")


@dataclass(frozen=True)
class Node:
    """One node of the graph: ``kind`` input | head | mlp | logits, its layer (input: -1, logits: L) and head."""

    kind: str
    layer: int = -1
    head: int = -1

    @property
    def name(self) -> str:
        """MIB's name: ``input``, ``a3.h1``, ``m3``, ``logits``."""
        return {"input": "input", "logits": "logits", "mlp": f"m{self.layer}"}.get(self.kind,
                                                                                 f"a{self.layer}.h{self.head}")


@lru_cache(maxsize=4096)
def node_of(name: str, n_layers: int) -> Node:
    """MIB's node name -> Node (ValueError for anything else; a pure function, kept for the names seen last)."""
    if name in ("input", "logits"):
        return Node(name, -1 if name == "input" else n_layers)
    try:
        if name.startswith("m"):
            return Node("mlp", int(name[1:]))
        if name.startswith("a"):
            layer, head = name[1:].split(".h")
            return Node("head", int(layer), int(head))
    except ValueError:
        pass
    raise ValueError(f"node {name!r}: write input, logits, m<layer> or a<layer>.h<head>")


@dataclass(frozen=True)
class Edge:
    """Sender -> receiver (through ``qkv`` when the receiver is a head)."""

    sender: Node
    receiver: Node
    qkv: str | None = None

    @property
    def name(self) -> str:
        """MIB's name: ``a0.h1->a3.h2<q>``, ``m0->logits``."""
        return f"{self.sender.name}->{self.receiver.name}" + (f"<{self.qkv}>" if self.qkv else "")


def receiver_key(e: Edge) -> tuple:
    """What an edge writes into: ``("head", layer, head, x)``, ``("mlp", layer)`` or ``("logits",)``."""
    if e.receiver.kind == "head":
        return ("head", e.receiver.layer, e.receiver.head, e.qkv)
    if e.receiver.kind == "mlp":
        return ("mlp", e.receiver.layer)
    return ("logits",)


class EdgeGraph(tuple):
    """A graph's edges (a tuple of :class:`Edge`, in order) and, read once, its edges grouped by receiver."""

    @cached_property
    def by_receiver(self) -> list[tuple[tuple, np.ndarray, np.ndarray]]:
        """Per receiver (:func:`receiver_key`, first-seen order): the positions of its edges in the graph, ordered
        by sender name, and those sender names (an object array of str)."""
        groups: dict[tuple, list[int]] = {}
        for i, e in enumerate(self):
            groups.setdefault(receiver_key(e), []).append(i)
        out = []
        for key, at in groups.items():
            at = sorted(at, key=lambda i: self[i].sender.name)
            out.append((key, np.array(at, dtype=np.int64), np.array([self[i].sender.name for i in at], dtype=object)))
        return out

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Each edge's MIB name, in order."""
        return tuple(e.name for e in self)

    @cached_property
    def sender_codes(self) -> tuple[np.ndarray, list[str]]:
        """(each edge's sender as a code [E], the senders' names by code)."""
        names: dict[str, int] = {}
        codes = np.array([names.setdefault(e.sender.name, len(names)) for e in self], dtype=np.int64)
        return codes, list(names)


def as_graph(edges: Sequence[Edge]) -> EdgeGraph:
    """``edges`` as an :class:`EdgeGraph` (itself when it is one)."""
    return edges if isinstance(edges, EdgeGraph) else EdgeGraph(edges)


@lru_cache(maxsize=8)
def graph_of(n_layers: int, n_heads: int, parallel_attn_mlp: bool) -> EdgeGraph:
    """The residual graph of a model of this shape (a pure function of it, built once: 123,211 edges on SmolLM2)."""
    return EdgeGraph(Edge(node_of(p, n_layers), node_of(c, n_layers), q)
                     for p, c, q in mib_edges(n_layers, n_heads, parallel_attn_mlp))


def edge_graph(backend: ModelBackend) -> EdgeGraph:
    """Every edge of the model's residual graph, in MIB's order (module docstring)."""
    return graph_of(backend.facts.n_layers, backend.facts.n_heads, bool(backend.parallel_attn_mlp))


def parse_edge(text: str, n_layers: int) -> Edge:
    """``"a0.h1->a3.h2<q>"`` -> Edge (ValueError saying what to type)."""
    left, arrow, right = text.strip().partition("->")
    qkv = None
    if right.endswith(">") and "<" in right:
        right, _, qkv = right[:-1].partition("<")
    if not arrow or (qkv is not None and qkv not in QKV):
        raise ValueError(f"edge {text!r}: write SENDER->RECEIVER[<q|k|v>], e.g. a0.h1->a3.h2<q>")
    return Edge(node_of(left, n_layers), node_of(right, n_layers), qkv)


# ---------------------------------------------------------------------------------------------
# the senders' differences d_u = value_u(X_c) - value_u(X_r), at every position
# ---------------------------------------------------------------------------------------------

def prepared(backend: ModelBackend, pairs: Sequence[PromptPair]) -> PatchRun:
    """X_r and X_c run once, caching what the senders' values and the receivers' inputs are read from."""
    L = backend.facts.n_layers
    names = [hooks.resid_pre(0), hooks.resid_post(L - 1)]
    names += [n for j in range(L) for n in (hooks.attn_z(j), hooks.attn_out(j), hooks.mlp_out(j), hooks.mlp_in(j),
                                              hooks.attn_q(j), hooks.attn_k(j), hooks.attn_v(j))]
    if backend.parallel_attn_mlp or backend.runs_one_block:  # a parallel block's MLP reads the block input
        names += [hooks.resid_pre(j) for j in range(L)]     # (_mlp_edits); a block run alone starts from it
    names = list(dict.fromkeys(names))
    return prepare(backend, pairs, names, [hooks.resid_pre(0), *[n for j in range(L)
                                                                for n in (hooks.attn_z(j), hooks.mlp_out(j))]])


@torch.no_grad()
def sender_differences(backend: ModelBackend, run: PatchRun, senders: Sequence[Node], calls: BlockCalls | None = None
                       ) -> tuple[dict[str, torch.Tensor], str | None]:
    """({sender name: d_u [P, pos, d_model]}, note) (module docstring).  A head's: one pass per layer, the layer's
    heads as rows, each row's head output from X_c at every position, the attention's output read.  With ``calls``
    (X_r's, ``ModelBackend.block_calls``; ``run`` from :func:`prepared`, which keeps each layer's input where the
    backend runs a block alone) that layer's block runs alone on X_r's stream entering it, one row block more left
    unpatched -- checked first: its attention output must be X_r's; else whole passes, and ``note`` says so."""
    out: dict[str, torch.Tensor] = {}
    P = run.n
    by_layer: dict[int, list[int]] = {}
    note = None
    for s in senders:
        if s.kind == "input":
            out[s.name] = (run.cf_cache[hooks.resid_pre(0)] - run.ref_cache[hooks.resid_pre(0)]).float()
        elif s.kind == "mlp":
            name = hooks.mlp_out(s.layer)
            out[s.name] = (run.cf_cache[name] - run.ref_cache[name]).float()
        elif s.kind == "head":
            by_layer.setdefault(s.layer, []).append(s.head)
    for layer, heads in by_layer.items():
        z, attn_out = hooks.attn_z(layer), hooks.attn_out(layer)
        S = len(heads)

        def put(act: torch.Tensor, heads=heads, z=z) -> torch.Tensor:  # [S * P (+ P), pos, H, d_head]
            for i, h in enumerate(heads):
                act[i * P:(i + 1) * P, :, h] = run.cf_cache[z][:, :, h].to(act.device, act.dtype)
            return act
        a = None  # [S, P, pos, d]
        if calls is not None:
            try:
                with backend.hooks([(z, put)]):
                    got = backend.block_activations(calls, layer, run.stacked(run.ref_cache[hooks.resid_pre(layer)],
                                                                              S + 1), [attn_out], stop=True)
                a = got[attn_out].float().reshape(S + 1, P, *run.ref_cache[attn_out].shape[1:])
                check_same(f"block {layer} run alone misses the model's attention output", a[S],
                           run.ref_cache[attn_out], backend.facts.dtype)
                a = a[:S]
            except (ShortcutMismatch, RuntimeError, TypeError) as e:
                calls, a = None, None
                note = fallback_note("The senders' differences, a layer's block alone", str(e))
        if a is None:
            with backend.hooks([(z, put)]):
                acts = backend.activations_upto(run.stacked(run.ref, S), run.stacked(run.mask, S), [attn_out])
            a = acts[attn_out].float().reshape(S, P, *run.ref_cache[attn_out].shape[1:])
        for i, h in enumerate(heads):
            out[Node("head", layer, h).name] = (a[i] - run.ref_cache[attn_out].float()).cpu()
    return {k: v.cpu() for k, v in out.items()}, note


# ---------------------------------------------------------------------------------------------
# exact edge patching
# ---------------------------------------------------------------------------------------------

@dataclass
class EdgeRaw:
    """Per-pair answer logits with each edge patched.  E edges, P pairs (R token roles)."""

    pairs: list[PromptPair]
    edges: list[Edge]
    logit_o: torch.Tensor   # [P]     unpatched answer logit on X_r
    patched: torch.Tensor   # [E, P]  answer logit with the edge patched; [E, R, P] at each token role (by_role)

    def effects(self) -> torch.Tensor:
        """Mean logit difference per edge (per edge and role) over the pairs.  # [E] or [E, R]"""
        return (self.patched - self.logit_o).double().mean(-1)


def role_masks(backend: ModelBackend, pairs: Sequence[PromptPair], width: int) -> torch.Tensor:
    """1 at each token role's positions (:func:`engine.techniques.attention.circuit_roles`), 0 elsewhere.
    # [R, P, width, 1]"""
    at = circuit_roles(backend, pairs, width)  # [P, width]
    return torch.stack([(at == r).float()[..., None] for r in range(len(CIRCUIT_ROLES))])


def live_roles(backend: ModelBackend, pairs: Sequence[PromptPair]) -> list[bool]:
    """Whether each token role can carry a unit's difference to END.  The model is causal: at a position before the
    first token where X_r and X_c differ every value is the same on both prompts, and a position after END does not
    reach it; a role whose positions in every pair are such sends a zero difference, its rows' effect is exactly 0,
    and they are not run.  [R]"""
    at = circuit_roles(backend, pairs, max(len(p.ref_ids) for p in pairs))  # [P, width]
    live = [False] * len(CIRCUIT_ROLES)
    for i, p in enumerate(pairs):
        first = next((t for t, (a, b) in enumerate(zip(p.ref_ids, p.cf_ids)) if a != b), len(p.ref_ids))
        for r in at[i, first:len(p.ref_ids)].tolist():
            live[r] = True
    return live


def _add_rows(deltas: Sequence[torch.Tensor], P: int) -> HookFn:
    """Hook: row block s gets ``deltas[s]`` [P, pos, d] added (an empty block: None)."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        act = act.clone()
        for s, d in enumerate(deltas):
            if d is not None:
                act[s * P:(s + 1) * P] += d.to(act.device, act.dtype)
        return act
    return fn


def _frozen_rows(value: torch.Tensor, keep: Sequence[bool], P: int) -> HookFn:
    """Hook: row blocks s with ``keep[s]`` False take ``value`` [P, ...] (X_r's), the others keep what they compute."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        act = act.clone()
        for s, k in enumerate(keep):
            if not k:
                act[s * P:(s + 1) * P] = value.to(act.device, act.dtype)
        return act
    return fn


@torch.no_grad()
def edge_patching(backend: ModelBackend, pairs: Sequence[PromptPair], edges: Sequence[Edge] | None = None, *,
                  by_role: bool = False, rows_per_pass: int = 256, progress: ProgressFn | None = None) -> EdgeRaw:
    """The answer logit with each edge patched (exact; module docstring).  ``edges``: default every edge;
    ``by_role``: each edge at each token role's positions only (patched [E, R, P])."""
    edges = list(edges) if edges is not None else edge_graph(backend)
    run = prepared(backend, pairs)
    diffs, _ = sender_differences(backend, run, list({e.sender: None for e in edges}))
    P = run.n
    masks = role_masks(backend, pairs, run.ref.shape[1]) if by_role else None  # [R, P, T, 1]
    R = 1 if masks is None else len(masks)
    live = live_roles(backend, pairs) if by_role else [True]
    units = [(e, r) for e in edges for r in range(R)]  # edge-major, then role
    groups: dict[tuple, list[int]] = {}
    for i, (e, r) in enumerate(units):
        if live[r]:  # a dead role's rows keep X_r's logit: their effect is exactly 0
            groups.setdefault((e.receiver.kind, e.receiver.layer), []).append(i)

    def edits_of(key: tuple, idx: list[int]) -> list[Edit]:
        kind, layer = key
        group = [units[i][0] for i in idx]
        d = [diffs[e.sender.name] if masks is None else diffs[e.sender.name] * masks[r]
             for e, r in (units[i] for i in idx)]
        if kind == "logits":
            return [(hooks.resid_post(backend.facts.n_layers - 1), _add_rows(d, P))]
        if kind == "mlp":
            return _mlp_edits(backend, run, layer, d)
        return _head_edits(backend, run, group, d)

    out = run.logit_o.repeat(len(units), 1)  # [E * R, P]
    for key, got in _patched_groups(backend, run, groups, edits_of, rows_per_pass, progress).items():
        out[groups[key]] = got
    return EdgeRaw(list(pairs), edges, run.logit_o, out if masks is None else out.reshape(len(edges), R, P))


def _patched_groups(backend: ModelBackend, run: PatchRun, groups: dict, edits_of, rows_per_pass: int,
                    progress: ProgressFn | None) -> dict:
    """Per group of units that write into one place (a receiver, a node's output): the answer logit at END with each
    unit patched, at most ``rows_per_pass`` rows per pass, ``edits_of(key, units)`` the hooks of one batch of them.
    {key: [len(units), P]}"""
    P = run.n
    per = max(1, rows_per_pass // max(1, P))
    steps = Stages(progress, [len(u) for u in groups.values()])
    out = {}
    for gi, (key, units) in enumerate(groups.items()):
        bar = steps.stage(gi)
        chunks, parts = batches(len(units), per), []
        for bi, b in enumerate(chunks):
            batch = [units[i] for i in b]
            edits = edits_of(key, batch)
            parts.append(patch_rows(backend, run, list(range(len(batch))), lambda _g, e=edits: e,
                                    rows_per_pass=len(batch) * P))  # [S, P]
            if bar is not None:
                bar(bi + 1, len(chunks))
        out[key] = torch.cat(parts)
    return out


@dataclass
class NodeRaw:
    """Per-pair answer logits with each head's and MLP's X_c output at one token role.  N nodes, R roles, P pairs."""

    pairs: list[PromptPair]
    nodes: list[str]        # [N] :func:`engine.techniques.faithfulness.component_names` order
    logit_o: torch.Tensor   # [P]
    patched: torch.Tensor   # [N, R, P]

    def effects(self) -> torch.Tensor:
        """Mean logit difference per node and role over the pairs.  # [N, R]"""
        return (self.patched - self.logit_o).double().mean(-1)


def node_senders(backend: ModelBackend) -> list[Node]:
    """Every head and MLP as a graph node, in :func:`engine.techniques.faithfulness.component_names` order."""
    f = backend.facts
    return [node_of(n, f.n_layers) for n in component_names(f.n_layers, f.n_heads)]


@torch.no_grad()
def node_patching(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 256,
                  progress: ProgressFn | None = None) -> NodeRaw:
    """The answer logit with each node's X_c output at each token role's positions (exact; module docstring)."""
    nodes = node_senders(backend)
    run = prepared(backend, pairs)
    diffs, _ = sender_differences(backend, run, nodes)
    P = run.n
    masks = role_masks(backend, pairs, run.ref.shape[1])  # [R, P, T, 1]
    R, live = len(masks), live_roles(backend, pairs)
    groups: dict[object, list[tuple[int, int]]] = {}  # where a node's output enters the stream -> (node, role)
    for i, n in enumerate(nodes):
        site = hooks.attn_out(n.layer) if n.kind == "head" else hooks.mlp_out(n.layer)
        groups.setdefault(site, []).extend((i, r) for r in range(R) if live[r])

    def edits_of(site, batch: list[tuple[int, int]]) -> list[Edit]:
        return [(site, _add_rows([diffs[nodes[i].name] * masks[r] for i, r in batch], P))]

    out = run.logit_o.repeat(len(nodes), R, 1)  # [N, R, P]: a dead role's rows keep X_r's logit (effect 0)
    for site, got in _patched_groups(backend, run, groups, edits_of, rows_per_pass, progress).items():
        for s, (i, r) in enumerate(groups[site]):
            out[i, r] = got[s]
    return NodeRaw(list(pairs), [n.name for n in nodes], run.logit_o, out)


def _mlp_edits(backend: ModelBackend, run: PatchRun, layer: int, d: Sequence[torch.Tensor]) -> list[Edit]:
    """The MLP's input plus each row's difference (a parallel block: its output, through the block model)."""
    P = run.n
    if not backend.parallel_attn_mlp:
        return [(hooks.mlp_in(layer), _add_rows(d, P))]
    x = run.ref_cache[hooks.resid_pre(layer)]  # [P, pos, d_model]: the block input the MLP reads

    def branch(v: torch.Tensor) -> torch.Tensor:
        flat = v.reshape(-1, v.shape[-1]).to(backend.device, x.dtype)
        return backend.mlp_branch(layer, flat).float().cpu().reshape(v.shape)
    base = run.ref_cache[hooks.mlp_out(layer)].float() - branch(x)  # the model's own output, rounding kept
    stacked = torch.cat([branch(x.float() + dd) + base for dd in d])

    def fn(act: torch.Tensor) -> torch.Tensor:
        return stacked.to(act.device, act.dtype)
    return [(hooks.mlp_out(layer), fn)]


def _head_edits(backend: ModelBackend, run: PatchRun, group: Sequence[Edge], d: Sequence[torch.Tensor]
                ) -> list[Edit]:
    """Pass (A): each receiver head's output with only its input x seeing the patched stream; the edit of
    pass (B) that writes it, every other head computing as it does."""
    P, S = run.n, len(group)
    layer = group[0].receiver.layer
    qkv = {"q": hooks.attn_q(layer), "k": hooks.attn_k(layer), "v": hooks.attn_v(layer)}
    edits_a = [(hooks.resid_pre(layer), _add_rows(d, P))]
    edits_a += [(name, _frozen_rows(run.ref_cache[name], [e.qkv == x for e in group], P)) for x, name in qkv.items()]
    z = hooks.attn_z(layer)
    with backend.hooks(edits_a):
        got = backend.activations_upto(run.stacked(run.ref, S), run.stacked(run.mask, S), [z])[z]  # [S*P, pos, H, dh]
    new = torch.stack([got[s * P:(s + 1) * P, :, e.receiver.head] for s, e in enumerate(group)])  # [S, P, pos, dh]

    def put(act: torch.Tensor) -> torch.Tensor:
        act = act.clone()
        for s, e in enumerate(group):
            act[s * P:(s + 1) * P, :, e.receiver.head] = new[s].to(act.device, act.dtype)
        return act
    return [(z, put)]


def head_senders_per_layer(edges: Sequence[Edge]) -> dict[int, int]:
    """{layer: its distinct head senders among ``edges``} (the rows of :func:`sender_differences`' passes)."""
    heads = {(e.sender.layer, e.sender.head) for e in edges if e.sender.kind == "head"}
    return {layer: sum(1 for j, _ in heads if j == layer) for layer in sorted({j for j, _ in heads})}


def sender_differences_work(backend: ModelBackend, edges: Sequence[Edge], n: int, width: int, *, alone: bool = False):
    """The work of :func:`sender_differences` for ``edges``' senders and ``n`` prompts padded to ``width``: a pass
    per layer with head senders, its heads as rows, stopped after that layer where the backend can; ``alone``: that
    layer's block alone, up to its attention's output, on one row block more (the check's), X_r's block calls not
    counted here."""
    from engine.cost import NO_WORK, block_pass, pass_upto
    w = NO_WORK
    for layer, count in head_senders_per_layer(edges).items():
        w += block_pass((count + 1) * n, width, attention_only=True) if alone else \
            pass_upto(backend, count * n, width, layer)
    return w


def edge_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], edges: Sequence[Edge] | None = None, *,
                       by_role: bool = False, rows_per_pass: int = 256):
    """The forward work of :func:`edge_patching` (``engine.cost.Work``): X_r and X_c, the heads' differences
    (a pass per layer, the heads as rows) and a row per edge (``by_role``: per edge and role) and pair, two for a head
    receiver (the passes that read one layer stop after it where the backend can, ``engine.cost.pass_upto``)."""
    from engine.cost import pass_upto
    from engine.machinery.patch_rows import patch_rows_work, prepare_work
    edges = list(edges) if edges is not None else edge_graph(backend)
    n, width = len(pairs), max(len(p.ref_ids) for p in pairs)
    w = prepare_work(pairs) + sender_differences_work(backend, edges, n, width)
    R = sum(live_roles(backend, pairs)) if by_role else 1
    groups: dict[tuple, int] = {}
    for e in edges:
        groups[(e.receiver.kind, e.receiver.layer)] = groups.get((e.receiver.kind, e.receiver.layer), 0) + R
    per = max(1, rows_per_pass // max(1, n))
    for (kind, layer), count in groups.items():
        w += patch_rows_work(count, n, width, rows_per_pass=per * n)
        if kind == "head":
            for g in range(0, count, per):
                w += pass_upto(backend, min(per, count - g) * n, width, layer)
    return w


def node_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, rows_per_pass: int = 256):
    """The forward work of :func:`node_patching` (``engine.cost.Work``): X_r and X_c, the heads' differences and a
    row per node, role and pair, the nodes grouped by where their output enters the stream."""
    from engine.machinery.patch_rows import patch_rows_work, prepare_work
    nodes = node_senders(backend)
    n, width = len(pairs), max(len(p.ref_ids) for p in pairs)
    w = prepare_work(pairs) + sender_differences_work(backend, [Edge(s, Node("logits")) for s in nodes], n, width)
    sites: dict[tuple, int] = {}
    R = sum(live_roles(backend, pairs))
    for s in nodes:
        sites[(s.kind, s.layer)] = sites.get((s.kind, s.layer), 0) + R
    per = max(1, rows_per_pass // max(1, n))
    for count in sites.values():
        w += patch_rows_work(count, n, width, rows_per_pass=per * n)
    return w
