"""Property tests of the prompt generators, the answer-token rule and typed-prompt parsing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.organism.recipe import build_tokenizer
from engine.prompts.pairs import (
    OperandRange,
    PromptError,
    PromptPair,
    answer_tokens,
    build_pairs,
    compute_answer,
    sample_problems,
)
from engine.prompts.promptsets import PromptSetSpec, generate, parse_families, parse_ops
from engine.prompts.templates import (
    CF_SYMBOLS,
    CF_WORDS,
    OPERATOR_TERMS,
    OPS,
    PAPER_FAMILIES,
    SLOT_POOLS,
    TEMPLATES,
    paper_templates,
    templates_for,
)
from engine.prompts.typed import parse_typed_prompt

TOK = build_tokenizer()
ops_st = st.lists(st.sampled_from(OPS), min_size=1, max_size=5, unique=True)


FIGURE_8_ADDITION = (  # the paper's Figure 8, verbatim (its ninth row repeats one of these)
    "{A} + {B} =", "{A} plus {B} equals to", "The addition of {A} and {B} is",
    "The addition of {A} and {B} equals to", "Q: How much is {A} plus {B}? A:", "Q: What is {A} plus {B}? A:",
    "Q: What is the result of {A} plus {B}? A:", "Q: What is the sum of {A} and {B}? A:",
)
# the other operations swap the words and the symbol
OTHER_OPS = {"sub": ("-", "minus", "subtraction", "difference"), "mul": ("*", "times", "multiplication", "product"),
             "div": ("/", "over", "division", "ratio")}


def figure8(op: str) -> set[str]:
    if op == "add":
        return set(FIGURE_8_ADDITION)
    sym, word, noun, res = OTHER_OPS[op]
    return {t.replace("+", sym).replace("plus", word).replace("addition", noun).replace("sum", res)
            for t in FIGURE_8_ADDITION}


def test_paper_family_is_figure_8_verbatim_8_per_op():
    tpls = paper_templates()
    assert len(tpls) == 32 and {t.family for t in tpls} == set(PAPER_FAMILIES) == {"paper"}
    for op in ("add", "sub", "mul", "div"):
        mine = [t for t in tpls if t.op == op]
        assert {t.render(111, 222).replace("111", "{A}").replace("222", "{B}") for t in mine} == figure8(op)
        # the operator slot marks the word or symbol that names the operation
        assert {t.operator for t in mine} <= set(OTHER_OPS.get(op, ("+", "plus", "addition", "sum")))
    assert {t.text for t in TEMPLATES if t.op == "pow"} == {"{A} [^] {B} =", "{A} to the [power] of {B} equals"}
    # nothing the project wrote is filed as the paper's
    assert all("Calculate" not in t.text and "Answer:" not in t.text for t in tpls)


def test_figure_10_skeletons_verbatim_with_slot_pools():
    (span,) = templates_for(["add"], ["time_span"])
    (acc,) = templates_for(["add"], ["object_accumulation"])
    assert span.render(4, 5, slots={"EVENT": "war", "SPAN_VERB": "lasted", "YYY": "199"}) == \
        "The war lasted 4 years from the year 1995 to the year 199"
    assert span.answer_sep == "" and span.max_answer == 9  # the answer is the end year's last digit
    assert acc.render(3, 5, slots={"NAME": "Anna", "OBJECT": "pens", "ACC_VERB": "buys"}) == (
        "Anna has 3 pens, then Anna buys 5 pens. What's the total number of pens that Anna has? The answer is")
    # the verb names the operation: the counterfactual replaces it by a neutral word
    assert acc.operator_words() == SLOT_POOLS["ACC_VERB"] and not acc.operator_is_symbol
    assert "none" in acc.render(3, 5, filler="none", slots={"NAME": "Anna", "OBJECT": "pens"}).split()
    assert not templates_for(["sub", "mul", "div"], ["time_span", "object_accumulation"])
    probs = sample_problems(["add"], 1000, 0, families=("time_span",))
    assert len(probs) == 36 and all(p.answer <= 9 for p in probs)  # A + B <= 9 for 1..9


@settings(max_examples=40, deadline=None)
@given(ops=ops_st, n=st.integers(1, 60), seed=st.integers(0, 10_000), hi=st.integers(2, 15),
       fam=st.sampled_from([None, PAPER_FAMILIES]))
def test_generated_problems_are_correct(ops, n, seed, hi, fam):
    r = OperandRange(1, hi)
    probs = sample_problems(ops, n, seed, operands=r, families=fam)
    assert probs, "some problems exist for every op in 1..hi"
    for p in probs:
        op, a, b = p.template.op, p.a, p.b
        assert p.template.op in ops and r.lo <= a <= r.hi and r.lo <= b <= r.hi
        expected = {"add": a + b, "sub": a - b, "mul": a * b,
                    "div": a // b if b else None, "pow": a ** b}[op]
        assert p.answer == expected
        if op == "div":
            assert b != 0 and a % b == 0 and p.answer * b == a  # exact division only
        if op == "sub":
            assert a > b  # no negatives unless asked
        if op == "pow":
            assert b <= r.max_exponent
        # counterfactual: same template shape, operator gone
        for filler in p.fillers:
            cf = p.cf_text(filler)
            assert p.template.render(a, b, filler=filler, slots=dict(p.slots)) == cf
            words = set(re.findall(r"[A-Za-z]+|[^\sA-Za-z0-9]", cf))
            assert not (words & OPERATOR_TERMS), (cf, words & OPERATOR_TERMS)
            assert filler in (CF_SYMBOLS if p.template.operator_is_symbol else CF_WORDS)


@settings(max_examples=25, deadline=None)
@given(ops=ops_st, n=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_pairs_have_equal_shape_and_right_answer_ids(ops, n, seed):
    pairs, dropped = build_pairs(TOK, sample_problems(ops, n, seed, families=None))
    assert not dropped  # the organism's tokenizer always finds an equal-length X_c
    for p in pairs:
        assert len(p.ref_ids) == len(p.cf_ids)
        diff = [i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y]
        # only the operator's tokens differ (one word: one or two sub-word pieces, the second piece
        # may coincide, as "divid ##e" / "non ##e")
        assert diff and diff == list(range(diff[0], diff[-1] + 1)) and len(diff) <= 2
        op_text = TOK.decode(p.ref_ids[diff[0]:diff[-1] + 1]).replace(" ", "")
        assert any(term.startswith(op_text) for term in OPERATOR_TERMS), op_text
        digits = TOK.convert_ids_to_tokens(p.answer_ids)
        assert "".join(digits) == str(p.answer)
        assert p.answer_id == p.answer_ids[0]
        assert PromptPair.from_json(p.to_json()) == p


def test_seeded_and_reproducible():
    a = sample_problems(["add", "mul"], 50, 7)
    b = sample_problems(["add", "mul"], 50, 7)
    c = sample_problems(["add", "mul"], 50, 8)
    assert a == b and a != c


def test_n_is_capped_by_distinct_problems_and_negatives_optional():
    div = sample_problems(["div"], 10_000, 0)
    assert len(div) == len({(p.template.id, p.a, p.b) for p in div}) == 8 * 23
    neg = sample_problems(["sub"], 1000, 0, operands=OperandRange(1, 9, allow_negative=True))
    assert any(p.answer < 0 for p in neg)


def _space_tokenizer():
    """A tokenizer that emits a lone whitespace token before numbers, like Llama-2's '▁'."""
    from tokenizers import Tokenizer, models
    from tokenizers import pre_tokenizers as pt
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(["<unk>", " ", "=", "+", "-", "is"] + list("0123456789"))}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pt.Sequence([pt.Split(" ", behavior="isolated"), pt.Digits(individual_digits=True)])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")


def test_answer_token_rule_moves_whitespace_tokens_into_the_prompt():
    tok = _space_tokenizer()
    at = answer_tokens(tok, "3 + 5 =", 8)
    toks = tok.convert_ids_to_tokens(at.prompt_ids)
    assert toks[-1] == " " and toks[-2] == "="
    assert tok.convert_ids_to_tokens([at.answer_id]) == ["8"]
    at = answer_tokens(tok, "9 + 9 =", 18)
    assert tok.convert_ids_to_tokens(at.answer_ids) == ["1", "8"]
    neg = answer_tokens(tok, "3 - 5 =", -2)
    assert tok.convert_ids_to_tokens(neg.answer_ids) == ["-", "2"]


def test_answer_token_rule_on_word_level_tokenizer():
    at = answer_tokens(TOK, "The sum of 3 and 5 is", 8)
    assert TOK.convert_ids_to_tokens(at.prompt_ids)[0] == "<bos>"
    assert TOK.convert_ids_to_tokens(at.prompt_ids)[-1] == "is"
    assert TOK.convert_ids_to_tokens(at.answer_ids) == ["8"]


@pytest.mark.parametrize("text,op,a,b,ans", [
    ("What is 7 times 8?", "mul", 7, 8, 56),
    ("The sum of 3 and 5 is", "add", 3, 5, 8),
    ("If you subtract 3 from 9, you get", "sub", 9, 3, 6),
    ("If you add 2 to 4, the result is", "add", 4, 2, 6),
    ("12 / 4 =", "div", 12, 4, 3),
    ("2 ^ 5 =", "pow", 2, 5, 32),
    ("Q: What is 9 minus 4? A:", "sub", 9, 4, 5),
    ("The quotient of 8 and 2 is", "div", 8, 2, 4),
    ("3 to the power of 2 equals", "pow", 3, 2, 9),
    ("6 multiplied by 7 is", "mul", 6, 7, 42),
    ("Q: What is 9 divided by 3? A:", "div", 9, 3, 3),
    # the paper's Figure 8 phrasings
    ("The addition of 3 and 5 equals to", "add", 3, 5, 8),
    ("The subtraction of 9 and 4 is", "sub", 9, 4, 5),
    ("Q: What is the ratio of 8 and 2? A:", "div", 8, 2, 4),
    ("The multiplication of 3 and 4 is", "mul", 3, 4, 12),
    ("8 over 2 equals to", "div", 8, 2, 4),
])
def test_typed_prompts_parse(text, op, a, b, ans):
    tp = parse_typed_prompt(text)
    assert (tp.op, tp.a, tp.b, tp.answer) == (op, a, b, ans)
    assert tp.operator not in tp.cf_text.split()
    assert len(tp.cf_text.split()) == len(text.split())


@pytest.mark.parametrize("text,phrase", [
    ("", "empty"), ("   ", "empty"), ("hello there", "no numbers"), ("just 5", "only one number"),
    ("3 and 5", "no operation"), ("7 / 2 =", "not a whole number"), ("x" * 3000, "characters"),
    ("🙂 3 🙂 5", "no operation"),
])
def test_typed_prompts_refused_with_reason(text, phrase):
    with pytest.raises(PromptError, match=phrase):
        parse_typed_prompt(text)


def test_set_spec_validation():
    assert parse_ops("all") == ("add", "sub", "mul", "div")
    assert parse_families("word") == ("time_span", "object_accumulation")
    for bad in ("mod", "", "add,xyz"):
        with pytest.raises(PromptError):
            parse_ops(bad)
    with pytest.raises(PromptError):
        PromptSetSpec(n=0)
    with pytest.raises(PromptError):
        PromptSetSpec(operand_lo=5, operand_hi=2)
    pairs, dropped = generate(TOK, PromptSetSpec(ops=("add", "pow"), n=10, seed=1))
    assert {p.op for p in pairs} == {"add", "pow"} and dropped == 0
    assert compute_answer("pow", 2, 3) == 8
