"""Path patching to a head: which earlier heads feed a key head (Algorithm 1 with a head as receiver).

Zhang et al. (2024, §4.1) run Algorithm 1 with the answer logit as receiver (:mod:`engine.techniques.path_patching`).
With a *head* as receiver -- head (l_r, h_r), through its query, key or value input -- the same
algorithm asks which earlier senders write what that head reads at END:

1. Run X_r and X_c; cache every head's output (z), every MLP's output and the receiver layer's
   queries, keys and values.
2. **Record** the receiver's new output: run X_r with
   * the sender's END output (head (l_s, h_s), l_s < l_r, or MLP l_s < l_r) taken from X_c,
   * every other head frozen at X_r, at every position, in every layer -- including the receiver
     layer's other heads,
   * at the receiver: its chosen input (q, k or v) recomputed from the patched residual stream,
     the other two frozen at X_r, the MLPs recomputed;
   and keep the receiver's output z (Wang et al. 2023a's path patching, step 2).
3. **Pass it on alone**: run X_r again with every head frozen at X_r but the receiver, whose output is the
   recorded z; the MLPs recomputed, so the receiver's changed output reaches the logits through the residual
   stream and the END position's MLPs -- and the sender's own write (its direct path to the logits, and its path
   through the MLPs) does not: what is read is carried only through the receiver's input.
4. Read the answer token's logit at END: ``logit_p`` vs ``logit_o`` (the same metrics as path
   patching: relative ``effect`` and ``logit_diff``).

A sender that matters only through this receiver's query shows a strongly negative effect: it is
what the key head looks up the operands with.  With every head frozen, a patch at END changes only
the END residual, so only the receiver's END query (or END key / value) moves.

Cost -- the floor.  With every head frozen and the sender patched at END, no position before END
differs from X_r's run: the receiver's queries, keys and values there are X_r's.  So X_r's keys and
values up to END are kept once per prompt length, and each (sender, prompt) row runs **the END token
alone** against them in each of steps 2 and 3 (:func:`engine.machinery.patch_rows.at_end`): one position per
row, through the model's own layers (its rotary embedding, grouped-query attention, norms), instead of the whole
prompt.  :func:`head_path_patching_reference` -- whole prompts, one row per sender and prompt, on the
patching core -- is the textbook loop; the two agree to float rounding (``tests/integration/
test_head_patching.py``).  A backend that cannot keep keys and values (NDIF) runs the reference, and
so does a model whose keys and values do not give back its own logits (the self-check of
:func:`engine.machinery.patch_rows.patch_rows`; the result's ``fallback`` says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import TOKENS_PER_PASS, check_pairs, length_chunks
from engine.machinery.components import wide_rows
from engine.machinery.patch_rows import PatchRun, at_end, chain, patch_rows, prepare, replace
from engine.machinery.shortcut import ShortcutMismatch, fallback_note
from engine.progress import ProgressFn, Stages, note
from engine.prompts.pairs import PromptPair
from engine.techniques.path_patching import PatchingRaw, Sender, SenderValue, sender_edits, sender_hooks, summarize
from engine.techniques.path_patching import cli as patching_cli

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


def head_path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, *,
                       rows_per_pass: int | None = None, progress: ProgressFn | None = None) -> PatchingRaw:
    """Effect of every earlier sender on the answer logit through ``receiver``'s input only (exact).

    Each sender x prompt row runs the END token alone against X_r's cached keys and values, the
    prompts grouped by length (module docstring); ``rows_per_pass`` rows per forward pass (default:
    as many as hold ``TOKENS_PER_PASS`` cached positions).  Returns a PatchingRaw over the
    receiver's layers (layers >= receiver.layer hold nan)."""
    if not backend.continues:
        return head_path_patching_reference(backend, pairs, receiver, progress=progress)
    try:
        return _head_path_patching_at_end(backend, pairs, receiver, rows_per_pass, progress)
    except ShortcutMismatch as e:
        raw = head_path_patching_reference(backend, pairs, receiver, progress=progress)
        raw.fallback = fallback_note("head -> head path patching", str(e))
        return raw


def _head_path_patching_at_end(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver,
                               rows_per_pass: int | None, progress: ProgressFn | None) -> PatchingRaw:
    _check_receiver(backend, receiver)
    check_pairs(pairs, backend.facts.vocab_size)
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    senders = senders_before(receiver, backend.facts.n_heads)
    patched = torch.empty(len(senders), len(pairs))  # [S, P]
    logit_o = torch.empty(len(pairs))
    steps = Stages(progress, [len(idx) for idx in chunks for _ in range(2)])  # sized by prompts, two steps each
    for ci, idx in enumerate(chunks):
        chunk = [pairs[i] for i in idx]
        run, record, through = _prepared(backend, chunk, receiver)
        end_run = at_end(backend, run)
        rows = rows_per_pass or max(len(chunk), TOKENS_PER_PASS // len(chunk[0].ref_ids))
        patched[:, idx] = _two_steps(backend, end_run, senders, record, through, rows, steps, 2 * ci)
        logit_o[idx] = run.logit_o
    return _raw(backend, pairs, receiver, senders, patched, logit_o)


def _two_steps(backend: ModelBackend, run: PatchRun, senders: Sequence[Sender], record, through, rows: int,
               steps: Stages, at: int) -> torch.Tensor:
    """Steps 2 and 3 of every sender (module docstring): the receiver's output recorded, then passed on alone.
    # [S, P]"""
    z_of: dict[Sender, torch.Tensor] = {}
    patch_rows(backend, run, senders, lambda grp: record(run, grp, z_of), rows_per_pass=rows,
               progress=steps.stage(at))
    return patch_rows(backend, run, senders, lambda grp: through(run, grp, z_of), rows_per_pass=rows,
                      progress=steps.stage(at + 1))


def head_path_patching_work(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver):
    """The forward work of :func:`head_path_patching` (``engine.cost.Work``): per chunk of one length, X_r and X_c
    cached, X_r's keys and values, and every earlier sender as a row of the END token alone in each of steps 2 and 3
    (the textbook loop where the backend cannot continue a prefix)."""
    from engine.cost import NO_WORK, one_pass
    from engine.machinery.patch_rows import patch_rows_work, prepare_work
    n_senders = len(senders_before(receiver, backend.facts.n_heads))
    if not backend.continues:
        width = max(len(p.ref_ids) for p in pairs)
        rows = patch_rows_work(n_senders, len(pairs), width)
        return prepare_work(pairs) + rows + rows  # steps 2 and 3
    w = NO_WORK
    for idx in length_chunks(pairs, TOKENS_PER_PASS):
        chunk = [pairs[i] for i in idx]
        n, width = len(chunk), len(chunk[0].ref_ids)
        rows = max(n, TOKENS_PER_PASS // width)
        w += prepare_work(chunk) + one_pass(n, width - 1)
        step = patch_rows_work(n_senders, n, width, rows_per_pass=rows, start=width - 1)
        w += step + step  # steps 2 and 3
    return w


def head_path_patching_reference(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, *,
                                 rows_per_pass: int = 128, progress: ProgressFn | None = None) -> PatchingRaw:
    """The textbook loop: whole (padded) prompts, one row per sender and prompt in each of steps 2 and 3, one hooked
    pass per group."""
    _check_receiver(backend, receiver)
    run, record, through = _prepared(backend, pairs, receiver)
    senders = senders_before(receiver, backend.facts.n_heads)
    patched = _two_steps(backend, run, senders, record, through, rows_per_pass, Stages(progress, [1, 1]), 0)
    return _raw(backend, pairs, receiver, senders, patched, run.logit_o)  # patched: [S, P]


def _check_receiver(backend: ModelBackend, receiver: Receiver) -> None:
    L, H = backend.facts.n_layers, backend.facts.n_heads
    if not 0 < receiver.layer < L or not 0 <= receiver.head < H or receiver.input not in INPUTS:
        raise ValueError(f"receiver {receiver} is not a head of this model with earlier senders")


def _prepared(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver):
    """Step 1 (X_r and X_c cached) and the hooks of a group of senders in steps 2 and 3: ``record(run, group,
    z_of)`` -- every head frozen at X_r but the receiver, the sender's END output from X_c, the receiver's other two
    inputs frozen at X_r; the receiver's output of each sender's rows kept in ``z_of[sender]`` -- and ``through(run,
    group, z_of)`` -- every head frozen at X_r, the receiver's output ``z_of[sender]``."""
    L, lr, hr = backend.facts.n_layers, receiver.layer, receiver.head
    qkv = {"q": hooks.attn_q(lr), "k": hooks.attn_k(lr), "v": hooks.attn_v(lr)}
    frozen_inputs = [qkv[i] for i in INPUTS if i != receiver.input]  # only the chosen input is recomputed
    run = prepare(backend, pairs, sender_hooks(L) + frozen_inputs, sender_hooks(L))
    z_lr = hooks.attn_z(lr)

    def record(r: PatchRun, group: Sequence[Sender], z_of: dict):
        P = r.n

        def keep(act: torch.Tensor) -> torch.Tensor:  # [S * P, pos, H, d_head]
            for s, snd in enumerate(group):
                z_of[snd] = act[s * P:(s + 1) * P, :, hr].detach().clone()  # [P, pos, d_head]
            return act
        edits = [(name, chain(fn, keep) if name == z_lr else fn)
                 for name, fn in sender_edits(r, group, L, keep=(lr, hr))]
        return edits + [(name, replace(r.stacked(r.ref_cache[name], len(group)))) for name in frozen_inputs]

    def through(r: PatchRun, group: Sequence[Sender], z_of: dict):
        S = len(group)
        received = torch.cat([z_of[snd] for snd in group])  # [S * P, pos, d_head]

        def put(act: torch.Tensor) -> torch.Tensor:  # [S * P, pos, H, d_head]
            act[:, :, hr] = received.to(act.device, act.dtype)
            return act
        frozen = [(hooks.attn_z(layer), replace(r.stacked(r.ref_cache[hooks.attn_z(layer)], S)))
                  for layer in range(L)]
        return [(name, chain(fn, put) if name == z_lr else fn) for name, fn in frozen]
    return run, record, through


def _raw(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, senders: Sequence[Sender],
         patched: torch.Tensor, logit_o: torch.Tensor) -> PatchingRaw:
    """``patched`` [S, P] laid out as a PatchingRaw (layers >= the receiver's: nan)."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    head_logit = torch.full((len(pairs), L, H), float("nan"))
    mlp_logit = torch.full((len(pairs), L), float("nan"))
    for i, snd in enumerate(senders):
        if snd.component == "head":
            head_logit[:, snd.layer, snd.head] = patched[i]
        else:
            mlp_logit[:, snd.layer] = patched[i]
    return PatchingRaw(list(pairs), logit_o, head_logit, mlp_logit)


def cached_head_path_patching(backend: ModelBackend, pairs: Sequence[PromptPair], receiver: Receiver, *,
                              cache=None, progress: ProgressFn | None = None
                              ) -> tuple[list[SenderValue], bool]:
    """Head -> head path patching through the result cache: (per-sender means, computed)."""
    from engine.results import run_cached_rows

    params = {"dtype": backend.facts.dtype, "receiver": str(receiver), "position": "END",
              "steps": "record, then pass on"}

    def compute():
        raw = head_path_patching(backend, pairs, receiver, progress=progress)
        return [v for v in summarize(raw) if v.component in ("head", "mlp") and v.layer < receiver.layer
                and v.metric in ("effect", "logit_diff")], {"receiver": str(receiver), "fallback": raw.fallback or ""}

    out, art, computed = run_cached_rows(backend, pairs, METHOD, params, compute, SenderValue, cache=cache)
    if art.get("fallback"):
        note(art["fallback"])
    return out, computed

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine path-patching --receiver``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """``patch --receiver L.H[:q|k|v]``: every earlier sender's effect through that head's input."""
    model = ctx.model
    receiver = parse_receiver(args.receiver, model.facts.n_layers, model.facts.n_heads)
    pairs = ctx.pairs
    with ctx.progress("head -> head patching") as bar:
        vals, computed = cached_head_path_patching(model, pairs, receiver, cache=ctx.cache, progress=bar)
    out = wide_rows(vals, keep=lambda v: v.group == "*" and v.component in ("head", "mlp"))
    ctx.write_csv(args.out, ctx.with_pins(out))  # each pinned sender's note, when the model has pins
    top = sorted((r for r in out if r["component"] == "head"), key=lambda r: r["logit_diff"])[:5]
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "receiver": str(receiver),
            "senders": len(out), "top_senders": top}


def cli_patch(args, ctx) -> dict:
    """``patch``: path patching to the answer logit, or with ``--receiver`` to that head (:func:`cli`)."""
    if args.receiver is None:
        return patching_cli(args, ctx)
    if args.by != "all" or args.with_prob:
        raise ValueError("--receiver gives one row per sender: drop --by and --with-prob")
    return cli(args, ctx)
