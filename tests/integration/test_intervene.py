"""Intervene (engine/techniques/intervene.py) against the interventions the lab already defines, on the bundled model.

Patching head L.H from the counterfactual prompt X_c:
* at END with every other head frozen is path patching's sender L.H (its answer logit, per pair);
* at every position with nothing frozen is the counterfactual knockout (``knockout_end`` with ``means`` None:
  the answer-logit margin over the vocabulary's mean logit).
Mean ablation is the knockouts' (``next_token_probs`` under the same Knockout); zero is scale 0; the CLI
answers bad input in one line with exit status 2.
"""

from __future__ import annotations

import pytest
import torch

from engine.prompts.pairs import PromptError
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.intervene import Intervention, forget, intervene, intervened_logits, parse_targets
from engine.techniques.knockout import Knockout, knockout_end, mean_activations, next_token_probs
from engine.techniques.path_patching import Sender, path_patching, path_patching_reference
from tests.integration.test_cli import run_cli

HEADS = ((1, 3), (1, 1), (0, 2))


@pytest.fixture(scope="module")
def pairs(organism):
    ps, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul"), n=3, seed=1))
    return ps[:6]


def _patch(organism, p, head, *, freeze, positions):
    iv = Intervention("patch", parse_targets(f"{head[0]}.{head[1]}", organism.facts.n_layers, organism.facts.n_heads),
                      positions=positions, source=tuple(p.cf_ids), freeze=freeze)
    return intervened_logits(organism, p.ref_ids, iv)


def test_patch_at_end_with_the_others_frozen_is_path_patching(organism, pairs):
    raw = path_patching(organism, pairs)
    ref = path_patching_reference(organism, pairs, [Sender("head", L, H) for L, H in HEADS])
    for i, p in enumerate(pairs):
        for L, H in HEADS:
            before, after = _patch(organism, p, (L, H), freeze=True, positions="end")
            assert float(before[p.answer_id]) == pytest.approx(float(raw.logit_o[i]), abs=1e-4)
            assert float(after[p.answer_id]) == pytest.approx(float(ref[Sender("head", L, H)][i]), abs=1e-4)
            assert float(after[p.answer_id]) == pytest.approx(float(raw.head_logit[i, L, H]), abs=1e-4)


def test_patch_everywhere_is_the_counterfactual_knockout(organism, pairs):
    kos = [Knockout((h,)) for h in HEADS]
    readout = knockout_end(organism, pairs, kos, None)
    for i, p in enumerate(pairs):
        for k, head in enumerate(HEADS):
            _, after = _patch(organism, p, head, freeze=False, positions="all")
            margin = float(after[p.answer_id] - after.mean())
            assert margin == pytest.approx(float(readout.margin[k, i]), abs=1e-4)
            assert bool(after.argmax() == p.answer_id) == bool(readout.right[k, i])


def test_mean_is_the_knockouts_mean_ablation_and_zero_is_scale_0(organism, pairs):
    means = mean_activations(organism, pairs)
    p = pairs[0]
    t = parse_targets("1.3,0.mlp", organism.facts.n_layers, organism.facts.n_heads)
    _, after = intervened_logits(organism, p.ref_ids, Intervention("mean", t, "all"), means=means)
    want = next_token_probs(organism, p.ref_ids, ko=Knockout(((1, 3),), (0,)), means=means)
    assert torch.allclose(torch.softmax(after, -1), want, atol=1e-6)
    _, zero = intervened_logits(organism, p.ref_ids, Intervention("zero", t, "all"))
    _, scaled = intervened_logits(organism, p.ref_ids, Intervention("scale", t, "all", factor=0.0))
    assert torch.allclose(zero, scaled, atol=1e-5)
    _, one = intervened_logits(organism, p.ref_ids, Intervention("scale", t, "end", factor=1.0))
    before, _ = intervened_logits(organism, p.ref_ids, Intervention("scale", t, "end", factor=1.0))
    assert torch.allclose(one, before, atol=1e-4)


def test_adding_a_numbers_unembedding_raises_that_number(organism, pairs):
    p = pairs[0]
    other = next(q.answer_id for q in pairs if q.answer_id != p.answer_id)
    t = parse_targets(f"{organism.facts.n_layers - 1}.resid", organism.facts.n_layers, organism.facts.n_heads)
    res = intervene(organism, p.ref_ids, Intervention("add", t, strength=2.0, direction_token=other), watch=other)
    assert res.after.watched_logit > res.before.watched_logit + 1
    assert res.after.top[0].token_id == other  # twice the residual's own norm along its unembedding: it wins


def test_a_live_change_costs_one_forward_pass(organism, pairs):
    forget()
    p = pairs[1]
    t = parse_targets("1.3", organism.facts.n_layers, organism.facts.n_heads)
    first = intervene(organism, p.ref_ids, Intervention("patch", t, source=tuple(p.cf_ids), freeze=True))
    again = intervene(organism, p.ref_ids, Intervention("scale", t, factor=2.0, freeze=True))
    assert (first.forward_passes, again.forward_passes) == (3, 1)


@pytest.mark.parametrize("text", ["1.99", "99.1", "x", "1.mlp.999999", ""])
def test_bad_components_say_what_the_model_has(organism, text):
    with pytest.raises(PromptError):
        parse_targets(text, organism.facts.n_layers, organism.facts.n_heads, organism.facts.d_mlp)


def test_bad_combinations_are_refused(organism):
    t = parse_targets("1.3", organism.facts.n_layers, organism.facts.n_heads)
    for iv in (Intervention("add", t, direction_token=5), Intervention("patch", t),
               Intervention("scale", t, factor=1e9), Intervention("mean", parse_targets(
                   "1.resid", organism.facts.n_layers, organism.facts.n_heads))):
        with pytest.raises(ValueError):
            iv.check()


def test_cli_intervene(tmp_path):
    out = tmp_path / "iv.json"
    r = run_cli("intervene", "--model", "organism", "--text", "Q: What is 7 plus 8? A:", "--components", "1.3",
                "--action", "patch", "--freeze", "--out", str(out), cache=tmp_path / "r.duckdb")
    assert r.returncode == 0, r.stderr
    assert out.exists() and "watched_prob_after" in out.read_text()
    bad = run_cli("intervene", "--model", "organism", "--text", "Q: What is 7 plus 8? A:", "--components", "9.9",
                  cache=tmp_path / "r.duckdb")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_notebook_cell_runs_as_written(capsys):
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "notebook.md").read_text(encoding="utf-8")
    cell = re.search(r"## Intervene on one prompt.*?```python\n(.*?)```", doc, re.S).group(1)
    exec(compile(cell, "docs/notebook.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("3 passes") or out[0].endswith("1 passes"), out
    assert out[1].startswith("[('9'"), out  # 9's direction at twice the residual's norm makes 9 the top token
