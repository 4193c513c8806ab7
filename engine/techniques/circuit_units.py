"""Circuit units: what a circuit of MIB's residual graph keeps, at three resolutions, and how each is ranked.

A circuit is a set of kept *units*; every unit outside it is ablated (:mod:`engine.techniques.edge_faithfulness`
runs it: an ablated edge u -> v makes v read u's X_c value, or u's mean, instead of u's value in the run).  The
node circuits of :mod:`engine.techniques.faithfulness` ablate a component at every position; here:

* ``edge``           -- an edge u -> v (E units): ablated at every position;
* ``edge-position``  -- an edge at one token role (E x R units; R = 5 roles of
  :data:`engine.techniques.attention.CIRCUIT_ROLES`: operand A, operator, operand B, END, other): ablated at that
  role's positions only, so a circuit can keep a1.h3 -> logits at END and drop it at the operands
  (position-aware circuits, Haklay et al., ACL 2025);
* ``node-position``  -- a head or an MLP at one token role (N x R units, N = L H + L; the input is always kept, as
  in the node circuits): ablated, every edge out of it is ablated at that role's positions -- the component's
  output replaced there, what it computes elsewhere kept.

**Rankings.**  The position resolutions are scored from the edges' estimates split by role
(:func:`engine.techniques.eap.eap` with ``by_role``: EAP, EAP-IG): an edge at a role scores its own estimate; a
node at a role the sum of its out-edges' (the first-order estimate of replacing the node's output at those
positions: a sender's output enters every receiver after it, so the gradient with respect to it is the sum of
its receivers' input gradients).  ``exact`` scores each unit by its own patch (:mod:`engine.techniques.edges`):
an edge at a role by exact edge patching with the sender's difference at that role's positions only (R times the
edges' cost), a node at a role by X_r with the node's X_c output there -- the unit alone ablated, not a sum over
its edges (one row per node and role).  The random baseline draws random units of the same resolution.

**Sizes** are shares of the resolution's own units (5 % of the edge x position units is not 5 % of the edges);
:meth:`Units.edges_kept` turns kept units into the edges kept at each role ([C, E, R]) that the runner reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.backends.base import ModelBackend
from engine.techniques.attention import CIRCUIT_ROLES
from engine.techniques.edges import edge_graph
from engine.techniques.faithfulness import component_names

#: the resolutions of :func:`units_of`, with what the pages call them
RESOLUTIONS: dict[str, str] = {"edge": "edge", "edge-position": "edge × position",
                               "node-position": "node × position"}
#: the rankings each resolution can be scored by (edge_scores' names)
RANKINGS_AT: dict[str, tuple[str, ...]] = {"edge": ("exact", "eap", "eap-ig"),
                                           "edge-position": ("exact", "eap", "eap-ig"),
                                           "node-position": ("exact", "eap", "eap-ig")}


@dataclass(frozen=True)
class Units:
    """The U units of one resolution of a model's graph (E edges, R roles: 1 at edge resolution)."""

    resolution: str
    names: tuple[str, ...]  # [U] e.g. "a0.h1->a2.h0<q>", "a0.h1->a2.h0<q>@operator", "a0.h1@END"
    n_edges: int
    roles: int
    sender: np.ndarray      # [E] node-position: each edge's sender among the components (-1: the input); else []

    def __len__(self) -> int:
        return len(self.names)

    def edges_kept(self, kept: np.ndarray) -> np.ndarray:
        """Kept units [C, U] -> the edges kept at each role.  # [C, E, R] bool"""
        kept = np.asarray(kept, dtype=bool).reshape(-1, len(self.names))
        C = kept.shape[0]
        if self.resolution != "node-position":
            return kept.reshape(C, self.n_edges, self.roles)
        node = kept.reshape(C, -1, self.roles)  # [C, N, R]
        out = np.ones((C, self.n_edges, self.roles), dtype=bool)  # the input's edges: always kept
        own = self.sender >= 0
        out[:, own] = node[:, self.sender[own]]
        return out

    def scores(self, by_role: np.ndarray) -> np.ndarray:
        """Each unit's score from the edges' scores by role (module docstring).  by_role [E, R] -> [U]"""
        by_role = np.asarray(by_role, dtype=np.float64).reshape(self.n_edges, -1)
        if self.resolution == "edge":
            return by_role.sum(1)
        if self.resolution == "edge-position":
            return by_role.reshape(-1)
        own = self.sender >= 0
        out = np.zeros((len(self.names) // self.roles, self.roles))
        np.add.at(out, self.sender[own], by_role[own])
        return out.reshape(-1)


def units_of(backend: ModelBackend, resolution: str) -> Units:
    """The units of ``resolution`` (:data:`RESOLUTIONS`) on ``backend``'s graph, in graph order (edge-major, then
    role)."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}: choose from {', '.join(RESOLUTIONS)}")
    edges = edge_graph(backend)
    E = len(edges)
    if resolution == "edge":
        return Units(resolution, tuple(edges.names), E, 1, np.zeros(0, dtype=np.int64))
    if resolution == "edge-position":
        names = tuple(f"{n}@{r}" for n in edges.names for r in CIRCUIT_ROLES)
        return Units(resolution, names, E, len(CIRCUIT_ROLES), np.zeros(0, dtype=np.int64))
    comps = component_names(backend.facts.n_layers, backend.facts.n_heads)
    at = {n: i for i, n in enumerate(comps)}
    sender = np.array([at.get(e.sender.name, -1) for e in edges], dtype=np.int64)
    names = tuple(f"{n}@{r}" for n in comps for r in CIRCUIT_ROLES)
    return Units(resolution, names, E, len(CIRCUIT_ROLES), sender)


def check_ranking(resolution: str, ranking: str) -> None:
    """ValueError unless ``ranking`` scores ``resolution``'s units."""
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}: choose from {', '.join(RESOLUTIONS)}")
    if ranking not in RANKINGS_AT[resolution]:
        raise ValueError(f"the {RESOLUTIONS[resolution]} circuits are ranked by {', '.join(RANKINGS_AT[resolution])}"
                         f", not {ranking!r}")
