"""The bundled model: shape, tokenizer, accuracy targets, and a reproducible training recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from engine.organism.card import template_accuracy
from engine.organism.recipe import DEFAULT_DIR, Recipe, build_tokenizer, split_words
from engine.organism.train import train
from engine.prompts.pairs import answer_tokens
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.prompts.templates import NAMES, PAPER_NAMES, TEMPLATES_BY_ID, paper_templates, templates_for
from tests.helpers.cli import run_cli


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
                                           families=("paper", "time_span", "object_accumulation", "extended",
                                                     "power")))
    unk = tok.unk_token_id
    assert all(unk not in p.ref_ids and unk not in p.cf_ids for p in pairs)
    # the answer-token rule on this tokenizer: no whitespace token, the digit follows the prompt directly
    at = answer_tokens(tok, "3 plus 5 equals to", 8)
    assert tok.convert_ids_to_tokens(at.prompt_ids)[-2:] == ["equals", "to"]
    assert tok.convert_ids_to_tokens(at.answer_ids) == ["8"]
    assert tok.convert_ids_to_tokens(answer_tokens(tok, "Q: What is 9 plus 9? A:", 18).answer_ids) == ["1", "8"]


def test_operator_words_and_names_span_several_tokens(model):
    tok = model.tokenizer
    paper_words = {w for t in TEMPLATES_BY_ID.values() if t.family in ("paper", "time_span", "object_accumulation")
                   for w in t.operator_words() if w.isalpha()}
    assert paper_words <= set(split_words())
    for w in paper_words | set(NAMES) | set(PAPER_NAMES):
        assert len(tok(w, add_special_tokens=False)["input_ids"]) == 2, w
    assert tok.convert_ids_to_tokens(tok("3 plus 5", add_special_tokens=False)["input_ids"]) == ["3", "pl", "##us", "5"]


def test_each_paper_template_answered(model):
    """First-token accuracy on every operand pair of each template of Appendix A: the issue's targets are
    >= 99 % on each Figure 8 template and >= 95 % on each of Figure 10's twelve word problems."""
    acc = template_accuracy(model)
    paper = acc["paper_by_template"]
    fig8 = {t.id for t in paper_templates()}
    fig10 = {t.id for t in templates_for(["add"], ["time_span", "object_accumulation"])}
    assert set(paper) == fig8 | fig10 and len(fig8) == 32 and len(fig10) == 12
    low = {k: v["first_token"] for k, v in paper.items() if k in fig8 and v["first_token"] < 0.99}
    assert not low, low
    low = {k: v["first_token"] for k, v in paper.items() if k in fig10 and v["first_token"] < 0.95}
    assert not low, low
    assert sum(paper[k]["first_token"] * paper[k]["n"] for k in fig8) / sum(paper[k]["n"] for k in fig8) >= 0.99
    assert paper["div.paper.0"]["n"] == 23 and paper["add.time_span.0"]["n"] == 36  # every operand pair
    assert paper["add.time_span.4"]["n"] == 60 and paper["add.object_accumulation.3"]["n"] == 81
    assert set(acc["held_out_templates"]) == set(Recipe().held_out_templates)


def test_prompts_cli_paper_family_is_figure_8(tmp_path):
    """Acceptance: every kept ref_text of `prompts --families paper --n 400` is a Figure 8 template
    with digits filled in, and all 32 appear; likewise for Figure 10's families."""
    for fams, ids in (("paper", {t.id for t in paper_templates()}),
                      ("word", {t.id for t in templates_for(["add"], ["time_span", "object_accumulation"])})):
        out = tmp_path / f"{fams}.jsonl"
        r = run_cli("prompts", "--model", "organism", "--op", "all" if fams == "paper" else "add",
                    "--families", fams, "--n", "400", "--seed", "0", "--out", str(out), cache=tmp_path / "c.duckdb")
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert {row["template"] for row in rows} == ids
        for row in rows:
            t = TEMPLATES_BY_ID[row["template"]]
            pattern = re.escape(t.render(111, 222, slots={s: "\x00" for s in t.slot_names}))
            pattern = pattern.replace("111", "[0-9]+").replace("222", "[0-9]+").replace("\x00", "[A-Za-z0-9.]+")
            assert re.fullmatch(pattern, row["ref_text"]), (row["ref_text"], t.text)


def test_counterfactuals_do_not_give_the_answer(model):
    pairs, _ = generate(model.tokenizer, PromptSetSpec(n=50, seed=7))
    with torch.no_grad():
        hits = 0
        for p in pairs:
            hits += int(model.logits(torch.tensor([p.cf_ids]))[0, -1].argmax() == p.answer_id)
    assert hits / len(pairs) < 0.05


def test_model_card_reports_targets():
    ev = json.loads((DEFAULT_DIR / "evaluation.json").read_text())["evaluation"]
    # held-out operand pairs of the trained templates (all families): 82-100 % per op, see the card
    assert all(v["first_token"] >= 0.8 for v in ev["held_out_by_op"].values())
    assert len(ev["paper_by_template"]) == 44
    assert all(v["first_token"] >= 0.99 for k, v in ev["paper_by_template"].items() if ".paper." in k)
    assert all(v["first_token"] >= 0.95 for k, v in ev["paper_by_template"].items() if ".paper." not in k)
    assert set(ev["held_out_templates"]) == set(Recipe().held_out_templates)
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


def test_layer_drop_zeroes_layer_0_attention_only_inside_the_block():
    """LayerDrop (the lever that moved the circuit out of layer 0): a dropped example computes exactly
    what the model with layer 0's W_O zeroed computes, a kept one is untouched, and the hook goes."""
    import copy

    from engine.organism.train import build_model, layer_drop
    r = Recipe(n_layers=2, d_mlp=64)
    tok = build_tokenizer(r)
    model = build_model(r, len(tok), tok).eval()
    ids = torch.tensor([tok("3 plus 5 equals to")["input_ids"]] * 2)  # [2, pos]
    plain = model(ids).logits
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.model.layers[0].self_attn.o_proj.weight.zero_()
    keep = [torch.tensor([0.0, 1.0]).view(2, 1, 1)]  # drop example 0, keep example 1
    with torch.no_grad(), layer_drop(model.model.layers[0].self_attn, keep):
        dropped = model(ids).logits
    assert torch.allclose(dropped[0], zeroed(ids).logits[0], atol=1e-6)
    assert torch.equal(dropped[1], plain[1]) and not torch.allclose(dropped[0], plain[0])
    assert torch.equal(model(ids).logits, plain)  # hook removed on exit
