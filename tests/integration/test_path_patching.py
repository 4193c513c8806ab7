"""Exactness of fast path patching against the textbook one-forward-per-sender reference."""

from __future__ import annotations

import pytest
import torch

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.path_patching import cached_path_patching, path_patching, path_patching_reference, summarize
from tests.integration.tiny_models import build_tiny_model

ARCHS = ("llama", "qwen2", "mistral", "gpt2")


def _max_rel_diff(backend, pairs, senders=None):
    fast = path_patching(backend, pairs, batch_size=7)
    ref = path_patching_reference(backend, pairs, senders, batch_size=7)
    # relative to the answer logit, but not to one that happens to be ~0 (a random-init model's can be
    # 0.002: float32 noise of 1e-6 would read as 5e-4)
    scale = fast.logit_o.abs().clamp_min(0.05)
    worst = 0.0
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        worst = max(worst, float(((f - v).abs() / scale).max()))
    return worst, fast


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_equals_reference_on_random_init(arch, tmp_path):
    backend = open_model(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=4, seed=1))
    worst, fast = _max_rel_diff(backend, pairs)
    assert worst < 1e-4, f"{arch}: fast vs reference relative difference {worst:.2e}"
    # the patch moves something: not every sender is a no-op
    assert float((fast.head_logit - fast.logit_o[:, None, None]).abs().max()) > 1e-4


def test_fast_equals_reference_on_bundled_model(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul"), n=10, seed=2))
    worst, _ = _max_rel_diff(organism, pairs)
    assert worst < 1e-4


def test_effect_definitions(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("sub",), n=6, seed=3))
    raw = path_patching(organism, pairs, with_prob=True)
    eff, meff = raw.per_pair("effect")
    ld, _ = raw.per_pair("logit_diff")
    assert torch.allclose(eff * raw.logit_o[:, None, None], ld, atol=1e-5)
    pd, _ = raw.per_pair("prob_diff")
    assert pd.shape == eff.shape and float(pd.abs().max()) <= 1.0
    # the unpatched END logits match a plain forward pass
    lg = organism.logits(torch.tensor([pairs[0].ref_ids]))
    assert abs(float(lg[0, -1, pairs[0].answer_id]) - float(raw.logit_o[0])) < 1e-4
    groups = {v.group for v in summarize(raw)}
    assert "*" in groups and "op:sub" in groups


class CountingBackend:
    """Delegates to a backend; ``forwards`` counts its forward passes of every kind (the backend's
    own meter, reset here), whichever of its methods ran them."""

    def __init__(self, inner):
        self._inner = inner
        inner.meter = WorkMeter()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @property
    def forwards(self) -> int:
        return self._inner.meter.forward_calls


def test_second_call_is_served_from_cache(organism, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add",), n=12, seed=4))
    counting = CountingBackend(organism)
    t1, computed1 = cached_path_patching(counting, pairs, cache=cache)
    n1 = counting.forwards
    t2, computed2 = cached_path_patching(counting, pairs, cache=cache)
    assert computed1 and not computed2
    assert n1 > 0 and counting.forwards == n1  # no forward pass for the cached call
    assert t1.heatmap() == t2.heatmap()
    heads, mlps = t2.heatmap("effect")
    assert len(heads) == organism.facts.n_layers and len(heads[0]) == organism.facts.n_heads
    top = t2.top_heads(3)
    assert top == sorted(top, key=lambda t: t[2]) and len(top) == 3


@pytest.mark.parametrize("arch", ("qwen2", "gpt2"))
def test_a_subset_of_head_senders_equals_the_full_run(arch, tmp_path):
    """Only some heads as senders (the operand grid's candidates): those heads and every MLP equal the full run's, on
    the END chains and on the textbook loop; every other head is NaN."""
    from engine.techniques.path_patching import path_patching_loop
    backend = open_model(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "sub"), n=4, seed=1))
    L, H = backend.facts.n_layers, backend.facts.n_heads
    heads = [(1, H - 1), (L - 1, 0), (L - 1, H - 1)]  # none of layer 0: the self-check chain still starts there
    full = path_patching(backend, pairs)
    for part in (path_patching(backend, pairs, heads=heads), path_patching_loop(backend, pairs, heads=heads)):
        assert torch.allclose(part.logit_o, full.logit_o, atol=1e-5)
        assert torch.allclose(part.mlp_logit, full.mlp_logit, atol=1e-4)
        for layer, h in heads:
            assert torch.allclose(part.head_logit[:, layer, h], full.head_logit[:, layer, h], atol=1e-4)
        chosen = torch.zeros(L, H, dtype=torch.bool)
        chosen[[a for a, _ in heads], [b for _, b in heads]] = True
        assert bool(part.head_logit[:, ~chosen].isnan().all()) and not bool(part.head_logit[:, chosen].isnan().any())


def test_carry_groups_equal_path_patching_of_those_pairs_alone(organism, tmp_path):
    """Issue 49's carry split: the cached table's ``carry:yes`` / ``carry:no`` heatmaps, their intervals and key heads
    equal path patching run on those pairs alone (every pair is patched on its own, so a subset's mean is the mean of
    its pairs), and they are the pairs whose sum carries / difference borrows; multiplications are in neither."""
    from cache import ResultCache
    from engine.prompts.pairs import column_carry
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub", "mul"), n=8, seed=5))
    table, _ = cached_path_patching(organism, pairs, cache=ResultCache(tmp_path / "c.duckdb"))
    groups = table.per_pair.groups()
    assert {"carry:yes", "carry:no"} <= set(table.groups())
    for group, carries in (("carry:yes", True), ("carry:no", False)):
        idx = groups[group]
        assert idx and all(column_carry(pairs[i].op, pairs[i].a, pairs[i].b) is carries for i in idx)
        assert all(pairs[i].op in ("add", "sub") for i in idx)
        alone, _ = cached_path_patching(organism, [pairs[i] for i in idx], cache=ResultCache(tmp_path / f"{group}.db"))
        for metric in ("effect", "logit_diff"):
            (h, m), (ha, ma) = table.heatmap(metric, group), alone.heatmap(metric)
            assert torch.allclose(torch.tensor(h), torch.tensor(ha), atol=1e-5, equal_nan=True), (group, metric)
            assert torch.allclose(torch.tensor(m), torch.tensor(ma), atol=1e-5, equal_nan=True), (group, metric)
            assert table.heatmap_intervals(metric, group) is not None
        top = table.top_heads(5, "logit_diff", group)
        assert [t[:2] for t in top] == [t[:2] for t in alone.top_heads(5, "logit_diff")]
    assert len(groups["carry:yes"]) + len(groups["carry:no"]) == sum(p.op in ("add", "sub") for p in pairs)
