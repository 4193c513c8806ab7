"""AppTest of the home page (app.py): model facts, accuracy table, errors as st.error."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _run() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    return at.run()


def test_home_shows_facts_and_accuracy():
    at = _run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    labels = [m.label for m in at.metric]
    assert "Layers" in labels and "Heads (KV)" in labels
    assert len(at.dataframe) >= 1
    ops = at.dataframe[0].value.index.tolist()
    assert ops == ["add", "div", "mul", "sub"]
    assert (at.dataframe[0].value["first_token"] >= 0.9).all()
    assert any("result cache" in c.value for c in at.caption)
    shown = [m.value for m in at.markdown if "First answer tokens of these 400 prompts" in m.value]
    assert shown and "`1`" in shown[0] and not at.warning  # balanced: no token holds more than 40 %


def test_second_visit_reads_from_cache():
    _run()
    at = _run()
    assert any("Read from the result cache" in c.value for c in at.caption)


def test_bad_model_path_gives_error_not_exception(tmp_path):
    at = _run()
    at.sidebar.text_input(key="model_spec_input").set_value(str(tmp_path / "no-such-model"))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception
    assert at.error and "does not exist" in at.error[0].value


def test_directory_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    at = _run()
    at.sidebar.text_input(key="model_spec_input").set_value(str(tmp_path))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception
    assert at.error and "Cannot load model" in at.error[0].value


def test_an_architecture_the_lab_cannot_study_gives_one_error(tmp_path):
    """Issue 31: a model whose blocks hold a Mamba mixer is refused with the reason, not a traceback."""
    from tests.integration.tiny_models import build_tiny
    model_dir = build_tiny("falcon_h1", tmp_path / "falcon_h1")
    at = _run()
    at.sidebar.text_input(key="model_spec_input").set_value(str(model_dir))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "FalconH1ForCausalLM" in at.error[0].value and "Mamba" in at.error[0].value
    assert "Traceback" not in at.error[0].value


def test_no_operation_selected():
    at = _run()
    next(m for m in at.multiselect if m.label == "Operations").set_value([])
    next(b for b in at.button if b.label == "Show accuracy").click().run()
    assert not at.exception
    assert any("at least one operation" in e.value for e in at.error)


def test_home_circuit_summary_appears_after_patching_ran():
    at = _run()
    assert not at.exception, at.exception
    assert any("No path-patching result" in i.value for i in at.info)
    # the Patching page computes (same sidebar set, same cache); Home then quotes its numbers
    patching = AppTest.from_file(str(Path(APP).parent / "pages" / "4_Path_patching.py"), default_timeout=300)
    patching.session_state["prompt_set"] = at.session_state["prompt_set"] if "prompt_set" in at.session_state else {
        "ops": ["add", "sub", "mul", "div"], "families": "paper (Fig. 8, 32 templates)", "n": 40, "seed": 0}
    patching.run()
    assert not patching.exception, patching.exception
    top = patching.dataframe[0].value.iloc[0]
    at.run()
    assert not at.exception, at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "**Key heads.**" in text and f"{int(top['layer'])}.{int(top['head'])} (" in text
    assert "**Attention.**" in text and "**MLPs.**" in text


def test_home_builds_the_report_and_offers_it_for_download():
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["prompt_set"] = {"ops": ["add", "mul"], "families": "paper (Fig. 8, 32 templates)", "n": 8,
                                     "seed": 0}
    at.run()
    assert not at.exception, at.exception
    at.button(key="report_build").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    html = at.session_state[[k for k in at.session_state if str(k).startswith("report:")][0]]
    assert html.startswith("<!DOCTYPE html>") and html.count('class="chart"') == 6 and "vegaEmbed" in html
