"""Bad notes (issue 51): a 10,000-character note and HTML in a note -- a clear message, nothing lost, nothing
rendered as HTML: on the Path patching page, in the CLI, the circuit JSON and the report."""

from __future__ import annotations

import json

from cache import ResultCache
from tests.reliability.conftest import SMALL_SET_ARGS, texts

HTML = "<b>operator</b> mover <script>alert('x')</script> <img src=x onerror=alert(1)> **bold** [a](javascript:x)"


def _page_with(tmp_path, monkeypatch, organism, note: str | None):
    db = tmp_path / "results.duckdb"
    monkeypatch.setenv("ARITHLAB_CACHE", str(db))
    cache = ResultCache(db)
    if note is not None:
        cache.pin(organism.facts.fingerprint, "1.3", note)
    from streamlit.testing.v1 import AppTest

    from tests.reliability.conftest import PAGES, SMALL_SET
    at = AppTest.from_file(str(PAGES / "4_Path_patching.py"), default_timeout=300)
    at.session_state["prompt_set"] = dict(SMALL_SET)
    at.session_state["selected_head"] = (1, 3)
    return cache, at.run()


def test_html_in_a_note_is_shown_as_text_on_the_page(tmp_path, monkeypatch, organism):
    _, at = _page_with(tmp_path, monkeypatch, organism, HTML)
    assert not at.exception and not at.error, (texts(at, "exception"), texts(at, "error"))
    assert HTML in [t.value for t in at.text]  # st.text: shown as typed
    assert not any("<script>" in str(m.value) or "<b>operator" in str(m.value) for m in at.markdown)
    specs = [c.proto.spec for c in [*at.get("arrow_vega_lite_chart"), *at.get("vega_lite_chart")]]
    assert any('"title":"note"' in s.replace(" ", "") for s in specs)  # the tooltip shows it (Vega: as text)


def test_a_10000_character_note_is_refused_on_the_page_and_the_kept_note_stays(tmp_path, monkeypatch, organism):
    cache, at = _page_with(tmp_path, monkeypatch, organism, "operator mover")
    at.text_area(key="note_1.3").set_value("x" * 10_000).run()
    at.button(key="pin_1.3").click().run()
    assert not at.exception
    assert any("at most 1,000 characters; this one has 10,000" in e for e in texts(at, "error")), texts(at, "error")
    assert cache.labels(organism.facts.fingerprint) == {"1.3": "operator mover"}


def test_the_cli_refuses_a_long_note_and_a_missing_head_in_one_line(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    assert cli("pins", "--model", "organism", "--pin", "1.3", "--note", HTML).rc == 0
    for argv in (("--pin", "1.1", "--note", "x" * 10_000), ("--pin", "9.9"), ("--pin", "<b>1.3</b>"),
                 ("--note", "a note with no pin")):
        r = cli("pins", "--model", "organism", *argv)
        r.error_line()
    out = json.loads(cli("pins", "--model", "organism").out)
    assert out["pins"] == [{"component": "1.3", "note": HTML, "updated_at": out["pins"][0]["updated_at"]}]


def test_the_circuit_json_and_the_report_carry_the_note_escaped(tmp_path, monkeypatch, cli, organism):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    ResultCache(tmp_path / "results.duckdb").pin(organism.facts.fingerprint, "1.3", HTML)
    out = tmp_path / "circuit.json"
    assert cli("circuit", "--model", "organism", *SMALL_SET_ARGS, "--k", "5", "--out", str(out)).rc == 0
    nodes = {n["id"]: n for n in json.loads(out.read_text())["nodes"]}
    assert nodes["h1.3"]["note"] == HTML and nodes["h1.3"]["label"] == "1.3"
    assert all(n["note"] == "" for i, n in nodes.items() if i != "h1.3")
    from engine.findings.report import Report
    from views.report import render_html
    rep = Report("t", "now", {"spec": "x", "n_layers": 2, "n_heads": 4}, {}, {}, [],
                 [{"component": "head", "layer": 1, "head": 3, "effect": -0.2}], [], [], [], [], [],
                 pins=[{"component": "1.3", "note": HTML}])
    page = render_html(rep)
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "<img src=x" not in page
    assert page.count("<script") == 2  # the inlined library and the charts' own: none from the note


def test_the_circuit_page_lists_the_notes_of_its_nodes_as_text(tmp_path, monkeypatch, organism):
    db = tmp_path / "results.duckdb"
    monkeypatch.setenv("ARITHLAB_CACHE", str(db))
    ResultCache(db).pin(organism.facts.fingerprint, "1.3", HTML)
    from streamlit.testing.v1 import AppTest

    from tests.reliability.conftest import PAGES, SMALL_SET
    at = AppTest.from_file(str(PAGES / "12_Circuit.py"), default_timeout=300)
    at.session_state["prompt_set"] = dict(SMALL_SET)
    at.run()
    for b in [b for b in at.button if "(estimated: about " in b.label]:  # the page may ask first
        b.click().run()
    assert not at.exception and not at.error, (texts(at, "exception"), texts(at, "error"))
    frames = [f.value for f in at.dataframe]
    assert any(list(f.get("note", [])) == [HTML] for f in frames), frames
    assert not any("<script>" in str(m.value) for m in at.markdown)
    import pyarrow as pa  # the chart's rows travel as Arrow datasets beside its spec
    frames = [pa.ipc.open_stream(d.data.data).read_pandas()
              for c in [*at.get("arrow_vega_lite_chart"), *at.get("vega_lite_chart")] for d in c.proto.datasets]
    drawn = [r for f in frames if "shown_note" in f for r in f.to_dict("records") if r["note"]]
    assert {(r["id"], r["note"]) for r in drawn} == {("h1.3", HTML)}  # ringed, its note under it: text, not HTML
    assert drawn[0]["shown_note"] == HTML[:25].rstrip() + "…"


def test_every_heatmap_of_the_models_heads_outlines_its_pins(tmp_path, monkeypatch, organism):
    """Issue 51: the pins on every heatmap, not only Path patching's -- the Story's key heads, Compare's A and B."""
    import pyarrow as pa
    from streamlit.testing.v1 import AppTest

    from tests.reliability.conftest import PAGES, SMALL_SET
    db = tmp_path / "results.duckdb"
    monkeypatch.setenv("ARITHLAB_CACHE", str(db))
    ResultCache(db).pin(organism.facts.fingerprint, "1.3", "operator mover")
    for page, state, charts in (("1_Story.py", {"story_step": 2}, 1), ("17_Compare.py", {}, 2)):
        at = AppTest.from_file(str(PAGES / page), default_timeout=300)
        at.session_state["prompt_set"] = dict(SMALL_SET)
        for k, v in state.items():
            at.session_state[k] = v
        at.run()
        for b in [b for b in at.button if "(estimated: about " in b.label and "findings" not in b.label]:
            b.click().run()
        assert not at.exception and not at.error, (page, texts(at, "exception"), texts(at, "error"))
        frames = [pa.ipc.open_stream(d.data.data).read_pandas()
                  for c in [*at.get("arrow_vega_lite_chart"), *at.get("vega_lite_chart")] for d in c.proto.datasets]
        noted = [f for f in frames if "note" in f and "layer" in f and (f["note"] == "operator mover").any()]
        assert len(noted) == charts, (page, [list(f.columns) for f in frames])
        for f in noted:
            assert f[f["note"] != ""][["layer", "head"]].values.tolist() == [[1, 3]]


def test_the_path_patching_csvs_carry_the_pins_notes(tmp_path, monkeypatch, cli, organism):
    """The CLI's heatmap CSV (and head -> head's) gains a `note` column when the model has pins, as typed (CSV
    quoting, no markup); without pins the file is as before."""
    import csv
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    plain, noted, h2h = tmp_path / "plain.csv", tmp_path / "noted.csv", tmp_path / "h2h.csv"
    assert cli("path-patching", "--model", "organism", *SMALL_SET_ARGS, "--out", str(plain)).rc == 0
    assert "note" not in next(csv.reader(plain.open(encoding="utf-8")))
    ResultCache(tmp_path / "results.duckdb").pin(organism.facts.fingerprint, "1.3", HTML)
    ResultCache(tmp_path / "results.duckdb").pin(organism.facts.fingerprint, "0.mlp", "early MLP")
    assert cli("path-patching", "--model", "organism", *SMALL_SET_ARGS, "--out", str(noted)).rc == 0
    rows = list(csv.DictReader(noted.open(encoding="utf-8")))
    assert {(r["component"], r["layer"], r["head"], r["note"]) for r in rows if r["note"]} == {
        ("head", "1", "3", HTML), ("mlp", "0", "-1", "early MLP")}
    assert [{k: v for k, v in r.items() if k != "note"} for r in rows] == list(csv.DictReader(plain.open()))
    assert cli("path-patching", "--model", "organism", *SMALL_SET_ARGS, "--receiver", "5.5", "--out", str(h2h)).rc == 0
    notes = {(r["layer"], r["head"]): r["note"] for r in csv.DictReader(h2h.open(encoding="utf-8")) if r["note"]}
    assert notes == {("1", "3"): HTML, ("0", "-1"): "early MLP"}
