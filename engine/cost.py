"""What a computation costs before it runs: forward passes counted from the code, seconds estimated here.

The lab's unit of work is the **forward-equivalent** (FE): one right-padded, full-logits forward pass of the
prompt set (``bench/work.py``), weighted by multiply-accumulates per position
(:func:`engine.backends.base.macs_per_position`).  Each heavy technique's module counts what it runs in FE
(``curve_cost`` of :mod:`engine.techniques.knockout_curve`, ``path_patching_cost`` ...): the count follows the
code, and ``tests/integration/test_cost.py`` checks it against the backend's :class:`WorkMeter` after a real run.

Seconds are an **estimate** on this machine: the FE times the measured seconds of one pass of the set.  One
pass is timed once per loaded model (:func:`pass_timing`: two small real forward passes give the fixed cost of
a call and the cost of a position; memoised on the backend object) and scaled by the set's padded positions.
Work that is not a forward pass (a probe's fits) is added by the technique as seconds of its own.

A page asks before it computes anything estimated above :data:`HEAVY_S` (``ui.progress.compute_or_button``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.backends.base import ModelBackend, WorkMeter, macs_per_position
from engine.prompts.pairs import PromptPair

#: above this many estimated seconds, a page shows a button with the cost before it computes
HEAVY_S = 10.0

#: the two timed shapes of :func:`pass_timing`: (rows, positions), and the runs of each (the fastest counts)
SMALL, LARGE = (1, 8), (8, 16)
REPEATS = 2


@dataclass(frozen=True)
class Cost:
    """A computation's cost before it runs: forward-equivalents counted from the code, seconds estimated."""

    forward_equivalents: float  # passes of the set (the lab's unit, as in bench/)
    seconds: float              # an estimate on this machine: the FE x the measured seconds per pass (+ other work)

    @property
    def heavy(self) -> bool:
        """More than :data:`HEAVY_S` estimated seconds: a page asks before it computes."""
        return self.seconds > HEAVY_S

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.forward_equivalents + other.forward_equivalents, self.seconds + other.seconds)

    def label(self) -> str:
        """"estimated: about 40 s, 60 forward passes of the set"."""
        fe = self.forward_equivalents
        passes = ("less than one forward pass" if fe < 0.95 else "one forward pass" if fe < 1.5
                  else f"{fe:.0f} forward passes")
        return f"estimated: about {seconds_text(self.seconds)}, {passes} of the set"


NOTHING = Cost(0.0, 0.0)


def seconds_text(s: float) -> str:
    """"40 s", "3 min", "1.5 h": a duration as a person reads it."""
    if s < 60:
        return f"{max(1, round(s))} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


@dataclass(frozen=True)
class PassTiming:
    """Seconds of a forward pass on this machine: a fixed cost per call and a cost per padded position
    (full logits, so the unembedding is in it)."""

    call_s: float
    position_s: float

    def seconds(self, rows: int, positions: int) -> float:
        """One full-logits pass of ``rows`` prompts padded to ``positions`` tokens."""
        return self.call_s + self.position_s * rows * positions


def pass_timing(backend: ModelBackend) -> PassTiming:
    """The backend's :class:`PassTiming`, measured on first use and kept on the backend object itself
    (``backend.pass_timing``): the fastest of :data:`REPEATS` runs of two small passes, :data:`SMALL` and
    :data:`LARGE`, after one run to warm up.
    The backend's work meter is left as it was."""
    got = backend.__dict__.get("pass_timing")
    if isinstance(got, PassTiming):
        return got
    vocab = min(int(getattr(backend.tokenizer, "vocab_size", 0) or backend.facts.vocab_size), backend.facts.vocab_size)
    ids = torch.arange(LARGE[0] * LARGE[1]).remainder(max(vocab - 1, 1)).view(*LARGE) + 1  # [rows, pos]: any tokens

    def timed(rows: int, positions: int) -> float:
        x = ids[:rows, :positions]
        best = math.inf
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            backend.logits(x, torch.ones_like(x))
            best = min(best, time.perf_counter() - t0)
        return best

    meter = backend.meter
    backend.meter = WorkMeter()
    try:
        timed(*SMALL)  # the first call of a shape pays for its set-up
        small, large = timed(*SMALL), timed(*LARGE)
    finally:
        backend.meter = meter
    n_small, n_large = SMALL[0] * SMALL[1], LARGE[0] * LARGE[1]
    position_s = max((large - small) / (n_large - n_small), 1e-9)
    timing = PassTiming(max(small - position_s * n_small, 0.0), position_s)
    backend.pass_timing = timing
    return timing


def unit_positions(pairs: Sequence[PromptPair]) -> int:
    """Positions of one FE: the set's prompts (X_r) right-padded to the longest."""
    return len(pairs) * max((len(p.ref_ids) for p in pairs), default=0)


def seconds_per_pass(backend: ModelBackend, pairs: Sequence[PromptPair]) -> float:
    """Estimated seconds of one forward-equivalent of ``pairs`` on this machine."""
    return pass_timing(backend).seconds(len(pairs), max((len(p.ref_ids) for p in pairs), default=0))


def estimate(backend: ModelBackend, pairs: Sequence[PromptPair], forward_equivalents: float, *,
             calls: int | None = None, other_s: float = 0.0) -> Cost:
    """The :class:`Cost` of ``forward_equivalents`` passes of ``pairs``: the positions' seconds, the fixed cost
    of ``calls`` forward calls (default: one per FE, at least one) and ``other_s`` seconds of other work."""
    t = pass_timing(backend)
    n_calls = max(1, math.ceil(forward_equivalents)) if calls is None else calls
    s = forward_equivalents * t.position_s * unit_positions(pairs) + n_calls * t.call_s + other_s
    return Cost(float(forward_equivalents), float(s))


def fe_of(backend: ModelBackend, pairs: Sequence[PromptPair], *, body: float, unembed: float = 0.0,
          mlp_rows: float = 0.0) -> float:
    """Forward-equivalents of ``body`` positions through every block, ``unembed`` positions through the final
    norm and the unembedding and ``mlp_rows`` rows through one MLP branch (the END chains), relative to one
    padded full-logits pass of ``pairs`` (``bench/work.py: fe``)."""
    c_body, c_unembed, c_mlp = macs_per_position(backend.facts)
    unit = max(unit_positions(pairs), 1)
    return (body * c_body + unembed * c_unembed + mlp_rows * c_mlp) / (unit * (c_body + c_unembed))


def metered(backend: ModelBackend, pairs: Sequence[PromptPair], meter: WorkMeter) -> float:
    """The forward-equivalents a :class:`WorkMeter` counted (its body positions and unembedded rows)."""
    return fe_of(backend, pairs, body=meter.body_tokens, unembed=meter.unembed_rows)


def end_only_fe(backend: ModelBackend, pairs: Sequence[PromptPair], passes: float = 1.0) -> float:
    """``passes`` END-only passes of the prompts (X_r or X_c: the same lengths): every real token through the
    blocks when batched by length, the unembedding at END only."""
    real = sum(len(p.ref_ids) for p in pairs)
    return passes * fe_of(backend, pairs, body=real, unembed=len(pairs))
