"""The answer-token rule on every tokenizer family, the balance rule and the answer-token distribution.

Tokenizer families are rebuilt offline with ``tokenizers`` (BPE trained on arithmetic sentences) so that
they split numbers exactly as the real ones do:

* ``bytelevel_split_digits`` -- Qwen2 / SmolLM2: ``" 8"`` -> ``"Ġ"``, ``"8"`` (a lone whitespace token);
* ``metaspace_split_digits`` -- Llama-2 (SentencePiece, adds ``<s>``): ``" 8"`` -> ``"▁"``, ``"8"``;
* ``bytelevel_whole_numbers`` -- GPT-2: ``" 12"`` is one token ``"Ġ12"``;
* ``organism`` -- the bundled model's word-level tokenizer (digits split, BOS added).

The real SmolLM2 tokenizer is checked in tests/integration/test_smollm2_techniques.py.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from engine.organism.recipe import build_tokenizer
from engine.prompts.pairs import Problem, build_pair, prompt_set_hash
from engine.prompts.promptsets import (
    BALANCE_OVERSAMPLE,
    DOMINANT_SHARE,
    PromptSetSpec,
    answer_token_stats,
    generate,
    generate_set,
)
from engine.prompts.templates import Template
from engine.prompts.typed import typed_prompt_ids
from engine.techniques.attention import FIRST_TOKEN, ROLE_DEFINITIONS, ROLES, token_roles

CORPUS = [f"{a} + {b} = {a + b}. The sum of {a} and {b} is {a + b}. Q: What is {a} times {b}? A: {a * b}. "
          f"{a} - {b} = {a - b}. {a * b} / {b} = {a}. Calculate {a} plus {b}. {a} none {b} nothing blank @ #"
          for a in range(1, 10) for b in range(1, 10)]
FAMILIES = ("bytelevel_split_digits", "metaspace_split_digits", "bytelevel_whole_numbers", "organism")
SPLITS_DIGITS = {"bytelevel_split_digits": True, "metaspace_split_digits": True,
                 "bytelevel_whole_numbers": False, "organism": True}


def _family(name: str):
    if name == "organism":
        return build_tokenizer()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if name == "bytelevel_split_digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
        tok.decoder = decoders.ByteLevel()
    elif name == "metaspace_split_digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
            pre_tokenizers.Digits(individual_digits=True)])
        tok.decoder = decoders.Metaspace()
        alphabet = []
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>"],
                                                        initial_alphabet=alphabet, show_progress=False))
    if name == "metaspace_split_digits":  # SentencePiece models prepend <s>
        tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, _family(request.param)


def _is_space(tok, i: int) -> bool:
    return tok.convert_ids_to_tokens([i])[0].strip("▁Ġ ") == ""


@pytest.mark.parametrize("text,answer", [("3 + 5 =", "8"), ("Q: What is 4 times 3? A:", "12"),
                                         ("The sum of 3 and 5 is", "8")])
def test_typed_prompt_is_read_where_the_first_digit_is_predicted(family, text, answer):
    name, tok = family
    typed = typed_prompt_ids(tok, text)
    assert typed.parsed is not None and str(typed.parsed.answer) == answer
    full = tok(f"{text} {answer}")["input_ids"]
    # the prompt ids are a prefix of the full text's ids and stop right before the answer's first token
    assert full[:len(typed.ids)] == typed.ids and full[len(typed.ids)] == typed.answer.answer_id
    first = tok.convert_ids_to_tokens([typed.answer.answer_id])[0]
    assert answer[0] in first
    if name in ("bytelevel_split_digits", "metaspace_split_digits"):
        # these tokenizers emit a lone whitespace token before a number: it belongs to the prompt
        assert _is_space(tok, typed.ids[-1]) and len(typed.ids) == len(tok(text)["input_ids"]) + 1
        assert first == answer[0]  # and the answer token is the bare first digit
    else:
        assert typed.ids == tok(text)["input_ids"]


def test_unparsed_prompt_is_read_at_the_number_position(family):
    name, tok = family
    typed = typed_prompt_ids(tok, "3 ? 5 =")  # no operator the parser knows
    assert typed.parsed is None and "no operation" in typed.error and typed.rule_applied
    assert _is_space(tok, typed.ids[-1]) == (name in ("bytelevel_split_digits", "metaspace_split_digits"))


def test_prompt_files_and_typed_prompts_share_the_rule(family):
    _, tok = family
    tpl = Template(id="test.qa", op="mul", family="test", text="Q: What is {A} [times] {B}? A:")
    prob = Problem(tpl, 7, 8, fillers=("none", "nothing", "blank"))
    pair = build_pair(tok, prob)
    typed = typed_prompt_ids(tok, prob.ref_text)
    assert pair.ref_ids == typed.ids and pair.answer_id == typed.answer.answer_id


def _max_share(pairs, op: str) -> float:
    mine = [p.answer_id for p in pairs if p.op == op]
    return max(mine.count(i) for i in set(mine)) / len(mine)


def test_balanced_sets_spread_the_first_answer_token(family):
    name, tok = family
    spec = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=60, seed=4)
    balanced, _ = generate(tok, spec)
    plain, _ = generate(tok, PromptSetSpec(ops=spec.ops, n=60, seed=4, balance=False))
    # the candidates the balanced set was chosen from: the unbalanced set of BALANCE_OVERSAMPLE x n
    pool, _ = generate(tok, PromptSetSpec(ops=spec.ops, n=60 * BALANCE_OVERSAMPLE, seed=4, balance=False))
    for op in spec.ops:
        got = Counter(p.answer_id for p in balanced if p.op == op)
        have = Counter(p.answer_id for p in pool if p.op == op)
        # n, or every candidate when fewer exist (a tokenizer may give some templates no equal-length X_c)
        assert sum(got.values()) == min(60, sum(have.values())) and set(got) == set(have)  # every token represented
        # round-robin: a token has fewer than the most frequent one minus 1 only when it ran out
        for t, c in got.items():
            assert c >= max(got.values()) - 1 or c == have[t], (op, t, got, have)
    stats_b, stats_p = answer_token_stats(tok, balanced), answer_token_stats(tok, plain)
    assert stats_b.warning is None and stats_b.top_share <= DOMINANT_SHARE
    if SPLITS_DIGITS[name]:
        # additions of 1..9: every sum from 10 to 18 starts with "1" -- the degenerate set the rule avoids
        assert _max_share(plain, "add") > DOMINANT_SHARE and stats_p.warning is not None
        assert stats_p.top_token.strip("▁Ġ") == "1" and "1" in stats_p.warning
        assert _max_share(balanced, "add") < 0.15
    else:
        assert _max_share(plain, "add") < DOMINANT_SHARE  # whole-number tokens: 17 different answers
    assert prompt_set_hash(balanced) != prompt_set_hash(plain)


def test_balance_flag_and_rule_are_in_the_params():
    a, b = PromptSetSpec(), PromptSetSpec(balance=False)
    assert a.to_params()["balance"] is True and b.to_params()["balance"] is False
    assert a.to_params()["balance_rule"] != b.to_params()["balance_rule"] == "none"
    assert a.to_params()["answer_token_rule"] == b.to_params()["answer_token_rule"]


def test_balanced_generation_is_seeded_and_reports_dropped_candidates():
    tok = _family("bytelevel_split_digits")
    one, two = generate_set(tok, PromptSetSpec(n=20, seed=9)), generate_set(tok, PromptSetSpec(n=20, seed=9))
    assert [p.ref_text for p in one.pairs] == [p.ref_text for p in two.pairs]
    assert one.candidates > len(one.pairs) and all(isinstance(r, str) and r for _, r in one.dropped)


def test_answer_token_stats_counts_real_tokens():
    tok = build_tokenizer()
    pairs, _ = generate(tok, PromptSetSpec(ops=("add",), n=40, seed=1, balance=False))
    stats = answer_token_stats(tok, pairs)
    assert sum(stats.counts.values()) == stats.n == 40 and stats.per_op["add"] == stats.counts
    first = [tok.convert_ids_to_tokens([p.answer_id])[0] for p in pairs]
    assert stats.counts[stats.top_token] == first.count(stats.top_token) == max(first.count(t) for t in first)
    assert list(stats.counts.values()) == sorted(stats.counts.values(), reverse=True)
    assert stats.to_json()["warning"] == stats.warning


def _pair(tok, text: str, op: str = "add"):
    tpl = Template(id="test.t", op=op, family="test", text=text)
    return build_pair(tok, Problem(tpl, 3, 5, fillers=("none", "nothing", "@", "#")))


@pytest.mark.parametrize("name", ["bytelevel_split_digits", "metaspace_split_digits"])
def test_first_token_role_with_and_without_bos(name):
    tok = _family(name)
    backend = SimpleNamespace(tokenizer=tok)
    qa = token_roles(backend, _pair(tok, "Q: What is {A} [plus] {B}? A:"))
    assert qa[0] == FIRST_TOKEN and "operator" in qa and "operand A" in qa and "operand B" in qa
    eq = token_roles(backend, _pair(tok, "{A} [+] {B} ="))
    if tok("3")["input_ids"][0] == tok.bos_token_id:  # Llama-like: BOS at position 0 is the first token
        assert eq[0] == FIRST_TOKEN
    else:  # no BOS: position 0 holds operand A, whose role wins
        assert eq[0] == "operand A" and FIRST_TOKEN not in eq
    assert set(qa) <= set(ROLES) and set(ROLE_DEFINITIONS) == set(ROLES)


@pytest.mark.parametrize("name", ["bytelevel_split_digits", "metaspace_split_digits"])
@pytest.mark.parametrize("kind", ["operand-a", "operand-b", "operator-removed", "operator-swapped"])
def test_roles_under_every_counterfactual_kind(name, kind):
    """The operand a counterfactual replaces keeps its role (issue 47: under operand-a, operand A's digits were read
    as the operator, and the Numbers probes found no operand A); the operator is what an operator kind replaces."""
    from engine.prompts.pairs import OperandRange
    tok = _family(name)
    tpl = Template(id="test.t", op="add", family="test", text="Q: What is {A} [+] {B}? A:")
    pair = build_pair(tok, Problem(tpl, 5, 3, fillers=("@", "#")), kind, OperandRange(1, 9))
    roles = token_roles(SimpleNamespace(tokenizer=tok), pair)
    changed = {roles[i] for i, (r, c) in enumerate(zip(pair.ref_ids, pair.cf_ids)) if r != c}
    assert "operand A" in roles and "operand B" in roles
    if kind.startswith("operand"):
        assert changed == {f"operand {kind[-1].upper()}"} and "operator" not in roles
    else:
        assert changed == {"operator"}
