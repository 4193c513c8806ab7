"""AppTest of the Intervene page: the chart and the answer's metric for each action; bad input gives st.error."""

from __future__ import annotations

from tests.app.conftest import errors, page


def _charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def test_each_action_draws_the_distribution_and_the_command():
    at = page("15_Intervene.py").run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert _charts(at) == 1 and any("P(answer" in m.label for m in at.metric)
    assert any("engine intervene" in c.value for c in at.code)
    for label in ("scale", "zero", "add a number's direction", "patch from another prompt"):
        if label.startswith("add"):  # a direction goes to an MLP or a residual stream
            at.multiselect(key="iv_components").set_value(["1.resid"]).run()
        at.radio(key="iv_action").set_value(label).run()
        assert not at.exception and not errors(at), (label, at.exception, errors(at))
        assert _charts(at) == 1
    at.multiselect(key="iv_components").set_value(["1.3", "0.mlp"]).run()
    assert not at.exception and not errors(at)
    at.checkbox(key="iv_freeze").check().run()
    assert not at.exception and not errors(at)
    assert "--freeze" in at.code[0].value and "1.3,0.mlp" in at.code[0].value


def test_bad_input_is_an_error_in_the_pages_words():
    at = page("15_Intervene.py").run()
    at.multiselect(key="iv_components").set_value([]).run()
    assert not at.exception and any("Choose at least one component" in e for e in errors(at))
    at.multiselect(key="iv_components").set_value(["1.3"]).run()
    at.radio(key="iv_action").set_value("add a number's direction").run()
    assert not at.exception and any("not to a head" in e for e in errors(at))
    at.radio(key="iv_action").set_value("patch from another prompt").run()
    at.text_input(key="iv_source").set_value("zzqx qqzz").run()
    assert not at.exception and errors(at)
