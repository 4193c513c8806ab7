"""The paper's findings checked on a model: one small function per finding, each giving the lab's number and
the verdict by its stated criterion (the criteria are listed in :mod:`engine.findings.paper`).

Every check takes an :class:`Evidence` -- the model, its correctly answered prompt pairs, the cache and what
the other findings need (the same problems in other formats, exponentiation, GSM8K, a second model, the
newest fine-tuning jobs) -- and returns a :class:`Verdict`.  The path-patching table that most checks start
from is computed once, by the first check that asks for it.

Every computed number carries its 95 % bootstrap interval over the prompt pairs (:mod:`engine.numerics.
intervals`, from the per-pair results each technique stores with its cached result: no extra forward pass),
and a criterion is read off the interval: *holds* when the whole interval is on the finding's side of the
threshold, *does not hold* when it is wholly on the other side, *inconclusive* (``holds`` None with a number)
when it straddles it.  Every criterion is a share, a cosine or a relative change: the same on any logit scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from engine.numerics.intervals import NULL_QUANTILE, Interval, all_hold, interval
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.knockout_curve import KNOCKOUT_DRAWS, KNOCKOUT_K
from engine.techniques.path_patching import TOP_HEADS, head_sparsity

SPARSE_SHARE = TOP_HEADS  # "a small fraction (< 5%) of attention heads": sparsity and the knockout's k
TOP_DROP, RANDOM_DROP = 0.50, 0.10
ATTENTION_SHARE = 0.50
TOP_READERS = 5
MIN_PAIRS = 8  # fewer correctly answered prompts than this: nothing to analyse
PRECISE_SHARE = 0.90
TASK_FOR_SFT = "arithmetic (held-out split)"
#: the words of a note where fine-tuning can teach the model what it lacks (the Paper page says where)
CAN_TEACH = "fine-tuning can teach it"


@dataclass(frozen=True)
class Verdict:
    lab: str              # the lab's number on this model and set, with its interval ("" when not computed)
    holds: bool | None    # None: inconclusive (the interval straddles the criterion) or not computed (no ``lab``)
    note: str             # the criterion, or why there is no number
    pairs: str = ""       # what the number (and its interval) rests on: "33 pairs", "40 GSM8K questions" ...


def pairs_text(n: int, what: str = "pairs") -> str:
    """``n`` pairs, with the small-set note when they are few (:func:`~engine.numerics.intervals.small_set_note`)."""
    from engine.numerics.intervals import SMALL_SET
    return f"{n} {what}" + (f" (few: under {SMALL_SET}, the interval is wide)" if n < SMALL_SET else "")


@dataclass
class Evidence:
    """What the checks read.  ``format_pairs``: {format: correctly answered pairs} of the same problems in other
    formats; ``power_pairs`` / ``gsm8k_pairs``: the correctly answered exponentiation and GSM8K pairs
    (``gsm8k_pairs`` None: the data are not available); ``second``: (name, a function giving the path-patching
    table of a second model); ``sft``: a function giving {method: gain in points} of the newest finished
    fine-tuning jobs, or a sentence saying why not; ``answered``: every pair of ``pairs``, ``power_pairs`` and
    ``gsm8k_pairs`` is one the plain model answers right (the filter kept it), so a knockout row's accuracy before
    the knockout is 100 % by construction and is not evaluated again (False: ``reproduce --keep-all``'s every
    pair; then it is); ``progress``: the running check's progress callback."""

    model: Any
    pairs: Sequence[PromptPair]
    cache: Any
    format_pairs: dict[str, Sequence[PromptPair]] = field(default_factory=dict)
    power_pairs: Sequence[PromptPair] = ()
    gsm8k_pairs: Sequence[PromptPair] | None = None
    second: tuple[str, Callable[[], Any]] | None = None
    sft: Callable[[], dict[str, float] | str] | None = None
    answered: bool = True
    progress: ProgressFn | None = None
    #: the other sets (a format of FORMATS, "power") the set's counterfactual kind cannot make, and why
    unbuilt: dict[str, str] = field(default_factory=dict)
    _table: Any = field(default=None, init=False, repr=False)  # the path-patching table, once computed

    @property
    def table(self):
        """The path-patching table of ``pairs`` (computed by the first check that reads it)."""
        if self._table is None:
            from engine.techniques.path_patching import cached_path_patching
            self._table, _ = cached_path_patching(self.model, self.pairs, cache=self.cache, progress=self.progress)
        return self._table

    def readers(self) -> list[tuple[int, int]]:
        """The top heads whose attention the attention checks read."""
        return [(a, b) for a, b, _ in self.table.top_heads(TOP_READERS)]


def rel(after: float, before: float) -> float:
    return (after - before) / before if before else 0.0


def rel_interval(before: np.ndarray, after: np.ndarray) -> Interval:
    """The relative change of the accuracy, (after - before) / before, over pairs: ``before`` [P] and
    ``after`` [P] or [draws, P] (then the mean over the draws) of 0/1 per pair."""
    def stat(idx):
        b = before[idx].mean()
        return (after[..., idx].mean() - b) / b if b else 0.0
    return interval(stat, before.shape[-1])


def before_and_after(ev: Evidence, pairs: Sequence[PromptPair], ko) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``pairs`` the model answers right ([P] 0/1 each) before and after the knockout ``ko`` (mean
    ablation over the pairs' X_c); before is all right when ``ev.answered`` (the filter kept them)."""
    from engine.techniques.knockout import Knockout, knockout_correct, mean_activations
    kos = [ko] if ev.answered else [Knockout(), ko]
    right = knockout_correct(ev.model, pairs, kos, mean_activations(ev.model, pairs)).double().numpy()
    return (np.ones(len(pairs)) if ev.answered else right[0]), right[-1]


def pct(iv: Interval, fmt: str = "{:+.0f}") -> str:
    return iv.scaled(100).text(fmt, " %")


def sparse_heads(table, who: str = "") -> Verdict:
    s = head_sparsity(table.per_pair)
    metric = table.ranking_metric()  # the lab's ranking (the Path patching page's): effect, or logit_diff
    top = ", ".join(f"{a}.{b}" for a, b, _ in table.top_heads(3, metric))
    return Verdict(f"{who}{s.text()}; top by {metric}: {top}", s.holds(),
                   f"holds when the interval of the top {100 * TOP_HEADS:.0f} % of the heads' share of all heads' "
                   f"|effect| (answer-logit difference, every pair) lies above the {NULL_QUANTILE:.0%} quantile of "
                   f"the same share with each pair's head labels shuffled (the share itself at or below it: "
                   f"does not hold; only the interval's lower end below it: inconclusive). Encodes §4.1 (i): "
                   f"\"Only a small number of heads have a noteworthy influence on the output\" -- a share, so "
                   f"the same on every logit scale")


def share_interval(per_pair: np.ndarray, heads: Sequence[tuple[int, int]]) -> Interval:
    """The mean over ``heads`` and pairs of each pair's END-row share on operands + operator ([P, L, H])."""
    x = per_pair[:, [a for a, _ in heads], [b for _, b in heads]]  # [P, k]
    return interval(lambda idx: float(x[idx].mean()), x.shape[0])


def key_heads(ev: Evidence) -> Verdict:
    """Fig. 2 / 15: few heads matter."""
    return replace(sparse_heads(ev.table), pairs=pairs_text(len(ev.pairs)))


def knockout(ev: Evidence) -> Verdict:
    """Fig. 3: the top heads' knockout collapses accuracy, random heads' does not."""
    from engine.techniques.knockout_curve import cached_knockout_points
    f = ev.model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(a, b) for a, b, _ in ev.table.top_heads(k_max)]
    k_eval = min(k_max, max(1, round(SPARSE_SHARE * f.n_layers * f.n_heads)))  # the top 5 % of the heads
    points, right = cached_knockout_points(ev.model, ev.pairs, ranked, (k_eval,) if ev.answered else (0, k_eval),
                                           k_max=k_max, draws=KNOCKOUT_DRAWS, cache=ev.cache, progress=ev.progress)
    at = points[-1]
    base = np.ones(len(ev.pairs)) if ev.answered else right[0, 0]  # [P]: k = 0
    top, rand = rel_interval(base, right[-1, 0]), rel_interval(base, right[-1, 1:])
    return Verdict(f"top-{at.k} {pct(top)}, random {pct(rand)} (from {100 * base.mean():.0f} %)",
                   all_hold(top.below(-TOP_DROP), rand.above(-RANDOM_DROP)),
                   f"holds when the interval of the top-{at.k} heads' relative accuracy change lies below "
                   f"-{TOP_DROP:.0%} and that of {at.k} random heads (mean of {KNOCKOUT_DRAWS} draws) above "
                   f"-{RANDOM_DROP:.0%}. Encodes §4.1: \"the performance of the model drops sharply in "
                   f"'effect-rank', while keeping stable (relatively minor effect within 2%) in 'random-rank'\" "
                   f"(about -70 % in the paper)", pairs_text(len(ev.pairs)))


def faithfulness(ev: Evidence) -> Verdict:
    """Beyond the paper (MIB): the circuits of the exact ranking beat random circuits of the same sizes."""
    from engine.techniques.faithfulness import cached_faithfulness, verdict_text
    table, _ = cached_faithfulness(ev.model, ev.pairs, cache=ev.cache, progress=ev.progress)
    lab, holds = verdict_text(table)
    return Verdict(lab, holds,
                   "holds when the interval of the exact ranking's CPR minus the random ranking's (the same "
                   "resampled pairs) lies above 0: keeping the top path-patching components, and giving every other "
                   "one its value on the pair's own counterfactual X_c (MIB's counterfactual ablation), keeps more "
                   "of the answer logit than keeping as many random ones, over MIB's sizes "
                   "(0.1 % ... 100 %). Extends §4.1's Fig. 3 from the heads one at a time to the circuit as a whole",
                   pairs_text(len(ev.pairs)))


def attention(ev: Evidence) -> Verdict:
    """Fig. 5: the key heads read the operands and the operator."""
    from engine.techniques.attention import cached_problem_share
    readers = ev.readers()
    per_pair = cached_problem_share(ev.model, ev.pairs, cache=ev.cache, progress=ev.progress)  # [P, L, H]
    share = share_interval(per_pair, readers)
    return Verdict(f"top-{len(readers)} heads {pct(share, '{:.0f}')} on operands + operator "
                   f"(all heads {100 * float(per_pair.mean()):.0f} %)",
                   share.above(ATTENTION_SHARE),
                   f"holds when the interval of the top-{len(readers)} heads' END-row attention on the operand "
                   f"and operator tokens lies above {ATTENTION_SHARE:.0%}. Encodes §5.2: the key heads "
                   f"\"particularly attend to the operands and operators\"", pairs_text(len(ev.pairs)))


def mlps(ev: Evidence) -> Verdict:
    """Fig. 6 / 13 / 14: a later MLP writes the answer."""
    from engine.techniques.mlp_projections import answer_mlp, cached_answer_cosines
    f = ev.model.facts
    cos_c, cos_o, null = cached_answer_cosines(ev.model, ev.pairs, cache=ev.cache, progress=ev.progress)
    best, c, gap = answer_mlp(cos_c, cos_o)
    return Verdict(f"MLP {best} of {f.n_layers} most aligned with C: cos {c.text()} vs "
                   f"{float(cos_o[:, best].mean()):.2f} for other numbers (gap {gap.text('{:+.2f}')}; "
                   f"random directions up to {float(null[best]):.2f})",
                   (best >= f.n_layers // 2) and all_hold(c.above(float(null[best])), gap.above(0.0)),
                   "holds when the MLP most aligned with the answer lies in the second half of the layers, the "
                   "interval of its cosine with W_U[C] lies above the 95th percentile of random directions' and "
                   "the interval of its gap over the other numbers above 0. Encodes §5.2 / Fig. 6: later MLPs' "
                   "output is aligned with the answer's unembedding (a cosine: the same on every logit scale)",
                   pairs_text(len(ev.pairs)))


def transfer(ev: Evidence) -> Verdict:
    """Fig. 7: the key heads' attention in unseen formats."""
    from engine.techniques.attention import cached_problem_share
    readers = ev.readers()
    shares, too_few = {}, {}
    cannot = {fmt: why for fmt, why in ev.unbuilt.items() if fmt in ev.format_pairs}
    for fmt, fpairs in ev.format_pairs.items():
        if fmt in cannot:
            continue
        if len(fpairs) < MIN_PAIRS:
            too_few[fmt] = len(fpairs)
            continue
        shares[fmt] = (len(fpairs), share_interval(cached_problem_share(ev.model, fpairs, cache=ev.cache), readers))
    none_here = "; ".join(f"no {fmt} prompts under this counterfactual ({why})" for fmt, why in cannot.items())
    if not shares:
        few = ("the model answers too few prompts right in the other formats ("
               + ", ".join(f"{fmt}: {n}" for fmt, n in too_few.items()) + f"; at least {MIN_PAIRS} each are needed)")
        return Verdict("", None, "; ".join(t for t in (few if too_few else "", none_here) if t))
    skipped = "".join(f"; {fmt}: only {n} answered right" for fmt, n in too_few.items()) + (
        f"; {none_here}" if none_here else "")
    return Verdict(f"the same top-{len(readers)} heads on operands + operator: " + ", ".join(
        f"{fmt} {pct(v, '{:.0f}')} ({n} prompts)" for fmt, (n, v) in shares.items()),
        all_hold(*(v.above(ATTENTION_SHARE) for _, v in shares.values())),
        f"holds when the interval lies above {ATTENTION_SHARE:.0%} in every format{skipped}",
        ", ".join(f"{fmt} {pairs_text(n)}" for fmt, (n, _) in shares.items()))


def power(ev: Evidence) -> Verdict:
    """Table 3: exponentiation's own key heads, knocked out."""
    from engine.techniques.knockout import Knockout
    from engine.techniques.path_patching import cached_path_patching
    pp = ev.power_pairs
    if "power" in ev.unbuilt:
        return Verdict("", None, f"no exponentiation prompts under this set's counterfactual: {ev.unbuilt['power']}")
    if len(pp) < MIN_PAIRS:
        return Verdict("", None, f"the model answers {len(pp)} exponentiation prompt{'' if len(pp) == 1 else 's'} "
                                 f"right (at least {MIN_PAIRS} are needed; {CAN_TEACH})")
    p_table, _ = cached_path_patching(ev.model, pp, cache=ev.cache, progress=ev.progress)
    p_top = tuple((a, b) for a, b, _ in p_table.top_heads(TOP_READERS))
    base, after = before_and_after(ev, pp, Knockout(p_top))
    r = rel_interval(base, after)
    return Verdict(f"top-{len(p_top)} heads {', '.join(f'{a}.{b}' for a, b in p_top)}: {pct(r)} on "
                   f"{len(pp)} prompts", r.below(-TOP_DROP),
                   f"holds when the interval of the relative accuracy change lies below -{TOP_DROP:.0%}",
                   pairs_text(len(pp)))


def gsm8k(ev: Evidence) -> Verdict:
    """Table 4: GSM8K's key heads against the templates'."""
    if ev.gsm8k_pairs is None:
        return Verdict("", None, "GSM8K is not available here (../shared/data or ARITHLAB_DATA)")
    if len(ev.gsm8k_pairs) < MIN_PAIRS:
        n = len(ev.gsm8k_pairs)
        return Verdict("", None, f"the model answers {n} GSM8K question{'' if n == 1 else 's'} right at the first "
                                 f"answer token (at least {MIN_PAIRS} are needed)")
    from engine.techniques.knockout import Knockout
    from engine.techniques.transfer import overlap, top_heads_of
    f = ev.model.facts
    k = min(10, f.n_layers * f.n_heads)
    own = top_heads_of(ev.model, ev.gsm8k_pairs, k, cache=ev.cache, progress=ev.progress)
    shared, _ = overlap([(a, b) for a, b, _ in ev.table.top_heads(k)], own)
    base, after = before_and_after(ev, ev.gsm8k_pairs, Knockout(tuple(own)))  # GSM8K's own top-k knocked out
    r = rel(float(after.mean()), float(base.mean()))
    return Verdict(f"{shared} of {k} shared; {100 * r:+.0f} % on {len(ev.gsm8k_pairs)} GSM8K questions",
                   shared / k >= 0.5 and -r >= TOP_DROP,
                   f"holds when at least half the top-{k} heads are shared and GSM8K's own top-{k} "
                   f"knockout costs at least {TOP_DROP:.0%}", pairs_text(len(ev.gsm8k_pairs), "GSM8K questions"))


def models(ev: Evidence) -> Verdict:
    """Fig. 12: the same sparsity on a second model."""
    if ev.second is None:
        return Verdict("", None, "no second model was given to compare")
    name, second_table = ev.second
    return sparse_heads(second_table(), f"{name}: ")


def sft(ev: Evidence) -> Verdict:
    """Tables 1 / 2 / 5: precise SFT against full SFT."""
    got = ev.sft() if ev.sft is not None else "no fine-tuning job was looked up"
    if isinstance(got, str):
        return Verdict("", None, got)
    p, full = got.get("precise"), got.get("full")
    if p is None or full is None:
        missing = " and ".join(m for m in ("precise", "full") if got.get(m) is None)
        return Verdict("", None, f"no {missing} fine-tuning job has finished on this model")
    return Verdict(f"{TASK_FOR_SFT}: precise {p:+.1f} vs full {full:+.1f} points",
                   full > 0 and p >= PRECISE_SHARE * full,
                   f"holds when precise SFT gains at least {PRECISE_SHARE:.0%} of full SFT's gain")
