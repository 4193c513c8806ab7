"""CLI contract of ``python -m engine``: JSON out, JSONL prompts, one-line errors with exit 2.

What only a real process shows -- the exit status after the early end, ``--help``, info, an error of each stage with
nothing else on stderr, a silent stderr on a pipe, the progress bar on a terminal -- runs in processes of their own
(``run_cli_process``); what a command writes and caches, and the other bad arguments' lines, in this process
(``run_cli``: the same ``main``, tests/helpers/cli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli, run_cli_process

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli") / "results.duckdb"


def test_info_prints_model_facts(cache_file):
    r = run_cli_process("info", "--model", "organism", cache=cache_file)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["n_layers"] >= 6 and facts["n_heads"] >= 8 and facts["n_kv_heads"] < facts["n_heads"]
    assert len(facts["fingerprint"]) >= 16


def test_exit_status_survives_the_early_process_end(cache_file, tmp_path):
    """``python -m engine`` ends the process right after the exit handlers (engine/__main__.py): the
    status is still argparse's for --help, and a file a command wrote is complete."""
    assert run_cli_process("--help", cache=cache_file).returncode == 0
    assert run_cli_process("path-patching", "--help", cache=cache_file).returncode == 0
    out = tmp_path / "pairs.jsonl"
    r = run_cli_process("prompts", "--model", "organism", "--op", "add", "--n", "20", "--out", str(out),
                        cache=cache_file)
    assert r.returncode == 0 and len(out.read_text().splitlines()) == json.loads(r.stdout)["kept"] > 0


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

    from engine.models.load import load_model, logits
    m = load_model("organism", device="cpu")
    for rec in lines[:60]:
        out_logits = logits(m, torch.tensor([rec["ref_ids"]]))
        assert out_logits[0, -1].argmax().item() == rec["answer_id"]


def test_a_set_chosen_by_its_carry(cache_file, tmp_path):
    """``--carry yes`` / ``no``: every prompt written has that carry (the sums of 1..9 from 10 up; the others), and
    the two sets are cached apart."""
    for carry in ("yes", "no"):
        out = tmp_path / f"{carry}.jsonl"
        r = run_cli("prompts", "--model", "organism", "--op", "add", "--n", "12", "--carry", carry, "--out", str(out),
                    cache=cache_file)
        assert r.returncode == 0, r.stderr
        sums = [json.loads(x)["answer"] for x in out.read_text().splitlines()]
        assert sums and all((s >= 10) is (carry == "yes") for s in sums), sums


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


#: the bad arguments run in a process of their own: one error of each stage a command goes through
IN_A_PROCESS = {("frobnicate",), ("accuracy", "--op", "mod"), ("info", "--model", "/nonexistent/model"),
                ("accuracy", "--op", "add,sub", "--carry", "yes")}


@pytest.mark.parametrize("args,phrase", [
    (("accuracy", "--op", "mod"), "unknown operation"),
    (("accuracy", "--n", "0"), "positive"),
    (("accuracy", "--n", "-3"), "positive"),
    (("accuracy", "--operands", "9"), "LO-HI"),
    (("info", "--model", "/nonexistent/model"), "does not exist"),
    (("prompts", "--op", "add"), "--out"),
    (("frobnicate",), "invalid choice"),
    (("accuracy", "--dtype", "int4"), "invalid choice"),
    (("accuracy", "--op", "add,mul", "--carry", "yes"), "additions and subtractions, not mul"),
    (("accuracy", "--op", "add,sub", "--carry", "yes"), "no sub problem with operands 1..9 has a borrow"),
    (("accuracy", "--carry", "maybe"), "invalid choice"),
])
def test_bad_arguments_exit_nonzero_with_one_line(cache_file, args, phrase):
    """Exit 2 and one line on stderr; in a real process (nothing but that line reaches stderr) for an error of each
    stage -- argparse's, the set's before the model opens, the model's, the set's after it opened -- in this process
    for the rest (the same ``main``, tests/helpers/cli.py)."""
    run = run_cli_process if args in IN_A_PROCESS else run_cli
    r = run(*args, cache=cache_file)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert phrase in lines[0] and "Traceback" not in r.stderr


def test_patch_csv_and_second_call_cached(cache_file, tmp_path):
    import csv
    out = tmp_path / "e.csv"
    args = ("path-patching", "--model", "organism", "--op", "add", "--n", "200", "--seed", "0", "--out", str(out))
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
    # the carry split from the same cached result: a row per sender and group, n the group's pairs
    third = run_cli(*args, "--by", "carry", cache=cache_file)
    assert third.returncode == 0 and json.loads(third.stdout)["cached"] is True, third.stderr
    split = list(csv.DictReader(out.open()))
    assert {r["group"] for r in split} == {"yes", "no"} and len(split) == 2 * len(rows)
    n = {g: {r["n"] for r in split if r["group"] == g} for g in ("yes", "no")}
    assert all(len(v) == 1 for v in n.values()) and sum(int(next(iter(v))) for v in n.values()) == int(rows[0]["n"])


def test_prompts_reports_why_prompts_were_dropped(cache_file, tmp_path):
    # exponentiation: a skill the bundled model was never taught, so most prompts are answered wrong
    out = tmp_path / "pow.jsonl"
    r = run_cli("prompts", "--model", "organism", "--op", "pow", "--n", "12", "--seed", "0", "--show-dropped",
                "--out", str(out), cache=cache_file)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["balanced"] is True and s["candidates"] > s["generated"] == 12
    assert s["dropped"] == sum(s["dropped_by_reason"].values()) == len(s["dropped_prompts"]) > 0
    wrong = [d for d in s["dropped_prompts"] if d["reason"] == "wrong answer"]
    assert len(wrong) == s["generated"] - s["kept"] and s["kept"] == len(out.read_text().splitlines())
    assert all(d["model_token"] != d["answer_token"] for d in wrong)
    assert s["answer_tokens"]["n"] == s["kept"]


def test_every_subcommand_defaults_to_the_paper_templates():
    from engine.cli.main import build_parser
    for cmd in ("prompts --out x", "accuracy", "path-patching --out x", "knockout", "knockout-curve --out x",
                "attention --out x", "mlp-projections --out x", "transfer"):
        assert build_parser()[0].parse_args(cmd.split()).families == "paper", cmd


def test_patch_guards_the_relative_effect_on_a_random_init_model(cache_file, tmp_path):
    """Random weights: answer logits near 0 or negative -- the relative effect would flip or explode."""
    from engine.organism.recipe import build_tokenizer
    from engine.prompts.pairs import write_jsonl
    from engine.prompts.promptsets import PromptSetSpec, generate
    from tests.integration.tiny_models import build_tiny_model
    model_dir = build_tiny_model("qwen2", tmp_path / "tiny")
    pairs, _ = generate(build_tokenizer(), PromptSetSpec(ops=("add",), n=10, seed=0))
    write_jsonl(str(tmp_path / "p.jsonl"), pairs)  # as given: not filtered to right answers
    r = run_cli("path-patching", "--model", str(model_dir), "--prompts", str(tmp_path / "p.jsonl"), "--out",
                str(tmp_path / "e.csv"), cache=cache_file)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    guard = s["effect_guard"]
    assert guard["excluded_pairs"] > 5 and guard["ranked_by"] == "logit_diff"  # measured: all 10 below 1
    assert f"{guard['excluded_pairs']} of 10 prompt pairs" in guard["note"] and "logit_diff" in guard["note"]
    assert all("logit_diff" in h and "effect" not in h for h in s["top_heads"])

def test_sweeps_are_silent_on_a_pipe_and_take_quiet(tmp_path):
    """Progress bars go to a terminal only (tests/unit/test_progress.py): piped stderr stays empty."""
    args = ["knockout-curve", "--model", "organism", "--op", "add", "--n", "12", "--k-max", "3", "--draws", "3",
            "--no-cache", "--out", str(tmp_path / "c.csv")]
    for extra in ([], ["--quiet"]):
        piped = run_cli_process(*args, *extra, cache=tmp_path / "c.duckdb")
        assert piped.returncode == 0 and piped.stderr.strip() == "", piped.stderr


def test_sweeps_show_a_progress_bar_on_a_terminal(tmp_path):
    """On a terminal (a pty of 100 x 24), the knockout curve draws tqdm bars with counts on stderr."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, ARITHLAB_CACHE=str(tmp_path / "t.duckdb"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "knockout-curve", "--model", "organism", "--op", "add",
                             "--n", "12", "--k-max", "3", "--draws", "3", "--no-cache",
                             "--out", str(tmp_path / "c.csv")],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 5.0)
        if not ready and proc.poll() is not None:
            break
        try:
            data = os.read(master, 65536) if ready else b""
        except OSError:  # the child closed the terminal
            break
        shown += data
    os.close(master)
    assert proc.wait(300) == 0
    text = shown.decode(errors="replace")
    assert "checking answers" in text and "path patching" in text and "knockout sets" in text, text[-2000:]
    assert "it/s]" in text or "s/it]" in text, text[-2000:]
