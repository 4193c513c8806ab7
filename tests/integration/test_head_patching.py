"""Head -> head path patching against a one-forward-per-sender reference written out plainly."""

from __future__ import annotations

import pytest
import torch

from engine.backends import hooks, open_model
from engine.backends.base import WorkMeter
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.head_patching import (
    Receiver,
    cached_head_path_patching,
    head_path_patching,
    head_path_patching_reference,
    parse_receiver,
    senders_before,
)
from tests.helpers.smollm2 import open_smollm2
from tests.integration.tiny_models import build_tiny_model


def _reference(backend, pairs, receiver, senders):
    """For each pair and sender: two forward passes of that prompt alone, hooks written out directly -- the
    receiver's output recorded with the sender patched (every other head frozen, its other inputs frozen), then
    passed on alone (every head frozen, the receiver's output the recorded one)."""
    L = backend.facts.n_layers
    lr, hr = receiver.layer, receiver.head
    qkv = {"q": hooks.attn_q(lr), "k": hooks.attn_k(lr), "v": hooks.attn_v(lr)}
    names = [n for layer in range(L) for n in (hooks.attn_z(layer), hooks.mlp_out(layer))] + list(qkv.values())
    out = torch.empty(len(pairs), len(senders))
    for i, p in enumerate(pairs):
        ref = torch.tensor([p.ref_ids])
        _, c_r = backend.run_with_cache(ref, None, names)
        _, c_c = backend.run_with_cache(torch.tensor([p.cf_ids]), None, names)
        for j, s in enumerate(senders):
            recorded = {}
            edits = []
            for layer in range(L):
                z = c_r[hooks.attn_z(layer)].clone()
                if s.component == "head" and s.layer == layer:
                    z[0, -1, s.head] = c_c[hooks.attn_z(layer)][0, -1, s.head]

                def fz(act, z=z, layer=layer, recorded=recorded):
                    keep = act[0, :, hr].clone()
                    act[...] = z
                    if layer == lr:
                        act[0, :, hr] = keep
                        recorded["z"] = keep
                    return act
                edits.append((hooks.attn_z(layer), fz))
            if s.component == "mlp":
                m = c_r[hooks.mlp_out(s.layer)].clone()
                m[0, -1] = c_c[hooks.mlp_out(s.layer)][0, -1]
                edits.append((hooks.mlp_out(s.layer), lambda act, m=m: m))
            for inp, name in qkv.items():
                if inp != receiver.input:
                    edits.append((name, lambda act, v=c_r[name]: v))
            with torch.no_grad(), backend.hooks(edits):
                backend.logits(ref)
            passed_on = []
            for layer in range(L):
                z = c_r[hooks.attn_z(layer)].clone()
                if layer == lr:
                    z[0, :, hr] = recorded["z"]
                passed_on.append((hooks.attn_z(layer), lambda act, z=z: z.clone()))
            with torch.no_grad(), backend.hooks(passed_on):
                out[i, j] = backend.logits(ref)[0, -1, p.answer_id]
    return out


def _check(backend, pairs, receiver, every=1):
    raw = head_path_patching(backend, pairs, receiver, rows_per_pass=3 * len(pairs))
    senders = senders_before(receiver, backend.facts.n_heads)[::every]
    want = _reference(backend, pairs, receiver, senders)
    scale = raw.logit_o.abs().clamp_min(1.0)
    for j, s in enumerate(senders):
        got = raw.head_logit[:, s.layer, s.head] if s.component == "head" else raw.mlp_logit[:, s.layer]
        assert float(((got - want[:, j]).abs() / scale).max()) < 1e-4, s
    assert torch.isnan(raw.head_logit[:, receiver.layer:]).all()
    return raw


@pytest.mark.parametrize("inp", ("q", "k", "v"))
def test_head_to_head_equals_reference_on_bundled_model(organism, inp):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=6))
    raw = _check(organism, pairs, Receiver(3, 1, inp))
    moved = (raw.head_logit[:, :3] - raw.logit_o[:, None, None]).abs()
    if inp in ("k", "v"):
        # only END's own key / value moves, which changes only END's attention to itself: almost nothing passes --
        # while the senders' own writes move the logit (read by path patching, not here)
        from engine.techniques.path_patching import path_patching
        direct = (path_patching(organism, pairs).head_logit[:, :3] - raw.logit_o[:, None, None]).abs()
        assert float(moved.max()) < 1e-3 < float(direct.max())
    else:
        assert float(moved.max()) > 1e-3  # some sender reaches the logit through this receiver


@pytest.mark.parametrize("arch", ("llama", "qwen2", "gpt2"))
def test_head_to_head_on_random_init(arch, tmp_path):
    backend = open_model(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add",), n=2, seed=1))
    _check(backend, pairs, Receiver(backend.facts.n_layers - 1, 0, "q"))


def test_head_to_head_on_smollm2():
    smol = open_smollm2()
    pairs, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add",), n=1, seed=0))
    assert smol.tokenizer.decode([pairs[0].answer_id]).strip().isdigit()
    _check(smol, pairs, Receiver(3, 2, "q"), every=5)


@pytest.mark.parametrize("backend", ("bridge", "nnsight"))
def test_each_row_runs_the_end_token_alone(backend):
    """The floor: besides X_r, X_c and one prefix per prompt length, the forward passes carry one
    position per (sender, prompt) row -- and give the textbook loop's numbers on either backend."""
    model = open_model("organism", device="cpu", backend=backend)
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub"), n=3, seed=4))
    lengths = {len(p.ref_ids) for p in pairs}
    assert len(lengths) > 1  # several prompt lengths: several chunks
    receiver = Receiver(4, 2, "k")
    model.meter = WorkMeter()
    raw = head_path_patching(model, pairs, receiver)
    rows = len(senders_before(receiver, model.facts.n_heads)) * len(pairs)
    whole = sum(3 * len(p.ref_ids) - 1 for p in pairs)  # X_r, X_c and the prefix before END
    checks = len(pairs)  # the self-check: every prompt's END token continued once with no edit
    assert model.meter.body_tokens == whole + 2 * (rows + checks)  # steps 2 and 3, each checked
    assert raw.fallback is None
    want = head_path_patching_reference(model, pairs, receiver)
    done = ~torch.isnan(want.head_logit)
    assert torch.allclose(raw.head_logit[done], want.head_logit[done], atol=1e-4)
    assert torch.allclose(raw.mlp_logit[:, :4], want.mlp_logit[:, :4], atol=1e-4)
    assert torch.allclose(raw.logit_o, want.logit_o, atol=1e-4)


def test_parse_receiver_and_cache(organism, tmp_path):
    assert parse_receiver("3.1", 6, 8) == Receiver(3, 1, "q")
    assert parse_receiver(" 5.7:v ", 6, 8) == Receiver(5, 7, "v")
    for bad in ("0.1:q", "6.0", "3.8", "3.1:x", "three"):
        with pytest.raises(ValueError):
            parse_receiver(bad, 6, 8)
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("sub",), n=3, seed=2))
    a, c1 = cached_head_path_patching(organism, pairs, Receiver(2, 0), cache=cache)
    b, c2 = cached_head_path_patching(organism, pairs, Receiver(2, 0), cache=cache)
    assert c1 and not c2 and sorted(map(str, a)) == sorted(map(str, b))
    assert {v.layer for v in b} == {0, 1}
