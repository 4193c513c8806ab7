"""Written templates and written pairs on real tokenizers: the messages that need a tokenizer or a model (a
counterfactual never as long as the prompt, words the tokenizer does not know, a model that answers none right), a
written set analysed at the answer's first digit (the bundled model and SmolLM2), and a file of written pairs
giving the same kept pairs and path patching as the template they were written from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from engine.prompts.custom import parse_template, read_text_pairs, unknown_words
from engine.prompts.pairs import PromptError
from engine.prompts.promptsets import PromptSetSpec, generate_set
from engine.techniques.accuracy import answered_right, kept_pairs
from engine.techniques.path_patching import path_patching
from tests.helpers.smollm2 import open_smollm2

APPLES = "{A} apples [and] {B} pears make"


def _spec(text: str, op: str = "add", **kw) -> PromptSetSpec:
    return PromptSetSpec(ops=(op,), n=kw.pop("n", 20), templates=(parse_template(text, op).as_param(),), **kw)


def test_a_counterfactual_never_as_long_as_the_prompt_says_which_tokens_differ(organism):
    # the bundled tokenizer writes "++" as two tokens and every neutral symbol as one
    with pytest.raises(PromptError, match=r"splits the operator '\+\+' into 2 token\(s\) and the neutral symbols "
                                          r"\(@, <, >, #, &, \|\) into 1; pick an operator"):
        generate_set(organism.tokenizer, _spec("{A} [++] {B} ="))


def test_words_the_tokenizer_does_not_know_are_named(organism):
    assert unknown_words(organism.tokenizer, parse_template(APPLES, "add")) == ["make"]
    assert unknown_words(organism.tokenizer, parse_template("{A} [plus] {B} is", "add")) == []


def _digit_at_end(tok, pairs) -> None:
    """Every pair is read where the answer's first digit is predicted: the answer token holds the answer's first
    digit, and X_r / X_c differ only at the operator."""
    for p in pairs:
        first = tok.decode([p.answer_id]).strip()
        assert first and first[0] == str(p.answer)[0], (p.ref_text, first)
        assert len(p.ref_ids) == len(p.cf_ids) and p.ref_ids[-1] == p.cf_ids[-1]
        assert not any(c.isdigit() for c in tok.decode([x for x, y in zip(p.ref_ids, p.cf_ids) if x != y]))


def test_a_written_set_runs_path_patching_at_the_digit_position(organism):
    kept, n = kept_pairs(organism, _spec("{A} [plus] {B} is"))
    assert n == 20 and len(kept) >= 15
    _digit_at_end(organism.tokenizer, kept)
    res = path_patching(organism, kept)
    assert torch.isfinite(res.head_logit).all() and float(res.head_logit.abs().max()) > 0


@pytest.mark.realmodel
def test_the_apples_template_on_smollm2_at_the_digit_position():
    smol = open_smollm2()
    kept, n = kept_pairs(smol, _spec(APPLES, n=40))
    assert n == 40 and kept, "SmolLM2 answered some of the apples-and-pears prompts right when this was written"
    _digit_at_end(smol.tokenizer, kept)
    assert all(p.ref_text.endswith("pears make") and " and " in p.ref_text and " and " not in p.cf_text
               for p in kept)


def test_written_pairs_give_the_same_kept_pairs_and_patching_as_their_template(organism, tmp_path):
    pairs = generate_set(organism.tokenizer, _spec("{A} [plus] {B} is")).pairs
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.ref_text, "counterfactual": p.cf_text, "answer": p.answer,
                                        "op": p.op}) + "\n" for p in pairs))
    read = read_text_pairs(organism.tokenizer, str(path))
    assert [(p.ref_ids, p.cf_ids, p.answer_id) for p in read] == [(p.ref_ids, p.cf_ids, p.answer_id) for p in pairs]
    kept_file, (kept_tpl, _) = answered_right(organism, read), kept_pairs(organism, _spec("{A} [plus] {B} is"))
    assert [p.ref_ids for p in kept_file] == [p.ref_ids for p in kept_tpl]
    a, b = path_patching(organism, kept_file), path_patching(organism, kept_tpl)
    assert torch.equal(a.head_logit, b.head_logit)


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "3 + 5 =", "counterfactual": "3 nothing 5 =", "answer": 8}', "the counterfactual has 6 tokens"),
    ('{"prompt": "three apples", "counterfactual": "three pears", "answer": 3}', "say which operation"),
    ('{"prompt": "3 + 5 =", "answer": 8}', 'write an object with "prompt"'),
    ('{"prompt": "3 + 5 =", "counterfactual": "3 @ 5 =", "answer": "eight"}', "is not a number"),
    ("3 + 5 = 8", "not JSON"),
])
def test_a_bad_line_of_written_pairs_is_named(organism, tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "2 + 2 =", "counterfactual": "2 @ 2 =", "answer": 4}\n' + line + "\n")
    with pytest.raises(PromptError, match=f"{path}:2: .*{message}"):
        read_text_pairs(organism.tokenizer, str(path))


def _cli(*args, tmp_path):
    env = {"ARITHLAB_CACHE": str(tmp_path / "c.duckdb"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "engine", "path-patching", "--out", str(tmp_path / "o.csv"),
                           "--quiet", *args], capture_output=True, text=True, env=env, timeout=600)


def test_the_cli_takes_a_template_and_says_in_one_line_what_is_wrong(tmp_path):
    ok = _cli("--template", "{A} [plus] {B} is", "--op", "add", "--n", "10", tmp_path=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["n_pairs"] >= 8
    for args, message in ((("--template", "{A} plus {B} is"), "say its operation with one --op"),
                          (("--template", "add:{A} plus is"), "has no {B}"),
                          (("--template", APPLES, "--op", "sub", "--n", "5"), "answers none of the 5 prompts of your "
                                                                              "template right")):
        bad = _cli(*args, tmp_path=tmp_path)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, bad.stderr


def test_the_report_names_the_written_template(organism, tmp_path):
    from cache import ResultCache
    from engine.findings.report import build_report
    from views.report import render_html
    spec = _spec("{A} [plus] {B} is", n=10)
    rep = build_report(organism, spec, ResultCache(tmp_path / "c.duckdb"), k_max=2, draws=1)
    assert rep.prompt_set["templates"] == ["add:{A} [plus] {B} is"] and rep.prompt_set["families"] == ["custom"]
    assert "{A} [plus] {B} is" in render_html(rep)
