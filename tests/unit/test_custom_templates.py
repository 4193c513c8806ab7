"""Templates a user writes (engine.prompts.custom): every malformed template gets a message that says what to change;
a checked template is a prompt set whose cache key holds it; a typed prompt becomes its template."""

from __future__ import annotations

import pytest

from engine.prompts.custom import (
    EXAMPLE,
    mark_operator,
    parse_param,
    parse_template,
    template_from_typed,
    template_words,
)
from engine.prompts.pairs import PromptError, sample_problems
from engine.prompts.promptsets import PromptSetSpec

MALFORMED = {  # template -> what the message must say
    "": "empty",
    "{A} apples make": "no {B}",
    "{A} apples and {A} pears make": "appears 2 times",
    "{A} + {B} = {C} apples": "{C} must come last",
    "{A} apples {X} {B} is": "unknown slot {X}",
    "{A} [and] [or] {B} is": "mark only the one",
    "apples {A} and {B}": "ends with an operand",
    "{A} [and {B} pears make": "do not pair up",
    "{A} [{B}] make": "not nothing or an operand",
}


@pytest.mark.parametrize("text", list(MALFORMED))
def test_every_malformed_template_says_what_to_change(text):
    with pytest.raises(PromptError, match=f".*{MALFORMED[text].replace('{', '.').replace('}', '.')}"):
        parse_template(text, "add")


def test_a_template_is_checked_and_normalised():
    w = parse_template("  {A} apples [and]   {B} pears make {C}", "add")
    assert (w.op, w.text, w.operator) == ("add", "{A} apples [and] {B} pears make", "and")
    assert w.template.family == "custom" and w.template.id.startswith("custom.add.")
    assert parse_param(w.as_param()) == w
    with pytest.raises(PromptError, match="OP:TEXT"):
        parse_param("plus:{A} [+] {B} =")


def test_the_operator_is_marked_on_a_whole_word():
    assert mark_operator("{A} apples and {B} sandwiches make", "and") == "{A} apples [and] {B} sandwiches make"
    assert mark_operator("{A} + {B} =", "+") == "{A} [+] {B} ="
    with pytest.raises(PromptError, match="not a word of the template"):
        mark_operator("{A} apples and {B} pears make", "plus")
    assert template_words("{NAME} has {A} apples, [and] {B} pears make") == ["has", "apples", "and", "pears", "make"]


def test_the_operator_counterfactual_needs_a_marked_operator_the_operand_kinds_do_not():
    t = parse_template("{A} apples and {B} pears make", "add").as_param()
    with pytest.raises(PromptError, match=r"mark the word that names the operation with \[ \]"):
        PromptSetSpec(ops=("add",), templates=(t,))
    PromptSetSpec(ops=("add",), templates=(t,), counterfactual="operand-a")
    with pytest.raises(PromptError, match="add add to the operations"):
        PromptSetSpec(ops=("mul",), templates=(parse_template(EXAMPLE, "add").as_param(),))


def test_a_written_set_keys_its_templates_and_the_papers_sets_keep_their_keys():
    w = parse_template(EXAMPLE, "add")
    params = PromptSetSpec(ops=("add",), templates=(w.as_param(),)).to_params()
    assert params["templates"] == [w.as_param()] and params["families"] == ["custom"]
    assert "templates" not in PromptSetSpec().to_params()
    problems = sample_problems(("add",), 10, 0, templates=[w.template])
    assert len(problems) == 10 and all(p.template.id == w.template.id for p in problems)
    assert problems[0].ref_text == f"{problems[0].a} apples and {problems[0].b} pears make"


@pytest.mark.parametrize("typed, op, text", [
    ("What is 7 times 8?", "mul", "What is {A} [times] {B}?"),
    ("The sum of 3 and 5 is", "add", "The [sum] of {A} and {B} is"),
    ("Subtract 2 from 9 =", "sub", "[Subtract] {B} from {A} ="),
    ("6 - 2 =", "sub", "{A} [-] {B} ="),
])
def test_a_typed_prompt_becomes_its_template(typed, op, text):
    w = template_from_typed(typed)
    assert (w.op, w.text) == (op, text)
