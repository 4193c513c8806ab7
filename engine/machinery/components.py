"""The components a technique reports on -- every head (layer, head) and every layer's MLP (head = -1) -- and
the three shapes their values take: long rows (what a technique stores: one per component, group and metric),
the grid the heatmap draws (heads [L][H] and MLPs [L]) and wide rows (a CSV: one per component, a column per
metric or kind).  Path patching, head -> head, attribution patching and the report read and write them here;
no torch, so ``views/`` (the heatmap frame) reads them too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

#: ``3.1`` (a head), ``3.mlp`` (an MLP), ``3.mlp.120`` (one MLP neuron), ``3.resid`` (a residual stream)
_SITE = re.compile(r"^(\d{1,4})\.(?:(\d{1,4})|mlp(?:\.(\d{1,6}))?|(resid))$")


@dataclass(frozen=True)
class Component:
    """A head or a layer's MLP; techniques' row types extend it with their fields."""

    component: str  # "head" | "mlp"
    layer: int
    head: int       # -1 for MLPs

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}" if self.component == "head" else f"MLP{self.layer}"


def site_name(layer: int, head: int) -> str:
    """The typed name of a head (``1.3``) or of a layer's MLP (``head`` < 0: ``1.mlp``), as :func:`parse_site` reads
    it and pins are kept (``engine.findings.notes``)."""
    return f"{layer}.mlp" if head < 0 else f"{layer}.{head}"


def parse_site(text: str, n_layers: int, n_heads: int, d_mlp: int | None = None, resid: bool = False
               ) -> tuple[str, int, int]:
    """``3.1`` / ``3.mlp`` / ``3.mlp.120`` (and ``3.resid`` when ``resid``) -> ``(kind, layer, index)`` with kind
    "head" | "mlp" | "neuron" | "resid" and index the head or neuron (-1 otherwise); ValueError saying what to
    write or what the model has.  The one reader of a typed component for the Atlas and Intervene."""
    m = _SITE.match((text or "").strip())
    if m is None or (m.group(4) and not resid):
        kinds = "LAYER.HEAD (3.1), LAYER.mlp (3.mlp)" + (", LAYER.mlp.NEURON (3.mlp.120) or LAYER.resid (3.resid)"
                                                        if resid else " or LAYER.mlp.NEURON (3.mlp.120)")
        raise ValueError(f"{text!r} names no component: write {kinds}")
    layer = int(m.group(1))
    if layer >= n_layers:
        raise ValueError(f"the model has layers 0-{n_layers - 1}, not {layer}")
    if m.group(2) is not None:
        if int(m.group(2)) >= n_heads:
            raise ValueError(f"the model has heads 0-{n_heads - 1}, not {m.group(2)}")
        return "head", layer, int(m.group(2))
    if m.group(3) is not None:
        if d_mlp is not None and int(m.group(3)) >= d_mlp:
            raise ValueError(f"the MLPs have neurons 0-{d_mlp - 1}, not {m.group(3)}")
        return "neuron", layer, int(m.group(3))
    return ("resid" if m.group(4) else "mlp"), layer, -1


def grid(cells: Iterable[tuple[str, int, int, float]], n_layers: int, n_heads: int
         ) -> tuple[list[list[float]], list[float]]:
    """(heads [L][H], mlps [L]) of ``(component, layer, head, value)`` cells; missing ones nan."""
    heads = [[float("nan")] * n_heads for _ in range(n_layers)]
    mlps = [float("nan")] * n_layers
    for component, layer, head, value in cells:
        if component == "head":
            heads[layer][head] = value
        elif component == "mlp":
            mlps[layer] = value
    return heads, mlps


def wide_rows(values: Iterable[Any], column: str = "metric", keep: Callable[[Any], bool] = lambda v: True,
              first: Callable[[Any], dict[str, Any]] = lambda v: {}) -> list[dict[str, Any]]:
    """One dict per component of long rows (``component``, ``layer``, ``head``, ``value`` and the field named
    ``column``, whose value names the column) -- ``{**first(v), component, layer, head, <column>: value ...}``
    for the rows ``keep`` takes, one per distinct ``first(v)`` and component, sorted by ``first``, then
    layer-major with each layer's heads before its MLP."""
    rows: dict[tuple, dict[str, Any]] = {}
    for v in values:
        if not keep(v):
            continue
        lead = first(v)
        row = rows.setdefault((tuple(lead.items()), v.component, v.layer, v.head),
                              {**lead, "component": v.component, "layer": v.layer, "head": v.head})
        row[getattr(v, column)] = v.value
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], k[2], k[1] == "mlp", k[3]))]
