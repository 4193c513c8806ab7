"""AppTest of the Improve page: a real background fine-tuning job, its progress, then base vs tuned."""

from __future__ import annotations

import time

import pytest

from engine.finetune.jobs import job_dir, list_jobs, log_tail, read_job
from tests.app.conftest import errors, page


@pytest.fixture(autouse=True)
def _jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_JOBS", str(tmp_path / "jobs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _wait(timeout: float = 240.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        jobs = list_jobs()
        if jobs and jobs[0].done:
            return jobs[0]
        time.sleep(0.5)
    raise AssertionError(f"the job did not finish in {timeout} s: {[j.to_dict() for j in list_jobs()]}")


def test_precise_job_runs_and_compares():
    at = page("9_Improve.py").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert any("No fine-tuning job yet" in i.value for i in at.info)
    at.number_input(key="ft_max_steps").set_value(4)  # a short budget
    at.text_input(key="ft_name").set_value("demo-precise")
    at.button[0].click().run()  # form submit: Start fine-tuning
    assert not at.exception, at.exception
    job = _wait()
    assert job.state == "finished", (job.to_dict(), log_tail(job_dir(job.job_id), 40))
    assert job.step == 4
    at.run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    cmp = next(t.value for t in at.table if "tuned %" in t.value.columns)
    assert set(cmp.index) >= {"skill (held-out)", "arithmetic (paper templates)", "arithmetic (held-out split)",
                              "word problems (Figure 10)", "control facts"}
    tuned = cmp["tuned %"].astype(float)
    assert ((tuned >= 0) & (tuned <= 100)).all()
    # base heatmap + tuned heatmap + loss curve
    assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) >= 3
    assert read_job(job_dir(job.job_id)).out_dir.endswith("demo-precise")
    # one click loads the tuned model everywhere, the sidebar's box included
    at.button(key="use_tuned").click().run()
    assert not at.exception, at.exception
    out_dir = read_job(job_dir(job.job_id)).out_dir
    assert at.session_state["model_choice"].spec == out_dir
    assert at.sidebar.text_input(key="model_spec_input").value == out_dir


def test_the_improve_snippets_are_the_jobs_command_and_reproduce_base_vs_tuned(tmp_path, monkeypatch, capsys):
    """Copy as code on Improve (issue 51): before a job, the form's job as a command and as run_finetune(...) -- the
    job the button then starts runs exactly that command; after it, the job's command run again (another --out)
    trains the same weights, and the notebook lines give the page's base vs tuned table and the tuned heatmap's
    key heads."""
    import json
    import shlex

    from engine.finetune.run import read_record
    from tests.app.test_as_code import run_notebook, shown_code
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    at = page("9_Improve.py").run()
    at.number_input(key="ft_max_steps").set_value(3)
    at.text_input(key="ft_name").set_value("as-code")
    at.button[0].click().run()  # submits the form: the code below is the job it started (not finished yet)
    cli0, py0 = shown_code(at)
    job = _wait()
    assert job.state == "finished", (job.to_dict(), log_tail(job_dir(job.job_id), 40))
    ran = json.loads((job_dir(job.job_id) / "request.json").read_text())["args"]
    at = page("9_Improve.py")
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    cli, py = shown_code(at)
    assert shlex.split(cli[0])[4:] == ran  # the job's own command
    assert shlex.split(cli[1])[3] == "path-patching" and job.out_dir in cli[1]
    shown = next(t.value for t in at.table if "tuned %" in t.value.columns)
    nb = run_notebook(py, tmp_path, monkeypatch, capsys)
    assert [t for t, *_ in nb["tasks"]] == list(shown.index)
    assert [f"{100 * b:.1f}" for _, _, b, _ in nb["tasks"]] == list(shown["base %"])
    assert [f"{100 * t:.1f}" for _, _, _, t in nb["tasks"]] == list(shown["tuned %"])
    assert len(nb["top_heads"]) == 5
    again = [*ran[:ran.index("--out") + 1], str(tmp_path / "again"), *ran[ran.index("--out") + 2:]]
    from engine.cli.main import main
    assert main(["finetune", *again]) == 0
    capsys.readouterr()
    assert read_record(tmp_path / "again")["tuned_fingerprint"] == read_record(job.out_dir)["tuned_fingerprint"]
    # the form's job as code: the command the job ran, and a run_finetune(...) of the request that gives it
    assert shlex.split(cli0[0])[4:] == ran
    from engine.finetune import run as run_module
    seen = []
    monkeypatch.setattr(run_module, "run_finetune", lambda r: seen.append(r) or {"result": {}})
    exec(compile(py0, "snippet", "exec"), {})
    assert len(seen) == 1 and seen[0].cli_args() == ran


def test_the_page_trains_with_the_cli_recipe():
    """The page shows the recipe's values and, left empty, its job gets no schedule flags: the worker
    (the CLI) fills them from the same recipe."""
    from engine.finetune.recipe import default_recipe
    from engine.finetune.run import read_record

    at = page("9_Improve.py").run()
    assert not at.exception, at.exception
    from engine.backends import open_model
    recipe = default_recipe("precise", open_model("organism", device="cpu").facts.n_params)
    caption = next(c.value for c in at.caption if c.value.startswith("Default recipe"))
    assert recipe.reason in caption and "the CLI's too" in caption
    lr_box = next(n for n in at.number_input if n.label == "Learning rate")
    assert lr_box.value is None and f"{recipe.lr:.1e}" in lr_box.proto.placeholder
    at.number_input(key="ft_max_steps").set_value(2)
    at.button[0].click().run()
    assert not at.exception, at.exception
    job = _wait()
    assert job.state == "finished", (job.to_dict(), log_tail(job_dir(job.job_id), 40))
    import json
    args = json.loads((job_dir(job.job_id) / "request.json").read_text())["args"]
    assert not {"--lr", "--epochs", "--batch-size", "--warmup", "--weight-decay"} & set(args), args
    cfg = read_record(job.out_dir)["config"]
    assert (cfg["lr"], cfg["batch_size"], cfg["epochs"], cfg["warmup"], cfg["weight_decay"]) == \
        (recipe.lr, recipe.batch_size, recipe.epochs, recipe.warmup, recipe.weight_decay)


def test_bad_inputs_show_errors():
    at = page("9_Improve.py").run()
    at.text_input(key="ft_heads").set_value("99.99")  # a head that does not exist
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert any("do not exist" in e for e in errors(at)), errors(at)
    assert not list_jobs()  # nothing was started
    at = page("9_Improve.py").run()
    at.selectbox(key="ft_data").set_value("JSONL file ...")
    at.text_input(key="ft_data_path").set_value("/nonexistent/data.jsonl")
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert any("does not exist" in e for e in errors(at)), errors(at)
    from engine.finetune.jobs import jobs_root
    taken = jobs_root().parent / "tuned" / "taken"
    taken.mkdir(parents=True)
    (taken / "finetune.json").write_text("{}")
    at = page("9_Improve.py").run()
    at.text_input(key="ft_name").set_value("taken")
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert any("already a tuned model" in e for e in errors(at)), errors(at)
    assert not list_jobs() and (taken / "finetune.json").read_text() == "{}"


def test_a_job_whose_worker_died_is_shown_failed(tmp_path):
    import json
    import subprocess
    import sys

    from engine.finetune.jobs import jobs_root
    # a worker that exits without ever finishing its job: status still says "running"
    d = jobs_root() / "20260101-000000-dead00"
    d.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "pass", "--job-dir", str(d)])
    proc.wait()
    (d / "status.json").write_text(json.dumps({"job_id": d.name, "state": "running", "pid": proc.pid, "step": 7,
                                               "total_steps": 90, "started": time.time(), "updated": time.time()}))
    at = page("9_Improve.py").run()
    assert not at.exception, at.exception
    msgs = errors(at)
    assert any("The job failed" in m and "killed or crashed" in m and "7/90" in m for m in msgs), msgs
    assert not any("3 · Base vs tuned" in m.value for m in at.subheader)
