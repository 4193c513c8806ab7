"""The relative effect's guard, on constructed patched logits (engine/techniques/path_patching.py, module docstring)."""

from __future__ import annotations

import math

import torch

from engine.prompts.pairs import PromptPair
from engine.techniques.path_patching import EFFECT_MIN_LOGIT, PatchingRaw, PatchingTable, summarize


def _pair(op: str, i: int) -> PromptPair:
    return PromptPair(op=op, template=f"{op}.t", family="test", a=i, b=1, answer=i + 1, ref_text=f"{i} + 1 =",
                      cf_text=f"{i} @ 1 =", ref_ids=[1, 2, 3], cf_ids=[1, 4, 3], answer_id=5)


def _raw(logit_o: list[float], ops: list[str]) -> PatchingRaw:
    """Two layers, two heads; head (1, 0) lowers every answer logit by 2, MLP 0 by 1."""
    lo = torch.tensor(logit_o)
    heads = lo[:, None, None].repeat(1, 2, 2).clone()
    heads[:, 1, 0] -= 2.0
    mlps = lo[:, None].repeat(1, 2).clone()
    mlps[:, 0] -= 1.0
    return PatchingRaw([_pair(op, i) for i, op in enumerate(ops)], lo, heads, mlps)


def _table(raw: PatchingRaw) -> PatchingTable:
    return PatchingTable(2, 2, len(raw.pairs), summarize(raw))


def test_small_and_negative_logits_are_left_out_of_the_effect_only():
    # pairs 2 and 3 would give effects -2/0.001 = -2000 and -2/-4 = +0.5 (the sign flipped)
    raw = _raw([10.0, 4.0, 0.001, -4.0], ["add", "add", "sub", "sub"])
    eff, meff = raw.per_pair("effect")
    assert raw.effect_excluded().tolist() == [False, False, True, True]
    assert torch.isnan(eff[2:]).all() and torch.isnan(meff[2:]).all()
    table = _table(raw)
    heads, mlps = table.heatmap("effect")
    assert math.isclose(heads[1][0], (-2 / 10 - 2 / 4) / 2, rel_tol=1e-6)  # only the two guarded pairs
    assert math.isclose(mlps[0], (-1 / 10 - 1 / 4) / 2, rel_tol=1e-6)
    ld, _ = table.heatmap("logit_diff")
    assert math.isclose(ld[1][0], -2.0)  # logit_diff uses every pair
    assert table.guard_counts() == (2, 4) and table.guard_counts("op:add") == (0, 2)
    note = table.effect_note()
    assert note is not None and "2 of 4" in note and f"{EFFECT_MIN_LOGIT:g}" in note
    assert table.effect_note("op:add") is None
    assert table.ranking_metric() == "effect"  # half left out: not more than half
    assert table.top_heads(1)[0][:2] == (1, 0)


def test_more_than_half_left_out_falls_back_to_logit_diff():
    raw = _raw([10.0, 0.5, -1.0, 0.0], ["add"] * 4)
    table = _table(raw)
    assert table.guard_counts() == (3, 4)
    assert table.ranking_metric() == "logit_diff"
    assert "ranked by logit_diff" in table.effect_note()
    top = table.top_heads(1)
    assert top[0][:2] == (1, 0) and math.isclose(top[0][2], -2.0)  # a logit difference, not a ratio
    # the effect is still there, from pair 0 only
    assert math.isclose(table.top_heads(1, "effect")[0][2], -2 / 10, rel_tol=1e-6)


def test_every_pair_left_out_gives_no_effect_value_but_logit_diff():
    table = _table(_raw([-3.0, 0.2], ["mul", "mul"]))
    heads, _ = table.heatmap("effect")
    assert all(math.isnan(v) for row in heads for v in row)
    assert table.top_heads(3, "effect") == []  # NaN cells are never key heads
    assert table.ranking_metric() == "logit_diff" and len(table.top_heads(3)) == 3
