"""The page 'Your templates' (AppTest): each malformed template gets one st.error that says what to change, never a
traceback; a template is checked on the model, saved, and becomes the prompt set of every page."""

from __future__ import annotations

import pytest

from tests.app.conftest import errors, page

pytestmark = pytest.mark.app

MALFORMED = {
    "{A} apples make": "has no {B}",
    "{A} + {B} = {C} apples": "{C} must come last",
    "{A} [++] {B} =": "splits the operator '++' into 2 token(s)",
    "apples {A} and {B}": "ends with an operand",
    "{A} apples {X} {B} is": "Unknown slot {X}",
    "{A} apples and {B} pears make": "Mark the word that names the operation with [ ]",
}


def test_malformed_templates_each_say_what_to_change():
    at = page("13_Templates.py").run()
    assert not at.exception and not errors(at), errors(at)
    for text, message in MALFORMED.items():
        at.text_input(key="tpl_text").input(text).run()
        assert not at.exception, (text, at.exception)
        assert len(errors(at)) == 1 and message in errors(at)[0], (text, errors(at))


def test_a_template_is_checked_saved_and_used_on_every_page():
    at = page("13_Templates.py").run()
    at.text_input(key="tpl_text").input("{A} apples and {B} pears make").run()
    at.selectbox(key="tpl_operator_{A} apples and {B} pears make").select("and").run()
    assert not errors(at), errors(at)
    assert "does not know 'make'" in at.warning[0].value
    assert at.dataframe[0].value["X_c"].str.contains(" and ").sum() == 0
    at.button(key="tpl_use").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"]["template"] == "add:{A} apples [and] {B} pears make"
    assert "prompts right: every page now runs on them" in at.success[0].value
    assert any("{A} apples [and] {B} pears make" in m.value for m in at.markdown)  # under Saved templates
    assert "yours: {A} apples [and] {B} pears make (add)" in at.selectbox(key="ps_families").options

    # a template the model answers none right: the message says what to change, nothing is switched
    at.text_input(key="tpl_text").input("{A} apples [and] {B} pears make").run()
    at.selectbox(key="tpl_op").select("sub").run()
    at.button(key="tpl_use").click().run()
    assert any("answers none of the" in e and "rephrase it" in e for e in errors(at)), errors(at)
    assert at.session_state["prompt_set"]["template"] == "add:{A} apples [and] {B} pears make"

    # Path patching runs on the written set
    pp = page("4_Path_patching.py")
    pp.session_state["prompt_set"] = at.session_state["prompt_set"]
    pp.run()
    assert not pp.exception and not errors(pp), errors(pp)


def test_the_prompt_labs_prompt_becomes_the_set_of_every_page():
    at = page("3_Prompt_lab.py")
    at.session_state["prompt"] = "What is 7 times 8?"
    at.run()
    at.button(key="lab_template").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"]["template"] == "mul:What is {A} [times] {B}?"
    assert at.session_state["prompt_set"]["ops"] == ["mul"]
