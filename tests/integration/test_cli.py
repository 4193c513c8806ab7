"""CLI contract of ``python -m engine``: JSON out, JSONL prompts, one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cache: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, ARITHLAB_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli") / "results.duckdb"


def test_info_prints_model_facts(cache_file):
    r = run_cli("info", "--model", "organism", cache=cache_file)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["n_layers"] >= 6 and facts["n_heads"] >= 8 and facts["n_kv_heads"] < facts["n_heads"]
    assert len(facts["fingerprint"]) >= 16


def test_prompts_jsonl_reproduces_right_answers(cache_file, tmp_path):
    out = tmp_path / "pairs.jsonl"
    r = run_cli("prompts", "--model", "organism", "--op", "all", "--n", "30", "--seed", "3",
                "--out", str(out), cache=cache_file)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == summary["kept"] > 100
    for rec in lines:
        for field in ("op", "template", "a", "b", "answer", "ref_text", "cf_text", "ref_ids", "cf_ids",
                      "answer_id"):
            assert field in rec
        assert len(rec["ref_ids"]) == len(rec["cf_ids"])
    # the ids, fed to the model as given, give the answer token as argmax
    import torch

    from engine.models import load_model, logits
    m = load_model("organism", device="cpu")
    for rec in lines[:60]:
        out_logits = logits(m, torch.tensor([rec["ref_ids"]]))
        assert out_logits[0, -1].argmax().item() == rec["answer_id"]


def test_accuracy_json_and_second_call_cached(cache_file):
    args = ("accuracy", "--model", "organism", "--op", "add,mul", "--n", "40", "--seed", "1")
    first = run_cli(*args, cache=cache_file)
    assert first.returncode == 0, first.stderr
    a = json.loads(first.stdout)
    assert set(a["per_op"]) == {"add", "mul"} and a["cached"] is False
    assert all(0.0 <= v["first_token"] <= 1.0 for v in a["per_op"].values())
    assert {t["op"] for t in a["per_template"]} == {"add", "mul"}
    second = json.loads(run_cli(*args, cache=cache_file).stdout)
    assert second["cached"] is True and second["per_op"] == a["per_op"]


@pytest.mark.parametrize("args,phrase", [
    (("accuracy", "--op", "mod"), "unknown operation"),
    (("accuracy", "--n", "0"), "positive"),
    (("accuracy", "--n", "-3"), "positive"),
    (("accuracy", "--operands", "9"), "LO-HI"),
    (("info", "--model", "/nonexistent/model"), "does not exist"),
    (("prompts", "--op", "add"), "--out"),
    (("frobnicate",), "invalid choice"),
    (("accuracy", "--dtype", "int4"), "invalid choice"),
])
def test_bad_arguments_exit_nonzero_with_one_line(cache_file, args, phrase):
    r = run_cli(*args, cache=cache_file)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert phrase in lines[0] and "Traceback" not in r.stderr


def test_patch_csv_and_second_call_cached(cache_file, tmp_path):
    import csv
    out = tmp_path / "e.csv"
    args = ("patch", "--model", "organism", "--op", "add", "--n", "200", "--seed", "0", "--out", str(out))
    first = run_cli(*args, cache=cache_file)
    assert first.returncode == 0, first.stderr
    rows = list(csv.DictReader(out.open()))
    assert set(rows[0]) == {"component", "layer", "head", "effect", "logit_diff", "n"}
    assert sum(r["component"] == "mlp" for r in rows) == 8 and sum(r["component"] == "head" for r in rows) == 64
    assert all(r["head"] == "-1" for r in rows if r["component"] == "mlp")
    assert json.loads(first.stdout)["cached"] is False
    second = run_cli(*args, cache=cache_file)
    assert json.loads(second.stdout)["cached"] is True
    assert list(csv.DictReader(out.open())) == rows
