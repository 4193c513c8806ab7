"""engine.results' codec: dataclass rows -> cache.ResultRow -> the same dataclass rows (long and wide
format), through memory and through a real DuckDB cache."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from cache import ResultCache, ResultRow
from engine.results import decode_rows, encode_rows, run_cached_rows


@dataclass(frozen=True)
class Long:
    component: str
    layer: int
    head: int
    group: str
    metric: str
    value: float


@dataclass(frozen=True)
class Wide:
    op: str
    template: str
    n: int
    first_token: float
    full: float


@dataclass(frozen=True)
class Cell:
    layer: int | None
    head: int | None
    role: str | None
    value: float
    flag: bool = False


@dataclass(frozen=True)
class Point:  # no label field left: label None
    layer: int
    top: float


ODD = ["head|op:add", 'a "quoted" \\ back', "ünïcødé ✓ 加", "", "|", "{}", "null", "x\ny\t\0"]


def same(a, b) -> bool:
    """Dataclass lists equal, NaN equal to NaN."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if type(x) is not type(y):
            return False
        for k, v in vars(x).items():
            w = getattr(y, k)
            if not (v == w or (isinstance(v, float) and isinstance(w, float) and math.isnan(v) and math.isnan(w))):
                return False
            if type(v) is not type(w):
                return False
    return True


def through_cache(tmp_path, rows):
    c = ResultCache(tmp_path / "c.duckdb")
    c.put("k", model_fingerprint="fp", prompt_set_hash="ps", method="m", params={}, rows=rows)
    run = c.get("k")
    assert run is not None
    return run.rows


def test_long_format_round_trip_with_odd_labels(tmp_path):
    rows = [Long(comp, layer, head, g, metric, v)
            for comp in ("head", "mlp|x") for layer, head in ((0, 1), (2, -1)) for g in ODD
            for metric, v in (("effect", -0.25), ("logit_diff", float("nan")), ("p", float("inf")))]
    enc = encode_rows(rows)
    assert len(enc) == len(rows) and all(isinstance(r, ResultRow) for r in enc)
    assert enc[0].layer == 0 and enc[0].head == 1 and enc[0].metric == "effect" and enc[0].value == -0.25
    assert enc[0].label == '{"component":"head","group":"head|op:add"}'  # canonical: sorted keys, no spaces
    assert all(r.label.isascii() for r in enc)
    assert same(decode_rows(Long, enc), rows)
    assert same(decode_rows(Long, through_cache(tmp_path, enc)), rows)


def test_wide_format_round_trip_restores_ints_and_keeps_order(tmp_path):
    rows = [Wide(op, tpl, n, n / 7, float("nan") if n == 3 else 0.5) for op in ("sub", "add|mul", "ß")
            for tpl, n in (("*", 12), ('t"1', 3), ("t|2", 9))]
    enc = encode_rows(rows, ("n", "first_token", "full"))
    assert len(enc) == 3 * len(rows)
    assert [r.metric for r in enc[:3]] == ["n", "first_token", "full"]
    assert enc[0].layer is None and enc[0].head is None and json.loads(enc[0].label) == {"op": "sub", "template": "*"}
    for got in (decode_rows(Wide, enc, ("n", "first_token", "full")),
                decode_rows(Wide, through_cache(tmp_path, enc), ["n", "first_token", "full"])):
        assert same(got, rows)
        assert all(type(r.n) is int for r in got)


def test_none_columns_bool_fields_and_defaults(tmp_path):
    rows = [Cell(None, None, None, 1.0), Cell(3, None, "END|-1", float("nan"), True), Cell(None, 7, "é", -0.0)]
    enc = encode_rows(rows, ("value", "flag"))
    assert [(r.layer, r.head) for r in enc[::2]] == [(None, None), (3, None), (None, 7)]
    assert json.loads(enc[0].label) == {"role": None}
    got = decode_rows(Cell, through_cache(tmp_path, enc), ("value", "flag"))
    assert same(got, rows) and got[1].flag is True
    assert math.copysign(1.0, got[2].value) == -1.0


def test_no_label_fields_store_label_none():
    rows = [Point(2, 0.5), Point(0, 1.0)]
    enc = encode_rows(rows, ["top"])
    assert [r.label for r in enc] == [None, None]
    assert decode_rows(Point, enc, ["top"]) == rows


def test_label_values_keep_their_types():
    @dataclass
    class Mixed:
        a: object
        metric: str = "m"
        value: float = 1.0

    rows = [Mixed(1), Mixed(True), Mixed(1.0), Mixed(-0.0), Mixed(0.0), Mixed("1"), Mixed(None)]
    got = decode_rows(Mixed, encode_rows(rows))
    assert [(type(r.a), repr(r.a)) for r in got] == [(type(r.a), repr(r.a)) for r in rows]


def test_decode_reads_any_row_objects_in_stored_order():
    raw = [SimpleNamespace(layer=1, head=None, label='{"op":"b","template":"*"}', metric=m, value=v)
           for m, v in (("full", 1.0), ("n", 4.0), ("first_token", 0.25))]
    raw.insert(0, SimpleNamespace(layer=None, head=None, label='{"template":"x","op":"a"}', metric="n", value=2.0))
    raw += [SimpleNamespace(layer=None, head=None, label='{"template":"x","op":"a"}', metric=m, value=0.0)
            for m in ("first_token", "full")]
    got = decode_rows(Wide, raw, ("n", "first_token", "full"))
    assert got == [Wide("a", "x", 2, 0.0, 0.0), Wide("b", "*", 4, 0.25, 1.0)]


def test_run_cached_rows_same_rows_cached_or_not(tmp_path):
    model = SimpleNamespace(facts=SimpleNamespace(fingerprint="fp"))
    rows = [Long("head", 0, 1, g, "effect", x) for g, x in zip(ODD, (0.1, float("nan"), -3.0, 0.0, 1e300, 2.5,
                                                                       -1e-300, 7.0))]
    calls = []

    def compute():
        calls.append(1)
        return rows, {"n": len(rows)}

    cache = ResultCache(tmp_path / "c.duckdb")
    plain = run_cached_rows(model, [], "m", {"a": 1}, compute, Long)
    first = run_cached_rows(model, [], "m", {"a": 1}, compute, Long, cache=cache)
    second = run_cached_rows(model, [], "m", {"a": 1}, compute, Long, cache=cache)
    assert len(calls) == 2 and plain[1:] == ({"n": 8}, True) and first[2] and not second[2]
    assert second[1] == {"n": 8}
    for got, _, _ in (plain, first, second):
        assert same(got, rows)


@pytest.mark.parametrize("rows, metrics, err", [
    ([Wide("a", "b", 1, 0.0, 0.0)], None, "metric and value"),            # long format without metric/value
    ([Wide("a", "b", 1, 0.0, 0.0)], ("nope",), "metrics must be"),         # unknown metric field
    ([Cell(0, 0, "r", 1.0)], ("head",), "metrics must be"),                # a column is no metric
    ([Cell(0, 0, "r", 1.0)], "value", "one str"),                          # a bare str
    ([Long("head", 0, 0, ["g"], "m", 1.0)], None, "label fields"),         # not a JSON scalar
    ([Long("head", 0, 0, float("nan"), "m", 1.0)], None, "label fields"),  # NaN has no JSON spelling
    ([Point(0, 1.0), Cell(0, 0, "r", 1.0)], ["top"], "mix"),               # two classes
    ([{"layer": 0}], None, "dataclass"),                                   # not a dataclass
])
def test_encode_rejects_what_would_not_round_trip(rows, metrics, err):
    with pytest.raises((TypeError, ValueError), match=err):
        encode_rows(rows, metrics)


def test_decode_rejects_rows_of_another_layout():
    enc = encode_rows([Wide("a", "b", 1, 0.0, 0.0)], ("n", "first_token", "full"))
    with pytest.raises(ValueError, match="lacks metrics"):
        decode_rows(Wide, enc[:2], ("n", "first_token", "full"))
    with pytest.raises(ValueError, match="not one of"):
        decode_rows(Wide, [*enc, ResultRow(None, None, enc[0].label, "extra", 1.0)], ("n", "first_token", "full"))
    with pytest.raises(ValueError, match="does not hold"):  # decoded with other metrics: other label fields
        decode_rows(Wide, enc, ("n", "first_token"))
    with pytest.raises(ValueError, match="does not hold"):
        decode_rows(Long, [ResultRow(0, 0, "head|op:add", "effect", 1.0)])  # the old packed label
    assert decode_rows(Long, []) == [] and encode_rows([]) == []


def test_fields_with_init_false_are_not_stored():
    @dataclass
    class Derived:
        layer: int
        value: float
        metric: str = "m"
        double: float = field(init=False)

        def __post_init__(self):
            self.double = 2 * self.value

    got = decode_rows(Derived, encode_rows([Derived(1, 2.0)]))
    assert got[0].double == 4.0 and got[0].layer == 1


def test_a_result_says_what_computed_it_and_a_new_version_misses(tmp_path, monkeypatch):
    """Issue 31: the key and the stored params hold the versions of torch, transformers, transformer-lens and
    nnsight; a result computed under other versions is not served."""
    import engine.results as results
    model = SimpleNamespace(facts=SimpleNamespace(fingerprint="fp"))
    calls = []

    def compute():
        calls.append(1)
        return [Long("head", 0, 0, "*", "effect", 1.0)], {}

    cache = ResultCache(tmp_path / "c.duckdb")
    run_cached_rows(model, [], "m", {"a": 1}, compute, Long, cache=cache)
    (summary,) = cache.list_runs("m")
    stored_by = cache.get(summary.run_id).params["computed_by"]
    assert set(stored_by) == {"torch", "transformers", "transformer-lens", "nnsight"}
    assert stored_by == results.library_versions() and all(v not in ("", "-") for v in stored_by.values())
    run_cached_rows(model, [], "m", {"a": 1}, compute, Long, cache=cache)
    assert len(calls) == 1  # same versions: served
    newer = dict(results.library_versions(), transformers="99.0.0")
    monkeypatch.setattr(results, "library_versions", lambda: newer)
    assert results.stored(model, [], "m", {"a": 1}, cache) is None
    run_cached_rows(model, [], "m", {"a": 1}, compute, Long, cache=cache)
    assert len(calls) == 2  # another transformers: computed again, beside the old result
    assert len(cache.list_runs("m")) == 2


def test_arrays_round_trip_float32_by_default_and_float64_bit_for_bit_where_exact():
    import numpy as np

    from engine.results import decode_array, encode_array
    x = np.array([[1 / 3, -0.0, np.nan], [1e-300, 2.0 ** 60 + 1, -np.inf]])  # [2, 3]: values float32 cannot hold
    f32 = decode_array(json.loads(json.dumps(encode_array(x))))
    assert f32.dtype == np.float32 and f32.shape == (2, 3) and f32[0, 0] == np.float32(1 / 3)
    f64 = decode_array(json.loads(json.dumps(encode_array(x, exact=True))))
    assert f64.dtype == np.float64 and f64.tobytes() == x.tobytes()  # NaN, -0.0 and the last bits kept
