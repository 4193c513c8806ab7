"""Copy as code (issue 51): each page's "This view as code" runs as written -- its `python -m engine` lines through
the CLI's own entry (``engine.cli.main.main``, what ``python -m engine`` calls) in this process, with a cache of their
own, and one line (Home's ``info``) in a real ``python -m engine`` subprocess; its notebook lines with exec on another
cache -- and gives the numbers of the page's engine call on the same settings (to 1e-6); a page whose view no command
reproduces says so."""

from __future__ import annotations

import ast
import functools
import math
import shlex

import pytest

from tests.app.conftest import ask_all, errors, page


def test_the_path_patching_snippet_reproduces_the_key_heads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("4_Path_patching.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    cli, py = [c.value for c in at.code][:2]
    shown = [(int(r["layer"]), int(r["head"]), float(r.iloc[2])) for _, r in at.dataframe[0].value.iterrows()]
    exec(compile(py, "snippet", "exec"), {})
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(a, b) for a, b, _ in printed] == [(a, b) for a, b, _ in shown]
    assert all(abs(v - w) < 1e-6 for (_, _, v), (_, _, w) in zip(printed, shown))
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    args = parser.parse_args(shlex.split(cli)[3:])
    assert args.cmd == "path-patching" and args.n == 8 and args.op == "add,sub,mul,div"


def test_the_intervene_command_prints_the_pages_numbers(tmp_path, monkeypatch, capsys):
    import json

    from engine.cli.main import main
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("15_Intervene.py")
    at.session_state["prompt"] = "Q: What is 7 plus 8? A:"
    at.run()
    at.multiselect(key="iv_components").set_value(["1.3", "1.1"]).run()
    at.radio(key="iv_action").set_value("scale").run()
    at.slider(key="iv_factor").set_value(-1.0).run()
    at.checkbox(key="iv_freeze").check().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    cli = at.code[0].value
    shown = float(next(m.value for m in at.metric if m.label.startswith("P(answer")))
    capsys.readouterr()
    assert main(shlex.split(cli)[3:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["components"] == ["1.3", "1.1"] and out["factor"] == -1.0 and out["freeze"]
    assert abs(out["watched_prob_after"] - shown) < 5e-4  # the page shows three decimals
    _, py = shown_code(at)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close(nb["before"], [(t["token_id"], t["prob"]) for t in out["before"]])
    assert close(nb["after"], [(t["token_id"], t["prob"]) for t in out["after"]])
    assert close(nb["watched_prob_after"], out["watched_prob_after"])


@pytest.mark.parametrize("kind,flag,caption", [
    ("class mean", "class-mean", "Direction: 7's class mean at END leaving layer 2"),
    ("probe", "probe", "Direction: the logistic probe of the answer at END leaving layer 2")])
def test_a_direction_from_the_set_on_the_page_its_command_and_its_notebook_lines(tmp_path, monkeypatch, capsys,
                                                                                 kind, flag, caption):
    """Intervene's 'add a number's direction' with its class mean or its probe over the sidebar set: the page's
    P(answer), the command's (with the set's flags) and the notebook's agree; the caption says which direction; a
    number the set does not answer twice is an st.error naming the answers it has."""
    import json

    from engine.cli.main import main
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("15_Intervene.py")
    at.session_state["prompt"] = "Q: What is 7 plus 8? A:"
    at.run()
    at.multiselect(key="iv_components").set_value(["2.resid"]).run()
    at.radio(key="iv_action").set_value("add a number's direction").run()
    at.radio(key="iv_direction").set_value(kind).run()
    assert at.selectbox(key="iv_direction_layer").value == 2  # the component's layer
    at.number_input(key="iv_number").set_value(7).run()
    at.slider(key="iv_strength").set_value(2.0).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any(c.value.startswith(caption) for c in at.caption), [c.value for c in at.caption]
    cli = at.code[0].value
    assert f"--direction {flag} --direction-layer 2" in cli and "--op add,sub,mul,div" in cli
    shown = float(next(m.value for m in at.metric if m.label.startswith("P(answer")))
    capsys.readouterr()
    assert main(shlex.split(cli)[3:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["direction"] == flag and out["direction_layer"] == 2 and out["strength"] == 2.0
    assert abs(out["watched_prob_after"] - shown) < 5e-4  # the page shows three decimals
    _, py = shown_code(at)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close(nb["after"], [(t["token_id"], t["prob"]) for t in out["after"]], 1e-5)
    at.number_input(key="iv_number").set_value(9999).run()
    assert not at.exception and any("choose one the set answers often enough" in e for e in errors(at)), errors(at)


# ---------------------------------------------------------------------------------------------
# every page's snippet, run: the CLI lines through the CLI's entry in this process (their own cache; one in a
# subprocess), the notebook lines with exec (another cache), each compared with the page's engine call on the same
# settings (no cache)
# ---------------------------------------------------------------------------------------------

TYPED = "Q: What is 7 plus 8? A:"


def shown_code(at) -> tuple[list[str], str]:
    """The page's 'This view as code': its CLI lines and its notebook lines."""
    bash = [c.value for c in at.code if c.language == "bash"]
    py = [c.value for c in at.code if c.language == "python"]
    assert len(bash) <= 1 and len(py) == 1, (bash, py)
    return (bash[0].splitlines() if bash else []), py[0]


def run_cli_lines(lines: list[str], tmp_path, *, in_a_subprocess: bool = False) -> list[dict]:
    """Each ``python -m engine`` line, in ``tmp_path`` with its own cache (``cli.duckdb``): the JSON each prints.
    A line runs in this process as ``python -m engine`` runs it (``tests.helpers.cli.run_cli``: no interpreter start,
    ML-stack import or teardown; the line filters its set with its own pass); ``in_a_subprocess=True`` runs it in a
    real ``python -m engine`` process instead (one test keeps that covered)."""
    import json

    from tests.helpers.cli import run_cli, run_cli_process
    out = []
    for line in lines:
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", "engine"], line
        run = run_cli_process if in_a_subprocess else run_cli
        done = run(*argv[3:], cache=tmp_path / "cli.duckdb", cwd=tmp_path, timeout=600)
        assert done.returncode == 0, (line, done.stderr[-2000:])
        out.append(json.loads(done.stdout))
    return out


def run_notebook(py: str, tmp_path, monkeypatch, capsys):
    """The notebook lines with exec, on a cache of their own: the literal their last line prints."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "notebook.duckdb"))
    capsys.readouterr()
    exec(compile(py, "snippet", "exec"), {})
    return eval(capsys.readouterr().out.strip().splitlines()[-1], {"nan": math.nan})  # a literal, NaN as nan


@functools.cache
def engine_pairs(n: int = 8):
    """The page's model and pairs, computed here without a cache (the pages' set: ``n`` prompts of each operation)."""
    from engine import PromptSetSpec, kept_pairs, open_model
    model = open_model("organism")
    pairs, _ = kept_pairs(model, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=n, seed=0))
    return model, pairs


def close(a, b, tol: float = 1e-6) -> bool:
    """Two nested tuples / lists of numbers and strings, equal up to ``tol`` on the floats."""
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol or (math.isnan(a) and math.isnan(b))
    return a == b


def test_the_knockout_snippets_reproduce_the_accuracy_the_top5_and_the_curve(tmp_path, monkeypatch, capsys):
    from engine.prompts.typed import typed_prompt_ids
    from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations, top_next_tokens
    from engine.techniques.knockout_curve import knockout_curve
    from engine.techniques.path_patching import cached_path_patching
    at = page("6_Knockout.py", n=8)
    at.session_state["prompt"] = TYPED
    # the app's knockout set and the curve's controls (ui.state, ui.url_state), as the widgets leave them
    for entry, value in (("ko_heads", ["1.3", "1.1"]), ("ko_mlps", [1]), ("ko_kmax", 3), ("ko_draws", 2)):
        at.session_state[entry] = value
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    assert [shlex.split(x)[3] for x in lines] == ["knockout", "knockout-curve"]
    model, pairs = engine_pairs()
    ko = Knockout(((1, 1), (1, 3)), (1,))
    means = mean_activations(model, pairs)
    before, after = knockout_accuracies(model, pairs, [Knockout(), ko], means)
    top5 = [(t.token_id, t.prob) for t in top_next_tokens(model, typed_prompt_ids(model.tokenizer, TYPED).ids,
                                                          ko=ko, means=means)]
    ranked = [(a, b) for a, b, _ in cached_path_patching(model, pairs)[0].top_heads(3)]
    curve = [(p.k, p.top_accuracy, p.random_mean) for p in knockout_curve(model, pairs, ranked, means, k_max=3,
                                                                          draws=2)]
    assert any(f"{after:.1%}" == m.value for m in at.metric)  # the page's own number
    assert at.multiselect(key="knockout_heads").value == ["1.3", "1.1"] and at.slider(key="ko_draws_input").value == 2
    ko_out, curve_out = run_cli_lines(lines, tmp_path)
    assert close([ko_out["accuracy_before"], ko_out["accuracy_after"]], [before, after])
    assert close([(t["token_id"], t["prob"]) for t in ko_out["top5_after"]], top5)
    assert close([(p["k"], p["top_accuracy"], p["random_mean"]) for p in curve_out["points"]], curve)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close([nb["accuracy_before"], nb["accuracy_after"]], [before, after])
    assert close(nb["top5_after"], top5) and close(nb["curve"], curve)


def test_the_mlp_projections_snippets_reproduce_the_projections_the_lens_and_the_top_numbers(tmp_path, monkeypatch,
                                                                                            capsys):
    from engine.prompts.typed import typed_prompt_ids
    from engine.techniques.logit_lens import cached_logit_lens
    from engine.techniques.mlp_projections import cached_mlp_projections, top_number_tokens
    at = page("5_MLP_projections.py", n=8)
    at.session_state["prompt"] = TYPED
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    model, pairs = engine_pairs()
    proj = [(v.layer, v.metric, v.value, v.std) for v in cached_mlp_projections(model, pairs)[0]]
    lens = [(r.group, r.layer, r.mean_prob, r.median_rank, r.top1) for r in cached_logit_lens(model, pairs)[0]]
    typed = typed_prompt_ids(model.tokenizer, TYPED)
    top = [(t.layer, t.rank, t.number) for t in top_number_tokens(model, TYPED, typed.ids,
                                                                  answer_id=typed.answer.answer_id) if t.rank <= 5]
    proj_out, lens_out = run_cli_lines(lines, tmp_path)
    assert close([(v["layer"], v["metric"], v["value"], v["std"]) for v in proj_out["per_layer"]], proj)
    assert close([("*", r["layer"], r["mean_prob"], r["median_rank"], r["top1"]) for r in lens_out["per_layer"]],
                 [r for r in lens if r[0] == "*"])
    assert close([(t["layer"], t["rank"], t["number"]) for t in proj_out["top_number_tokens"] if t["rank"] <= 5], top)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close(nb["projections"], proj) and close(nb["lens"], lens)
    assert close([t for t in nb["top_numbers"] if t[1] <= 5], top)


def test_the_position_patching_snippets_reproduce_the_heatmap(tmp_path, monkeypatch, capsys):
    import csv

    from engine.techniques.position_patching import cached_layer_position_patching
    at = page("8_Position_patching.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    group = at.selectbox(key="lp_group").value
    lines, py = shown_code(at)
    model, pairs = engine_pairs()
    cells = cached_layer_position_patching(model, pairs, group=group,
                                           tokens=lambda ids: model.tokenizer.convert_ids_to_tokens(list(ids)))[0]
    want = [(c.layer, c.rel, c.logit_diff) for c in cells]
    assert len(want) > 10
    run_cli_lines(lines, tmp_path)
    with open(tmp_path / "positions.csv", encoding="utf-8") as f:
        got = [(int(r["layer"]), int(r["rel"]), float(r["logit_diff"])) for r in csv.DictReader(f)
               if r["group"] == group]
    assert close(got, want)
    assert close(run_notebook(py, tmp_path, monkeypatch, capsys), want)


def test_the_circuit_snippets_reproduce_the_diagram(tmp_path, monkeypatch, capsys):
    import json

    from engine.techniques.circuit import circuit_diagram
    at = page("12_Circuit.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    model, pairs = engine_pairs()
    d = circuit_diagram(model, pairs, k=5, mlps=3)
    nodes, edges = [(n.id, n.effect) for n in d.nodes], [(e.source, e.target, e.weight) for e in d.edges]
    assert len(nodes) >= 8
    run_cli_lines(lines, tmp_path)
    got = json.loads((tmp_path / "circuit.json").read_text())
    assert close([(n["id"], n["effect"]) for n in got["nodes"]], nodes)
    assert close([(e["source"], e["target"], e["weight"]) for e in got["edges"]], edges)
    assert close(run_notebook(py, tmp_path, monkeypatch, capsys), (nodes, edges))


def test_the_circuit_pages_edges_and_their_snippets(tmp_path, monkeypatch, capsys):
    """The Circuit page drawing the top edges of MIB's graph (EAP): its button, then the diagram whose edges are the
    top 8 by |score| of the engine's EAP with the receiver's input named; the command and the notebook lines give
    the same nodes and edges."""
    import json

    from engine.techniques.circuit import edge_diagram
    from engine.techniques.edge_scores import cached_edge_scores
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("12_Circuit.py", n=2).run()
    at.radio(key="circuit_edges_input").set_value(True).run()
    at.number_input(key="circuit_top_input").set_value(8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert not at.get("vega_lite_chart") and not at.get("arrow_vega_lite_chart")  # asked first: nothing drawn yet
    next(b for b in at.button if b.label.startswith("Score every edge (EAP")).click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("The 8 edges of the largest |EAP" in c.value for c in at.caption)
    lines, py = shown_code(at)
    assert "--edges eap --top 8" in lines[0]
    model, pairs = engine_pairs(2)
    d = edge_diagram(model, pairs, "eap", top=8)
    rows, _, _ = cached_edge_scores(model, pairs, "eap")
    top = sorted(rows, key=lambda r: -abs(r.value))[:8]
    assert [abs(e.weight) for e in d.edges] == [abs(r.value) for r in top]
    assert {e.via for e in d.edges if e.target.startswith("h")} <= {"q", "k", "v"}
    nodes = [(n.id, n.effect) for n in d.nodes]
    edges = [(e.source, e.target, e.via, e.weight) for e in d.edges]
    run_cli_lines(lines, tmp_path)
    got = json.loads((tmp_path / "circuit.json").read_text())
    assert close([(n["id"], n["effect"]) for n in got["nodes"]], nodes, 1e-5)
    assert close([(e["source"], e["target"], e["via"], e["weight"]) for e in got["edges"]], edges, 1e-5)
    assert close(run_notebook(py, tmp_path, monkeypatch, capsys), (nodes, edges), 1e-5)


def test_the_faithfulness_snippets_reproduce_the_curves_and_the_scores(tmp_path, monkeypatch, capsys):
    import csv

    from engine.techniques.faithfulness import RANDOM_DRAWS, cached_faithfulness
    at = page("11_Faithfulness.py", n=4).run()  # the curves wait for their button; the code is shown
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    assert f"--draws {RANDOM_DRAWS} --ablation counterfactual" in lines[0]
    model, pairs = engine_pairs(4)  # 4 prompts of each operation: the curves three times (page, CLI, notebook)
    table, _ = cached_faithfulness(model, pairs, draws=RANDOM_DRAWS, ablation="counterfactual")
    points = [(p.ranking, p.metric, p.k, p.f) for p in table.points]
    scores = [(s.ranking, s.metric, s.cpr, s.cmd) for s in table.scores]
    (out,) = run_cli_lines(lines, tmp_path)
    assert close([(s["ranking"], s["metric"], s["cpr"], s["cmd"]) for s in out["scores"]], scores)
    with open(tmp_path / "faithfulness.csv", encoding="utf-8") as f:
        got = [(r["ranking"], r["metric"], int(r["k"]), float(r["f"])) for r in csv.DictReader(f)]
    assert close(got, points)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close(nb["points"], points) and close(nb["scores"], scores)


def test_the_atlas_snippets_reproduce_the_operand_grid(tmp_path, monkeypatch, capsys):
    import csv

    from engine import PromptSetSpec
    from engine.techniques.operand_grid import operand_grid
    at = page("14_Atlas.py", n=8)
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "ops": ["add"]}
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    template = at.selectbox(key="atlas_template").value
    lines, py = shown_code(at)
    model, _ = engine_pairs()
    grid = operand_grid(model, PromptSetSpec(ops=("add",), n=8, seed=0), template=template)
    want = [(r["a"], r["b"], r["right"], r["effect"], r["direct"]) for r in grid.rows(grid.top_head())]
    assert len(want) == 81
    run_cli_lines(lines, tmp_path)
    with open(tmp_path / "grid.csv", encoding="utf-8") as f:
        got = [(int(r["a"]), int(r["b"]), r["right"] == "True", float(r["effect"]), float(r["direct"]))
               for r in csv.DictReader(f)]
    assert close(got, want)
    assert close(run_notebook(py, tmp_path, monkeypatch, capsys), want)


def test_the_prompt_lab_snippet_reproduces_the_analysis_and_says_there_is_no_command(tmp_path, monkeypatch, capsys):
    from engine.techniques.promptlab import analyse_prompt
    at = page("3_Prompt_lab.py")
    at.session_state["prompt"] = TYPED
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    assert lines == [] and any("No `python -m engine` command" in c.value for c in at.caption)
    model, _ = engine_pairs()
    rep = analyse_prompt(model, TYPED)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert nb["tokens"] == rep.tokens and nb["counterfactual"] == rep.cf_ids
    assert close(nb["top5"], [(t.token_id, t.prob) for t in rep.top5])
    assert close([nb["p_answer"], nb["answer_rank"], nb["p_answer_cf"]],
                 [rep.p_answer, rep.answer_rank, rep.p_answer_cf])


def test_the_numbers_snippets_reproduce_the_probes(tmp_path, monkeypatch, capsys):
    import csv

    from engine.techniques.numbers.probes import cached_number_probes
    at = page("10_Numbers.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    model, pairs = engine_pairs()
    rows, _ = cached_number_probes(model, pairs)
    want = [(r.layer, r.position, r.target, r.method, r.score, r.baseline) for r in rows]
    run_cli_lines(lines, tmp_path)
    with open(tmp_path / "numbers.csv", encoding="utf-8") as f:
        got = [(int(r["layer"]), r["position"], r["target"], r["method"], float(r["score"]), float(r["baseline"]))
               for r in csv.DictReader(f)]
    assert close(got, want)
    assert close(run_notebook(py, tmp_path, monkeypatch, capsys), want)


def test_the_compare_snippets_reproduce_both_heatmaps_and_the_difference(tmp_path, monkeypatch, capsys):
    import csv

    from engine import PromptSetSpec, cached_path_patching, kept_pairs
    from engine.findings.compare import compare_tables
    at = page("17_Compare.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    b_kind = at.selectbox(key="cmp_kind").value
    lines, py = shown_code(at)
    assert f"--counterfactual {b_kind}" in lines[1]
    model, pairs = engine_pairs()
    pairs_b, _ = kept_pairs(model, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=8, seed=0, counterfactual=b_kind))
    table_a, table_b = cached_path_patching(model, pairs)[0], cached_path_patching(model, pairs_b)[0]
    cmp = compare_tables(table_a, table_b, metric="logit_diff", k=5)
    cells = [(c.component, c.layer, c.head, c.diff, c.low, c.high) for c in cmp.cells]
    assert any(c.differs for c in cmp.cells) or len(cells) > 10
    run_cli_lines(lines, tmp_path)
    for name, table in (("a.csv", table_a), ("b.csv", table_b)):
        with open(tmp_path / name, encoding="utf-8") as f:
            got = {(r["component"], int(r["layer"]), int(r["head"])): float(r["logit_diff"]) for r in csv.DictReader(f)}
        heads, mlps = table.heatmap("logit_diff")
        assert close([got[("head", a, b)] for a in range(len(heads)) for b in range(len(heads[0]))],
                     [float(v) for row in heads for v in row])
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert close(nb["cells"], cells) and close(nb["top_a"], cmp.top_a) and close(nb["top_b"], cmp.top_b)


def test_the_templates_snippets_reproduce_the_written_templates_set(tmp_path, monkeypatch, capsys):
    from engine import PromptSetSpec, kept_pairs
    from engine.prompts.promptsets import generate_set
    at = page("13_Templates.py", n=8).run()  # the page's example template, for addition
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    model, _ = engine_pairs()
    (template,) = [shlex.split(lines[0])[i + 1] for i, a in enumerate(shlex.split(lines[0])) if a == "--template"]
    spec = PromptSetSpec(ops=("add",), n=8, seed=0, templates=(f"add:{template}",))
    gen = generate_set(model.tokenizer, spec)
    kept, _ = kept_pairs(model, spec)
    assert len(gen.pairs) == len(at.dataframe[0].value) or len(gen.pairs) > 5  # the page shows the first five
    (out,) = run_cli_lines(lines, tmp_path)
    assert (out["generated"], out["candidates"], out["kept"]) == (len(gen.pairs), gen.candidates, len(kept))
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert (nb["generated"], nb["candidates"], nb["dropped"], nb["kept"]) == (len(gen.pairs), gen.candidates,
                                                                           len(gen.dropped), len(kept))
    assert nb["first"] == list(at.dataframe[0].value["X_r"])


def test_the_paper_snippets_reproduce_the_findings_table(tmp_path, monkeypatch, capsys):
    at = ask_all(page("2_Paper.py", n=2).run(), skip=())  # the smallest set that still has pairs of each operation
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    table = at.table[0].value
    shown = [(f, lab if lab != "–" else "", v) for f, lab, v in zip(table.index, table["this model"], table["verdict"])]
    assert any(v == "holds" for _, _, v in shown)
    (out,) = run_cli_lines(lines, tmp_path)
    assert [(r["figure"], r["lab"], r["verdict"]) for r in out["findings"]] == shown
    assert run_notebook(py, tmp_path, monkeypatch, capsys) == shown


def test_the_transfer_snippet_reproduces_the_table_and_says_there_is_no_command(tmp_path, monkeypatch, capsys):
    from engine import PromptSetSpec
    from engine.prompts.promptsets import format_spec, generate
    from engine.techniques.accuracy import answered_right
    from engine.techniques.transfer import transfer
    at = page("7_Transfer.py", n=8).run()  # B: the word problems (the page's default), the next seed
    next(b for b in at.button if b.label.startswith("Compare (")).click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    lines, py = shown_code(at)
    assert lines == [] and any("No `python -m engine` command takes this second set" in c.value for c in at.caption)
    model, pairs = engine_pairs()
    spec_b = format_spec(PromptSetSpec(ops=("add", "sub", "mul", "div"), n=8, seed=0), "word")
    res = transfer(model, pairs, answered_right(model, generate(model.tokenizer, spec_b)[0]), k=10)
    sets = [(s.name, s.n_pairs, s.accuracy, s.accuracy_ko_own, s.accuracy_ko_other, s.top_heads)
            for s in (res.a, res.b)]
    shown = at.dataframe[0].value
    assert list(shown["pairs"]) == [s[1] for s in sets]
    assert close(list(shown["knock out other's top-k"]), [s[4] for s in sets])
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert nb["overlap"] == res.overlap and close(nb["sets"], sets)


def test_every_story_screen_with_a_chart_shows_it_as_code_and_the_code_reproduces_it(tmp_path, monkeypatch, capsys):
    """The Story's screens: the answer (the Prompt lab's snippet), the key heads (Path patching's), the attention of
    the top head (its own: the set's role chart and the typed prompt's row), the MLPs (MLP projections'), the
    knockout curve (Knockout's); the heads' and the attention's notebook lines run and give the screen's numbers."""
    from engine.techniques.attention import role_attention
    from engine.techniques.path_patching import cached_path_patching
    from engine.techniques.promptlab import typed_attention
    from ui.story import screens
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    model, pairs = engine_pairs()
    table, _ = cached_path_patching(model, pairs)
    top = table.top_heads(5, "effect")
    shown = {}
    for step, (title, _) in enumerate(screens(), 1):
        at = page("1_Story.py", n=8)
        at.session_state["prompt"] = TYPED
        at.session_state["story_step"] = step
        at = ask_all(at.run())
        assert not at.exception and not errors(at), (title, at.exception, errors(at))
        if at.code:
            shown[title] = shown_code(at)
    assert len(shown) >= 5, list(shown)  # the screens with a chart of their own (Improve's waits for a job)
    commands = {t: [line.split()[3] for line in lines] for t, (lines, _) in shown.items()}
    assert sorted(sum(commands.values(), [])) == sorted(["path-patching", "attention", "mlp-projections", "logit-lens",
                                                         "knockout-curve"]), commands
    heads = next(py for lines, py in shown.values() if lines and "path-patching" in lines[0])
    assert close(run_notebook(heads, tmp_path, monkeypatch, capsys), [tuple(t) for t in top])
    attention = next(py for lines, py in shown.values() if lines and "attention" in lines[0])
    layer, head, _ = table.top_heads(1)[0]
    got = run_notebook(attention, tmp_path, monkeypatch, capsys)
    want_set = [(r.role, r.value) for r in role_attention(model, pairs) if (r.layer, r.head) == (layer, head)]
    want_row = [(t.position, t.token, t.weight, t.role) for t in typed_attention(model, TYPED, layer, head)]
    assert close(got["set"], want_set) and close(got["prompt"], want_row)


def test_compare_puts_the_papers_findings_side_by_side_and_its_code_reproduces_them(tmp_path, monkeypatch, capsys):
    """Compare's second view (issue 51): the paper's rows on A and on B, asked for by a button with its cost; the
    table's numbers and verdicts are those of `reproduce` on each set, in the command's output and the notebook's."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("17_Compare.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    press = [b for b in at.button if b.label.startswith("Check the paper's findings on A and B (estimated: about ")]
    assert len(press) == 1 and not [t for t in at.table if "B's verdict" in t.value.columns]  # nothing unasked
    press[0].click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    table = next(t.value for t in at.table if "B's verdict" in t.value.columns)
    lines, py = shown_code(at)
    assert [line.split()[3] for line in lines] == ["path-patching", "path-patching", "reproduce", "reproduce"]
    out_a, out_b = run_cli_lines(lines[2:], tmp_path)
    for col, out in (("A", out_a), ("B", out_b)):
        assert list(table[col]) == [r["lab"] or "–" for r in out["findings"]]
        assert list(table[f"{col}'s verdict"]) == [r["verdict"] for r in out["findings"]]
    assert {"holds", "does not hold", "inconclusive"} & set(table["A's verdict"])
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert [(f, a, va, b, vb) for f, a, va, b, vb in nb["findings"]] == [
        (f, a if a != "–" else "", va, b if b != "–" else "", vb)
        for f, a, va, b, vb in zip(table.index, table["A"], table["A's verdict"], table["B"], table["B's verdict"])]
    same = sum(x == y for x, y in zip(table["A's verdict"], table["B's verdict"]) if "not computed" not in (x, y))
    assert any(m.value.startswith(f"**{same} of ") for m in at.markdown)


def test_the_home_snippets_reproduce_the_facts_and_the_accuracy_table(tmp_path, monkeypatch, capsys):
    """Home's lines: ``info`` and ``accuracy`` give the page's facts and accuracy table, and so do its notebook lines.
    Its ``info`` line is the one CLI line of this file run in a real ``python -m engine`` subprocess, as written (the
    entry point as a process: engine/__main__.py, its exit status, its environment); every other line runs through
    ``engine.cli.main.main`` in this process (``run_cli_lines``)."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = ask_all(page("0_Home.py").run())
    assert not at.exception and not errors(at), (at.exception, errors(at))
    shown = at.dataframe[0].value  # per operation, as the page draws it
    lines, py = shown_code(at)
    assert [shlex.split(x)[3] for x in lines] == ["info", "accuracy"]
    # the one line of this file run in a real `python -m engine` process (see the docstring)
    (info,) = run_cli_lines(lines[:1], tmp_path, in_a_subprocess=True)
    (acc,) = run_cli_lines(lines[1:], tmp_path)
    assert info["fingerprint"] == acc["fingerprint"] and info["n_layers"] == 8
    assert sorted(acc["per_op"]) == sorted(shown.index)
    for op, row in shown.iterrows():
        assert close([acc["per_op"][op]["first_token"], acc["per_op"][op]["full_answer"]],
                     [float(row["first_token"]), float(row["full_answer"])])
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert nb["facts"]["fingerprint"] == info["fingerprint"]
    per_op = {op: (ft, fa, p) for op, tpl, _, ft, fa, p in nb["accuracy"] if tpl == "*"}
    assert all(close(list(per_op[op]), [float(r["first_token"]), float(r["full_answer"]), float(r["mean_p_answer"])])
               for op, r in shown.iterrows())
    assert len(nb["accuracy"]) == len(shown) + len(acc["per_template"])


def test_the_workspaces_snippet_lists_the_pages_workspaces_and_says_there_is_no_command(tmp_path, monkeypatch,
                                                                                         capsys):
    from cache import ResultCache
    from engine.backends import open_model
    from engine.findings.workspace import make, save
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    cache = ResultCache(tmp_path / "results.duckdb")
    model = open_model("organism")
    cache.pin(model.facts.fingerprint, "1.3", "operator mover")
    save(make("sevens", "organism", model.facts.fingerprint, {"ops": "add", "head": "1.3"}, cache), cache)
    at = page("16_Workspaces.py").run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    shown = at.dataframe[0].value
    lines, py = shown_code(at)
    assert not lines and any("No `python -m engine` command lists" in c.value for c in at.caption)
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))  # the page's cache: its workspaces
    capsys.readouterr()
    exec(compile(py, "snippet", "exec"), {})
    got = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(n, m, p) for n, m, _, p, _ in got] == list(zip(shown["name"], shown["model"], shown["pins"]))
    assert got[0][4] == {"ops": "add", "head": "1.3"}
