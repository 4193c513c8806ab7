"""Batches by length (engine.machinery.batching.length_batches): the dynamic programme finds the cheapest cut of
the sorted lengths (checked against every cut of small cases), respects the row limit, and per-batch results go back
into the pairs' order."""

from __future__ import annotations

import itertools
import random

import torch

from engine.machinery.batching import in_pair_order, length_batches


def cost(lengths, groups, call):
    return sum(len(g) * max(lengths[i] for i in g) + call for g in groups)


def every_cut(lengths, rows, call):
    """The cheapest cost over every cut of the sorted lengths into consecutive runs of at most ``rows``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = float("inf")
    for mask in itertools.product((0, 1), repeat=len(order) - 1):
        groups, cur = [], [order[0]]
        for cut, i in zip(mask, order[1:]):
            if cut:
                groups.append(cur)
                cur = []
            cur.append(i)
        groups.append(cur)
        if all(len(g) <= rows for g in groups):
            best = min(best, cost(lengths, groups, call))
    return best


def test_length_batches_is_the_cheapest_cut():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 9)
        lengths = [rng.randint(1, 40) for _ in range(n)]
        rows, call = rng.randint(1, 5), rng.choice([0.0, 3.0, 25.0])
        got = length_batches(lengths, rows, call)
        assert sorted(i for g in got for i in g) == list(range(n))
        assert all(1 <= len(g) <= rows for g in got)
        assert abs(cost(lengths, got, call) - every_cut(lengths, rows, call)) < 1e-9


def test_no_padding_without_a_call_cost_and_one_batch_with_a_large_one():
    lengths = [5, 9, 5, 12, 9, 5]
    assert all(len({lengths[i] for i in g}) == 1 for g in length_batches(lengths, 64, 0.0))
    assert len(length_batches(lengths, 64, 1e6)) == 1


def test_results_return_in_the_pairs_order():
    index = [torch.tensor([2, 0]), torch.tensor([3, 1])]
    parts = [torch.tensor([[20.0], [0.0]]), torch.tensor([[30.0], [10.0]])]
    assert in_pair_order(index, parts).flatten().tolist() == [0.0, 10.0, 20.0, 30.0]
