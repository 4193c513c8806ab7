"""Improve: precise SFT of the key heads (or full SFT / LoRA) as a background job, then base vs tuned."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.findings.as_code import improve_code
from engine.finetune.data import BUILTIN_SETS
from engine.finetune.errors import FinetuneError
from engine.finetune.jobs import (
    job_dir,
    job_eta,
    jobs_root,
    list_jobs,
    log_tail,
    losses,
    read_job,
    request_args,
    start_finetune,
    stop_job,
)
from engine.finetune.recipe import default_recipe
from engine.finetune.run import FinetuneRequest, check_out_dir, heads_text, read_record
from engine.finetune.slices import parse_heads
from engine.finetune.train import TrainConfig
from engine.techniques.path_patching import cached_path_patching
from ui.as_code import code_view
from ui.circuit_panels import patching_table
from ui.improve_panels import comparison_chart, comparison_rows, comparison_table
from ui.notes_panel import noted
from ui.progress import USER_ERRORS
from ui.session import ModelChoice, analysed_pairs, loaded_model, result_cache, setup_page, use_model
from views.charts import heatmap, heatmap_frame, heatmap_limit, loss_curve

model, spec = setup_page(
    "Improve",
    "Precise SFT (the paper's §4.3): fine-tune only the Q/K/V/O slices of the key heads found by path "
    "patching, with gradients scaled by H/h; full SFT and LoRA are the baselines. The job runs in the "
    "background (it survives a page reload); when it ends, compare the tuned model with the base.")
choice: ModelChoice = st.session_state.get("model_choice", ModelChoice())
cache = result_cache()
if choice.remote:
    st.error("Fine-tuning runs on a local copy of the model: switch off 'Run remotely on NDIF' in the sidebar.")
    st.stop()

# ---- 1. the job -----------------------------------------------------------------------------
pairs, _ = analysed_pairs(model, spec, cache)
table, _ = patching_table(model, pairs, cache, failure="rank the heads")
n_heads = table.n_layers * table.n_heads
st.subheader("1 · Train")
method = st.radio("Method", ("precise", "full", "lora"), horizontal=True, key="ft_method",
                  help="precise: only the selected heads' slices; full: every weight; lora: rank-8 adapters "
                       "on the attention projections")
recipe = default_recipe(method, model.facts.n_params)
st.caption(f"Default recipe (the CLI's too): {recipe.reason}. Leave a field empty to use it.")
with st.form("finetune_form"):
    c2, c3 = st.columns([1, 2])
    k = c2.number_input("Top k heads", 1, n_heads, min(8, n_heads), key="ft_k",
                        help="prefills the head list from this prompt set's path-patching heatmap")
    heads_in = c3.text_input("Heads (LAYER.HEAD, comma separated; empty = the top k)", "", key="ft_heads",
                             help="e.g. 0.1,3.7 -- overrides the top k")
    c4, c5, c6, c7 = st.columns(4)
    default_set = "notation+replay" if model.facts.spec == "organism" else "arith"
    data = c4.selectbox("Data", list(BUILTIN_SETS) + ["JSONL file ..."], index=list(BUILTIN_SETS).index(default_set),
                        key="ft_data",
                        help="built-in sets (docs/finetune.md) or a JSONL file of {prompt, answer} lines")
    data_path = c4.text_input("JSONL file (Data: JSONL file ...)", "", key="ft_data_path",
                              placeholder="path/to/data.jsonl",
                              help="read only when Data is \"JSONL file ...\": one {prompt, answer} object per line")
    lr = c5.number_input("Learning rate", 1e-7, 1.0, None, format="%.1e", key="ft_lr",
                         placeholder=f"recipe: {recipe.lr:.1e}", help=recipe.reason)
    epochs = c6.number_input("Epochs", 0.1, 1000.0, None, key="ft_epochs",
                             placeholder=f"recipe: {recipe.epochs:g}"
                                         + (f", >= {recipe.min_steps} steps" if recipe.min_steps else ""))
    batch = c7.number_input("Batch size", 1, 4096, None, key="ft_batch", placeholder=f"recipe: {recipe.batch_size}")
    c8, c9, c10 = st.columns(3)
    max_steps = c8.number_input("Max steps (0 = no limit)", 0, 10**6, 0, help="the budget", key="ft_max_steps")
    wd = c9.number_input("Weight decay", 0.0, 10.0, None, key="ft_wd", placeholder=f"recipe: {recipe.weight_decay:g}")
    name = c10.text_input("Save as", "", key="ft_name", placeholder="name of the tuned model",
                          help="the tuned model is saved under .cache/tuned/ with this name")
    submitted = st.form_submit_button("Start fine-tuning", type="primary")

top = [(int(a), int(b)) for a, b, _ in table.top_heads(int(k))]


def form_request() -> FinetuneRequest:
    """The job the form's values start (FinetuneError / OSError / ValueError: what is wrong with them)."""
    heads = parse_heads(heads_in) if heads_in.strip() else tuple(top)
    bad = [f"{a}.{b}" for a, b in heads if a >= table.n_layers or b >= table.n_heads]
    if bad:
        raise FinetuneError(f"head(s) {', '.join(bad)} do not exist: the model has {table.n_layers} layers "
                            f"x {table.n_heads} heads (0-based)")
    source = data_path.strip() if data == "JSONL file ..." else data
    if not source:
        raise FinetuneError("give the path of a JSONL file of {\"prompt\": ..., \"answer\": ...} lines")
    if data == "JSONL file ..." and not Path(source).is_file():
        raise FinetuneError(f"data file {source} does not exist")
    label = (name.strip() or f"{method}-{Path(choice.spec).name}-{time.strftime('%Y%m%d-%H%M%S')}"
             ).replace("/", "_")
    if label.startswith("."):
        raise FinetuneError("the name must not start with a dot")
    config = TrainConfig(method=method, heads=heads if method == "precise" else (), lr=lr, epochs=epochs,
                         batch_size=None if batch is None else int(batch), weight_decay=wd,
                         max_steps=int(max_steps) or None)
    return FinetuneRequest(spec=choice.spec, config=config, data=source,
                           out_dir=str(jobs_root().parent / "tuned" / label), dtype=choice.dtype,
                           device=None if choice.device in ("auto", "all GPUs") else choice.device)


if submitted:
    try:
        request = form_request()
        check_out_dir(request.out_dir)
        st.session_state["job_id"] = start_finetune(request)
        st.query_params["job"] = st.session_state["job_id"]
    except (FinetuneError, OSError, ValueError) as e:
        st.error(f"Cannot start the job: {e}")


def form_code() -> None:
    """The form's job as code (nothing where its values are wrong: the form says so when it is submitted)."""
    try:
        request = form_request()
    except (FinetuneError, OSError, ValueError):
        return
    code_view(improve_code(model, spec, request.cli_args(), py_request=repr(request)))


st.caption(f"Top {int(k)} heads of this prompt set: {heads_text(top)}")

# ---- 2. progress ----------------------------------------------------------------------------
jobs = list_jobs()
if not jobs:
    st.info("No fine-tuning job yet: start one above.")
    form_code()
    st.stop()
ids = [j.job_id for j in jobs]
wanted = st.session_state.get("job_id") or st.query_params.get("job")
job_id = st.selectbox("Job", ids, index=ids.index(wanted) if wanted in ids else 0,
                      format_func=lambda i: f"{i} · {next(j.state for j in jobs if j.job_id == i)}")
st.query_params["job"] = job_id
jdir = job_dir(job_id)


@st.fragment(run_every=None if read_job(jdir).done else 1.0)  # polls only while the job runs
def job_panel() -> None:
    status = read_job(jdir)
    st.subheader("2 · Progress")
    total = max(status.total_steps, 1)
    eta = job_eta(status)
    st.progress(min(1.0, status.step / total),
                text=f"{status.state} · step {status.step}/{status.total_steps or '?'}"
                     + (f" · loss {status.loss:.4f}" if status.loss is not None else "")
                     + (f" · about {eta:.0f} s left" if eta is not None else ""))
    curve = pd.DataFrame(losses(jdir))
    if len(curve):
        st.altair_chart(loss_curve(curve), width="stretch")
    if status.state == "failed":
        st.error(f"The job failed: {status.message}")
        st.code(log_tail(jdir) or "(empty log)")
    elif status.state == "stopped":
        st.warning("The job was stopped; the model was saved with the steps it had made.")
    if not status.done and st.button("Stop the job"):
        stop_job(jdir)
    if status.done and st.session_state.get(f"shown_{job_id}") != status.state:
        st.session_state[f"shown_{job_id}"] = status.state
        st.rerun()  # full rerun: the comparison below appears


job_panel()

# ---- 3. results -----------------------------------------------------------------------------
status = read_job(jdir)
if status.state not in ("finished", "stopped"):
    form_code()
    st.stop()
try:
    record = read_record(status.out_dir)
except FinetuneError as e:
    st.error(str(e))
    st.stop()
if record is None:
    st.error(f"The job says it finished but {status.out_dir} holds no fine-tuning record; start it again.")
    st.stop()
st.subheader("3 · Base vs tuned")
r = record["result"]
st.caption(f"{r['method']} · {r['steps']} steps · {r['samples_per_s']:.0f} samples/s · "
           f"{r['trainable_params']:,} of {r['total_params']:,} parameters trained · "
           f"optimizer state {r['optimizer_state_numel']:,} numbers · saved in `{status.out_dir}` (a model spec)")
if record["base_fingerprint"] != model.facts.fingerprint:
    st.warning(f"This job tuned `{record['base_spec']}`, not the model loaded in the sidebar: load "
               f"`{record['base_spec']}` to compare against its base.")
    st.stop()
tuned_choice = ModelChoice(status.out_dir, choice.device, choice.dtype, choice.backend, False)
# before the comparison (which takes a while): the button is there, and works, from the first moment
st.button("Use the tuned model in every page", key="use_tuned", on_click=use_model, args=(tuned_choice,),
          help="Loads it in the sidebar; the knockout set and the selection, made on the base model, are cleared.")
tuned = loaded_model(tuned_choice)
if tuned is None:
    st.stop()
rows = comparison_rows(model, tuned, cache)
if rows is None:
    st.stop()
try:
    t_table, _ = cached_path_patching(tuned, pairs, cache=cache)
except USER_ERRORS as e:
    st.error(f"Cannot run path patching on the tuned model: {e}")
    st.stop()
comparison_table(rows)
st.altair_chart(comparison_chart(rows), width="stretch")
frames = {title: noted(heatmap_frame(*tab.heatmap("effect", "*")), m, cache)  # each model's pins outlined
          for title, tab, m in (("base", table, model), ("tuned", t_table, tuned))}
lim = max(heatmap_limit(df) for df in frames.values())  # one symmetric scale for both
st.caption(f"Both heatmaps on one colour scale, ±{lim:.3f} (relative effect; MLP cells beyond it saturate).")
left, right = st.columns(2)
for col, (title, df) in zip((left, right), frames.items()):
    col.markdown(f"**Path patching · {title}**")
    col.altair_chart(heatmap(df, "effect", lim=lim), width="stretch", key=f"cmp_{title}")
st.caption(f"Jobs live in `{jobs_root()}`.")
code_view(improve_code(model, spec, request_args(jdir), tuned=status.out_dir))  # the command the job ran, and after
