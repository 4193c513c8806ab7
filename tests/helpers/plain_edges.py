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

    def hooks_of(self, edge: str, scale: torch.Tensor | float = 1.0) -> tuple[dict, dict]:
        """(pre, post) hooks of the X_r run with ``edge`` patched (the difference times ``scale``); a head
        receiver's output computed first, in a run of its own."""
        sender, receiver, qkv = _edge(edge)
        d = self.difference(sender) * scale
        kind, layer, head = _node(receiver)
        P = self.p
        if kind == "logits":
            return {}, {P.layers[P.L - 1]: lambda x: x + d.to(x.dtype)}
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

    def patched(self, edge: str) -> torch.Tensor:
        """The answer logit at END with ``edge`` patched.  # [P]"""
        with torch.no_grad():
            return self.forward(*self.hooks_of(edge))

    def derivative(self, edge: str) -> torch.Tensor:
        """d answer logit / d eps with the edge sending eps times its difference, at eps = 0, by autograd through
        the hooked runs (the reference of EAP).  # [P]"""
        eps = torch.zeros(len(self.ref), 1, 1, requires_grad=True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(self.forward(*self.hooks_of(edge, eps)).sum(), eps)
        return g.reshape(-1)
