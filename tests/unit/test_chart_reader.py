"""The chart reader's sentences (tests/e2e/chart_reader.py) on hand-made readings: what a student would see."""

from __future__ import annotations

from tests.e2e.chart_reader import chart_problems


def _chart(texts):
    return {"drawn": True, "axes": [], "outside": [], "cut": [], "past_page": 0, "unseen": [], "items": 3,
            "marks_text": [{"text": t, "box": dict(zip("lrtb", box))} for t, box in texts]}


def test_a_note_over_its_own_halo_is_one_text_and_two_texts_on_each_other_are_a_defect():
    halo = [("answer writer", (10, 90, 40, 52)), ("answer writer", (10, 90, 40, 52))]
    assert chart_problems(_chart(halo)) == []
    assert chart_problems(_chart([("answer writer", (10, 90, 40, 52)), ("answer writer", (40, 120, 44, 56))])) == [
        "texts drawn over each other: answer writer/answer writer"]  # the same note twice, shifted: both seen
    assert chart_problems(_chart([("27.4", (10, 40, 40, 52)), ("16.7", (30, 60, 44, 56))])) == [
        "texts drawn over each other: 27.4/16.7"]
    assert chart_problems(_chart([("27.4", (10, 40, 40, 52)), ("16.7", (50, 80, 40, 52))])) == []
