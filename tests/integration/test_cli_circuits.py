"""CLI contract of the subcommands beyond the paper (attribution, position-patching, logit-lens)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.helpers.cli import run_cli


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory):
    return tmp_path_factory.mktemp("cli_circuits") / "results.duckdb"


def _shape():
    """(layers, heads) of the bundled model, from its config (the tests follow a retrained organism)."""
    import json as _json

    from engine.organism.recipe import DEFAULT_DIR
    cfg = _json.loads((DEFAULT_DIR / "config.json").read_text())
    return cfg["num_hidden_layers"], cfg["num_attention_heads"]


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_attribution_csv_columns_agreement_and_cache(cache_file, tmp_path):
    out = tmp_path / "atp.csv"
    args = ("attribution", "--model", "organism", "--op", "add,mul", "--n", "12", "--out", str(out))
    r = run_cli(*args, cache=cache_file)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = _csv(out)
    assert list(rows[0]) == ["component", "layer", "head", "exact", "atp", "abs_error", "exact_total", "atp_total"]
    L, H = _shape()
    assert len(rows) == res["senders"] == L * H + L
    for row in rows:
        assert float(row["abs_error"]) == pytest.approx(abs(float(row["exact"]) - float(row["atp"])))
    ag = res["agreement (heads)"]["atp vs exact"]
    assert -1 <= ag["spearman"] <= 1 and 0 <= ag["top10_overlap"] <= 10
    assert len(ag["missed_top10"]) == len(ag["invented_top10"]) == 10 - ag["top10_overlap"]
    assert set(res["seconds"]) == {"exact", "atp", "exact_total", "atp_total"}
    again = run_cli(*args, cache=cache_file)
    assert again.returncode == 0 and json.loads(again.stdout)["cached"] is True


def test_position_patch_and_logit_lens(cache_file, tmp_path):
    lp = tmp_path / "lp.csv"
    r = run_cli("position-patching", "--model", "organism", "--op", "sub", "--n", "8", "--out", str(lp),
                "--group", "op:sub", cache=cache_file)
    assert r.returncode == 0, r.stderr
    rows = _csv(lp)
    assert rows and {row["group"] for row in rows} == {"op:sub"}
    assert {row["token"] for row in rows if row["rel"] == "0"} == {"END"}
    lens = tmp_path / "lens.csv"
    r = run_cli("logit-lens", "--model", "organism", "--op", "sub", "--n", "8", "--out", str(lens), cache=cache_file)
    assert r.returncode == 0, r.stderr
    overall = [row for row in _csv(lens) if row["group"] == "*"]
    assert [int(row["layer"]) for row in overall] == list(range(-1, _shape()[0]))
    assert float(overall[-1]["top1"]) == 1.0  # kept prompts: the model's own output is right


@pytest.mark.parametrize("args, words", [
    (("position-patching", "--op", "sub", "--n", "4", "--group", "op:nope"), "not in this set"),
    (("attribution", "--op", "nope", "--n", "4"), "unknown"),
    (("logit-lens", "--op", "add", "--n", "0"), "positive"),
])
def test_bad_input_one_line_exit_2(cache_file, tmp_path, args, words):
    r = run_cli(*args, "--out", str(tmp_path / "x.csv"), cache=cache_file)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.stderr


def test_patch_receiver_writes_one_row_per_earlier_sender(cache_file, tmp_path):
    out = tmp_path / "h2h.csv"
    r = run_cli("path-patching", "--model", "organism", "--op", "add", "--n", "6", "--receiver", "2.3:k",
                "--out", str(out), cache=cache_file)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = _csv(out)
    assert res["receiver"] == "2.3:k" and len(rows) == res["senders"] == 2 * (_shape()[1] + 1)
    assert {int(row["layer"]) for row in rows} == {0, 1}
    bad = run_cli("path-patching", "--model", "organism", "--op", "add", "--n", "6", "--receiver", "2.3:x", "--out",
                  str(out), cache=cache_file)
    assert bad.returncode == 2 and "choose q, k or v" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
