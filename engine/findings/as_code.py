"""Copy as code: a page's view as the CLI command and the notebook lines that reproduce its numbers.

``set_flags`` / ``set_python`` write a prompt set (``PromptSetSpec``) as ``python -m engine`` flags and as the
constructor call the notebook API takes (only the fields that differ from the defaults); each page's function
below writes its own view.  A test runs each snippet and compares its output with the page's numbers.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields

from engine.prompts.promptsets import PromptSetSpec


@dataclass(frozen=True)
class Snippet:
    """A view as code: ``cli`` (``python -m engine`` lines, one command a line; None where no command reproduces
    the view), ``py`` (notebook lines whose last line prints the view's numbers as a Python literal) and ``note``
    (what the code reproduces, in the page's words)."""

    cli: str | None
    py: str
    note: str = ""


def set_flags(spec: PromptSetSpec) -> list[str]:
    """The CLI's prompt-set flags for ``spec`` (a written template: ``--template`` with its operation)."""
    out = ["--op", ",".join(spec.ops), "--n", str(spec.n), "--seed", str(spec.seed)]
    if spec.templates:
        for t in spec.templates:
            out += ["--template", t.split(":", 1)[1]]
    else:
        out += ["--families", ",".join(spec.families)]
    if (spec.operand_lo, spec.operand_hi) != (1, 9):
        out += ["--operands", f"{spec.operand_lo}-{spec.operand_hi}"]
    for flag, on in (("--allow-negative", spec.allow_negative), ("--no-balance", not spec.balance),
                     ("--every", spec.every)):
        if on:
            out.append(flag)
    if spec.decimals:
        out += ["--decimals", str(spec.decimals)]
    if spec.counterfactual != "operator-removed":
        out += ["--counterfactual", spec.counterfactual]
    if spec.digit != "first":
        out += ["--digit", spec.digit]
    if spec.carry != "any":
        out += ["--carry", spec.carry]
    return out


def set_python(spec: PromptSetSpec) -> str:
    """``PromptSetSpec(...)`` with the fields of ``spec`` that differ from the defaults."""
    base = PromptSetSpec()
    args = [f"{f.name}={getattr(spec, f.name)!r}" for f in fields(spec)
            if getattr(spec, f.name) != getattr(base, f.name)]
    return f"PromptSetSpec({', '.join(args)})"


def model_options(model) -> dict[str, str]:
    """How ``model`` (a loaded backend, or a spec string) was opened, where it differs from the defaults:
    ``dtype`` / ``backend`` -> value (the same names as ``open_model``'s arguments and the CLI's flags)."""
    if isinstance(model, str):
        return {}
    opts = {"dtype": model.facts.dtype, "backend": getattr(model, "name", "bridge")}
    return {k: v for k, v in opts.items() if v != {"dtype": "float32", "backend": "bridge"}[k]}


def model_spec_of(model) -> str:
    """The spec ``model`` was opened from (``model``: a loaded backend, or a spec string)."""
    return model if isinstance(model, str) else model.facts.spec


def command(name: str, model, spec: PromptSetSpec | None, *args: str) -> str:
    """``python -m engine NAME --model SPEC`` with how the model was opened (:func:`model_options`), the set's flags
    (:func:`set_flags`) and ``args``, quoted."""
    opts = [x for k, v in model_options(model).items() for x in (f"--{k}", v)]
    return shlex.join(["python", "-m", "engine", name, "--model", model_spec_of(model), *opts,
                       *(set_flags(spec) if spec else []), *args])


def opening(model, spec: PromptSetSpec | None, names: list[str], *, lines: tuple[str, ...] = (),
            cache: bool = True) -> str:
    """The notebook's first lines: the imports (``engine``'s public ``names``; ``lines``: other imports), the model
    opened as the page's (``model``: a loaded backend, or a spec string), the dashboard's result cache (``cache``
    False: none) and the set's pairs the model answers right (``spec`` None: no set)."""
    base = ["open_model"] + (["ResultCache"] if cache else []) + (["PromptSetSpec", "kept_pairs"] if spec else [])
    how = [repr(model_spec_of(model))] + [f"{k}={v!r}" for k, v in model_options(model).items()]
    out = [f"from engine import {', '.join(sorted(set(names + base)))}", *lines, "",
           f"model = open_model({', '.join(how)})"]
    if cache:
        out.append("cache = ResultCache()                                  # the dashboard's results")
    if spec:
        out.append(f"pairs, _ = kept_pairs(model, {set_python(spec)}, cache=cache)")
    return "\n".join(out) + "\n"


def home_code(model, spec: PromptSetSpec) -> Snippet:
    """The Home page: the model's facts and the accuracy table of the page's own prompt set (per operation and per
    template, first token and full answer)."""
    cli = "\n".join([command("info", model, None), command("accuracy", model, spec)])
    py = (opening(model, None, ["PromptSetSpec"], lines=("from engine.techniques.accuracy import accuracy_report",))
          + f"rows, _ = accuracy_report(model, {set_python(spec)}, cache=cache)\n"
          + "print({'facts': model.facts.to_dict(),\n"
          + "       'accuracy': [(r.op, r.template, r.n, r.first_token, r.full_answer, r.mean_p_answer)"
          + " for r in rows]})\n")
    return Snippet(cli, py, "The model's facts (`info`) and the accuracy table (`accuracy`: per operation, and per "
                            "template with the mean P(answer)); the notebook lines print both.")


def workspaces_code() -> Snippet:
    """The Workspaces page: the saved workspaces of the dashboard's result cache (a file's one: ``read_file``)."""
    py = ("from engine import ResultCache\n"
          "from engine.findings.workspace import read_file, saved\n\n"
          "cache = ResultCache()                                  # the dashboard's results (and workspaces)\n"
          "kept = saved(cache)\n"
          "# a workspace file: read_file(open('NAME.workspace.json').read())\n"
          "print([(w.name, w.model_spec, w.saved_at, len(w.pins), w.state) for w in kept])\n")
    return Snippet(None, py, "No `python -m engine` command lists or opens workspaces (a workspace is the dashboard's "
                             "view): the notebook lines list the saved ones, each with its model, pins and view.")


def path_patching_code(model, spec: PromptSetSpec, metric: str, k: int) -> Snippet:
    """The Path patching page's heatmap and its key heads (all operations' pairs)."""
    cli = command("path-patching", model, spec, "--out", "effects.csv")
    py = (opening(model, spec, ["cached_path_patching"])
          + "table, _ = cached_path_patching(model, pairs, cache=cache)\n"
          + f"print(table.top_heads({k}, {metric!r}))                 # the page's key heads: (layer, head, value)\n")
    return Snippet(cli, py, "The heatmap (effects.csv, one row per sender) and the key heads, all operations.")


def attention_code(model, spec: PromptSetSpec, layer: int, head: int, text: str) -> Snippet:
    """Head (layer, head)'s END-row attention by token role over the set, and on the typed prompt token by token
    (the Story's attention step)."""
    cli = command("attention", model, spec, "--out", "attention.csv")
    py = (opening(model, spec, [], lines=("from engine.techniques.attention import cached_role_attention",
                                          "from engine.techniques.promptlab import typed_attention"))
          + "roles, _ = cached_role_attention(model, pairs, cache=cache)\n"
          + f"row = typed_attention(model, {text!r}, {layer}, {head})\n"
          + f"print({{'set': [(r.role, r.value) for r in roles if (r.layer, r.head) == ({layer}, {head})],\n"
          + "       'prompt': [(t.position, t.token, t.weight, t.role) for t in row]})\n")
    return Snippet(cli, py, f"Every head's attention by token role (attention.csv; head {layer}.{head}'s rows are "
                            f"the set's chart) and head {layer}.{head} on the typed prompt, token by token.")


def knockout_code(model, spec: PromptSetSpec, heads: list[str], mlps: list[int], text: str,
                  k_max: int, draws: int) -> Snippet:
    """The Knockout page: the set's accuracy before / after the knockout set, the typed prompt's top-5 next tokens
    after it, and the curve of the top-k heads vs k random heads."""
    ko = (["--heads", ",".join(heads)] if heads else []) + (["--mlps", ",".join(map(str, mlps))] if mlps else [])
    lines = ([command("knockout", model, spec, *ko, "--text", text)] if heads or mlps else [])
    lines.append(command("knockout-curve", model, spec, "--k-max", str(k_max), "--draws", str(draws),
                         "--out", "curve.csv"))
    parsed = tuple(tuple(int(x) for x in h.split(".")) for h in heads)
    py = (opening(model, spec, ["Knockout", "cached_path_patching", "knockout_accuracy", "mean_activations",
                                     "top_next_tokens", "typed_prompt_ids"],
                  lines=("from engine.techniques.knockout_curve import cached_knockout_curve",))
          + f"ko = Knockout(heads={parsed!r}, mlps={tuple(mlps)!r})\n"
          + "means = mean_activations(model, pairs)                 # mean ablation over the counterfactuals\n"
          + f"ids = typed_prompt_ids(model.tokenizer, {text!r}).ids\n"
          + "top5 = top_next_tokens(model, ids, ko=ko, means=means)\n"
          + "table, _ = cached_path_patching(model, pairs, cache=cache)\n"
          + f"ranked = [(a, b) for a, b, _ in table.top_heads({k_max})]\n"
          + f"curve, _ = cached_knockout_curve(model, pairs, ranked, k_max={k_max}, draws={draws}, cache=cache)\n"
          + "print({'accuracy_before': knockout_accuracy(model, pairs, Knockout(), means),\n"
          + "       'accuracy_after': knockout_accuracy(model, pairs, ko, means),\n"
          + "       'top5_after': [(t.token_id, t.prob) for t in top5],\n"
          + "       'curve': [(p.k, p.top_accuracy, p.random_mean) for p in curve]})\n")
    note = ("The accuracy before / after the knockout set and the typed prompt's top-5 after it (`knockout`), and "
            "the curve of the top-k heads vs k random heads (`knockout-curve`)."
            + ("" if heads or mlps else " Choose heads or MLPs to knock out for the `knockout` command: it needs "
                                        "at least one.")
            + ("" if spec.seed == 0 else f" The command draws its random heads with the set's seed ({spec.seed}); "
                                         "the page, like the notebook lines, with seed 0."))
    return Snippet("\n".join(lines), py, note)


def mlp_projections_code(model, spec: PromptSetSpec, text: str) -> Snippet:
    """The MLP projections page: the per-layer cosines (mean and sd over the set), the logit lens of the answer
    and the typed prompt's top number tokens per layer."""
    cli = "\n".join([command("mlp-projections", model, spec, "--text", text, "--out", "projections.csv"),
                     command("logit-lens", model, spec, "--out", "lens.csv")])
    py = (opening(model, spec, ["typed_prompt_ids"],
                  lines=("from engine.techniques.logit_lens import cached_logit_lens",
                         "from engine.techniques.mlp_projections import cached_mlp_projections, top_number_tokens"))
          + "vals, _ = cached_mlp_projections(model, pairs, cache=cache)\n"
          + "lens, _ = cached_logit_lens(model, pairs, cache=cache)\n"
          + f"typed = typed_prompt_ids(model.tokenizer, {text!r})\n"
          + f"top = top_number_tokens(model, {text!r}, typed.ids)\n"
          + "print({'projections': [(v.layer, v.metric, v.value, v.std) for v in vals],\n"
          + "       'lens': [(r.group, r.layer, r.mean_prob, r.median_rank, r.top1) for r in lens],\n"
          + "       'top_numbers': [(t.layer, t.rank, t.number) for t in top]})\n")
    return Snippet(cli, py, "The projections (projections.csv), the logit lens (lens.csv) and, with --text, the "
                            "typed prompt's top number tokens per layer.")


def position_patching_code(model, spec: PromptSetSpec, group: str, metric: str) -> Snippet:
    """The Position patching page: the layer x position heatmap of one group of the set's pairs."""
    cli = command("position-patching", model, spec, "--group", group, "--out", "positions.csv")
    py = (opening(model, spec, [],
                  lines=("from engine.techniques.position_patching import cached_layer_position_patching",))
          + "tokens = lambda ids: model.tokenizer.convert_ids_to_tokens(list(ids))   # each position's label\n"
          + f"cells, _ = cached_layer_position_patching(model, pairs, cache=cache, group={group!r}, tokens=tokens)\n"
          + f"print([(c.layer, c.rel, c.{metric}) for c in cells])  # the heatmap's cells: (layer, position, value)\n")
    return Snippet(cli, py, f"The heatmap of the group `{group}` (positions.csv: logit_diff and restored).")


def circuit_code(model, spec: PromptSetSpec, k: int, mlps: int, senders: bool, edges: str | None = None,
                 top: int = 20) -> Snippet:
    """The Circuit page: the diagram's nodes and edges (``edges``: the top ``top`` edges of that ranking instead)."""
    if edges:
        cli = command("circuit", model, spec, "--edges", edges, "--top", str(top), "--out", "circuit.json")
        py = (opening(model, spec, ["edge_diagram"])
              + f"d = edge_diagram(model, pairs, {edges!r}, top={top}, cache=cache)\n"
              + "print(([(n.id, n.effect) for n in d.nodes], [(e.source, e.target, e.via, e.weight) "
                "for e in d.edges]))\n")
        return Snippet(cli, py, "The diagram's nodes and edges (circuit.json, with the notes of pinned components).")
    cli = command("circuit", model, spec, "--k", str(k), "--mlps", str(mlps), *(["--senders"] if senders else []),
                  "--out", "circuit.json")
    py = (opening(model, spec, ["circuit_diagram"])
          + f"d = circuit_diagram(model, pairs, k={k}, mlps={mlps}, senders={senders}, cache=cache)\n"
          + "print(([(n.id, n.effect) for n in d.nodes], [(e.source, e.target, e.weight) for e in d.edges]))\n")
    return Snippet(cli, py, "The diagram's nodes and edges (circuit.json, with the notes of pinned components).")


def faithfulness_code(model, spec: PromptSetSpec, draws: int, ablation: str) -> Snippet:
    """The Faithfulness page: the curves of the exact, AtP and random rankings' circuits, their CPR and CMD."""
    cli = command("faithfulness", model, spec, "--draws", str(draws), "--ablation", ablation,
                  "--out", "faithfulness.csv")
    py = (opening(model, spec, ["cached_faithfulness"])
          + f"table, _ = cached_faithfulness(model, pairs, draws={draws}, ablation={ablation!r}, cache=cache)\n"
          + "print({'points': [(p.ranking, p.metric, p.k, p.f) for p in table.points],      # the curves\n"
          + "       'scores': [(s.ranking, s.metric, s.cpr, s.cmd) for s in table.scores]})  # the table\n")
    return Snippet(cli, py, "The curves (faithfulness.csv) and each ranking's CPR and CMD with their intervals. The "
                            "edges below: `python -m engine edge-scores` with the same set and `--ranking`; their "
                            "circuits with `--faithfulness curves.csv` and `--resolution edge`, `edge-position` or "
                            "`node-position`.")


def atlas_code(model, spec: PromptSetSpec, component: str, template: str) -> Snippet:
    """The Atlas page: one component (none typed: the grid's top head) over the operand grid of one template."""
    cli = command("operand-grid", model, spec, *(["--component", component] if component else []),
                  "--grid-template", template, "--out", "grid.csv")
    pick = ("comp = grid.top_head()                                 # none typed: the grid's strongest head\n"
            if not component else "")
    comp = ("None" if not component else
            f"parse_component({component!r}, model.facts.n_layers, model.facts.n_heads, model.facts.d_mlp)")
    neurons = "[comp] if comp is not None and comp.kind == 'neuron' else []"
    py = (opening(model, None, ["PromptSetSpec"],
                  lines=("from engine.techniques.operand_grid import operand_grid, parse_component",))
          + f"comp = {comp}\n"
          + f"grid = operand_grid(model, {set_python(spec)}, template={template!r},\n"
          + f"                    component=comp, neurons={neurons}, cache=cache)\n" + pick
          + "print([(r['a'], r['b'], r['right'], r['effect'], r['direct']) for r in grid.rows(comp)])  # its cells\n")
    return Snippet(cli, py, "The grid of the component (grid.csv, one row per operand pair). The heuristic neurons "
                            "below: `python -m engine heuristic-neurons` with the same set, `--grid-template` and "
                            "`--layer`.")


def prompt_lab_code(model, text: str) -> Snippet:
    """The Prompt lab: the typed prompt's tokens, its top-5 next tokens, P(answer), its rank and P(answer) on the
    counterfactual."""
    py = (opening(model, None, [], lines=("from engine.techniques.promptlab import analyse_prompt",),
                  cache=False)
          + f"rep = analyse_prompt(model, {text!r})\n"
          + "print({'tokens': rep.tokens, 'top5': [(t.token_id, t.prob) for t in rep.top5], 'p_answer': rep.p_answer,\n"
          + "       'answer_rank': rep.answer_rank, 'p_answer_cf': rep.p_answer_cf, 'counterfactual': rep.cf_ids})\n")
    return Snippet(None, py, "No `python -m engine` command analyses one prompt alone: `knockout`, `mlp-projections` "
                             "and `intervene` take it as `--text` and add its top next tokens to their own views.")


def numbers_code(model, spec: PromptSetSpec) -> Snippet:
    """The Numbers page's probes: per layer, position, target and method, the held-out score and its baseline."""
    cli = command("numbers", model, spec, "--no-causal", "--spectrum-out", "spectrum.csv", "--out", "numbers.csv")
    py = (opening(model, spec, [], lines=("from engine.techniques.numbers.probes import cached_number_probes",))
          + "rows, _ = cached_number_probes(model, pairs, cache=cache)\n"
          + "print([(r.layer, r.position, r.target, r.method, r.score, r.baseline) for r in rows])  # probes, helix\n")
    return Snippet(cli, py, "The probe and helix rows (numbers.csv) and the number tokens' spectrum (spectrum.csv); "
                            "without `--no-causal` the command also runs the causal check at the page's layer.")


def compare_code(model, spec: PromptSetSpec, spec_b: PromptSetSpec, metric: str, k: int, model_b=None, *,
                 findings: bool = False) -> Snippet:
    """The Compare page: A (the set) vs B (the set with another counterfactual kind, other templates or another answer
    digit; or the same set on ``model_b``, a loaded backend or a spec string), cell by cell with intervals;
    ``findings``: the paper's findings on A and B are shown too."""
    b_model = model if model_b is None else model_b
    lines = [command("path-patching", model, spec, "--out", "a.csv"),
             command("path-patching", b_model, spec_b, "--out", "b.csv")]
    if findings:
        lines += [command("reproduce", model, spec, "--out", "paper_a.html"),
                  command("reproduce", b_model, spec_b, "--out", "paper_b.html")]
    how = [repr(model_spec_of(model_b))] + [f"{k}={v!r}" for k, v in model_options(model_b).items()] if model_b else []
    py = (opening(model, spec, ["cached_path_patching"],
                  lines=("from engine.findings.compare import compare_findings, compare_tables" if findings else
                         "from engine.findings.compare import compare_tables",))
          + (f"model_b = open_model({', '.join(how)})\n" if model_b is not None else "model_b = model\n")
          + f"spec_b = {set_python(spec_b)}\n"
          + "pairs_b, _ = kept_pairs(model_b, spec_b, cache=cache)\n"
          + "table_a, _ = cached_path_patching(model, pairs, cache=cache)\n"
          + "table_b, _ = cached_path_patching(model_b, pairs_b, cache=cache)\n"
          + f"cmp = compare_tables(table_a, table_b, metric={metric!r}, k={k})\n"
          + (f"rows = compare_findings(model, {set_python(spec)}, model_b, spec_b, cache)\n" if findings else "")
          + "print({'cells': [(c.component, c.layer, c.head, c.diff, c.low, c.high) for c in cmp.cells],  # A - B\n"
          + "       'top_a': cmp.top_a, 'top_b': cmp.top_b"
          + (",\n       'findings': [(a.figure, a.lab, a.verdict, b.lab, b.verdict) for a, b in rows]})\n" if findings
             else "})\n"))
    return Snippet("\n".join(lines), py,
                   "No command compares two runs: the two `path-patching` lines write A's and B's heatmaps (a.csv, "
                   "b.csv)" + ("; the two `reproduce` lines each run's findings (the numbers are printed, the "
                               "report written)" if findings else "")
                   + "; the notebook lines give the difference of each cell with its interval and the two top-k "
                     "lists" + (", and the findings side by side." if findings else "."))


def intervene_code(model, spec: PromptSetSpec, text: str, components: str, action: str, positions: str,
                   factor: float, number: int | None, strength: float, source_text: str | None,
                   freeze: bool, direction_layer: int | None = None, direction: str = "class-mean") -> Snippet:
    """The Intervene page: the typed prompt's top next tokens before / after one intervention (``components``: the
    targets' names, comma-separated; ``spec``: the set whose counterfactual means a mean ablation takes, or whose
    prompts give a number's ``direction`` -- class-mean or probe -- at ``direction_layer``; None: its
    unembedding)."""
    where = "all" if action == "mean" else positions
    from_set = action == "add" and direction_layer is not None
    uses_set = action == "mean" or from_set
    args = ["--text", text, "--components", components, "--action", action]
    args += {"patch": ["--source", source_text] if source_text else [], "scale": ["--factor", f"{factor:g}"],
             "add": ["--number", str(number), "--strength", f"{strength:g}"]
             + (["--direction", direction, "--direction-layer", str(direction_layer)] if from_set else [])
             }.get(action, [])
    args += (["--positions", positions] if action != "mean" else []) + (["--freeze"] if freeze else [])
    cli = command("intervene", model, spec if uses_set else None, *args)
    source = ("()" if action != "patch" else
              f"tuple(check_typed_text(model.tokenizer, {source_text!r}).ids)" if source_text else
              f"tuple(typed_pair(model.tokenizer, {text!r}).cf_ids)   # the typed prompt's counterfactual")
    token = f"number_token(model.tokenizer, {text!r}, {number})" if action == "add" and not from_set else "None"
    means = "mean_activations(model, pairs)" if action == "mean" else "None"
    vector = (f"tuple(number_direction(model, pairs, {direction_layer}, {number}, {direction!r})[0])"
              "   # unit, [d_model]")
    py = (opening(model, spec if uses_set else None,
                  ["Intervention", "intervene", "number_token", "parse_targets"]
                  + (["mean_activations"] if action == "mean" else [])
                  + (["number_direction"] if from_set else []),
                  lines=("from engine.techniques.promptlab import check_typed_text, typed_pair",),
                  cache=uses_set)
          + "f = model.facts\n"
          + f"typed = check_typed_text(model.tokenizer, {text!r})\n"
          + (f"direction = {vector}\n" if from_set else "")
          + f"iv = Intervention({action!r}, parse_targets({components!r}, f.n_layers, f.n_heads, f.d_mlp), {where!r},\n"
          + f"                  factor={factor!r}, strength={strength!r}, source={source},\n"
          + f"                  direction_token={token}, freeze={freeze!r}"
          + (", direction=direction)\n" if from_set else ")\n")
          + "watch = typed.answer.answer_id if typed.answer is not None else None\n"
          + f"res = intervene(model, typed.ids, iv, watch=watch, means={means}, k=5)\n"
          + "print({'before': [(t.token_id, t.prob) for t in res.before.top],\n"
          + "       'after': [(t.token_id, t.prob) for t in res.after.top],\n"
          + "       'watched_prob_after': res.after.watched_prob})\n")
    return Snippet(cli, py, "The top next tokens before and after, and P(answer) (the command prints them as JSON).")


def templates_code(model, spec: PromptSetSpec) -> Snippet:
    """The Templates page: the written template's prompt set (pairs, candidates, dropped) and the pairs the model
    answers right (``spec``: the set with the template)."""
    cli = command("prompts", model, spec, "--out", "pairs.jsonl")
    py = (opening(model, spec, [],
                  lines=("from engine.prompts.promptsets import generate_set",))
          + f"gen = generate_set(model.tokenizer, {set_python(spec)})\n"
          + "print({'generated': len(gen.pairs), 'candidates': gen.candidates, 'dropped': len(gen.dropped),\n"
          + "       'kept': len(pairs), 'first': [p.ref_text for p in gen.pairs[:5]]})\n")
    return Snippet(cli, py, "The template's prompt pairs and candidates, and those the model answers right "
                            "(pairs.jsonl: the kept pairs).")


def paper_code(model, spec: PromptSetSpec, second: str | None) -> Snippet:
    """The Paper page: each finding's number on this model and set and its verdict (``second``: Fig. 12's model)."""
    cli = command("reproduce", model, spec, *(["--compare", second] if second else []), "--out", "paper.html")
    py = (opening(model, None, ["PromptSetSpec", "reproduce"])
          + (f"second = open_model({second!r})\n" if second else "")
          + f"rows = reproduce(model, {set_python(spec)}, cache{', second=second' if second else ''})\n"
          + "print([(r.figure, r.lab, r.verdict) for r in rows])   # the table: finding, this model, verdict\n")
    return Snippet(cli, py, "Each finding's number and verdict (the command also writes them, with the report, as "
                            "one HTML file).")


def improve_code(model, spec: PromptSetSpec, job_args: list[str], *, tuned: str | None = None,
                 py_request: str | None = None) -> Snippet:
    """The Improve page: the fine-tuning job's command (``job_args``: ``finetune``'s arguments, as the shown job ran
    them or as the form would start one) and, where the job left a tuned model (``tuned``: its folder), base vs
    tuned -- each task's accuracy and the tuned model's path patching on the set, as the page shows them;
    ``py_request``: the notebook's ``FinetuneRequest(...)`` of the form's job (no tuned model yet)."""
    cli = shlex.join(["python", "-m", "engine", "finetune", *job_args])
    if tuned is None:
        py = ("from engine.finetune.run import FinetuneRequest, run_finetune\n"
              "from engine.finetune.train import TrainConfig\n\n"
              f"record = run_finetune({py_request})\n"
              "print(record['result'])   # steps, losses, parameters trained\n")
        return Snippet(cli, py, "The job the form starts with its current values (schedule fields left empty take "
                                "the recipe's, in the command and the page alike); it saves the tuned model in --out.")
    opts = [x for k, v in model_options(model).items() for x in (f"--{k}", v)]
    cli += "\n" + command("path-patching", tuned, spec, *opts, "--out", "tuned.csv")
    how = [repr(tuned)] + [f"{k}={v!r}" for k, v in model_options(model).items()]
    py = (opening(model, spec, ["cached_path_patching"],
                  lines=("from engine.finetune.skill_demo import compare",))
          + f"tuned = open_model({', '.join(how)})\n"
          + "rows = compare(model, tuned, cache=cache)                  # base vs tuned accuracy per task\n"
          + "table, _ = cached_path_patching(tuned, pairs, cache=cache)   # the tuned model's heatmap\n"
          + "print({'tasks': [(r.task, r.n, r.base, r.tuned) for r in rows],\n"
          + "       'top_heads': table.top_heads(5, 'effect')})\n")
    return Snippet(cli, py, "The first line is the job's own command (its --out now holds the tuned model: give a "
                            "new folder to train again); the second writes the tuned model's heatmap (tuned.csv); "
                            "the notebook lines give the base vs tuned table and the tuned model's key heads.")


def transfer_code(model, spec: PromptSetSpec, spec_b: PromptSetSpec | None, bench: str | None, data_dir: str,
                  k: int) -> Snippet:
    """The Transfer page: the sidebar's set (A) against a second set (B: ``spec_b``, or the benchmark ``bench``'s
    questions from ``data_dir``), top-k overlap and cross knockouts."""
    if bench is not None:
        cli = command("transfer", model, spec, "--b-bench", bench, "--data-dir", data_dir, "--k", str(k))
        second = f"benchmark_pairs(model.tokenizer, {data_dir!r}, {bench!r}, {spec.n}, {spec.seed})"
        lines = ("from engine.techniques.accuracy import answered_right",
                 "from engine.techniques.transfer import benchmark_pairs")
        note = "The overlap and the knockouts of both sets (the command prints them as JSON)."
    else:
        cli = None
        second = f"generate(model.tokenizer, {set_python(spec_b)})[0]"
        lines = ("from engine.techniques.accuracy import answered_right",)
        note = ("No `python -m engine` command takes this second set: `transfer --b-families` keeps the set's "
                "operations and seed, the page's B is the next seed (word problems: additions only).")
    py = (opening(model, spec, ["generate", "transfer"] if bench is None else ["transfer"], lines=lines)
          + f"pairs_b = answered_right(model, {second}, cache=cache)\n"
          + f"res = transfer(model, pairs, pairs_b, names=('A', 'B'), k={k}, cache=cache)\n"
          + "print({'overlap': res.overlap, 'sets': [(s.name, s.n_pairs, s.accuracy, s.accuracy_ko_own,\n"
          + "                                         s.accuracy_ko_other, s.top_heads) for s in (res.a, res.b)]})\n")
    return Snippet(cli, py, note)
