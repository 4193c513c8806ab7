"""AppTest of the one app state through the router (app.py): the typed prompt, the knockout set and the
selection follow the user across pages; a model change clears the model's picks with a note."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import REPO, SMALL_SET, app, errors, go

PROMPT = "What is 7 times 8?"
SET = SMALL_SET


def _text(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def test_router_titles_and_home_first():
    at = app()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Arithmetic-circuits lab"]
    from ui.nav import PAGES
    assert [p.title for p in PAGES][:1] == ["Home"] and "Path patching" in [p.title for p in PAGES]
    assert all((REPO / p.script).is_file() for p in PAGES)
    assert sorted(p.script for p in PAGES) == sorted(f"pages/{f.name}" for f in (REPO / "pages").glob("*.py"))
    # the files are numbered in menu order (Streamlit ignores pages/ auto-discovery once st.navigation runs)
    assert [int(Path(p.script).name.split("_")[0]) for p in PAGES] == list(range(len(PAGES)))


def test_typed_prompt_follows_every_page_and_stays_in_the_box():
    at = go(app(), "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value(PROMPT).run()
    assert "7 * 8 = 56" in _text(at)
    for script in ("4_Path_patching.py", "5_MLP_projections.py", "6_Knockout.py", "1_Story.py"):
        go(at, script)
        assert f"`{PROMPT}`" in _text(at), script
    go(at, "3_Prompt_lab.py")
    assert at.text_input(key="typed_prompt").value == PROMPT
    assert "7 * 8 = 56" in _text(at)


def test_knockout_picks_are_kept_and_a_heatmap_click_only_selects():
    at = go(app(), "6_Knockout.py")
    next(b for b in at.button if b.label == "Top-3 heads").click().run()
    top3 = list(at.multiselect(key="knockout_heads").value)
    assert len(top3) == 3
    at.multiselect(key="knockout_mlps").set_value([1]).run()
    go(at, "4_Path_patching.py")
    at.session_state["selected_head"] = (0, 0)  # what a heatmap click stores
    at.run()
    assert "Head 0.0" in [h.value for h in at.subheader]
    assert at.session_state["ko_heads"] == sorted(top3, key=lambda h: tuple(map(int, h.split("."))))  # not added
    if "0.0" not in top3:
        at.button(key="add_to_knockout").click().run()
        assert "0.0" in at.session_state["ko_heads"]
    go(at, "6_Knockout.py")
    kept = list(at.multiselect(key="knockout_heads").value)
    assert set(top3) <= set(kept) and list(at.multiselect(key="knockout_mlps").value) == [1]


def test_mlp_cell_selection_shows_the_mlp_view():
    at = go(app(), "4_Path_patching.py")
    at.session_state["selected_head"] = (2, -1)
    at.run()
    assert not at.exception and not errors(at), errors(at)
    assert "MLP 2" in [h.value for h in at.subheader]
    assert any("The numbers MLP 2 pushes most on your prompt" in c.value for c in at.caption)


def test_model_change_clears_the_picks_with_a_note(tmp_path):
    at = go(app(), "6_Knockout.py")
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
    at = go(app(), "1_Story.py")
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
    at = go(app(), "6_Knockout.py")
    next(b for b in at.button if b.label == "Top-3 heads").click().run()
    assert len(at.session_state["ko_heads"]) == 3
    at.sidebar.text_input(key="model_spec_input").set_value(str(smollm2_gguf_path()))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception, at.exception
    assert any("The model changed" in w.value for w in at.warning)
    go(at, "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value("3 + 5 =").run()
    assert not at.exception, at.exception
    tokens = at.dataframe[0].value
    shown, raw = list(tokens.loc["token"]), list(tokens.loc["raw"])
    assert any(t.startswith("Ġ") for t in raw) and not any("Ġ" in t for t in shown)
    assert any(t.startswith("␣") for t in shown)
    go(at, "6_Knockout.py")
    assert list(at.multiselect(key="knockout_heads").value) == []


# ---------------------------------------------------------------------------------------------
# the URL (ui.url_state): a link opens the same view; the state is written back into the URL
# ---------------------------------------------------------------------------------------------

LINK = {"prompt": PROMPT, "head": "1.2", "ko": "0.1,1.3", "ko_mlp": "1"}


def _link(params: dict) -> AppTest:
    """A fresh session opened with a link's query parameters (AppTest starts on the default page)."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = dict(SET)
    at.query_params.update(params)
    return at.run()


def _notes(at: AppTest) -> list[str]:
    return [w.value for w in at.warning if "Link parameter" in w.value]


def _click_cell(at: AppTest, layer: int, head: int) -> AppTest:
    """What a click on a cell of the Path patching heatmap (metric effect, all operations) sends."""
    from streamlit.elements.vega_charts import VegaLiteState
    from streamlit.util import AttributeDictionary

    from views.charts import HEAD_SELECTION
    at.session_state["heatmap_effect_*"] = VegaLiteState(
        {"selection": AttributeDictionary({HEAD_SELECTION: [{"layer": layer, "head": head}]})})
    return at.run()


def test_a_link_sets_the_prompt_selection_and_knockouts_every_page_shows():
    at = _link({**LINK, "job": "kept"})
    assert not at.exception, at.exception
    assert not errors(at) and not at.warning, (errors(at), [w.value for w in at.warning])
    assert at.session_state["prompt"] == PROMPT and at.session_state["selected_head"] == (1, 2)
    go(at, "6_Knockout.py")
    assert list(at.multiselect(key="knockout_heads").value) == ["0.1", "1.3"]
    assert list(at.multiselect(key="knockout_mlps").value) == [1]
    assert f"`{PROMPT}`" in _text(at)
    go(at, "4_Path_patching.py")
    assert "Head 1.2" in [h.value for h in at.subheader]
    assert at.button(key="add_to_knockout").label == "Add head 1.2 to the knockout set"
    go(at, "3_Prompt_lab.py")
    assert at.text_input(key="typed_prompt").value == PROMPT and "7 * 8 = 56" in _text(at)
    assert not at.warning, [w.value for w in at.warning]
    # the address bar still holds the link (plus the prompt set's non-default fields); other keys are kept
    assert at.query_params == {"ops": "add,mul", "n": "8", **LINK, "job": "kept"}


def test_a_links_selection_for_its_own_model_is_not_cleared():
    """follow_model clears picks made on another model; a link's picks were made on the link's model."""
    from engine.models.spec import ORGANISM_DIR
    at = _link({"model": str(ORGANISM_DIR), "head": "2.mlp", "ko": "0.1"})
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["model_choice"].spec == str(ORGANISM_DIR)
    assert at.sidebar.text_input(key="model_spec_input").value == str(ORGANISM_DIR)
    go(at, "4_Path_patching.py")
    assert not any("The model changed" in w.value for w in at.warning), [w.value for w in at.warning]
    assert "MLP 2" in [h.value for h in at.subheader]
    assert at.session_state["ko_heads"] == ["0.1"]
    assert at.query_params["model"] == str(ORGANISM_DIR) and at.query_params["head"] == "2.mlp"


def test_state_changes_are_written_into_the_url_and_defaults_removed():
    at = _link({"job": "kept"})
    assert at.query_params == {"ops": "add,mul", "n": "8", "job": "kept"}  # the test's prompt set, nothing else
    go(at, "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value(PROMPT).run()
    assert at.query_params["prompt"] == PROMPT
    at.sidebar.number_input(key="ps_seed").set_value(3)
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert at.query_params["seed"] == "3"
    at.sidebar.number_input(key="ps_seed").set_value(0)
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert "seed" not in at.query_params  # back at its default
    go(at, "6_Knockout.py")
    at.multiselect(key="knockout_heads").set_value(["1.3", "0.1"]).run()
    at.multiselect(key="knockout_mlps").set_value([2]).run()
    assert at.query_params["ko"] == "0.1,1.3" and at.query_params["ko_mlp"] == "2"
    go(at, "4_Path_patching.py")
    _click_cell(at, 2, -1)  # the page selects the MLP while it runs, then stops after the MLP view
    assert not at.exception, at.exception
    assert "MLP 2" in [h.value for h in at.subheader]
    assert at.query_params["head"] == "2.mlp"
    go(at, "3_Prompt_lab.py")
    at.text_input(key="typed_prompt").set_value(state_default_prompt()).run()
    assert "prompt" not in at.query_params
    go(at, "6_Knockout.py")
    at.multiselect(key="knockout_heads").set_value([]).run()
    at.multiselect(key="knockout_mlps").set_value([]).run()
    assert "ko" not in at.query_params and "ko_mlp" not in at.query_params
    assert at.query_params == {"ops": "add,mul", "n": "8", "head": "2.mlp", "job": "kept"}
    # another model: it is written, and the selection made on the old one is cleared from the URL too
    from engine.models.spec import ORGANISM_DIR
    at.sidebar.text_input(key="model_spec_input").set_value(str(ORGANISM_DIR))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception, at.exception
    assert at.query_params == {"model": str(ORGANISM_DIR), "ops": "add,mul", "n": "8", "job": "kept"}


def state_default_prompt() -> str:
    from ui.state import DEFAULT_PROMPT
    return DEFAULT_PROMPT


# parameter -> (bad value, phrase of its note, the app state afterwards: its default or what was valid)
BAD_LINKS = {
    "head": ("99.99", "`organism` has layers 0-7 and heads 0-7", lambda ss: "selected_head" not in ss),
    "ko": ("0.1,9.0", "no head 9.0", lambda ss: ss["ko_heads"] == ["0.1"]),
    "ko_mlp": ("1,x", "x not a layer number", lambda ss: "ko_mlps" not in ss or ss["ko_mlps"] == []),
    "ops": ("add,root", "unknown operation root", lambda ss: ss["prompt_set"]["ops"] == SET["ops"]),
    "n": ("many", "not a whole number from 1 to 1000", lambda ss: ss["prompt_set"]["n"] == SET["n"]),
    "families": ("poems", "choose from paper, word, all, notation", lambda ss: ss["prompt_set"]["families"]
                 == SET["families"]),
    "device": ("tpu", "choose from auto, cpu, cuda", lambda ss: ss["model_choice"].device == "auto"),
}


def test_bad_link_values_give_a_note_each_and_their_defaults_nothing_else_is_lost():
    at = _link({"prompt": PROMPT, **{k: v for k, (v, _, _) in BAD_LINKS.items()}})
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert [t.value for t in at.title] == ["Arithmetic-circuits lab"]  # the page is drawn
    notes = _notes(at)
    assert len(notes) == len(BAD_LINKS), notes
    for key, (value, phrase, check) in BAD_LINKS.items():
        note = next((n for n in notes if n.startswith(f"Link parameter `{key}={value}` ignored")), None)
        assert note is not None and phrase in note, (key, notes)
        assert check(at.session_state), key
    assert at.session_state["prompt"] == PROMPT  # the good part of the link is kept
    assert at.query_params == {"ops": "add,mul", "n": "8", "prompt": PROMPT, "ko": "0.1"}  # bad values are gone
    go(at, "6_Knockout.py")  # the notes are for the page the link opened
    assert not _notes(at) and list(at.multiselect(key="knockout_heads").value) == ["0.1"]


def test_the_counterfactual_kind_follows_the_link_and_the_sidebar():
    at = _link({"cf": "operand-b"})
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"]["counterfactual"] == "operand-b"
    assert at.query_params["cf"] == "operand-b"
    go(at, "4_Path_patching.py")
    assert not at.exception and not errors(at), errors(at)
    assert at.sidebar.selectbox(key="ps_counterfactual").value == "operand-b"
    at.sidebar.selectbox(key="ps_counterfactual").set_value("operator-removed")
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "cf" not in at.query_params  # back at the paper's X_c


@pytest.mark.parametrize("link", [{"head": "x.y"}, {"head": "-1.0"}, {"ko": "3"}, {"balance": "maybe"},
                                  {"cf": "operand-c"},
                                  {"seed": "-4"}, {"dtype": "int3"}, {"model": " "}],
                         ids=lambda link: "=".join(*link.items()))
def test_malformed_link_values(link):
    at = _link({**link, "prompt": PROMPT})
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    (key, value), = link.items()
    assert [n for n in _notes(at) if n.startswith(f"Link parameter `{key}={value}` ignored")], _notes(at)
    assert key not in at.query_params and at.query_params["prompt"] == PROMPT


def test_a_link_whose_model_cannot_be_loaded_falls_back_to_the_default_model(tmp_path):
    at = _link({**LINK, "model": str(tmp_path / "missing"), "dtype": "float16"})
    assert not at.exception, at.exception
    assert not errors(at), errors(at)  # the default model is loaded: no "Cannot load model" error
    notes = _notes(at)
    assert len(notes) == 1 and notes[0].startswith(f"Link parameter `model={tmp_path / 'missing'}` ignored")
    assert "does not exist" in notes[0] and "`dtype=float16`" in notes[0] and "default model `organism`" in notes[0]
    assert at.session_state["model_choice"].spec == "organism"
    go(at, "4_Path_patching.py")  # the rest of the link is kept, on the default model
    assert "Head 1.2" in [h.value for h in at.subheader] and at.session_state["ko_heads"] == ["0.1", "1.3"]
    assert "model" not in at.query_params and "dtype" not in at.query_params
    assert at.query_params["head"] == "1.2" and at.query_params["prompt"] == PROMPT


# ---------------------------------------------------------------------------------------------
# every page's own controls in the link (url_state.CHOICES): the Story's step and Large fonts, ...
# ---------------------------------------------------------------------------------------------

CHOICE_LINK = {"step": "2", "large": "1", "pp_metric": "logit_diff", "pp_k": "3", "pp_tab": "Stability",
               "ko_k": "5", "ko_draws": "4", "lens_group": "op:mul", "faith_metric": "accuracy"}


def test_a_link_sets_each_pages_controls_and_a_changed_control_is_written_back():
    at = _link(CHOICE_LINK)
    assert not at.exception and not errors(at) and not _notes(at), (errors(at), _notes(at))
    go(at, "1_Story.py")
    assert at.header[0].value.startswith("2 · ") and at.toggle(key="story_large_input").value is True
    go(at, "6_Knockout.py")
    assert at.number_input(key="ko_k_input").value == 5 and at.slider(key="ko_draws_input").value == 4
    assert "Top-5 heads" in [b.label for b in at.button]
    go(at, "4_Path_patching.py")
    assert at.selectbox(key="pp_metric_input").value == "logit_diff" and at.number_input(key="pp_k_input").value == 3
    assert at.session_state["pp_tab_input"] == "Stability"
    go(at, "5_MLP_projections.py")
    assert at.selectbox(key="lens_group").value == "op:mul"
    go(at, "11_Faithfulness.py")
    assert at.radio(key="faith_metric").value == "accuracy"
    assert not _notes(at) and at.query_params == {"ops": "add,mul", "n": "8", **CHOICE_LINK}
    # a control changed on its page is written into the URL; back at its default it leaves it
    go(at, "6_Knockout.py")
    at.number_input(key="ko_k_input").set_value(7).run()
    assert at.query_params["ko_k"] == "7" and "Top-7 heads" in [b.label for b in at.button]
    at.number_input(key="ko_k_input").set_value(3).run()
    assert "ko_k" not in at.query_params
    go(at, "1_Story.py")
    at.button(key="story_next").click().run()
    at.toggle(key="story_large_input").set_value(False).run()
    assert at.query_params["step"] == "3" and "large" not in at.query_params


def test_a_link_sets_the_circuit_and_transfer_controls():
    at = _link({"circ_k": "4", "circ_mlps": "2", "circ_hh": "1", "tr_set": "decimals (Fig. 4)", "tr_k": "6"})
    assert not at.exception and not errors(at) and not _notes(at), (errors(at), _notes(at))
    go(at, "12_Circuit.py")
    assert at.number_input(key="circuit_k_input").value == 4 and at.number_input(key="circuit_mlps_input").value == 2
    assert at.toggle(key="circuit_senders_input").value is True
    go(at, "7_Transfer.py")
    assert at.selectbox(key="transfer_second_input").value == "decimals (Fig. 4)"
    assert at.number_input(key="transfer_k_input").value == 6
    assert {k: at.query_params[k] for k in ("circ_k", "circ_mlps", "circ_hh", "tr_set", "tr_k")} == {
        "circ_k": "4", "circ_mlps": "2", "circ_hh": "1", "tr_set": "decimals (Fig. 4)", "tr_k": "6"}


def test_a_link_sets_the_circuit_pages_edge_circuit():
    """The Circuit page's edge circuit (Draw, ranking, edges drawn) travels in the link, so in a workspace too
    (``ui.workspaces.current`` saves the link's parameters)."""
    link = {"circ_edges": "1", "circ_ranking": "exact", "circ_top": "12"}
    at = _link(link)
    assert not at.exception and not errors(at) and not _notes(at), (errors(at), _notes(at))
    go(at, "12_Circuit.py")
    assert not at.exception and not errors(at), errors(at)
    assert at.radio(key="circuit_edges_input").value is True
    assert at.radio(key="circuit_ranking_input").value == "exact"
    assert at.number_input(key="circuit_top_input").value == 12
    assert any(b.label.startswith("Score every edge (exact edge patching)") for b in at.button)  # asked, not run
    assert {k: at.query_params[k] for k in link} == link
    at.number_input(key="circuit_top_input").set_value(30).run()
    at.radio(key="circuit_ranking_input").set_value("eap").run()  # the default: left out of the link
    assert at.query_params["circ_top"] == "30" and "circ_ranking" not in at.query_params
    at.radio(key="circuit_edges_input").set_value(False).run()
    assert "circ_edges" not in at.query_params and at.number_input(key="circuit_k_input").value >= 1


# parameter -> (bad value, phrase of its note, the page that checks it: None = read with the link)
BAD_CHOICES = {
    "step": ("x", "not a whole number from 1 to 99", None),
    "large": ("big", "use 1 or 0", None),
    "pp_metric": ("logit", "choose from effect, logit_diff", None),
    "pp_k": ("999", "not a whole number from 1 to 64 here", "4_Path_patching.py"),
    "pp_group": ("op:pow", "choose from *, op:add, op:mul, carry:yes, carry:no, typed", "4_Path_patching.py"),
    "ko_kmax": ("31", "not a whole number from 1 to 30", None),
    "circ_k": ("999", "not a whole number from 1 to 64 here", "12_Circuit.py"),
    "circ_top": ("61", "not a whole number from 1 to 60", None),
    "circ_ranking": ("acdc", "choose from exact, eap, eap-ig", None),
    "tr_set": ("lyrics", "choose from word problems (Fig. 10)", None),
}


@pytest.mark.parametrize("key", list(BAD_CHOICES))
def test_a_bad_page_control_in_a_link_gives_a_note_and_the_default(key):
    value, phrase, checked_by = BAD_CHOICES[key]
    at = _link({key: value, "prompt": PROMPT})
    assert not at.exception and not errors(at), errors(at)
    if checked_by is not None:
        assert not _notes(at)  # the value's form is right: its page checks it
        go(at, checked_by)
    note = next((n for n in _notes(at) if n.startswith(f"Link parameter `{key}={value}` ignored")), None)
    assert note is not None and phrase in note, _notes(at)
    assert key not in at.query_params and at.query_params["prompt"] == PROMPT


def test_a_links_step_beyond_the_story_gives_a_note_and_step_1():
    at = _link({"step": "9"})
    go(at, "1_Story.py")
    assert any("`step=9` ignored: not a whole number from 1 to 6 here" in n for n in _notes(at)), _notes(at)
    assert at.header[0].value.startswith("1 · ") and "step" not in at.query_params
