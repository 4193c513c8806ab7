"""Every export on every set (issue 47, Build 4): the HTML report, the circuit diagram's JSON and SVG, the MIB export
and the CSVs of the pages, built through the functions the CLI and the pages call, on every kind of set the sidebar
or the CLI makes -- the paper's Figure 8 templates, a written template, a file of written pairs -- under every
counterfactual kind, on the bundled model, SmolLM2 and Gemma 3; and on sets where something has nothing to compute
(one pair, one operation, no MIB task, a model that answers almost none right): the export is built and says why,
or the set is refused in one sentence that says what to change.

Each command runs in this process as ``python -m engine`` runs it (its parser and its ``run``), on the model and
result cache the module opened once; the sets are tiny (real models: 1 to 4 kept pairs), so the matrix costs little
more than one report per set.  The researcher's case of the issue (SmolLM2, a written template, the report opened
offline in Chromium) is ``tests/e2e/test_report_browser.py``.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.prompts.pairs import COUNTERFACTUALS, PromptError
from tests.conftest import TIMINGS

#: the issue's written template (the researcher's, SmolLM2): "and" has no paired operation to swap to
APPLES = "{A} apples [and] {B} apples make"
#: a written template whose operator has a swap (+ -> -): the operator-swapped kind on a written template
PLUS = "{A} [plus] {B} is"
CF_KINDS = tuple(COUNTERFACTUALS)
#: prompts per operation per model: a few kept pairs on each (seeded, so always the same ones)
N = {"organism": 3, "smollm2": 4, "gemma3": 4}


@dataclass
class Lab:
    name: str
    spec: str       # the --model argument
    model: object
    cache: object
    tmp: Path
    seconds: float = 0.0
    by_command: dict = field(default_factory=dict)


_LABS: dict[str, Lab] = {}


def _open_lab(name: str, tmp_path_factory) -> Lab:
    """The model ``name`` opened once for the module, with its own result cache."""
    if name in _LABS:
        return _LABS[name]
    from cache import ResultCache
    t0 = time.monotonic()
    if name == "organism":
        from engine.backends import open_model
        model, spec = open_model("organism"), "organism"
    elif name == "smollm2":
        from tests.helpers.smollm2 import open_smollm2
        model = open_smollm2()
        spec = model.facts.spec
    else:
        from tests.helpers.gemma3 import open_gemma3
        model = open_gemma3()
        spec = model.facts.spec
    tmp = tmp_path_factory.mktemp(f"exports_{name}")
    _LABS[name] = Lab(name, spec, model, ResultCache(tmp / "results.duckdb"), tmp, time.monotonic() - t0)
    return _LABS[name]


def _timing(lab: Lab) -> None:
    TIMINGS.append(f"export matrix on {lab.name}: {lab.seconds:.0f} s (opening the model included; "
                   + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(lab.by_command.items(), key=lambda x: -x[1])) + ")")


@pytest.fixture(scope="module", autouse=True)
def _timings():
    yield
    for lab in _LABS.values():
        _timing(lab)
    _LABS.clear()


@pytest.fixture(scope="module", params=["organism", pytest.param("smollm2", marks=pytest.mark.realmodel),
                                        pytest.param("gemma3", marks=pytest.mark.realmodel)])
def lab(request, tmp_path_factory):
    out = _open_lab(request.param, tmp_path_factory)
    yield out
    if request.param != "organism":  # a real model's memory back once its tests are done
        _timing(_LABS.pop(request.param))


@pytest.fixture(scope="module")
def organism(tmp_path_factory):
    """The bundled model (the tests of the pages' other CSVs, small sets and the Paper's rows)."""
    return _open_lab("organism", tmp_path_factory)


def cli(lab: Lab, *argv: str) -> dict:
    """One subcommand run as ``python -m engine`` runs it (its parser, its ``run``), on the lab's opened model and
    cache; its JSON summary.  A refusal (PromptError, ValueError) propagates."""
    from engine.cli.context import Context
    from engine.cli.main import build_parser
    parser, commands = build_parser()
    args = parser.parse_args([*argv, "--model", lab.spec])
    ctx = Context(args)
    ctx.__dict__.update(model=lab.model, cache=lab.cache)  # the cached properties, opened once for the module
    buf = io.StringIO()
    t0 = time.monotonic()
    try:
        with redirect_stdout(buf):
            assert commands[args.cmd](args, ctx) in (0, None)
    finally:
        lab.seconds += time.monotonic() - t0
        lab.by_command[args.cmd] = lab.by_command.get(args.cmd, 0.0) + time.monotonic() - t0
    return json.loads(buf.getvalue())


def set_args(lab: Lab, kind: str, cf: str) -> list[str]:
    """The CLI options of a set: ``figure8`` (the paper's templates, addition and subtraction), ``template`` (the
    issue's written template; ``PLUS`` for the operator-swapped kind), ``every`` (the written template's every
    problem, unbalanced: the sidebar's "every prompt answered right") or ``pairs`` (a file of written pairs: the
    written template's kept pairs, as a user would write them)."""
    n = str(N[lab.name])
    if kind == "every":
        return ["--template", APPLES, "--op", "add", "--every", "--counterfactual", cf]
    if kind == "figure8":
        return ["--op", "add,sub", "--n", n, "--counterfactual", cf]
    if kind == "template":
        text = PLUS if cf == "operator-swapped" else APPLES
        return ["--template", text, "--op", "add", "--n", str(2 * int(n)), "--counterfactual", cf]
    return ["--pairs", str(pairs_file(lab))]


def pairs_file(lab: Lab) -> Path:
    """A JSONL file of written pairs (prompt, counterfactual, answer, op) from the written template's set."""
    path = lab.tmp / "my_pairs.jsonl"
    if not path.exists():
        from engine.prompts.promptsets import PromptSetSpec
        from engine.techniques.accuracy import kept_pairs
        spec = PromptSetSpec(ops=("add",), n=2 * N[lab.name], templates=(f"add:{APPLES}",))
        kept, _ = kept_pairs(lab.model, spec, cache=lab.cache)
        path.write_text("".join(json.dumps({"prompt": p.ref_text, "counterfactual": p.cf_text, "answer": p.answer,
                                            "op": p.op}) + "\n" for p in kept))
    return path


#: the written template under the carry kind: the bundled model answers none of its 6 (the problems whose units
#: digits can flip the carry), so only the paper's templates run it
SETS = ([("figure8", cf) for cf in CF_KINDS] + [("template", cf) for cf in CF_KINDS if cf != "carry"]
        + [("every", "operator-removed"), ("pairs", "file")])


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_report(html: str, n_kept: int) -> None:
    """The report's HTML: every chart embedded with its data, nothing fetched from the network, the set's size."""
    assert html.startswith("<!DOCTYPE html>") and "vegaEmbed" in html
    assert html.count('class="chart"') == 6, "a chart is missing from the report"
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "the report fetches from the network"
    assert re.search(rf"<th>n_kept</th><td[^>]*>{n_kept}</td>", html), "the report does not say how many pairs"
    assert "nan%" not in html and "max() arg" not in html


@pytest.mark.slow
@pytest.mark.parametrize("kind,cf", SETS, ids=[f"{k}-{c}" for k, c in SETS])
def test_every_export_builds_on_every_set(lab, kind, cf, tmp_path):
    """The report, the circuit (JSON, SVG), the MIB export and the CSVs of the report's techniques, on one set."""
    if kind == "every" and lab.name != "organism":
        pytest.skip("every prompt answered right: 42 pairs on SmolLM2, the written template's code path at 20 times "
                    "the cost; the bundled model runs it")
    if cf == "carry" and lab.name != "organism":
        pytest.skip("carry on 1..9: only sums whose units flip (none of the subtractions) -- SmolLM2 keeps 1 of its 4; "
                    "the bundled model runs it")
    from engine.techniques.circuit import Diagram
    from engine.techniques.faithfulness import MIB_TASKS, mib_submission
    from engine.techniques.path_patching import cached_path_patching
    from views.circuit_diagram import diagram_image
    args = set_args(lab, kind, cf)
    rep = cli(lab, "report", *args, "--out", str(tmp_path / "r.html"), "--k-max", "3", "--draws", "2")
    n_kept = rep["prompt_set"]["n_kept"]
    assert n_kept >= 1 and len(rep["top_heads"]) == 3
    check_report((tmp_path / "r.html").read_text(encoding="utf-8"), n_kept)
    if kind == "pairs":
        assert rep["prompt_set"]["file"] == "my_pairs.jsonl" and rep["prompt_set"]["n_in_file"] >= n_kept
    elif kind == "every":
        assert rep["prompt_set"]["every"] is True and rep["prompt_set"]["n_generated"] == 81  # 9 x 9 operand pairs
    elif cf != "operator-removed":
        assert rep["prompt_set"]["counterfactual"] == cf

    # the circuit: the CLI's JSON, drawn as the Circuit page's SVG download
    c = cli(lab, "circuit", *args, "--out", str(tmp_path / "c.json"))
    d = Diagram.from_json(json.loads((tmp_path / "c.json").read_text()))
    assert c["n_pairs"] == d.n_pairs == n_kept and len(c["heads"]) == 5
    assert diagram_image(d, "svg").startswith(b"<svg")
    if cf == "operator-removed":  # the page's PNG button (the same chart through vl-convert)
        assert diagram_image(d, "png").startswith(b"\x89PNG")

    # the CSVs the pages offer of the report's techniques (read from the cache the report filled)
    for name, extra in (("path-patching", ()), ("attention", ()), ("mlp-projections", ()), ("logit-lens", ()),
                        ("knockout-curve", ("--k-max", "3", "--draws", "2")), ("stability", ())):
        out = tmp_path / f"{name}.csv"
        cli(lab, name, *args, "--out", str(out), *extra)
        assert _rows(out), f"{name}: an empty CSV"

    # MIB: the Faithfulness page's download (the exact ranking's scores per task), from the path patching
    pairs = _pairs(lab, args)
    pp, computed = cached_path_patching(lab.model, pairs, cache=lab.cache)
    assert not computed
    files = mib_submission(lab.model, pairs, pp)
    tasks = {MIB_TASKS[p.op] for p in pairs if p.op in MIB_TASKS}
    assert sorted(f.split("_")[0] for f in files) == sorted(tasks)
    for graph in files.values():
        assert {"cfg", "nodes", "edges"} <= set(graph) and json.loads(json.dumps(graph)) == graph


def _pairs(lab: Lab, args: list[str]):
    """The set's pairs as the CLI reads them (generated and filtered, or the file's answered right)."""
    from engine.cli.context import Context
    from engine.cli.main import build_parser
    parser, _ = build_parser()
    ctx = Context(parser.parse_args(["path-patching", *args, "--out", "-", "--model", lab.spec]))
    ctx.__dict__.update(model=lab.model, cache=lab.cache)
    return ctx.pairs


@pytest.mark.slow
def test_a_set_the_counterfactual_cannot_be_made_for_is_refused_saying_what_to_change(lab, tmp_path):
    """The issue's template under the operator-swapped kind: "and" has no paired operation."""
    with pytest.raises(PromptError, match=r"no swapped operator for 'and': .* mark one of '\+', 'plus'"):
        cli(lab, "report", "--template", APPLES, "--op", "add", "--n", "4", "--counterfactual", "operator-swapped",
            "--out", str(tmp_path / "r.html"))


#: the pages' other CSVs (Path patching's panels, Position patching, Atlas, Transfer, Numbers, Faithfulness, Home)
#: and the sets a command cannot take, with the sentence it says instead (the bundled model only: their forward
#: passes are the pages' own, exact against references elsewhere; here, that they build on every kind of set)
PAGE_CSVS = {
    "carries": ("--k", "3"),
    "position-patching": ("--group", "*"),
    "attribution": ("--no-total",),
    "operand-grid": ("--operands", "1-4"),  # its grid: every operand pair of the range (16, not 81)
    "transfer": ("--k", "3"),
    "numbers": ("--no-causal",),
    "faithfulness": ("--draws", "2"),
}
#: (command, set kind) -> what it says instead of an export: the commands that need the set's templates
REFUSED = {(cmd, "pairs"): "unrecognized arguments: --pairs" for cmd in ("carries", "operand-grid", "transfer")}
REFUSED[("transfer", "operator-swapped")] = "the operator-swapped counterfactual needs an operator with a paired"
#: the grid needs every operand pair, and a units sum of 9 has no carry flip
REFUSED[("operand-grid", "carry")] = "no operands of the range flip the carry and keep the answer's units digit"
SMALL_SETS = [("figure8", cf) for cf in CF_KINDS] + [("template", "operator-removed"), ("pairs", "file")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,cf", SMALL_SETS, ids=[f"{k}-{c}" for k, c in SMALL_SETS])
def test_the_pages_other_csvs_build_on_every_kind_of_set(organism, kind, cf, tmp_path):
    from engine.cli.context import CliError
    lab = organism
    args = set_args(lab, kind, cf)
    for name, extra in PAGE_CSVS.items():
        out = tmp_path / f"{name}.csv"
        extra = (*extra, "--mib-dir", str(tmp_path / "mib")) if name == "faithfulness" else extra
        refusal = REFUSED.get((name, kind)) or REFUSED.get((name, cf))
        if refusal:
            with pytest.raises((PromptError, ValueError, CliError), match=re.escape(refusal)):
                cli(lab, name, *args, "--out", str(out), *extra)
            continue
        if name == "numbers" and (kind != "figure8" or cf == "carry"):  # carry: 3 of its 6 pairs kept here
            with pytest.raises(ValueError, match=r"the probes need at least 5 prompt pairs \(here \d\)"):
                cli(lab, name, *args, "--out", str(out), *extra)
            continue
        cli(lab, name, *args, "--out", str(out), *extra)
        assert _rows(out), f"{name}: an empty CSV"
    assert list((tmp_path / "mib").glob("*/importances.json"))
    if kind != "pairs":  # Home's accuracy table: of a generated set (the file's pairs are answered right by design)
        assert cli(lab, "accuracy", *args)["per_op"]


@pytest.mark.slow
def test_sets_with_little_to_compute_export_and_say_why(organism, tmp_path):
    """One pair; exponentiation only (no MIB task, no operand grid of the paper's templates); a file the model
    answers none of right; a knockout curve asked beyond the model's heads (the bundled model)."""
    lab = organism
    from engine.techniques.faithfulness import mib_submission
    one = ["--op", "add", "--n", "1"]
    rep = cli(lab, "report", *one, "--out", str(tmp_path / "one.html"), "--k-max", "3", "--draws", "2")
    assert rep["prompt_set"]["n_kept"] == 1
    check_report((tmp_path / "one.html").read_text(encoding="utf-8"), 1)
    cli(lab, "circuit", *one, "--out", str(tmp_path / "one.json"))
    cli(lab, "faithfulness", *one, "--out", str(tmp_path / "one.csv"), "--draws", "2", "--mib-dir",
        str(tmp_path / "mib"))
    assert len(list((tmp_path / "mib").glob("arithmetic-addition_*/importances.json"))) == 1

    power = ["--op", "pow", "--n", "2"]
    rep = cli(lab, "report", *power, "--out", str(tmp_path / "pow.html"), "--k-max", "3", "--draws", "2")
    check_report((tmp_path / "pow.html").read_text(encoding="utf-8"), rep["prompt_set"]["n_kept"])
    with pytest.raises(ValueError, match="no addition or subtraction prompts in the set: MIB's arithmetic tasks"):
        cli(lab, "faithfulness", *power, "--out", str(tmp_path / "pow.csv"), "--mib-dir", str(tmp_path / "m"))
    assert mib_submission(lab.model, _pairs(lab, power), cached_pp(lab, power)) == {}  # the page says why
    with pytest.raises(PromptError, match=r"templates \(paper\) have none for pow"):
        cli(lab, "operand-grid", *power, "--out", str(tmp_path / "grid.csv"))

    from engine.cli.context import CliError
    with pytest.raises(CliError, match="--counterfactual does not apply to my_pairs.jsonl: each of its pairs brings"):
        cli(lab, "report", "--pairs", str(pairs_file(lab)), "--counterfactual", "operand-a", "--out",
            str(tmp_path / "p.html"))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"prompt": "3 + 5 =", "counterfactual": "3 @ 5 =", "answer": 9}) + "\n")
    with pytest.raises(PromptError, match=r"answers none of the 1 pairs of .*wrong.jsonl right: check each pair"):
        cli(lab, "report", "--pairs", str(wrong), "--out", str(tmp_path / "w.html"))

    rep = cli(lab, "report", *one, "--out", str(tmp_path / "all.html"), "--k-max", "1000", "--draws", "1")
    L, H = lab.model.facts.n_layers, lab.model.facts.n_heads
    with pytest.raises(ValueError, match=f"--k-max 1000 exceeds the model's {L * H} heads"):
        cli(lab, "knockout-curve", *one, "--out", str(tmp_path / "ko.csv"), "--k-max", "1000")


def cached_pp(lab: Lab, args: list[str]):
    from engine.techniques.path_patching import cached_path_patching
    return cached_path_patching(lab.model, _pairs(lab, args), cache=lab.cache)[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind,cf", [("template", "operand-a"), ("figure8", "operator-swapped")])
def test_the_paper_findings_build_on_a_written_template_and_other_counterfactuals(organism, kind, cf, tmp_path):
    """The Paper page's findings (its CSV; ``reproduce``'s HTML): every row a verdict or why it has none (the bundled
    model; the Paper page on SmolLM2: tests/e2e/test_paper_browser.py)."""
    lab = organism
    res = cli(lab, "reproduce", *set_args(lab, kind, cf), "--out", str(tmp_path / "paper.html"))
    verdicts = {f["figure"]: f["verdict"] for f in res["findings"]}
    assert len(verdicts) >= 8
    assert set(verdicts.values()) <= {"holds", "does not hold", "inconclusive", "not computed"}
    assert all(f["note"] for f in res["findings"]), "a row says nothing of how it was judged or why not"
    if cf == "operator-swapped":  # word problems and exponentiation have no operator to swap: their rows say so
        notes = {f["figure"]: f["note"] for f in res["findings"]}
        assert verdicts["Table 3"] == "not computed" and "no exponentiation prompts under this" in notes["Table 3"]
        assert "no word prompts under this counterfactual (no swapped operator" in notes["Fig. 7"]
    html = (tmp_path / "paper.html").read_text(encoding="utf-8")
    n_kept = re.search(r"<th>n_kept</th><td[^>]*>(\d+)</td>", html)
    assert "The paper's findings on this model" in html and n_kept
    check_report(html, int(n_kept.group(1)))
