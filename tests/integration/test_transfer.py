"""Transfer (engine/techniques/transfer.py), on both backends: the key heads of one set knocked out on another, its
three knockouts per set in one pass (small work: one padded pass) and its progress in order."""

from __future__ import annotations

import pytest

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import keep_correct
from engine.techniques.knockout import mean_activations


@pytest.fixture(scope="module", params=["bridge", "nnsight"])
def organism(request):
    """The bundled model on each backend."""
    return open_model("organism", device="cpu", backend=request.param)


def test_transfer_knockouts_one_pass_per_set(organism):
    from engine.techniques.path_patching import path_patching
    from engine.techniques.transfer import transfer
    a, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add",), n=6, seed=21))
    b, _ = generate(organism.tokenizer, PromptSetSpec(ops=("mul",), n=6, seed=22))
    a, b = keep_correct(organism, a), keep_correct(organism, b)
    mean_activations(organism, a), mean_activations(organism, b)  # memoized: shared by every technique
    organism.meter = WorkMeter()
    path_patching(organism, a)
    path_patching(organism, b)
    patch_calls = organism.meter.forward_calls
    organism.meter = WorkMeter()
    seen = []
    res = transfer(organism, a, b, k=3, progress=lambda d, t: seen.append((d, t)))
    # + one (padded: the bundled model is small) knockout pass per set for its 3 knockouts
    assert organism.meter.forward_calls == patch_calls + 2
    assert res.a.accuracy_ko_own <= res.a.accuracy
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)
