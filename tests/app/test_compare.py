"""AppTest of the Compare page: A (operator removed) vs B (operand A changed) on one set -- two heatmaps on one
scale, their difference with the cells whose interval excludes 0 counted, the top-k overlap; a kind B cannot use
on the set is an st.error in the page's words."""

from __future__ import annotations

import re

import pytest

from tests.app.conftest import errors, page


def _charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def test_operator_removed_vs_operand_a():
    at = page("17_Compare.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert _charts(at) == 3
    md = " ".join(m.value for m in at.markdown)
    m = re.search(r"(\d+) of (\d+) cells differ", md)
    assert m and int(m.group(2)) == 8 * 9 and 0 < int(m.group(1)) < int(m.group(2)), md
    assert any(re.match(r"Top 5 heads: \d of 5 shared", s.value) for s in at.subheader)


def test_a_kind_the_set_cannot_use_is_an_error():
    at = page("17_Compare.py", n=8).run()
    at.selectbox(key="cmp_kind").set_value("carry").run()
    assert not at.exception and any("B cannot use carry flipped on this set" in e for e in errors(at)), errors(at)


def test_other_templates_and_another_answer_digit_for_b():
    """B with the word problems instead of the paper's templates, then at the units digit: the heatmaps' titles name
    A and B, the difference counts its cells, the copied code builds B's set; the engine's comparison of the same
    two sets gives the page's count of differing cells."""
    from dataclasses import replace

    from engine.backends import open_model
    from engine.findings.compare import compare_tables
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    at = page("17_Compare.py", n=8).run()
    at.radio(key="cmp_axis").set_value("families").run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    md = " ".join(m.value for m in at.markdown)
    assert "**A: paper (Fig. 8, 32 templates)**" in md and "**B: word problems (Fig. 10)**" in md, md[:800]
    from engine.prompts.promptsets import parse_families
    assert f"--families {','.join(parse_families('word'))}" in at.code[0].value.splitlines()[1]
    at.radio(key="cmp_axis").set_value("digit").run()
    at.selectbox(key="cmp_digit").set_value("last").run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    md = " ".join(m.value for m in at.markdown)
    assert "**A: the first digit**" in md and "**B: the last (units) digit**" in md, md[:800]
    assert "--digit last" in at.code[0].value.splitlines()[1]
    m = re.search(r"(\d+) of (\d+) cells differ", md)
    model = open_model("organism")
    spec = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=8, seed=0)
    pairs_a, pairs_b = kept_pairs(model, spec)[0], kept_pairs(model, replace(spec, digit="last"))[0]
    cmp = compare_tables(cached_path_patching(model, pairs_a)[0], cached_path_patching(model, pairs_b)[0],
                         metric="logit_diff", k=5)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(cmp.differing()), len(cmp.cells)), md


def test_another_model_a_tuned_copy_cell_by_cell_and_a_bad_path(tmp_path):
    """B = a copy of the bundled model whose head 1.3 writes half its output (o_proj's slice halved), saved as a
    folder: compared cell by cell (the caption says when that reads the same heads), the difference counted as the
    engine counts it, the code opens B's model; a folder that holds no model is an st.error."""
    import torch

    from engine.backends import open_model
    from engine.findings.compare import compare_tables
    from engine.models.load import load_plain
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    pm = load_plain("organism", device="cpu")
    d_head = pm.hf_model.config.hidden_size // pm.hf_model.config.num_attention_heads
    with torch.no_grad():
        pm.hf_model.model.layers[1].self_attn.o_proj.weight[:, 3 * d_head:4 * d_head] *= 0.5
    folder = tmp_path / "half-1.3"
    pm.hf_model.save_pretrained(folder)
    pm.tokenizer.save_pretrained(folder)
    at = page("17_Compare.py", n=8).run()
    at.radio(key="cmp_axis").set_value("model").run()
    assert not at.exception and not errors(at) and any("Type B's model" in i.value for i in at.info)
    at.text_input(key="cmp_model").set_value(str(folder)).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("tuned copy of A" in c.value for c in at.caption)
    md = " ".join(m.value for m in at.markdown)
    m = re.search(r"(\d+) of (\d+) cells differ", md)
    spec = PromptSetSpec(ops=("add", "sub", "mul", "div"), n=8, seed=0)
    a, b = open_model("organism"), open_model(str(folder))
    cmp = compare_tables(cached_path_patching(a, kept_pairs(a, spec)[0])[0],
                         cached_path_patching(b, kept_pairs(b, spec)[0])[0], metric="logit_diff", k=5)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(cmp.differing()), len(cmp.cells)), md
    assert len(cmp.differing()) > 0
    assert f"--model {folder}" in at.code[0].value.splitlines()[1]
    at.text_input(key="cmp_model").set_value(str(folder / "nothing-here")).run()
    assert not at.exception and any("Cannot load model" in e and "Type another model for B" in e
                                    for e in errors(at)), errors(at)


@pytest.mark.realmodel
def test_smollm2_against_the_bundled_model_by_rank():
    """Two shapes (the bundled model's 8 x 8 heads against SmolLM2's 30 x 9): no difference heatmap, the caption
    says why, each model's top k beside the other's by rank, both models' lines in the code."""
    from tests.helpers.smollm2 import smollm2_gguf_path
    at = page("17_Compare.py", n=4).run()
    at.radio(key="cmp_axis").set_value("model").run()
    at.text_input(key="cmp_model").set_value(str(smollm2_gguf_path())).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("no cell of one is a cell of the other" in c.value for c in at.caption)
    assert "cells differ" not in " ".join(m.value for m in at.markdown)
    assert any(s.value == "Top 5 heads of each model" for s in at.subheader)
    table = at.dataframe[0].value
    assert list(table.columns) == ["rank", "A", "B"] and len(table) == 5
    assert all(int(h.split(".")[0]) < 30 for h in table["B"].str.split(" ").str[0])
    assert str(smollm2_gguf_path()) in at.code[0].value.splitlines()[1]


def test_few_pairs_say_the_intervals_are_too_narrow_to_trust():
    """Two additions in the sidebar's set (n = 2): fewer than 10 pairs in A or B, a warning beside the count of
    differing cells."""
    at = page("17_Compare.py", n=2)
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "ops": ["add"]}
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert any("too narrow" in w.value and "read 'differs' as a hint" in w.value for w in at.warning), \
        [w.value for w in at.warning]


def test_the_carry_for_b():
    """B = the set's prompts with a carry: on the paper's four operations an st.error says mul and div have none;
    on additions, A (any carry) vs B (only those with a carry) -- the titles name both, B's count is its own set's,
    the copied code builds B with ``--carry yes``, and the page's count of differing cells is the engine's."""
    from engine.backends import open_model
    from engine.findings.compare import compare_tables
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    at = page("17_Compare.py", n=8).run()
    at.radio(key="cmp_axis").set_value("carry").run()
    assert not at.exception and any("B cannot use prompts with a carry / borrow on this set" in e
                                    and "not mul, div" in e for e in errors(at)), errors(at)
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "ops": ["add"], "n": 12}
    at.run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    md = " ".join(m.value for m in at.markdown)
    assert "**A: prompts with or without a carry / borrow**" in md and "**B: prompts with a carry / borrow**" in md
    assert "--carry yes" in at.code[0].value.splitlines()[1]
    model = open_model("organism")
    spec = PromptSetSpec(ops=("add",), n=12, seed=0)
    pairs_a, pairs_b = kept_pairs(model, spec)[0], kept_pairs(model, PromptSetSpec(ops=("add",), n=12, carry="yes"))[0]
    assert all(p.answer >= 10 for p in pairs_b) and f"**B: prompts with a carry / borrow** ({len(pairs_b)} pairs)" in md
    cmp = compare_tables(cached_path_patching(model, pairs_a)[0], cached_path_patching(model, pairs_b)[0],
                         metric="logit_diff", k=5)
    m = re.search(r"(\d+) of (\d+) cells differ", md)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(cmp.differing()), len(cmp.cells)), md


def test_the_top_k_lists_say_what_they_rank_by():
    """The Compare page's top-k lists rank by its Metric box (logit_diff by default), the Paper page's 'key heads'
    row (Fig. 2 / 15) by the lab's ranking (``PatchingTable.ranking_metric``): a caption under the list names both
    when they differ -- the two orders of one page are explained -- and the row names its own metric."""
    from engine.backends import open_model
    from engine.findings.checks import sparse_heads
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    model = open_model("organism")
    table = cached_path_patching(model, kept_pairs(model, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=8,
                                                                        seed=0))[0])[0]
    ranking = table.ranking_metric()
    assert ranking == "effect"  # the bundled model's effect counts: the Compare page's default differs from it
    top3 = ", ".join(f"{a}.{b}" for a, b, _ in table.top_heads(3, ranking))
    assert sparse_heads(table).lab.endswith(f"; top by {ranking}: {top3}")
    at = page("17_Compare.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    caption = next(c.value for c in at.caption if c.value.startswith("Ranked by "))
    assert caption.startswith("Ranked by logit_diff (the Metric box above)"), caption
    assert f"'key heads' row (Fig. 2 / 15) of the paper's findings below, rank by {ranking}" in caption, caption
    assert [h.split(" ")[0] for h in at.dataframe[0].value["A"]] == [f"{a}.{b}" for a, b, _ in
                                                                      table.top_heads(5, "logit_diff")]
    at.selectbox(key="cmp_metric").set_value(ranking).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    caption = next(c.value for c in at.caption if c.value.startswith("Ranked by "))
    assert caption.startswith(f"Ranked by {ranking}") and "The same ranking as the Path patching" in caption, caption
    assert [h.split(" ")[0] for h in at.dataframe[0].value["A"]] == [f"{a}.{b}" for a, b, _ in
                                                                      table.top_heads(5, ranking)]
