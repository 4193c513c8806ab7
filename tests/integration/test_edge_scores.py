"""The edge-scores command: one row per edge of MIB's graph, cached, and MIB files with the lab's own edge scores."""

from __future__ import annotations

import csv
import json
import math

import pytest

from tests.helpers.cli import run_cli


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_cli_rows_cache_and_mib_files(tmp_path):
    cache = tmp_path / "results.duckdb"
    out, mib = tmp_path / "edges.csv", tmp_path / "mib"
    args = ("edge-scores", "--model", "organism", "--op", "sub", "--n", "3", "--ranking", "eap", "--out", str(out),
            "--mib-dir", str(mib), "--mib-sizes", "0.05")
    r = run_cli(*args, cache=cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = _csv(out)
    assert list(rows[0]) == ["edge", "eap"] and len(rows) == res["edges"]
    assert res["rankings"]["eap"]["forward_equivalents"] > 0 and res["rankings"]["eap"]["cached"] is False
    files = sorted(mib.glob("*/edges-eap/*.json"))
    assert [f.name for f in files] == ["importances.json", "size-0.05.json"]
    assert files[0].parent.parent.name == "arithmetic-subtraction_organism"
    g = json.loads(files[1].read_text())
    csv_scores = {row["edge"]: float(row["eap"]) for row in rows}  # the CSV's set is the task's own here
    assert set(g["edges"]) == set(csv_scores)
    assert all(g["edges"][n]["score"] == pytest.approx(v, abs=1e-9) for n, v in csv_scores.items())
    assert sum(e["in_graph"] for e in g["edges"].values()) == math.floor(0.05 * len(rows) + 1e-9)
    assert all("score" in v for n, v in g["nodes"].items() if n not in ("input", "logits"))
    again = run_cli(*args, cache=cache)
    assert again.returncode == 0 and json.loads(again.stdout)["rankings"]["eap"]["cached"] is True


def test_bad_sizes_one_line_exit_2(tmp_path):
    r = run_cli("edge-scores", "--op", "sub", "--n", "2", "--mib-dir", str(tmp_path), "--mib-sizes", "7",
                "--out", str(tmp_path / "x.csv"), cache=tmp_path / "c.duckdb")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "(0, 1]" in lines[0], r.stderr


def test_cli_faithfulness_curve_cached(tmp_path):
    cache, out, faith = tmp_path / "results.duckdb", tmp_path / "edges.csv", tmp_path / "faith.csv"
    args = ("edge-scores", "--model", "organism", "--op", "sub", "--n", "2", "--ranking", "eap", "--out", str(out),
            "--faithfulness", str(faith))
    r = run_cli(*args, cache=cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["faithfulness"]
    assert res["cached"] is False and res["forward_equivalents"] > 0
    rows = _csv(faith)
    assert list(rows[0])[:5] == ["ranking", "metric", "size", "k", "f"]
    logit = {float(row["size"]): row for row in rows if row["ranking"] == "eap" and row["metric"] == "logit"}
    assert float(logit[0.0]["f"]) == pytest.approx(0.0, abs=1e-6) and float(logit[1.0]["f"]) == pytest.approx(1.0)
    assert int(logit[1.0]["k"]) == len(_csv(out)) and int(logit[0.05]["k"]) == math.floor(0.05 * int(logit[1.0]["k"]))
    assert {(s["ranking"], s["metric"]) for s in res["scores"]} == {(r, m) for r in ("eap", "random")
                                                                   for m in ("logit", "accuracy")}
    eap_logit = next(s for s in res["scores"] if s["ranking"] == "eap" and s["metric"] == "logit")
    random_logit = next(s for s in res["scores"] if s["ranking"] == "random" and s["metric"] == "logit")
    assert eap_logit["gap"] == pytest.approx(eap_logit["cpr"] - random_logit["cpr"], abs=1e-9)
    assert {float(row["size"]) for row in rows if row["ranking"] == "random"} == set(logit)
    again = run_cli(*args, cache=cache)
    assert again.returncode == 0 and json.loads(again.stdout)["faithfulness"]["cached"] is True
    assert _csv(faith) == rows
    # mean ablation: its own cached curves (the edge scores reused), the model's circuit still f = 1
    mean = run_cli(*args, "--ablation", "mean", cache=cache)
    assert mean.returncode == 0, mean.stderr
    assert json.loads(mean.stdout)["faithfulness"]["cached"] is False
    m_logit = {float(row["size"]): row for row in _csv(faith) if row["ranking"] == "eap" and row["metric"] == "logit"}
    assert float(m_logit[1.0]["f"]) == pytest.approx(1.0) and set(m_logit) == set(logit)


def test_cli_position_resolutions(tmp_path):
    """``--resolution``: circuits of edges (or heads and MLPs) at token roles, ranked by EAP by role, each cached on
    its own; the exact ranking of heads and MLPs at token roles (each unit patched alone) beside it."""
    cache, out, faith = tmp_path / "results.duckdb", tmp_path / "edges.csv", tmp_path / "faith.csv"
    base = ("edge-scores", "--model", "organism", "--op", "sub", "--n", "2", "--ranking", "eap", "--out", str(out),
            "--faithfulness", str(faith))
    seen = {}
    for resolution in ("edge-position", "node-position"):
        r = run_cli(*base, "--resolution", resolution, cache=cache)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["faithfulness"]["cached"] is False and res["faithfulness"]["resolution"] == resolution
        units = _csv(out)  # the scores of the units the circuits are made of, not the edges'
        assert len(units) == res["units"] and set(units[0]) == {"unit", "eap"}
        rows = _csv(faith)
        seen[resolution] = int(next(row["k"] for row in rows if row["ranking"] == "eap" and row["size"] == "1.0"))
        assert {row["ranking"] for row in rows} == {"eap", "random"}
    assert seen["edge-position"] == 5 * res["edges"]  # every edge at five roles
    exact = run_cli(*base[:-4], "--ranking", "exact", "--out", str(out), "--faithfulness", str(faith),
                    "--resolution", "node-position", cache=cache)
    assert exact.returncode == 0, exact.stderr
    units = {row["unit"]: float(row["exact"]) for row in _csv(out)}
    assert len(units) == json.loads(exact.stdout)["units"] and "m0@operator" in units
    # each head and MLP at each role patched alone: a few hundred passes of the set, not exact edge patching's
    # thousands (the edges are not scored on the way)
    assert json.loads(exact.stdout)["rankings"]["exact"]["forward_equivalents"] < 1_000
    rows = _csv(faith)
    assert {row["ranking"] for row in rows} == {"exact", "random"}
    assert int(next(row["k"] for row in rows if row["ranking"] == "exact" and row["size"] == "1.0")) == seen[
        "node-position"]  # the same units: every head and MLP at five roles


@pytest.mark.parametrize("ranking,nodes", [("eap", False), ("exact", True)])
def test_role_scores_come_back_from_the_cache_bit_for_bit(organism, tmp_path, ranking, nodes):
    """The scores by token role (every edge's, or every head's and MLP's, at each role) are stored as one float64
    array: computed and read back, they are role_scores' own values to the last bit, in its shape."""
    import numpy as np

    from cache import ResultCache
    from engine.prompts.promptsets import PromptSetSpec, generate
    from engine.techniques.attention import CIRCUIT_ROLES
    from engine.techniques.edge_scores import cached_role_scores, role_scores
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(n=2, ops=("sub",), seed=0))
    plain = role_scores(organism, pairs, ranking, nodes=nodes)  # [E or N, R]
    cache = ResultCache(tmp_path / "results.duckdb")
    cold, art, computed = cached_role_scores(organism, pairs, ranking, nodes=nodes, cache=cache)
    warm, again, hit = cached_role_scores(organism, pairs, ranking, nodes=nodes, cache=cache)
    assert computed and not hit and set(art) == set(again) == {"seconds", "forward_equivalents"}
    assert plain.shape[1] == len(CIRCUIT_ROLES) and cold.dtype == warm.dtype == np.float64
    assert cold.tobytes() == warm.tobytes() == plain.astype(np.float64).tobytes()
