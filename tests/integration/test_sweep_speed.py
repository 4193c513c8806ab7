"""Sweeps at their floor in forward passes (issue 15), on both backends and the real SmolLM2.

* END-only logits (``logits_at`` / ``end_logits``) equal the full logits at those positions;
* ``knockout_curve`` makes exactly one END-only evaluation per **distinct** knockout set (k = 0 of
  every draw and repeated draws once): as many forward calls as distinct sets with one set per
  pass, ceil(distinct / s) with s sets batched per pass -- counted by the backend's meter and,
  independently, by a forward hook on the Hugging Face embedding;
* the batched END-only path gives the same accuracies and curve as the full-logits reference (tests.helpers.references),
  and rows of one pass carrying different knockouts give what each knockout gives alone;
(the accuracy scores against full logits: ``test_accuracy.py``; transfer's one pass per set: ``test_transfer.py``).
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.machinery.batching import TOKENS_PER_PASS, length_chunks, pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import keep_correct
from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations
from engine.techniques.knockout_curve import curve_knockouts, knockout_curve
from tests.helpers.references import knockout_accuracy_full_logits, knockout_curve_full_logits


@pytest.fixture(scope="module", params=["bridge", "nnsight"])
def organism(request):
    return open_model("organism", device="cpu", backend=request.param)


@pytest.fixture(scope="module")
def pairs(organism):
    ps, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=6, seed=3))
    return keep_correct(organism, ps)


def _padded(backend, seqs):
    ids, mask, _ = pad(seqs, pad_id(backend))
    return ids, mask


def _distinct(sets) -> int:
    return len({frozenset(ko.heads) for ko in sets})


def test_end_logits_equal_full_logits(organism, pairs):
    ids, mask = _padded(organism, [p.ref_ids for p in pairs[:5]])
    end = torch.tensor([len(p.ref_ids) - 1 for p in pairs[:5]])
    full = organism.logits(ids, mask)  # [batch, pos, vocab]
    organism.meter = WorkMeter()
    got = organism.end_logits(ids, mask, end)  # [batch, vocab]
    assert got.shape == (5, full.shape[-1])
    assert torch.allclose(got, full[torch.arange(5), end], atol=1e-4)
    assert organism.meter.unembed_rows == 5  # only the END rows went through the unembedding
    pos = torch.stack([end, (end - 1).clamp_min(0)], 1)
    assert torch.allclose(organism.logits_at(ids, mask, pos), full[torch.arange(5)[:, None], pos], atol=1e-4)


@pytest.mark.parametrize("k_max,draws,per_pass", [(4, 3, 1), (4, 3, 5), (1, 40, 1), (0, 6, 1)])
def test_knockout_curve_forward_calls_equal_distinct_sets(organism, pairs, k_max, draws, per_pass):
    L, H = organism.facts.n_layers, organism.facts.n_heads
    ranked = [(L - 1 - i % L, i % H) for i in range(k_max)]
    sets = [ko for _, top, rand in curve_knockouts(L, H, ranked, k_max=k_max, draws=draws) for ko in [top, *rand]]
    distinct = _distinct(sets)
    assert distinct < len(sets)  # k = 0 of every draw is one set (and 40 one-head draws of 48 repeat)
    means = mean_activations(organism, pairs)
    embed_calls = []
    embed = organism.hf_model.get_submodule("model.embed_tokens") if organism.name == "nnsight" else None
    handle = embed.register_forward_hook(lambda *a: embed_calls.append(1)) if embed is not None else None
    organism.meter = WorkMeter()
    try:
        knockout_curve(organism, pairs, ranked, means, k_max=k_max, draws=draws, sets_per_pass=per_pass)
    finally:
        if handle is not None:
            handle.remove()
    chunks = length_chunks(pairs, TOKENS_PER_PASS)  # prompts of equal length: no padding
    assert 1 < len(chunks) == len({len(p.ref_ids) for p in pairs})
    assert organism.meter.forward_calls == len(chunks) * math.ceil(distinct / per_pass)
    assert organism.meter.body_tokens == sum(len(p.ref_ids) for p in pairs) * distinct
    if handle is not None:
        assert len(embed_calls) == organism.meter.forward_calls
    assert organism.meter.unembed_rows == distinct * len(pairs)  # END rows only


def test_batched_curve_equals_the_full_logits_reference(organism, pairs):
    L, H = organism.facts.n_layers, organism.facts.n_heads
    means = mean_activations(organism, pairs)
    ranked = [(layer, h) for layer in range(L) for h in range(H)][::5][:6]
    new = knockout_curve(organism, pairs, ranked, means, k_max=6, draws=4, seed=1)
    old = knockout_curve_full_logits(organism, pairs, ranked, means, k_max=6, draws=4, seed=1)
    assert new == old
    assert any(p.top_accuracy < 1.0 or p.random_mean < 1.0 for p in new)  # the knockouts do bite


def test_rows_with_different_knockouts_equal_each_alone(organism, pairs):
    means = mean_activations(organism, pairs)
    kos = [Knockout(), Knockout(((0, 1), (2, 3))), Knockout(mlps=(1,)), Knockout(((5, 0),), (0, 4)),
           Knockout(((2, 3), (0, 1)))]  # the last repeats the second (other order)
    together = knockout_accuracies(organism, pairs, kos, means, sets_per_pass=4)
    alone = [knockout_accuracy_full_logits(organism, pairs, ko, means) for ko in kos]
    assert together == alone
    assert together[1] == together[4]
    assert len(set(together)) > 1
