"""The activations the number methods read: the residual stream of every layer at END, A and B, one pass per
prompt set.

**Activations.**  x[l, pos, i] is the residual stream of prompt i at layer l: ``resid_post[l]`` for
l = 0..L-1 and ``resid_pre[0]`` (the embedding, positional part included) as layer -1, at three
positions: ``END`` (the last prompt token, where the answer's first token is predicted), ``A`` (the last
token of operand A) and ``B`` (the last token of operand B) -- the operand positions are the last
positions with the roles "operand A" / "operand B" of :func:`engine.techniques.attention.token_roles`.
Targets are the numbers A, B and C of each prompt (C = the answer, not its first token).
One forward pass per prompt set reads every layer at the three positions and the END logits; the probes, the
circle, helix patching and the causal check of the same prompt set and weights share it, and shifts at END share one
computation of the prompts' keys and values before END (:func:`remembered`: the last of each, in memory) -- made by
that same pass where the shifts will continue them (:func:`keeps_prefixes`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import batches, check_pairs, pad, pad_id
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair, prompt_set_hash
from engine.techniques.attention import token_roles

METHOD = "numbers"
VERSION = 4  # bumped when a quantity of the package's docstrings changes (part of every cache key of the package)
POSITIONS: tuple[str, ...] = ("END", "A", "B")
TARGETS: tuple[str, ...] = ("A", "B", "C")
ROLE_OF = {"A": "operand A", "B": "operand B"}
CONTINUE_ROWS = 256  # rows one continuation call takes: shifts of a chunk share a call up to this
KEEP_PREFIX_BYTES = 512 * 2 ** 20  # larger prefixes (a big model on a GPU) are made per call, not kept


# ---------------------------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------------------------

def positions(backend: ModelBackend, pair: PromptPair) -> dict[str, int]:
    """{"END": last token, "A": A's last token, "B": B's last token} of ``pair.ref_ids``."""
    roles = token_roles(backend, pair)
    out = {"END": len(pair.ref_ids) - 1}
    for name, role in ROLE_OF.items():
        at = [i for i, r in enumerate(roles) if r == role]
        if not at:
            raise ValueError(f"no {role} token in {pair.ref_text!r}: the operands must be written in digits")
        out[name] = at[-1]
    return out


def target_values(pairs: Sequence[PromptPair]) -> dict[str, np.ndarray]:
    """{"A": [P], "B": [P], "C": [P]} as float64."""
    return {"A": np.array([float(p.a) for p in pairs]), "B": np.array([float(p.b) for p in pairs]),
            "C": np.array([float(p.answer) for p in pairs])}


def all_layers(backend: ModelBackend) -> list[int]:
    return list(range(-1, backend.facts.n_layers))


def check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    bad = [x for x in layers if not -1 <= x < n_layers]
    if bad or not layers:
        raise ValueError(f"layers {bad or '(none)'} do not exist: give -1 (embedding) .. {n_layers - 1}")
    return sorted(set(int(x) for x in layers))


def resid_hook(layer: int) -> hooks.HookName:
    """The residual stream leaving ``layer`` (-1: the embedding, resid_pre[0])."""
    return hooks.resid_pre(0) if layer < 0 else hooks.resid_post(layer)


@torch.no_grad()
def residuals(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *, batch_size: int = 64,
              progress: ProgressFn | None = None, total: int | None = None) -> np.ndarray:
    """x[layer, position, prompt, d_model] (float64) for ``layers`` (-1 = resid_pre[0]) and POSITIONS."""
    return residuals_and_end_logits(backend, pairs, layers, batch_size=batch_size, progress=progress, total=total)[0]


@torch.no_grad()
def residuals_and_end_logits(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *,
                             batch_size: int = 64, progress: ProgressFn | None = None, total: int | None = None
                             ) -> tuple[np.ndarray, torch.Tensor]:
    """(:func:`residuals`, the next-token logits at END [P, vocab]) of one pass: the final norm and the unembedding
    run on END only."""
    check_pairs(pairs, backend.facts.vocab_size)
    layers = check_layers(layers, backend.facts.n_layers)
    names = [resid_hook(x) for x in layers]
    at = [positions(backend, p) for p in pairs]
    pos = torch.tensor([[a[n] for n in POSITIONS] for a in at])  # [P, 3]
    out = np.zeros((len(layers), len(POSITIONS), len(pairs), backend.facts.d_model))
    logits = torch.empty(len(pairs), backend.facts.vocab_size)
    chunks = batches(len(pairs), batch_size)
    for ci, idx in enumerate(chunks):
        ids, mask, end = pad([pairs[i].ref_ids for i in idx], pad_id(backend))
        lg, c = backend.run_with_cache_at(ids, mask, names, end[:, None])  # lg [b, 1, vocab]
        logits[list(idx)] = lg[:, 0].float().cpu()
        rows = torch.arange(len(idx))[:, None]
        for j, name in enumerate(names):
            act = c[name][rows, pos[list(idx)].to(c[name].device)]  # [b, 3, d_model]
            out[j][:, list(idx)] = act.double().cpu().numpy().transpose(1, 0, 2)
        if progress is not None:
            progress(ci + 1, total or len(chunks))
    return out, logits


_LAST_LOCK = threading.Lock()
_LAST: dict[str, tuple[tuple, object]] = {}  # kind -> (key, value): the last pass of each kind


def remembered(kind: str, backend: ModelBackend, pairs: Sequence[PromptPair], make, *, keep: bool = True):
    """``make()``, kept for the last (weights, dtype, prompt set) of ``kind``: the probes, the circle, helix
    patching and the causal check of one prompt set share one residual pass and one prefix (a page's first visit
    runs them one after the other).  ``keep`` False: made, not kept (and the last one of ``kind`` let go)."""
    key = (backend.facts.fingerprint, backend.facts.dtype, prompt_set_hash(pairs))
    with _LAST_LOCK:
        hit = _LAST.get(kind)
    if hit is not None and hit[0] == key:
        return hit[1]
    with _LAST_LOCK:
        _LAST.pop(kind, None)  # the last one is not needed while the new one is made
    value = make()
    if keep:
        with _LAST_LOCK:
            _LAST[kind] = (key, value)
    return value


def residual_pass(backend: ModelBackend, pairs: Sequence[PromptPair], *, progress: ProgressFn | None = None,
                  total: int | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """:func:`residuals_and_end_logits` of every layer (-1 .. L-1: layer l at index l + 1), remembered for the last
    prompt set (:func:`remembered`); where shifts at END will continue the prompts' prefixes
    (:func:`keeps_prefixes`), the same pass keeps them (:func:`residuals_and_prefixes`)."""
    def make():
        if not keeps_prefixes(backend, pairs):
            return residuals_and_end_logits(backend, pairs, all_layers(backend), progress=progress, total=total)
        out, kept = residuals_and_prefixes(backend, pairs, all_layers(backend), progress=progress, total=total)
        remembered("prefixes", backend, pairs, lambda: kept)
        return out
    return remembered("residuals", backend, pairs, make)


def keeps_prefixes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> bool:
    """Whether the residual pass keeps X_r's keys and values for the shifts at END: the backend continues prompts,
    every prompt has a token before END, the keys and values fit :data:`KEEP_PREFIX_BYTES`, and continuing them pays
    for a single shift (:func:`continuation_pays`)."""
    return (backend.continues and min(len(p.ref_ids) for p in pairs) >= 2
            and prefix_bytes(backend, pairs) <= KEEP_PREFIX_BYTES and continuation_pays(backend, pairs, 1))


@torch.no_grad()
def residuals_and_prefixes(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *,
                           progress: ProgressFn | None = None, total: int | None = None
                           ) -> tuple[tuple[np.ndarray, torch.Tensor], list["Prefix"]]:
    """(:func:`residuals_and_end_logits`, :func:`prefixes`) from one pass per chunk of equal-length prompts that
    keeps their keys and values (``prefix_with_cache_at``): the END logits are the full prompt's, and each chunk's
    unshifted continuation of END from its keys and values cropped before END is the check
    :func:`.shifts.continued_readouts` holds against them."""
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    check_pairs(pairs, backend.facts.vocab_size)
    names = [resid_hook(x) for x in check_layers(layers, backend.facts.n_layers)]
    out = np.zeros((len(names), len(POSITIONS), len(pairs), backend.facts.d_model))
    logits = torch.empty(len(pairs), backend.facts.vocab_size)
    kept = []
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    for ci, idx in enumerate(chunks):
        idx = list(idx)
        ids = torch.tensor([pairs[i].ref_ids for i in idx])  # [n, T]: one length, no padding
        T = ids.shape[1]
        pos = torch.tensor([[positions(backend, pairs[i])[n] for n in POSITIONS] for i in idx])  # [n, 3]
        cache, lg, acts = backend.prefix_with_cache_at(ids, names, pos)
        logits[idx] = lg.float().cpu()
        for j, name in enumerate(names):
            out[j][:, idx] = acts[name].double().cpu().numpy().transpose(1, 0, 2)  # [n, 3, d] -> [3, n, d]
        clean = backend.continue_end_logits(cache, torch.arange(len(idx)), ids[:, T - 1:], start=T - 1)
        kept.append(Prefix(idx, cache, ids[:, T - 1:], clean.float().cpu()))
        if progress is not None:  # in the padded pass's units (its batches of 64), as the caller's total counts
            units = len(batches(len(pairs), 64))
            progress(-(-(ci + 1) * units // len(chunks)), total or units)
    return (out, logits), kept


def layer_residuals(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], **kw) -> np.ndarray:
    """x[layer, position, prompt, d_model] of :func:`residuals`, read from :func:`residual_pass`."""
    layers = check_layers(layers, backend.facts.n_layers)
    return residual_pass(backend, pairs, **kw)[0][[x + 1 for x in layers]]


def forget_residuals() -> None:
    """Let go of the remembered residual pass and prefixes (:func:`remembered`): the next use runs them."""
    with _LAST_LOCK:
        _LAST.clear()


def residual_pass_work(backend: ModelBackend, pairs: Sequence[PromptPair]):
    """The forward work of :func:`residual_pass` (``engine.cost.Work``): none when it is remembered for these pairs,
    else one END-only pass (its prefixes kept: one pass per chunk of one length and its END continued)."""
    from engine.cost import NO_WORK, Work, padded_passes
    key = (backend.facts.fingerprint, backend.facts.dtype, prompt_set_hash(pairs))
    with _LAST_LOCK:
        hit = _LAST.get("residuals")
    if hit is not None and hit[0] == key:
        return NO_WORK
    if not keeps_prefixes(backend, pairs):
        return padded_passes([p.ref_ids for p in pairs], 64)
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    w = NO_WORK
    for idx in length_chunks(pairs, TOKENS_PER_PASS):
        n, T = len(idx), len(pairs[idx[0]].ref_ids)
        w += Work(2, n * T + n, 2 * n)
    return w


# ---------------------------------------------------------------------------------------------
# the prompts' keys and values before END, kept for the shifts at END
# ---------------------------------------------------------------------------------------------

def continuation_pays(backend: ModelBackend, pairs: Sequence[PromptPair], n_shifts: int) -> bool:
    """Whether the prefixes + their continuations (per chunk: the check, then the shifts ``CONTINUE_ROWS`` rows a
    call) cost fewer token positions (a call's fixed cost counted, :func:`engine.machinery.batching.call_tokens`)
    than one padded pass per shift."""
    if not backend.continues:
        return False
    from engine.machinery.batching import TOKENS_PER_PASS, call_tokens, length_chunks
    call = call_tokens(backend.facts)
    width = max(len(p.ref_ids) for p in pairs)
    full = n_shifts * (len(pairs) * width + len(batches(len(pairs), 64)) * call)
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    calls = sum(1 + -(-n_shifts // max(1, CONTINUE_ROWS // len(c))) for c in chunks)  # the check, then the shifts
    cont = sum(len(p.ref_ids) for p in pairs) + len(chunks) * call + calls * call + (n_shifts + 1) * len(pairs)
    return cont < full


@dataclass
class Prefix:
    """One chunk of equal-length prompts: their indices, the keys and values of every position before END (the
    backend's opaque cache), END's token [n, 1] and the unshifted continuation's END logits [n, vocab]."""

    idx: list[int]
    cache: object
    end_ids: torch.Tensor
    clean: torch.Tensor


@torch.no_grad()
def prefixes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> list[Prefix] | None:
    """X_r's prefixes of every prompt, per chunk of equal length (None: a prompt of one token), remembered for the
    last prompt set (:func:`remembered`)."""
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks

    def make() -> list[Prefix] | None:
        out = []
        for idx in length_chunks(pairs, TOKENS_PER_PASS):
            ids = torch.tensor([pairs[i].ref_ids for i in idx])  # [n, T]: one length, no padding
            T = ids.shape[1]
            if T < 2:
                return None
            cache = backend.prefix(ids[:, :T - 1])
            clean = backend.continue_end_logits(cache, torch.arange(len(idx)), ids[:, T - 1:], start=T - 1)
            out.append(Prefix(list(idx), cache, ids[:, T - 1:], clean.float().cpu()))
        return out

    return remembered("prefixes", backend, pairs, make, keep=prefix_bytes(backend, pairs) <= KEEP_PREFIX_BYTES)


def prefix_bytes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> int:
    """The keys and values :func:`prefixes` holds: 2 x layers x prefix tokens x KV heads x d_head x the dtype's size."""
    f = backend.facts
    try:
        size = torch.empty((), dtype=getattr(torch, f.dtype)).element_size()
    except (AttributeError, TypeError):
        size = 4
    return 2 * f.n_layers * sum(len(p.ref_ids) - 1 for p in pairs) * f.n_kv_heads * f.d_head * size
