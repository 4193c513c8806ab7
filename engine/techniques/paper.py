"""The paper's findings, one row each, checked on the current model and prompt set.

Zhang et al. (ICML 2024) argue in steps; each step has a number in a figure or a table.  For each,
this module computes the lab's number on the model and prompt set at hand (through the result cache,
computing what is missing) and says whether the finding holds by a stated criterion:

* **Fig. 2 / 15 -- sparsity.**  "Only a small percentage (< 5 %) of the attention heads ... significantly
  impact the model's performance": the share of heads whose path-patching effect moves the answer
  logit by 5 % or more (the circuit summary's threshold).  Holds: some heads do, and fewer than 5 %
  (no head at all is a spread effect, not a sparse one).
* **Fig. 3 -- knockout.**  Knocking out the top-k heads by effect collapses accuracy; k random heads
  change it by at most 2 % (Table 4: top-10 -69 %, 1 % of LLaMA2-7B's heads).  Lab: the point at k = 5 %
  of the model's heads (at most 10: 3 of the bundled model's 64, so that "random heads" are as small a
  share as the key heads) of the Knockout page's default curve (read from it when cached, else only
  that point's knockout sets are evaluated).  Holds: a relative drop of at least 50 %
  for the top heads and at most 10 % for the random ones.
* **Fig. 5 -- what the key heads read.**  The key heads attend to the operands and the operators.  Lab:
  the top-5 heads' mean END-row attention on the operand and operator tokens.  Holds: at least 50 %.
* **Fig. 6 / 13 / 14 -- the MLPs write the answer.**  Later MLPs' output points to the answer's
  unembedding.  Lab: the layer whose MLP output is most aligned with W_U[C] (cosine), against other
  numbers.  Holds: it lies in the second half of the layers and beats the other numbers' cosine.
* **Fig. 7 -- attention transfers to unseen formats.**  On Figure 4's unseen samples (multi-digit
  integers, rational numbers) the key heads still attend to the numbers.  Lab: the top-5 heads (of this
  set) on the same problems with operands 10..99, with one decimal (4.5), and as Figure 10's word
  problems, each on the prompts the model answers right.  Holds: at least 50 % on operands and operator
  in every format.
* **Table 3 -- exponentiation.**  Key heads of the ``^`` / "to the power of" task, knocked out, cost
  -66 % / -62 %.  Lab: path patching on the ``power`` family, then its top-5 heads knocked out.
  Holds: a relative drop of at least 50 %.
* **Table 4 -- GSM8K.**  60 % of the top-10 key heads are shared with those of GSM8K questions, whose
  own knockout costs -65 %.  Lab: :mod:`engine.techniques.transfer` on GSM8K pairs
  (:func:`~engine.techniques.transfer.benchmark_pairs`).  Holds: overlap of at least 50 % and a drop of
  at least 50 %.
* **Fig. 12 -- other models.**  Another model shows the same sparsity.  Lab: the same sparsity number
  on a second model, when one is given.
* **Tables 1 / 2 / 5 -- precise SFT.**  Tuning the key heads only matches full SFT.  Lab: the newest
  finished precise and full fine-tuning jobs on this model (Improve page), their gains on the
  held-out arithmetic split.  Holds: precise gains at least 90 % of full SFT's gain.

A finding that cannot be computed on this model (too few prompts answered right, no job finished)
has no number and says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import PromptError, PromptPair

# the circuit summary's threshold, and the Knockout page's default curve (its cache entry is shared)
from engine.techniques.ablation import KNOCKOUT_DRAWS, KNOCKOUT_K
from engine.techniques.patching import KEY_EFFECT, sparsity

SPARSE_SHARE = 0.05
TOP_DROP, RANDOM_DROP = 0.50, 0.10
ATTENTION_SHARE = 0.50
TOP_READERS = 5
MIN_PAIRS = 8  # fewer correctly answered prompts than this: nothing to analyse
PRECISE_SHARE = 0.90
TASK_FOR_SFT = "arithmetic (held-out split)"


@dataclass(frozen=True)
class PaperFinding:
    key: str
    figure: str           # "Fig. 2 / 15"
    claim: str            # the paper's finding, in words
    paper: str            # the paper's number
    lab: str              # the lab's number on this model and set ("" when not computed)
    holds: bool | None    # None: not computed (``note`` says why)
    note: str             # the criterion, or why there is no number
    page: str             # the lab page that shows it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


ROWS: tuple[tuple[str, str, str, str, str], ...] = (
    # key, figure, claim, the paper's number, page
    ("sparsity", "Fig. 2 / 15", "Fewer than 5 % of the heads matter for the answer", "< 5 % of heads",
     "Patching_heatmap"),
    ("knockout", "Fig. 3", "Knocking out the top heads collapses accuracy; random heads do not",
     "top-10 -69 %, random within -2 %", "Knockout"),
    ("attention", "Fig. 5", "The key heads attend to the operands and the operator",
     "attention mostly on operands / operators", "Patching_heatmap"),
    ("mlps", "Fig. 6 / 13 / 14", "Later MLPs write the answer (output aligned with W_U[C])",
     "layers 17-28 of 32 lift C", "MLP_projections"),
    ("transfer", "Fig. 7", "The key heads' attention transfers to unseen formats (multi-digit, decimals, words)",
     "attention mainly on the operands", "Transfer"),
    ("power", "Table 3", "Exponentiation has key heads too; knocking them out hurts",
     "-66 % (^) / -62 % (to the power of)", "Knockout"),
    ("gsm8k", "Table 4", "GSM8K's key heads overlap the templates'; knocking them out hurts",
     "6 of 10 shared; -65 % on GSM8K", "Transfer"),
    ("models", "Fig. 12", "Other models show the same sparse key heads", "sparse in LLaMA2-13B, Mistral-7B",
     "Patching_heatmap"),
    ("sft", "Tables 1 / 2 / 5", "Precise SFT of the key heads matches full SFT",
     "LLaMA2-7B GSM8K +12.8 precise vs +10.0 full (Table 1)", "Improve"),
)
STEPS = tuple(r[0] for r in ROWS)


def _row(key: str, lab: str, holds: bool | None, note: str) -> PaperFinding:
    _, figure, claim, paper, page = next(r for r in ROWS if r[0] == key)
    return PaperFinding(key, figure, claim, paper, lab, holds, note, page)


def _rel(after: float, before: float) -> float:
    return (after - before) / before if before else 0.0


def _sparsity_row(table, key: str = "sparsity", who: str = "") -> PaperFinding:
    n_key, n = sparsity(table)
    share = n_key / max(1, n)
    top = ", ".join(f"{a}.{b}" for a, b, _ in table.top_heads(3))
    return _row(key, f"{who}{n_key} of {n} heads ({100 * share:.1f} %); top {top}", 0 < share < SPARSE_SHARE,
                f"holds when some heads but under {100 * SPARSE_SHARE:.0f} % of them move the answer logit by "
                f"{abs(KEY_EFFECT):.0%} or more (none: the effect is spread, not sparse)")


def _problem_share(roles, heads: Sequence[tuple[int, int]]) -> float:
    """Mean END-row attention of ``heads`` on operand and operator tokens."""
    by = {}
    for r in roles:
        if (r.layer, r.head) in heads and r.role.startswith(("operand", "operator")):
            by[(r.layer, r.head)] = by.get((r.layer, r.head), 0.0) + r.value
    return sum(by.get(h, 0.0) for h in heads) / max(1, len(heads))


def paper_findings(model, pairs: Sequence[PromptPair], cache, *,
                   format_pairs: dict[str, Sequence[PromptPair]] | None = None,
                   power_pairs: Sequence[PromptPair] = (), gsm8k_pairs: Sequence[PromptPair] | None = None,
                   second: tuple[str, Callable[[], Any]] | None = None,
                   sft: Callable[[], dict[str, float] | str] | None = None,
                   progress: ProgressFn | None = None) -> list[PaperFinding]:
    """Every row of :data:`ROWS` for ``model`` on ``pairs`` (its correctly answered prompt pairs).

    ``format_pairs``: {format: correctly answered pairs} of the same problems in other formats (Figure 4's
    multi-digit integers and decimals, Figure 10's word problems); ``power_pairs`` / ``gsm8k_pairs``: the
    correctly answered exponentiation and GSM8K pairs (``gsm8k_pairs`` None: the data are not available);
    ``second``: (name, a function giving the path-patching table of a second model); ``sft``: a function
    giving {method: gain in points} of the newest finished fine-tuning jobs, or a sentence saying why not.
    """
    from engine.techniques.ablation import Knockout, cached_knockout_points, knockout_accuracies, mean_activations
    from engine.techniques.attention import cached_role_attention
    from engine.techniques.patching import cached_path_patching
    from engine.techniques.projections import cached_mlp_projections

    if not pairs:
        raise PromptError("the model answers none of these prompts right: pick other operations or another model")
    format_pairs = format_pairs or {}
    stages = Stages(progress, [40, 20, 10, 10, 10, 30, 30, 10, 10])
    out: list[PaperFinding] = []
    f = model.facts

    table, _ = cached_path_patching(model, pairs, cache=cache, progress=stages.stage(0))
    stages.finish(0)
    out.append(_sparsity_row(table))

    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(a, b) for a, b, _ in table.top_heads(k_max)]
    k_eval = min(k_max, max(1, round(SPARSE_SHARE * f.n_layers * f.n_heads)))  # the top 5 % of the heads
    p0, at = cached_knockout_points(model, pairs, ranked, (0, k_eval), k_max=k_max, draws=KNOCKOUT_DRAWS,
                                    cache=cache, progress=stages.stage(1))
    stages.finish(1)
    base = p0.top_accuracy
    top_rel, rand_rel = _rel(at.top_accuracy, base), _rel(at.random_mean, base)
    out.append(_row("knockout", f"top-{at.k} {100 * top_rel:+.0f} %, random {100 * rand_rel:+.0f} % "
                                f"(from {100 * base:.0f} %)", -top_rel >= TOP_DROP and -rand_rel <= RANDOM_DROP,
                    f"holds when the top-{at.k} heads cost at least {TOP_DROP:.0%} of the accuracy and "
                    f"{at.k} random heads (mean of {KNOCKOUT_DRAWS} draws) at most {RANDOM_DROP:.0%}"))

    readers = [(a, b) for a, b, _ in table.top_heads(TOP_READERS)]
    roles, _ = cached_role_attention(model, pairs, cache=cache, progress=stages.stage(2))
    stages.finish(2)
    share = _problem_share(roles, readers)
    all_heads = [(a, b) for a in range(f.n_layers) for b in range(f.n_heads)]
    out.append(_row("attention", f"top-{len(readers)} heads {100 * share:.0f} % on operands + operator "
                                 f"(all heads {100 * _problem_share(roles, all_heads):.0f} %)",
                    share >= ATTENTION_SHARE, f"holds when the top-{len(readers)} heads put at least "
                                              f"{ATTENTION_SHARE:.0%} of their END-row attention there"))

    proj, _ = cached_mlp_projections(model, pairs, cache=cache, progress=stages.stage(3))
    stages.finish(3)
    ans = {v.layer: v.value for v in proj if v.metric == "cos_out_C"}
    other = {v.layer: v.value for v in proj if v.metric == "cos_out_other"}
    best = max(ans, key=ans.get)
    out.append(_row("mlps", f"MLP {best} of {f.n_layers} most aligned with C: cos {ans[best]:.2f} vs "
                            f"{other.get(best, float('nan')):.2f} for other numbers",
                    best >= f.n_layers // 2 and ans[best] > other.get(best, float("inf")),
                    "holds when the MLP most aligned with the answer lies in the second half of the layers "
                    "and beats the other numbers"))

    shares, too_few = {}, {}
    for fmt, fpairs in format_pairs.items():
        if len(fpairs) < MIN_PAIRS:
            too_few[fmt] = len(fpairs)
            continue
        f_roles, _ = cached_role_attention(model, fpairs, cache=cache)
        shares[fmt] = (len(fpairs), _problem_share(f_roles, readers))
    if not shares:
        out.append(_row("transfer", "", None, "the model answers too few prompts right in the other formats ("
                        + ", ".join(f"{fmt}: {n}" for fmt, n in too_few.items())
                        + f"; at least {MIN_PAIRS} each are needed)"))
    else:
        skipped = "".join(f"; {fmt}: only {n} answered right" for fmt, n in too_few.items())
        out.append(_row("transfer", f"the same top-{len(readers)} heads on operands + operator: " + ", ".join(
            f"{fmt} {100 * v:.0f} % ({n} prompts)" for fmt, (n, v) in shares.items()),
            all(v >= ATTENTION_SHARE for _, v in shares.values()),
            f"holds when it is at least {ATTENTION_SHARE:.0%} in every format{skipped}"))
    stages.finish(4)

    if len(power_pairs) < MIN_PAIRS:
        out.append(_row("power", "", None, f"the model answers {len(power_pairs)} exponentiation prompts right "
                                           f"(at least {MIN_PAIRS} are needed; teach it on the Improve page)"))
    else:
        p_table, _ = cached_path_patching(model, power_pairs, cache=cache, progress=stages.stage(5))
        p_top = tuple((a, b) for a, b, _ in p_table.top_heads(TOP_READERS))
        acc0, acc_ko = knockout_accuracies(model, power_pairs, [Knockout(), Knockout(p_top)],
                                           mean_activations(model, power_pairs))
        rel = _rel(acc_ko, acc0)
        out.append(_row("power", f"top-{len(p_top)} heads {', '.join(f'{a}.{b}' for a, b in p_top)}: "
                                 f"{100 * rel:+.0f} % on {len(power_pairs)} prompts", -rel >= TOP_DROP,
                        f"holds when knocking them out costs at least {TOP_DROP:.0%} of the accuracy"))
    stages.finish(5)

    if gsm8k_pairs is None:
        out.append(_row("gsm8k", "", None, "GSM8K is not available here (../shared/data or ARITHLAB_DATA)"))
    elif len(gsm8k_pairs) < MIN_PAIRS:
        out.append(_row("gsm8k", "", None, f"the model answers {len(gsm8k_pairs)} GSM8K questions right at the "
                                           f"first answer token (at least {MIN_PAIRS} are needed)"))
    else:
        from engine.techniques.transfer import transfer
        k = min(10, f.n_layers * f.n_heads)
        res = transfer(model, pairs, gsm8k_pairs, names=("templates", "gsm8k"), k=k, cache=cache,
                       progress=stages.stage(6))
        rel = _rel(res.b.accuracy_ko_own, res.b.accuracy)
        out.append(_row("gsm8k", f"{res.overlap} of {k} shared; {100 * rel:+.0f} % on {res.b.n_pairs} GSM8K "
                                 f"questions", res.overlap / k >= 0.5 and -rel >= TOP_DROP,
                        f"holds when at least half the top-{k} heads are shared and GSM8K's own top-{k} "
                        f"knockout costs at least {TOP_DROP:.0%}"))
    stages.finish(6)

    if second is None:
        out.append(_row("models", "", None, "pick a second model to compare (Paper page; "
                                            "`engine reproduce --compare M`)"))
    else:
        name, second_table = second
        row = _sparsity_row(second_table(), "models", f"{name}: ")
        out.append(row)
    stages.finish(7)

    got = sft() if sft is not None else "no fine-tuning job was looked up"
    if isinstance(got, str):
        out.append(_row("sft", "", None, got))
    else:
        p, full = got.get("precise"), got.get("full")
        if p is None or full is None:
            missing = " and ".join(m for m in ("precise", "full") if got.get(m) is None)
            out.append(_row("sft", "", None, f"no {missing} fine-tuning job has finished on this model "
                                             f"(Improve page)"))
        else:
            out.append(_row("sft", f"{TASK_FOR_SFT}: precise {p:+.1f} vs full {full:+.1f} points",
                            full > 0 and p >= PRECISE_SHARE * full,
                            f"holds when precise SFT gains at least {PRECISE_SHARE:.0%} of full SFT's gain"))
    stages.finish(8)
    return out


def sft_gains(model, cache=None) -> dict[str, float] | str:
    """{method: gain in points on TASK_FOR_SFT} of the newest finished precise and full fine-tuning jobs
    on ``model`` (each tuned model is opened and scored, through the cache), or why there is none."""
    from engine.backends import open_model
    from engine.finetune.jobs import finished_jobs_of
    from engine.organism.skill_demo import task_accuracies
    newest: dict[str, str] = {}
    for job, record in finished_jobs_of(model.facts.fingerprint):
        newest.setdefault(record.get("result", {}).get("method", ""), job.out_dir)
    if not newest:
        return "no fine-tuning job has finished on this model yet (Improve page)"
    base = task_accuracies(model, cache=cache)
    if TASK_FOR_SFT not in base:
        return f"this model's tokenizer gives no {TASK_FOR_SFT} prompts"
    out = {}
    for method in ("precise", "full"):
        if method in newest:
            tuned = open_model(newest[method], device=model.facts.device)
            out[method] = 100.0 * (task_accuracies(tuned, cache=cache)[TASK_FOR_SFT][1] - base[TASK_FOR_SFT][1])
    return out


def reproduce(model, spec, cache, *, second=None, data_dir=None, progress: ProgressFn | None = None
              ) -> list[PaperFinding]:
    """:func:`paper_findings` with its inputs gathered: the spec's correctly answered pairs, the same
    problems in the other formats (:data:`engine.prompts.promptsets.FORMATS`), the exponentiation prompts
    of the same size and seed, GSM8K questions from
    ``data_dir`` (default ``../shared/data``), ``second`` (another loaded model, or None) on the same set,
    and the newest fine-tuning jobs on this model."""
    from dataclasses import replace

    from engine.evaluation.benchmarks import default_data_dir
    from engine.prompts.promptsets import FORMATS, format_spec
    from engine.techniques.accuracy import keep_correct, kept_pairs
    from engine.techniques.patching import cached_path_patching
    from engine.techniques.transfer import benchmark_pairs

    pairs, _ = kept_pairs(model, spec, cache=cache)
    if not pairs:
        raise PromptError("the model answers none of these prompts right: pick other operations or another model")
    formats = {fmt: kept_pairs(model, format_spec(spec, fmt), cache=cache)[0] for fmt in FORMATS}
    power, _ = kept_pairs(model, replace(spec, ops=("pow",), families=("power",)), cache=cache)
    try:
        gsm8k = keep_correct(model, benchmark_pairs(model.tokenizer, data_dir or default_data_dir(), "gsm8k",
                                                    spec.n, spec.seed))
    except PromptError:
        gsm8k = None

    second_table = None
    if second is not None:
        def second_table():
            p2, _ = kept_pairs(second, spec, cache=cache)
            if not p2:
                raise PromptError(f"{second.facts.spec} answers none of these prompts right")
            return cached_path_patching(second, p2, cache=cache)[0]
    return paper_findings(model, pairs, cache, format_pairs=formats, power_pairs=power, gsm8k_pairs=gsm8k,
                          second=None if second is None else (second.facts.spec, second_table),
                          sft=lambda: sft_gains(model, cache), progress=progress)
