"""The ``operator-swapped`` counterfactual kind (engine.prompts.pairs): X_c with the paired operation's operator."""

from __future__ import annotations

import random
import re

import pytest

from engine.organism.recipe import build_tokenizer
from engine.prompts.pairs import (
    COUNTERFACTUALS,
    OPERATOR_SWAPPED,
    PromptError,
    _counterfactual_texts,
    build_pair,
    build_pairs,
    check_counterfactual,
    make_problem,
    sample_problems,
)
from engine.prompts.templates import (
    PAIRED_OP,
    PAPER_OPS,
    SWAPPED_OPERATOR,
    SWAPPED_OPERATOR_WORDS,
    TEMPLATES_BY_ID,
    Template,
    paper_templates,
    templates_for,
)

TOK = build_tokenizer()


def _problem(template_id: str | Template, a: int, b: int):
    t = TEMPLATES_BY_ID[template_id] if isinstance(template_id, str) else template_id
    return make_problem(t, a, b, random.Random(0))


def _dropped_reason(problem) -> str:
    pairs, dropped = build_pairs(TOK, [problem], OPERATOR_SWAPPED)
    assert not pairs and len(dropped) == 1
    return dropped[0][1]


def test_the_kind_is_listed():
    assert OPERATOR_SWAPPED in COUNTERFACTUALS and check_counterfactual(OPERATOR_SWAPPED) == OPERATOR_SWAPPED


@pytest.mark.parametrize("tid, ref, cf", [
    ("add.paper.0", "3 + 5 =", "3 - 5 ="),
    ("add.paper.1", "3 plus 5 equals to", "3 minus 5 equals to"),
    ("add.paper.2", "The addition of 3 and 5 is", "The difference of 3 and 5 is"),
    ("add.paper.7", "Q: What is the sum of 3 and 5? A:", "Q: What is the difference of 3 and 5? A:"),
    ("sub.paper.1", "8 minus 5 equals to", "8 plus 5 equals to"),
    ("sub.paper.7", "Q: What is the difference of 8 and 5? A:", "Q: What is the sum of 8 and 5? A:"),
    ("mul.paper.0", "6 * 2 =", "6 / 2 ="),
    ("mul.paper.1", "6 times 2 equals to", "6 over 2 equals to"),
    ("mul.paper.2", "The product of 6 and 2 is", "The ratio of 6 and 2 is"),
    ("div.paper.4", "Q: How much is 6 over 2? A:", "Q: How much is 6 times 2? A:"),
    ("mul.extended.5", "If you multiply 6 by 2, the result is", "If you divide 6 by 2, the result is"),
])
def test_the_operator_becomes_the_paired_operations_word(tid, ref, cf):
    a, b = (int(x) for x in re.findall(r"\d+", ref))
    pair = build_pair(TOK, _problem(tid, a, b), OPERATOR_SWAPPED)
    assert (pair.ref_text, pair.cf_text) == (ref, cf)
    assert len(pair.ref_ids) == len(pair.cf_ids)
    assert pair.answer == _problem(tid, a, b).answer  # the pair keeps X_r's answer


def test_everything_but_the_operator_is_kept_and_lengths_match():
    problems = sample_problems(PAPER_OPS, 40, 3)
    pairs, dropped = build_pairs(TOK, problems, OPERATOR_SWAPPED)
    assert len(pairs) > 100
    assert all("same answer" in reason for _, reason in dropped)  # only B = 1 of * and /
    for p in pairs:
        t = TEMPLATES_BY_ID[p.template]
        assert len(p.ref_ids) == len(p.cf_ids)
        assert p.cf_text == t.render(p.a, p.b, filler=SWAPPED_OPERATOR[t.id])
        before, _, after = t.text.partition(f"[{t.operator}]")
        assert p.ref_text.startswith(before.replace("{A}", str(p.a)).replace("{B}", str(p.b)))
        diff = [i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y]
        assert diff and all(p.ref_ids[i] not in TOK(f"{p.a} {p.b}")["input_ids"] for i in diff)


def test_x_c_answer_is_the_paired_operations():
    assert _counterfactual_texts(_problem("add.paper.0", 2, 5), OPERATOR_SWAPPED, None) == [("2 - 5 =", -3)]
    assert _counterfactual_texts(_problem("div.paper.0", 6, 2), OPERATOR_SWAPPED, None) == [("6 * 2 =", 12)]
    # 3 / 2 is no exact division: X_c is tokenized with X_r's answer
    assert _counterfactual_texts(_problem("mul.paper.0", 3, 2), OPERATOR_SWAPPED, None) == [("3 / 2 =", 6)]
    assert "same answer" in _dropped_reason(_problem("mul.paper.0", 7, 1))
    assert "same answer" in _dropped_reason(_problem("div.paper.1", 7, 1))


def test_the_table_is_derived_from_the_templates():
    for t in paper_templates():
        partner = TEMPLATES_BY_ID[f"{PAIRED_OP[t.op]}.paper.{t.id.rsplit('.', 1)[1]}"]
        assert SWAPPED_OPERATOR[t.id] == partner.operator and SWAPPED_OPERATOR[partner.id] == t.operator
    assert {"+", "plus", "addition", "sum"} == {t.operator for t in templates_for(["add"], ["paper"])}
    for op, w, swap in [("add", "sum", "difference"), ("sub", "difference", "sum"), ("add", "plus", "minus"),
                        ("add", "add", "subtract"), ("sub", "subtract", "add"), ("mul", "product", "ratio"),
                        ("div", "quotient", "product"), ("mul", "times", "over"), ("div", "divided", "times"),
                        ("mul", "multiply", "divide"), ("div", "divide", "multiply"), ("mul", "*", "/")]:
        assert SWAPPED_OPERATOR_WORDS[(op, w)] == swap, (op, w)
    assert SWAPPED_OPERATOR["mul.extended.3"] == "quotient" and SWAPPED_OPERATOR["mul.extended.4"] == "divided"
    # the extended word problems (a story verb) and the unparallel families have no swap
    assert not {tid for tid in SWAPPED_OPERATOR if TEMPLATES_BY_ID[tid].family not in ("paper", "extended")}
    assert "add.extended.9" not in SWAPPED_OPERATOR and "sub.extended.7" not in SWAPPED_OPERATOR


def test_problems_without_a_swap_are_dropped_with_the_reason():
    assert _dropped_reason(_problem("add.extended.9", 3, 4)) == (
        "no swapped operator for 'gives' (template add.extended.9 has no parallel sub template)")
    span = _problem("add.time_span.2", 3, 4)
    verb = dict(span.slots)["SPAN_VERB_PAST"]
    assert _dropped_reason(span).startswith(f"no swapped operator for '{verb}'")
    assert "no operator slot" in _dropped_reason(_problem("add.object_accumulation.0", 3, 4))
    assert "no swapped operator for pow" in _dropped_reason(_problem("pow.power.0", 2, 3))
    with pytest.raises(PromptError, match="no swapped operator"):
        build_pair(TOK, _problem("add.extended.9", 3, 4), OPERATOR_SWAPPED)


def test_written_templates_use_the_word_table():
    plus = Template("custom.add.test", "add", "custom", "{A} apples [plus] {B} pears make")
    assert build_pair(TOK, _problem(plus, 3, 4), OPERATOR_SWAPPED).cf_text == "3 apples minus 4 pears make"
    diff = Template("custom.sub.test", "sub", "custom", "The [difference] between {A} and {B} is")
    assert _counterfactual_texts(_problem(diff, 7, 4), OPERATOR_SWAPPED, None)[0][0] == "The sum between 7 and 4 is"
    other = Template("custom.add.and", "add", "custom", "{A} apples [and] {B} pears make")
    assert _dropped_reason(_problem(other, 3, 4)) == "no swapped operator for 'and'"
