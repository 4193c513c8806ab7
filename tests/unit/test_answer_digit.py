"""The answer digit (issue 49) without a model: choosing it, reading a pair there, and the carry counterfactual."""

from __future__ import annotations

import pytest

from engine.prompts.pairs import (
    AnswerTokens,
    PromptError,
    PromptPair,
    at_digit,
    carry_operands,
    compute_answer,
    parse_digit,
    units_carry,
)
from engine.prompts.promptsets import PromptSetSpec

TWO_DIGITS = range(10, 100)


def test_parse_digit():
    assert [parse_digit(x) for x in ("first", "LAST", "1", 1, "2", " 3 ")] == ["first", "last", "first", "first",
                                                                                 "2", "3"]
    for bad in ("0", "-1", "units", "", "2.5"):
        with pytest.raises(PromptError, match="first, last or a number"):
            parse_digit(bad)
    with pytest.raises(PromptError, match="write it as 'first'"):
        PromptSetSpec(digit="1")


def test_at_digit_forces_the_earlier_tokens():
    t = AnswerTokens([1, 2, 3], 50, [50, 51, 52])  # the prompt, the answer 3 tokens long
    assert at_digit(t, "first") == (t, 0)
    assert at_digit(t, "last") == (AnswerTokens([1, 2, 3, 50, 51], 52, [52]), 2)
    assert at_digit(t, "2") == (AnswerTokens([1, 2, 3, 50], 51, [51, 52]), 1)
    with pytest.raises(PromptError, match="has 3 token"):
        at_digit(t, "4")
    one = AnswerTokens([1, 2], 7, [7])
    assert at_digit(one, "last") == (one, 0)  # a one-token answer: its last token is its first


def test_the_digit_is_in_the_params_only_past_the_first():
    assert "digit" not in PromptSetSpec().to_params()
    assert PromptSetSpec(digit="last").to_params()["digit"] == "last"
    assert PromptSetSpec(digit="2").to_params()["digit"] == "2"


def test_a_forced_pair_round_trips_and_a_first_digit_pair_writes_no_forced():
    base = dict(op="add", template="t", family="f", a=27, b=35, answer=62, ref_text="27+35=", cf_text="27 35=",
                answer_id=9)
    first = PromptPair(ref_ids=[1, 2], cf_ids=[1, 3], answer_ids=[8, 9], **{**base, "answer_id": 8})
    assert "forced" not in first.to_json() and first.forced_ids == []
    last = PromptPair(ref_ids=[1, 2, 8], cf_ids=[1, 3, 8], answer_ids=[9], forced=1, **base)
    assert last.to_json()["forced"] == 1 and last.forced_ids == [8]
    assert PromptPair.from_json(last.to_json()) == last and PromptPair.from_json(first.to_json()) == first


@pytest.mark.parametrize("op", ["add", "sub"])
def test_the_carry_counterfactual_changes_only_the_carry(op):
    """Every operand pair of 10..99: each X_c the carry kind offers keeps the operands' tens digits and the answer's
    units digit and flips the units column's carry (borrow); where none exists, no flip keeps the units digit."""
    pairs = [(a, b) for a in TWO_DIGITS for b in TWO_DIGITS if op == "add" or a > b]
    valid, with_alts = set(pairs), 0
    for a, b in pairs:
        alts = carry_operands(op, a, b, valid)
        assert len(set(alts)) == len(alts) and set(alts) <= valid and (a, b) not in alts
        for x, y in alts:
            assert (x // 10, y // 10) == (a // 10, b // 10)
            assert compute_answer(op, x, y) % 10 == compute_answer(op, a, b) % 10
            assert units_carry(op, x, y) != units_carry(op, a, b)
            # the answers differ in the carry alone: by 10 (the tens digit moves by one)
            assert abs(compute_answer(op, x, y) - compute_answer(op, a, b)) == 10
        with_alts += bool(alts)
        if not alts:  # none exists: every units pair with the same answer units digit has the same carry
            units = compute_answer(op, a, b) % 10
            same = [(x, y) for x in range(10) for y in range(10)
                    if compute_answer(op, 10 * (a // 10) + x, 10 * (b // 10) + y) % 10 == units
                    and (op == "add" or 10 * (a // 10) + x > 10 * (b // 10) + y)]
            assert len({units_carry(op, 10 * (a // 10) + x, 10 * (b // 10) + y) for x, y in same}) == 1
    assert with_alts > 0.8 * len(pairs)
    if op == "add":
        assert (21, 31) in carry_operands("add", 27, 35, valid)  # 27 + 35 = 62 (carry) -> e.g. 21 + 31 = 52
        assert not carry_operands("add", 29, 30, valid)  # units sum 9, no carry: a sum of 19 needs a units digit 10


def test_the_carry_kind_is_for_add_and_sub():
    with pytest.raises(PromptError, match="additions and subtractions"):
        PromptSetSpec(ops=("add", "mul"), counterfactual="carry")
    with pytest.raises(PromptError, match="not mul"):
        units_carry("mul", 2, 3)
