"""Scale-free criteria with intervals (engine.numerics.intervals, the Paper rows of engine.findings.checks).

The sparsity row must separate a model with a known sparse circuit (the bundled model, trained for it) from one
whose effects are spread (the same architecture with random weights), by the same criterion whatever the logit
scale: the bundled model with its unembedding scaled 3x gets the same share, the same interval and the same
verdict."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from engine.backends import open_model
from engine.findings import checks
from engine.models.spec import ORGANISM_DIR
from engine.numerics.intervals import NULL_QUANTILE, shuffled_null, top_share
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import kept_pairs
from engine.techniques.path_patching import cached_path_patching, head_sparsity, path_patching

SPEC = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=0)


def _variant(tmp_path, name: str, edit) -> str:
    """A copy of the bundled model's folder with ``edit(hf_model)`` applied to its weights."""
    from transformers import AutoModelForCausalLM
    out = tmp_path / name
    shutil.copytree(ORGANISM_DIR, out)
    model = AutoModelForCausalLM.from_pretrained(ORGANISM_DIR)
    edit(model)
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """(bundled model, the same with W_U x 3, the same architecture with random weights)."""
    from transformers import AutoModelForCausalLM
    tmp = tmp_path_factory.mktemp("variants")

    def scale(m):
        assert not m.config.tie_word_embeddings  # scaling W_U alone: the embedding stays
        with torch.no_grad():
            m.lm_head.weight.mul_(3.0)

    def randomize(m):
        torch.manual_seed(0)
        fresh = AutoModelForCausalLM.from_config(m.config)
        m.load_state_dict(fresh.state_dict())

    return (open_model("organism", device="cpu"), open_model(_variant(tmp, "scaled", scale), device="cpu"),
            open_model(_variant(tmp, "random", randomize), device="cpu"))


def test_sparsity_separates_a_sparse_circuit_from_a_spread_one_on_any_logit_scale(three):
    organism, scaled, spread = three
    pairs, _ = kept_pairs(organism, SPEC)
    s_pairs, _ = kept_pairs(scaled, SPEC)
    assert [p.ref_ids for p in s_pairs] == [p.ref_ids for p in pairs]  # x3 logits: the same argmax
    raw, raw3 = path_patching(organism, pairs), path_patching(scaled, pairs)
    lo, lo3 = raw.logit_o.double(), raw3.logit_o.double()
    assert torch.allclose(lo3, 3 * lo, rtol=1e-4)  # the scale did change
    sparse, sparse3 = head_sparsity(raw), head_sparsity(raw3)
    assert sparse.holds() is True and sparse3.holds() is True
    assert sparse3.share.value == pytest.approx(sparse.share.value, abs=1e-4)
    assert (sparse3.share.low, sparse3.share.high) == pytest.approx((sparse.share.low, sparse.share.high), abs=1e-3)
    # the old criterion (a head moves the answer logit by 5 %) was not read on a share: the relative effect of
    # a head is the same here, but its logit difference is 3x -- the share is what stays
    d = (raw.head_logit - raw.logit_o[:, None, None]).reshape(len(pairs), -1).double().numpy()
    d3 = (raw3.head_logit - raw3.logit_o[:, None, None]).reshape(len(pairs), -1).double().numpy()
    assert np.abs(d3).mean() == pytest.approx(3 * np.abs(d).mean(), rel=1e-3)

    # the random model answers nothing right: its effects on the same (unfiltered) prompts are spread
    every, _ = generate(spread.tokenizer, SPEC)
    flat = head_sparsity(path_patching(spread, every[:48]))
    assert flat.holds() is False, flat
    assert flat.share.value <= flat.null < sparse.share.low


def test_the_share_and_its_null_are_plain_numpy(three):
    organism = three[0]
    pairs, _ = kept_pairs(organism, SPEC)
    raw = path_patching(organism, pairs)
    d = (raw.head_logit - raw.logit_o[:, None, None]).reshape(len(pairs), -1).double().numpy()
    s = head_sparsity(raw)
    k = round(0.05 * d.shape[1])
    col = np.abs(d.mean(0))
    assert s.k == k and s.share.value == pytest.approx(np.sort(col)[-k:].sum() / col.sum(), abs=1e-12)
    # the null by hand: every pair's row permuted over the heads
    rng = np.random.default_rng(0)
    by_hand = []
    for _ in range(200):
        x = np.stack([row[rng.permutation(len(row))] for row in d])
        a = np.abs(x.mean(0))
        by_hand.append(np.sort(a)[-k:].sum() / a.sum())
    got = shuffled_null(lambda x: top_share(x, k), d)
    assert np.quantile(got, NULL_QUANTILE) == pytest.approx(np.quantile(by_hand, NULL_QUANTILE), abs=0.03)
    # the interval by hand: a plain percentile bootstrap over pairs
    boots = [top_share(d[rng.integers(0, len(d), len(d))], k) for _ in range(2000)]
    assert (s.share.low, s.share.high) == pytest.approx(tuple(np.percentile(boots, [2.5, 97.5])), abs=0.015)


def test_one_pair_gives_no_sparsity_verdict(three):
    """With one pair, shuffling its head labels gives its own share back (the share is the same for any order of
    the heads), so the null equals the share by construction: no verdict, not "does not hold"."""
    organism = three[0]
    pairs, _ = kept_pairs(organism, SPEC)
    one = head_sparsity(path_patching(organism, pairs[:1]))
    assert one.share.value == pytest.approx(one.null, abs=1e-12)
    assert one.holds() is None and "one pair" in one.text()
    two = head_sparsity(path_patching(organism, pairs[:2]))
    assert two.pairs == 2 and "one pair" not in two.text()


def test_paper_rows_read_their_intervals_from_the_cache(three, tmp_path):
    """The per-pair results are stored with each cached result: a second run computes nothing and gives the
    same rows (intervals included)."""
    from cache import ResultCache
    organism = three[0]
    pairs, _ = kept_pairs(organism, SPEC)
    cache = ResultCache(str(tmp_path / "c.duckdb"))
    ev = checks.Evidence(organism, pairs, cache)
    first = [checks.key_heads(ev), checks.knockout(ev), checks.attention(ev), checks.mlps(ev)]
    _, computed = cached_path_patching(organism, pairs, cache=cache)
    assert not computed
    ev2 = checks.Evidence(organism, pairs, cache)
    from engine.results import cache_only
    with cache_only():  # nothing may be computed now
        again = [checks.key_heads(ev2), checks.knockout(ev2), checks.attention(ev2), checks.mlps(ev2)]
    assert again == first
    for v in first:
        assert "[" in v.lab and v.holds is not False, v


def test_heatmap_cells_carry_their_bootstrap_interval(three, tmp_path):
    """Each heatmap cell's interval is the percentile bootstrap of that cell's mean over the group's pairs: a loop of
    one scipy bootstrap per cell (the lab's one-cell ``interval``) on the per-pair results of the textbook mean."""
    from cache import ResultCache
    from engine.numerics.intervals import interval
    organism = three[0]
    pairs, _ = kept_pairs(organism, SPEC)
    table, _ = cached_path_patching(organism, pairs, cache=ResultCache(tmp_path / "c.duckdb"))
    for metric, group in (("logit_diff", "*"), ("effect", "op:add")):
        heads, mlps = table.heatmap(metric, group)
        (lo_h, lo_m), (hi_h, hi_m) = table.heatmap_intervals(metric, group)
        idx = table.per_pair.groups()[group]
        per_h, per_m = table.per_pair.per_pair(metric)
        cells = [(1, 1), (0, 0), (organism.facts.n_layers - 1, organism.facts.n_heads - 1)]
        for layer, head in cells:
            x = per_h[idx, layer, head].double().numpy()
            want = interval(lambda i, x=x: float(np.nanmean(x[i])), len(x))
            assert (want.value, want.low, want.high) == pytest.approx(
                (heads[layer][head], lo_h[layer][head], hi_h[layer][head]), abs=1e-6)
        x = per_m[idx, 1].double().numpy()
        want = interval(lambda i, x=x: float(np.nanmean(x[i])), len(x))
        assert (want.value, want.low, want.high) == pytest.approx((mlps[1], lo_m[1], hi_m[1]), abs=1e-6)
        assert all(lo <= v <= hi for row_l, row_v, row_h in zip(lo_h, heads, hi_h)
                   for lo, v, hi in zip(row_l, row_v, row_h) if v == v)
    from views.charts import heatmap, heatmap_frame
    df = heatmap_frame(heads, mlps, table.heatmap_intervals(metric, group))
    assert (df["low"] <= df["value"] + 1e-12).all() and (df["value"] <= df["high"] + 1e-12).all()
    tips = [t.get("title") for t in heatmap(df, metric).to_dict()["encoding"]["tooltip"]]
    assert "95 % interval, low" in tips and "95 % interval, high" in tips
