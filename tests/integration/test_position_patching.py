"""Layer x position patching (engine/techniques/position_patching.py) against a plain one-forward-per-cell reference."""

from __future__ import annotations

import pytest
import torch

from engine.backends import hooks, open_model
from engine.backends.base import WorkMeter
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.position_patching import cached_layer_position_patching, layer_position_patching, summarize
from tests.helpers.smollm2 import open_smollm2
from tests.integration.tiny_models import build_tiny_model


def _plain_position_patching(backend, pairs, layers=None):
    """One hooked forward pass per pair, layer and position (nothing batched, nothing skipped)."""
    L = backend.facts.n_layers
    layers = range(L) if layers is None else layers
    out = []
    for p in pairs:
        ref = torch.tensor([p.ref_ids])
        names = [hooks.resid_pre(layer) for layer in range(L)]
        _, c_c = backend.run_with_cache(torch.tensor([p.cf_ids]), None, names)
        n = len(p.ref_ids)
        vals = torch.full((L, n), float("nan"))
        for layer in layers:
            for pos in range(n):
                def fn(act, layer=layer, pos=pos, c_c=c_c):
                    act[0, pos] = c_c[hooks.resid_pre(layer)][0, pos]
                    return act
                with torch.no_grad(), backend.hooks([(hooks.resid_pre(layer), fn)]):
                    vals[layer, n - 1 - pos] = backend.logits(ref)[0, -1, p.answer_id]
        out.append(vals)
    return out


def _check_positions(backend, pairs, layers=None, rows_per_pass=None):
    """Every cell (of ``layers``; default all) equals the plain reference to 1e-4 relative."""
    raw = layer_position_patching(backend, pairs, rows_per_pass=rows_per_pass or 3 * len(pairs))
    want = _plain_position_patching(backend, pairs, layers)
    scale = raw.logit_o.abs().clamp_min(1.0)
    sel = list(range(backend.facts.n_layers)) if layers is None else list(layers)
    for i, w in enumerate(want):
        got, w = raw.patched[i, sel, :w.shape[1]], w[sel]
        assert float(((got - w).abs() / scale[i]).max()) < 1e-4
        assert torch.isnan(raw.patched[i, :, w.shape[1]:]).all()  # shorter prompts: no cell
    return raw


def test_layer_position_patching_equals_plain_reference_on_bundled_model(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "div"), n=4, seed=3))
    raw = _check_positions(organism, pairs)
    # layer 0 differs only at the operator: every other cell there is exactly unpatched
    d = raw.metric("logit_diff")[:, 0]
    assert int((d.nan_to_num(0) != 0).sum(-1).max()) <= 2
    # the answer logit needs the operation: patching END at the last layer's input moves it (nearly) to X_c's
    # value; not exactly, since the last layer's own heads still read the unpatched positions (up to ~10 %)
    restored = raw.metric("restored")[:, -1, 0]
    assert float((restored - 1).abs().max()) < 0.15


def test_cells_run_from_their_position_on_either_backend():
    """A cell at position p runs positions p .. END only: both backends give the same cells, and the forward
    passes carry fewer positions than whole prompts would (X_r, X_c and the prefix included)."""
    pairs, _ = generate(open_model("organism", device="cpu").tokenizer,
                        PromptSetSpec(ops=("add", "mul"), n=3, seed=5))
    got, tokens = {}, {}
    for name in ("bridge", "nnsight"):
        model = open_model("organism", device="cpu", backend=name)
        model.meter = WorkMeter()
        got[name] = layer_position_patching(model, pairs).patched
        tokens[name] = model.meter.body_tokens
    a, b = got["bridge"], got["nnsight"]
    assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.allclose(a.nan_to_num(), b.nan_to_num(), atol=1e-4)
    L = a.shape[1]
    cells = int((~torch.isnan(a)).sum())  # an upper bound of the patched (prompt, cell) rows
    whole = cells * sum(len(p.ref_ids) for p in pairs) / len(pairs)
    assert tokens["bridge"] == tokens["nnsight"] < 0.6 * whole, (tokens, whole, L)


@pytest.mark.parametrize("arch", ("llama", "qwen2", "gpt2"))
def test_layer_position_patching_on_random_init(arch, tmp_path):
    backend = open_model(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add",), n=3, seed=1))
    _check_positions(backend, pairs)


def test_layer_position_patching_on_smollm2_labels_the_digit_position():
    smol = open_smollm2()
    pairs, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add",), n=1, seed=0))
    L = smol.facts.n_layers
    raw = _check_positions(smol, pairs[:1], layers=(0, 1, L // 2, L - 1), rows_per_pass=64)  # 30 layers: four checked
    tok = smol.tokenizer
    cells = summarize(raw, lambda ids: tok.convert_ids_to_tokens(list(ids)))
    end_label = {c.token for c in cells if c.group.startswith("template:") and c.rel == 0}
    assert end_label == {tok.convert_ids_to_tokens([pairs[0].ref_ids[-1]])[0]}
    assert tok.decode([pairs[0].answer_id]).strip().isdigit()  # END predicts the answer's digit


def test_cached_cells_are_served_from_cache(organism, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("sub",), n=3, seed=4))
    tokens = lambda ids: organism.tokenizer.convert_ids_to_tokens(list(ids))  # noqa: E731
    a, c1 = cached_layer_position_patching(organism, pairs, cache=cache, tokens=tokens)
    b, c2 = cached_layer_position_patching(organism, pairs, cache=cache, tokens=tokens)
    assert c1 and not c2 and a == b and any(c.token for c in b)
