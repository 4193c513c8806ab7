"""AppTest of the one app state through the router (app.py): the typed prompt, the knockout set and the
selection follow the user across pages; a model change clears the model's picks with a note."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import REPO, errors

PROMPT = "What is 7 times 8?"
SET = {"ops": ["add", "mul"], "families": "paper (Fig. 8, 32 templates)", "n": 8, "seed": 0}


def _app() -> AppTest:
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = dict(SET)
    return at.run()


def _go(at: AppTest, script: str) -> AppTest:
    at.switch_page(f"pages/{script}").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    return at


def _text(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def test_router_titles_and_home_first():
    at = _app()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Arithmetic-circuits lab"]
    from ui.nav import PAGES
    assert [p.title for p in PAGES][:1] == ["Home"] and "Path patching" in [p.title for p in PAGES]
    assert all((REPO / p.script).is_file() for p in PAGES)
    assert sorted(p.script for p in PAGES) == sorted(f"pages/{f.name}" for f in (REPO / "pages").glob("*.py"))
    # the files are numbered in menu order (Streamlit ignores pages/ auto-discovery once st.navigation runs)
    assert [int(Path(p.script).name.split("_")[0]) for p in PAGES] == list(range(len(PAGES)))


def test_typed_prompt_follows_every_page_and_stays_in_the_box():
    at = _go(_app(), "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value(PROMPT).run()
    assert "7 * 8 = 56" in _text(at)
    for script in ("4_Patching_heatmap.py", "5_MLP_projections.py", "6_Knockout.py", "1_Story.py"):
        _go(at, script)
        assert f"`{PROMPT}`" in _text(at), script
    _go(at, "3_Prompt_lab.py")
    assert at.text_input(key="typed_prompt").value == PROMPT
    assert "7 * 8 = 56" in _text(at)


def test_knockout_picks_are_kept_and_a_heatmap_click_only_selects():
    at = _go(_app(), "6_Knockout.py")
    next(b for b in at.button if b.label == "Top-3 heads").click().run()
    top3 = list(at.multiselect(key="knockout_heads").value)
    assert len(top3) == 3
    at.multiselect(key="knockout_mlps").set_value([1]).run()
    _go(at, "4_Patching_heatmap.py")
    at.session_state["selected_head"] = (0, 0)  # what a heatmap click stores
    at.run()
    assert "Head 0.0" in [h.value for h in at.subheader]
    assert at.session_state["ko_heads"] == sorted(top3, key=lambda h: tuple(map(int, h.split("."))))  # not added
    if "0.0" not in top3:
        at.button(key="add_to_knockout").click().run()
        assert "0.0" in at.session_state["ko_heads"]
    _go(at, "6_Knockout.py")
    kept = list(at.multiselect(key="knockout_heads").value)
    assert set(top3) <= set(kept) and list(at.multiselect(key="knockout_mlps").value) == [1]


def test_mlp_cell_selection_shows_the_mlp_view():
    at = _go(_app(), "4_Patching_heatmap.py")
    at.session_state["selected_head"] = (2, -1)
    at.run()
    assert not at.exception and not errors(at), errors(at)
    assert "MLP 2" in [h.value for h in at.subheader]
    assert any("Top number tokens MLP 2 writes" in c.value for c in at.caption)


def test_model_change_clears_the_picks_with_a_note(tmp_path):
    at = _go(_app(), "6_Knockout.py")
    next(b for b in at.button if b.label == "Top-3 heads").click().run()
    assert at.session_state["ko_heads"]
    # another model (the same weights under another spec, so this test needs no second model)
    from engine.models.spec import ORGANISM_DIR
    at.sidebar.text_input(key="model_spec_input").set_value(str(ORGANISM_DIR))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception, at.exception
    notes = [w.value for w in at.warning if "The model changed" in w.value]
    assert notes and "knockout heads" in notes[0]
    assert list(at.multiselect(key="knockout_heads").value) == []
    assert not at.session_state["ko_heads"] if "ko_heads" in at.session_state else True


@pytest.mark.parametrize("steps", [6])
def test_story_walks_every_step(steps):
    at = _go(_app(), "1_Story.py")
    seen = []
    for i in range(steps):
        seen.append(at.header[0].value)
        assert at.header[0].value.startswith(f"{i + 1} · ")
        assert any("story-sentence" in m.value for m in at.markdown) or at.info, seen
        if i < steps - 1:
            at.button(key="story_next").click().run()
            assert not at.exception, at.exception
            assert not errors(at), (seen, errors(at))
    assert at.button(key="story_next").disabled
    at.button(key="story_back").click().run()
    assert at.header[0].value.startswith(f"{steps - 1} · ")


def test_smollm2_tokens_are_readable_and_bundled_heads_are_not_carried_over():
    """On the real SmolLM2 (byte-level tokens with Ġ): the Prompt lab shows ␣ with the raw piece beside it;
    a knockout set picked on the bundled model is cleared when SmolLM2 is loaded."""
    from tests.helpers.smollm2 import smollm2_gguf_path
    at = _go(_app(), "6_Knockout.py")
    next(b for b in at.button if b.label == "Top-3 heads").click().run()
    assert len(at.session_state["ko_heads"]) == 3
    at.sidebar.text_input(key="model_spec_input").set_value(str(smollm2_gguf_path()))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception, at.exception
    assert any("The model changed" in w.value for w in at.warning)
    _go(at, "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value("3 + 5 =").run()
    assert not at.exception, at.exception
    tokens = at.dataframe[0].value
    shown, raw = list(tokens.loc["token"]), list(tokens.loc["raw"])
    assert any(t.startswith("Ġ") for t in raw) and not any("Ġ" in t for t in shown)
    assert any(t.startswith("␣") for t in shown)
    _go(at, "6_Knockout.py")
    assert list(at.multiselect(key="knockout_heads").value) == []
