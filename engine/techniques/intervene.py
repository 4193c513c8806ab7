"""Intervene: change chosen components of one prompt's forward pass, read the answer distribution before / after.

On one prompt X (END = its last token, where the answer's first token is predicted), each chosen
component -- a head's output before W_O (``hook_z``, [batch, pos, head, d_head]), an MLP's output
(``hook_mlp_out``, [batch, pos, d_model]), one MLP neuron (``hook_mlp_post``, [batch, pos, d_mlp]) or
the residual stream leaving a block (``hook_resid_post``, [batch, pos, d_model]) -- is changed in one of
five ways, at END only or at every position:

* ``patch`` -- it takes its value on another prompt X' (the prompts aligned at END: X's position
  END - t takes X''s END - t; a position X' lacks keeps X's own value);
* ``scale`` -- multiplied by a factor alpha (1: unchanged, 0: zeroed, -1: flipped);
* ``zero``  -- set to 0;
* ``mean``  -- the knockouts' mean ablation, exactly :func:`engine.techniques.knockout.knocked_out`: its
  mean over a prompt set's counterfactual prompts, END-aligned, at every position (heads and MLPs);
* ``add``   -- a unit direction d added, s |a_END| d, where |a_END| is the component's own norm at END on
  X (s = 1: a vector as long as the activation itself; d_model components: MLPs, the residual stream);
  the direction is a token's unembedding column W_U[:, t] / |W_U[:, t]|, for a number the token the
  model would write first for it after X (:func:`number_token`), or a given vector (``direction``), e.g. a
  number's class-mean or logistic-probe direction over a prompt set (:mod:`engine.techniques.numbers.directions`),
  made unit.

``freeze``: every other head's output is held at its value on X, at every position (Algorithm 1's
frozen heads).  Two of these interventions are ones the lab already defines, and give its numbers:

* patching head L.H **at END from X_c with freeze** is path patching's sender L.H
  (:mod:`engine.techniques.path_patching`: the answer logit ``head_logit[p, L, H]``);
* patching head L.H **at every position from X_c without freeze** is the counterfactual knockout
  (:func:`engine.techniques.knockout.knockout_end` with ``means`` None: the answer-logit margin).

Before and after: the next-token distribution at END (softmax over the whole vocabulary), its top k,
and one watched token's probability and logit (the typed prompt's answer).  Cost: one forward pass
for X (memoised per model and prompt: it also caches X's head outputs for ``freeze``), one for X'
(memoised likewise), one for the intervened pass -- a live change of the strength costs one pass.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.backends.hooks import HookName
from engine.machinery.components import parse_site
from engine.prompts.pairs import PromptError, answer_tokens
from engine.techniques.knockout import Knockout, MeanActivations, TokenProb, knocked_out, top_of

ACTIONS = ("patch", "scale", "zero", "mean", "add")
POSITIONS = ("end", "all")
MAX_STRENGTH = 1000.0  # |alpha| and |s| beyond this are refused (a typo, not an experiment)


@dataclass(frozen=True)
class Target:
    """One component: a head (``3.1``), an MLP (``3.mlp``), a neuron (``3.mlp.120``) or a residual stream
    leaving a block (``3.resid``)."""

    kind: str        # "head" | "mlp" | "neuron" | "resid"
    layer: int
    index: int = -1  # the head or the neuron; -1 for an MLP or a residual stream

    @property
    def name(self) -> str:
        return {"head": f"{self.layer}.{self.index}", "mlp": f"{self.layer}.mlp",
                "neuron": f"{self.layer}.mlp.{self.index}", "resid": f"{self.layer}.resid"}[self.kind]

    def hook(self) -> HookName:
        return {"head": hooks.attn_z, "mlp": hooks.mlp_out, "neuron": hooks.mlp_post,
                "resid": hooks.resid_post}[self.kind](self.layer)


def parse_targets(text: str, n_layers: int, n_heads: int, d_mlp: int | None = None) -> tuple[Target, ...]:
    """``"1.3, 2.mlp, 2.mlp.40, 3.resid"`` -> targets (repeats dropped); PromptError naming the bad part."""
    out: list[Target] = []
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        try:
            out.append(Target(*parse_site(part, n_layers, n_heads, d_mlp, resid=True)))
        except ValueError as e:
            raise PromptError(f"{e} ({part})" if "names no component" not in str(e) else str(e)) from None
    if not out:
        raise PromptError("no component chosen: write e.g. 1.3 (a head), 2.mlp, 2.mlp.40 (a neuron) or 3.resid")
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Intervention:
    """What to do to ``targets``: one action, at END or every position, optionally with the other heads frozen."""

    action: str                      # one of ACTIONS
    targets: tuple[Target, ...]
    positions: str = "end"           # "end" | "all"
    factor: float = 0.0              # scale: alpha
    strength: float = 0.0            # add: s, in units of the component's own norm at END
    source: tuple[int, ...] = ()     # patch: X''s ids
    direction_token: int | None = None  # add: the token whose unembedding column is the direction
    freeze: bool = False             # every other head held at its value on X
    direction: tuple[float, ...] = ()  # add: a d_model vector instead of a token's unembedding (made unit)

    def check(self) -> "Intervention":
        """The intervention, or ValueError saying what is missing or cannot be done."""
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}: choose from {', '.join(ACTIONS)}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, not {self.positions!r}")
        if not self.targets:
            raise ValueError("no component chosen")
        if self.action == "patch" and not self.source:
            raise ValueError("a patch needs the other prompt to take the values from")
        if self.action == "mean" and any(t.kind not in ("head", "mlp") for t in self.targets):
            raise ValueError("mean ablation is defined for heads and MLPs (the knockouts' means); "
                             "zero or scale a neuron or a residual stream instead")
        if self.action == "add":
            if self.direction_token is None and not self.direction:
                raise ValueError("adding a direction needs its token (e.g. a number's unembedding) or a vector")
            if any(t.kind not in ("mlp", "resid") for t in self.targets):
                raise ValueError("a direction (d_model) is added to an MLP's output or a residual stream, "
                                 "not to a head's output before W_O or a neuron")
        if not (abs(self.factor) <= MAX_STRENGTH and abs(self.strength) <= MAX_STRENGTH):
            raise ValueError(f"factor and strength must lie within +-{MAX_STRENGTH:g}")
        return self


@dataclass
class Distribution:
    """The next-token distribution at END: its top k and one watched token."""

    top: list[TokenProb]
    watched_prob: float | None = None
    watched_logit: float | None = None


@dataclass
class InterventionResult:
    """Before and after one intervention on one prompt."""

    before: Distribution
    after: Distribution
    watched: str | None                      # the watched token, as the tokenizer writes it
    forward_passes: int                      # the passes this call ran (memoised ones not counted)
    answer_logit_before: float | None = None  # the watched token's logit (raw) before / after
    answer_logit_after: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"before": [t.__dict__ for t in self.before.top], "after": [t.__dict__ for t in self.after.top],
                "watched": self.watched, "watched_prob_before": self.before.watched_prob,
                "watched_prob_after": self.after.watched_prob, "watched_logit_before": self.before.watched_logit,
                "watched_logit_after": self.after.watched_logit, "forward_passes": self.forward_passes}


def number_token(tokenizer, text: str, number: int) -> int:
    """The first token the model would write for ``number`` after ``text`` (the answer-token rule)."""
    return answer_tokens(tokenizer, text, number).answer_id


# X's and X''s passes, memoised per (model fingerprint, ids, what was cached): a live slider costs one pass
_MEMO: dict[tuple, tuple[torch.Tensor, dict]] = {}
_MEMO_SIZE = 16


def forget() -> None:
    """Empty the memo of the unintervened passes."""
    _MEMO.clear()


def _run(backend: ModelBackend, ids: Sequence[int], names: Sequence[HookName]) -> tuple[torch.Tensor, dict]:
    """(END logits [vocab], the named activations [1, pos, ...]) of one prompt, memoised."""
    key = (backend.facts.fingerprint, tuple(ids), tuple(names))
    if key not in _MEMO:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        lg, cache = backend.run_with_cache(torch.tensor([list(ids)]), None, list(names))
        _MEMO[key] = (lg[0, -1].float(), cache)
    return _MEMO[key]


def _where(positions: str, width: int) -> list[int]:
    return [width - 1] if positions == "end" else list(range(width))


def _aligned(source: torch.Tensor, width: int, at: list[int]) -> tuple[list[int], list[int]]:
    """(positions of X, the END-aligned positions of X' [1, pos', ...]) for ``at``; X''s missing ones dropped."""
    w = source.shape[1]
    keep = [p for p in at if w - width + p >= 0]
    return keep, [w - width + p for p in keep]


def _edit(iv: Intervention, targets: list[Target], width: int, source_cache: dict, direction: torch.Tensor | None
          ) -> Callable[[torch.Tensor], torch.Tensor]:
    """One hook's function: every target of ``targets`` (one hook name) changed at ``iv.positions``."""
    at = _where(iv.positions, width)

    def fn(act: torch.Tensor) -> torch.Tensor:  # [1, pos, ...]
        for t in targets:
            sel = (slice(None),) if t.index < 0 else (t.index,)
            if iv.action == "patch":
                mine, theirs = _aligned(source_cache[t.hook()], width, at)
                if mine:
                    act[(0, mine) + sel] = source_cache[t.hook()][(0, theirs) + sel].to(act.device, act.dtype)
            elif iv.action == "scale":
                act[(0, at) + sel] = act[(0, at) + sel] * iv.factor
            elif iv.action == "zero":
                act[(0, at) + sel] = 0
            elif iv.action == "add":  # s times the component's own END norm, along d
                scale = iv.strength * act[0, width - 1].float().norm()
                act[0, at] = act[0, at] + (scale * direction.to(act.device)).to(act.dtype)
        return act
    return fn


def _freeze(frozen: torch.Tensor, keep: Sequence[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Every head's output becomes X's (``frozen`` [1, pos, H, d_head]) but the heads ``keep``."""
    def fn(act: torch.Tensor) -> torch.Tensor:
        kept = act[:, :, list(keep)].clone()
        act[...] = frozen.to(act.device, act.dtype)
        act[:, :, list(keep)] = kept
        return act
    return fn


def _distribution(backend: ModelBackend, logits: torch.Tensor, watch: int | None, k: int) -> Distribution:
    probs = torch.softmax(logits, -1)
    if watch is None:
        return Distribution(top_of(backend, probs, k))
    return Distribution(top_of(backend, probs, k), float(probs[watch]), float(logits[watch]))


@torch.no_grad()
def intervened_logits(backend: ModelBackend, ids: Sequence[int], iv: Intervention, *,
                      means: MeanActivations | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(END logits before [vocab], END logits after [vocab]) of ``ids`` under ``iv`` (:func:`intervene`'s engine)."""
    iv = iv.check()
    f = backend.facts
    width = len(ids)
    z_names = [hooks.attn_z(layer) for layer in range(f.n_layers)] if iv.freeze else []
    before, own = _run(backend, ids, z_names)
    source_cache: dict = {}
    if iv.action == "patch":
        _, source_cache = _run(backend, iv.source, sorted({t.hook() for t in iv.targets}))
    direction = None
    if iv.action == "add" and iv.direction:
        if len(iv.direction) != f.d_model:
            raise ValueError(f"the direction has {len(iv.direction)} entries, the model's residual stream "
                             f"{f.d_model}")
        vec = torch.tensor(iv.direction, dtype=torch.float64)
        if not torch.isfinite(vec).all() or float(vec.norm()) == 0.0:
            raise ValueError("the direction must be a finite, non-zero vector")
        direction = (vec / vec.norm()).float()  # [d_model], unit length
    elif iv.action == "add":
        w_u, _ = backend.unembed()  # [d_model, vocab]
        col = w_u[:, iv.direction_token].float()
        direction = col / col.norm().clamp_min(1e-12)  # [d_model], unit length
    by_hook: dict[HookName, list[Target]] = {}
    for t in iv.targets:
        by_hook.setdefault(t.hook(), []).append(t)
    edits: list[tuple[HookName, Callable]] = []
    if iv.freeze:
        for layer in range(f.n_layers):
            mine = [t.index for t in iv.targets if t.kind == "head" and t.layer == layer]
            fns = [_freeze(own[hooks.attn_z(layer)], mine)]
            if iv.action != "mean" and hooks.attn_z(layer) in by_hook:
                fns.append(_edit(iv, by_hook.pop(hooks.attn_z(layer)), width, source_cache, direction))
            edits.append((hooks.attn_z(layer), _chain(fns)))
    if iv.action != "mean":
        edits += [(name, _edit(iv, ts, width, source_cache, direction)) for name, ts in by_hook.items()]
    x, end = torch.tensor([list(ids)]), torch.tensor([width - 1])
    with ExitStack() as stack:
        if iv.action == "mean":
            if means is None:
                raise ValueError("mean ablation needs the prompt set's mean activations (knockout.mean_activations)")
            ko = Knockout(tuple((t.layer, t.index) for t in iv.targets if t.kind == "head"),
                          tuple(t.layer for t in iv.targets if t.kind == "mlp"))
            stack.enter_context(knocked_out(backend, ko, means, [None], [width - 1]))
        stack.enter_context(backend.hooks(edits))
        after = backend.end_logits(x, None, end)[0].float()
    return before, after


def _chain(fns: Sequence[Callable]) -> Callable:
    def fn(act):
        for g in fns:
            act = g(act)
        return act
    return fn


def intervene(backend: ModelBackend, ids: Sequence[int], iv: Intervention, *, watch: int | None = None,
              means: MeanActivations | None = None, k: int = 5) -> InterventionResult:
    """The answer distribution of ``ids`` before and after ``iv`` (top ``k``; ``watch``: a token followed too)."""
    calls = backend.meter.forward_calls
    before, after = intervened_logits(backend, ids, iv, means=means)
    watched = None if watch is None else str(backend.tokenizer.convert_ids_to_tokens([watch])[0])
    b, a = _distribution(backend, before, watch, k), _distribution(backend, after, watch, k)
    return InterventionResult(b, a, watched, backend.meter.forward_calls - calls,
                              b.watched_logit, a.watched_logit)


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine intervene``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """``--text``'s top-k next tokens before / after one intervention (not cached: one to three forward passes)."""
    from engine.techniques.promptlab import check_typed_text, typed_pair
    model = ctx.model
    f = model.facts
    targets = parse_targets(args.components, f.n_layers, f.n_heads, f.d_mlp)
    typed = ctx.typed(args.text)
    source: tuple[int, ...] = ()
    if args.action == "patch":
        source = tuple(check_typed_text(model.tokenizer, args.source).ids if args.source
                       else typed_pair(model.tokenizer, args.text).cf_ids)
    token, direction, layer = None, (), None
    if args.action == "add":
        if args.number is None:
            raise ValueError("--action add needs --number N: the number whose direction is added")
        if args.direction != "unembedding":
            from engine.techniques.numbers.directions import number_direction
            layer = targets[0].layer if args.direction_layer is None else args.direction_layer
            vec, _ = number_direction(model, ctx.pairs, layer, args.number, args.direction)
            direction = tuple(float(v) for v in vec)
        else:
            token = number_token(model.tokenizer, args.text, args.number)
    iv = Intervention(args.action, targets, args.positions, args.factor, args.strength, source, token,
                      args.freeze, direction).check()
    means = None
    if args.action == "mean":
        from engine.techniques.knockout import mean_activations
        means = mean_activations(model, ctx.pairs)
    watch = typed.answer.answer_id if typed.answer is not None else None
    res = intervene(model, typed.ids, iv, watch=watch, means=means, k=args.k)
    out = {"text": args.text, **ctx.typed_summary(typed), "components": [t.name for t in targets],
           "action": args.action, "positions": args.positions, "freeze": args.freeze,
           **({"factor": args.factor} if args.action == "scale" else {}),
           **({"strength": args.strength, "number": args.number, "direction": args.direction}
              if args.action == "add" else {}),
           **({"direction_layer": layer} if layer is not None else {}),
           **({"source": args.source or "the typed prompt's counterfactual"} if args.action == "patch" else {}),
           **res.to_json()}
    ctx.write_json(args.out, out)
    return out
