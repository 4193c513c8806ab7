"""One Step entry is one finding everywhere: a step added to engine.findings.steps.STEPS (and nowhere else)
appears in the circuit summary, the Paper page's verdicts, the HTML report and the Story page."""

from __future__ import annotations

import pytest

from cache import ResultCache
from engine.findings import steps
from engine.findings.checks import Verdict
from engine.prompts.promptsets import PromptSetSpec
from engine.techniques.accuracy import kept_pairs
from engine.techniques.path_patching import cached_path_patching

SPEC = PromptSetSpec(ops=("add",), n=6, seed=0)
SENTENCE = "The fake step counts {n} prompt pairs."


def fake_sentence(model, pairs, cache, table) -> str:
    return SENTENCE.format(n=len(pairs))


def fake_check(ev) -> Verdict:
    return Verdict(f"{len(ev.pairs)} pairs counted", True, "holds when pairs can be counted")


FAKE = steps.Step("pair count", "Fig. 99", "Prompt pairs can be counted", "99 pairs", "numbers",
                  fake_sentence, fake_check, 5, "Counting the pairs")


@pytest.fixture()
def with_fake(monkeypatch):
    monkeypatch.setattr(steps, "STEPS", (*steps.STEPS, FAKE))
    return FAKE


def test_one_step_reaches_summary_paper_and_report(with_fake, model, tmp_path):
    from engine.findings.paper import paper_findings
    from engine.findings.report import build_report
    from engine.findings.summary import circuit_summary
    from views.report import render_html
    cache = ResultCache(tmp_path / "c.duckdb")
    pairs, _ = kept_pairs(model, SPEC, cache=cache)
    cached_path_patching(model, pairs, cache=cache)
    text = SENTENCE.format(n=len(pairs))

    last = circuit_summary(model, pairs, cache)[-1]
    assert (last.step, last.text, last.technique, last.computed) == ("pair count", text, "numbers", True)

    rows = paper_findings(model, pairs, cache, sft=lambda: "no job")
    fake = rows[-1]
    assert (fake.key, fake.figure, fake.lab, fake.holds) == ("pair count", "Fig. 99", f"{len(pairs)} pairs counted",
                                                             True)

    rep = build_report(model, SPEC, cache, k_max=2, draws=1, paper=True)
    html = render_html(rep)
    assert text in html and "Fig. 99: Prompt pairs can be counted" in html and f"{len(pairs)} pairs counted" in html
    # the circuit diagram is in the report: its heads are the report's top heads, in order, with their effects
    heads = [n for n in rep.circuit["nodes"] if n["kind"] == "head"]
    metric = next(k for k in rep.top_heads[0] if k not in ("layer", "head"))
    top = {(t["layer"], t["head"]): t[metric] for t in rep.top_heads}
    assert set(top) <= {(n["layer"], n["head"]) for n in heads}  # the report lists 3 top heads, the diagram 5
    effects = {(n["layer"], n["head"]): n["effect"] for n in heads}
    assert all(effects[h] == pytest.approx(v, rel=1e-6) for h, v in top.items())
    assert "The circuit (Fig. 1)" in html


def test_one_step_reaches_the_story_page(with_fake, tmp_path, monkeypatch):
    """The Story page gains the step's screen (last), with its measured sentence and a link to its page."""
    from tests.app.conftest import errors, page
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "c.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = page("1_Story.py")
    at.session_state["story_step"] = 2  # the key heads (steps count from 1): path patching is computed here
    at.run()
    assert not at.exception and not errors(at)
    at.session_state["story_step"] = 99
    at.run()
    assert at.header[0].value.endswith(" · Counting the pairs"), at.header[0].value
    told = [m.value for m in at.markdown if m.value.startswith("<p class='story-sentence'>")]
    assert len(told) == 1 and "The fake step counts" in told[0] and "prompt pairs." in told[0], told
    assert not at.exception and not errors(at)
