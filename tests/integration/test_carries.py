"""Counterfactual kinds (engine.prompts.pairs.COUNTERFACTUALS) and what each key head carries
(engine.techniques.carries) on the bundled model, checked against its attention.

On the bundled model the clear-cut cases are: heads whose END row attends to neither operand (mostly the operator
and the words around it: 1.6 and 1.7 in its top 8) carry the operator -- their effect is there only when X_c
removes it, the intervals settle it; heads that attend mostly to A (1.0 - 1.3, about 72 % on A) move the answer
more when X_c changes A than when it changes B (and most when it removes the operator: they read A, but what they
write at END depends on the operation).  The operand grid (tests/integration/test_operand_grid.py) shows why they
"read A" here: they attend to the larger operand, which is A in every subtraction and division of this set."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace

from engine.prompts.pairs import COUNTERFACTUALS
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import role_attention
from engine.techniques.carries import KINDS, carries, what_heads_carry
from tests.helpers.cli import run_cli

SPEC = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=30, seed=0)


def test_each_kind_changes_only_its_part(organism):
    # the kinds the comparison uses (carry, for add and sub only, is tested in test_answer_digit.py)
    sets = {k: generate(organism.tokenizer, replace(SPEC, counterfactual=k))[0] for k in KINDS}
    assert set(KINDS) == set(COUNTERFACTUALS) - {"carry"}
    for kind, pairs in sets.items():
        assert pairs
        for p in pairs:
            assert len(p.ref_ids) == len(p.cf_ids) and p.ref_text != p.cf_text
            diff = [i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y]
            if kind == "operator-removed":
                assert str(p.a) in p.cf_text and str(p.b) in p.cf_text
            elif kind == "operator-swapped":  # the operator's tokens changed, the operands kept
                assert re.findall(r"\d+", p.cf_text) == re.findall(r"\d+", p.ref_text), (p.ref_text, p.cf_text)
                changed = organism.tokenizer.decode([p.ref_ids[i] for i in diff])
                assert diff and not any(c.isdigit() for c in changed), (p.ref_text, p.cf_text, changed)
            else:  # one operand token changed, the operator kept
                assert len(diff) == 1, (p.ref_text, p.cf_text)
                tok = organism.tokenizer.decode([p.ref_ids[diff[0]]]).strip()
                assert tok == str(p.a if kind == "operand-a" else p.b), (kind, p.ref_text, p.cf_text, tok)
    assert "counterfactual" not in SPEC.to_params()  # the paper's sets keep their cache keys
    assert replace(SPEC, counterfactual="operand-a").to_params()["counterfactual"] == "operand-a"


def test_what_the_bundled_models_key_heads_carry_agrees_with_their_attention(organism):
    rows, metric = what_heads_carry(organism, SPEC, k=8)
    att = {(r.layer, r.head, r.role): r.value for r in role_attention(organism, generate(organism.tokenizer, SPEC)[0])}
    val = {(r.layer, r.head, r.kind): r for r in rows}
    verdict = {(c.layer, c.head): c for c in carries(rows)}
    a_heads, op_heads = [], []
    for layer, head in verdict:
        a, b = att[(layer, head, "operand A")], att[(layer, head, "operand B")]
        if a < 0.05 and b < 0.05:  # reads no operand: the operator and its neighbours
            op_heads.append((layer, head))
            assert verdict[(layer, head)].kind == "operator-removed" and verdict[(layer, head)].clear
        elif a > 0.6:
            a_heads.append((layer, head))
            assert val[(layer, head, "operand-a")].value < val[(layer, head, "operand-b")].value, (layer, head)
    assert len(a_heads) >= 3 and len(op_heads) >= 1, (a_heads, op_heads)


def test_cli_and_a_bad_kind(tmp_path):
    out = tmp_path / "c.csv"
    r = run_cli("carries", "--model", "organism", "--op", "add,mul", "--n", "12", "--k", "3", "--out", str(out),
                cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(open(out, newline="")))
    assert {row["kind"] for row in rows} == set(KINDS) and len(rows) == 3 * len(KINDS)
    assert len(res["carries"]) == 3
    bad = run_cli("path-patching", "--model", "organism", "--op", "add", "--n", "6", "--counterfactual", "operand-c",
                  "--out", str(out), cache=tmp_path / "c.duckdb")
    assert bad.returncode == 2 and "operand-c" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
