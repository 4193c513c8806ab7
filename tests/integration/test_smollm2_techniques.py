"""Every technique on the real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI), small n."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.prompts.pairs import write_jsonl
from engine.prompts.promptsets import DOMINANT_SHARE, PromptSetSpec, answer_token_stats, generate
from engine.techniques.attention import FIRST_TOKEN, prompt_attention, role_attention, token_roles
from engine.techniques.knockout import Knockout, knockout_accuracy, mean_activations, top_next_tokens
from engine.techniques.mlp_projections import mlp_projections, top_number_tokens
from engine.techniques.path_patching import Sender, path_patching, path_patching_reference
from engine.techniques.transfer import benchmark_pairs, transfer
from tests.helpers.smollm2 import open_smollm2

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def smol():
    return open_smollm2()


@pytest.fixture(scope="module")
def pairs(smol):
    ps, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add", "mul"), n=3, seed=0))
    return ps


def test_fast_patching_equals_reference_on_smollm2(smol, pairs):
    L, H = smol.facts.n_layers, smol.facts.n_heads
    fast = path_patching(smol, pairs)
    senders = [Sender("head", 0, 0), Sender("head", L // 2, H - 1), Sender("head", L - 1, 2),
               Sender("mlp", 3), Sender("mlp", L - 2)]
    ref = path_patching_reference(smol, pairs, senders)
    scale = fast.logit_o.abs().clamp_min(1e-3)
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        assert float(((f - v).abs() / scale).max()) < 1e-4, s


def test_knockout_attention_projection_on_smollm2(smol, pairs):
    means = mean_activations(smol, pairs)
    acc = knockout_accuracy(smol, pairs, Knockout(((5, 1), (10, 2))), means)
    assert 0.0 <= acc <= 1.0
    before = top_next_tokens(smol, pairs[0].ref_ids)
    after = top_next_tokens(smol, pairs[0].ref_ids, ko=Knockout(mlps=(0, 1, 2)), means=means)
    assert before != after
    row = prompt_attention(smol, pairs[0].ref_ids, 10, 3)
    assert abs(sum(t.weight for t in row) - 1) < 1e-4
    roles = role_attention(smol, pairs)
    assert len(roles) == smol.facts.n_layers * smol.facts.n_heads * 5
    proj = mlp_projections(smol, pairs)
    assert len(proj) == 4 * smol.facts.n_layers
    top = top_number_tokens(smol, pairs[0].ref_text, pairs[0].ref_ids, k=2)
    assert len(top) == 2 * smol.facts.n_layers
    # the answer's first token (a digit: SmolLM2 splits numbers into digits) marked on every layer
    marked = top_number_tokens(smol, pairs[0].ref_text, pairs[0].ref_ids, k=2, answer_id=pairs[0].answer_id)
    assert sum(t.answer for t in marked) == smol.facts.n_layers
    assert {t.token for t in marked if t.answer} == {str(pairs[0].answer)[0]}


def test_typed_attention_roles_at_the_digits_on_smollm2(smol):
    """The typed prompt's roles on a tokenizer that splits numbers into digits: each operand's digits are its role,
    and END (the last token) is the position that predicts the answer's first digit."""
    from engine.techniques.promptlab import check_typed_text, typed_attention
    text = "What is 12 plus 7? Answer:"
    rows = typed_attention(smol, text, 10, 3)
    typed = check_typed_text(smol.tokenizer, text)
    assert [r.token for r in rows] == smol.tokenizer.convert_ids_to_tokens(typed.ids)
    assert [r.token.strip("Ġ") for r in rows if r.role == "operand A"] == ["1", "2"]
    assert [r.token.strip("Ġ") for r in rows if r.role == "operand B"] == ["7"]
    assert "operator" in {r.role for r in rows}
    assert abs(sum(r.weight for r in rows) - 1) < 1e-4


def test_benchmark_pairs_and_transfer_on_smollm2(smol, pairs):
    if not DATA.is_dir():
        pytest.skip("../shared/data not present")
    bench = benchmark_pairs(smol.tokenizer, DATA, "svamp", n=3, seed=0)
    assert bench and all(len(p.ref_ids) == len(p.cf_ids) and p.ref_text != p.cf_text for p in bench)
    res = transfer(smol, pairs, bench, names=("templates", "svamp"), k=5)
    assert 0 <= res.overlap <= 5 and len(res.a.top_heads) == 5


# ---------------------------------------------------------------------------------------------
# one answer-token rule: CLI --text reads the digit position (issue 11)
# ---------------------------------------------------------------------------------------------

@pytest.fixture()
def cli_on_smol(smol, monkeypatch, capsys, tmp_path):
    """``python -m engine ...`` in-process, its model the loaded SmolLM2 (open_model is what the CLI calls)."""
    import engine.backends
    from engine.cli import main as cli
    monkeypatch.setattr(engine.backends, "open_model", lambda *a, **k: smol)

    def run(*args: str) -> dict:
        assert cli.main([*args, "--no-cache"]) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)
    return run


def _digit(token: str) -> bool:
    return token.lstrip("Ġ").isdigit()


@pytest.mark.parametrize("cmd", ["knockout", "attention", "mlp-projections"])
def test_cli_text_analyses_the_digit_position_on_smollm2(smol, pairs, cli_on_smol, tmp_path, cmd):
    prompts = tmp_path / "pairs.jsonl"
    write_jsonl(str(prompts), pairs)
    text = "3 + 5 ="
    # SmolLM2 writes " 8" as a lone "Ġ" and "8": the digit is predicted after the "Ġ"
    full = smol.tokenizer(f"{text} 8")["input_ids"]
    assert smol.tokenizer.convert_ids_to_tokens(full[-2:]) == ["Ġ", "8"]
    want = smol.tokenizer.convert_ids_to_tokens(full[:-1])
    common = ("--model", "smollm2.gguf", "--prompts", str(prompts), "--text", text)
    if cmd == "knockout":
        res = cli_on_smol("knockout", *common, "--heads", "5.1")
        top = [t["token"] for t in res["top5_before"]]
        # read as typed, the next token is the lone space (p 0.91); at the digit position all top-5 are digits
        raw = top_next_tokens(smol, smol.tokenizer(text)["input_ids"])
        assert raw[0].token == "Ġ" and raw[0].prob > 0.5
        assert all(_digit(t) for t in top) and "8" in top, top
        assert res["parsed"]["answer_token"] == "8" and res["analysed_tokens"] == want
    elif cmd == "attention":
        res = cli_on_smol("attention", *common, "--layer", "10", "--head", "3", "--out", str(tmp_path / "a.csv"))
        assert [t["token"] for t in res["tokens"]] == want == res["analysed_tokens"]
        row = prompt_attention(smol, full[:-1], 10, 3)  # the END row of the digit-predicting position
        assert [round(t["weight"], 6) for t in res["tokens"]] == [round(t.weight, 6) for t in row]
    else:
        res = cli_on_smol("mlp-projections", *common, "--out", str(tmp_path / "p.csv"))
        assert res["analysed_tokens"] == want
        at_digit = top_number_tokens(smol, text, full[:-1])
        assert [t["token"] for t in res["top_number_tokens"]] == [t.token for t in at_digit]
        assert [t.token for t in top_number_tokens(smol, text, smol.tokenizer(text)["input_ids"])] != \
            [t.token for t in at_digit]
    if cmd != "attention":  # attention --text reads no prompt set
        assert res["answer_tokens"]["n"] == len(pairs)


def test_answer_token_distribution_and_balance_on_smollm2(smol):
    """Real SmolLM2 tokenization: unbalanced additions of 1..9 are mostly "1"; balanced ones are not."""
    tok = smol.tokenizer
    plain, _ = generate(tok, PromptSetSpec(ops=("add",), n=60, seed=0, balance=False))
    balanced, _ = generate(tok, PromptSetSpec(ops=("add",), n=60, seed=0))
    sp, sb = answer_token_stats(tok, plain), answer_token_stats(tok, balanced)
    assert sp.top_token == "1" and sp.top_share > DOMINANT_SHARE and sp.warning is not None
    assert set(sb.counts) == {str(d) for d in range(1, 10)} and sb.top_share <= 7 / 60 and sb.warning is None


def test_first_token_role_on_smollm2_without_bos(smol, pairs):
    """SmolLM2 adds no BOS: position 0 is the prompt's first token, and its attention sink is counted."""
    assert smol.tokenizer("3 + 5 =")["input_ids"][0] != smol.tokenizer.bos_token_id
    for p in pairs:
        roles = token_roles(smol, p)
        first = smol.tokenizer.convert_ids_to_tokens(p.ref_ids[:1])[0]
        assert roles[0] in (("operand A", "operand B") if first.isdigit() else (FIRST_TOKEN,)), (first, roles)
    worded = [p for p in pairs if token_roles(smol, p)[0] == FIRST_TOKEN]  # prompts not starting with a digit
    assert worded
    ra = role_attention(smol, worded)
    # measured: up to 0.86 of a head's END-row mass sits on position 0 (formerly counted as "other")
    assert max(v.value for v in ra if v.role == FIRST_TOKEN) > 0.5


def test_end_only_knockouts_and_scores_equal_full_logits_on_smollm2(smol):
    """Issue 15 on the real model: the batched END-only knockout curve equals the full-logits
    reference, with one forward call per distinct knockout set, and the END..-only accuracy scores equal
    full logits -- on prompts whose END is the token right before the answer's first digit."""
    import torch

    from engine.backends.base import WorkMeter
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    from engine.techniques.accuracy import first_token_right, forget_scores, score_pairs
    from engine.techniques.knockout_curve import curve_knockouts, knockout_curve
    ps, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add", "mul"), n=4, seed=1))
    for p in ps:  # the digit position: END is the last prompt token, the answer starts with a digit token
        answer = smol.tokenizer.decode(p.answer_ids).strip()
        assert answer == str(p.answer) and smol.tokenizer.decode([p.answer_id]).strip()[:1].isdigit()
        assert not smol.tokenizer.decode([p.ref_ids[-1]]).strip()[-1:].isdigit()
    forget_scores()
    alone = first_token_right(smol, ps)  # the filter's own pass: the prompts alone, END their last position
    scores = score_pairs(smol, ps)
    assert alone == [s.first_ok for s in scores]
    width = max(len(p.ref_ids) + len(p.answer_ids) for p in ps)
    for p, s in zip(ps, scores):
        seq = torch.tensor([p.ref_ids + p.answer_ids])
        full = smol.logits(seq)[0].float()  # [pos, vocab], unpadded
        end = len(p.ref_ids) - 1
        assert s.first_ok == (int(full[end].argmax()) == p.answer_id)
        assert abs(s.p_answer - torch.softmax(full[end], -1)[p.answer_id].item()) < 1e-4
    assert width > 0
    right = [p for p, s in zip(ps, scores) if s.first_ok]
    assert right, "SmolLM2 answers none of these prompts"
    means = mean_activations(smol, right)
    L, H = smol.facts.n_layers, smol.facts.n_heads
    ranked = [(L // 2, 0), (L // 2 + 1, 1), (3, 2)]
    sets = [ko for _, t, r in curve_knockouts(L, H, ranked, k_max=3, draws=2) for ko in [t, *r]]
    smol.meter = WorkMeter()
    new = knockout_curve(smol, right, ranked, means, k_max=3, draws=2, sets_per_pass=1)
    n_chunks = len(length_chunks(right, TOKENS_PER_PASS))
    assert smol.meter.forward_calls == n_chunks * len({frozenset(ko.heads) for ko in sets}) == n_chunks * (3 * 3 + 1)
    from tests.helpers.references import knockout_curve_full_logits
    assert new == knockout_curve_full_logits(smol, right, ranked, means, k_max=3, draws=2)


def test_operand_counterfactuals_and_what_heads_carry_on_smollm2(smol):
    """The operand kinds change exactly the operand's digit token (END still before the answer's first digit), and
    the key heads' comparison across kinds runs on the real model."""
    from dataclasses import replace

    from engine.techniques.carries import KINDS, what_heads_carry
    spec = PromptSetSpec(ops=("add", "mul"), n=10, seed=0)
    for kind in ("operand-a", "operand-b"):
        ps, _ = generate(smol.tokenizer, replace(spec, counterfactual=kind))
        assert ps
        for p in ps:
            diff = [i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y]
            assert len(p.ref_ids) == len(p.cf_ids) and len(diff) == 1, (p.ref_text, p.cf_text)
            operand = str(p.a if kind == "operand-a" else p.b)
            assert smol.tokenizer.decode([p.ref_ids[diff[0]]]).strip() == operand, (p.ref_text, diff)
            assert smol.tokenizer.decode([p.cf_ids[diff[0]]]).strip().isdigit()
            assert smol.tokenizer.decode([p.answer_id]).strip()[:1].isdigit()
            assert not smol.tokenizer.decode([p.ref_ids[-1]]).strip()[-1:].isdigit()
    rows, metric = what_heads_carry(smol, spec, k=3)
    assert len(rows) == 3 * len(KINDS) and metric in ("effect", "logit_diff")
    assert all(r.n > 0 and r.low <= r.value <= r.high for r in rows)


def test_counterfactual_knockouts_continue_the_shared_prefix_on_smollm2(smol):
    """Faithfulness circuits (counterfactual ablation) on the real model: continuing X_r's keys and values up to the
    first token X_r and X_c differ in gives the per-pair full-logits readouts, at the answer's digit position."""
    from engine.techniques import faithfulness as F
    from tests.helpers.references import continued_readouts_equal_reference
    ps, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add", "sub"), n=3, seed=2))
    for p in ps:
        assert smol.tokenizer.decode([p.answer_id]).strip()[:1].isdigit()
        assert not smol.tokenizer.decode([p.ref_ids[-1]]).strip()[-1:].isdigit()
    L, H = smol.facts.n_layers, smol.facts.n_heads
    orders = F.random_orders(L * H + L, 2, seed=3)
    kos = [F.circuit_knockout(o, k, L, H) for o in orders for k in (30, 150)]
    continued_readouts_equal_reference(smol, ps[:4], kos)


def test_circuit_roles_and_position_circuits_on_smollm2(smol, pairs):
    """Position-resolved circuits on real weights, the digit positions checked: each operand's role holds exactly
    its digits' tokens, END is the last position; ablating every edge at the operand A positions of prompts that
    write A before the operator changes nothing (X_r and X_c agree there), ablating them at the operator does."""
    import numpy as np
    import torch

    from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
    from engine.techniques.edge_faithfulness import edge_circuits
    from engine.techniques.edges import edge_graph

    for p in pairs:
        toks = smol.tokenizer.convert_ids_to_tokens(p.ref_ids)
        roles = [CIRCUIT_ROLES[i] for i in circuit_roles(smol, [p], len(toks))[0]]
        assert roles[-1] == "END"
        for role, value in (("operand A", p.a), ("operand B", p.b)):
            digits = smol.tokenizer.convert_tokens_to_string([t for t, r in zip(toks, roles) if r == role])
            assert digits.strip() == str(value), (p.ref_text, role, digits)
    early = [p for p in pairs if (lambda r, d: max(i for i, x in enumerate(r) if x == 0) < d)(
        circuit_roles(smol, [p], len(p.ref_ids))[0].tolist(),
        next(i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y))]
    assert early, [p.ref_text for p in pairs]
    E, R = len(edge_graph(smol)), len(CIRCUIT_ROLES)
    kept = np.ones((2, E, R), dtype=bool)
    kept[0, :, CIRCUIT_ROLES.index("operand A")] = False
    kept[1, :, CIRCUIT_ROLES.index("operator")] = False
    out = edge_circuits(smol, early[:1], kept)  # one pair: 2 passes per layer, each a full forward
    assert float((out.logit[0] - out.logit_o).abs().max()) < 1e-3 * float(out.logit_o.abs().max())
    assert float((out.logit[1] - out.logit_o).abs().max()) > 1e-2
    assert torch.isfinite(out.margin).all()
