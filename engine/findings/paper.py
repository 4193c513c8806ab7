"""The paper's findings, one row each, checked on the current model and prompt set.

Zhang et al. (ICML 2024) argue in steps; each step has a number in a figure or a table.  For each,
this module computes the lab's number on the model and prompt set at hand (through the result cache,
computing what is missing) and says whether the finding holds by a stated criterion -- a loop over the
checked steps of :data:`engine.findings.steps.STEPS`, each a small function of :mod:`engine.findings.checks`.

Every number comes with its 95 % bootstrap interval over the prompt pairs, and a finding holds when its
interval clears the criterion, does not hold when the interval lies wholly on the other side, and is
inconclusive when it straddles (:mod:`engine.findings.checks`).  Every criterion is scale-free: a share, a
cosine or a relative change, so it means the same on any model's logit scale.  The rows:

* **Fig. 2 / 15 -- sparsity.**  "Only a small number of heads have a noteworthy influence on the output"
  (§4.1 (i); "< 5 %" in the abstract).  Lab: the share of the heads' total |effect| (sum over heads of |mean
  answer-logit difference|) carried by the top 5 % of the heads, against the same share with each pair's head
  labels shuffled (its 95th percentile: what effects of this size give when they are not tied to particular
  heads).  Holds: the share's interval lies above the null.
* **Fig. 3 -- knockout.**  "The performance of the model drops sharply in effect-rank, while keeping stable
  (relatively minor effect within 2%) in random-rank" (§4.1; about -70 % in the paper).  Lab: the point
  at k = 5 % of the model's heads (at most 10: 3 of the bundled model's 64, so that "random heads" are as
  small a share as the key heads) of the Knockout page's default curve (read from it when cached, else only
  that point's knockout sets are evaluated).  Holds: the interval of the top heads' relative accuracy change
  lies below -50 %, that of the random heads (mean of the draws) above -10 %.
* **Fig. 5 -- what the key heads read.**  The key heads "particularly attend to the operands and operators"
  (§5.2).  Lab: the top-5 heads' mean END-row attention on the operand and operator tokens.  Holds: its
  interval lies above 50 %.
* **Fig. 6 / 13 / 14 -- the MLPs write the answer.**  Later MLPs' output points to the answer's
  unembedding.  Lab: the layer whose MLP output is most aligned with W_U[C] (cosine), against other
  numbers and against random directions.  Holds: it lies in the second half of the layers, its cosine's
  interval lies above the random directions' 95th percentile and the interval of its gap over the other
  numbers above 0.
* **Fig. 7 -- attention transfers to unseen formats.**  On Figure 4's unseen samples (multi-digit
  integers, rational numbers) the key heads still attend to the numbers.  Lab: the top-5 heads (of this
  set) on the same problems with operands 10..99, with one decimal (4.5), and as Figure 10's word
  problems, each on the prompts the model answers right.  Holds: the interval lies above 50 % in every format.
* **Table 3 -- exponentiation.**  Key heads of the ``^`` / "to the power of" task, knocked out, cost
  -66 % / -62 %.  Lab: path patching on the ``power`` family, then its top-5 heads knocked out.
  Holds: the interval of the relative accuracy change lies below -50 %.
* **Table 4 -- GSM8K.**  60 % of the top-10 key heads are shared with those of GSM8K questions, whose
  own knockout costs -65 %.  Lab: :mod:`engine.techniques.transfer` on GSM8K pairs
  (:func:`~engine.techniques.transfer.benchmark_pairs`).  Holds: overlap of at least 50 % and a drop of
  at least 50 % (one draw: no interval yet).
* **Fig. 12 -- other models.**  Another model shows the same sparsity.  Lab: the same sparsity number
  on a second model, when one is given.
* **Tables 1 / 2 / 5 -- precise SFT.**  Tuning the key heads only matches full SFT.  Lab: the newest
  finished precise and full fine-tuning jobs on this model, their gains on the
  held-out arithmetic split.  Holds: precise gains at least 90 % of full SFT's gain (one run each: no
  interval).

A finding that cannot be computed on this model (too few prompts answered right, no job finished)
has no number and says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from engine.findings import steps
from engine.findings.checks import TASK_FOR_SFT, Evidence
from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import ANY_CARRY, PromptError, PromptPair


@dataclass(frozen=True)
class PaperFinding:
    key: str
    figure: str           # "Fig. 2 / 15"
    claim: str            # the paper's finding, in words
    paper: str            # the paper's number
    lab: str              # the lab's number on this model and set ("" when not computed)
    holds: bool | None    # None: not computed (``note`` says why)
    note: str             # the criterion, or why there is no number
    technique: str        # the registry name of the technique that shows it
    pairs: str = ""       # what the number rests on ("33 pairs"; "" when not computed)

    @property
    def verdict(self) -> str:
        """``holds``, ``does not hold``, ``inconclusive`` (the interval straddles the criterion) or
        ``not computed``."""
        if self.holds is not None:
            return "holds" if self.holds else "does not hold"
        return "inconclusive" if self.lab else "not computed"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def checked_steps() -> list[steps.Step]:
    """The steps of the argument that the paper states with a number (those with a ``check``)."""
    return [s for s in steps.STEPS if s.check is not None]


def paper_findings(model, pairs: Sequence[PromptPair], cache, *,
                   format_pairs: dict[str, Sequence[PromptPair]] | None = None,
                   power_pairs: Sequence[PromptPair] = (), gsm8k_pairs: Sequence[PromptPair] | None = None,
                   second: tuple[str, Callable[[], Any]] | None = None,
                   sft: Callable[[], dict[str, float] | str] | None = None, answered: bool = True,
                   progress: ProgressFn | None = None, on_row: Callable[[str], None] | None = None,
                   unbuilt: dict[str, str] | None = None) -> list[PaperFinding]:
    """One row per checked step of :data:`engine.findings.steps.STEPS` for ``model`` on ``pairs`` (its correctly
    answered prompt pairs; ``answered`` False: any pairs); the other arguments are
    :class:`~engine.findings.checks.Evidence`'s.
    ``on_row(key)`` is called after each row (``bench/reproduce.py`` times the rows with it; :func:`reproduce`
    calls it with ``"inputs"`` once the prompt sets are gathered)."""
    if not pairs:
        raise PromptError("the model answers none of these prompts right: pick other operations or another model")
    todo = checked_steps()
    stages = Stages(progress, [s.weight for s in todo])
    ev = Evidence(model, pairs, cache, format_pairs or {}, power_pairs, gsm8k_pairs, second, sft, answered,
                  unbuilt=unbuilt or {})
    out = []
    for i, s in enumerate(todo):
        ev.progress = stages.stage(i)
        v = s.check(ev)
        out.append(PaperFinding(s.key, s.figure, s.claim, s.paper, v.lab, v.holds, v.note, s.technique, v.pairs))
        stages.finish(i)
        if on_row is not None:
            on_row(s.key)
    return out


def sft_gains(model, cache=None) -> dict[str, float] | str:
    """{method: gain in points on TASK_FOR_SFT} of the newest finished precise and full fine-tuning jobs
    on ``model`` (each tuned model is opened and scored, through the cache), or why there is none."""
    from engine.backends import open_model
    from engine.finetune.jobs import finished_jobs_of
    from engine.finetune.skill_demo import task_accuracies
    newest: dict[str, str] = {}
    for job, record in finished_jobs_of(model.facts.fingerprint):
        newest.setdefault(record.get("result", {}).get("method", ""), job.out_dir)
    if not newest:
        return "no fine-tuning job has finished on this model yet"
    base = task_accuracies(model, cache=cache)
    if TASK_FOR_SFT not in base:
        return f"this model's tokenizer gives no {TASK_FOR_SFT} prompts"
    out = {}
    for method in ("precise", "full"):
        if method in newest:
            tuned = open_model(newest[method], device=model.facts.device)
            out[method] = 100.0 * (task_accuracies(tuned, cache=cache)[TASK_FOR_SFT][1] - base[TASK_FOR_SFT][1])
    return out


def power_spec(spec):
    """The set of exponentiation prompts the paper's Section 4.1 check runs beside ``spec``: its size and seed, the
    exponentiation templates, any carry (a carry is a sum's or a difference's)."""
    from dataclasses import replace
    return replace(spec, ops=("pow",), families=("power",), templates=(), carry=ANY_CARRY)


def reproduce(model, spec, cache, *, second=None, data_dir=None, progress: ProgressFn | None = None,
              on_row: Callable[[str], None] | None = None, keep_all: bool = False) -> list[PaperFinding]:
    """:func:`paper_findings` with its inputs gathered: the spec's correctly answered pairs, the same
    problems in the other formats (:data:`engine.prompts.promptsets.FORMATS`), the exponentiation prompts
    of the same size and seed, GSM8K questions from
    ``data_dir`` (default ``../shared/data``), ``second`` (another loaded model, or None) on the same set,
    and the newest fine-tuning jobs on this model.  ``keep_all``: every generated prompt, answered right or not
    (``bench/reproduce.py`` on a random-weights model that answers none)."""

    from engine.evaluation.benchmarks import default_data_dir
    from engine.prompts.promptsets import FORMATS, format_spec, generate
    from engine.techniques.accuracy import answered_right, kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    from engine.techniques.transfer import benchmark_pairs

    unbuilt: dict[str, str] = {}  # the other sets this set's counterfactual kind cannot make, and why

    def select(spec_, name: str | None = None) -> list[PromptPair]:  # the spec's pairs the model answers right
        try:  # (keep_all: every pair)
            return generate(model.tokenizer, spec_)[0] if keep_all else kept_pairs(model, spec_, cache=cache)[0]
        except PromptError as e:  # e.g. word problems under operator-swapped: their row says so
            if name is None:
                raise
            unbuilt[name] = str(e)
            return []

    pairs = select(spec)
    if not pairs:
        raise PromptError("the model answers none of these prompts right: pick other operations or another model")
    formats = {fmt: select(format_spec(spec, fmt), fmt) for fmt in FORMATS}
    power = select(power_spec(spec), "power")
    try:
        gsm8k = benchmark_pairs(model.tokenizer, data_dir or default_data_dir(), "gsm8k", spec.n, spec.seed)
        gsm8k = gsm8k if keep_all else answered_right(model, gsm8k, cache=cache)
    except PromptError:
        gsm8k = None
    if on_row is not None:
        on_row("inputs")  # the prompt sets, kept pairs of every format, GSM8K

    second_table = None
    if second is not None:
        def second_table():
            p2, _ = kept_pairs(second, spec, cache=cache)
            if not p2:
                raise PromptError(f"{second.facts.spec} answers none of these prompts right")
            return cached_path_patching(second, p2, cache=cache)[0]
    return paper_findings(model, pairs, cache, format_pairs=formats, power_pairs=power, gsm8k_pairs=gsm8k,
                          second=None if second is None else (second.facts.spec, second_table),
                          sft=lambda: sft_gains(model, cache), answered=not keep_all, progress=progress,
                          on_row=on_row, unbuilt=unbuilt)


def reproduce_work(model, spec, cache, pairs: Sequence[PromptPair], *, data_dir=None):
    """The forward work of :func:`reproduce` (``engine.cost.Work``) in passes of ``pairs``, the set's correctly
    answered pairs (the sidebar's filter, already run): each row's computations unless cached.  The other sets'
    filters are counted on their generated prompts; what follows a filter not yet run is counted on as many of
    their prompts as this set keeps of its own (the keep rate of ``pairs``); a second model and the fine-tuning
    jobs' scoring are left out."""

    from engine.cost import NO_WORK, unless_cached
    from engine.evaluation.benchmarks import default_data_dir
    from engine.prompts.promptsets import FORMATS, format_spec, generate
    from engine.results import NotCached, cache_only
    from engine.techniques.accuracy import answered_right, kept_pairs, scoring_work
    from engine.techniques.attention import cached_problem_share, end_rows_work
    from engine.techniques.faithfulness import cached_faithfulness, faithfulness_work
    from engine.techniques.knockout import Knockout, knockout_end_work, mean_activations_work
    from engine.techniques.knockout_curve import KNOCKOUT_DRAWS
    from engine.techniques.mlp_projections import cached_answer_cosines, projections_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    from engine.techniques.transfer import benchmark_pairs
    kept = len(pairs) / max(1, len(generate(model.tokenizer, spec)[0]))

    def filtered(gen: Sequence[PromptPair], probe) -> tuple[object, list[PromptPair]]:  # (the filter's work, pairs)
        try:
            with cache_only():
                return NO_WORK, list(probe())
        except NotCached:
            return scoring_work(model, gen, full=False), list(gen[:round(kept * len(gen))])

    def generated(s) -> list[PromptPair]:  # a set this set's counterfactual kind cannot make: nothing to run
        try:
            return generate(model.tokenizer, s)[0]
        except PromptError:
            return []

    def knocked(p: Sequence[PromptPair], n_sets: int):  # means and n_sets knockout sets, END-only
        L, H = model.facts.n_layers, model.facts.n_heads
        kos = [Knockout(((h // H % L, h % H),)) for h in range(n_sets)]  # stand-ins: n_sets distinct sets
        return mean_activations_work(model, p) + knockout_end_work(model, p, kos) if p else NO_WORK

    w = unless_cached(lambda: cached_path_patching(model, pairs, cache=cache), lambda: path_patching_work(model, pairs))
    w += knocked(pairs, 1 + KNOCKOUT_DRAWS)  # Fig. 3's point (read from the stored curve when it is cached)
    w += unless_cached(lambda: cached_problem_share(model, pairs, cache=cache), lambda: end_rows_work(model, pairs))
    w += unless_cached(lambda: cached_answer_cosines(model, pairs, cache=cache), lambda: projections_work(model, pairs))
    w += unless_cached(lambda: cached_faithfulness(model, pairs, cache=cache),
                       lambda: faithfulness_work(model, pairs, cache=cache, with_ranking=False))
    for fmt in FORMATS:
        s = format_spec(spec, fmt)
        gen = generated(s)
        fw, fp = filtered(gen, lambda s=s: kept_pairs(model, s, cache=cache)[0]) if gen else (NO_WORK, [])
        if fp:
            w += unless_cached(lambda p=fp: cached_problem_share(model, p, cache=cache),
                               lambda p=fp: end_rows_work(model, p))
        w += fw
    s = power_spec(spec)
    gen = generated(s)
    fw, pp = filtered(gen, lambda: kept_pairs(model, s, cache=cache)[0]) if gen else (NO_WORK, [])
    w += fw
    if pp:
        w += unless_cached(lambda: cached_path_patching(model, pp, cache=cache), lambda: path_patching_work(model, pp))
        w += knocked(pp, 2)
    try:
        gsm = benchmark_pairs(model.tokenizer, data_dir or default_data_dir(), "gsm8k", spec.n, spec.seed)
    except PromptError:
        return w
    fw, gp = filtered(gsm, lambda: answered_right(model, gsm, cache=cache))
    w += fw
    if gp:
        w += unless_cached(lambda: cached_path_patching(model, gp, cache=cache, batch_size=32),
                           lambda: path_patching_work(model, gp)) + knocked(gp, 2)
    return w
