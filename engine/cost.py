"""What a computation costs before it runs: its forward work counted from the code, its seconds estimated here.

Each heavy technique's module counts the forward work it will do (:class:`Work`: calls, positions through the
blocks, positions unembedded, MLP-branch rows of the END chains) by walking the same batches, chunks and passes
as its code without running them (``path_patching_work``, ``knockout_end_work`` ...);
``tests/integration/test_cost.py`` checks each count against the backend's :class:`WorkMeter` after a real run.
The work is reported in the lab's unit, the **forward-equivalent** (FE): one right-padded, full-logits forward
pass of the prompt set, positions weighted by their multiply-accumulates
(:func:`engine.backends.base.macs_per_position`, as ``bench/work.py`` counts).

Seconds are an **estimate** on this machine: a forward call's fixed cost, a position's and an END-chain MLP row's
are timed per loaded model (:func:`pass_timing`: small END-only passes and one MLP branch; memoised on the backend
object, timed again by :func:`retime` when old) and applied to the counted work.  Work that is not a forward pass (a
probe's fits) is added by the technique in seconds.  Every computation a page times corrects the estimates that
follow (:func:`observe`, per view and over all): the ratio of measured to estimated seconds, which holds what the
passes' timing misses -- the work around the passes and the machine's load.

A page asks before it computes anything estimated above :data:`HEAVY_S` (``ui.progress.compute_or_button``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.backends.base import ModelBackend, WorkMeter, macs_per_position
from engine.prompts.pairs import PromptPair

#: above this many estimated seconds, a page shows a button with the cost before it computes
HEAVY_S = 10.0

#: the two timed shapes of :func:`pass_timing`: (rows, positions), and the runs of each (the fastest counts): at
#: least REPEATS, more while they take under TIMING_BUDGET_S together, at most MAX_REPEATS (a busy machine's spikes)
SMALL, LARGE = (1, 8), (32, 16)
REPEATS, MAX_REPEATS, TIMING_BUDGET_S = 2, 6, 0.5
#: rows of the timed MLP-branch call (the END chains run thousands a call)
MLP_ROWS = 1024

#: a backward pass through the blocks costs about twice the forward pass (two matrix products per one)
BACKWARD_FACTOR = 2


@dataclass(frozen=True)
class Cost:
    """A computation's cost before it runs: forward-equivalents counted from the code, seconds estimated."""

    forward_equivalents: float  # passes of the set (the lab's unit, as in bench/)
    seconds: float              # an estimate on this machine (PassTiming.seconds x observed_factor, + other work)

    @property
    def heavy(self) -> bool:
        """More than :data:`HEAVY_S` estimated seconds: a page asks before it computes."""
        return self.seconds > HEAVY_S

    def label(self) -> str:
        """"estimated: about 40 s, 60 forward passes of the set"."""
        fe = self.forward_equivalents
        passes = ("less than one forward pass" if fe < 0.95 else "one forward pass" if fe < 1.5
                  else f"{fe:.0f} forward passes")
        return f"estimated: about {seconds_text(self.seconds)}, {passes} of the set"


@dataclass(frozen=True)
class Work:
    """Forward work a computation does, counted from its code before it runs: what the backend's
    :class:`WorkMeter` counts (``calls``, ``body`` positions through every block, ``unembed`` positions through
    the final norm and the unembedding, ``layers`` positions times blocks of the passes that stop after a block),
    ``mlp_rows``, rows through one MLP branch (the END chains), and ``backward``, positions a backward pass carries
    back through every block (attribution patching's gradients; counted as :data:`BACKWARD_FACTOR` forward
    positions each), and ``attention``, positions through one block's attention only (a block run alone that
    stops there: one block less its MLP branch)."""

    calls: int = 0
    body: int = 0
    unembed: int = 0
    mlp_rows: int = 0
    backward: int = 0
    layers: int = 0
    attention: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.calls + other.calls, self.body + other.body, self.unembed + other.unembed,
                    self.mlp_rows + other.mlp_rows, self.backward + other.backward, self.layers + other.layers,
                    self.attention + other.attention)

    def __mul__(self, k: int) -> Work:
        return Work(self.calls * k, self.body * k, self.unembed * k, self.mlp_rows * k, self.backward * k,
                    self.layers * k, self.attention * k)

    def forward_body(self, n_layers: int) -> float:
        """Positions through every block: a backward position counted as :data:`BACKWARD_FACTOR` of them, a
        position through one block of a stopped pass (or its attention: its MLP branch is taken off in
        :meth:`fe`) as 1 / ``n_layers``."""
        return self.body + BACKWARD_FACTOR * self.backward + (self.layers + self.attention) / max(n_layers, 1)

    def fe(self, backend: ModelBackend, pairs: Sequence[PromptPair]) -> float:
        """Forward-equivalents of this work, one padded full-logits pass of ``pairs`` = 1."""
        return fe_of(backend, pairs, body=self.forward_body(backend.facts.n_layers), unembed=self.unembed,
                     mlp_rows=self.mlp_rows - self.attention)


NO_WORK = Work()


def one_pass(rows: int, width: int, unembedded: int | None = None) -> Work:
    """One forward call of ``rows`` prompts padded to ``width``, ``unembedded`` positions unembedded (default: one
    per row, the END-only or one-position passes)."""
    return Work(1, rows * width, rows if unembedded is None else unembedded)


def pass_upto(backend: ModelBackend, rows: int, width: int, layer: int) -> Work:
    """One pass that reads block ``layer``'s activations (``ModelBackend.activations_upto``): it stops after that
    block where the backend :attr:`stops_early`, else it is a whole pass with one position unembedded per row."""
    if backend.stops_early:
        return Work(1, layers=rows * width * (layer + 1))
    return one_pass(rows, width)


def block_pass(rows: int, width: int, attention_only: bool = False) -> Work:
    """One block run alone on ``rows`` streams of ``width`` positions (``ModelBackend.block_activations``);
    ``attention_only``: stopped in its attention."""
    return Work(1, attention=rows * width) if attention_only else Work(1, layers=rows * width)


def padded_passes(seqs: Sequence[Sequence[int]], batch_size: int, unembedded_per_row: int | None = 1) -> Work:
    """Consecutive padded batches of ``batch_size`` of ``seqs``, ``unembedded_per_row`` positions each unembedded
    (None: every position, full logits)."""
    w = NO_WORK
    for s in range(0, len(seqs), batch_size):
        chunk = seqs[s:s + batch_size]
        width = max(len(x) for x in chunk)
        w += one_pass(len(chunk), width, len(chunk) * (width if unembedded_per_row is None else unembedded_per_row))
    return w


def seconds_text(s: float) -> str:
    """"40 s", "3 min", "1.5 h": a duration as a person reads it."""
    if s < 60:
        return f"{max(1, round(s))} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


@dataclass(frozen=True)
class PassTiming:
    """Seconds of forward work on this machine: a fixed cost per call, the cost of one position through every block
    (END-only passes, the lab's common case; the unembedding weighted by its multiply-accumulates against a
    position's, :func:`engine.backends.base.macs_per_position`) and the cost of one row through an MLP branch on its
    own (the END chains: thousands of rows a call, cheaper per multiply-accumulate than a pass's positions)."""

    call_s: float
    position_s: float
    mlp_row_s: float | None = None  # None: not timed (a backend without the branch), weighted like positions

    def seconds(self, backend: ModelBackend, work: Work) -> float:
        """Estimated seconds of ``work`` on ``backend``."""
        c_body, c_unembed, c_mlp = macs_per_position(backend.facts)
        positions = work.forward_body(backend.facts.n_layers) + work.unembed * c_unembed / max(c_body, 1.0)
        mlp = (work.mlp_rows * self.mlp_row_s if self.mlp_row_s is not None
               else work.mlp_rows * c_mlp / max(c_body, 1.0) * self.position_s)
        return work.calls * self.call_s + positions * self.position_s + mlp


def pass_timing(backend: ModelBackend, *, again: bool = False) -> PassTiming:
    """The backend's :class:`PassTiming`, measured on first use and kept on the backend object itself
    (``backend.pass_timing``): the fastest of a few END-only passes of :data:`SMALL` and of :data:`LARGE` prompts
    (rows, positions) after one to warm up -- the fixed cost and the slope follow from the two -- and of a few calls of
    one MLP branch on :data:`MLP_ROWS` rows.  ``again``: measured anew, each figure the faster of the two timings (a
    first timing taken while other work loaded the machine is corrected).  The backend's work meter is left as it
    was."""
    got = backend.__dict__.get("pass_timing")
    if isinstance(got, PassTiming) and not again:
        return got
    vocab = min(int(getattr(backend.tokenizer, "vocab_size", 0) or backend.facts.vocab_size), backend.facts.vocab_size)
    ids = torch.arange(LARGE[0] * LARGE[1]).remainder(max(vocab - 1, 1)).view(*LARGE) + 1  # [rows, pos]: any tokens

    def fastest(run) -> float:
        best, spent, n = math.inf, 0.0, 0
        while n < REPEATS or (n < MAX_REPEATS and spent < TIMING_BUDGET_S):
            t0 = time.perf_counter()
            run()
            took = time.perf_counter() - t0
            best, spent, n = min(best, took), spent + took, n + 1
        return best

    def timed(rows: int, positions: int) -> float:
        x = ids[:rows, :positions]
        end = torch.full((rows,), positions - 1)
        return fastest(lambda: backend.end_logits(x, None, end))

    def mlp_rows() -> float | None:  # seconds of one row through layer 0's MLP branch, MLP_ROWS rows a call
        try:
            x = torch.zeros(MLP_ROWS, backend.facts.d_model, dtype=getattr(torch, backend.facts.dtype),
                            device=backend.device)
            backend.mlp_branch(0, x)  # its first call pays for its set-up
            return fastest(lambda: backend.mlp_branch(0, x)) / MLP_ROWS
        except (AttributeError, NotImplementedError, RuntimeError, TypeError, ValueError, KeyError):
            return None

    meter = backend.meter
    backend.meter = WorkMeter()
    try:
        timed(*SMALL)  # the first call of a shape pays for its set-up
        small, large = timed(*SMALL), timed(*LARGE)
    finally:
        backend.meter = meter
    n_small, n_large = SMALL[0] * SMALL[1], LARGE[0] * LARGE[1]
    position_s = max((large - small) / (n_large - n_small), 1e-9)
    timing = PassTiming(max(small - position_s * n_small, 0.0), position_s, mlp_rows())
    if isinstance(got, PassTiming):
        timing = PassTiming(min(got.call_s, timing.call_s), min(got.position_s, timing.position_s),
                            got.mlp_row_s if timing.mlp_row_s is None else timing.mlp_row_s if got.mlp_row_s is None
                            else min(got.mlp_row_s, timing.mlp_row_s))
    backend.pass_timing = timing
    backend.pass_timed_at = time.monotonic()
    return timing


#: a heavy verdict retimes the passes first when their timing is older than this (seconds)
RETIME_AFTER_S = 120.0


def retime(backend: ModelBackend) -> bool:
    """Time the passes again (:func:`pass_timing` ``again``) when the timing is older than :data:`RETIME_AFTER_S`,
    before a page asks for a button on its strength; True when the new timing is faster (estimate again)."""
    at = backend.__dict__.get("pass_timed_at")
    if at is None or time.monotonic() - at < RETIME_AFTER_S:
        return False
    old = pass_timing(backend)
    return pass_timing(backend, again=True) != old


def unit_positions(pairs: Sequence[PromptPair]) -> int:
    """Positions of one FE: the set's prompts (X_r) right-padded to the longest."""
    return len(pairs) * max((len(p.ref_ids) for p in pairs), default=0)


def seconds_per_pass(backend: ModelBackend, pairs: Sequence[PromptPair]) -> float:
    """Estimated seconds of one forward-equivalent of ``pairs`` (one padded full-logits pass) on this machine."""
    width = max((len(p.ref_ids) for p in pairs), default=0)
    return pass_timing(backend).seconds(backend, one_pass(len(pairs), width, len(pairs) * width))


def estimate(backend: ModelBackend, pairs: Sequence[PromptPair], work: Work, *, other_s: float = 0.0) -> Cost:
    """The :class:`Cost` of ``work``: its forward-equivalents in passes of ``pairs``, and its estimated seconds on
    this machine -- :meth:`PassTiming.seconds` plus ``other_s`` seconds of other work (a probe's fits), times
    :func:`observed_factor`."""
    seconds = (pass_timing(backend).seconds(backend, work) + other_s) * observed_factor(backend)
    return Cost(work.fe(backend, pairs), seconds)


def cost_of(backend: ModelBackend, counted: tuple[Work, Sequence[PromptPair]]) -> Cost:
    """The :class:`Cost` of a work function's (work, the pairs it is counted in passes of)."""
    work, pairs = counted
    return estimate(backend, pairs, work)


#: how far one observation moves the factor (in log space), and the factor's bounds
OBSERVE_WEIGHT, FACTOR_RANGE = 0.5, (0.05, 30.0)
#: the factor before any observation: the timed passes leave out the work around a technique's passes, as much again
#: on the bundled model (its accuracy table, 400 prompts: estimated 5.3 s from the passes alone, took 8.4 s)
PRIOR_FACTOR = 2.0
#: estimates shorter than this teach nothing (a call's jitter)
OBSERVE_MIN_S = 0.3


def observed_factor(backend: ModelBackend, kind: str | None = None) -> float:
    """Measured seconds over estimated seconds of this backend's recent computations (of one ``kind``, a page's
    view; None: of all): what the timed passes miss -- the work around the forward passes (bootstrap intervals, hooks'
    bookkeeping, fits) and the machine's load since they were timed.  The factor of all is :data:`PRIOR_FACTOR`
    before any observation.  A kind not measured yet takes the factor of all, but never less than the prior: what
    one view's passes miss says little about another's (the Atlas's attribution gradients, per pair and layer, take
    several times what their passes count), and a view never measured is better asked for than overrun -- a faster
    machine than the prior's shows in the kind's own factor once it has run.  Kept on the backend object itself
    (``backend.cost_factors``)."""
    factors = backend.__dict__.get("cost_factors") or {}
    every = float(factors.get(None, PRIOR_FACTOR))
    if kind is None:
        return every
    return float(factors[kind]) if kind in factors else max(every, PRIOR_FACTOR)


def for_kind(backend: ModelBackend, cost: Cost, kind: str) -> Cost:
    """``cost`` (estimated with the factor of all computations) with the factor measured on ``kind`` instead."""
    return Cost(cost.forward_equivalents, cost.seconds * observed_factor(backend, kind) / observed_factor(backend))


def observe(backend: ModelBackend, cost: Cost, seconds: float, kind: str | None = None) -> None:
    """A computation estimated at ``cost`` (by :func:`estimate`: the factor of all) took ``seconds``: move the factor
    of all and that of ``kind`` towards the ratio of ``seconds`` to the passes' own estimate (a geometric mean
    weighted :data:`OBSERVE_WEIGHT`, within :data:`FACTOR_RANGE`)."""
    if cost.seconds < OBSERVE_MIN_S or seconds <= 0:
        return
    ratio = seconds / (cost.seconds / observed_factor(backend))  # measured over the passes' own estimate
    factors = dict(backend.__dict__.get("cost_factors") or {})
    for k in dict.fromkeys((None, kind)):
        old = observed_factor(backend, k)
        new = math.exp((1 - OBSERVE_WEIGHT) * math.log(old) + OBSERVE_WEIGHT * math.log(ratio))
        factors[k] = float(min(max(new, FACTOR_RANGE[0]), FACTOR_RANGE[1]))
    backend.cost_factors = factors


def fe_of(backend: ModelBackend, pairs: Sequence[PromptPair], *, body: float, unembed: float = 0.0,
          mlp_rows: float = 0.0) -> float:
    """Forward-equivalents of ``body`` positions through every block, ``unembed`` positions through the final
    norm and the unembedding and ``mlp_rows`` rows through one MLP branch (the END chains), relative to one
    padded full-logits pass of ``pairs`` (``bench/work.py: fe``)."""
    c_body, c_unembed, c_mlp = macs_per_position(backend.facts)
    unit = max(unit_positions(pairs), 1)
    return (body * c_body + unembed * c_unembed + mlp_rows * c_mlp) / (unit * (c_body + c_unembed))


def metered(meter: WorkMeter) -> Work:
    """What a :class:`WorkMeter` counted, as :class:`Work` (it counts no MLP-branch rows)."""
    return Work(meter.forward_calls, meter.body_tokens, meter.unembed_rows, layers=meter.layer_tokens,
                attention=meter.attention_tokens)


def unless_cached(probe: Callable[[], object], work: Callable[[], Work]) -> Work:
    """``work()``, or nothing when ``probe()`` -- a cached computation -- finds its result in the cache (it runs under
    ``engine.results.cache_only``: a miss computes nothing)."""
    from engine.results import NotCached, cache_only
    try:
        with cache_only():
            probe()
    except NotCached:
        return work()
    return NO_WORK
