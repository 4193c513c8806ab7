"""The Improve page's per-model learning rate (engine.finetune.train.default_learning_rate)."""

from __future__ import annotations

import pytest

from engine.finetune.errors import FinetuneError
from engine.finetune.train import LR_ANCHORS, default_learning_rate


def test_anchors_are_reproduced_and_clamped():
    (n0, lr0), (n1, lr1) = LR_ANCHORS
    assert default_learning_rate(int(n0))[0] == lr0
    assert default_learning_rate(int(n1))[0] == lr1
    assert default_learning_rate(1000)[0] == lr0 and default_learning_rate(10**12)[0] == lr1


def test_smaller_steps_for_bigger_models_with_a_reason():
    lr_small, _ = default_learning_rate(1_182_592)   # the bundled model
    lr_mid, why = default_learning_rate(134_515_008)  # SmolLM2-135M
    lr_big, _ = default_learning_rate(1_500_000_000)
    assert lr_small > lr_mid > lr_big
    assert 1e-4 < lr_mid < 5e-4  # between the anchors on the log-log line
    assert "135 M parameters" in why and "log-log" in why


def test_bad_size():
    with pytest.raises(FinetuneError):
        default_learning_rate(0)
