"""Pins, notes and workspaces in the result cache's DuckDB file (cache/annotations.py): no model needed."""

from __future__ import annotations

import duckdb
import pytest

from cache import MAX_NOTE_CHARS, NoteError, ResultCache


@pytest.fixture()
def cache(tmp_path):
    return ResultCache(tmp_path / "results.duckdb")


def test_pins_are_per_fingerprint_replaced_and_removed(cache):
    assert cache.pins("fp") == [] and cache.labels("fp") == {}  # no file yet: nothing, no error
    cache.pin("fp", "1.3", "operator mover")
    cache.pin("fp", " 2.mlp ")
    cache.pin("fp", "1.3->5.5", "feeds the mover")
    cache.pin("other", "1.3", "another model's")
    cache.pin("fp", "1.3", "operand A mover")  # replaces the note
    assert cache.labels("fp") == {"1.3": "operand A mover", "1.3->5.5": "feeds the mover", "2.mlp": "pinned"}
    assert cache.labels("other") == {"1.3": "another model's"}
    assert cache.unpin("fp", "2.mlp") and not cache.unpin("fp", "2.mlp")
    assert [p.component for p in cache.pins("fp")] == ["1.3", "1.3->5.5"]


def test_a_note_over_the_limit_is_refused_and_the_rest_kept(cache):
    cache.pin("fp", "1.3", "kept")
    with pytest.raises(NoteError, match=f"at most {MAX_NOTE_CHARS:,} characters; this one has 10,000"):
        cache.pin("fp", "1.1", "x" * 10_000)
    with pytest.raises(NoteError, match=r"at most 1,000"):
        cache.pin("fp", "1.3", "y" * 10_000)  # nor does it replace a kept note
    assert cache.labels("fp") == {"1.3": "kept"}
    assert cache.pin("fp", "1.1", "z" * MAX_NOTE_CHARS).note == "z" * MAX_NOTE_CHARS


def test_a_note_is_plain_text_kept_as_typed(cache):
    html = "<b>mover</b> <script>alert('x')</script> [link](javascript:alert(1)) **bold**"
    cache.pin("fp", "1.3", html + "\x00\x1b[31m\n second line\t")
    assert cache.labels("fp")["1.3"] == html + "[31m\n second line"  # control characters dropped, ends stripped


@pytest.mark.parametrize("bad", ["", "1", "1.x", "a.b", "1.3->", "1.3;DROP TABLE runs", "<b>1.3</b>", "1.mlp.x"])
def test_bad_components_are_refused(cache, bad):
    with pytest.raises(NoteError, match="names no component"):
        cache.pin("fp", bad, "note")
    assert cache.pins("fp") == []


def test_workspaces_save_list_replace_delete(cache):
    cache.save_workspace("adds", "fp", '{"a": 1}')
    cache.save_workspace("muls", "fp", '{"a": 2}')
    cache.save_workspace("adds", "fp", '{"a": 3}')
    ws = {w.name: w for w in cache.workspaces()}
    assert set(ws) == {"adds", "muls"} and ws["adds"].state_json == '{"a": 3}'
    assert cache.delete_workspace("adds") and not cache.delete_workspace("adds")
    for bad in ("", " ", "a" * 81, "two\nlines"):
        with pytest.raises(NoteError):
            cache.save_workspace(bad, "fp", "{}")


def test_an_older_cache_file_gains_the_tables_and_keeps_its_results(tmp_path):
    db = tmp_path / "old.duckdb"
    cache = ResultCache(db)
    cache.put("r1", model_fingerprint="fp", prompt_set_hash="h", method="m", params={}, rows=[])
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE IF EXISTS pins")
    con.execute("DROP TABLE IF EXISTS workspaces")
    con.close()
    assert cache.pins("fp") == [] and cache.workspaces() == []  # reading: no tables yet, nothing
    cache.pin("fp", "0.0", "first")
    assert cache.get("r1") is not None and cache.labels("fp") == {"0.0": "first"}
