"""The paper's findings checked on a model: one small function per finding, each giving the lab's number and
the verdict by its stated criterion (the criteria are listed in :mod:`engine.findings.paper`).

Every check takes an :class:`Evidence` -- the model, its correctly answered prompt pairs, the cache and what
the other findings need (the same problems in other formats, exponentiation, GSM8K, a second model, the
newest fine-tuning jobs) -- and returns a :class:`Verdict`.  The path-patching table that most checks start
from is computed once, by the first check that asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.knockout_curve import KNOCKOUT_DRAWS, KNOCKOUT_K
from engine.techniques.path_patching import KEY_EFFECT, sparsity

SPARSE_SHARE = 0.05
TOP_DROP, RANDOM_DROP = 0.50, 0.10
ATTENTION_SHARE = 0.50
TOP_READERS = 5
MIN_PAIRS = 8  # fewer correctly answered prompts than this: nothing to analyse
PRECISE_SHARE = 0.90
TASK_FOR_SFT = "arithmetic (held-out split)"


@dataclass(frozen=True)
class Verdict:
    lab: str              # the lab's number on this model and set ("" when not computed)
    holds: bool | None    # None: not computed (``note`` says why)
    note: str             # the criterion, or why there is no number


@dataclass
class Evidence:
    """What the checks read.  ``format_pairs``: {format: correctly answered pairs} of the same problems in other
    formats; ``power_pairs`` / ``gsm8k_pairs``: the correctly answered exponentiation and GSM8K pairs
    (``gsm8k_pairs`` None: the data are not available); ``second``: (name, a function giving the path-patching
    table of a second model); ``sft``: a function giving {method: gain in points} of the newest finished
    fine-tuning jobs, or a sentence saying why not; ``progress``: the running check's progress callback."""

    model: Any
    pairs: Sequence[PromptPair]
    cache: Any
    format_pairs: dict[str, Sequence[PromptPair]] = field(default_factory=dict)
    power_pairs: Sequence[PromptPair] = ()
    gsm8k_pairs: Sequence[PromptPair] | None = None
    second: tuple[str, Callable[[], Any]] | None = None
    sft: Callable[[], dict[str, float] | str] | None = None
    progress: ProgressFn | None = None
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


def sparse_heads(table, who: str = "") -> Verdict:
    n_key, n = sparsity(table)
    share = n_key / max(1, n)
    top = ", ".join(f"{a}.{b}" for a, b, _ in table.top_heads(3))
    return Verdict(f"{who}{n_key} of {n} heads ({100 * share:.1f} %); top {top}", 0 < share < SPARSE_SHARE,
                   f"holds when some heads but under {100 * SPARSE_SHARE:.0f} % of them move the answer logit by "
                   f"{abs(KEY_EFFECT):.0%} or more (none: the effect is spread, not sparse)")


def problem_share(roles, heads: Sequence[tuple[int, int]]) -> float:
    """Mean END-row attention of ``heads`` on operand and operator tokens."""
    by = {}
    for r in roles:
        if (r.layer, r.head) in heads and r.role.startswith(("operand", "operator")):
            by[(r.layer, r.head)] = by.get((r.layer, r.head), 0.0) + r.value
    return sum(by.get(h, 0.0) for h in heads) / max(1, len(heads))


def key_heads(ev: Evidence) -> Verdict:
    """Fig. 2 / 15: few heads matter."""
    return sparse_heads(ev.table)


def knockout(ev: Evidence) -> Verdict:
    """Fig. 3: the top heads' knockout collapses accuracy, random heads' does not."""
    from engine.techniques.knockout_curve import cached_knockout_points
    f = ev.model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(a, b) for a, b, _ in ev.table.top_heads(k_max)]
    k_eval = min(k_max, max(1, round(SPARSE_SHARE * f.n_layers * f.n_heads)))  # the top 5 % of the heads
    p0, at = cached_knockout_points(ev.model, ev.pairs, ranked, (0, k_eval), k_max=k_max, draws=KNOCKOUT_DRAWS,
                                    cache=ev.cache, progress=ev.progress)
    base = p0.top_accuracy
    top_rel, rand_rel = rel(at.top_accuracy, base), rel(at.random_mean, base)
    return Verdict(f"top-{at.k} {100 * top_rel:+.0f} %, random {100 * rand_rel:+.0f} % (from {100 * base:.0f} %)",
                   -top_rel >= TOP_DROP and -rand_rel <= RANDOM_DROP,
                   f"holds when the top-{at.k} heads cost at least {TOP_DROP:.0%} of the accuracy and "
                   f"{at.k} random heads (mean of {KNOCKOUT_DRAWS} draws) at most {RANDOM_DROP:.0%}")


def attention(ev: Evidence) -> Verdict:
    """Fig. 5: the key heads read the operands and the operator."""
    from engine.techniques.attention import cached_role_attention
    f = ev.model.facts
    readers = ev.readers()
    roles, _ = cached_role_attention(ev.model, ev.pairs, cache=ev.cache, progress=ev.progress)
    share = problem_share(roles, readers)
    all_heads = [(a, b) for a in range(f.n_layers) for b in range(f.n_heads)]
    return Verdict(f"top-{len(readers)} heads {100 * share:.0f} % on operands + operator "
                   f"(all heads {100 * problem_share(roles, all_heads):.0f} %)",
                   share >= ATTENTION_SHARE, f"holds when the top-{len(readers)} heads put at least "
                                             f"{ATTENTION_SHARE:.0%} of their END-row attention there")


def mlps(ev: Evidence) -> Verdict:
    """Fig. 6 / 13 / 14: a later MLP writes the answer."""
    from engine.techniques.mlp_projections import cached_mlp_projections
    f = ev.model.facts
    proj, _ = cached_mlp_projections(ev.model, ev.pairs, cache=ev.cache, progress=ev.progress)
    ans = {v.layer: v.value for v in proj if v.metric == "cos_out_C"}
    other = {v.layer: v.value for v in proj if v.metric == "cos_out_other"}
    best = max(ans, key=ans.get)
    return Verdict(f"MLP {best} of {f.n_layers} most aligned with C: cos {ans[best]:.2f} vs "
                   f"{other.get(best, float('nan')):.2f} for other numbers",
                   best >= f.n_layers // 2 and ans[best] > other.get(best, float("inf")),
                   "holds when the MLP most aligned with the answer lies in the second half of the layers "
                   "and beats the other numbers")


def transfer(ev: Evidence) -> Verdict:
    """Fig. 7: the key heads' attention in unseen formats."""
    from engine.techniques.attention import cached_role_attention
    readers = ev.readers()
    shares, too_few = {}, {}
    for fmt, fpairs in ev.format_pairs.items():
        if len(fpairs) < MIN_PAIRS:
            too_few[fmt] = len(fpairs)
            continue
        f_roles, _ = cached_role_attention(ev.model, fpairs, cache=ev.cache)
        shares[fmt] = (len(fpairs), problem_share(f_roles, readers))
    if not shares:
        return Verdict("", None, "the model answers too few prompts right in the other formats ("
                       + ", ".join(f"{fmt}: {n}" for fmt, n in too_few.items())
                       + f"; at least {MIN_PAIRS} each are needed)")
    skipped = "".join(f"; {fmt}: only {n} answered right" for fmt, n in too_few.items())
    return Verdict(f"the same top-{len(readers)} heads on operands + operator: " + ", ".join(
        f"{fmt} {100 * v:.0f} % ({n} prompts)" for fmt, (n, v) in shares.items()),
        all(v >= ATTENTION_SHARE for _, v in shares.values()),
        f"holds when it is at least {ATTENTION_SHARE:.0%} in every format{skipped}")


def power(ev: Evidence) -> Verdict:
    """Table 3: exponentiation's own key heads, knocked out."""
    from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations
    from engine.techniques.path_patching import cached_path_patching
    pp = ev.power_pairs
    if len(pp) < MIN_PAIRS:
        return Verdict("", None, f"the model answers {len(pp)} exponentiation prompts right "
                                 f"(at least {MIN_PAIRS} are needed; fine-tuning can teach it)")
    p_table, _ = cached_path_patching(ev.model, pp, cache=ev.cache, progress=ev.progress)
    p_top = tuple((a, b) for a, b, _ in p_table.top_heads(TOP_READERS))
    acc0, acc_ko = knockout_accuracies(ev.model, pp, [Knockout(), Knockout(p_top)], mean_activations(ev.model, pp))
    r = rel(acc_ko, acc0)
    return Verdict(f"top-{len(p_top)} heads {', '.join(f'{a}.{b}' for a, b in p_top)}: {100 * r:+.0f} % on "
                   f"{len(pp)} prompts", -r >= TOP_DROP,
                   f"holds when knocking them out costs at least {TOP_DROP:.0%} of the accuracy")


def gsm8k(ev: Evidence) -> Verdict:
    """Table 4: GSM8K's key heads against the templates'."""
    if ev.gsm8k_pairs is None:
        return Verdict("", None, "GSM8K is not available here (../shared/data or ARITHLAB_DATA)")
    if len(ev.gsm8k_pairs) < MIN_PAIRS:
        return Verdict("", None, f"the model answers {len(ev.gsm8k_pairs)} GSM8K questions right at the first "
                                 f"answer token (at least {MIN_PAIRS} are needed)")
    from engine.techniques.transfer import transfer as two_sets
    f = ev.model.facts
    k = min(10, f.n_layers * f.n_heads)
    res = two_sets(ev.model, ev.pairs, ev.gsm8k_pairs, names=("templates", "gsm8k"), k=k, cache=ev.cache,
                   progress=ev.progress)
    r = rel(res.b.accuracy_ko_own, res.b.accuracy)
    return Verdict(f"{res.overlap} of {k} shared; {100 * r:+.0f} % on {res.b.n_pairs} GSM8K questions",
                   res.overlap / k >= 0.5 and -r >= TOP_DROP,
                   f"holds when at least half the top-{k} heads are shared and GSM8K's own top-{k} "
                   f"knockout costs at least {TOP_DROP:.0%}")


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
