"""The exact END chain: how a change at END reaches the answer logit when every head is frozen.

Shared by fast path patching (:mod:`engine.techniques.path_patching`) and path attribution patching
(:mod:`engine.techniques.attribution`).  With every head's output z frozen at its X_r value at every
position, no position but END changes and the attention contributes at END exactly what it did on X_r;
so a residual vector x at END is carried through block j by (the block model of
:mod:`engine.backends.layouts`)::

    sequential:  mid = x + attn_j;   x' = mid + MLP_j(mid)
    parallel:    x'  = x + attn_j + MLP_j(x)

with ``attn_j`` X_r's attention contribution at END (``hooks.attn_out``) and ``MLP_j`` the backend's MLP
branch (its norms and residual scale included), and read at the top as
``transform(LN_final(x) . W_U[:, answer] + b_U[answer])`` (``backend.answer_logits``).

A head sender (l, h) changes the attention module's output at END, ``a_l = o_proj(z)``
(``hooks.attn_proj_out``), by ``delta = (z_c - z_r)[l, END, h] @ W_O[l, h]``; its block adds
``attn_branch_l(a_l + delta)`` (the post-attention norm and residual scale; ``a_l + delta`` on most
models) and runs its MLP on the new stream (a parallel block's MLP reads the unchanged block input).  An MLP
sender l starts after its block at ``resid_post[l] + (mlp_c - mlp_r)[l]``.

**Self-check** (:mod:`engine.machinery.shortcut`).  The chains rest on the block model, so each batch
checks it before anything is reported: (1) for every layer, ``a_c - a_r`` equals ``(z_c - z_r) @ W_O``
summed over heads (the heads' outputs reach the attention module's output linearly, through W_O) and the
attention branch gives back X_r's contribution, ``attn_branch(a_r) = attn_r``; (2) one extra chain starts
at layer 0 with no change at all and, through every block's MLP branch, the final norm, the unembedding and
the logits' transform, must give back the model's own answer logit.  A mismatch raises
:class:`~engine.machinery.shortcut.ShortcutMismatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.backends.hooks import HookName
from engine.machinery.batching import PairBatch, pair_batches
from engine.machinery.shortcut import ShortcutMismatch, check_reproduces
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair


def chain_hooks(n_layers: int) -> tuple[list[HookName], list[HookName]]:
    """(X_r, X_c) activations the END chains read: per layer z, the attention module's output and contribution,
    resid_pre and MLP out of X_r; z, the attention module's output and MLP out of X_c."""
    ref = [n for layer in range(n_layers) for n in (hooks.attn_z(layer), hooks.attn_proj_out(layer),
                                                    hooks.attn_out(layer), hooks.resid_pre(layer),
                                                    hooks.mlp_out(layer))]
    cf = [n for layer in range(n_layers) for n in (hooks.attn_z(layer), hooks.attn_proj_out(layer),
                                                   hooks.mlp_out(layer))]
    return ref, cf


@dataclass
class EndBatch:
    """One batch of pairs run once on X_r and once on X_c: X_r's END logits and both runs' cached activations."""

    batch: PairBatch
    answer: torch.Tensor    # [P] the answer token, on the backend's device
    logits: torch.Tensor    # [P, vocab] float: X_r's logits at END (only END is unembedded)
    c_r: dict | None        # hook name -> X_r activation, every position
    c_c: dict | None        # hook name -> X_c activation, every position

    @property
    def model_logit(self) -> torch.Tensor:
        """The model's own answer logit on X_r.  # [P]"""
        return self.logits[torch.arange(len(self.batch.pairs)), self.answer]


def end_batches(backend: ModelBackend, pairs: Sequence[PromptPair], batch_size: int,
                names: tuple[Sequence[HookName], Sequence[HookName]], progress: ProgressFn | None = None
                ) -> Iterator[EndBatch]:
    """The batches every END-chain technique walks (exact path patching, path AtP): ``pairs`` in padded batches
    of ``batch_size``, each run on X_r caching ``names[0]`` and on X_c caching ``names[1]``; ``progress``
    after each batch has been used."""
    chunks = pair_batches(backend, pairs, batch_size)
    for ci, b in enumerate(chunks):
        at = b.end.reshape(-1, 1)  # only END is unembedded: the chains read the rest
        with torch.no_grad():
            lg_r, c_r = backend.run_with_cache_at(b.ref, b.mask, names[0], at)
            _, c_c = backend.run_with_cache_at(b.cf, b.mask, names[1], at)
        eb = EndBatch(b, b.answer.to(backend.device), lg_r[:, 0].float(), c_r, c_c)
        del lg_r, c_r, c_c  # the batch owns them: a user may drop them (EndActs.checked)
        yield eb
        if progress is not None:
            progress(ci + 1, len(chunks))


@dataclass
class EndActs:
    """X_r's and X_c's END activations of one batch of P pairs, per layer."""

    pre: list[torch.Tensor]     # [P, d_model]      X_r resid_pre
    a: list[torch.Tensor]       # [P, d_model]      X_r attention module output (o_proj(z))
    attn: list[torch.Tensor]    # [P, d_model]      X_r attention contribution
    mlp: list[torch.Tensor]     # [P, d_model]      X_r MLP contribution
    z: list[torch.Tensor]       # [P, H, d_head]    X_r head outputs
    z_c: list[torch.Tensor]     # [P, H, d_head]    X_c head outputs
    a_c: list[torch.Tensor]     # [P, d_model]      X_c attention module output
    mlp_c: list[torch.Tensor]   # [P, d_model]      X_c MLP contribution

    @classmethod
    def of(cls, c_r: dict, c_c: dict, end_rows: Callable[[torch.Tensor], torch.Tensor], n_layers: int) -> "EndActs":
        def end(cache: dict, name: Callable[[int], HookName]) -> list[torch.Tensor]:
            return [end_rows(cache[name(j)]) for j in range(n_layers)]
        return cls(end(c_r, hooks.resid_pre), end(c_r, hooks.attn_proj_out), end(c_r, hooks.attn_out),
                   end(c_r, hooks.mlp_out), end(c_r, hooks.attn_z), end(c_c, hooks.attn_z),
                   end(c_c, hooks.attn_proj_out), end(c_c, hooks.mlp_out))

    @classmethod
    def checked(cls, backend: ModelBackend, eb: EndBatch, W_O: Sequence[torch.Tensor]) -> "EndActs":
        """The END rows of ``eb``'s activations (which it then drops), after self-check (1) of the block model
        (:func:`check_block_model`)."""
        acts = cls.of(eb.c_r, eb.c_c, eb.batch.end_rows, len(W_O))
        eb.c_r = eb.c_c = None
        check_block_model(backend, acts, W_O, backend.facts.dtype)
        return acts

    def head_deltas(self, j: int, W_O: torch.Tensor) -> torch.Tensor:
        """Each head's change of the attention module's END output: (z_c - z_r)[h] @ W_O[h].  # [P, H, d_model]"""
        return torch.einsum("phd,hdm->phm", self.z_c[j] - self.z[j], W_O)


def mlp(backend: ModelBackend, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The MLP branch on a [P, n, d_model] stack of END residual vectors."""
    P, n, d = x.shape
    return backend.mlp_branch(layer, x.reshape(P * n, d)).reshape(P, n, d)


def attn_branch(backend: ModelBackend, layer: int, a: torch.Tensor) -> torch.Tensor:
    """The attention branch (post-attention norm, residual scale) on a [P, n, d_model] stack."""
    if backend.attn_branch_is_identity:
        return a
    P, n, d = a.shape
    return backend.attn_branch(layer, a.reshape(P * n, d)).reshape(P, n, d)


def step(backend: ModelBackend, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Carry END residual vectors x [P, n, d_model] through block ``layer`` whose attention contributes
    ``attn`` [P, n or 1, d_model]."""
    if backend.parallel_attn_mlp:
        return x + attn + mlp(backend, layer, x)
    mid = x + attn
    return mid + mlp(backend, layer, mid)


def head_starts(backend: ModelBackend, acts: EndActs, layer: int, delta: torch.Tensor) -> torch.Tensor:
    """The END stream after block ``layer`` with its attention module's output moved by ``delta`` [P, n, d_model]
    (n head senders, or zeros for the self-check).  # [P, n, d_model]"""
    if backend.attn_branch_is_identity:
        attn = acts.attn[layer][:, None] + delta
    else:
        attn = attn_branch(backend, layer, acts.a[layer][:, None] + delta)
    pre = acts.pre[layer][:, None]
    if backend.parallel_attn_mlp:  # its MLP reads the unchanged block input
        return pre + attn + acts.mlp[layer][:, None]
    return step(backend, layer, pre, attn)


def mlp_start(acts: EndActs, layer: int) -> torch.Tensor:
    """The END stream after block ``layer`` with its MLP's contribution taken from X_c.  # [P, 1, d_model]"""
    return (acts.pre[layer] + acts.attn[layer] + acts.mlp[layer] + (acts.mlp_c[layer] - acts.mlp[layer]))[:, None]


@torch.no_grad()
def run_chains(backend: ModelBackend, acts: EndActs, W_O: Sequence[torch.Tensor],
               heads: Sequence[Sequence[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every MLP and every head of every layer (``heads[l]``: only those heads of layer l) as sender, plus the
    unchanged chain from layer 0 (the self-check).

    Returns (senders [P, chains, d_model], layer-major: the layer's heads in order, then its MLP;
    check [P, d_model])."""
    L = len(acts.pre)
    x: torch.Tensor | None = None  # [P, chains, d_model]: the check chain, then every sender started so far
    for j in range(L):
        if x is not None:  # advance the chains started below layer j
            x = step(backend, j, x, acts.attn[j][:, None])
        delta = acts.head_deltas(j, W_O[j])  # [P, H, d_model]
        if heads is not None:
            delta = delta[:, list(heads[j])]
        if x is None:  # layer 0: the check chain starts as a head sender with no change
            delta = torch.cat([delta.new_zeros(delta.shape[0], 1, delta.shape[2]), delta], dim=1)
        new = torch.cat([head_starts(backend, acts, j, delta), mlp_start(acts, j)], dim=1)
        x = new if x is None else torch.cat([x, new], dim=1)
    return x[:, 1:], x[:, 0]


def check_components(backend: ModelBackend) -> None:
    """ShortcutMismatch when the backend cannot run this model's blocks piece by piece."""
    why = backend.components_fail()
    if why:
        raise ShortcutMismatch(f"its blocks cannot be run piece by piece ({why})")


def check_block_model(backend: ModelBackend, acts: EndActs, W_O: Sequence[torch.Tensor], dtype: str) -> None:
    """Self-check (1), and of the attention branch: per layer, at END,

    * ``a_c - a_r == sum_h (z_c - z_r)[h] @ W_O[h]`` (the heads reach the attention output linearly through W_O);
    * ``attn_branch(a_r) == attn_r`` (the post-attention norm and scale; nothing to check where it is the identity).

    Relative to the size of the attention output; ShortcutMismatch otherwise."""
    for j in range(len(acts.pre)):
        size = torch.maximum(acts.a[j].float().norm(dim=-1), acts.a_c[j].float().norm(dim=-1))  # [P]
        err = (acts.head_deltas(j, W_O[j]).sum(1).float() - (acts.a_c[j] - acts.a[j]).float()).norm(dim=-1)
        check_reproduces(f"the heads' outputs through W_O at layer {j}", err, torch.zeros_like(err), size, dtype)
        if not backend.attn_branch_is_identity:
            got = backend.attn_branch(j, acts.a[j]).float()
            err = (got - acts.attn[j].float()).norm(dim=-1)
            check_reproduces(f"the attention branch (post-norm, scale) at layer {j}", err, torch.zeros_like(err),
                             acts.attn[j].float().norm(dim=-1), dtype)


def chain_gradients(backend: ModelBackend, acts: EndActs, answer: torch.Tensor
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """(g_head [L] of [P, d_model], g_mlp [L] of [P, d_model], logit [P]) of the chain from X_r's embedding.

    The chain is run from ``resid_pre[0]`` with a zero probe added to each layer's attention module output
    (before its branch) and to each MLP's contribution; one backward pass gives d logit / d probe for all.
    ``logit`` is the chain's own answer logit (checked against the model's by the caller)."""
    L = len(acts.pre)
    dtype = acts.pre[0].dtype
    with torch.enable_grad():
        x = acts.pre[0].float()[:, None]  # [P, 1, d_model]
        probes_head, probes_mlp = [], []
        for j in range(L):
            p_head = torch.zeros_like(x, requires_grad=True)
            p_mlp = torch.zeros_like(x, requires_grad=True)
            if backend.attn_branch_is_identity:
                attn = acts.attn[j].float()[:, None] + p_head
            else:
                attn = attn_branch(backend, j, (acts.a[j].float()[:, None] + p_head).to(dtype)).float()
            if backend.parallel_attn_mlp:  # the MLP reads the block input; heads and MLP write together
                x = x + attn + mlp(backend, j, x.to(dtype)).float() + p_mlp
            else:
                x = x + attn
                x = x + mlp(backend, j, x.to(dtype)).float() + p_mlp
            probes_head.append(p_head)
            probes_mlp.append(p_mlp)
        lo = backend.answer_logits(x[:, 0].to(dtype), answer).float()  # [P]
        grads = torch.autograd.grad(lo.sum(), probes_head + probes_mlp)
    return [g[:, 0].detach() for g in grads[:L]], [g[:, 0].detach() for g in grads[L:]], lo.detach()
