"""A class on the bundled model (issue 47, Build 6): the Knockout page picks k and shows where the typed prompt
breaks; a zero change shows no arrow; the Story's sentences are computed from the chart beside them and say what
they are about (your prompt, or the set's mean), its words are explained beside it, and Large fonts scale the
charts' text."""

from __future__ import annotations

import json

import pyarrow as pa
from streamlit.testing.v1 import AppTest

from tests.app.conftest import REPO, SMALL_SET, app, errors, go

SET = SMALL_SET


def _charts(at: AppTest) -> list[tuple[dict, "pa.Table | None"]]:
    """(spec, data) of every chart on the page, in order (the data of its first dataset)."""
    out = []
    for c in at.get("vega_lite_chart"):
        data = c.proto.datasets[0].data.data if c.proto.datasets else None
        out.append((json.loads(c.proto.spec), pa.ipc.open_stream(data).read_pandas() if data else None))
    return out


def _popovers(at: AppTest, label: str) -> list:
    """The popovers labelled ``label`` on the page (AppTest has no accessor for them: blocks of type popover)."""
    found = []

    def walk(node):
        for child in getattr(node, "children", {}).values():
            if getattr(child, "type", "") == "popover" and child.proto.popover.label == label:
                found.append(child)
            walk(child)
    walk(at.main)
    return found


def _sentences(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith("<p class='story-sentence'>")]


def test_knockout_picks_k_and_shows_where_the_typed_prompt_breaks():
    at = go(app(), "6_Knockout.py")
    # nothing knocked out: no change, and no green arrow for it
    assert [(m.label, m.delta) for m in at.metric] == [("P(answer)", ""), ("Accuracy after knockout", "")]
    at.number_input(key="ko_k_input").set_value(5).run()
    button = next(b for b in at.button if b.label == "Top-5 heads")
    button.click().run()
    assert not at.exception and not errors(at), errors(at)
    assert len(at.session_state["ko_heads"]) == 5 and at.query_params["ko_k"] == "5"
    assert all(m.delta for m in at.metric)  # five key heads change both
    # your prompt, k = 0..10: P(answer) and its top token per k; the sentence reads the same frame
    frame = next(d for s, d in _charts(at) if d is not None and "answer_top1" in d)
    assert list(frame["k"]) == list(range(11)) and frame["answer_top1"].iloc[0]
    broken = frame[~frame["answer_top1"]]
    said = next(m.value for m in at.markdown if m.value.startswith("Your prompt `The sum of 3 and 5 is`"))
    if len(broken):
        k = int(broken["k"].iloc[0])
        assert f"up to the top {k - 1} heads knocked out" in said and f"the top {k} (adding head " in said, said
    else:
        assert "with up to the top 10 heads knocked out" in said, said


def test_the_story_attention_sentences_follow_their_charts_and_the_typed_prompt():
    at = app()
    at.session_state["story_step"] = 4
    go(at, "1_Story.py")
    assert at.header[0].value.startswith("4 · What the top head reads")
    (set_said, prompt_said), charts = _sentences(at), _charts(at)
    assert set_said.startswith("<p class='story-sentence'>Over the ") and "prompts of the set" in set_said
    roles = next(d for _, d in charts if d is not None and "value" in d and "role" in d)
    best = roles.loc[roles["value"].idxmax()]
    assert f"most on {best['role']}: {best['value']:.0%}." in set_said, (set_said, roles)
    said = prompt_said
    for text in ("What is 7 times 8?", "6 - 2 ="):
        row = next(d for _, d in _charts(at) if d is not None and "weight" in d)
        top = row.loc[row["weight"].idxmax()]
        assert f"looks most at token {int(top['position'])} " in said and f"{top['weight']:.0%}" in said, (said, row)
        go(at, "3_Prompt_lab.py")
        at.text_input(key="typed_prompt").set_value(text).run()
        go(at, "1_Story.py")
        said = _sentences(at)[1]
        assert f"On your prompt <code>{text}</code>" in said, said
    assert _sentences(at)[0] == set_said  # the set's mean does not depend on the typed prompt


def test_the_story_explains_its_words_and_large_fonts_scale_the_charts():
    from engine.findings.glossary import define
    at = app()
    at.session_state["story_step"] = 1
    go(at, "1_Story.py")
    [words] = _popovers(at, "Words used here")
    text = " ".join(m.value for m in words.markdown)
    assert define("counterfactual") in text and define("probability") in text
    small = [spec.get("config", {}).get("axis", {}).get("labelFontSize") for spec, _ in _charts(at)]
    at.toggle(key="story_large_input").set_value(True).run()
    assert at.query_params.get("large") == "1"
    large = [spec["config"]["axis"]["labelFontSize"] for spec, _ in _charts(at)]
    assert small == [None] * len(small) and large and all(size >= 16 for size in large), (small, large)
    texts = [layer["mark"].get("fontSize") for spec, _ in _charts(at) for layer in spec.get("layer", [])
             if layer["mark"]["type"] == "text"]
    assert texts and all(size >= 17 for size in texts), texts  # the bars' printed values (13 px) too


def test_home_speaks_plainly():
    at = app()
    shown = " ".join([c.value for c in at.caption] + [m.value for m in at.markdown])
    assert "docs/" not in shown and ".md" not in shown, shown


def test_the_storys_heavy_steps_wait_for_a_button_with_their_cost(monkeypatch):
    """Every Story step that computes goes through the pages' gate: with the threshold at 0 s every computation is
    heavy, so step 3 shows a button per missing result (path patching, then the knockout curve), each carrying the
    cost model's estimate, and draws its chart only once they are pressed; then it reads the cache at once."""
    import engine.cost
    monkeypatch.setattr(engine.cost, "HEAVY_S", 0.0)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = {**SET, "seed": 7}  # a set nobody has computed
    at.session_state["story_step"] = 3
    at.run()
    go(at, "1_Story.py")
    pressed = []
    def buttons():  # the step's (and the set's filter's), not the sidebar's report
        return [b for b in at.button if "(estimated: about " in b.label and not b.label.startswith("Build the report")]
    for _ in range(4):  # the filter of the set, path patching, the knockout curve
        asking = buttons()
        if not asking:
            break
        assert not _charts(at) and not _sentences(at), asking[0].label
        pressed.append(asking[0].label)
        asking[0].click().run()
        assert not at.exception and not errors(at), errors(at)
    assert any(label.startswith("Run path patching (estimated: about ") for label in pressed)
    assert any(label.startswith("Compute the knockout curve (k = 0 .. 10") for label in pressed), pressed
    assert _charts(at) and _sentences(at)
    at.run()  # cached now: no button
    assert not buttons() and _charts(at)
