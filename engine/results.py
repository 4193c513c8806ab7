"""Run a technique through the DuckDB result cache, and the one codec between its rows and the cache's.

Key = sha256 of canonical JSON of (model fingerprint, prompt-set hash, method, params, schema
version) -- see :func:`cache.make_key`.  With ``cache=None`` the computation runs uncached, and the
caller decodes the same rows either way.

Codec (:func:`encode_rows` / :func:`decode_rows`; :func:`run_cached_rows` wraps both around
:func:`run_cached`): a technique's result is a list of dataclass rows; the cache stores long-format
:class:`cache.ResultRow` ``(layer, head, label, metric, value)``.  Per dataclass row:

* fields named ``layer`` and ``head`` go to those columns (``None`` where the class has none);
* long format (``metrics=None``): the class has fields ``metric`` and ``value`` -- one ResultRow;
  wide format (``metrics=("a", "b")``): one ResultRow per name, ``metric=name, value=row.name``;
* every other field goes into ``label`` as canonical JSON (sorted keys, ASCII, no whitespace:
  ``{"component":"head","group":"op:add"}``), so any string survives, ``|`` and quotes included;
  ``label`` is ``None`` when no field is left.  Label fields hold JSON scalars (str, int, finite
  float, bool, None); values are real numbers (NaN and infinities included).

Decoding restores the label fields as JSON gives them back and the values as ``float`` -- ``int``
where the field is annotated ``int`` (and the value is integral), ``bool`` where it is ``bool``.  Rows
come back in stored order (wide rows: in the order of each group's first row), which is the order
they were encoded in.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from engine.prompts.pairs import PromptPair, prompt_set_hash

if TYPE_CHECKING:
    from cache import ResultRow

Compute = Callable[[], tuple[Iterable[Any], Mapping[str, Any] | None]]
T = TypeVar("T")
#: What :func:`run_cached_rows` computes: (dataclass rows, artifacts or None).
ComputeRows = Callable[[], tuple[Iterable[Any], Mapping[str, Any] | None]]


class NotCached(LookupError):
    """Inside :func:`cache_only`: the result is not in the cache (nothing was computed)."""


_CACHE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("cache_only", default=False)


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """Within the block, every cached technique reads the cache and raises :class:`NotCached` on a
    miss instead of computing (summaries of what has already been computed)."""
    token = _CACHE_ONLY.set(True)
    try:
        yield
    finally:
        _CACHE_ONLY.reset(token)


#: the libraries whose versions are part of every cache key: a new version can change the numbers
KEYED_LIBRARIES = ("torch", "transformers", "transformer-lens", "nnsight")


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    """The installed versions of :data:`KEYED_LIBRARIES` (``"-"`` for one that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in KEYED_LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    return out


def keyed(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as stored and keyed: with the versions of what computed the result (``computed_by``)."""
    return {**params, "computed_by": dict(library_versions())}


def run_cached(model, pairs: Sequence[PromptPair], method: str, params: Mapping[str, Any], compute: Compute,
               cache=None) -> tuple[list[Any], dict[str, Any], bool]:
    """(rows, artifacts, computed) of ``method`` on ``pairs``, from the cache or ``compute()``.

    The key and the stored parameters include :func:`library_versions`: a result says what computed it."""
    params = keyed(params)
    if _CACHE_ONLY.get():
        hit = stored(model, pairs, method, params, cache)
        if hit is None:
            raise NotCached(f"{method} is not in the cache")
        return hit[0], hit[1], False
    if cache is None:
        rows, artifacts = compute()
        return list(rows), dict(artifacts or {}), True
    from cache import make_key
    f = model.facts
    psh = prompt_set_hash(pairs)
    run, computed = cache.get_or_compute(make_key(f.fingerprint, psh, method, params), compute,
                                         model_fingerprint=f.fingerprint, prompt_set_hash=psh, method=method,
                                         params=params)
    return list(run.rows), dict(run.artifacts or {}), computed


def stored(model, pairs: Sequence[PromptPair], method: str, params: Mapping[str, Any], cache
           ) -> tuple[list[Any], dict[str, Any]] | None:
    """(rows, artifacts) of ``method`` on ``pairs`` if the cache holds them, else None (computes nothing)."""
    if cache is None:
        return None
    from cache import make_key
    f = model.facts
    run = cache.get(make_key(f.fingerprint, prompt_set_hash(pairs), method, keyed(params)))
    return None if run is None else (list(run.rows), dict(run.artifacts or {}))


# ---------------------------------------------------------------------------------------------
# codec: dataclass rows <-> ResultRow (module docstring)
# ---------------------------------------------------------------------------------------------

COLUMNS = ("layer", "head")  # dataclass fields stored in the result table's own integer columns
LABEL_SCALARS = (str, int, float, bool, type(None))


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where each field of a dataclass goes: the integer columns, the label (JSON) and the metrics."""

    cls: type
    columns: tuple[str, ...]         # those of COLUMNS the class has
    label: tuple[str, ...]           # fields stored in the label, in declaration order
    metrics: tuple[str, ...] | None  # None: long format (fields metric, value)
    kinds: Mapping[str, type]        # metric (or value) field -> int / bool / float: what decoding restores

    @classmethod
    def of(cls, row_cls: type, metrics: Sequence[str] | None) -> RowLayout:
        """The layout of dataclass ``row_cls`` (TypeError / ValueError where it does not fit ``metrics``)."""
        if not (isinstance(row_cls, type) and dataclasses.is_dataclass(row_cls)):
            raise TypeError(f"rows must be dataclass instances, not {getattr(row_cls, '__name__', row_cls)!r}")
        fields = {f.name: f for f in dataclasses.fields(row_cls) if f.init}
        if isinstance(metrics, str):
            raise TypeError("metrics must be a sequence of field names, not one str")
        if metrics is None:
            missing = [n for n in ("metric", "value") if n not in fields]
            if missing:
                raise ValueError(f"{row_cls.__name__}: the long format (metrics=None) needs fields metric and value; "
                                 f"missing {missing}")
            numeric: tuple[str, ...] = ("value",)
            taken = {"metric", "value"}
        else:
            metrics = tuple(metrics)
            bad = [n for n in metrics if n not in fields or n in COLUMNS]
            if bad or not metrics or len(set(metrics)) != len(metrics):
                raise ValueError(f"{row_cls.__name__}: metrics must be distinct fields other than layer and head, "
                                 f"got {list(metrics)}")
            numeric = metrics
            taken = set(metrics)
        columns = tuple(n for n in COLUMNS if n in fields)
        label = tuple(n for n in fields if n not in taken and n not in COLUMNS)
        return cls(row_cls, columns, label, metrics, {n: value_kind(fields[n].type) for n in numeric})

    def label_of(self, values: Sequence[Any]) -> str | None:
        """The canonical JSON label of the label fields' ``values`` (None when the class has none)."""
        bad = {n: v for n, v in zip(self.label, values)
               if not isinstance(v, LABEL_SCALARS) or (isinstance(v, float) and not math.isfinite(v))}
        if bad:
            raise TypeError(f"{self.cls.__name__}: label fields must be str, int, finite float, bool or None; "
                            f"got {bad}")
        if not self.label:
            return None
        return json.dumps(dict(zip(self.label, values)), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)

    def fields_of(self, label: str | None) -> dict[str, Any]:
        """The label fields stored in ``label`` (ValueError where it holds other fields)."""
        try:
            got = {} if label is None else json.loads(label)
        except ValueError:  # not JSON: e.g. a label packed by hand before the codec
            got = None
        if not isinstance(got, dict) or set(got) != set(self.label):
            raise ValueError(f"{self.cls.__name__}: label {label!r} does not hold the fields {list(self.label)}")
        return got

    def restore(self, name: str, value: float) -> Any:
        """A stored value as field ``name`` holds it: int (when integral) or bool where so annotated."""
        kind = self.kinds[name]
        if kind is bool:
            return bool(value)
        if kind is int and math.isfinite(value) and value == int(value):
            return int(value)
        return value


def value_kind(annotation: Any) -> type:
    """``bool``, ``int`` or ``float``: what a numeric field annotated ``annotation`` decodes to
    (annotations are strings under ``from __future__ import annotations``)."""
    for t in (bool, int):
        if annotation is t or annotation == t.__name__:
            return t
    return float


def as_value(value: Any) -> Any:
    """``value`` for ResultRow.value, which takes real numbers but not bools (stored as 0.0 / 1.0)."""
    return float(value) if isinstance(value, bool) else value


def encode_rows(rows: Iterable[Any], metrics: Sequence[str] | None = None) -> list[ResultRow]:
    """Dataclass rows (all of one class) as long-format :class:`cache.ResultRow` (module docstring).

    ``metrics`` None: long format, the class has fields ``metric`` and ``value``; otherwise each
    named field becomes one ResultRow per dataclass row, in the order of ``metrics``.  Raises
    TypeError / ValueError for rows of mixed classes, a class that does not fit ``metrics``, or
    label fields that are not JSON scalars.
    """
    from cache import ResultRow
    out: list[ResultRow] = []
    layout: RowLayout | None = None
    labels: dict[tuple, str | None] = {}  # label fields' values -> JSON, built once per distinct label
    for row in rows:
        if layout is None:
            layout = RowLayout.of(type(row), metrics)
        elif type(row) is not layout.cls:
            raise TypeError(f"rows mix {layout.cls.__name__} and {type(row).__name__}")
        values = [getattr(row, n) for n in layout.label]
        # (type, value, repr of floats): True and 1, 0.0 and -0.0 are equal keys but different JSON
        key = tuple((type(v), v, repr(v) if type(v) is float else None) for v in values)
        try:
            label = labels[key]
        except (KeyError, TypeError):  # a new label, or an unhashable value (label_of says what is wrong)
            label = labels[key] = layout.label_of(values)
        layer = row.layer if "layer" in layout.columns else None
        head = row.head if "head" in layout.columns else None
        if layout.metrics is None:
            out.append(ResultRow(layer=layer, head=head, label=label, metric=row.metric, value=as_value(row.value)))
        else:
            out.extend(ResultRow(layer=layer, head=head, label=label, metric=m, value=as_value(getattr(row, m)))
                       for m in layout.metrics)
    return out


def decode_rows(cls: type[T], rows: Iterable[Any], metrics: Sequence[str] | None = None) -> list[T]:
    """The inverse of :func:`encode_rows`: ``cls`` instances from ResultRows (anything with the
    attributes layer, head, label, metric, value), in stored order.

    Wide format: rows are grouped by (layer, head, label), in the order of each group's first row; a
    group lacking one of ``metrics``, or a metric not among them, is a ValueError -- as is a label
    that does not hold exactly the class's label fields (a result stored in another layout).
    """
    layout = RowLayout.of(cls, metrics)
    parsed: dict[str | None, dict[str, Any]] = {}  # label -> its fields, parsed once per distinct label

    def fields(r: Any) -> dict[str, Any]:
        if r.label not in parsed:
            parsed[r.label] = layout.fields_of(r.label)
        kw = dict(parsed[r.label])
        for n in layout.columns:
            kw[n] = getattr(r, n)
        return kw

    if layout.metrics is None:
        return [cls(**fields(r), metric=r.metric, value=layout.restore("value", r.value)) for r in rows]
    wanted = set(layout.metrics)
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.metric not in wanted:
            raise ValueError(f"{cls.__name__}: stored metric {r.metric!r} is not one of {list(layout.metrics)}")
        key = (r.layer, r.head, r.label)
        if key not in groups:
            groups[key] = fields(r)
        groups[key][r.metric] = layout.restore(r.metric, r.value)
    out = []
    for key, kw in groups.items():
        missing = wanted - kw.keys()
        if missing:
            raise ValueError(f"{cls.__name__}: stored row {key} lacks metrics {sorted(missing)}")
        out.append(cls(**kw))
    return out


def run_cached_rows(model, pairs: Sequence[PromptPair], method: str, params: Mapping[str, Any],
                    compute_rows: ComputeRows, cls: type[T], metrics: Sequence[str] | None = None,
                    cache=None) -> tuple[list[T], dict[str, Any], bool]:
    """:func:`run_cached` over dataclass rows: (rows of ``cls``, artifacts, computed).

    ``compute_rows()`` returns (``cls`` rows, artifacts or None); they are stored with
    :func:`encode_rows` and read back with :func:`decode_rows` -- uncached too, so a fresh result
    and a cached one come back alike."""
    def compute():
        rows, artifacts = compute_rows()
        return encode_rows(rows, metrics), artifacts

    stored_rows, artifacts, computed = run_cached(model, pairs, method, params, compute, cache)
    return decode_rows(cls, stored_rows, metrics), artifacts, computed


# ---------------------------------------------------------------------------------------------
# per-pair arrays as artifacts (the bootstrap's inputs, engine.numerics.intervals)
# ---------------------------------------------------------------------------------------------

def encode_array(x: Any, *, exact: bool = False) -> dict[str, Any]:
    """A float tensor / array as a JSON artifact: its shape and its float32 bytes in base64 (NaN kept); ``exact``:
    its float64 bytes, bit for bit (scores whose order matters, not only their spread)."""
    import base64

    import numpy as np
    kind, dtype = ("f64", "<f8") if exact else ("f32", "<f4")
    a = np.ascontiguousarray(np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, dtype=dtype))
    return {"shape": list(a.shape), kind: base64.b64encode(a.tobytes()).decode("ascii")}


def decode_array(obj: Mapping[str, Any]) -> Any:
    """The numpy array :func:`encode_array` stored (float32, or float64 where stored ``exact``)."""
    import base64

    import numpy as np
    kind, dtype = ("f64", "<f8") if "f64" in obj else ("f32", "<f4")
    return np.frombuffer(base64.b64decode(obj[kind]), dtype=dtype).reshape(obj["shape"]).copy()
