"""EAP against autograd through hand-patched plain runs; EAP-IG with one step is EAP."""

from __future__ import annotations

import pytest
import torch

from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
from engine.techniques.eap import eap
from engine.techniques.edges import edge_graph
from tests.helpers.plain_edges import PlainEdges, sample
from tests.integration.test_edges import plain_of
from tests.integration.tiny_models import build_tiny


@pytest.fixture(scope="module")
def bundled(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    edges = sample(edge_graph(organism), heads=9, others=5)
    return organism, pairs, edges, eap(organism, pairs, edges)


def worst_vs_autograd(backend, path, pairs, edges, raw) -> float:
    ref = PlainEdges(plain_of(backend, path), pairs)
    return max(float((raw.scores[i] - ref.derivative(e.name)).abs().max()) for i, e in enumerate(edges))


def test_eap_equals_autograd_on_bundled_model(bundled):
    backend, pairs, edges, raw = bundled
    assert float(raw.scores.abs().max()) > 1e-3  # not all zero
    assert worst_vs_autograd(backend, "models/organism", pairs, edges, raw) < 1e-5


def test_eap_ig_with_one_step_is_eap(bundled):
    backend, pairs, edges, raw = bundled
    few = [i for i, e in enumerate(edges) if e.receiver.kind != "head" or e.receiver.layer < 3]  # fewer passes
    sub = [edges[i] for i in few]
    one = eap(backend, pairs, sub).scores
    assert float((one - raw.scores[few]).abs().max()) < 1e-6  # (another edge set: sums in another order)
    assert torch.equal(eap(backend, pairs, sub, steps=1).scores, one)
    two = eap(backend, pairs, sub, steps=2)  # X_c half-way in: another estimate
    assert float((two.scores - one).abs().max()) > 1e-4
    with pytest.raises(ValueError):
        eap(backend, pairs, edges, steps=-1)


def test_a_layers_block_alone_gives_the_whole_passes_gradients_and_falls_back_when_it_misses(bundled, monkeypatch):
    """The senders' differences and the head inputs' gradients from each layer's block run alone (on X_r's stream,
    on the point's stream) equal those of whole passes (EAP-IG's interpolated points too, 1e-5) for less work; a
    block that misses the model's attention output or z falls back to whole passes and says so, with the same
    scores."""
    from engine.backends.base import WorkMeter
    from engine.cost import metered
    backend, pairs, edges, _ = bundled
    backend.meter = WorkMeter()
    alone = eap(backend, pairs, edges, steps=2)
    alone_fe = metered(backend.meter).fe(backend, pairs)
    assert alone.note is None and backend.runs_one_block
    cls = type(backend)
    real = cls.block_activations
    monkeypatch.setattr(cls, "runs_one_block", property(lambda self: False))
    backend.meter = WorkMeter()
    whole = eap(backend, pairs, edges, steps=2)
    whole_fe = metered(backend.meter).fe(backend, pairs)
    assert float((alone.scores - whole.scores).abs().max()) < 1e-5 and whole_fe > 2 * alone_fe
    monkeypatch.setattr(cls, "runs_one_block", property(lambda self: True))

    wrong = max(e.receiver.layer for e in edges if e.receiver.kind == "head")
    rows_of_gradients = 3 * backend.facts.n_heads * len(pairs)
    for only_gradients, check in ((False, "attention output"), (True, "z")):
        def off(self, calls, layer, resid_pre, names, only_gradients=only_gradients, **kw):
            # a block model wrong at one layer of the sample's heads (a scale would not do: the block's norm removes
            # it): in every call (the senders' differences catch it first), or only in the gradients' (3 H row blocks)
            bad = layer == wrong and (not only_gradients or resid_pre.shape[0] == rows_of_gradients)
            return real(self, calls, layer, resid_pre + (0.05 * resid_pre.roll(1, -1) if bad else 0), names, **kw)
        monkeypatch.setattr(cls, "block_activations", off)
        missed = eap(backend, pairs, edges, steps=2)
        assert missed.note is not None and f"block {wrong} run alone misses the model's {check}" in missed.note
        assert float((missed.scores - whole.scores).abs().max()) < 1e-5


def test_eap_equals_autograd_on_sandwich_norms(tmp_path):
    path = build_tiny("gemma3_text", tmp_path / "g")  # post-norms around attention and MLP: the MLP's input VJP
    backend = open_model(str(path), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add",), n=2, seed=1))
    edges = sample(edge_graph(backend), heads=6, others=6)
    assert worst_vs_autograd(backend, path, pairs, edges, eap(backend, pairs, edges)) < 1e-5


def test_eap_by_token_role_equals_autograd_at_those_positions(bundled):
    """Position-aware EAP: an edge's estimate at a token role is d logit / d eps with the edge sending eps times its
    difference at that role's positions only (autograd, 1e-5); the roles add up to the edge's EAP; an operand
    written before the operator scores exactly 0 there (X_r and X_c agree up to the operator)."""
    backend, pairs, edges, raw = bundled
    by = eap(backend, pairs, edges, by_role=True)  # scores [E, R, P]
    assert by.scores.shape == (len(edges), len(CIRCUIT_ROLES), len(pairs))
    assert float((by.scores.sum(1) - raw.scores).abs().max()) < 1e-5
    ref = PlainEdges(plain_of(backend, "models/organism"), pairs)
    width = max(len(p.ref_ids) for p in pairs)
    at = circuit_roles(backend, pairs, width)  # [P, width]
    worst = max(float((by.scores[i, r] - ref.derivative(e.name, at == r)).abs().max())
                for i, e in enumerate(edges) for r in range(len(CIRCUIT_ROLES)))
    assert worst < 1e-5, f"EAP by role vs autograd: {worst:.2e}"
    before = [i for i, p in enumerate(pairs)  # prompts whose operand A precedes the operator ("2 + 4 =")
              if CIRCUIT_ROLES.index("operand A") in at[i, :int((at[i] == CIRCUIT_ROLES.index("operator"))
                                                                   .nonzero()[0])].tolist()]
    assert before
    assert float(by.scores[:, CIRCUIT_ROLES.index("operand A"), before].abs().max()) == 0.0
    assert float(by.scores[:, CIRCUIT_ROLES.index("END")].abs().max()) > 1e-3
