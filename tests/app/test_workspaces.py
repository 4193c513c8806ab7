"""AppTest of the Workspaces page: save the view, list it, reopen it, delete it; a damaged file and another model's
file give an st.error in the page's words and change nothing."""

from __future__ import annotations

import json

import pytest

from tests.app.conftest import errors, page

PROMPT = "Q: What is 7 times 8? A:"


@pytest.fixture()
def db(tmp_path, monkeypatch):
    path = tmp_path / "results.duckdb"
    monkeypatch.setenv("ARITHLAB_CACHE", str(path))
    return path


def _saved_names(at) -> list[str]:
    return list(at.dataframe[0].value["name"]) if at.dataframe else []


def test_save_list_reopen_delete(db):
    at = page("16_Workspaces.py")
    at.session_state["prompt"] = PROMPT
    at.session_state["selected_head"] = (1, 3)
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("No workspace saved yet" in i.value for i in at.info)
    at.text_input(key="workspace_name").set_value("sevens").run()
    at.button(key="workspace_save").click().run()
    assert not errors(at) and _saved_names(at) == ["sevens"]
    at.session_state["prompt"] = "2 + 2 ="
    at.session_state["selected_head"] = (0, 0)
    at.button(key="workspace_reopen").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert at.session_state["prompt"] == PROMPT and at.session_state["selected_head"] == (1, 3)
    assert any("Reopened workspace 'sevens'" in s.value for s in at.success)
    at.button(key="workspace_delete").click().run()
    assert not errors(at) and _saved_names(at) == []


@pytest.mark.parametrize("data, phrase", [
    (b'{"schema": "arithlab-workspace", "version": 1, "model": ', "not valid JSON"),
    (json.dumps({"schema": "arithlab-workspace", "version": 1, "name": "theirs",
                 "model": {"spec": "/no/such/dir/other.gguf", "fingerprint": "0123456789abcdef"},
                 "state": {"prompt": "9 + 9 ="}, "pins": [{"component": "1.3", "note": "theirs"}]}).encode(),
     "weights fingerprint 0123456789abcdef"),
])
def test_a_damaged_or_other_models_file_is_refused_and_nothing_lost(db, data, phrase):
    at = page("16_Workspaces.py")
    at.session_state["prompt"] = PROMPT
    at.run()
    at.text_input(key="workspace_name").set_value("mine").run()
    at.button(key="workspace_save").click().run()
    at.file_uploader(key="workspace_file").set_value(("w.json", data, "application/json")).run()
    assert not at.exception
    assert any(phrase in e and "Nothing was changed" in e for e in errors(at)), errors(at)
    assert at.session_state["prompt"] == PROMPT and _saved_names(at) == ["mine"]
    from cache import ResultCache
    assert ResultCache(db).labels("0123456789abcdef") == {}  # the refused file's pins were not imported


def test_a_file_of_the_loaded_model_opens_its_view_and_adds_its_pins(db, organism):
    data = json.dumps({"schema": "arithlab-workspace", "version": 1, "name": "colleague",
                       "model": {"spec": "/their/copy/of/organism", "fingerprint": organism.facts.fingerprint},
                       "state": {"prompt": "9 + 9 =", "head": "1.3", "ko": "1.1"},
                       "pins": [{"component": "1.3", "note": "operator mover"}]}).encode()
    at = page("16_Workspaces.py").run()
    at.file_uploader(key="workspace_file").set_value(("colleague.json", data, "application/json")).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert at.session_state["prompt"] == "9 + 9 =" and at.session_state["selected_head"] == (1, 3)
    assert any("1 pin(s) added" in s.value for s in at.success)
    from cache import ResultCache
    assert ResultCache(db).labels(organism.facts.fingerprint) == {"1.3": "operator mover"}


def test_after_save_the_list_chooses_the_workspace_just_saved(db):
    """After Save, the list's choice (what Reopen and Export take) is the workspace just saved, not the one the list
    showed before (CI's bundled-model walk exported the SmolLM2 walk's workspace, saved earlier on the same
    dashboard: the choice had stayed on it)."""
    from cache import ResultCache
    from engine.backends import open_model
    from engine.findings.workspace import make, save
    model = open_model("organism")
    cache = ResultCache(db)
    save(make("smol", "organism", model.facts.fingerprint, {"ops": "mul"}, cache), cache)  # another session's
    at = page("16_Workspaces.py")
    at.session_state["prompt"] = PROMPT
    at.run()
    assert at.selectbox(key="workspace_pick").value == "smol"
    at.text_input(key="workspace_name").set_value("sevens").run()
    at.button(key="workspace_save").click().run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert sorted(_saved_names(at)) == ["sevens", "smol"]
    assert at.selectbox(key="workspace_pick").value == "sevens"
