"""Attribution patching: AtP equals plain autograd implementations of its definition; exact activation
patching equals one plain hooked forward pass per sender; the agreement statistics are right."""

from __future__ import annotations

import math

import pytest
import torch

from engine.backends import hooks, open_model
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attribution import (
    activation_patching,
    agreement,
    attribution,
    cached_attribution,
    path_atp,
    sender_rows,
    spearman,
    total_atp,
)
from tests.helpers.smollm2 import open_smollm2
from tests.integration.tiny_models import build_tiny_model


def _plain_atp(backend, pairs, frozen: bool):
    """d/d(alpha) of the answer logit when one sender's END output is z_r + alpha (z_c - z_r), at alpha = 0.

    One hooked forward pass per layer and kind: the sender activation gets a zero probe at END whose
    gradient is d logit / d activation; with ``frozen`` every head output is replaced by its detached X_r
    value, so no gradient flows through any other head (path patching's definition)."""
    f = backend.facts
    L, H = f.n_layers, f.n_heads
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))]
    ref, mask, end = pad([p.ref_ids for p in pairs], pad_id(backend))
    cf, _, _ = pad([p.cf_ids for p in pairs], pad_id(backend))
    rows = torch.arange(len(pairs))
    answer = torch.tensor([p.answer_id for p in pairs])
    with torch.no_grad():
        lg, c_r = backend.run_with_cache(ref, mask, names)
        _, c_c = backend.run_with_cache(cf, mask, names)
    lo = lg[rows, end, answer].float()
    heads = torch.empty(len(pairs), L, H)
    mlps = torch.empty(len(pairs), L)
    for layer in range(L):
        for kind in ("head", "mlp"):
            name = hooks.attn_z(layer) if kind == "head" else hooks.mlp_out(layer)
            probe = torch.zeros_like(c_r[name][rows, end], requires_grad=True)

            def add_probe(act, probe=probe):
                return act + _scatter(act, probe, rows, end)

            edits = []
            if frozen:
                for j in range(L):
                    frozen_z = c_r[hooks.attn_z(j)].clone()
                    if kind == "head" and j == layer:
                        edits.append((hooks.attn_z(j),
                                      lambda act, v=frozen_z, probe=probe: v + _scatter(v, probe, rows, end)))
                    else:
                        edits.append((hooks.attn_z(j), lambda act, v=frozen_z: v))
                if kind == "mlp":
                    edits.append((name, add_probe))
            else:
                edits.append((name, add_probe))
            with torch.enable_grad(), backend.hooks(edits):
                out = backend.logits(ref, mask)[rows, end, answer].float()
                (g,) = torch.autograd.grad(out.sum(), [probe])
            delta = (c_c[name] - c_r[name])[rows, end]
            if kind == "head":
                heads[:, layer] = lo[:, None] + (g * delta).sum(-1)
            else:
                mlps[:, layer] = lo + (g * delta).sum(-1)
    return lo, heads, mlps


def _scatter(act, probe, rows, end):
    full = torch.zeros_like(act)
    return full.index_put((rows, end), probe.to(act.dtype))


def _check(raw, lo, heads, mlps, tol):
    scale = lo.abs().clamp_min(1.0)[:, None]
    assert float(((raw.head_logit - heads).abs() / scale[:, :, None]).max()) < tol
    assert float(((raw.mlp_logit - mlps).abs() / scale).max()) < tol


@pytest.fixture(scope="module")
def organism_pairs(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=3, seed=5))
    return pairs


def test_path_atp_equals_plain_autograd_on_bundled_model(organism, organism_pairs):
    raw = path_atp(organism, organism_pairs, batch_size=5)
    _check(raw, *_plain_atp(organism, organism_pairs, frozen=True), tol=1e-5)


def test_total_atp_equals_plain_autograd_on_bundled_model(organism, organism_pairs):
    raw = total_atp(organism, organism_pairs, batch_size=5)
    _check(raw, *_plain_atp(organism, organism_pairs, frozen=False), tol=1e-5)


def test_activation_patching_equals_one_forward_per_sender(organism, organism_pairs):
    raw = activation_patching(organism, organism_pairs, rows_per_pass=30)
    f = organism.facts
    names = [hooks.attn_z(3), hooks.mlp_out(2)]
    ref, mask, end = pad([p.ref_ids for p in organism_pairs], pad_id(organism))
    cf, _, _ = pad([p.cf_ids for p in organism_pairs], pad_id(organism))
    rows = torch.arange(len(organism_pairs))
    answer = torch.tensor([p.answer_id for p in organism_pairs])
    _, c_c = organism.run_with_cache(cf, mask, names)
    for name, head in ((hooks.attn_z(3), 5), (hooks.mlp_out(2), None)):
        def fn(act, name=name, head=head):
            if head is None:
                act[rows, end] = c_c[name][rows, end]
            else:
                act[rows, end, head] = c_c[name][rows, end, head]
            return act
        with torch.no_grad(), organism.hooks([(name, fn)]):
            want = organism.logits(ref, mask)[rows, end, answer]
        got = raw.head_logit[:, 3, 5] if head is not None else raw.mlp_logit[:, 2]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    assert raw.head_logit.shape == (len(organism_pairs), f.n_layers, f.n_heads)


@pytest.mark.parametrize("arch", ("llama", "qwen2", "gpt2"))
def test_atp_equals_plain_autograd_on_random_init(arch, tmp_path):
    backend = open_model(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "mul"), n=3, seed=1))
    _check(path_atp(backend, pairs), *_plain_atp(backend, pairs, frozen=True), tol=1e-5)
    _check(total_atp(backend, pairs), *_plain_atp(backend, pairs, frozen=False), tol=1e-5)


def test_atp_on_smollm2_at_the_digit_position():
    smol = open_smollm2()
    pairs, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add",), n=2, seed=0))
    for p in pairs:  # the analysed position predicts a digit
        assert smol.tokenizer.decode([p.answer_id]).strip().isdigit()
    _check(path_atp(smol, pairs), *_plain_atp(smol, pairs, frozen=True), tol=1e-4)


def test_spearman_and_agreement():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # ties: average ranks
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    from engine.techniques.attribution import SenderRow
    rows = [SenderRow("head", 0, h, {"exact": e, "atp": a})
            for h, (e, a) in enumerate([(-5, -1), (-4, -4), (-3, -5), (0, 0), (1, -2)])]
    ag = agreement(rows, ks=(2,))
    assert ag.overlap[2] == 1 and ag.missed[2] == ["L0H0"] and ag.invented[2] == ["L0H2"]
    assert ag.max_abs_error == pytest.approx(4.0)


def test_cached_attribution_is_served_from_cache(organism, organism_pairs, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    t1, c1 = cached_attribution(organism, organism_pairs, cache=cache)
    t2, c2 = cached_attribution(organism, organism_pairs, cache=cache)
    assert c1 and not c2
    assert set(t2.kinds()) == {"exact", "atp", "exact_total", "atp_total"}
    raw = attribution(organism, organism_pairs)
    direct = {r.name: r.values for r in sender_rows(raw)}
    for r in t2.rows["effect"]:
        for k, v in r.values.items():
            assert v == pytest.approx(direct[r.name][k], rel=1e-6, abs=1e-9)
    assert set(t2.seconds) == {"exact", "atp", "exact_total", "atp_total"}
