"""The sidebar's "Answer digit" and the link's ``digit=`` (issue 49), on the bundled model."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import REPO, SMALL_SET, errors, go


def _link(params: dict) -> AppTest:
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = {**SMALL_SET, "ops": ["add"]}
    at.query_params.update(params)
    return at.run()


def _path_patching_from_link(params: dict, key: str, box: str) -> AppTest:
    """The router opened on ``params``: the set's ``key`` and the link hold the link's value; then the Path patching
    page, whose sidebar box ``box`` shows it."""
    at = _link(params)
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"][key] == params[key] and at.query_params[key] == params[key]
    go(at, "4_Path_patching.py")
    assert not at.exception and not errors(at), errors(at)
    assert at.sidebar.selectbox(key=box).value == params[key]
    return at


def test_the_answer_digit_follows_the_link_and_the_sidebar():
    at = _path_patching_from_link({"digit": "last"}, "digit", "ps_digit")
    texts = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "Last (units) answer-digit tokens" in texts or "last (units) digit" in texts, texts[:2000]
    at.sidebar.selectbox(key="ps_digit").set_value("first")
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "digit" not in at.query_params  # back at the first digit: the link as it was


def test_a_bad_digit_in_the_link_is_ignored_with_a_note():
    at = _link({"digit": "units"})
    assert not at.exception and not errors(at), errors(at)
    notes = [w.value for w in at.warning if "Link parameter" in w.value]
    assert [n for n in notes if n.startswith("Link parameter `digit=units` ignored")], notes
    assert "digit" not in at.query_params


def test_the_operand_range_follows_the_link_and_the_sidebar():
    at = _link({"operands": "10-99", "digit": "last"})
    assert not at.exception and not errors(at), errors(at)
    cur = at.session_state["prompt_set"]
    assert (cur["operand_lo"], cur["operand_hi"], cur["digit"]) == (10, 99, "last")
    assert at.query_params["operands"] == "10-99"
    assert at.sidebar.number_input(key="ps_operand_lo").value == 10
    at.sidebar.number_input(key="ps_operand_lo").set_value(1)
    at.sidebar.number_input(key="ps_operand_hi").set_value(9)
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "operands" not in at.query_params and at.query_params["digit"] == "last"


def test_a_bad_operand_range_in_the_link_is_ignored_with_a_note():
    at = _link({"operands": "9-1"})
    assert not at.exception and not errors(at), errors(at)
    notes = [w.value for w in at.warning if "Link parameter" in w.value]
    assert [n for n in notes if n.startswith("Link parameter `operands=9-1` ignored")], notes
    assert "operands" not in at.query_params


def test_the_carry_follows_the_link_and_the_sidebar():
    """``carry=yes``: the set holds only sums with a carry (the caption says so, the Operation box offers no carry
    split: there is one carry), the sidebar's box shows it; back to any carry, the link loses the key."""
    at = _path_patching_from_link({"carry": "yes", "n": "12"}, "carry", "ps_carry")
    said = " ".join(c.value for c in at.caption) + " ".join(i.value for i in at.info)
    assert "a balanced sample of 12 per operation with a carry / borrow" in said, said[:2000]
    assert "with a carry / borrow" not in next(s for s in at.selectbox if s.label == "Operation").options
    at.sidebar.selectbox(key="ps_carry").set_value("any")
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "carry" not in at.query_params and at.session_state["prompt_set"]["carry"] == "any"


def test_a_bad_carry_in_the_link_is_ignored_with_a_note():
    at = _link({"carry": "maybe"})
    assert not at.exception and not errors(at), errors(at)
    notes = [w.value for w in at.warning if "Link parameter" in w.value]
    assert [n for n in notes if n.startswith("Link parameter `carry=maybe` ignored") and "any, yes, no" in n], notes
    assert "carry" not in at.query_params


def _story(prompt_set: dict) -> AppTest:
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = prompt_set
    at.run()
    return go(at, "1_Story.py")


def test_the_story_offers_the_units_digit_where_one_first_token_starts_most_answers():
    """Sums of operands 5..9 all start with '1' (the bundled model answers the 12 it is given): the Story's first
    screen says so and its button tells the story at the units digit -- the set's digit, the sidebar's box and the
    caption follow; operands 1..9 (a sixth of the sums start with '1') get neither."""
    at = _story({**SMALL_SET, "ops": ["add"], "n": 12, "operand_lo": 5, "operand_hi": 9})
    said = " ".join(m.value for m in at.markdown)
    assert ("100% of the set's add prompts the model answers right (12 of 12) start their answer with <code>1</code>, "
            "the tens digit") in said, said[:1500]
    at.button(key="story_units").click().run()
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"]["digit"] == "last"
    assert at.sidebar.selectbox(key="ps_digit").value == "last"
    assert not [b for b in at.button if b.key == "story_units"]  # at the units digit: nothing to offer
    assert any("read the answer's last (units) digit" in c.value for c in at.caption)
    plain = _story({**SMALL_SET, "ops": ["add"], "n": 12})
    assert not [b for b in plain.button if b.key == "story_units"]
    assert "start their answer with" not in " ".join(m.value for m in plain.markdown)


def test_a_dominant_one_digit_answer_is_not_called_a_tens_digit():
    """'1' starting most answers of single-digit differences (SmolLM2's subtractions: 82 % '1') is no tens digit:
    the units digit would be the same token, and the Story offers nothing."""
    from dataclasses import dataclass

    from ui.story import tens_dominated

    @dataclass
    class P:
        op: str
        answer: int
        answer_id: int
    one_digit = [P("sub", 1, 7)] * 9 + [P("sub", 2, 8)] * 2
    tens = [P("add", a, 7) for a in (10, 12, 13, 15, 17)] + [P("add", 4, 9)] * 3
    assert tens_dominated(one_digit) is None
    assert tens_dominated(one_digit + tens) == ("add", 5 / 8, 7, 5, 8)  # 5 of the 8 additions


@pytest.mark.realmodel
def test_smollm2s_default_set_gets_the_units_digit_offer_for_its_sums_not_its_differences():
    """SmolLM2 on the sidebar's default set's additions and subtractions (40 each, balanced): the sums it answers
    right start with the tens '1' more than 40 % of the time (their units digit is another token); its differences'
    commonest first token is a one-digit answer."""
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from tests.helpers.smollm2 import open_smollm2
    from ui.story import tens_dominated
    smol = open_smollm2()
    pairs, _ = kept_pairs(smol, PromptSetSpec(ops=("add", "sub")))
    op, share, tid, _, _ = tens_dominated(pairs)
    assert op == "add" and share > 0.4 and smol.tokenizer.convert_ids_to_tokens([tid])[0] == "1", (op, share)
    assert tens_dominated([p for p in pairs if p.op == "sub"]) is None


def test_the_typed_prompt_alone_is_read_at_the_sets_digit():
    """Path patching's 'the typed prompt alone' on a set read at the last digit: the heatmap of the typed pair read
    there (the tens digit written after both prompts), said in the caption; a digit the typed answer lacks is an
    st.error that names the sidebar's choice."""
    from engine.backends import open_model
    from engine.techniques.path_patching import cached_path_patching
    from engine.techniques.promptlab import typed_pair
    at = _link({"digit": "last", "head": "1.3"})
    at.session_state["prompt"] = "Q: What is 7 plus 8? A:"
    go(at, "4_Path_patching.py")
    next(s for s in at.selectbox if s.label == "Operation").set_value("typed").run()
    assert not at.exception and not errors(at), errors(at)
    model = open_model("organism", device="cpu")
    table, _ = cached_path_patching(model, [typed_pair(model.tokenizer, "Q: What is 7 plus 8? A:", "last")])
    want = [(a, b, round(e, 4)) for a, b, e in table.top_heads(5)]
    got = [(int(r.layer), int(r.head), round(float(r.effect), 4)) for r in at.dataframe[0].value.itertuples()]
    assert got == want
    said = [c.value for c in at.caption if "typed prompt" in c.value]
    assert any("read at the answer's last (units) digit" in c and "`1` written after both" in c for c in said), said
    texts = " ".join(m.value for m in at.markdown)
    assert "Last (units) answer-digit token of the typed prompt** (the token whose logit the heatmap measures): `5`" \
        in texts, texts[:1500]
    assert not [w.value for w in at.warning if "same last answer token" in w.value]  # one prompt: no share to warn of
    # the head's bars: the typed prompt's END row at the heatmap's position, the tens digit written after the prompt
    bars = [c.value for c in at.caption if c.value.startswith("Your prompt")]
    assert bars and "with the answer's first digit before the last (units) one (`1`) written after it" in bars[0], bars
    at.query_params["digit"] = "2"
    at.session_state["prompt"] = "Q: What is 3 plus 5? A:"
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "digit": "2"}
    at.run()
    said = errors(at)
    assert any("Cannot patch the typed prompt" in e and "no 2nd one" in e and "'Answer digit'" in e for e in said), said
