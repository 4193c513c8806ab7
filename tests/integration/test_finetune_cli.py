"""The finetune CLI end to end, its errors, the tuned model as a SPEC, and background jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.finetune.jobs import list_jobs, losses, read_job, start_job

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, capture_output=True, text=True,
                          env=env or ENV, timeout=600)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    base = tmp_path_factory.mktemp("ft")
    env = {**ENV, "ARITHLAB_CACHE": str(base / "c.duckdb")}
    out = base / "tuned"
    r = _cli("finetune", "--model", "organism", "--method", "precise", "--heads", "0.1,3.7", "--data", "notation",
             "--out", str(out), "--lr", "3e-3", "--batch-size", "16", "--max-steps", "3", env=env)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_precise_run_saves_a_loadable_model_and_the_slices(tuned):
    from engine.finetune.run import apply_slices
    from engine.models.load import load_model, load_plain

    out, rec = tuned
    assert rec["result"]["steps"] == 3 and rec["config"]["heads"] == [[0, 1], [3, 7]]
    assert rec["tuned_fingerprint"] != rec["base_fingerprint"]
    assert (out / "model.safetensors").exists() and (out / "tuned_slices.safetensors").exists()
    loaded = load_model(str(out))
    assert loaded.facts.fingerprint == rec["tuned_fingerprint"]
    # the slices file alone turns the base into the tuned model
    base = load_plain("organism")
    heads = apply_slices(base.hf_model, out / "tuned_slices.safetensors")
    assert heads == [(0, 1), (3, 7)]
    tuned_sd = load_plain(str(out)).hf_model.state_dict()
    for k, v in base.hf_model.state_dict().items():
        assert torch.equal(v, tuned_sd[k]), k


@pytest.mark.parametrize("args, needle", [
    (["--method", "precise", "--data", "notation"], "needs --heads"),
    (["--method", "precise", "--heads", "9.9", "--data", "notation"], "does not exist"),
    (["--method", "precise", "--heads", "x", "--data", "notation"], "LAYER.HEAD"),
    (["--method", "full", "--heads", "0.1", "--data", "notation"], "only apply to --method precise"),
    (["--method", "full", "--data", "/nonexistent.jsonl"], "does not exist"),
    (["--method", "sgd", "--data", "notation"], "invalid choice"),
    (["--method", "full", "--data", "notation", "--lr", "abc"], "not a number"),
    (["--method", "full", "--data", "arithmetic"], "does not exist (give a JSONL file"),  # an unknown set
])
def test_bad_arguments_give_one_line(tmp_path, args, needle):
    r = _cli("finetune", "--model", "organism", "--out", str(tmp_path / "o"), "--no-cache", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_an_existing_tuned_model_is_not_overwritten(tuned):
    out, rec = tuned
    before = (out / "finetune.json").read_text()
    r = _cli("finetune", "--method", "full", "--data", "notation", "--out", str(out), "--no-cache", "--max-steps", "1")
    assert r.returncode == 2 and "already a tuned model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (out / "finetune.json").read_text() == before


def test_a_data_file_without_answers_is_refused(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"prompt": "2 + 3 =", "answer": ""}\n')
    r = _cli("finetune", "--method", "full", "--data", str(data), "--out", str(tmp_path / "o"), "--no-cache")
    assert r.returncode == 2 and "empty prompt or answer" in r.stderr and not (tmp_path / "o").exists()


def test_bad_jsonl_line_is_named(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "2 × 3 =", "answer": "6"}\n{"prompt": "oops"}\n')
    r = _cli("finetune", "--method", "full", "--data", str(data), "--out", str(tmp_path / "o"), "--no-cache")
    assert r.returncode == 2 and f"{data}:2" in r.stderr


def test_job_reports_progress_and_finishes(tmp_path):
    root = tmp_path / "jobs"
    jid = start_job(["--model", "organism", "--method", "lora", "--data", "notation", "--out",
                     str(tmp_path / "lora"), "--lr", "1e-3", "--batch-size", "16", "--max-steps", "3", "--no-cache"],
                    root=root)
    t0 = time.time()
    while not read_job(root / jid).done and time.time() - t0 < 300:
        time.sleep(0.3)
    st = read_job(root / jid)
    assert st.state == "finished", (st, (root / jid / "log.txt").read_text()[-2000:])
    assert [p["step"] for p in losses(root / jid)] == [1, 2, 3]
    assert [j.job_id for j in list_jobs(root=root)] == [jid]


def test_killed_job_is_reported_failed_not_finished(tmp_path):
    root = tmp_path / "jobs"
    jid = start_job(["--model", "organism", "--method", "full", "--data", "notation", "--out",
                     str(tmp_path / "full"), "--lr", "1e-4", "--batch-size", "8", "--epochs", "500", "--no-cache"],
                    root=root)
    t0 = time.time()
    while time.time() - t0 < 300:
        st = read_job(root / jid)
        if st.state == "running" and st.step >= 2:
            break
        time.sleep(0.2)
    assert st.state == "running", st
    os.kill(st.pid, signal.SIGKILL)
    t0 = time.time()
    while read_job(root / jid).state == "running" and time.time() - t0 < 30:
        time.sleep(0.2)
    st = read_job(root / jid)
    assert st.state == "failed" and "killed or crashed" in st.message, st
    assert not (tmp_path / "full").exists()  # no half-written model directory


def test_cli_without_schedule_flags_trains_with_the_recipe(tmp_path):
    from engine.finetune.recipe import default_recipe

    env = {**ENV, "ARITHLAB_CACHE": str(tmp_path / "c.duckdb")}
    r = _cli("finetune", "--model", "organism", "--method", "full", "--data", "notation", "--out",
             str(tmp_path / "full"), "--max-steps", "2", env=env)
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)["config"]
    recipe = default_recipe("full", 1_182_592)
    assert (cfg["lr"], cfg["batch_size"], cfg["epochs"], cfg["warmup"], cfg["weight_decay"], cfg["min_steps"]) == \
        (recipe.lr, recipe.batch_size, recipe.epochs, recipe.warmup, recipe.weight_decay, recipe.min_steps)


@pytest.mark.parametrize("config", [
    dict(method="precise", heads=((0, 1), (3, 7)), mlps=(2,)),
    dict(method="lora", lr=1e-3, epochs=3.0, batch_size=8, warmup=0.1, weight_decay=0.0, max_steps=5, seed=3),
    dict(method="full", rescale=False, kv_rule="all", micro_batch=4, lora_r=4),
])
def test_a_request_and_its_cli_arguments_say_the_same(config):
    """What the Improve page's background job runs is the request the page built."""
    import argparse

    from engine.cli.commands.finetune import config_from_args, register
    from engine.finetune.run import FinetuneRequest
    from engine.finetune.train import TrainConfig

    req = FinetuneRequest(spec="organism", config=TrainConfig(lora_alpha=2 * config.get("lora_r", 8), **config),
                          data="notation", out_dir="/tmp/x", device="cpu", limit=7)
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    register(sub)
    args = ap.parse_args(["finetune", *req.cli_args()])
    heads = tuple(tuple(int(x) for x in h.split(".")) for h in args.heads.split(",")) if args.heads else ()
    assert config_from_args(args, heads) == req.config
    assert (args.model, args.data, args.out, args.device, args.limit) == ("organism", "notation", "/tmp/x", "cpu", 7)
