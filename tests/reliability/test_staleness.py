"""Staleness: new weights give a new fingerprint, so no result cached for the old weights is ever shown
for the new ones (CLI and a long-running dashboard); a schema-version bump ignores old rows cleanly."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.reliability.conftest import ORGANISM, SMALL_SET_ARGS, run_page, snapshot, texts


def _copy_organism(dst):
    shutil.copytree(ORGANISM, dst)
    return dst


def _replace_weights(model_dir) -> None:
    """Overwrite the weights in place with different ones: the final norm's scale negated, which
    turns the logits upside down (the most likely token becomes the least likely)."""
    from safetensors.torch import load_file, save_file
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["model.norm.weight"] = -tensors["model.norm.weight"]
    save_file(tensors, path, metadata={"format": "pt"})


def test_new_weights_new_fingerprint_in_cli(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    model = _copy_organism(tmp_path / "model")
    args = ("accuracy", "--model", str(model), *SMALL_SET_ARGS)
    first = json.loads(cli(*args).out)
    assert first["cached"] is False and json.loads(cli(*args).out)["cached"] is True
    _replace_weights(model)
    r = cli(*args)
    assert r.rc == 0, r.err
    new = json.loads(r.out)
    assert new["fingerprint"] != first["fingerprint"]
    assert new["cached"] is False  # the old weights' result is not served
    fresh = json.loads(cli(*args, "--no-cache").out)
    assert new["per_op"] == fresh["per_op"] != first["per_op"]  # and it is what the new weights give
    assert {v[1] for v in snapshot(tmp_path / "results.duckdb").values()} == {first["fingerprint"],
                                                                             new["fingerprint"]}


def _home_facts(at) -> dict:
    return json.loads(at.json[0].value)


def test_new_weights_in_a_running_dashboard(tmp_path, monkeypatch):
    """The dashboard keeps loaded models in memory (st.cache_resource); weights replaced on disk
    must be loaded again, not served from memory with the old model's results."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    model = _copy_organism(tmp_path / "model")
    before = run_page("app.py", model=str(model))
    assert not before.exception and not before.error, texts(before, "error")
    acc_before = before.dataframe[0].value["first_token"].to_dict()
    assert run_page("app.py", model=str(model)).caption  # second visit: same model from memory
    _replace_weights(model)
    after = run_page("app.py", model=str(model))  # same process: the same st.cache_resource
    assert not after.exception and not after.error, texts(after, "error")
    assert _home_facts(after)["fingerprint"] != _home_facts(before)["fingerprint"]
    assert any("Computed now" in c for c in texts(after, "caption"))
    assert after.dataframe[0].value["first_token"].to_dict() != acc_before


def test_schema_version_bump_ignores_old_rows(seeded_cache, cli, monkeypatch, tmp_path):
    """Every run in the seeded cache was written under the current schema version; with the version
    bumped (as a release that changes what results mean would do) they are all ignored -- no error,
    recomputed, identical numbers -- and kept, so the old version still reads them."""
    import cache.schema
    from cache import ResultCache
    old_csv, new_csv = tmp_path / "old.csv", tmp_path / "new.csv"
    args = ("patch", *SMALL_SET_ARGS)
    r = cli(*args, "--out", str(old_csv))
    assert r.rc == 0 and json.loads(r.out)["cached"] is True
    version = cache.schema.SCHEMA_VERSION
    monkeypatch.setattr(cache.schema, "SCHEMA_VERSION", version + 1)
    assert ResultCache().list_runs() == []  # the old rows are invisible to the new version
    r = cli(*args, "--out", str(new_csv))
    assert r.rc == 0 and not r.err.strip(), r.err
    assert json.loads(r.out)["cached"] is False
    assert new_csv.read_text() == old_csv.read_text()
    assert sorted(s.method for s in ResultCache().list_runs()) == ["kept_prompts", "path_patching"]
    at = run_page("6_Knockout.py")  # a page under the new version: recomputes, no error
    assert not at.exception and not at.error, texts(at, "error")
    seeded_cache.assert_intact()  # the old rows are still in the file
    monkeypatch.setattr(cache.schema, "SCHEMA_VERSION", version)
    r = cli(*args, "--out", str(old_csv))
    assert r.rc == 0 and json.loads(r.out)["cached"] is True


@pytest.mark.parametrize("version", [0, 10**6])
def test_rows_of_any_other_version_are_never_read(seeded_cache, version):
    """Rows written under another version (older or newer) under the very key a current run would
    use are still ignored: the stored version is checked, not only the key."""
    from cache import ResultCache
    runs = ResultCache().list_runs()
    assert runs
    import duckdb
    con = duckdb.connect(str(seeded_cache.path))
    try:
        con.execute("UPDATE runs SET schema_version = ?", [version])
    finally:
        con.close()
    c = ResultCache()
    assert c.list_runs() == [] and all(c.get(r.run_id) is None for r in runs)
    at = run_page("4_Path_patching.py")
    assert not at.exception and not at.error, texts(at, "error")
    assert any("computed now" in c for c in texts(at, "caption"))
