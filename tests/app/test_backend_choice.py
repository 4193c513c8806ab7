"""AppTest: pick the nnsight backend in the sidebar, then the heatmap page computes with it."""

from __future__ import annotations

from tests.app.conftest import errors, page


def test_sidebar_switches_to_nnsight_and_heatmap_renders(tmp_path, monkeypatch):
    from ui.session import ModelChoice
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "fresh.duckdb"))  # computed now, by nnsight
    at = page("4_Path_patching.py", n=8)
    at.session_state["model_choice"] = ModelChoice(spec="/no/such/model")  # fails fast; the sidebar is drawn
    at.run()
    assert any("does not exist" in e for e in errors(at))
    at.text_input(key="model_spec_input").set_value("organism")
    at.selectbox(key="model_backend_input").set_value("nnsight")
    next(b for b in at.button if b.label == "Load model").click()
    at.run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert at.session_state["model_choice"].backend == "nnsight"
    assert any("**nnsight** backend" in c.value for c in at.sidebar.caption)
    charts = len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))
    assert charts >= 3 and any(h.value.startswith("Head ") for h in at.subheader)


def test_remote_without_key_is_an_error_on_the_page(monkeypatch):
    from ui.session import ModelChoice
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    at = page("4_Path_patching.py", n=8)
    at.session_state["model_choice"] = ModelChoice(spec="meta-llama/Llama-3.1-8B", backend="nnsight", remote=True)
    at.run()
    assert not at.exception
    assert any("NDIF_API_KEY" in e for e in errors(at))
