"""Value types returned by and accepted by the cache.

``ResultRow`` is one long-format measurement; ``CachedRun`` is a complete
run as stored (params, rows, artifacts); ``RunSummary`` is the row-less
listing entry returned by ``ResultCache.list_runs``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeAlias

from .schema import SCHEMA_VERSION

__all__ = [
    "CachedRun",
    "ResultRow",
    "RowLike",
    "RunSummary",
    "coerce_row",
    "coerce_rows",
    "rows_as_records",
]

_INT32_MIN: Final[int] = -(2**31)
_INT32_MAX: Final[int] = 2**31 - 1
_ROW_FIELDS: Final[frozenset[str]] = frozenset({"layer", "head", "label", "metric", "value"})


def _opt_int32(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"ResultRow.{name} must be int or None, not {type(value).__name__}")
    as_int = int(value)
    if not _INT32_MIN <= as_int <= _INT32_MAX:
        raise ValueError(f"ResultRow.{name}={as_int} does not fit a 32-bit INTEGER column")
    return as_int


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One long-format measurement.

    ``layer``/``head`` are ``None`` for model-level or layer-level metrics;
    ``label`` is a free dimension (op name, template, ...) or ``None``.
    ``value`` may be any float, including NaN/inf.  Integral numpy scalars
    are accepted and converted to ``int``/``float``.
    """

    layer: int | None
    head: int | None
    label: str | None
    metric: str
    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", _opt_int32("layer", self.layer))
        object.__setattr__(self, "head", _opt_int32("head", self.head))
        if self.label is not None and not isinstance(self.label, str):
            raise TypeError(f"ResultRow.label must be str or None, not {type(self.label).__name__}")
        if not isinstance(self.metric, str) or not self.metric:
            raise TypeError(f"ResultRow.metric must be a non-empty str, got {self.metric!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real):
            raise TypeError(f"ResultRow.value must be a real number, not {type(self.value).__name__}")
        object.__setattr__(self, "value", float(self.value))

    def as_record(self) -> dict[str, Any]:
        """``{"layer", "head", "label", "metric", "value"}`` dict."""
        return {
            "layer": self.layer,
            "head": self.head,
            "label": self.label,
            "metric": self.metric,
            "value": self.value,
        }

    def same_as(self, other: ResultRow) -> bool:
        """Equality that also treats NaN values as equal (for tests and comparisons)."""
        if (self.layer, self.head, self.label, self.metric) != (other.layer, other.head, other.label, other.metric):
            return False
        return self.value == other.value or (math.isnan(self.value) and math.isnan(other.value))


#: What ``put``/``compute`` may supply per row: a ResultRow or a mapping with its five fields.
RowLike: TypeAlias = ResultRow | Mapping[str, Any]


def coerce_row(row: RowLike, index: int = 0) -> ResultRow:
    """Return *row* as a validated :class:`ResultRow`."""
    if isinstance(row, ResultRow):
        return row
    if isinstance(row, Mapping):
        missing = {"metric", "value"} - row.keys()
        unknown = set(row.keys()) - _ROW_FIELDS
        if missing or unknown:
            raise ValueError(
                f"row {index}: mapping must have keys metric, value and optionally layer, head, label; "
                f"missing={sorted(missing)} unknown={sorted(map(str, unknown))}"
            )
        return ResultRow(
            layer=row.get("layer"),
            head=row.get("head"),
            label=row.get("label"),
            metric=row["metric"],
            value=row["value"],
        )
    raise TypeError(f"row {index} must be a ResultRow or a Mapping, not {type(row).__name__}")


def coerce_rows(rows: Iterable[RowLike]) -> list[ResultRow]:
    """Validate every row; raises ``TypeError``/``ValueError`` naming the bad row."""
    if isinstance(rows, (Mapping, str, bytes)):
        raise TypeError(f"rows must be an iterable of rows, not a single {type(rows).__name__}")
    out: list[ResultRow] = []
    for i, row in enumerate(rows):
        try:
            out.append(coerce_row(row, i))
        except (TypeError, ValueError) as exc:
            if str(exc).startswith(f"row {i}"):
                raise
            raise type(exc)(f"row {i}: {exc}") from exc
    return out


@dataclass(frozen=True, slots=True)
class CachedRun:
    """A complete cached run: its identity, its long-format rows and artifacts.

    ``created_at`` is timezone-aware UTC.  Rows come back in insertion order.
    """

    run_id: str
    method: str
    params: dict[str, Any]
    rows: list[ResultRow]
    artifacts: dict[str, Any]
    created_at: datetime
    model_fingerprint: str = ""
    prompt_set_hash: str = ""
    schema_version: int = SCHEMA_VERSION

    def records(self) -> list[dict[str, Any]]:
        """Rows as a list of dicts (ready for ``pandas.DataFrame``/Altair)."""
        return rows_as_records(self.rows)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One entry of ``ResultCache.list_runs`` (no rows/artifacts loaded)."""

    run_id: str
    method: str
    params: dict[str, Any]
    model_fingerprint: str
    prompt_set_hash: str
    schema_version: int
    created_at: datetime
    n_rows: int


def rows_as_records(run_or_rows: CachedRun | Iterable[ResultRow]) -> list[dict[str, Any]]:
    """List of ``{"layer", "head", "label", "metric", "value"}`` dicts."""
    rows = run_or_rows.rows if isinstance(run_or_rows, CachedRun) else run_or_rows
    return [row.as_record() for row in rows]
