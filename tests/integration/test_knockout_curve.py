"""The knockout curve of a typed prompt (engine/techniques/knockout_curve.py) against one full-logits pass per k
on the bundled model."""

from __future__ import annotations

import pytest

from engine.techniques.knockout import Knockout, mean_activations


def test_prompt_knockout_curve_equals_one_full_logits_pass_per_k(model, pairs):
    """The typed prompt under the top-k heads (k = 0..K, one batched END-only pass) == each knockout on its own,
    full logits."""
    from engine.techniques.knockout_curve import prompt_knockout_curve
    from engine.techniques.promptlab import check_typed_text
    from tests.helpers.references import prompt_knockout_full_logits
    means = mean_activations(model, pairs)
    typed = check_typed_text(model.tokenizer, "The sum of 3 and 5 is")
    ranked = [(1, 3), (1, 0), (5, 5), (1, 1), (3, 2), (6, 2)]
    pts = prompt_knockout_curve(model, typed.ids, typed.answer.answer_id, ranked, means, k_max=len(ranked))
    assert [p.k for p in pts] == list(range(len(ranked) + 1)) and pts[0].head == "" and pts[1].head == "1.3"
    for p in pts:
        want_p, want_top = prompt_knockout_full_logits(model, typed.ids, typed.answer.answer_id,
                                                       Knockout(tuple(ranked[:p.k])), means)
        assert abs(p.p_answer - want_p) < 1e-5 and p.top_id == want_top, p
        assert p.answer_top1 == (want_top == typed.answer.answer_id)
    assert pts[0].answer_top1  # the bundled model answers 8
    with pytest.raises(ValueError, match="the ranking has"):
        prompt_knockout_curve(model, typed.ids, typed.answer.answer_id, ranked, means, k_max=len(ranked) + 1)
