"""Property tests of the prompt generators, the answer-token rule and typed-prompt parsing."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.organism.recipe import build_tokenizer
from engine.paths import REPO_ROOT
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
    PAPER_POOL_WORDS,
    SLOT_POOLS,
    TEMPLATES,
    TEMPLATES_BY_ID,
    VERB_FORMS,
    VERB_SLOTS,
    paper_templates,
    templates_for,
)
from engine.prompts.typed import parse_typed_prompt

TOK = build_tokenizer()
ops_st = st.lists(st.sampled_from(OPS), min_size=1, max_size=5, unique=True)


PAPER_MD = REPO_ROOT.parent / "shared" / "paper" / "zhang2024.md"


def _appendix_a() -> tuple[dict[str, list[str]], list[str]]:
    """Figure 8's rows per operation and Figure 10's twelve templates, as the paper prints them."""
    text = PAPER_MD.read_text(encoding="utf-8")
    text = text[text.index("A. Templates"):]
    fig8: dict[str, list[str]] = {op: [] for op in ("add", "sub", "mul", "div")}
    cols = ("add", "sub")
    for line in text[:text.index("Figure 8:")].splitlines()[1:]:
        cells = line.split("\t")
        if cells == ["Multiplication", "Division"]:
            cols = ("mul", "div")
        elif len(cells) == 2 and cells != ["Addition", "Subtraction"]:
            for op, cell in zip(cols, cells):
                fig8[op].append(cell.replace("$", "").replace("\\{", "{").replace("\\}", "}"))
    fig10 = re.findall(r"^(\d+)\. (.+)$", text[text.index("For the templates 1-8"):text.index("Figure 10:")], re.M)
    assert [int(i) for i, _ in fig10] == list(range(1, 13))
    return fig8, [t for _, t in fig10]


@pytest.mark.skipif(not PAPER_MD.exists(), reason="needs ../shared/paper (CI has it)")
def test_paper_and_word_families_are_appendix_a_verbatim():
    fig8, fig10 = _appendix_a()
    tpls = paper_templates()
    assert len(tpls) == 32 and {t.family for t in tpls} == set(PAPER_FAMILIES) == {"paper"}
    for op, printed in fig8.items():
        assert len(printed) == 9 and len(set(printed)) == 8  # the paper prints one row twice
        assert sorted(t.as_printed() for t in tpls if t.op == op) == sorted(set(printed)), op
    assert [t.as_printed() for t in templates_for(["add"], ["time_span", "object_accumulation"])] == fig10
    # what the templates render: the operator slot and the slot words filled in, nothing else
    t = TEMPLATES_BY_ID["sub.paper.3"]
    assert t.render(7, 2) == "The difference of 7 and 2 equals to" and t.operator == "difference"
    assert {t.text for t in TEMPLATES if t.op == "pow"} == {"{A} [^] {B} =", "{A} to the [power] of {B} equals"}
    # nothing the project wrote is filed as the paper's
    assert all("Calculate" not in t.text and "Answer:" not in t.text for t in tpls)


def test_figure_10_slots_come_from_the_pools_in_the_right_form():
    span = templates_for(["add"], ["time_span"])
    acc = templates_for(["add"], ["object_accumulation"])
    assert len(span) == 8 and len(acc) == 4
    assert span[0].render(4, 5, slots={"EVENT": "war", "SPAN_VERB_PAST": "lasted", "YYY": "189"}) == \
        "The war lasted 4 years from the year 1895 to the year 189"
    assert span[0].answer_sep == "" and span[0].max_answer == 9  # the answer is the end year's last digit
    assert span[4].max_answer == 12 and span[2].answer_sep == " "
    for name, words in PAPER_POOL_WORDS.items():  # the paper's own words are in the pools
        assert set(words) <= set(SLOT_POOLS[name]), name
    assert len(SLOT_POOLS["NAME"]) == len(set(SLOT_POOLS["NAME"])) == 100
    assert SLOT_POOLS["YYY"] == tuple(str(y) for y in range(100, 200)) and len(SLOT_POOLS["MONTH"]) == 12
    for p in sample_problems(["add"], 10_000, 3, families=("time_span", "object_accumulation")):
        slots = dict(p.slots)
        for name, (verb, form) in VERB_SLOTS.items():  # one lemma per instance, in the slot's form
            if name in slots:
                forms = [f for f in VERB_FORMS[verb].values() if f[form] == slots[name]]
                assert forms and all(slots.get(verb + sfx) in (None, forms[0][i])
                                     for sfx, i in (("", 0), ("_S", 1), ("_PAST", 2))), slots
        if "NAME2" in slots:
            assert slots["NAME"] != slots["NAME2"]
        text = p.ref_text
        assert ("will" in text) == (any(n == "SPAN_VERB" for n in slots)) or p.template.family != "time_span"
        if p.template.family == "time_span":
            assert f"{p.a} " in text and (p.answer <= 9 if p.template.answer_sep == "" else True)
    assert not templates_for(["sub", "mul", "div"], ["time_span", "object_accumulation"])
    probs = sample_problems(["add"], 1000, 0, families=("time_span",))
    assert all(p.answer <= (9 if p.template.answer_sep == "" else 12 if "hours" in p.template.text else 18)
               for p in probs)


def test_object_accumulation_counterfactual_is_figure_9():
    """X_c changes the objects and the person, so nothing accumulates (Figure 9)."""
    acc = templates_for(["add"], ["object_accumulation"])[0]
    slots = {"NAME": "Mary", "OBJECT": "apples", "ACC_VERB_S": "gains"}
    assert acc.render(3, 4, slots=slots) == (
        "Mary has 3 apples, then Mary gains 4 apples. What's the total number of apples that Mary has? The answer is")
    assert acc.render(3, 4, swaps=("cups", "tables", "John"), slots=slots) == (
        "Mary has 3 apples, then Mary gains 4 cups. What's the total number of tables that John has? The answer is")
    for p in sample_problems(["add"], 400, 5, families=("object_accumulation",)):
        ref_words = set(dict(p.slots).values())
        for swap in p.fillers:
            assert isinstance(swap, tuple) and len(set(swap)) == len(swap) and not (set(swap) & ref_words)
            cf = p.cf_text(swap)
            assert cf != p.ref_text and cf.count(str(p.a)) >= 1 and f" {p.b} " in cf


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
            if isinstance(filler, tuple):  # Figure 9: other objects and person, the same verb
                assert p.template.render(a, b, swaps=filler, slots=dict(p.slots)) == cf
                continue
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
        if TEMPLATES_BY_ID[p.template].swapped_slots:  # Figure 9: only the swapped objects / person differ
            swapped = TOK.decode([p.cf_ids[i] for i in diff]).replace(" ", "")
            pools = {w for n in TEMPLATES_BY_ID[p.template].swapped_slots for w in SLOT_POOLS[n]}
            assert diff and all(any(w.startswith(TOK.decode([p.cf_ids[i]]).replace("##", "").strip())
                                    or TOK.decode([p.cf_ids[i]]).replace("##", "").strip() in w for w in pools)
                                for i in diff), swapped
            continue
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


def test_a_generated_set_is_tokenized_once_per_tokenizer_and_spec(monkeypatch):
    """generate keeps each tokenizer's sets by spec: the same spec again is not tokenized again and comes in lists
    of its own (equal to a fresh generation); another spec, or another tokenizer, is generated."""
    from engine.prompts import promptsets
    calls = []
    real = promptsets.build_pairs
    monkeypatch.setattr(promptsets, "build_pairs", lambda *a, **k: calls.append(a[2:]) or real(*a, **k))
    tok = build_tokenizer()
    spec = PromptSetSpec(ops=("add", "sub"), n=7, seed=123)
    a, na = generate(tok, spec)
    a.clear()  # a caller's list is its own
    b, nb = generate(tok, spec)
    assert len(calls) == 1 and len(b) == 14 and na == nb
    fresh = promptsets.tokenized_set(tok, spec)
    assert b == fresh.pairs and len(calls) == 2
    generate(tok, PromptSetSpec(ops=("add", "sub"), n=7, seed=124))
    generate(build_tokenizer(), spec)
    assert len(calls) == 4


def test_n_is_capped_by_distinct_problems_and_negatives_optional():
    div = sample_problems(["div"], 10_000, 0)
    assert len(div) == len({(p.template.id, p.a, p.b) for p in div}) == 8 * 23
    neg = sample_problems(["sub"], 1000, 0, operands=OperandRange(1, 9, allow_negative=True))
    assert any(p.answer < 0 for p in neg)


def test_every_problem_of_the_templates_unbalanced():
    """``every``: all (template, A, B) of the set, whatever n and balance say; a sample keeps its cache keys."""
    from engine.prompts.promptsets import problem_count, sample_words
    tok = build_tokenizer()
    spec = PromptSetSpec(ops=("add", "div"), n=5, every=True)
    pairs, dropped = generate(tok, spec)
    assert len(pairs) + dropped == problem_count(spec) == 8 * 81 + 8 * 23
    assert len({(p.template, p.a, p.b) for p in pairs}) == len(pairs)
    assert generate(tok, PromptSetSpec(ops=("add", "div"), n=40, balance=False, every=True))[0] == pairs
    assert PromptSetSpec(ops=("add",), n=5, every=True).to_params() == PromptSetSpec(ops=("add",), n=9,
                                                                                        every=True).to_params()
    assert "every" not in PromptSetSpec(ops=("add",)).to_params()  # a sample's keys are those it always had
    assert sample_words(spec) == "every problem of its templates"
    assert sample_words(PromptSetSpec(n=40)) == "a balanced sample of 40 per operation"


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


def test_decimal_operands_are_figure_4s_rational_numbers():
    """--decimals 1: "The addition of 4.5 and 2.3 is" with answer 6.8; every operand and every +, -, *
    answer has its decimals (no 4.0, no 4.5 + 2.5 = 7.0); the answer's tokens include the point."""
    spec = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=30, seed=2, decimals=1)
    pairs, _ = generate(TOK, spec)
    assert {p.op for p in pairs} == {"add", "sub", "mul", "div"}
    for p in pairs:
        a, b = p.a, p.b
        assert isinstance(a, float) and f"{a:.1f}" in p.ref_text and f"{b:.1f}" in p.ref_text
        want = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[p.op]
        assert abs(p.answer - want) < 1e-9, p
        if p.op == "div":
            assert isinstance(p.answer, int)
        else:
            assert str(p.answer) != str(int(p.answer)) and not str(p.answer).endswith("0")
        assert "".join(TOK.convert_ids_to_tokens(p.answer_ids)) == str(p.answer)
        assert PromptPair.from_json(p.to_json()) == p
    # integer sets keep their cache keys; decimal ones differ
    assert "decimals" not in PromptSetSpec().to_params() and spec.to_params()["decimals"] == 1
    with pytest.raises(PromptError):
        generate(TOK, PromptSetSpec(ops=("pow",), families=("power",), decimals=1))
    with pytest.raises(PromptError):
        PromptSetSpec(decimals=3)
