"""engine/machinery/components.py: the one reader of a typed component (the Atlas's and Intervene's)."""

from __future__ import annotations

import pytest

from engine.machinery.components import grid, parse_site


@pytest.mark.parametrize(("text", "want"), [("3.1", ("head", 3, 1)), (" 0.mlp ", ("mlp", 0, -1)),
                                            ("2.mlp.120", ("neuron", 2, 120)), ("3.resid", ("resid", 3, -1))])
def test_each_kind_is_read(text, want):
    assert parse_site(text, n_layers=4, n_heads=4, d_mlp=512, resid=True) == want


@pytest.mark.parametrize(("text", "says"), [("4.1", "layers 0-3, not 4"), ("3.4", "heads 0-3, not 4"),
                                            ("1.mlp.512", "neurons 0-511, not 512"), ("x", "names no component"),
                                            ("", "names no component"), ("1.2.3", "names no component")])
def test_a_bad_name_says_what_the_model_has(text, says):
    with pytest.raises(ValueError, match=says):
        parse_site(text, n_layers=4, n_heads=4, d_mlp=512, resid=True)


def test_a_residual_stream_only_where_asked_for():
    with pytest.raises(ValueError, match=r"LAYER\.mlp\.NEURON \(3\.mlp\.120\)$"):
        parse_site("1.resid", n_layers=4, n_heads=4)
    assert parse_site("1.mlp.99999", n_layers=4, n_heads=4) == ("neuron", 1, 99999)  # no d_mlp: not checked


def test_grid_places_heads_and_mlps():
    heads, mlps = grid([("head", 1, 0, 0.5), ("mlp", 0, -1, 2.0)], n_layers=2, n_heads=2)
    assert heads[1][0] == 0.5 and mlps == [2.0, pytest.approx(float("nan"), nan_ok=True)]
