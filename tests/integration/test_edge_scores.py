"""The edge-scores command: one row per edge of MIB's graph, cached, and MIB files with the lab's own edge scores."""

from __future__ import annotations

import csv
import json
import math

import pytest

from engine.techniques.edge_scores import mib_edge_graph, parse_sizes
from engine.techniques.faithfulness import mib_edges
from tests.integration.test_cli import run_cli


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_mib_graph_holds_the_scores_and_the_top_edges():
    names = [f"{p}->{c}" + (f"<{q}>" if q else "") for p, c, q in mib_edges(2, 2)]
    scores = {n: (-1) ** i * i / 10 for i, n in enumerate(names)}
    g = mib_edge_graph(scores, 2, 2, 16, size=0.1, node_scores=[0.5] * 6)
    assert g["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
    assert {n: e["score"] for n, e in g["edges"].items()} == scores
    kept = [n for n, e in g["edges"].items() if e["in_graph"]]
    assert kept == names[-math.floor(0.1 * len(names)):]  # the largest |score|: the last ones
    assert g["nodes"]["a0.h0"]["score"] == 0.5 and g["nodes"]["logits"]["in_graph"]
    touched = {x.split("<")[0] for n in kept for x in n.split("->")}
    assert {n for n, v in g["nodes"].items() if v["in_graph"]} == touched | {"input", "logits"}
    assert all(e["in_graph"] for e in mib_edge_graph(scores, 2, 2, 16)["edges"].values())
    assert parse_sizes("0.01,0.05") == [None, 0.01, 0.05]
    with pytest.raises(ValueError):
        parse_sizes("2")


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
