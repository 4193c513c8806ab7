"""AppTest of the Position patching page (layer x position patching, logit lens)."""

from __future__ import annotations

from tests.app.conftest import errors, page


def test_information_flow_draws_the_heatmap_and_switches_group_and_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))  # its own: "computed now" is its claim
    at = page("8_Position_patching.py").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) == 1
    group = at.selectbox(key="lp_group")
    assert group.value.startswith("template:")  # a template first: its own few prompts, token labels
    first = next(c.value for c in at.caption if " prompt pairs · " in c.value)
    assert "computed now" in first and "carry its first prompt's tokens" in first
    n_template, n_all = (int(x) for x in first.split(" prompt pairs")[0].split(" of "))
    assert 0 < n_template < n_all
    at.selectbox(key="lp_group").set_value("*").run()
    assert not at.exception and not errors(at)
    assert "computed now" in " ".join(c.value for c in at.caption)  # another group: patched when chosen
    at.radio(key="lp_metric").set_value("restored").run()
    assert not at.exception and not errors(at)
    captions = " ".join(c.value for c in at.caption)
    assert "read from the cache" in captions  # the metric switch did not recompute
    assert "counted from the last token" in captions


def test_mlp_projections_page_shows_the_logit_lens():
    at = page("5_MLP_projections.py").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert "Logit lens of the answer" in [h.value for h in at.subheader]
    assert any("the answer is the top token" in c.value for c in at.caption)
