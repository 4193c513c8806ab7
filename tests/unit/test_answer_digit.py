"""The answer digit (issue 49) without a model: choosing it, reading a pair there, the carry counterfactual, and a set
chosen by its carry."""

from __future__ import annotations

import pytest

from engine.prompts.pairs import (
    AnswerTokens,
    OperandRange,
    PromptError,
    PromptPair,
    at_digit,
    carry_operands,
    column_carry,
    compute_answer,
    parse_digit,
    sample_problems,
    units_carry,
)
from engine.prompts.promptsets import PromptSetSpec, sample_words

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


def test_a_set_chosen_by_its_carry_holds_only_that_carry_worded_as_the_whole_set():
    """``carry`` yes / no: n problems per operation, each of that carry (add and sub of 10..39); with every problem
    they are exactly the any-carry set's problems of that carry, in its order and in its words (templates with
    slot words included: the word problems)."""
    from engine.prompts.templates import PAPER_FAMILIES, WORD_PROBLEM_FAMILIES
    r = OperandRange(10, 39)
    for carry in ("yes", "no"):
        some = sample_problems(("add", "sub"), 25, 0, operands=r, carry=carry)
        assert [sum(p.template.op == op for p in some) for op in ("add", "sub")] == [25, 25]
        assert all(column_carry(p.template.op, p.a, p.b) is (carry == "yes") for p in some)
    for fams in (PAPER_FAMILIES, WORD_PROBLEM_FAMILIES):
        ops = ("add",) if fams == WORD_PROBLEM_FAMILIES else ("add", "sub")
        every = sample_problems(ops, 100_000, 3, operands=r, families=fams)
        for carry in ("yes", "no"):
            chosen = sample_problems(ops, 100_000, 3, operands=r, families=fams, carry=carry)
            assert chosen == [p for p in every if column_carry(p.template.op, p.a, p.b) is (carry == "yes")]
            assert chosen  # both carries occur in 10..39


def test_the_carry_joins_the_set_only_when_it_chooses():
    """A set of any carry keeps its params (its cache keys) as before the choice existed; a choice is in the params,
    the CLI flags and the set's words; mul and div have no carry; 1..9 has no borrow."""
    from engine.findings.as_code import set_flags
    plain = PromptSetSpec(ops=("add", "sub"))
    assert "carry" not in plain.to_params() and "--carry" not in set_flags(plain)
    yes = PromptSetSpec(ops=("add", "sub"), carry="yes", operand_lo=10, operand_hi=99)
    assert yes.to_params()["carry"] == "yes" and set_flags(yes)[-2:] == ["--carry", "yes"]
    assert sample_words(yes) == "a balanced sample of 100 per operation with a carry / borrow"
    with pytest.raises(PromptError, match="additions and subtractions, not mul"):
        PromptSetSpec(ops=("add", "mul"), carry="no")
    with pytest.raises(PromptError, match="choose from any, yes, no"):
        PromptSetSpec(ops=("add",), carry="maybe")
    with pytest.raises(PromptError, match="no sub problem with operands 1..9 has a borrow"):
        sample_problems(("add", "sub"), 10, 0, carry="yes")
    with pytest.raises(PromptError, match="every add problem with operands 5..9 has a carry"):
        sample_problems(("add",), 10, 0, operands=OperandRange(5, 9), carry="no")
