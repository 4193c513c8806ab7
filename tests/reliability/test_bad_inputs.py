"""Hostile and broken inputs, in the pages (AppTest) and the CLI: each gets a clear message (st.error /
st.warning / st.info in pages; one ``error:`` line and exit status 2 in the CLI), never a traceback,
and every result cached before the case is still in the cache afterwards."""

from __future__ import annotations

import json
import os
import shutil

import duckdb
import pytest

from tests.reliability.conftest import (
    BAD_MODELS,
    ORGANISM,
    SMALL_SET,
    SMALL_SET_ARGS,
    make_bad_model,
    n_charts,
    page_results,
    run_page,
    snapshot,
    start_cli,
    start_pages_unprivileged,
    texts,
)

ANALYSIS_PAGES = ("4_Path_patching.py", "5_MLP_projections.py", "6_Knockout.py")

# ---------------------------------------------------------------------------------------------
# typed prompts
# ---------------------------------------------------------------------------------------------
# case -> (prompt, where the Prompt lab says it, phrase, CLI: error phrase or None when it runs)
PROMPTS = {
    "empty": ("", "error", "the prompt is empty", "the prompt is empty"),
    "10000_characters": ("1 + 2 = " * 1250, "error", "keep it under 2000", "keep it under 2000"),
    "emoji": ("🧮 3 + 5 = 🙂", "info", "not in this model's vocabulary", None),
    "other_scripts": ("三 加 五 等于 3 + 5 =", "info", "not in this model's vocabulary", None),
    "other_script_digits": ("٣ + ٥ =", "warning", "no numbers (digits 0-9)", None),
    "no_numbers": ("The sum of and is", "warning", "no numbers", None),
    "no_known_word": ("hello there", "error", "vocabulary", "vocabulary"),
    "multi_token_operands": ("123 + 456 =", "info", "operand 123 is 3 tokens", None),
    "model_gets_it_wrong": ("2 ^ 3 =", "markdown", "the model gets it wrong", None),
}


@pytest.mark.parametrize("case", list(PROMPTS))
def test_typed_prompt_in_pages(case, seeded_cache):
    text, where, phrase, _ = PROMPTS[case]
    at = run_page("3_Prompt_lab.py", prompt=text)
    assert not at.exception, texts(at, "exception")
    shown = texts(at, where)
    assert any(phrase in s for s in shown), (where, shown, texts(at, "error"))
    if where != "error":
        assert not at.error, texts(at, "error")
        assert n_charts(at) >= 1  # the next-token chart is still shown
    for name in ANALYSIS_PAGES:  # the other pages analyse the same typed prompt
        at = run_page(name, prompt=text)
        assert not at.exception, (name, texts(at, "exception"))
        errs = texts(at, "error")
        if where == "error":
            assert any(phrase in e for e in errs), (name, errs)
        else:
            assert not errs, (name, errs)
        assert n_charts(at) >= 1, name  # the set-level charts do not depend on the typed prompt
    seeded_cache.assert_intact()


@pytest.mark.parametrize("case", list(PROMPTS))
def test_typed_prompt_in_cli(case, seeded_cache, cli, tmp_path):
    text, _, _, cli_error = PROMPTS[case]
    r = cli("knockout", "--heads", "0.1", "--text", text, *SMALL_SET_ARGS)
    if cli_error is not None:
        assert cli_error in r.error_line()
        r = cli("attention", "--text", text, "--layer", "0", "--head", "0", "--out", str(tmp_path / "a.csv"))
        assert cli_error in r.error_line() and not (tmp_path / "a.csv").exists()
    else:
        assert r.rc == 0 and not r.err.strip(), r.err
        res = json.loads(r.out)
        assert res["text"] == text and len(res["top5_before"]) == 5
        if case == "model_gets_it_wrong":
            assert res["parsed"]["answer"] == 8 and res["top5_before"][0]["token"] != "8"
        if case in ("no_numbers", "other_script_digits"):
            assert "no numbers" in res["parsed"]["error"]
        if case == "multi_token_operands":
            assert (res["parsed"]["a"], res["parsed"]["b"], res["parsed"]["answer"]) == (123, 456, 579)
    seeded_cache.assert_intact()


# ---------------------------------------------------------------------------------------------
# numbers and names: k, n, op, operands
# ---------------------------------------------------------------------------------------------
ARGS = {
    "k_max_above_heads": (("knockout-curve", "--k-max", "65", "--out", "{tmp}/c.csv"), "exceeds the model's 64 heads"),
    "transfer_k_above_heads": (("transfer", "--k", "65"), "1..64"),
    "head_above_heads": (("knockout", "--heads", "0.8"), "does not exist"),
    "attention_head_above_heads": (("attention", "--text", "3 + 5 =", "--layer", "0", "--head", "8",
                                    "--out", "{tmp}/a.csv"), "does not exist"),
    "n_zero": (("accuracy", "--n", "0"), "positive"),
    "n_negative": (("accuracy", "--n", "-3"), "positive"),
    "draws_zero": (("knockout-curve", "--draws", "0", "--out", "{tmp}/c.csv"), "positive"),
    "unknown_op": (("accuracy", "--op", "mod"), "unknown operation"),
    "no_op": (("accuracy", "--op", ""), "no operation"),
    "empty_operand_range": (("accuracy", "--operands", "9-1"), "empty"),
}


@pytest.mark.parametrize("case", list(ARGS))
def test_bad_numbers_and_names_in_cli(case, seeded_cache, cli, tmp_path):
    argv, phrase = ARGS[case]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert phrase in cli(*argv, *([] if "--op" in argv or argv[0] == "transfer" else ["--op", "add"])).error_line()
    assert not list(tmp_path.glob("*.csv"))
    seeded_cache.assert_intact()


def test_multi_token_operands_in_cli(seeded_cache, cli):
    """Operands 10-99 are two tokens for the bundled model: supported, the accuracy is reported."""
    r = cli("accuracy", "--op", "add", "--n", "8", "--operands", "10-99")
    assert r.rc == 0 and not r.err.strip(), r.err
    res = json.loads(r.out)
    assert res["per_op"]["add"]["n"] == 8 and 0.0 <= res["per_op"]["add"]["first_token"] <= 1.0
    seeded_cache.assert_intact()


def test_k_n_and_op_widgets_refuse_bad_values(seeded_cache):
    """Pages take k, n and operations from bounded widgets: out-of-range values never reach the engine."""
    at = run_page("4_Path_patching.py")
    k = next(w for w in at.number_input if w.label == "Top k")
    assert k.max == 64  # the model's heads
    k.set_value(49).run()
    assert not at.exception and not at.error
    assert next(w for w in at.number_input if w.label == "Top k").value <= 64
    assert len(at.dataframe[0].value) <= 64
    for bad_n in (0, -5):
        at.sidebar.number_input(key="ps_n").set_value(bad_n)
        next(b for b in at.sidebar.button if b.label == "Use this set").click().run()
        assert not at.exception and not at.error
        assert at.session_state["prompt_set"]["n"] >= 1
    at.sidebar.multiselect(key="ps_ops").set_value(["mod"])
    next(b for b in at.sidebar.button if b.label == "Use this set").click().run()
    assert not at.exception
    assert any("pick at least one operation" in e for e in texts(at, "error"))
    seeded_cache.assert_intact()


# ---------------------------------------------------------------------------------------------
# models that cannot be used
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(BAD_MODELS))
def test_bad_model_in_cli(kind, seeded_cache, cli, tmp_path):
    model, marker = make_bad_model(kind, tmp_path / "models")
    out = tmp_path / "e.csv"
    line = cli("path-patching", "--model", str(model), "--out", str(out), *SMALL_SET_ARGS).error_line()
    assert BAD_MODELS[kind] in line
    assert not out.exists() and not marker.exists()
    seeded_cache.assert_intact()


@pytest.mark.parametrize("kind", list(BAD_MODELS))
def test_bad_model_in_pages(kind, seeded_cache, tmp_path):
    model, marker = make_bad_model(kind, tmp_path / "models")
    for name in ("app.py", "3_Prompt_lab.py"):
        at = run_page(name, model=str(model))
        assert not at.exception, (name, texts(at, "exception"))
        errs = texts(at, "error")
        assert len(errs) == 1 and "Cannot load model" in errs[0] and BAD_MODELS[kind] in errs[0], (name, errs)
    assert not marker.exists()
    seeded_cache.assert_intact()


@pytest.fixture(scope="module")
def permission_cases(seed_template, tmp_path_factory):
    """The cases that need real file permissions, run once for the module in processes without
    CAP_DAC_OVERRIDE (so they apply even to root): a model directory and a weights file without
    read permission, and a cache file without write permission -- through the CLI and the pages."""
    root = tmp_path_factory.mktemp("unprivileged")
    models = {}
    for what in ("directory", "weights"):
        models[what] = root / f"unreadable-{what}"
        shutil.copytree(ORGANISM, models[what])
    caches = {}
    for name in ("models", "read_only"):
        caches[name] = root / name / "results.duckdb"
        caches[name].parent.mkdir()
        shutil.copy2(seed_template, caches[name])
    baseline = snapshot(seed_template)
    targets = [models["directory"], models["weights"] / "model.safetensors", caches["read_only"]]
    modes = [t.stat().st_mode for t in targets]
    targets[0].chmod(0)
    targets[1].chmod(0)
    targets[2].chmod(0o444)
    try:  # all five processes side by side: they only import and read
        ro = caches["read_only"]
        started = {what: start_cli("info", "--model", str(m), cache=caches["models"], enforce_permissions=True)
                   for what, m in models.items()}
        started["ro_hit"] = start_cli("path-patching", "--out", str(root / "e.csv"), *SMALL_SET_ARGS, cache=ro,
                                      enforce_permissions=True)
        started["ro_miss"] = start_cli("accuracy", *SMALL_SET_ARGS, cache=ro, enforce_permissions=True)
        pages = start_pages_unprivileged(
            [{"page": "app.py", "cache": str(caches["models"]), "model": str(m), "prompt_set": SMALL_SET}
             for m in models.values()]
            + [{"page": "4_Path_patching.py", "cache": str(ro), "prompt_set": {**SMALL_SET, "seed": 1}},
               {"page": "4_Path_patching.py", "cache": str(ro), "prompt_set": SMALL_SET}])
        out = {name: p.result() for name, p in started.items()}
        out["page_directory"], out["page_weights"], out["ro_miss_page"], out["ro_hit_page"] = page_results(pages)
        out["ro_mode"] = ro.stat().st_mode & 0o777
    finally:
        for t, mode in zip(targets, modes):
            t.chmod(mode & 0o7777)
    out["snapshots"] = {name: snapshot(db) for name, db in caches.items()}
    out["baseline"] = baseline
    return out


@pytest.mark.parametrize("what", ["directory", "weights"])
def test_unreadable_model(what, permission_cases):
    """A model directory (or its weights file) without read permission."""
    assert "Permission denied" in permission_cases[what].error_line()
    page = permission_cases[f"page_{what}"]
    assert not page["exception"], page["exception"]
    assert len(page["error"]) == 1 and "Cannot load model" in page["error"][0], page["error"]
    assert "Permission denied" in page["error"][0]
    assert permission_cases["snapshots"]["models"] == permission_cases["baseline"]  # nothing lost (nor added)


def test_read_only_cache(permission_cases):
    """A cache file without write permission: cached results are served, new ones are computed and
    shown, the user is told they were not stored, nothing is lost."""
    hit, miss = permission_cases["ro_hit"], permission_cases["ro_miss"]
    assert hit.rc == 0 and json.loads(hit.out)["cached"] is True and not hit.err.strip(), hit.err
    line = miss.error_line()
    assert "not cached" in line and "not writable" in line
    assert json.loads(miss.out)["per_op"]["add"]["n"] == 8  # the output is complete
    miss, hit = permission_cases["ro_miss_page"], permission_cases["ro_hit_page"]  # another / the cached set
    assert not miss["exception"] and not hit["exception"], (miss["exception"], hit["exception"])
    assert len(miss["error"]) == 1 and "not cached" in miss["error"][0], miss["error"]
    assert miss["charts"] >= 3 and any("computed now" in c for c in miss["caption"])  # shown all the same
    assert not hit["error"] and hit["charts"] >= 3
    assert any("read from the cache" in c for c in hit["caption"])
    assert permission_cases["ro_mode"] == 0o444
    assert permission_cases["snapshots"]["read_only"] == permission_cases["baseline"]  # nothing lost, nothing written


# ---------------------------------------------------------------------------------------------
# the cache file: corrupt, read-only, full disk
# ---------------------------------------------------------------------------------------------

def _corrupt(db) -> bytes:
    damaged = os.urandom(64 * 1024)
    db.write_bytes(damaged)
    return damaged


def test_corrupt_cache_in_cli(seeded_cache, cli):
    damaged = _corrupt(seeded_cache.path)
    r = cli("accuracy", *SMALL_SET_ARGS)
    line = r.error_line()
    assert "damaged" in line and "moved aside" in line
    assert json.loads(r.out)["per_op"]["add"]["n"] == 8  # the output is complete
    [aside] = seeded_cache.path.parent.glob("results.duckdb.corrupt-*")
    assert aside.read_bytes() == damaged  # kept byte for byte, not deleted
    again = cli("accuracy", *SMALL_SET_ARGS)
    assert again.rc == 0 and json.loads(again.out)["cached"] is True and not again.err.strip()


def test_corrupt_cache_in_pages(seeded_cache):
    damaged = _corrupt(seeded_cache.path)
    at = run_page("4_Path_patching.py")
    assert not at.exception
    errs = texts(at, "error")
    assert len(errs) == 1 and "damaged" in errs[0] and "moved aside" in errs[0], errs
    assert n_charts(at) >= 3  # the results are computed and shown all the same
    [aside] = seeded_cache.path.parent.glob("results.duckdb.corrupt-*")
    assert aside.read_bytes() == damaged
    at = run_page("4_Path_patching.py")  # the fresh cache now serves the page
    assert not at.exception and not at.error
    assert any("read from the cache" in c for c in texts(at, "caption"))


@pytest.fixture()
def full_disk(monkeypatch):
    """Every row insert fails the way DuckDB reports a full disk."""
    import cache.bulk

    def no_space(*args, **kwargs):
        raise duckdb.IOException('IO Error: Could not write file "results.duckdb.wal": No space left on device')
    monkeypatch.setattr(cache.bulk, "_insert_chunk", no_space)


def test_full_disk_in_cli(seeded_cache, full_disk, cli, tmp_path):
    hit = cli("path-patching", "--out", str(tmp_path / "e.csv"), *SMALL_SET_ARGS)
    assert hit.rc == 0 and json.loads(hit.out)["cached"] is True and not hit.err.strip()
    miss = cli("accuracy", *SMALL_SET_ARGS)
    line = miss.error_line()
    assert "not cached" in line and "disk (or quota) is full" in line
    assert json.loads(miss.out)["per_op"]["add"]["n"] == 8
    seeded_cache.assert_intact()
    assert snapshot(seeded_cache.path).keys() == seeded_cache.baseline.keys()


def test_full_disk_in_pages(seeded_cache, full_disk):
    at = run_page("app.py")
    assert not at.exception
    errs = texts(at, "error")
    assert len(errs) == 1 and "disk (or quota) is full" in errs[0], errs
    assert len(at.dataframe) >= 1 and n_charts(at) >= 1  # the accuracy is shown all the same
    at = run_page("6_Knockout.py")
    assert not at.exception and not at.error  # cached results are still served
    seeded_cache.assert_intact()
    assert snapshot(seeded_cache.path).keys() == seeded_cache.baseline.keys()
