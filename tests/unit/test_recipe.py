"""The default training recipe (engine.finetune.recipe): one for the CLI, the Improve page and the benches."""

from __future__ import annotations

import pytest

from engine.finetune.errors import FinetuneError
from engine.finetune.recipe import ANCHORS, default_recipe
from engine.finetune.train import TrainConfig


@pytest.mark.parametrize("method", ["precise", "full", "lora"])
def test_anchors_are_reproduced_and_clamped(method):
    for a in ANCHORS:
        r = default_recipe(method, int(a.n_params))
        assert (r.lr, r.batch_size, r.epochs, r.min_steps) == (a.lr[method], a.batch_size, a.epochs, a.min_steps)
    assert default_recipe(method, 1000).lr == ANCHORS[0].lr[method]
    assert default_recipe(method, 10**12).lr == ANCHORS[-1].lr[method]


def test_smaller_steps_for_bigger_models_with_a_reason():
    small = default_recipe("full", 1_182_592)   # the bundled model
    mid = default_recipe("full", 494_032_768)   # Qwen2.5-0.5B: between SmolLM2 and 7B
    big = default_recipe("full", 1_500_000_000)
    assert small.lr > mid.lr > big.lr
    assert "log-log between SmolLM2-135M" in mid.reason and "494 M parameters" in mid.reason
    assert mid.batch_size == 32 and mid.min_steps == 50  # nearest anchor in log-parameters: SmolLM2


def test_precise_takes_larger_steps_than_full_on_a_small_model():
    n = 134_515_008  # SmolLM2-135M
    assert default_recipe("precise", n).lr > default_recipe("full", n).lr


def test_steps_cover_small_data_sets():
    r = default_recipe("precise", 134_515_008)
    assert r.steps(400) == max(50, 2 * 13)  # 400 examples at batch 32: 13 steps an epoch, 2 epochs
    assert r.steps(7473) == 2 * 234         # GSM8K train: the paper's 2 epochs


def test_config_fields_left_empty_take_the_recipe_and_explicit_ones_win():
    n = 134_515_008
    rec = default_recipe("precise", n)
    cfg = TrainConfig(heads=((1, 2),)).resolved(n)
    assert (cfg.lr, cfg.batch_size, cfg.epochs, cfg.min_steps, cfg.warmup, cfg.weight_decay) == \
        (rec.lr, rec.batch_size, rec.epochs, rec.min_steps, rec.warmup, rec.weight_decay)
    assert cfg.is_resolved and cfg.resolved(n) == cfg
    own = TrainConfig(heads=((1, 2),), lr=5e-5, epochs=1.0).resolved(n)
    assert own.lr == 5e-5 and own.epochs == 1.0 and own.min_steps == 0  # an explicit epoch count is kept


def test_bad_inputs():
    with pytest.raises(FinetuneError):
        default_recipe("full", 0)
    with pytest.raises(FinetuneError, match="unknown method"):
        default_recipe("sgd", 10**6)
