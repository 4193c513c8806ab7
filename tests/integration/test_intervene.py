"""Intervene (engine/techniques/intervene.py) against the interventions the lab already defines, on the bundled model.

Patching head L.H from the counterfactual prompt X_c:
* at END with every other head frozen is path patching's sender L.H (its answer logit, per pair);
* at every position with nothing frozen is the counterfactual knockout (``knockout_end`` with ``means`` None:
  the answer-logit margin over the vocabulary's mean logit).
Mean ablation is the knockouts' (``next_token_probs`` under the same Knockout); zero is scale 0; the CLI
answers bad input in one line with exit status 2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.prompts.pairs import PromptError
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.intervene import Intervention, forget, intervene, intervened_logits, parse_targets
from engine.techniques.knockout import Knockout, knockout_end, mean_activations, next_token_probs
from engine.techniques.path_patching import Sender, path_patching, path_patching_reference
from tests.helpers.cli import run_cli

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


# ---------------------------------------------------------------------------------------------
# a number's class-mean direction (engine/techniques/numbers/directions.py), added
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def plain_end_residual(backend, pairs, layer):
    """X [P, d_model] float64 by hand: one unpadded forward per prompt, resid_post[layer] at its last token (END: the
    token right before the answer)."""
    from engine.backends import hooks
    from engine.prompts.pairs import answer_tokens
    xs = []
    for p in pairs:
        assert answer_tokens(backend.tokenizer, p.ref_text, p.answer).prompt_ids == p.ref_ids  # the answer follows
        _, c = backend.run_with_cache(torch.tensor([p.ref_ids]), None, [hooks.resid_post(layer)])
        xs.append(c[hooks.resid_post(layer)][0, -1].double())
    return torch.stack(xs)


def plain_class_mean(backend, pairs, layer, value):
    """d_v by hand: the class mean of the plain END residuals minus the set's mean, made unit (float64)."""
    X = plain_end_residual(backend, pairs, layer)  # [P, d_model]
    mine = torch.tensor([float(p.answer) == float(value) for p in pairs])
    d = X[mine].mean(0) - X.mean(0)
    return (d / d.norm()).numpy(), int(mine.sum())


@torch.no_grad()
def plain_added(backend, ids, layer, vector, strength):
    """END logits with s |x_END| d added to resid_post[layer] at END, by a hand-written hook."""
    from engine.backends import hooks
    d = torch.tensor(vector, dtype=torch.float32)

    def add(act):  # [1, pos, d_model]
        act[0, -1] = act[0, -1] + strength * act[0, -1].float().norm() * d.to(act.dtype)
        return act
    with backend.hooks([(hooks.resid_post(layer), add)]):
        return backend.end_logits(torch.tensor([list(ids)]), None, torch.tensor([len(ids) - 1]))[0].float()


def check_class_mean_direction(backend, pairs, layer, value, strength=2.0):
    from engine.techniques.numbers.directions import class_mean_direction
    got, n = class_mean_direction(backend, pairs, layer, value)
    want, n_want = plain_class_mean(backend, pairs, layer, value)
    assert n == n_want >= 2
    np.testing.assert_allclose(got, want, atol=1e-5)
    p = next(q for q in pairs if float(q.answer) != float(value))
    t = parse_targets(f"{layer}.resid", backend.facts.n_layers, backend.facts.n_heads)
    _, after = intervened_logits(backend, p.ref_ids, Intervention("add", t, strength=strength,
                                                                  direction=tuple(got)))
    ref = plain_added(backend, p.ref_ids, layer, got, strength)
    assert torch.allclose(after, ref, atol=1e-3 * float(ref.abs().max())), float((after - ref).abs().max())


def test_a_numbers_class_mean_direction_is_the_hand_computed_mean_and_is_added_as_written(organism):
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers.directions import answer_counts
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=40, seed=0))
    value = max(answer_counts(pairs).items(), key=lambda kv: kv[1])[0]
    for layer in (1, organism.facts.n_layers - 1):
        check_class_mean_direction(organism, pairs, layer, value)


def plain_probe_direction(backend, pairs, layer, value, X=None):
    """The probe's direction by hand: scikit-learn's pipeline (StandardScaler + LogisticRegression, the Numbers
    page's C) fitted on the plain END residuals of the prompts whose answer occurs twice or more, and its decision
    function read at 0 and at each unit vector e_i of the residual stream: the gradient of the logit of ``value``
    minus the classes' mean logit (binary: the one decision score, its sign by the class), made unit (``X``: the
    plain END residuals, when already taken)."""
    from collections import Counter

    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from engine.techniques.numbers.probes import LOGREG_C
    X = plain_end_residual(backend, pairs, layer).numpy() if X is None else X
    y = np.array([float(p.answer) for p in pairs])
    counts = Counter(y.tolist())
    keep = np.array([counts[v] >= 2 for v in y])
    pipe = make_pipeline(StandardScaler(), LogisticRegression(C=LOGREG_C, solver="newton-cg", tol=1e-10,
                                                             max_iter=10_000)).fit(X[keep], y[keep])
    d = X.shape[1]
    scores = pipe.decision_function(np.vstack([np.zeros((1, d)), np.eye(d)]))  # [1 + d, K] (binary: [1 + d])
    g = scores[1:] - scores[:1]  # the linear score's change along each e_i: its gradient
    k = list(pipe.classes_).index(float(value))
    grad = (g[:, k] - g.mean(1)) if g.ndim == 2 else (g if k == 1 else -g)
    return grad / np.linalg.norm(grad), int(counts[float(value)])


def test_a_numbers_probe_direction_is_scikit_learns_probe_gradient_and_is_added_as_written(organism):
    """The logistic probe's direction equals the gradient of scikit-learn's own fitted probe (on activations taken by
    hand), for the most and the least frequent answer of the set, at two layers; adding it is the hand-written hook."""
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers.directions import answer_counts, number_direction
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=40, seed=0))
    have = answer_counts(pairs)
    assert len(have) >= 3  # a multinomial probe
    common = max(have.items(), key=lambda kv: kv[1])[0]
    rare = min(have.items(), key=lambda kv: kv[1])[0]
    for layer in (1, organism.facts.n_layers - 1):
        X = plain_end_residual(organism, pairs, layer).numpy()
        for value in (common, rare):
            got, n = number_direction(organism, pairs, layer, value, "probe")
            want, n_want = plain_probe_direction(organism, pairs, layer, value, X)
            assert n == n_want == have[value]
            np.testing.assert_allclose(got, want, atol=1e-4)
    p = next(q for q in pairs if float(q.answer) != float(common))
    t = parse_targets(f"{layer}.resid", organism.facts.n_layers, organism.facts.n_heads)
    vec, _ = number_direction(organism, pairs, layer, common, "probe")
    _, after = intervened_logits(organism, p.ref_ids, Intervention("add", t, strength=2.0, direction=tuple(vec)))
    ref = plain_added(organism, p.ref_ids, layer, vec, 2.0)
    assert torch.allclose(after, ref, atol=1e-3 * float(ref.abs().max()))


def test_a_binary_probe_direction_takes_its_sign_from_the_class(organism):
    """Two answers in the set: scikit-learn keeps one weight row; each answer's direction is that row's sign."""
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers.directions import answer_counts, number_direction
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=40, seed=0))
    a, b = sorted(answer_counts(pairs), key=lambda v: -answer_counts(pairs)[v])[:2]
    two = [p for p in pairs if float(p.answer) in (a, b)]
    da, _ = number_direction(organism, two, 2, a, "probe")
    db, _ = number_direction(organism, two, 2, b, "probe")
    np.testing.assert_allclose(da, -db, atol=1e-9)
    np.testing.assert_allclose(da, plain_probe_direction(organism, two, 2, a)[0], atol=1e-4)
    with pytest.raises(ValueError, match="choose one the set answers often enough"):
        number_direction(organism, two, 2, 9999, "probe")
    with pytest.raises(ValueError, match="two answers or more"):
        number_direction(organism, [p for p in two if float(p.answer) == a], 2, a, "probe")


def test_a_value_the_set_does_not_answer_twice_is_refused_with_the_values_it_has(organism):
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers.directions import answer_counts, class_mean_direction
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=40, seed=0))
    have = answer_counts(pairs)
    with pytest.raises(ValueError, match="choose one the set answers often enough") as e:
        class_mean_direction(organism, pairs, 1, 9999)
    assert f"{next(iter(have))} ({have[next(iter(have))]})" in str(e.value)
    t = parse_targets("1.resid", organism.facts.n_layers, organism.facts.n_heads)
    for bad in ((1.0, 2.0), (0.0,) * organism.facts.d_model, (float("nan"),) * organism.facts.d_model):
        with pytest.raises(ValueError):
            intervened_logits(organism, pairs[0].ref_ids, Intervention("add", t, strength=1.0, direction=bad))


def test_cli_intervene_adds_a_class_mean_or_a_probe_direction(tmp_path):
    import json
    out = tmp_path / "iv.json"
    r = run_cli("intervene", "--model", "organism", "--text", "Q: What is 7 plus 8? A:", "--components", "2.resid",
                "--action", "add", "--number", "11", "--direction", "class-mean", "--op", "add", "--n", "40",
                "--strength", "2", "--out", str(out), cache=tmp_path / "r.duckdb")
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["direction"] == "class-mean" and got["direction_layer"] == 2 and got["number"] == 11
    r = run_cli("intervene", "--model", "organism", "--text", "Q: What is 7 plus 8? A:", "--components", "2.resid",
                "--action", "add", "--number", "11", "--direction", "probe", "--op", "add", "--n", "40",
                "--strength", "2", "--out", str(out), cache=tmp_path / "r.duckdb")
    assert r.returncode == 0, r.stderr
    probe = json.loads(out.read_text())
    assert probe["direction"] == "probe" and probe["direction_layer"] == 2 and probe["after"] != got["after"]
    bad = run_cli("intervene", "--model", "organism", "--text", "Q: What is 7 plus 8? A:", "--components", "2.resid",
                  "--action", "add", "--number", "9999", "--direction", "class-mean", "--op", "add", "--n", "40",
                  cache=tmp_path / "r.duckdb")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.realmodel
def test_smollm2_class_mean_direction_equals_the_hand_computed_mean():
    """SmolLM2: END is the prompt's last token, right before the answer's first digit (checked per prompt in the
    plain loop); the batched, padded residual pass's class mean equals one unpadded forward per prompt."""
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers.directions import answer_counts
    from tests.helpers.smollm2 import open_smollm2
    smol = open_smollm2()
    pairs, _ = kept_pairs(smol, PromptSetSpec(ops=("add",), n=24, seed=0))
    value = max(answer_counts(pairs).items(), key=lambda kv: kv[1])[0]
    for p in pairs:
        last = str(smol.tokenizer.convert_ids_to_tokens(p.ref_ids)[-1])
        assert not any(ch.isdigit() for ch in last), (p.ref_text, last)
    check_class_mean_direction(smol, pairs, smol.facts.n_layers // 2, value)
