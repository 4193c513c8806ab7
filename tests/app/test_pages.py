"""AppTest of every analysis page: widgets present, charts render, bad input gives st.error."""

from __future__ import annotations

import re

from tests.app.conftest import errors, page


def _ok(at):
    assert not at.exception, at.exception
    assert not errors(at), errors(at)


def _charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def test_prompt_lab_parses_and_predicts():
    at = page("3_Prompt_lab.py").run()
    _ok(at)
    assert at.text_input(key="typed_prompt").value == "The sum of 3 and 5 is"
    assert _charts(at) >= 1
    md = " ".join(m.value for m in at.markdown)
    assert "3 + 5 = 8" in md and "Counterfactual" in md
    at.text_input(key="typed_prompt").set_value("Q: What is 7 times 8? A:").run()
    _ok(at)
    assert "7 * 8 = 56" in " ".join(m.value for m in at.markdown)


def test_prompt_lab_empty_and_nonsense_prompts():
    at = page("3_Prompt_lab.py").run()
    at.text_input(key="typed_prompt").set_value("").run()
    assert not at.exception and any("empty" in e for e in errors(at))
    at.text_input(key="typed_prompt").set_value("hello there").run()
    assert not at.exception
    assert any("vocabulary" in e for e in errors(at)) or any("no numbers" in w.value for w in at.warning)


def test_bad_model_path_gives_error_on_pages():
    for name in ("3_Prompt_lab.py", "4_Path_patching.py"):
        at = page(name)
        from ui.session import ModelChoice
        at.session_state["model_choice"] = ModelChoice(spec="/no/such/model")
        at.run()
        assert not at.exception
        assert any("does not exist" in e for e in errors(at))


def test_patching_heatmap_and_head_selection_changes_attention_view():
    at = page("4_Path_patching.py").run()
    _ok(at)
    assert _charts(at) >= 3  # heatmap + token attention + role attention
    first = [h.value for h in at.subheader]
    assert any(v.startswith("Head ") for v in first)
    at.session_state["selected_head"] = (3, 5)
    at.run()
    _ok(at)
    assert "Head 3.5" in [h.value for h in at.subheader]
    assert first != [h.value for h in at.subheader]  # the attention view moved to the chosen head
    assert len(at.dataframe) >= 1 and len(at.dataframe[0].value) == 5


def test_patching_stability_tab():
    at = page("4_Path_patching.py", n=16).run()
    _ok(at)
    box = at.selectbox(key="stability_group")
    assert "*" in box.options[0] or box.value == "*"
    table = next(d.value for d in at.dataframe if "top 5" in d.value.columns)
    assert len(table) >= 5 and "all pairs" in list(table["pairs"])
    share = table["mean share of resamples in the top 5"]
    assert (table["n"] == 1).any() and (share[table["n"] == 1] == "— (1 pair: nothing to resample)").all()  # no 100 %
    assert share[table["n"] > 1].str.endswith("%").all()
    box.set_value("carry:yes").run()
    _ok(at)
    assert at.selectbox(key="stability_group").value == "carry:yes"


def test_patching_what_each_head_carries_on_demand(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))  # its own: "asked, not cached" is its claim
    at = page("4_Path_patching.py", n=12).run()
    _ok(at)
    charts = _charts(at)
    next(b for b in at.button if b.key == "carries_go").click().run()
    _ok(at)
    assert _charts(at) == charts + 1
    table = next(d.value for d in at.dataframe if "carries (most negative effect)" in d.value.columns)
    assert len(table) == 5 and set(table["carries (most negative effect)"]) <= {
        "operator-removed", "operand-a", "operand-b"}
    at.run()  # read from the cache: no button any more
    assert not [b for b in at.button if b.key == "carries_go"]


def test_what_every_head_carries_is_a_heatmap_per_kind_with_every_head():
    """The toggle "Every head": one heatmap per counterfactual kind with a cell for every head (the same cached path
    patchings as the top k: no button the second time), its values the engine's, the settled heads listed."""
    from engine.backends import open_model
    from engine.techniques.carries import carries, what_heads_carry
    at = page("4_Path_patching.py", n=12).run()
    _ok(at)
    for go in [b for b in at.button if b.key == "carries_go"]:  # none where an earlier test of the run cached them
        go.click().run()  # the top k: computes every kind
    at.toggle(key="carries_every").set_value(True).run()
    _ok(at)
    assert not [b for b in at.button if b.key == "carries_go"]  # every head: read from the same cache
    from engine.prompts.promptsets import PromptSetSpec
    model = open_model("organism")
    rows, _ = what_heads_carry(model, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=0),
                               k=model.facts.n_layers * model.facts.n_heads)  # the page's set, recomputed here
    kinds = {r.kind for r in rows}
    assert len(rows) == model.facts.n_layers * model.facts.n_heads * len(kinds) and len(kinds) >= 3
    import pyarrow as pa
    frames = [pa.ipc.open_stream(d.data.data).read_pandas() for c in at.get("arrow_vega_lite_chart")
              + at.get("vega_lite_chart") for d in c.proto.datasets]
    drawn = sorted(round(float(v), 5) for f in frames if "settled" in f for v in f["value"])  # the kinds' heatmaps
    assert drawn == sorted(round(r.value, 5) for r in rows)  # every head under every kind, the engine's values
    settled = [c for c in carries(rows) if c.clear]
    table = next(d.value for d in at.dataframe if "carries (most negative effect)" in d.value.columns)
    assert list(table["head"]) == [f"{c.layer}.{c.head}" for c in settled]
    assert any(f"{len(settled)} of {len(rows) // len(kinds)} heads" in m.value for m in at.markdown)


def test_patching_heatmap_of_the_typed_prompt():
    """The Operation box's last choice: the typed prompt against its counterfactual, one pair, as the heatmap
    (the same numbers as path patching of that one pair); a prompt with no counterfactual is an st.error."""
    from engine.backends import open_model
    from engine.techniques.path_patching import cached_path_patching
    from engine.techniques.promptlab import typed_pair
    at = page("4_Path_patching.py").run()
    _ok(at)
    box = next(s for s in at.selectbox if s.label == "Operation")
    assert box.options[-1] == "the typed prompt alone"
    box.set_value("typed").run()
    _ok(at)
    model = open_model("organism", device="cpu")
    table, _ = cached_path_patching(model, [typed_pair(model.tokenizer, "The sum of 3 and 5 is")])
    want = [(a, b, round(e, 4)) for a, b, e in table.top_heads(5)]
    got = at.dataframe[0].value
    assert [(int(r.layer), int(r.head), round(float(r.effect), 4)) for r in got.itertuples()] == want
    assert any("The sum of 3 and 5 is" in c.value and "one pair" in c.value for c in at.caption)
    at.session_state["prompt"] = "hello there"
    at.run()
    assert not at.exception
    assert any("Cannot patch the typed prompt" in e for e in errors(at)), errors(at)


def test_mlp_projection_page():
    at = page("5_MLP_projections.py").run()
    _ok(at)
    assert _charts(at) >= 1 and len(at.dataframe) == 1


def test_knockout_page_changes_prediction(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))  # its own: "asked, not cached" is its claim
    at = page("6_Knockout.py").run()
    _ok(at)
    before = at.table[0].value.copy()
    at.multiselect(key="knockout_mlps").set_value([0, 5]).run()
    _ok(at)
    after = at.table[0].value
    assert list(after["before"]) == list(before["before"])
    assert list(after["after knockout"]) != list(before["after knockout"])
    # the Fig. 3 curve only when asked, its cost on the button; then read from the cache (the one chart before it:
    # where your prompt breaks, k = 0..10, one forward pass)
    assert _charts(at) == 1
    go = next(b for b in at.button if b.key == "knockout_curve_go")
    assert re.search(r"\(estimated: about \d+ (s|min), \d+ forward passes of the set\)$", go.label), go.label
    go.click().run()
    _ok(at)
    assert _charts(at) >= 2 and not [b for b in at.button if b.key == "knockout_curve_go"]  # pressed: gone
    assert any("95 % bootstrap intervals" in c.value for c in at.caption)  # the curve's bands are intervals
    at.run()
    assert _charts(at) >= 2 and not [b for b in at.button if b.key == "knockout_curve_go"]


def test_faithfulness_page_on_demand_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "results.duckdb"))  # its own: "asked, not cached" is its claim
    at = page("11_Faithfulness.py").run()
    _ok(at)
    assert _charts(at) == 0 and any("circuits" in i.value for i in at.info)
    next(b for b in at.button if b.key == "faithfulness_go").click().run()
    _ok(at)
    assert _charts(at) == 1 and not [b for b in at.button if b.key == "faithfulness_go"]  # pressed: gone
    scores = at.dataframe[0].value
    assert list(scores["ranking"]) == ["exact path patching", "attribution patching (AtP)",
                                       "random (one order per pair)"]
    assert all("[" in v for v in scores["CPR"])  # every CPR with its interval
    at.radio(key="faith_metric").set_value("accuracy").run()  # another metric: read from the same cached result
    _ok(at)
    assert _charts(at) == 1 and not [b for b in at.button if b.key == "faithfulness_go"]
    mib = [b for b in at.get("download_button") if "importances.json" in str(b.proto.label)]
    assert len(mib) == 2  # addition and subtraction


def test_circuit_page_draws_and_a_click_names_the_node(monkeypatch):
    at = page("12_Circuit.py").run()
    _ok(at)
    assert _charts(at) == 1
    labels = [b.proto.label for b in at.get("download_button")]
    assert {"Diagram (JSON)", "Diagram (SVG)", "Diagram (PNG)"} <= set(labels)
    from streamlit.elements.vega_charts import VegaLiteState
    from streamlit.util import AttributeDictionary

    from views.circuit_diagram import DIAGRAM_SELECTION
    at.session_state["circuit_5_3_False"] = VegaLiteState(
        {"selection": AttributeDictionary({DIAGRAM_SELECTION: [{"id": "answer"}]})})
    at.run()
    _ok(at)
    assert any("**answer logit** (answer)" in m.value for m in at.markdown)
    # head -> head asked for: the box beside the button names what is left, not the parts the diagram has cached
    # (every computation asked for here, whatever its estimate on this machine)
    monkeypatch.setattr("engine.cost.HEAVY_S", 0.0)
    at = page("12_Circuit.py").run()
    at.toggle(key="circuit_senders_input").set_value(True).run()
    _ok(at)
    left = [i.value for i in at.info if i.value.startswith("Still to compute for this diagram: ")]
    assert left and "head → head path patching into " in left[0], [i.value for i in at.info]
    assert "path patching;" not in left[0] and "the attention by token role" not in left[0]


def test_transfer_page():
    at = page("7_Transfer.py").run()
    _ok(at)
    next(b for b in at.button if b.label.startswith("Compare (estimated: ")).click().run()
    _ok(at)
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 2
    # an input changes: the last comparison stays, with a note saying which inputs it is for
    next(n for n in at.number_input if n.label == "Top k").set_value(3).run()
    _ok(at)
    assert len(at.dataframe) == 1 and any("Showing the last comparison" in i.value for i in at.info)


def test_transfer_page_says_when_a_set_rests_on_too_few_pairs():
    """A set of fewer than SMALL_SET answered pairs (the lab's rule, engine.numerics.intervals.small_set_note): a
    warning beside the shared key heads names that set and its pairs, and says to raise 'Prompts per op'; two sets
    of enough pairs: no such warning."""
    from engine.numerics.intervals import SMALL_SET
    at = page("7_Transfer.py", n=3).run()  # B: word problems, additions only -- at most 3 pairs
    _ok(at)
    next(b for b in at.button if b.label.startswith("Compare (estimated: ")).click().run()
    _ok(at)
    table = at.dataframe[0].value
    n_b = int(table.loc[table["set"] == "B", "pairs"].iloc[0])
    assert n_b < SMALL_SET
    few = [w.value for w in at.warning if "Too few pairs" in w.value]
    assert len(few) == 1 and f"set B on {n_b} prompt pair" in few[0] and f"at least {SMALL_SET}" in few[0], few
    assert "Raise 'Prompts per op' in the sidebar" in few[0]
    at = page("7_Transfer.py", n=12).run()
    next(s for s in at.selectbox if s.label == "Second set (B)").set_value("paper templates").run()
    next(b for b in at.button if b.label.startswith("Compare (estimated: ")).click().run()
    _ok(at)
    table = at.dataframe[0].value
    assert min(table["pairs"]) >= SMALL_SET, table
    assert not any("Too few pairs" in w.value for w in at.warning), [w.value for w in at.warning]


def test_patching_page_shows_answer_tokens_and_role_definitions():
    from engine.techniques.attention import ROLE_DEFINITIONS
    at = page("4_Path_patching.py").run()
    _ok(at)
    md = " ".join(m.value for m in at.markdown)
    assert "First answer tokens of these" in md
    assert all(f"**{role}**: {text}" in md for role, text in ROLE_DEFINITIONS.items())
    assert not any("same first answer token" in w.value for w in at.warning)  # balanced by default
    at.session_state["prompt_set"] = {"ops": ["add"], "families": at.session_state["prompt_set"]["families"],
                                      "n": 30, "seed": 0, "balance": False}
    at.run()
    _ok(at)
    assert any(re.search(r"of the add prompts \(\d+ of 30\) have the same first answer token '1'", w.value)
               for w in at.warning), \
        [w.value for w in at.warning]


def test_patching_exact_vs_attribution_tab_and_head_to_head_on_demand():
    at = page("4_Path_patching.py").run()
    _ok(at)
    assert [t.label for t in at.tabs] == ["Heatmap", "Exact vs attribution", "Stability", "What each head carries"]
    assert not any("Spearman" in c.value for c in at.caption)  # on demand: nothing computed on the first visit
    go = [b for b in at.button if b.key == "atp_go_True"]
    assert go and re.search(r"\(estimated: about \d+ (s|min), \d+ forward passes of the set\)$", go[0].label)
    assert any("adds one forward pass of the set per sender" in i.value for i in at.info)
    go[0].click().run()
    _ok(at)
    assert any("Spearman" in c.value for c in at.caption)
    assert any("missed by AtP" in str(list(d.value.columns)) for d in at.dataframe)
    at.session_state["selected_head"] = (3, 5)
    at.run()
    _ok(at)
    assert "What feeds head 3.5" in [h.value for h in at.subheader]
    go = [b for b in at.button if b.key == "h2h_go_3.5:q"]
    assert go and "27 senders" in go[0].label  # 3 layers x (8 heads + MLP)
    n_charts = _charts(at)
    go[0].click().run()
    _ok(at)
    assert _charts(at) == n_charts + 1  # the head -> head heatmap
    at.run()  # now read from the cache: no button
    assert not [b for b in at.button if b.key == "h2h_go_3.5:q"] and _charts(at) == n_charts + 1


def _chart_rows(at, field: str) -> list:
    """Every value of ``field`` in the data of the page's charts (each chart's datasets, as Arrow streams)."""
    import pyarrow as pa
    out = []
    for c in at.get("arrow_vega_lite_chart") + at.get("vega_lite_chart"):
        for d in c.proto.datasets:
            df = pa.ipc.open_stream(d.data.data).read_pandas()
            out += list(df[field]) if field in df else []
    return out


def test_path_patching_words_follow_the_counterfactual_kind():
    """The page's text names the sidebar's counterfactual and what a red head carries under it."""
    at = page("4_Path_patching.py", n=6).run()
    _ok(at)
    text = " ".join(c.value for c in at.caption)
    assert "counterfactual prompt (operator removed)" in text and "carries the operation" in text
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "counterfactual": "operand-a"}
    at.run()
    _ok(at)
    text = " ".join(c.value for c in at.caption)
    assert "counterfactual prompt (operand A changed)" in text and "carries operand A" in text
    assert "operator removed" not in text


def test_patching_heatmap_of_the_carry_groups():
    """Issue 49: the Operation box offers the pairs that carry (borrow) and those that do not; each shows the cached
    table's heatmap and key heads of those pairs, and says how many of the set's pairs they are."""
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    at = page("4_Path_patching.py").run()
    _ok(at)
    box = next(s for s in at.selectbox if s.label == "Operation")
    assert box.options[-3:] == ["with a carry / borrow", "without a carry / borrow", "the typed prompt alone"]
    words = {"carry:yes": "With a carry / borrow", "carry:no": "Without a carry / borrow"}
    model = open_model("organism", device="cpu")
    spec = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=0)
    pairs, _ = kept_pairs(model, spec)
    table, _ = cached_path_patching(model, pairs)
    for group in ("carry:yes", "carry:no"):
        next(s for s in at.selectbox if s.label == "Operation").set_value(group).run()
        _ok(at)
        got = at.dataframe[0].value
        metric = got.columns[2]
        want = [(a, b, round(e, 4)) for a, b, e in table.top_heads(len(got), metric, group)]
        assert [(int(r[0]), int(r[1]), round(float(r[2]), 4)) for r in got.itertuples(index=False)] == want
        n = len(table.per_pair.groups()[group])
        assert any(c.value.startswith(f"{words[group]}: {n} of the {len(pairs)} pairs")
                   for c in at.caption), [c.value for c in at.caption][:6]


def test_attention_bars_and_their_caption_follow_the_typed_prompt():
    """The clicked head's attention chart is the typed prompt's, token by token with roles, and its caption names
    that prompt: another prompt, another chart and caption."""
    at = page("4_Path_patching.py", n=6)
    at.session_state["selected_head"] = (1, 3)
    at.run()
    _ok(at)
    assert {"5: 3", "7: 5"} <= set(_chart_rows(at, "label"))
    assert any("`The sum of 3 and 5 is`" in c.value for c in at.caption)
    at.session_state["prompt"] = "The sum of 4 and 2 is"
    at.run()
    _ok(at)
    labels = set(_chart_rows(at, "label"))
    assert {"5: 4", "7: 2"} <= labels and "7: 5" not in labels
    assert {"operand A", "operand B", "operator"} <= set(_chart_rows(at, "role"))
    assert any("`The sum of 4 and 2 is`" in c.value for c in at.caption)


def test_mlp_page_marks_the_answer_and_says_where_it_ranks():
    """The top numbers of each layer's MLP mark the typed prompt's answer and the sentence above them is about that
    answer: another prompt, another answer named."""
    at = page("5_MLP_projections.py", n=6).run()
    _ok(at)
    md = " ".join(m.value for m in at.markdown)
    assert "the answer 8" in md.lower()
    at.session_state["prompt"] = "The sum of 4 and 2 is"
    at.run()
    _ok(at)
    md = " ".join(m.value for m in at.markdown)
    assert "the answer 6" in md.lower() and "the answer 8" not in md.lower()
