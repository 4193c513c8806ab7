"""Faithfulness curves (engine.techniques.faithfulness) on the bundled model: the batched readouts equal a plain
per-pair loop under both ablations; the exact ranking's circuits beat random ones by a wide margin (CPR gap
interval above 0); AtP's curve is computed beside it; the cached result reads back without a forward pass; the CLI
writes the curves and MIB submission files that EAP-IG's loader would accept."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from engine.prompts.promptsets import PromptSetSpec
from engine.results import cache_only
from engine.techniques import faithfulness as F
from engine.techniques.accuracy import kept_pairs
from engine.techniques.knockout import mean_activations
from tests.helpers.cli import run_cli
from tests.helpers.references import (
    continued_readouts_equal_reference,
    interchange_margin_full_logits,
    mean_ablated_margin_full_logits,
)
from tests.unit.test_faithfulness import _validate_like_from_json

SPEC = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=20, seed=0)


@pytest.fixture(scope="module")
def pairs(organism):
    ps, _ = kept_pairs(organism, SPEC)
    assert len(ps) >= 40
    return ps


@pytest.mark.parametrize("ablation", F.ABLATIONS)
def test_readouts_equal_a_per_pair_loop(organism, pairs, ablation):
    sub = pairs[::9]
    L, H = organism.facts.n_layers, organism.facts.n_heads
    scores = {"exact": np.arange(L * H + L, dtype=float)[::-1].copy()}
    means = mean_activations(organism, sub) if ablation == "mean" else None
    raw = F.faithfulness(organism, sub, scores, means, draws=2, sizes=(0.0, 0.1, 0.5, 1.0))
    assert [c.ranking for c in raw.circuits] == ["model", "empty"] + ["exact"] * 4 + ["random"] * 4
    for s, c in enumerate(raw.circuits):
        for i, p in enumerate(sub):  # a random circuit: the pair's own order (pair i: order i mod 2)
            ko = F.circuit_for(raw, c, i)
            right, margin = (interchange_margin_full_logits(organism, p, ko) if means is None
                             else mean_ablated_margin_full_logits(organism, p, ko, means))
            assert bool(raw.right[s, i]) == right
            assert abs(float(raw.margin[s, i]) - margin) < 1e-4 * max(1.0, abs(margin)), (s, i)
    ko0 = F.circuit_for(raw, raw.circuits[-2], 0)  # the two orders' circuits of one size differ
    assert ko0 != F.circuit_for(raw, raw.circuits[-2], 1) and ko0 == F.circuit_for(raw, raw.circuits[-2], 2)


def test_exact_circuits_beat_random_ones_on_the_bundled_model(organism, pairs, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "r.duckdb")
    table, computed = F.cached_faithfulness(organism, pairs, cache=cache)
    assert computed
    ex, atp, rnd = (table.score(r) for r in F.RANKINGS)
    assert ex.gap_interval.above(0.0) is True and ex.gap_low > 0.1  # a wide margin, not one draw of noise
    assert ex.cpr_low > rnd.cpr_high
    assert atp.cpr == atp.cpr and atp.cpr_low <= atp.cpr <= atp.cpr_high  # AtP's curve beside it, with its interval
    for r in F.RANKINGS:
        curve = table.curve(r)
        assert [p.size for p in curve] == list(F.SIZES)
        assert curve[0].f == pytest.approx(0.0) and curve[-1].f == pytest.approx(1.0)
    lab, holds = F.verdict_text(table)
    assert holds is True and "CPR exact" in lab
    with cache_only():  # read back: the same numbers, no forward pass
        again, computed = F.cached_faithfulness(organism, pairs, cache=cache)
    assert not computed and again.scores == table.scores and again.points == table.points


def test_cli_writes_curves_and_mib_files(tmp_path):
    out, mib = tmp_path / "f.csv", tmp_path / "mib"
    r = run_cli("faithfulness", "--model", "organism", "--op", "add,sub", "--n", "12", "--out", str(out),
                "--draws", "2", "--mib-dir", str(mib), cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(open(out, newline="")))
    assert {row["ranking"] for row in rows} == set(F.RANKINGS) and len(rows) == 3 * 2 * len(F.SIZES)
    assert [p.split("/")[-2] for p in res["mib"]] == ["arithmetic-addition_organism", "arithmetic-subtraction_organism"]
    for p in res["mib"]:
        _validate_like_from_json(json.loads(open(p).read()))
    bad = run_cli("faithfulness", "--model", "organism", "--op", "mul", "--n", "6", "--out", str(out),
                  "--mib-dir", str(mib), cache=tmp_path / "c.duckdb")
    assert bad.returncode == 2 and "addition or subtraction" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_counterfactual_knockouts_continue_the_shared_prefix(organism, pairs):
    L, H = organism.facts.n_layers, organism.facts.n_heads
    orders = F.random_orders(L * H + L, 3, seed=1)
    kos = [F.circuit_knockout(o, k, L, H) for o in orders for k in (0, 5, 20, 40)]
    out = continued_readouts_equal_reference(organism, pairs[::7], kos)
    # a continuation that does not reproduce X_c's END logits is not used: the textbook passes give the same
    from engine.techniques.knockout import knockout_end
    cont = organism.continue_end_logits
    organism.continue_end_logits = lambda *a, **kw: cont(*a, **kw) * 1.01
    try:
        again = knockout_end(organism, pairs[::7], kos, None, sets_per_pass=4)
    finally:
        del organism.continue_end_logits
    assert torch.equal(again.right, out.right)
    assert torch.allclose(again.margin, out.margin, atol=1e-4)
