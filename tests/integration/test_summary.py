"""The circuit summary is built from cached results only, with the numbers the techniques computed."""

from __future__ import annotations

import re

import pytest

from cache import ResultCache
from engine.backends import open_model
from engine.findings.summary import circuit_summary
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.results import NotCached, cache_only
from engine.techniques.logit_lens import cached_logit_lens
from engine.techniques.path_patching import cached_path_patching
from tests.integration.test_path_patching import CountingBackend


def test_summary_reads_only_the_cache_and_quotes_its_numbers(tmp_path):
    model = open_model("organism", device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "mul"), n=10, seed=0))
    cache = ResultCache(tmp_path / "c.duckdb")
    counting = CountingBackend(model)
    # nothing cached: one "not computed yet" finding, and no forward pass
    assert [(f.step, f.computed) for f in circuit_summary(counting, pairs, cache)] == [("key heads", False)]
    with cache_only(), pytest.raises(NotCached):
        cached_path_patching(counting, pairs, cache=cache)
    assert counting.forwards == 0 and cache.list_runs() == []

    table, _ = cached_path_patching(model, pairs, cache=cache)
    lens, _ = cached_logit_lens(model, pairs, cache=cache)
    n = counting.forwards
    found = {f.step: f for f in circuit_summary(counting, pairs, cache)}
    assert counting.forwards == n  # still nothing computed
    layer, head, effect = table.top_heads(1)[0]
    said = re.search(rf"{layer}\.{head} \(([-+][0-9.e-]+)\)", found["key heads"].text)
    assert found["key heads"].computed and said and float(said.group(1)) == pytest.approx(effect, abs=5e-3, rel=0.05)
    assert not found["attention"].computed  # attention roles were never computed
    assert found["MLPs"].computed and found["MLPs"].technique == "mlp-projections"
    assert "contribution" not in found["MLPs"].text  # the projections were never computed
    last = [r for r in lens if r.group == "*"][-1]
    assert found["logit lens"].computed and f"P = {last.mean_prob:.2f} after the last layer" in found["logit lens"].text
    assert not found["knockout"].computed
    from engine.techniques.knockout_curve import KNOCKOUT_DRAWS, KNOCKOUT_K, cached_knockout_curve
    ranked = [(layer, h) for layer, h, _ in table.top_heads(KNOCKOUT_K)]
    pts, _ = cached_knockout_curve(model, pairs, ranked, k_max=KNOCKOUT_K, draws=KNOCKOUT_DRAWS, cache=cache)
    ko = {f.step: f for f in circuit_summary(model, pairs, cache)}["knockout"]
    gap = 100 * (pts[3].random_mean - pts[3].top_accuracy)
    assert ko.computed and f"top 3 heads leaves {pts[3].top_accuracy:.0%}" in ko.text
    assert f"gap of {gap:.0f} points" in ko.text


def test_the_mlp_sentence_claims_the_answer_only_where_its_gap_over_other_numbers_is_above_0(tmp_path, monkeypatch):
    """SmolLM2's Story said "MLP 29's contribution points most towards the answer's unembedding (cos 0.20 vs 0.20 for
    other numbers)" where the Paper page called the same gap +0.00 [-0.01, +0.01] inconclusive."""
    import numpy as np

    import engine.techniques.mlp_projections as mp
    model = open_model("organism", device="cpu")
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add",), n=10, seed=0))
    cache = ResultCache(tmp_path / "c.duckdb")
    cached_path_patching(model, pairs, cache=cache)
    mp.cached_mlp_projections(model, pairs, cache=cache)
    text = {f.step: f for f in circuit_summary(model, pairs, cache)}["MLPs"].text
    cos_c, cos_o, _ = mp.cached_answer_cosines(model, pairs, cache=cache)
    best = int(np.argmax(cos_c.mean(0)))
    assert f"MLP {best}'s contribution points most towards the answer's unembedding" in text, text
    assert "gap +" in text
    rng = np.random.default_rng(0)  # answer and other numbers alike: no claim, the interval said
    same = rng.normal(0.2, 0.01, cos_c.shape)
    monkeypatch.setattr(mp, "cached_answer_cosines", lambda *a, **k: (same, same + rng.normal(0, 0.01, same.shape),
                                                                    None))
    text = {f.step: f for f in circuit_summary(model, pairs, cache)}["MLPs"].text
    assert "points most towards" not in text and "but not shown to be more than with the other numbers'" in text
