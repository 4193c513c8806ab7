"""Path patching to a head: which earlier heads feed a key head (Algorithm 1 with a head as receiver).

Zhang et al. (2024, §4.1) run Algorithm 1 with the answer logit as receiver (:mod:`engine.techniques.patching`).
With a *head* as receiver -- head (l_r, h_r), through its query, key or value input -- the same
algorithm asks which earlier senders write what that head reads at END:

1. Run X_r and X_c; cache every head's output (z), every MLP's output and the receiver layer's
   queries, keys and values.
2. Run X_r again, with
   * the sender's END output (head (l_s, h_s), l_s < l_r, or MLP l_s < l_r) taken from X_c,
   * every other head frozen at X_r, at every position, in every layer -- including the receiver
     layer's other heads and every head above it,
   * at the receiver: its chosen input (q, k or v) recomputed from the patched residual stream,
     the other two frozen at X_r; so the receiver's END output changes only through that input;
   * the MLPs recomputed, so the receiver's changed output is passed on to the logits through the
     END position's MLPs (the rest frozen).
3. Read the answer token's logit at END: ``logit_p`` vs ``logit_o`` (the same metrics as path
   patching: relative ``effect`` and ``logit_diff``).

A sender that matters only through this receiver's query shows a strongly negative effect: it is
what the key head looks up the operands with.  With every head frozen, a patch at END changes only
the END residual, so only the receiver's END query (or END key / value) moves.

Cost: the senders are batched as rows (one row per prompt and sender), one hooked forward pass of
the model per batch -- the textbook loop, exact.  (An END-chain shortcut like path patching's would
need the receiver's attention as a single-position component of the backend; not done yet.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.batching import batches, check_pairs, pad, pad_id
from engine.techniques.patching import PatchingRaw, Sender, SenderValue, summarize

Input = Literal["q", "k", "v"]
INPUTS: tuple[str, ...] = ("q", "k", "v")
METHOD = "head_path_patching"


@dataclass(frozen=True)
class Receiver:
    layer: int
    head: int
    input: Input = "q"

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}:{self.input}"


def parse_receiver(text: str, n_layers: int, n_heads: int) -> Receiver:
    """``"3.1:q"`` (layer.head[:q|k|v], default q) -> Receiver; ValueError with what to type otherwise."""
    head_part, _, inp = text.strip().partition(":")
    inp = inp or "q"
    try:
        layer, head = (int(x) for x in head_part.split("."))
    except ValueError:
        raise ValueError(f"receiver {text!r}: write LAYER.HEAD[:q|k|v], e.g. 3.1:q") from None
    if inp not in INPUTS:
        raise ValueError(f"receiver input {inp!r}: choose q, k or v")
    if not 0 < layer < n_layers or not 0 <= head < n_heads:
        raise ValueError(f"receiver {layer}.{head}: the layer must be 1..{n_layers - 1} (it needs earlier "
                         f"senders) and the head 0..{n_heads - 1}")
    return Receiver(layer, head, inp)  # type: ignore[arg-type]


def senders_before(receiver: Receiver, n_heads: int) -> list[Sender]:
    """Every head and MLP of the layers below the receiver."""
    return [s for layer in range(receiver.layer)
            for s in ([Sender("head", layer, h) for h in range(n_heads)] + [Sender("mlp", layer)])]


@torch.no_grad()
def head_path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, *,
                       rows_per_pass: int = 128, progress: ProgressFn | None = None) -> PatchingRaw:
    """Effect of every earlier sender on the answer logit through ``receiver``'s input only (exact).

    Returns a PatchingRaw over the receiver's layers (layers >= receiver.layer hold nan)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    check_pairs(pairs, f.vocab_size)
    if not 0 < receiver.layer < L or not 0 <= receiver.head < H or receiver.input not in INPUTS:
        raise ValueError(f"receiver {receiver} is not a head of this model with earlier senders")
    P = len(pairs)
    ref, mask, end = pad([p.ref_ids for p in pairs], pad_id(backend))
    cf, _, _ = pad([p.cf_ids for p in pairs], pad_id(backend))
    answer = torch.tensor([p.answer_id for p in pairs])
    rows = torch.arange(P)
    lr = receiver.layer
    qkv = {"q": hooks.attn_q(lr), "k": hooks.attn_k(lr), "v": hooks.attn_v(lr)}
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    lg, c_r = backend.run_with_cache(ref, mask, names + [qkv[i] for i in INPUTS if i != receiver.input])
    logit_o = lg[rows.to(lg.device), end.to(lg.device), answer.to(lg.device)].float().cpu()
    _, c_c = backend.run_with_cache(cf, mask, names)
    senders = senders_before(receiver, H)
    patched = torch.empty(len(senders), P)
    per_pass = max(1, rows_per_pass // P)
    groups = batches(len(senders), per_pass)
    for gi, grp in enumerate(groups):
        group = [senders[i] for i in grp]
        S = len(group)
        rep = lambda t, S=S: t.repeat(S, *([1] * (t.dim() - 1)))  # noqa: E731 - [P, ...] -> [S * P, ...]
        edits = []
        for layer in range(L):
            z = rep(c_r[hooks.attn_z(layer)]).clone()  # [S * P, pos, H, d_head], frozen at X_r
            for s, snd in enumerate(group):
                if snd.component == "head" and snd.layer == layer:
                    z[rows + s * P, end, snd.head] = c_c[hooks.attn_z(layer)][rows, end, snd.head]
            if layer == lr:
                edits.append((hooks.attn_z(layer), _freeze_except(z, receiver.head)))
            else:
                edits.append((hooks.attn_z(layer), _replace(z)))
            mlp_rows = [s for s, snd in enumerate(group) if snd.component == "mlp" and snd.layer == layer]
            if mlp_rows:
                edits.append((hooks.mlp_out(layer), _patch_mlp(mlp_rows, c_c[hooks.mlp_out(layer)], rows, end, P)))
        for inp in INPUTS:
            if inp != receiver.input:  # only the chosen input is recomputed
                edits.append((qkv[inp], _replace(rep(c_r[qkv[inp]]))))
        with backend.hooks(edits):
            out = backend.logits(rep(ref), rep(mask))
        patched[list(grp)] = out[torch.arange(S * P).to(out.device), end.repeat(S).to(out.device),
                                 answer.repeat(S).to(out.device)].float().cpu().reshape(S, P)
        if progress is not None:
            progress(gi + 1, len(groups))
    head_logit = torch.full((P, L, H), float("nan"))
    mlp_logit = torch.full((P, L), float("nan"))
    for i, snd in enumerate(senders):
        if snd.component == "head":
            head_logit[:, snd.layer, snd.head] = patched[i]
        else:
            mlp_logit[:, snd.layer] = patched[i]
    return PatchingRaw(list(pairs), logit_o, head_logit, mlp_logit)


def _replace(value: torch.Tensor):
    def fn(act: torch.Tensor) -> torch.Tensor:
        act[...] = value.to(act.device, act.dtype)
        return act
    return fn


def _freeze_except(value: torch.Tensor, head: int):
    """Receiver layer: every head frozen at ``value`` but the receiver, which keeps its recomputed output."""
    def fn(act: torch.Tensor) -> torch.Tensor:  # [S * P, pos, H, d_head]
        keep = act[:, :, head].clone()
        act[...] = value.to(act.device, act.dtype)
        act[:, :, head] = keep
        return act
    return fn


def _patch_mlp(slots: list[int], m_c: torch.Tensor, rows: torch.Tensor, end: torch.Tensor, P: int):
    def fn(act: torch.Tensor) -> torch.Tensor:  # [S * P, pos, d_model]
        for s in slots:
            act[(rows + s * P).to(act.device), end.to(act.device)] = m_c[rows, end].to(act.device, act.dtype)
        return act
    return fn


def cached_head_path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, *,
                              cache=None, progress: ProgressFn | None = None
                              ) -> tuple[list[SenderValue], bool]:
    """Head -> head path patching through the result cache: (per-sender means, computed)."""
    from engine.results import run_cached_rows

    params = {"dtype": backend.facts.dtype, "receiver": str(receiver), "position": "END"}

    def compute():
        raw = head_path_patching(backend, pairs, receiver, progress=progress)
        return [v for v in summarize(raw) if v.component in ("head", "mlp") and v.layer < receiver.layer
                and v.metric in ("effect", "logit_diff")], {"receiver": str(receiver)}

    out, _, computed = run_cached_rows(backend, pairs, METHOD, params, compute, SenderValue, cache=cache)
    return out, computed
