"""The forward work of exact edge patching and EAP / EAP-IG, counted from the code, against the backend's WorkMeter."""

from __future__ import annotations

import pytest

from engine.backends.base import WorkMeter
from engine.cost import metered
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.eap import eap, eap_work
from engine.techniques.edges import edge_graph, edge_patching, edge_patching_work, node_patching, node_patching_work
from tests.helpers.plain_edges import sample

#: a set whose every token role reaches END, and one where two do not ("1 + 4 =" vs "1 > 4 =": operand A and the first
#: token precede the change; their rows are not run and not counted)
SETS = {"mixed": {}, "symbols": {"templates": ("add:{A} [+] {B} =", "mul:{A} [*] {B} =")}}


@pytest.fixture(scope="module", params=sorted(SETS))
def setup(organism, request):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=5, **SETS[request.param]))
    return organism, pairs, sample(edge_graph(organism), heads=6, others=4)


def counted(model, run):
    model.meter = WorkMeter()
    run()
    w = metered(model.meter)
    return w.calls, w.body, w.unembed, w.layers, w.attention


@pytest.mark.parametrize("by_role", [False, True])
def test_exact_edge_patching_work(setup, by_role):
    model, pairs, edges = setup
    w = edge_patching_work(model, pairs, edges, by_role=by_role, rows_per_pass=32)
    assert counted(model, lambda: edge_patching(model, pairs, edges, by_role=by_role, rows_per_pass=32)) == \
        (w.calls, w.body, w.unembed, w.layers, w.attention)


def test_exact_node_patching_work(setup):
    """Every head and MLP at every token role (the exact ranking of node x position circuits)."""
    model, pairs, _ = setup
    w = node_patching_work(model, pairs, rows_per_pass=32)
    assert counted(model, lambda: node_patching(model, pairs, rows_per_pass=32)) == \
        (w.calls, w.body, w.unembed, w.layers, w.attention)


@pytest.mark.parametrize("steps", [0, 2])
def test_eap_work(setup, steps):
    model, pairs, edges = setup
    w = eap_work(model, pairs, edges, steps=steps)
    got = counted(model, lambda: eap(model, pairs, edges, steps=steps))
    assert got[:3] == (w.calls, w.body, w.unembed)
    # the blocks alone stop at z or the attention's output: counted as attention, their backward in it (x 1 + 2)
    assert (got[3], got[4]) != (0, 0) and got[3] == w.layers
    assert w.attention > got[4] > 0 and w.backward > 0
