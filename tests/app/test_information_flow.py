"""AppTest of the Information flow page (layer x position patching, logit lens)."""

from __future__ import annotations

from tests.app.conftest import errors, page


def test_information_flow_draws_the_heatmap_and_switches_group_and_metric():
    at = page("8_Information_flow.py").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) == 1
    assert at.selectbox(key="lp_group").value.startswith("op:")
    at.selectbox(key="lp_group").set_value("*").run()
    at.radio(key="lp_metric").set_value("restored").run()
    assert not at.exception and not errors(at)
    captions = " ".join(c.value for c in at.caption)
    assert "read from the cache" in captions  # the second run did not recompute
    assert "counted from the last token" in captions


def test_mlp_projections_page_shows_the_logit_lens():
    at = page("5_MLP_projections.py").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert "Logit lens of the answer" in [h.value for h in at.subheader]
    assert any("the answer is the top token" in c.value for c in at.caption)
