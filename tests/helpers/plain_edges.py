"""Plain-transformers references of edge patching and its gradient estimate (EAP), hooks on the model's own modules.

Written without the lab's backends or its block model, after :mod:`tests.helpers.plain`: an edge u -> v is
named as in MIB (``a0.h1->a3.h2<q>``, ``m0->logits``, ``input->m2``); a sender's value is what it adds to the
residual stream (the embedding stream, a head's attention contribution with only that head from the run in
question, an MLP's contribution); the edge sends ``value_u(X_c) - value_u(X_r)`` to v's input only.
"""

from __future__ import annotations

import torch

from engine.machinery.batching import pad
from tests.helpers.plain import Plain, qkv_split


def _node(name: str) -> tuple[str, int, int]:
    if name in ("input", "logits"):
        return name, -1, -1
    if name.startswith("m"):
        return "mlp", int(name[1:]), -1
    layer, head = name[1:].split(".h")
    return "head", int(layer), int(head)


def _edge(name: str) -> tuple[str, str, str | None]:
    left, _, right = name.partition("->")
    qkv = None
    if right.endswith(">"):
        right, _, qkv = right[:-1].partition("<")
    return left, right, qkv


class PlainEdges:
    """X_r and X_c of some pairs on a plain model: each sender's difference, each edge patched by hand."""

    def __init__(self, plain: Plain, pairs) -> None:
        self.p = plain
        self.ref = [p.ref_ids for p in pairs]
        self.cf = [p.cf_ids for p in pairs]
        self.answer = torch.tensor([p.answer_id for p in pairs])
        self.r, self.c = plain.capture(self.ref), plain.capture(self.cf)
        self.rows = torch.arange(len(pairs))
        lg, self.end = plain.run(self.ref)
        self.logit_o = lg[self.rows, self.end, self.answer]
        self._diff: dict[str, torch.Tensor] = {}

    def attn_module(self, layer: int) -> torch.nn.Module:
        b = self.p.branches
        return self.p.layers[layer].get_submodule(b.attn_out) if b.attn_out else self.p.attn(layer)

    def difference(self, sender: str) -> torch.Tensor:
        """value_u(X_c) - value_u(X_r) at every position.  # [P, pos, d_model]"""
        if sender not in self._diff:
            kind, layer, head = _node(sender)
            if kind == "input":
                d = self.c["resid_pre"][0] - self.r["resid_pre"][0]
            elif kind == "mlp":
                d = self.c["mlp"][layer] - self.r["mlp"][layer]
            else:
                got = {}

                def swap(x):
                    x = x.reshape(*x.shape[:2], self.p.H, -1).clone()
                    x[:, :, head] = self.c["z"][layer][:, :, head]
                    return x.reshape(*x.shape[:2], -1)

                def keep(name):
                    def fn(x):
                        got[name] = x.clone()
                        return x
                    return fn
                self.p.run(self.ref, post={self.attn_module(layer): keep("clean")})
                self.p.run(self.ref, pre={self.p.o_proj(layer): swap}, post={self.attn_module(layer): keep("swap")})
                d = got["swap"] - got["clean"]
            self._diff[sender] = d.float()
        return self._diff[sender]

    def clean_attention(self, layer: int) -> torch.Tensor:
        """The attention branch's output of ``layer`` on X_r.  # [P, pos, d_model]"""
        key = f"attention {layer}"
        if key not in self._diff:
            got = {}
            self.p.run(self.ref, post={self.attn_module(layer): lambda x: got.setdefault("a", x.clone())})
            self._diff[key] = got["a"]
        return self._diff[key]

    def hooks_of(self, edge: str, scale: torch.Tensor | float = 1.0) -> tuple[dict, dict]:
        """(pre, post) hooks of the X_r run with ``edge`` patched (the difference times ``scale``); a head
        receiver's output computed first, in a run of its own."""
        sender, receiver, qkv = _edge(edge)
        d = self.difference(sender) * scale
        kind, layer, head = _node(receiver)
        P = self.p
        if kind == "logits":
            return {}, {P.layers[P.L - 1]: lambda x: x + d.to(x.dtype)}
        if kind == "mlp" and P.branches.mlp_in is None:  # a parallel block: the MLP reads the layer's input
            attn = self.attn_module(layer)  # the layer reads x + d, its attention answers as on x, x + d - d leaves
            clean = self.clean_attention(layer)
            return ({P.layers[layer]: lambda x: x + d.to(x.dtype)},
                    {attn: lambda x: clean.to(x.dtype).clone(), P.layers[layer]: lambda x: x - d.to(x.dtype)})
        if kind == "mlp":
            return {P.layers[layer].get_submodule(P.branches.mlp_in): lambda x: x + d.to(x.dtype)}, {}
        z = self.receiver_output(layer, head, qkv, d)

        def put(x):
            x = x.reshape(*x.shape[:2], P.H, -1).clone()
            x[:, :, head] = z.to(x.dtype)
            return x.reshape(*x.shape[:2], -1)
        return {P.o_proj(layer): put}, {}

    def receiver_output(self, layer: int, head: int, qkv: str, d: torch.Tensor) -> torch.Tensor:
        """Head (layer, head)'s o_proj input slice when only its input ``qkv`` reads the stream plus ``d``."""
        P = self.p
        proj, split = qkv_split(P, layer)
        clean: dict[str, torch.Tensor] = {}
        P.run(self.ref, post={m: (lambda x, k=k: clean.__setitem__(k, x.clone()) or x) for k, m in proj.items()})
        if split is None:
            post = {proj[k]: (lambda x, k=k: clean[k].to(x.dtype)) for k in "qkv" if k != qkv}
        else:
            which = "qkv".index(qkv)

            def mix(x):
                new = clean["qkv"].clone().to(x.dtype)
                new[..., split[which]] = x[..., split[which]]
                return new
            post = {proj["qkv"]: mix}
        got = {}

        def keep(x):
            got["z"] = x.reshape(*x.shape[:2], P.H, -1)[:, :, head].clone()
            return x
        self.forward(pre={P.layers[layer]: lambda x: x + d.to(x.dtype), P.o_proj(layer): keep}, post=post)
        return got["z"]

    def forward(self, pre: dict, post: dict) -> torch.Tensor:
        """The answer logit at END of X_r under the hooks, with gradients where asked.  # [P]"""
        ids, mask, end = pad(self.ref, self.p.pad_id)
        with self.p.hooked(pre, post, tuple(ids.shape)):
            lg = self.p.model(input_ids=ids, attention_mask=mask).logits.float()
        return lg[self.rows, end, self.answer]

    def node_patched(self, node: str, where: torch.Tensor) -> torch.Tensor:
        """The answer logit at END of X_r with ``node``'s X_c output at the positions ``where`` [P, pos, 1] (0 / 1)
        marks: a head's slice of the o_proj input swapped there, an MLP's output replaced there.  # [P]"""
        kind, layer, head = _node(node)
        P = self.p
        if kind == "mlp":
            c = self.c["mlp"][layer]
            hooks = ({}, {P.mlp_out(layer): lambda x: x * (1 - where) + c.to(x.dtype) * where})
        else:
            c = self.c["z"][layer][:, :, head]

            def swap(x):
                x = x.reshape(*x.shape[:2], P.H, -1).clone()
                x[:, :, head] = x[:, :, head] * (1 - where) + c.to(x.dtype) * where
                return x.reshape(*x.shape[:2], -1)
            hooks = ({P.o_proj(layer): swap}, {})
        with torch.no_grad():
            return self.forward(*hooks)

    def patched(self, edge: str) -> torch.Tensor:
        """The answer logit at END with ``edge`` patched.  # [P]"""
        with torch.no_grad():
            return self.forward(*self.hooks_of(edge))

    def derivative(self, edge: str, where: torch.Tensor | None = None) -> torch.Tensor:
        """d answer logit / d eps with the edge sending eps times its difference, at eps = 0, by autograd through
        the hooked runs (the reference of EAP); ``where`` [P, pos] 0/1: only at those positions.  # [P]"""
        eps = torch.zeros(len(self.ref), 1, 1, requires_grad=True)
        with torch.enable_grad():
            scale = eps if where is None else eps * where.float()[..., None]
            (g,) = torch.autograd.grad(self.forward(*self.hooks_of(edge, scale)).sum(), eps)
        return g.reshape(-1)


def sample(edges: list, heads: int, others: int) -> list:
    """Some edges of every kind: into heads (q, k and v), into MLPs, into the logits, from the input."""
    into_heads = [e for e in edges if e.receiver.kind == "head"]
    rest = [e for e in edges if e.receiver.kind != "head"]
    step_h, step_o = max(1, len(into_heads) // heads), max(1, len(rest) // others)
    return into_heads[::step_h][:heads] + rest[::step_o][:others]


def cover(edges: list) -> list:
    """Few edges among which every sender kind (input, head, MLP) and every receiver (a head's q, k and v, an
    MLP, the logits) appears: the graph read from its end, an edge kept when it adds a kind."""
    seen: set[tuple] = set()
    out = []
    for e in reversed(edges):
        new = {("sender", e.sender.kind), ("receiver", e.receiver.kind, e.qkv)} - seen
        if new:
            out.append(e)
            seen |= new
    return out


@torch.no_grad()
def mean_values(plain: Plain, pairs, over) -> dict[str, list[torch.Tensor]]:
    """X_c's capture of ``pairs`` with each sender's value (the embedding stream, every head's o_proj input, every
    MLP's contribution) at pair i's position p replaced by its mean over the prompts of ``over`` with pair i's
    template, each read at the same distance from its own END: prompt by prompt, position by position."""
    c = plain.capture([p.cf_ids for p in pairs])
    alone = [plain.capture([q.cf_ids]) for q in over]  # one prompt a run: no padding
    for i, p in enumerate(pairs):
        end = len(p.cf_ids) - 1
        for pos in range(end + 1):
            back = end - pos
            same = [(a, len(q.cf_ids) - 1 - back) for a, q in zip(alone, over)
                    if q.template == p.template and len(q.cf_ids) - 1 >= back]
            for key, layers in (("resid_pre", [0]), ("z", range(plain.L)), ("mlp", range(plain.L))):
                for j in layers:
                    c[key][j][i, pos] = torch.stack([a[key][j][0, at] for a, at in same]).float().mean(0)
    return c


@torch.no_grad()
def edge_circuit(plain: Plain, pairs, edges: list[str], kept: set[str], *,
                 mean_over=None, roles: tuple[str, ...] = (), role_at=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(answer logit [P], answer logit minus the mean logit [P]) at END of X_r with every edge of ``edges`` (MIB
    names) outside ``kept`` ablated, by hand, layer by layer: each receiver reads its input in this run plus, for
    every ablated edge into it, the sender's X_c value minus its value in this run.  A head's z: one run per input
    (q, k, v) with the layer's input plus that input's correction, the projections' outputs kept, then one run
    with the three put together; a head's value in this run: the attention's output with that head's o_proj input
    from X_c minus the attention's output, the layer's other heads as this run computed them (MIB's
    ``evaluate_graph``, written for the plain model; a parallel block's MLP reads the layer's input plus its
    correction with the attention's output held at this run's).  ``mean_over``: mean ablation -- the senders'
    X_c values replaced by their means over these pairs' X_c (:func:`mean_values`).  ``roles`` and ``role_at``
    ([P, pos] each position's index in ``roles``, right-padded): ``kept`` names ``edge@role`` and an edge is
    ablated exactly at the positions of its roles outside ``kept``."""
    P = plain
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    r = P.capture(ref)
    c = P.capture([p.cf_ids for p in pairs]) if mean_over is None else mean_values(P, pairs, mean_over)
    # receiver input ("a3.h1<q>", "m2", "logits") -> (sender, where [P, pos, 1] or 1) of its ablated edges
    ablated: dict[str, list[tuple[str, torch.Tensor | float]]] = {}
    for e in edges:
        sender, receiver, qkv = _edge(e)
        into = ablated.setdefault(receiver + (f"<{qkv}>" if qkv else ""), [])
        if not roles and e not in kept:
            into.append((sender, 1.0))
        for i, role in enumerate(roles):
            if f"{e}@{role}" not in kept:
                into.append((sender, (role_at == i).float()[..., None]))
    diff = {"input": (c["resid_pre"][0] - r["resid_pre"][0]).float()}  # X_c value - this run's value
    z: list[torch.Tensor] = []    # this run's o_proj inputs per layer [P, pos, H, dh]
    mlp: list[torch.Tensor] = []  # this run's MLP contributions per layer [P, pos, d]

    def delta(receiver: str) -> torch.Tensor:
        out = torch.zeros_like(diff["input"])
        for s, where in ablated.get(receiver, []):
            out = out + diff[s] * where
        return out

    def put_z(value):
        return lambda x: value.reshape(*x.shape[:2], -1).to(x.dtype).clone()  # a copy: a model may add in place

    def plus(d):
        return lambda t: t + d.to(t.dtype)

    def state(upto: int) -> tuple[dict, dict]:
        """Hooks writing this run's heads and MLPs of layers < upto back."""
        pre = {P.o_proj(j): put_z(z[j]) for j in range(upto)}
        post = {P.mlp_out(j): (lambda x, v=mlp[j]: v.to(x.dtype).clone()) for j in range(upto)}  # Falcon: out += attn
        return pre, post

    def keeper(got: dict, key: str):
        def fn(x):
            got[key] = x.clone()
            return x
        return fn

    def attn_of(layer: int, zz: torch.Tensor) -> torch.Tensor:
        got: dict = {}
        attn = P.layers[layer].get_submodule(P.branches.attn_out) if P.branches.attn_out else P.attn(layer)
        P.run(ref, pre={P.o_proj(layer): put_z(zz)}, post={attn: keeper(got, "a")})
        return got["a"].float()

    for layer in range(P.L):
        proj, split = qkv_split(P, layer)
        zl = torch.empty_like(r["z"][layer])
        for h in range(P.H):
            outs: dict[str, dict] = {}
            for x in "qkv":
                pre, post = state(layer)
                pre[P.layers[layer]] = plus(delta(f"a{layer}.h{h}<{x}>"))
                outs[x] = {}
                post.update({mod: keeper(outs[x], name) for name, mod in proj.items()})
                P.run(ref, pre, post)
            pre, post = state(layer)
            if split is None:
                post.update({proj[x]: (lambda t, v=outs[x][x]: v.to(t.dtype)) for x in "qkv"})
            else:
                fused = outs["q"]["qkv"].clone()
                fused[..., split[1]] = outs["k"]["qkv"][..., split[1]]
                fused[..., split[2]] = outs["v"]["qkv"][..., split[2]]
                post[proj["qkv"]] = lambda t, v=fused: v.to(t.dtype)
            got: dict = {}
            pre[P.o_proj(layer)] = keeper(got, "z")
            P.run(ref, pre, post)
            zl[:, :, h] = got["z"].reshape(*got["z"].shape[:2], P.H, -1)[:, :, h]
        z.append(zl)
        base = attn_of(layer, zl)
        for h in range(P.H):
            swapped = zl.clone()
            swapped[:, :, h] = c["z"][layer][:, :, h]
            diff[f"a{layer}.h{h}"] = attn_of(layer, swapped) - base
        pre, post = state(layer)
        pre[P.o_proj(layer)] = put_z(zl)
        if P.branches.mlp_in is None:  # a parallel block's MLP reads the layer's input: the layer reads it plus
            pre[P.layers[layer]] = plus(delta(f"m{layer}"))  # the MLP's correction, its attention answers as on z
            post[P.attn(layer)] = lambda t, v=base: v.to(t.dtype).clone()
        else:
            pre[P.layers[layer].get_submodule(P.branches.mlp_in)] = plus(delta(f"m{layer}"))
        got = {}
        post[P.mlp_out(layer)] = keeper(got, "m")
        P.run(ref, pre, post)
        mlp.append(got["m"])
        diff[f"m{layer}"] = (c["mlp"][layer] - got["m"]).float()
    pre, post = state(P.L)
    post[P.layers[P.L - 1]] = plus(delta("logits"))
    lg, end = P.run(ref, pre, post)
    rows = torch.arange(len(ref))
    a = lg[rows, end, answer]
    return a, a - lg[rows, end].mean(-1)
