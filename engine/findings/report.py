"""A shareable report of the paper's analysis on one model and prompt set (data only; see ``views/report.py``).

Gathers, through the result cache (computing what is missing), the numbers of the paper's steps on
the chosen prompt set: accuracy per operation, path patching (every head and MLP), the top heads'
attention by token role, MLP projections, the logit lens and the Fig. 3 knockout curve -- plus what
is needed to reproduce them: the model's fingerprint and facts, the prompt-set definition and hash,
and the versions of the packages that computed them.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable, Sequence

from engine.findings import steps
from engine.machinery.components import wide_rows
from engine.paths import REPO_ROOT
from engine.progress import ProgressFn
from engine.prompts.custom import none_right_message
from engine.prompts.pairs import PromptPair, prompt_set_hash

PACKAGES = ("torch", "transformers", "transformer-lens", "nnsight", "streamlit", "altair", "duckdb")
#: the techniques whose numbers the report charts (views/report.py), gathered for the steps of the paper's argument
#: that name them (engine.findings.steps), in the argument's order
CHARTED = ("path-patching", "knockout-curve", "attention", "mlp-projections", "logit-lens")


def charted_steps() -> tuple[steps.Step, ...]:
    """The steps of the paper's argument the report charts, in the argument's order (read at call time)."""
    return tuple(s for s in steps.STEPS if s.technique in CHARTED)


def phases() -> tuple[str, ...]:
    """The phases of gathering the report's data (its progress bar): the prompt set, each charted step, the
    circuit."""
    return ("prompt set", *(s.key for s in charted_steps()), "circuit")


@dataclass
class Report:
    title: str
    created: str
    model: dict[str, Any]
    prompt_set: dict[str, Any]
    versions: dict[str, str]
    accuracy: list[dict[str, Any]]                  # per op: n generated, n kept
    patching: list[dict[str, Any]]                  # component, layer, head, effect, logit_diff
    top_heads: list[dict[str, Any]]                 # layer, head, effect
    roles: list[dict[str, Any]]                     # top heads' layer, head, role, value
    projections: list[dict[str, Any]]               # layer, metric, value, std
    lens: list[dict[str, Any]]                      # layer, mean_prob, median_rank, top1
    knockout: list[dict[str, Any]]                  # k, top_accuracy, random_mean, ...
    notes: list[str] = field(default_factory=list)
    paper: list[dict[str, Any]] = field(default_factory=list)  # the paper's verdicts (engine.findings.paper)
    summary: list[dict[str, Any]] = field(default_factory=list)  # step, text, technique: the summary's findings
    circuit: dict[str, Any] = field(default_factory=dict)  # the circuit diagram (engine.techniques.circuit, JSON)
    pins: list[dict[str, Any]] = field(default_factory=list)  # component, note: the user's pins (engine.findings.notes)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=REPO_ROOT, check=False).stdout.strip()
    except OSError:
        rev = ""
    out["arithmetic-circuits lab"] = rev or "unknown"
    return out


def build_report(model, spec, cache, *, k_max: int = 10, draws: int = 5, top_k: int = 3, paper: bool = False,
                 second=None, progress: ProgressFn | None = None, paper_progress: ProgressFn | None = None,
                 on_row: Callable[[str], None] | None = None, pairs: Sequence[PromptPair] | None = None,
                 source: dict[str, Any] | None = None) -> Report:
    """Every number of the report for ``model`` on the prompt set ``spec`` (cached where possible); with
    ``paper``, also the paper's findings one row each (:func:`engine.findings.paper.reproduce`, ``second``:
    a second loaded model for Fig. 12; ``paper_progress`` and ``on_row`` its progress and finished rows).
    ``pairs``: instead of ``spec`` (None), pairs read from a file and answered right, ``source`` what the report
    says of them (the file, how many pairs it holds)."""
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.attention import cached_role_attention
    from engine.techniques.circuit import circuit_diagram
    from engine.techniques.knockout_curve import cached_knockout_curve
    from engine.techniques.logit_lens import cached_logit_lens
    from engine.techniques.mlp_projections import cached_mlp_projections
    from engine.techniques.path_patching import cached_path_patching

    phase = phases()

    def step(i: int) -> None:
        if progress is not None:
            progress(i, len(phase))

    f = model.facts
    if pairs is None:
        pairs, n_generated = kept_pairs(model, spec, cache=cache)
        if not pairs:
            raise ValueError(none_right_message(n_generated, custom=bool(spec.templates)))
        described = {**spec.to_params(), "n_generated": n_generated}
    else:
        if paper:
            raise ValueError("the paper's findings need a prompt set the lab generates (operations and templates), "
                             "not pairs read from a file")
        if not pairs:
            raise ValueError("no prompt pairs: the model answers none of them right")
        described = dict(source or {})
    seed = spec.seed if spec is not None else 0
    step(1)
    got: dict[str, Any] = {}

    def ranked() -> tuple[str, list]:  # the path-patching table's metric and top heads (its step comes first)
        table = got["path-patching"]
        return table.ranking_metric(), table.top_heads(max(top_k, k_max), table.ranking_metric())

    def curve():
        top = ranked()[1]
        k = min(k_max, len(top))  # the model's heads, or those the table ranks (a head of no value is not ranked)
        return cached_knockout_curve(model, pairs, [(layer, h) for layer, h, _ in top[:k]], k_max=k, draws=draws,
                                     seed=seed, cache=cache)[0]

    gather: dict[str, Callable[[], Any]] = {
        "path-patching": lambda: cached_path_patching(model, pairs, cache=cache)[0],
        "knockout-curve": curve,
        "attention": lambda: cached_role_attention(model, pairs, cache=cache)[0],
        "mlp-projections": lambda: cached_mlp_projections(model, pairs, cache=cache)[0],
        "logit-lens": lambda: cached_logit_lens(model, pairs, cache=cache)[0],
    }
    for i, s in enumerate(charted_steps(), start=2):
        got[s.technique] = gather[s.technique]()
        step(i)
    table = got["path-patching"]
    ranking, top = ranked()
    patching = wide_rows(table.values, keep=lambda v: v.group == "*" and v.component in ("head", "mlp")
                         and v.metric in ("effect", "logit_diff"))
    wanted = {(layer, h) for layer, h, _ in top[:top_k]}
    circuit = circuit_diagram(model, pairs, k=min(max(top_k, 5), f.n_layers * f.n_heads), mlps=min(3, f.n_layers),
                              cache=cache).to_json()
    step(len(phase))
    kept: dict[str, int] = {}
    for p in pairs:
        kept[p.op] = kept.get(p.op, 0) + 1
    notes = [n for n in (table.effect_note(),) if n]
    from engine.findings.notes import labels
    from engine.findings.summary import circuit_summary
    summary = [f.__dict__ for f in circuit_summary(model, pairs, cache)]  # every technique's sentence, cached
    findings = []
    if paper:
        from engine.findings.paper import reproduce
        findings = [r.to_json() for r in reproduce(model, spec, cache, second=second, progress=paper_progress,
                                                   on_row=on_row)]
    return Report(
        title=f"Arithmetic circuits of {f.spec}",
        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        model=f.to_dict(),
        prompt_set={**described, "hash": prompt_set_hash(pairs), "n_kept": len(pairs)},
        versions=versions(),
        accuracy=[{"op": op, "kept": n} for op, n in sorted(kept.items())],
        patching=patching,
        top_heads=[{"layer": layer, "head": h, ranking: e} for layer, h, e in top[:max(top_k, 5)]],
        roles=[r.__dict__ for r in got["attention"] if (r.layer, r.head) in wanted],
        projections=[v.__dict__ for v in got["mlp-projections"]],
        lens=[r.__dict__ for r in got["logit-lens"] if r.group == "*"],
        knockout=[p.__dict__ for p in got["knockout-curve"]],
        notes=notes,
        paper=findings,
        summary=summary,
        circuit=circuit,
        pins=[{"component": c, "note": n} for c, n in labels(f.fingerprint, cache).items()],
    )


def report_work(model, spec, cache, *, k_max: int = 10, draws: int = 5):
    """The forward work of :func:`build_report` (``engine.cost.Work``) and the pairs it is counted in passes of:
    each phase unless cached -- the set's filter (not run yet: every generated prompt counted as kept), path
    patching, the attention by role, the MLP projections, the logit lens and the knockout curve (its ranking not
    known yet: counted on stand-in heads, the same number of sets); the circuit reads the phases before it."""
    from engine.cost import NO_WORK, unless_cached
    from engine.prompts.promptsets import generate
    from engine.results import NotCached, cache_only
    from engine.techniques.accuracy import kept_pairs, scoring_work
    from engine.techniques.attention import cached_role_attention, end_rows_work
    from engine.techniques.knockout_curve import cached_knockout_curve, curve_work
    from engine.techniques.logit_lens import cached_logit_lens, logit_lens_work
    from engine.techniques.mlp_projections import cached_mlp_projections, projections_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    w = NO_WORK
    try:
        with cache_only():
            pairs, _ = kept_pairs(model, spec, cache=cache)
    except NotCached:
        pairs = generate(model.tokenizer, spec)[0]
        w = scoring_work(model, pairs, full=False)
    if not pairs:
        return w, pairs
    f = model.facts
    try:
        with cache_only():
            table, _ = cached_path_patching(model, pairs, cache=cache)
        ranked = [(layer, h) for layer, h, _ in table.top_heads(k_max)]
    except NotCached:
        w += path_patching_work(model, pairs)
        ranked = [(i // f.n_heads % f.n_layers, i % f.n_heads) for i in range(min(k_max, f.n_layers * f.n_heads))]
    k = min(k_max, len(ranked))
    seed = spec.seed
    w += unless_cached(lambda: cached_role_attention(model, pairs, cache=cache), lambda: end_rows_work(model, pairs))
    w += unless_cached(lambda: cached_mlp_projections(model, pairs, cache=cache),
                       lambda: projections_work(model, pairs))
    w += unless_cached(lambda: cached_logit_lens(model, pairs, cache=cache), lambda: logit_lens_work(model, pairs))
    w += unless_cached(lambda: cached_knockout_curve(model, pairs, ranked[:k], k_max=k, draws=draws, seed=seed,
                                                     cache=cache),
                       lambda: curve_work(model, pairs, ranked[:k], k_max=k, draws=draws, seed=seed))
    return w, pairs

