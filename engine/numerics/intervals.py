"""Bootstrap intervals over prompt pairs, a shuffled-label null, and verdicts read off an interval.

Every number the lab reports over a prompt set is a statistic of per-pair results: a mean effect, an accuracy,
an attention share, a share of the total effect.  Its uncertainty is that of the prompt sample, so:

* **Interval.**  The percentile bootstrap over the prompt pairs (:func:`scipy.stats.bootstrap`, ``method=
  "percentile"``): ``RESAMPLES`` resamples of the pairs with replacement, seeded with ``SEED``, the statistic
  recomputed on each, the central ``LEVEL`` of those values.  The statistic is a function of the indices of
  the resampled pairs, so statistics of several per-pair arrays (accuracy before and after a knockout, a share
  of a [pairs, heads] matrix) are resampled together.  Nothing runs the model again: the per-pair results are
  stored with each technique's cached result.
* **Null of a share.**  "The top 5 % of the heads carry this share of the total effect" means something only
  against what the same per-pair effects give when they are *not* tied to particular heads: each pair's row
  of effects is permuted over the heads (independently per pair, ``NULL_DRAWS`` times, seeded) and the share
  recomputed (:func:`shuffled_null`).  A ranking that is one draw of noise shows a share near the null's.
* **Verdict.**  A criterion "x above t" holds when the whole interval lies above t, does not hold when the
  whole interval lies at or below t, and is *inconclusive* (``None``) when the interval straddles t
  (:meth:`Interval.above`, :meth:`Interval.below`; several criteria at once: :func:`all_hold`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95
RESAMPLES = 1000
NULL_DRAWS = 200
SEED = 0
NULL_QUANTILE = 0.95  # the null's upper quantile a share must clear
BATCH_VALUES = 4_000_000  # resampled values one bootstrap batch holds (memory)
#: fewer prompt pairs than this: an interval is wide and moves with the sample -- the pages say so beside it
SMALL_SET = 20


def small_set_note(n: int) -> str | None:
    """A sentence for a result that rests on ``n`` pairs, when they are fewer than :data:`SMALL_SET`, else None."""
    if n >= SMALL_SET:
        return None
    return (f"Only {n} prompt pair{'s' if n != 1 else ''}: every interval here rests on {'them' if n != 1 else 'it'}, "
            f"so it is wide and another sample of prompts could move it (at least {SMALL_SET} pairs are advised).")


@dataclass(frozen=True)
class Interval:
    """A statistic on all pairs (``value``) and its bootstrap interval [low, high] (NaN: fewer than 2 pairs)."""

    value: float
    low: float
    high: float

    def above(self, t: float) -> bool | None:
        """True: the whole interval is above t; False: it is at or below t; None: it straddles t."""
        if not (self.low == self.low and self.high == self.high):
            return None
        return True if self.low > t else False if self.high <= t else None

    def below(self, t: float) -> bool | None:
        """True: the whole interval is below t; False: it is at or above t; None: it straddles t."""
        if not (self.low == self.low and self.high == self.high):
            return None
        return True if self.high < t else False if self.low >= t else None

    def scaled(self, c: float) -> Interval:
        lo, hi = sorted((c * self.low, c * self.high))
        return Interval(c * self.value, lo, hi)

    def text(self, fmt: str = "{:.2f}", unit: str = "") -> str:
        """``32 % [27, 35]``: ``fmt`` for each number (:func:`number_text`: one that rounds to zero prints as 0,
        never -0), ``unit`` after the value."""
        if not (self.low == self.low):
            return number_text(fmt, self.value) + unit + " (one pair: no interval)"
        return f"{number_text(fmt, self.value)}{unit} [{number_text(fmt, self.low)}, {number_text(fmt, self.high)}]"


def number_text(fmt: str, x: float) -> str:
    """``fmt.format(x)``, but a value that rounds to zero at ``fmt``'s precision (-0.001 at ``{:.2f}``) or is -0.0
    prints as 0 does (``0.00``; ``+0.00`` with ``{:+.2f}``), not ``-0.00``."""
    s = fmt.format(x)
    return fmt.format(0.0) if s == fmt.format(-0.0) else s


def share_texts(counts: Sequence[int]) -> list[str]:
    """Each count's share of their total as text, "37.5 %": in whole percent where those add up to 100, else to one
    decimal -- equal counts always print equal shares (a largest-remainder rounding would print five 1s of 8 as
    13 % twice and 12 % three times), and 3 of 8 with five 1s of 8 prints 37.5 % + 5 x 12.5 %, not 38 % + 5 x 12 %
    = 98 %.  [] for no counts or a zero total."""
    total = sum(counts)
    if not counts or total <= 0:
        return []
    exact = [100 * c / total for c in counts]
    whole = [round(x) for x in exact]
    if sum(whole) == 100:
        return [f"{w} %" for w in whole]
    return [f"{x:.1f} %" for x in exact]


def interval(stat: Callable[[np.ndarray], float], n: int, *, resamples: int = RESAMPLES,
             seed: int = SEED) -> Interval:
    """``stat(idx)`` on all ``n`` pairs and its percentile bootstrap interval over resampled pair indices."""
    if n < 1:
        raise ValueError("no prompt pairs")
    value = float(stat(np.arange(n)))
    if n < 2:
        return Interval(value, math.nan, math.nan)
    res = stats.bootstrap((np.arange(n),), lambda idx: stat(idx.astype(int)), vectorized=False,
                          n_resamples=resamples, method="percentile", confidence_level=LEVEL,
                          random_state=np.random.default_rng(seed))
    ci = res.confidence_interval
    return Interval(value, float(ci.low), float(ci.high))


def mean_intervals(x: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) over axis 0 (the pairs) of ``x`` [P, ...], NaN-aware (a NaN is a pair left out),
    every cell from the same resamples.  Fewer than 2 pairs: NaN bounds."""
    x = np.asarray(x, dtype=np.float64)
    mean = np.nanmean(x, 0) if x.shape[0] else np.full(x.shape[1:], np.nan)
    if x.shape[0] < 2:
        nan = np.full(x.shape[1:], np.nan)
        return mean, nan, nan.copy()
    flat = x.reshape(x.shape[0], -1)
    batch = max(1, BATCH_VALUES // flat.size)  # resamples held at once (the draws are the same in any batches)
    res = stats.bootstrap((flat,), lambda s, axis: np.nanmean(s, axis=axis), vectorized=True, axis=0,
                          n_resamples=resamples, method="percentile", confidence_level=LEVEL,
                          random_state=np.random.default_rng(seed), batch=batch)
    ci = res.confidence_interval
    return mean, np.asarray(ci.low).reshape(x.shape[1:]), np.asarray(ci.high).reshape(x.shape[1:])


def top_share(x: np.ndarray, k: int) -> float:
    """Share of sum |mean effect| over the columns of ``x`` [P, N] carried by the k largest columns."""
    a = np.abs(np.nanmean(x, 0))
    total = a.sum()
    return float(np.sort(a)[::-1][:k].sum() / total) if total > 0 else 0.0


def shuffled_null(stat: Callable[[np.ndarray], float], x: np.ndarray, *, draws: int = NULL_DRAWS,
                  seed: int = SEED) -> np.ndarray:
    """``stat`` of ``x`` [P, N] with each pair's row permuted over the columns independently, ``draws`` times."""
    rng = np.random.default_rng(seed)
    return np.array([stat(rng.permuted(x, axis=1)) for _ in range(draws)])


def all_hold(*verdicts: bool | None) -> bool | None:
    """Several criteria at once: False if any fails, True if all hold, else None (inconclusive)."""
    if any(v is False for v in verdicts):
        return False
    return True if all(v is True for v in verdicts) else None
