"""The bundled model: shape, tokenizer, accuracy targets, and a reproducible training recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.accuracy import score_pairs
from engine.backend import open_model
from engine.organism import DEFAULT_DIR, Recipe, train
from engine.promptsets import PromptSetSpec, generate
from engine.templates import PAPER_OPS


@pytest.fixture(scope="module")
def model():
    return open_model("organism", device="cpu")


def test_shape_and_files(model):
    f = model.facts
    assert f.architecture == "LlamaForCausalLM"
    assert f.n_layers >= 6 and f.n_heads >= 8 and f.n_kv_heads < f.n_heads
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "training_report.json"):
        assert (DEFAULT_DIR / name).is_file(), name


def test_digits_are_single_tokens_and_vocab_covers_templates(model):
    tok = model.tokenizer
    for d in range(10):
        assert len(tok(str(d), add_special_tokens=False)["input_ids"]) == 1
    pairs, _ = generate(tok, PromptSetSpec(ops=("add", "sub", "mul", "div", "pow"), n=200, seed=0,
                                           families=("equation", "statement", "qa", "time_span",
                                                     "object_accumulation", "power")))
    unk = tok.unk_token_id
    assert all(unk not in p.ref_ids and unk not in p.cf_ids for p in pairs)


def test_accuracy_targets_on_fresh_prompts(model):
    """>= 99 % first-token accuracy per op over the paper and Figure 10 templates."""
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=PAPER_OPS, n=150, seed=123,
                                                       families=("equation", "statement", "qa", "time_span",
                                                                 "object_accumulation")))
    scores = score_pairs(model, pairs)
    for op in PAPER_OPS:
        s = [sc for p, sc in zip(pairs, scores) if p.op == op]
        assert sum(x.first_ok for x in s) / len(s) >= 0.99, op


def test_counterfactuals_do_not_give_the_answer(model):
    pairs, _ = generate(model.tokenizer, PromptSetSpec(n=50, seed=7))
    with torch.no_grad():
        hits = 0
        for p in pairs:
            hits += int(model.logits(torch.tensor([p.cf_ids]))[0, -1].argmax() == p.answer_id)
    assert hits / len(pairs) < 0.05


def test_model_card_reports_targets():
    ev = json.loads((DEFAULT_DIR / "evaluation.json").read_text())["evaluation"]
    assert all(v["first_token"] >= 0.99 for v in ev["held_out_by_op"].values())
    assert ev["control_accuracy"] >= 0.95
    card = (DEFAULT_DIR / "README.md").read_text()
    assert "python -m engine.organism train" in card and "Where the key heads sit" in card


def test_training_is_seeded_and_reproducible(tmp_path):
    r = Recipe(steps=3, batch_size=8, n_layers=2, warmup=1)
    a = train(r, tmp_path / "a", log=lambda s: None)
    b = train(r, tmp_path / "b", log=lambda s: None)
    from safetensors.torch import load_file
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["final_loss"] == b["final_loss"]
    assert json.loads((tmp_path / "a" / "tokenizer.json").read_text()) == json.loads(
        (Path(DEFAULT_DIR) / "tokenizer.json").read_text())
