"""Workspaces (engine/findings/workspace.py): the file format, its checks, the model found by fingerprint or path,
pins imported without replacing a kept note -- on a cache file, no model needed."""

from __future__ import annotations

import json

import pytest

from cache import ResultCache
from engine.findings.workspace import (
    VERSION,
    WorkspaceError,
    delete,
    import_pins,
    make,
    model_of,
    read_file,
    save,
    saved,
)

STATE = {"ops": "add", "cf": "operand-a", "prompt": "Q: What is 7 plus 8? A:", "head": "1.3", "ko": "1.1,1.3"}


@pytest.fixture()
def cache(tmp_path):
    c = ResultCache(tmp_path / "results.duckdb")
    c.pin("fpA", "1.3", "operator mover")
    c.pin("fpA", "1.1", "<b>operand A</b>")
    return c


def test_a_workspace_round_trips_through_its_file_and_the_store(cache):
    ws = make("adds", "organism", "fpA", STATE, cache)
    back = read_file(ws.dumps().encode())
    assert (back.name, back.model_spec, back.fingerprint, back.state) == ("adds", "organism", "fpA", STATE)
    assert back.pins == [{"component": "1.1", "note": "<b>operand A</b>"},
                         {"component": "1.3", "note": "operator mover"}]
    save(ws, cache)
    save(make("muls", "organism", "fpA", {"ops": "mul"}, cache), cache)
    assert {w.name for w in saved(cache)} == {"adds", "muls"}
    assert [w.state for w in saved(cache) if w.name == "adds"] == [STATE]
    assert delete("adds", cache) and [w.name for w in saved(cache)] == ["muls"]


@pytest.mark.parametrize("data, why", [
    (b"", "not valid JSON"),
    (b'{"schema": "arithlab-workspace", "version": 1, "model": {"spec"', "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not text"),
    (b"[1, 2, 3]", "no \"schema\""),
    (b'{"schema": "something-else"}', "no \"schema\""),
    (json.dumps({"schema": "arithlab-workspace", "version": 99}).encode(), "version 99"),
    (json.dumps({"schema": "arithlab-workspace", "version": VERSION, "model": {"spec": "organism"},
                 "state": {}}).encode(), "no spec and fingerprint"),
    (json.dumps({"schema": "arithlab-workspace", "version": VERSION, "model": {"spec": "o", "fingerprint": "f"},
                 "state": {"n": 40}}).encode(), "not a table of texts"),
    (json.dumps({"schema": "arithlab-workspace", "version": VERSION, "model": {"spec": "o", "fingerprint": "f"},
                 "state": {}, "pins": [{"note": "x"}]}).encode(), "not a list of {component, note}"),
    (b" " * 2_000_001, "at most 2,000,000"),
])
def test_a_damaged_or_foreign_file_says_why_and_changes_nothing(cache, data, why):
    save(make("kept", "organism", "fpA", STATE, cache), cache)
    before = (cache.labels("fpA"), [w.dumps() for w in saved(cache)])
    with pytest.raises(WorkspaceError, match="Nothing was changed") as e:
        read_file(data)
    assert why in str(e.value)
    assert (cache.labels("fpA"), [w.dumps() for w in saved(cache)]) == before


def test_the_model_is_found_by_fingerprint_or_by_path(tmp_path, cache):
    ws = make("w", "/no/such/dir/model.gguf", "fpA", STATE, cache)
    assert model_of(ws, "/here/model.gguf", "fpA") == "/here/model.gguf"  # the loaded model, by fingerprint
    with pytest.raises(WorkspaceError, match=r"/no/such/dir/model.gguf \(weights fingerprint fpA\).*Nothing was"):
        model_of(ws, "organism", "fpB")  # another model's file, its model missing here
    real = tmp_path / "m.gguf"
    real.write_bytes(b"x")
    assert model_of(make("w", str(real), "fpC", {}, None), "organism", "fpB") == str(real)  # by path
    assert model_of(make("w", "organism", "fpD", {}, None), "x", "fpB") == "organism"
    assert model_of(make("w", "HuggingFaceTB/SmolLM2-135M", "fpE", {}, None), "x", "fpB") == \
        "HuggingFaceTB/SmolLM2-135M"  # a hub id: opened (or refused) by the model loader


def test_importing_pins_never_replaces_a_kept_note(tmp_path, cache):
    theirs = read_file(json.dumps({
        "schema": "arithlab-workspace", "version": VERSION, "name": "colleague",
        "model": {"spec": "organism", "fingerprint": "fpA"}, "state": {},
        "pins": [{"component": "1.3", "note": "theirs"}, {"component": "5.5", "note": "new"},
                 {"component": "bad name", "note": "x"}, {"component": "2.2", "note": "y" * 10_000}]}))
    assert import_pins(theirs, cache) == (1, 3)
    assert cache.labels("fpA") == {"1.1": "<b>operand A</b>", "1.3": "operator mover", "5.5": "new"}
    other = make("o", "organism", "fpZ", {}, None)
    other.pins = [{"component": "1.3", "note": "another model's"}]
    assert import_pins(other, cache) == (1, 0)
    assert cache.labels("fpA")["1.3"] == "operator mover" and cache.labels("fpZ") == {"1.3": "another model's"}
