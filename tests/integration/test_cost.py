"""engine/cost.py: each heavy technique's work, counted from its code before it runs, against what the backend's
WorkMeter counts when it runs (bundled model, a small set).

Tolerances: the counts that walk the same batches, chunks and passes as the code are exact (calls, positions
through the blocks, positions unembedded); those stated as "at most" (layer x position patching counts every cell,
the shifts of the Numbers page count every prompt as moved) must not undercount and stay within 3x; the
faithfulness plan runs on stand-in orders for its two rankings (the sets differ, not their number): within 15 %.
The END chains' MLP rows, which the meter does not see, are checked against ``bench/work.py``'s counter.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.cost import (
    HEAVY_S,
    PRIOR_FACTOR,
    Cost,
    Work,
    estimate,
    for_kind,
    metered,
    observe,
    observed_factor,
    pass_timing,
)
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import forget_scores, keep_correct

pytestmark = pytest.mark.slow
SPEC = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=4, seed=3)


@pytest.fixture(scope="module")
def pairs(organism):
    return keep_correct(organism, generate(organism.tokenizer, SPEC)[0])


def counted(model, run) -> Work:
    model.meter = WorkMeter()
    run()
    return metered(model.meter)


def forward(w: Work) -> tuple[int, int, int]:
    return w.calls, w.body, w.unembed


def test_filter_and_scoring(organism):
    from engine.techniques.accuracy import first_token_right, score_pairs, scoring_work
    gen, _ = generate(organism.tokenizer, SPEC)
    forget_scores()
    assert forward(counted(organism, lambda: first_token_right(organism, gen))) == forward(
        scoring_work(organism, gen, full=False))
    forget_scores()
    assert forward(counted(organism, lambda: score_pairs(organism, gen))) == forward(scoring_work(organism, gen))


def test_path_patching_and_its_chains(pairs):
    from bench.work import Counter
    from engine.techniques.path_patching import path_patching, path_patching_work
    model = open_model("organism", device="cpu")  # wrapped by the counter: its own copy
    c = Counter()
    c.attach(model)
    path_patching(model, pairs)
    w = path_patching_work(model, pairs)
    assert (c.calls, c.body, c.unembed) == forward(w)
    assert abs(c.mlp_rows - w.mlp_rows) <= 0.01 * w.mlp_rows  # the chains' rows (the self-check's few not counted)


def test_path_patching_and_path_atp_where_the_blocks_do_not_run_piece_by_piece(organism, pairs, monkeypatch):
    """A model whose blocks cannot be run piece by piece (known before anything runs): path patching runs the
    textbook loop, path AtP the hooked gradient, the direct effects their loop -- and the counts are theirs, not the
    END chains' (counted until 2026-12-05: 2 passes and 480 positions for path patching where its loop ran 11 and
    17,760 here, so a page could start it unasked)."""
    from engine.techniques.attribution import path_atp, path_atp_work
    from engine.techniques.operand_grid import direct_effects, direct_effects_work
    from engine.techniques.path_patching import path_patching, path_patching_work
    monkeypatch.setattr(organism, "components_fail", lambda: "a block that takes the residual as an argument")
    raws = []
    got = counted(organism, lambda: raws.append(path_patching(organism, pairs)))
    assert raws[0].fallback and forward(got) == forward(path_patching_work(organism, pairs))
    got = counted(organism, lambda: raws.append(path_atp(organism, pairs)))
    w = path_atp_work(organism, pairs)
    assert raws[1].fallback and forward(got) == forward(w) and w.backward == w.body // 3 and w.mlp_rows == 0
    got = counted(organism, lambda: raws.append(direct_effects(organism, pairs)))
    assert raws[2].fallback and forward(got) == forward(direct_effects_work(organism, pairs))


def test_knockouts_means_and_the_curve(organism, pairs):
    from engine.techniques.knockout import (
        forget_means,
        knockout_end,
        knockout_end_work,
        mean_activations,
        mean_activations_work,
    )
    from engine.techniques.knockout_curve import curve_knockouts
    forget_means()
    w = mean_activations_work(organism, pairs)
    assert forward(counted(organism, lambda: mean_activations(organism, pairs))) == forward(w)
    assert mean_activations_work(organism, pairs) == Work()  # memoised: nothing to run
    means = mean_activations(organism, pairs)
    L, H = organism.facts.n_layers, organism.facts.n_heads
    kos = [ko for _, top, rand in curve_knockouts(L, H, [(1, 3), (5, 5), (1, 1)], k_max=3, draws=4)
           for ko in [top, *rand]]
    assert forward(counted(organism, lambda: knockout_end(organism, pairs, kos, means))) == forward(
        knockout_end_work(organism, pairs, kos))
    assert forward(counted(organism, lambda: knockout_end(organism, pairs, kos, None))) == forward(
        knockout_end_work(organism, pairs, kos, mean=False))


def test_attribution_head_to_head_and_the_lens(organism, pairs):
    from engine.techniques.attribution import attribution, attribution_work
    from engine.techniques.head_patching import Receiver, head_path_patching, head_path_patching_work
    from engine.techniques.logit_lens import logit_lens, logit_lens_work
    assert forward(counted(organism, lambda: attribution(organism, pairs))) == forward(
        attribution_work(organism, pairs))
    rec = Receiver(5, 5, "q")
    assert forward(counted(organism, lambda: head_path_patching(organism, pairs, rec))) == forward(
        head_path_patching_work(organism, pairs, rec))
    got, w = counted(organism, lambda: logit_lens(organism, pairs)), logit_lens_work(organism, pairs)
    assert (got.calls, got.body) == (w.calls, w.body)  # and every layer's END stream unembedded besides
    assert w.unembed == got.unembed + len(pairs) * (organism.facts.n_layers + 1)


def test_upper_bounds_position_patching_and_the_numbers_shifts(organism, pairs):
    from engine.techniques.helix_patch import helix_patch, helix_patch_work
    from engine.techniques.numbers import causal_check, causal_check_work, forget_residuals
    from engine.techniques.position_patching import layer_position_patching, position_patching_work
    for run, w in ((lambda: layer_position_patching(organism, pairs), position_patching_work(organism, pairs)),
                   (lambda: (forget_residuals(), helix_patch(organism, pairs, 4)), helix_patch_work(organism, pairs)),
                   (lambda: (forget_residuals(), causal_check(organism, pairs, 4)),
                    causal_check_work(organism, pairs))):
        forget_residuals()
        got = counted(organism, run)
        assert got.body <= w.body <= 3 * got.body and got.calls <= w.calls <= 3 * got.calls, (got, w)


def test_faithfulness_and_transfer(organism, pairs):
    from engine.techniques.faithfulness import cached_faithfulness, faithfulness_work
    from engine.techniques.knockout import forget_means
    from engine.techniques.transfer import transfer, transfer_work
    for ablation in ("counterfactual",):  # mean ablation: the knockouts above
        forget_means()
        w = faithfulness_work(organism, pairs, ablation=ablation)
        got = counted(organism, lambda a=ablation: cached_faithfulness(organism, pairs, ablation=a))
        assert got.calls == w.calls and abs(got.body - w.body) <= 0.15 * got.body, (ablation, got, w)
    half = len(pairs) // 2
    forget_means()
    w = transfer_work(organism, pairs[:half], pairs[half:])
    assert forward(counted(organism, lambda: transfer(organism, pairs[:half], pairs[half:], k=3))) == forward(w)


def test_the_atlas_grid_neurons_and_their_circuit(organism, tmp_path):
    from cache import ResultCache
    from engine.techniques.heuristic_neurons import (
        heuristic_neurons,
        heuristic_neurons_work,
        neuron_circuit,
        neuron_circuit_work,
    )
    from engine.techniques.operand_grid import operand_grid, operand_grid_work
    cache = ResultCache(tmp_path / "c.duckdb")
    w, grid = operand_grid_work(organism, SPEC, cache=cache)
    assert forward(counted(organism, lambda: operand_grid(organism, SPEC, cache=cache))) == forward(w)
    assert operand_grid_work(organism, SPEC, cache=cache)[0] == Work()  # cached: nothing to run
    w, _ = heuristic_neurons_work(organism, SPEC, layer=6, cache=cache)
    assert forward(counted(organism, lambda: heuristic_neurons(organism, SPEC, layer=6, cache=cache))) == forward(w)
    tags, _ = heuristic_neurons(organism, SPEC, layer=6, cache=cache)
    assert counted(organism, lambda: heuristic_neurons(organism, SPEC, layer=6, cache=cache)) == Work()  # cached
    tags = [dataclasses.replace(t, tagged=True) for t in tags[:5]]
    w, _ = neuron_circuit_work(organism, SPEC, tags, cache=cache)
    first = neuron_circuit(organism, SPEC, tags, cache=cache)
    assert counted(organism, lambda: neuron_circuit(organism, SPEC, tags, cache=cache)) == Work()  # cached
    assert neuron_circuit(organism, SPEC, tags, cache=cache) == first
    assert forward(counted(organism, lambda: neuron_circuit(organism, SPEC, tags))) == forward(w)
    assert len(grid) == 81  # operands 1 to 9: the grid's unit


def test_estimates_label_and_learn_from_what_they_measure(organism, pairs):
    t = pass_timing(organism)
    assert t is pass_timing(organism) and t.call_s >= 0 and t.position_s > 0  # measured once, kept on the backend
    w = Work(10, 10 * 40, 10)
    c = estimate(organism, pairs, w)
    assert c.seconds > 0 and c.forward_equivalents > 0
    assert Cost(60.4, 41.0).label() == "estimated: about 41 s, 60 forward passes of the set"
    assert Cost(0.5, 200).label() == "estimated: about 3 min, less than one forward pass of the set"
    assert Cost(1.0, HEAVY_S + 1).heavy and not Cost(1.0, HEAVY_S).heavy
    assert observed_factor(organism) == observed_factor(organism, "curve") == PRIOR_FACTOR  # nothing observed yet
    observe(organism, Cost(1.0, 1.0), 4.0, kind="curve")  # four times slower than estimated: half way (log scale)
    assert observed_factor(organism) == observed_factor(organism, "curve") == pytest.approx(2 * PRIOR_FACTOR)
    assert estimate(organism, pairs, w).seconds == pytest.approx(2 * c.seconds)
    observe(organism, Cost(1.0, 2 * PRIOR_FACTOR), 0.5, kind="lens")  # half its passes' own estimate
    assert observed_factor(organism, "lens") == pytest.approx((2 * PRIOR_FACTOR * 0.5) ** 0.5)
    assert observed_factor(organism) == pytest.approx((2 * PRIOR_FACTOR * 0.5) ** 0.5)  # all computations too
    assert observed_factor(organism, "curve") == pytest.approx(2 * PRIOR_FACTOR)  # another view keeps its own
    # a view not measured: the factor of all, but never below the prior (here all is below it)
    assert observed_factor(organism) < PRIOR_FACTOR and observed_factor(organism, "other") == PRIOR_FACTOR
    lens = estimate(organism, pairs, w)
    assert for_kind(organism, lens, "lens").seconds == pytest.approx(
        lens.seconds * observed_factor(organism, "lens") / observed_factor(organism))
    before = dict(organism.cost_factors)
    observe(organism, Cost(1.0, 0.01), 100.0)  # too short to teach anything
    assert organism.cost_factors == before
    observe(organism, Cost(1.0, 1.0), 16.0, kind="curve")  # a slow machine: all above the prior
    assert observed_factor(organism) > PRIOR_FACTOR
    assert observed_factor(organism, "other") == observed_factor(organism)  # then a view not measured takes it
    del organism.cost_factors


def test_a_timing_taken_under_load_is_corrected_before_a_page_asks_on_its_strength(organism):
    from engine.cost import RETIME_AFTER_S, PassTiming, retime
    pass_timing(organism)
    assert not retime(organism)  # just timed: nothing to do
    organism.pass_timing = slow = PassTiming(5.0, 1.0, 1.0)  # as if timed while the machine was busy
    organism.pass_timed_at -= RETIME_AFTER_S + 1
    assert retime(organism)
    t = pass_timing(organism)
    assert t.call_s < slow.call_s and t.position_s < slow.position_s and t.mlp_row_s < slow.mlp_row_s
