"""Bulk insertion of long-format result rows.

``executemany`` costs about a millisecond per row in DuckDB, far too slow for
the hundred-thousand-row results of a full head sweep.  Rows are therefore
written column-wise, in chunks of :data:`CHUNK_ROWS`:

* through a pyarrow table when pyarrow is importable (installed with
  streamlit), otherwise
* as one ``INSERT ... SELECT unnest(?), unnest(?), ...`` statement with the
  columns bound as list parameters (pure DuckDB, no extra dependency).

Neither path needs pandas.  Both run inside the caller's transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import ModuleType

import duckdb

from .models import ResultRow

__all__ = ["CHUNK_ROWS", "USE_ARROW", "insert_results"]

#: Rows per INSERT statement (bounds the temporary column lists' memory).
CHUNK_ROWS: int = 50_000
#: Set to False to force the pure-DuckDB path (tests exercise both).
USE_ARROW: bool = True

_pyarrow: ModuleType | bool | None = False  # False = not yet imported
_counter = itertools.count()


def _arrow() -> ModuleType | None:
    global _pyarrow
    if _pyarrow is False:
        try:
            import pyarrow  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            _pyarrow = None
        else:
            _pyarrow = pyarrow
    return _pyarrow if isinstance(_pyarrow, ModuleType) else None


def insert_results(con: duckdb.DuckDBPyConnection, run_id: str, rows: Sequence[ResultRow]) -> None:
    """Append *rows* of *run_id* to ``results``, preserving their order."""
    for start in range(0, len(rows), CHUNK_ROWS):
        _insert_chunk(con, run_id, rows[start : start + CHUNK_ROWS])


def _insert_chunk(con: duckdb.DuckDBPyConnection, run_id: str, chunk: Sequence[ResultRow]) -> None:
    layers = [r.layer for r in chunk]
    heads = [r.head for r in chunk]
    labels = [r.label for r in chunk]
    metrics = [r.metric for r in chunk]
    values = [r.value for r in chunk]
    pa = _arrow() if USE_ARROW else None
    if pa is None:
        con.execute(
            "INSERT INTO results SELECT ?, unnest(?::INTEGER[]), unnest(?::INTEGER[]), "
            "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::DOUBLE[])",
            [run_id, layers, heads, labels, metrics, values],
        )
        return
    table = pa.table(
        {
            "layer": pa.array(layers, type=pa.int32()),
            "head": pa.array(heads, type=pa.int32()),
            "label": pa.array(labels, type=pa.string()),
            "metric": pa.array(metrics, type=pa.string()),
            "value": pa.array(values, type=pa.float64()),
        }
    )
    view = f"_arithlab_results_chunk_{next(_counter)}"
    con.register(view, table)
    try:
        con.execute(
            f"INSERT INTO results SELECT ?, layer, head, label, metric, value FROM {view}",
            [run_id],
        )
    finally:
        con.unregister(view)
