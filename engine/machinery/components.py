"""The components a technique reports on -- every head (layer, head) and every layer's MLP (head = -1) -- and
the three shapes their values take: long rows (what a technique stores: one per component, group and metric),
the grid the heatmap draws (heads [L][H] and MLPs [L]) and wide rows (a CSV: one per component, a column per
metric or kind).  Path patching, head -> head, attribution patching and the report read and write them here;
no torch, so ``views/`` (the heatmap frame) reads them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class Component:
    """A head or a layer's MLP; techniques' row types extend it with their fields."""

    component: str  # "head" | "mlp"
    layer: int
    head: int       # -1 for MLPs

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}" if self.component == "head" else f"MLP{self.layer}"


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
