"""The answer digit (issue 49) on the bundled model: the first digit exactly as before, a later one read after the
teacher-forced earlier digits, the filter and the balance by the chosen digit, the carry counterfactual's pairs."""

from __future__ import annotations

import hashlib
import json
import re

import torch

from engine.prompts.pairs import prompt_set_hash
from engine.prompts.promptsets import PromptSetSpec, answer_token_stats, generate
from engine.techniques.accuracy import forget_scores, kept_pairs, score_pairs
from engine.techniques.attention import token_roles

#: (spec, sha256 of its params' JSON, the generated set's hash), computed before the digit could be chosen
#: (commit 7ea2679): the first digit keeps its cache keys and its prompts byte for byte
BEFORE = [
    (PromptSetSpec(), "3935e1e7a2729d8b", "d5df9c2d6e13d804cfd3068145793fa6cee10d3b4b3f186039e49a5788ea643e"),
    (PromptSetSpec(ops=("add",), n=40), "7addc241dafea35d",
     "484eff6f0c0bbe1afad9c56f9f56ba90dceed16151389412a04584ab746f8d11"),
    (PromptSetSpec(ops=("add", "sub"), n=20, operand_lo=10, operand_hi=99, counterfactual="operand-a"),
     "d43ce3b0acec1241", "db6dccb99e35afe9ce22e5078703180769e250c451a330ae701099c773df490d"),
]
#: the kept pairs of add and sub, n=40, before the digit existed: all 80 kept, this hash
KEPT_BEFORE = "4e295e9878c2e83b981a6560046940d141b8335a646655bd51515798881706cf"


def test_first_digit_keys_prompts_and_kept_pairs_are_unchanged(organism):
    for spec, params, pairs_hash in BEFORE:
        assert hashlib.sha256(json.dumps(spec.to_params(), sort_keys=True).encode()).hexdigest()[:16] == params
        pairs, _ = generate(organism.tokenizer, spec)
        assert prompt_set_hash(pairs) == pairs_hash
        assert all(p.forced == 0 and "forced" not in p.to_json() for p in pairs)
    forget_scores()
    kept, n = kept_pairs(organism, PromptSetSpec(ops=("add", "sub"), n=40))
    assert (len(kept), n, prompt_set_hash(kept)) == (80, 80, KEPT_BEFORE)


def test_the_last_digit_is_read_after_the_forced_tens(organism):
    tok = organism.tokenizer
    pairs, _ = generate(tok, PromptSetSpec(ops=("add", "sub"), n=30, digit="last"))
    two = [p for p in pairs if p.forced]
    assert two and len(two) < len(pairs)  # 1..9: the sums from 10 on have a tens digit to force
    for p in pairs:
        text = str(int(p.answer))
        assert p.forced == len(text) - 1 and len(p.ref_ids) == len(p.cf_ids)
        assert tok.decode(p.ref_ids[len(p.ref_ids) - p.forced:] if p.forced else []).strip() == text[:-1]
        assert p.cf_ids[len(p.cf_ids) - p.forced:] == p.forced_ids  # X_r's digits forced in X_c too
        assert tok.decode([p.answer_id]).strip() == text[-1] and p.answer_ids == [p.answer_id]
        roles = token_roles(organism, p)
        assert roles[len(roles) - p.forced:] == ["other"] * p.forced
        assert {"operand A", "operand B"} <= set(roles)
    # balanced by the units digit: 10 tokens, none above its share
    stats = answer_token_stats(tok, pairs, "last")
    assert stats.warning is None and stats.top_share <= 0.2 and "digit" in stats.to_json()


def test_the_filter_wants_every_digit_up_to_the_chosen_one(organism):
    """A pair read at the units digit is right when the argmax after the prompt is its tens digit and the argmax
    after the forced tens is its units digit: checked against a plain greedy continuation of the prompt alone."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add",), n=8, digit="last"))
    forget_scores()
    scores = score_pairs(organism, pairs)
    for p, s in zip(pairs, scores):
        ids = p.ref_ids[:len(p.ref_ids) - p.forced]
        greedy = []
        for _ in range(p.forced + 1):
            x = torch.tensor([ids + greedy])
            with torch.no_grad():
                logits = organism.logits_at(x, torch.ones_like(x), torch.tensor([[x.shape[1] - 1]]))
            greedy.append(int(logits[0, 0].argmax()))
        assert s.first_ok == (greedy == p.forced_ids + [p.answer_id]), p.ref_text


def test_the_carry_counterfactual_on_the_bundled_tokenizer(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=20, operand_lo=10, operand_hi=99,
                                                          counterfactual="carry"))
    assert len(pairs) == 40
    for p in pairs:
        a, b = (int(x) for x in re.findall(r"\d+", p.cf_text))
        assert (a // 10, b // 10) == (p.a // 10, p.b // 10) and (a, b) != (p.a, p.b)
        c = a + b if p.op == "add" else a - b
        assert c % 10 == p.answer % 10 and abs(c - p.answer) == 10
        assert len(p.ref_ids) == len(p.cf_ids)


def test_a_set_chosen_by_its_carry_is_the_carry_group_of_the_whole_set(organism, tmp_path):
    """The sidebar's 'Carry / borrow' (``carry``): with every problem of one written template, the pairs the bundled
    model answers right under carry yes / no are exactly the whole set's kept pairs of that carry, in order; so each
    result of the carry set is the whole set's carry group's -- path patching's heatmap equals its ``carry:yes`` /
    ``carry:no`` group within 1e-6 -- and the set's cache keys are its own."""
    from cache import ResultCache
    from engine.prompts.custom import parse_template
    from engine.techniques.path_patching import cached_path_patching
    cache = ResultCache(tmp_path / "c.duckdb")
    template = (parse_template("{A} [plus] {B} is", "add").as_param(),)
    whole = PromptSetSpec(ops=("add",), every=True, templates=template)
    pairs, _ = kept_pairs(organism, whole, cache=cache)
    table, _ = cached_path_patching(organism, pairs, cache=cache)
    for carry in ("yes", "no"):
        spec = PromptSetSpec(ops=("add",), every=True, templates=template, carry=carry)
        mine, _ = kept_pairs(organism, spec, cache=cache)
        assert mine == [p for p in pairs if p.carry is (carry == "yes")] and 5 < len(mine) < len(pairs)
        alone, computed = cached_path_patching(organism, mine, cache=cache)
        assert computed  # its own key: not the whole set's table
        for metric in ("effect", "logit_diff"):
            (h, m), (ha, ma) = table.heatmap(metric, f"carry:{carry}"), alone.heatmap(metric)
            assert torch.allclose(torch.tensor(h), torch.tensor(ha), atol=1e-6, equal_nan=True), (carry, metric)
            assert torch.allclose(torch.tensor(m), torch.tensor(ma), atol=1e-6, equal_nan=True), (carry, metric)
