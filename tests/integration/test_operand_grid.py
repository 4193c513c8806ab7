"""The operand grid (engine.techniques.operand_grid) against plain references on the bundled model: per pair, the
END-row attention on A's and B's tokens from an unbatched forward (positions found from the text's characters, not
the token roles), the path-patching value from the textbook loop, a neuron's activation from an unbatched forward;
and what the grid shows: the bundled model's key heads 1.0, 1.1 and 1.3 read the *larger* operand, not A."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from engine.backends import hooks
from engine.prompts.pairs import PromptError
from engine.prompts.promptsets import PromptSetSpec
from engine.techniques.operand_grid import grid_pairs, grid_template, operand_grid, parse_component
from engine.techniques.path_patching import Sender, path_patching_reference

SPEC = PromptSetSpec(ops=("add",), n=40)


@pytest.fixture(scope="module")
def grid(organism):
    return operand_grid(organism, SPEC, neurons=[parse_component("6.mlp.5", 8, 8, organism.facts.d_mlp)])


def _operand_positions(tok, text: str, ids: list[int], number) -> list[int]:
    """Positions of the tokens that cover the characters of ``number`` in ``text`` (first occurrence after the
    previous one is not needed: the caller passes distinct spans)."""
    enc = tok(text, return_offsets_mapping=True)
    start = text.index(str(number))
    end = start + len(str(number))
    return [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s < end and e > start and i < len(ids)]


def test_the_grid_is_every_operand_pair_of_one_template(organism, grid):
    assert grid.template == "add.paper.0" and len(grid.a) == 81 and sum(grid.right) == 81
    assert sorted(zip(grid.a, grid.b)) == [(a, b) for a in range(1, 10) for b in range(1, 10)]


def test_attention_effect_and_activation_equal_plain_references(organism, grid):
    tok = organism.tokenizer
    pairs = grid_pairs(tok, SPEC, grid_template(SPEC))
    head, neuron = parse_component("1.3", 8, 8), parse_component("6.mlp.5", 8, 8, organism.facts.d_mlp)
    typed = operand_grid(organism, SPEC, component=head)  # the head typed: its exact path patching, whatever AtP says
    assert torch.equal(typed.mlp_effect, grid.mlp_effect) and int((~typed.head_effect[0].isnan()).sum()) == 1
    for i in (0, 17, 44, 80):
        p = pairs[i]
        assert p.a != p.b or i in (0, 80)
        ids = torch.tensor([p.ref_ids])
        _, c = organism.run_with_cache(ids, None, [hooks.attn_pattern(1), hooks.mlp_post(6)])
        row = c[hooks.attn_pattern(1)][0, head.head, -1]                      # [pos]
        a_text, b_text = str(p.a), str(p.b)
        if p.a != p.b:  # A comes first in "{A} + {B} =": B's span starts after A's
            pa = _operand_positions(tok, p.ref_text, p.ref_ids, a_text)
            b_at = p.ref_text.index(b_text, p.ref_text.index(a_text) + len(a_text))
            enc = tok(p.ref_text, return_offsets_mapping=True)
            pb = [j for j, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s < b_at + len(b_text) and e > b_at]
            assert float(row[pa].sum()) == pytest.approx(float(grid.attn_a[i, 1, head.head]), abs=1e-5)
            assert float(row[pb].sum()) == pytest.approx(float(grid.attn_b[i, 1, head.head]), abs=1e-5)
        act = float(c[hooks.mlp_post(6)][0, -1, neuron.neuron])
        assert act == pytest.approx(grid.neurons[neuron.name][i], abs=1e-5)
        ref = path_patching_reference(organism, [p], [Sender("head", 1, 3), Sender("mlp", 6)])
        lo = organism.logits(ids)[0, -1, p.answer_id]
        for s, v in ref.items():
            got = typed.head_effect[i, 1, 3] if s.component == "head" else grid.mlp_effect[i, 6]
            assert float(got) == pytest.approx(float((v[0] - lo) / lo), abs=1e-4), s


def test_the_default_head_is_the_exact_top_head_of_every_head(organism, grid):
    """Attribution patching only picks the candidates; of them the grid shows the exact best -- on the bundled model
    the same head that exact path patching of all 64 heads ranks first, though AtP ranks another first."""
    from engine.techniques.path_patching import path_patching
    full = path_patching(organism, grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC)))
    mean = full.per_pair(grid.metric)[0].nanmean(0)                     # [L, H]
    assert grid.top_head().name == "1.1" == "{}.{}".format(*divmod(int(mean.argmin()), 8))
    assert len(grid.candidates) == 8 and grid.candidates[0] != (1, 1)
    computed = ~grid.head_effect.isnan().all(0)
    assert sorted(map(tuple, computed.nonzero().tolist())) == sorted(grid.candidates)
    for layer, head in grid.candidates:
        assert torch.allclose(grid.head_effect[:, layer, head], full.per_pair(grid.metric)[0][:, layer, head],
                              atol=1e-5, equal_nan=True)


def reference_direct_effect(backend, pair, layer: int, head: int | None) -> float:
    """logit(x) - logit(x - c) at END of one unbatched prompt, c read off the model itself: a head's c is the change
    of its layer's attention contribution at END when its z at END is zeroed (a second forward pass), an MLP's its
    output at END; x - c is written into the last residual stream by a hook."""
    ids = torch.tensor([pair.ref_ids])
    L = backend.facts.n_layers
    if head is None:
        _, cache = backend.run_with_cache(ids, None, [hooks.mlp_out(layer)])
        c = cache[hooks.mlp_out(layer)][0, -1]
    else:
        _, clean = backend.run_with_cache(ids, None, [hooks.attn_out(layer)])

        def zero(z):  # [1, pos, H, d_head]
            z = z.clone()
            z[0, -1, head] = 0
            return z
        with backend.hooks([(hooks.attn_z(layer), zero)]):
            _, gone = backend.run_with_cache(ids, None, [hooks.attn_out(layer)])
        c = (clean[hooks.attn_out(layer)] - gone[hooks.attn_out(layer)])[0, -1]

    def minus(x):  # [1, pos, d_model]
        x = x.clone()
        x[0, -1] -= c.to(x.dtype)
        return x
    lo = float(backend.logits(ids)[0, -1, pair.answer_id])
    with backend.hooks([(hooks.resid_post(L - 1), minus)]):
        return lo - float(backend.logits(ids)[0, -1, pair.answer_id])


def test_direct_effects_equal_a_removal_from_the_last_stream(organism, grid):
    pairs = grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC))
    for i in (0, 17, 44):
        for layer, head in ((1, 3), (7, 0), (4, None), (7, None)):
            got = grid.direct_head[i, layer, head] if head is not None else grid.direct_mlp[i, layer]
            want = reference_direct_effect(organism, pairs[i], layer, head)
            assert float(got) == pytest.approx(want, abs=1e-4), (i, layer, head)
    assert "direct" in grid.rows(parse_component("1.3", 8, 8))[0]


def test_direct_effects_fast_path_equals_its_textbook_loop(organism, grid):
    """The grid's direct effects (one cached pass, checked) equal the textbook loop (every head and MLP frozen at X_r,
    the component's write at END removed, the model's own logits), on every component of the first 16 pairs."""
    from engine.techniques.operand_grid import direct_effects, direct_effects_loop
    pairs = grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC))[:16]
    fast, loop = direct_effects(organism, pairs), direct_effects_loop(organism, pairs)
    assert grid.fallback is None and fast.fallback is None and loop.fallback is None
    assert torch.allclose(fast.head, loop.head, atol=1e-4) and torch.allclose(fast.mlp, loop.mlp, atol=1e-4)
    assert torch.equal(fast.head, grid.direct_head[:16]) and torch.equal(fast.mlp, grid.direct_mlp[:16])
    assert float(loop.head.abs().max()) > 0.1  # not vacuous: the heads write to the answer's logit


def test_a_direct_effect_fast_path_that_misses_falls_back_and_says_so(organism, grid, monkeypatch, tmp_path):
    """W_O 1 % off the model's: the heads no longer sum to the attention's output, the grid's direct effects come from
    the textbook loop (equal to the checked fast path's), and the note is in the result, the cache and the notes the
    page shows; read back from the cache, the same note."""
    from cache import ResultCache
    from engine.progress import collect_notes
    original = organism.W_O
    monkeypatch.setattr(organism, "W_O", lambda layer: original(layer) * 1.01)
    cache = ResultCache(tmp_path / "c.duckdb")
    with collect_notes() as notes:
        got = operand_grid(organism, SPEC, cache=cache)
    assert got.fallback and "direct effects" in got.fallback and "textbook loop" in got.fallback
    assert "the heads' outputs through W_O" in got.fallback and got.fallback in notes
    assert torch.allclose(got.direct_head, grid.direct_head, atol=1e-4)
    assert torch.allclose(got.direct_mlp, grid.direct_mlp, atol=1e-4)
    with collect_notes() as notes:
        again = operand_grid(organism, SPEC, cache=cache)
    assert again.fallback == got.fallback and got.fallback in notes


def test_the_bundled_models_key_heads_read_the_larger_operand(organism, grid):
    for name in ("1.0", "1.1", "1.3"):
        d = pd.DataFrame(grid.rows(parse_component(name, 8, 8)))
        larger = d[d.a > d.b].attn_a.mean(), d[d.a < d.b].attn_b.mean()
        smaller = d[d.a > d.b].attn_b.mean(), d[d.a < d.b].attn_a.mean()
        assert min(larger) > 0.9 and max(smaller) < 0.1, (name, larger, smaller)
    rows = grid.rows(parse_component("1.3", 8, 8))
    assert {r["carry"] for r in rows} == {True, False}
    assert all(r["carry"] == (r["a"] + r["b"] >= 10) for r in rows)


@pytest.mark.parametrize("text, message", [("1.x", "names no component"), ("9.1", "layers 0-7"),
                                           ("1.8", "heads 0-7"), ("1.mlp.99999", "neurons 0-")])
def test_a_bad_component_says_what_the_model_has(text, message):
    with pytest.raises(PromptError, match=message):
        parse_component(text, 8, 8, 1024)


@pytest.mark.realmodel
def test_the_grid_on_smollm2_reads_the_operands_digit_tokens():
    """SmolLM2 writes each digit as its own token: the grid's attention on A / B is the END row at exactly the
    positions of A's and B's digits (found from the text's characters), and the answer token is the answer's
    first digit."""
    from tests.helpers.smollm2 import open_smollm2
    smol = open_smollm2()
    spec = PromptSetSpec(ops=("add",), n=40, operand_lo=2, operand_hi=5)
    grid = operand_grid(smol, spec)
    pairs = grid_pairs(smol.tokenizer, spec, grid_template(spec))
    assert len(pairs) == len(grid.a) == 16
    comp = grid.top_head()
    tok = smol.tokenizer
    for i in (1, 7, 14):
        p = pairs[i]
        assert tok.decode([p.answer_id]).strip() == str(p.answer)[0]
        enc = tok(p.ref_text, return_offsets_mapping=True)
        a_at = p.ref_text.index(str(p.a))
        b_at = p.ref_text.index(str(p.b), a_at + len(str(p.a)))
        pa, pb = ([j for j, (x, y) in enumerate(enc["offset_mapping"]) if y > x and x < s + n and y > s]
                  for s, n in ((a_at, len(str(p.a))), (b_at, len(str(p.b)))))
        assert [tok.decode([p.ref_ids[j]]).strip() for j in pa + pb] == [str(p.a), str(p.b)]
        _, c = smol.run_with_cache(torch.tensor([p.ref_ids]), None, [hooks.attn_pattern(comp.layer)])
        row = c[hooks.attn_pattern(comp.layer)][0, comp.head, -1]
        assert float(row[pa].sum()) == pytest.approx(float(grid.attn_a[i, comp.layer, comp.head]), abs=1e-4)
        assert float(row[pb].sum()) == pytest.approx(float(grid.attn_b[i, comp.layer, comp.head]), abs=1e-4)


def test_the_bundled_model_has_heuristic_neurons_tagged_held_out(organism, grid):
    from engine.techniques.heuristic_neurons import TAG_R2, end_activations, heuristic_neurons
    tags, layer = heuristic_neurons(organism, SPEC, top=20)
    assert layer == int(grid.mlp_effect.mean(0).argmin()) == 7
    tagged = [t for t in tags if t.tagged]
    assert tagged and all(t.r2 >= TAG_R2 for t in tagged)
    assert {"result tens digit", "result value"} & {t.tag for t in tagged}, tags
    assert [t.reaction for t in tags] == sorted((t.reaction for t in tags), reverse=True)
    # the activations it tags are the grid's own (one neuron, the same hook, batched vs the grid's pass)
    pairs = grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC))
    act = end_activations(organism, [p.ref_ids for p in pairs], 6)[:, 5]
    assert torch.allclose(act, torch.tensor(grid.neurons["6.mlp.5"]), atol=1e-5)


def test_the_tagged_neuron_circuit_is_checked_against_its_ends_and_a_plain_hook(organism):
    from dataclasses import replace as dc_replace

    from engine.techniques.heuristic_neurons import heuristic_neurons, neuron_circuit
    tags, layer = heuristic_neurons(organism, SPEC, top=20)
    c = neuron_circuit(organism, SPEC, tags)
    assert c.neurons == tuple(t.neuron for t in tags if t.tagged) and c.n_pairs == 81
    assert c.faithfulness.low <= c.faithfulness.value <= c.faithfulness.high
    assert 0 <= c.steering.low <= c.steering.value <= c.steering.high <= 1
    # f's denominator by hand: the margin of the model minus that with every neuron of the layer at its X_c mean
    from engine.techniques.heuristic_neurons import end_activations, end_margins
    grid = grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC))
    m_full, top = end_margins(organism, grid, layer, None)
    right = [q for q, t in zip(grid, top) if t == q.answer_id]
    mean_c = end_activations(organism, [q.cf_ids for q in grid], layer).mean(0)
    m_0, _ = end_margins(organism, right, layer, mean_c.expand(len(right), -1).clone())
    effect = m_full[[t == q.answer_id for q, t in zip(grid, top)]].mean() - m_0.mean()
    assert c.layer_effect.value == pytest.approx(effect, abs=1e-9)
    assert c.measurable == (c.layer_effect.low > 0)
    assert c.measurable  # on the bundled model the layer's neurons matter at END: its f is a result
    # every neuron of the layer kept: the model itself, f = 1; the circuit is never better than that here
    d_mlp = organism.facts.d_mlp
    every = [dc_replace(tags[0], neuron=n, tagged=True) for n in range(d_mlp)]
    assert neuron_circuit(organism, SPEC, every).faithfulness.value == pytest.approx(1.0, abs=1e-9)
    # steering one pair by hand: the tagged neurons at END set to their mean over the target answer's prompts
    pairs = grid_pairs(organism.tokenizer, SPEC, grid_template(SPEC))
    p, target = pairs[0], next(q for q in pairs[1:] if q.answer_id != pairs[0].answer_id)
    with_target = [q for q in pairs if q.answer == target.answer]
    keep = list(c.neurons)
    acts = []
    for q in with_target:
        _, cache = organism.run_with_cache(torch.tensor([q.ref_ids]), None, [hooks.mlp_post(layer)])
        acts.append(cache[hooks.mlp_post(layer)][0, -1, keep])
    mean = torch.stack(acts).mean(0)

    def set_neurons(act):
        act = act.clone()
        act[0, -1, keep] = mean.to(act.dtype)
        return act
    with organism.hooks([(hooks.mlp_post(layer), set_neurons)]):
        top = int(organism.logits(torch.tensor([p.ref_ids]))[0, -1].argmax())
    from engine.techniques.heuristic_neurons import end_margins
    new = torch.full((1, d_mlp), float("nan"))
    new[0, keep] = mean
    assert int(end_margins(organism, [p], layer, new)[1][0]) == top


@pytest.mark.realmodel
def test_direct_effects_on_gemma3_where_a_norm_follows_the_attention():
    """Gemma 3 normalises the attention's output before adding it: a head's direct effect goes through that norm
    (attn_branch(a) - attn_branch(a - o_h)), and equals the removal from the last stream computed on the model."""
    from tests.helpers.gemma3 import open_gemma3
    g = open_gemma3()
    assert not g.attn_branch_is_identity
    spec = PromptSetSpec(ops=("add",), n=40, operand_lo=2, operand_hi=4)
    grid = operand_grid(g, spec)
    pairs = grid_pairs(g.tokenizer, spec, grid_template(spec))
    L = g.facts.n_layers
    for i in (0, 5):
        for layer, head in ((L // 2, 1), (L - 1, 0), (L - 1, None)):
            got = grid.direct_head[i, layer, head] if head is not None else grid.direct_mlp[i, layer]
            want = reference_direct_effect(g, pairs[i], layer, head)
            assert float(got) == pytest.approx(want, abs=2e-3 * max(1.0, abs(want))), (i, layer, head)


def test_two_digit_operands_fold_onto_their_units_digits(organism):
    """The Atlas's units-digit grid (issue 49): on additions of 10..29 (400 pairs), each of the 100 cells is the mean of
    the 4 pairs whose A and B end in its digits -- checked against a plain fold of the rows with pandas --, the share
    answered right, and the units column's carry (a + b's units digits reach 10)."""
    from engine.techniques.operand_grid import units_rows
    spec = PromptSetSpec(ops=("add",), n=4, operand_lo=10, operand_hi=29)
    g = operand_grid(organism, spec, template="add.paper.0")
    rows = g.rows(g.top_head())
    folded = units_rows(rows, "add")
    assert len(rows) == 400 and len(folded) == 100 and {r["n"] for r in folded} == {4}
    df = pd.DataFrame(rows).assign(ua=lambda d: d["a"].astype(int) % 10, ub=lambda d: d["b"].astype(int) % 10)
    want = df.groupby(["ua", "ub"])[["effect", "direct", "attn_a", "attn_b", "right"]].mean()
    for r in folded:
        w = want.loc[(r["a"], r["b"])]
        for q in ("effect", "direct", "attn_a", "attn_b"):
            assert abs(r[q] - w[q]) < 1e-9 or (pd.isna(r[q]) and pd.isna(w[q])), (r, q)  # NaN: none of 4 had one
        assert r["right_share"] == w["right"] and r["right"] == (w["right"] >= 0.5)
        assert r["carry"] == (r["a"] + r["b"] >= 10)
