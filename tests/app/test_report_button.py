"""AppTest of the sidebar's "Build the report" button (issue 47, every export on every set): it builds the report of
the sidebar's set -- a written template, with a small set's Numbers probe in the cache (the researcher's failure:
"max() arg is an empty sequence", the bar left at "step 7 of 7 · finishing") -- and an error clears its progress
bar and says what went wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import errors

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TEMPLATE = "add:{A} [plus] {B} is"  # one the bundled model answers (it does not know "make")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _home(prompt_set: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["prompt_set"] = prompt_set
    at.run()
    assert not at.exception, at.exception
    return at


def _progress_bars(at: AppTest) -> list:
    return [e for e in at.get("progress")]


def test_the_report_of_a_written_template_builds_with_a_small_sets_numbers_cached():
    from cache import ResultCache
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.numbers import cached_number_probes
    spec = PromptSetSpec(ops=("add",), n=8, templates=(TEMPLATE,))
    model, cache = open_model("organism"), ResultCache()
    pairs, _ = kept_pairs(model, spec, cache=cache)
    rows, _ = cached_number_probes(model, pairs, cache=cache)  # the Numbers page, visited before the report
    assert not [r for r in rows if r.method == "logistic" and r.target == "C" and r.position == "END"], \
        "the set should be too small for the probe of C (the case that failed)"
    at = _home({"ops": ["add"], "families": "paper (Fig. 8, 32 templates)", "n": 8, "seed": 0,
                "template": TEMPLATE})
    at.button(key="report_build").click().run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    assert not _progress_bars(at)
    html = at.session_state[[k for k in at.session_state if str(k).startswith("report:")][0]]
    assert "A linear probe of C was not fitted on these" in html  # the summary's sentence says why
    assert [b for b in at.get("download_button") if "Download report" in str(b.proto.label)]


def test_an_error_clears_the_progress_bar_and_says_why(monkeypatch):
    import engine.findings.report as report

    def fails(*args, progress=None, **kw):
        progress(len(report.phases()), len(report.phases()))  # the bar at its last step, as in the issue
        raise ValueError("no rows to build")
    monkeypatch.setattr(report, "build_report", fails)
    at = _home({"ops": ["add"], "families": "paper (Fig. 8, 32 templates)", "n": 4, "seed": 0})
    at.button(key="report_build").click().run()
    assert not at.exception, at.exception
    assert errors(at) == ["Cannot build the report: no rows to build"]
    assert not _progress_bars(at), "the progress bar stayed after the error"
    assert not [b for b in at.button if b.key == "stop:building_the_report__step"]
