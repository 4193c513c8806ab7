"""Knockouts, attention and MLP projections: each checked against a plain Hugging Face computation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.models.spec import resolve_spec
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import FIRST_TOKEN, ROLES, prompt_attention, role_attention, token_roles
from engine.techniques.knockout import Knockout, knockout_accuracy, mean_activations, parse_heads, top_next_tokens
from engine.techniques.knockout_curve import knockout_curve
from engine.techniques.mlp_projections import METRICS, mlp_projections, number_token, top_number_tokens


@pytest.fixture(scope="module")
def plain():
    """The same weights as a plain transformers model (eager attention, no bridge)."""
    m = AutoModelForCausalLM.from_pretrained(resolve_spec("organism").load_target, attn_implementation="eager")
    return m.eval()


@pytest.fixture(scope="module")
def pairs(model):
    from engine.techniques.accuracy import keep_correct
    ps, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=5))
    return keep_correct(model, ps)


def test_mean_ablation_equals_plain_o_proj_hook(model, plain, pairs):
    """Knocking out head (l, h) through hook_z == replacing o_proj's input slice in plain HF."""
    means = mean_activations(model, pairs)
    layer, head = 2, 3
    d_head = model.facts.d_head
    p = pairs[0]
    ids = torch.tensor([p.ref_ids])
    with torch.no_grad():
        from engine.techniques.knockout import knocked_out
        with knocked_out(model, Knockout(((layer, head),)), means, [p.template], [len(p.ref_ids) - 1]):
            ours = model.logits(ids)[0, -1]
        mean_z = means.z[means.index(p.template), layer, :, head]  # [T, d_head], offset 0 = END
        n = len(p.ref_ids)
        repl = mean_z[:n].flip(0)  # positions 0..n-1

        def pre_hook(mod, args):
            x = args[0].clone()
            x[0, :, head * d_head:(head + 1) * d_head] = repl
            return (x,)

        h = plain.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook)
        try:
            theirs = plain(ids).logits[0, -1]
        finally:
            h.remove()
    assert torch.allclose(ours, theirs, atol=1e-4)
    # and the model is restored after the with block
    assert torch.allclose(model.logits(ids)[0, -1], plain(ids).logits[0, -1], atol=1e-4)


def test_knockout_accuracy_and_curve(model, pairs):
    means = mean_activations(model, pairs)
    base = knockout_accuracy(model, pairs, Knockout(), means)
    assert base == 1.0  # the pairs are the correctly answered ones
    every = tuple((layer, h) for layer in range(model.facts.n_layers) for h in range(model.facts.n_heads))
    assert knockout_accuracy(model, pairs, Knockout(every), means) < 0.5
    pts = knockout_curve(model, pairs, list(every[:3]), means, k_max=2, draws=3)
    assert [p.k for p in pts] == [0, 1, 2] and pts[0].top_accuracy == 1.0
    assert all(p.random_min <= p.random_mean <= p.random_max for p in pts)
    with pytest.raises(ValueError):
        knockout_curve(model, pairs, [], means, k_max=10_000)
    with pytest.raises(ValueError):
        Knockout(((99, 0),)).validate(model.facts.n_layers, model.facts.n_heads)
    assert parse_heads("3.1, 5.0") == ((3, 1), (5, 0))
    with pytest.raises(ValueError):
        parse_heads("3-1")


def test_top_next_tokens(model, pairs):
    p = pairs[0]
    top = top_next_tokens(model, p.ref_ids)
    assert top[0].token_id == p.answer_id and len(top) == 5
    assert top == sorted(top, key=lambda t: -t.prob)
    with torch.no_grad():
        probs = torch.softmax(model.logits(torch.tensor([p.ref_ids]))[0, -1].float(), -1)
    assert [t.token_id for t in top] == probs.topk(5).indices.tolist()
    assert all(abs(t.prob - float(probs[t.token_id])) < 1e-6 for t in top)


def test_prompt_attention_equals_plain_attentions(model, plain, pairs):
    p = pairs[1]
    with torch.no_grad():
        att = plain(torch.tensor([p.ref_ids]), output_attentions=True).attentions  # L x [1, H, q, k]
    for layer, head in ((0, 0), (3, 5)):
        ours = torch.tensor([t.weight for t in prompt_attention(model, p.ref_ids, layer, head)])
        assert torch.allclose(ours, att[layer][0, head, -1], atol=1e-5)
        assert abs(float(ours.sum()) - 1) < 1e-4


def test_role_attention_sums_to_one_and_roles_are_found(model, pairs):
    vals = role_attention(model, pairs)
    by_head: dict[tuple[int, int], float] = {}
    for v in vals:
        by_head[(v.layer, v.head)] = by_head.get((v.layer, v.head), 0.0) + v.value
    assert all(abs(s - 1) < 1e-4 for s in by_head.values())
    for p in pairs:
        roles = token_roles(model, p)
        assert roles[0] == FIRST_TOKEN and "operator" in roles and "operand A" in roles and "operand B" in roles
        assert set(roles) <= set(ROLES)


def test_mlp_projections_equal_plain_hidden_states(model, plain, pairs):
    vals = {(v.layer, v.metric): v.value for v in mlp_projections(model, pairs[:5])}
    assert {m for _, m in vals} == set(METRICS)
    W_U = plain.lm_head.weight.detach()  # [vocab, d]
    layer = 4
    cos_a, cos_c = [], []
    for p in pairs[:5]:
        captured = {}
        block = plain.model.layers[layer]
        h1 = block.post_attention_layernorm.register_forward_pre_hook(
            lambda m, a, captured=captured: captured.__setitem__("in", a[0][0, -1].detach()))
        h2 = block.mlp.register_forward_hook(
            lambda m, a, o, captured=captured: captured.__setitem__("out", o[0, -1].detach()))
        try:
            with torch.no_grad():
                plain(torch.tensor([p.ref_ids]))
        finally:
            h1.remove()
            h2.remove()
        wa = W_U[number_token(model, p.ref_text, p.a)]
        cos_a.append(torch.nn.functional.cosine_similarity(captured["in"], wa, dim=0))
        cos_c.append(torch.nn.functional.cosine_similarity(captured["out"], W_U[p.answer_id], dim=0))
    assert abs(vals[(layer, "cos_in_A")] - float(torch.stack(cos_a).mean())) < 1e-4
    assert abs(vals[(layer, "cos_out_C")] - float(torch.stack(cos_c).mean())) < 1e-4


def test_top_number_tokens(model, pairs):
    p = pairs[0]
    top = top_number_tokens(model, p.ref_text, p.ref_ids, k=3)
    assert len(top) == 3 * model.facts.n_layers
    assert all(t.token.strip("Ġ▁").isdigit() for t in top)


def test_top_number_tokens_mark_the_answer_with_its_rank(model, plain, pairs):
    """With the answer's token given, every layer lists it with its rank among the number tokens, counted from a
    plain ranking of that MLP's output . W_U[n] (a layer whose top k misses it lists it after them)."""
    from engine.techniques.mlp_projections import number_tokens
    p = pairs[0]
    top = top_number_tokens(model, p.ref_text, p.ref_ids, k=2, answer_id=p.answer_id)
    nums = sorted(number_tokens(model, p.ref_text))
    W_U = plain.lm_head.weight.detach()[nums]  # [N, d]
    for layer in range(model.facts.n_layers):
        captured = {}
        h = plain.model.layers[layer].mlp.register_forward_hook(
            lambda m, a, o, captured=captured: captured.__setitem__("out", o[0, -1].detach()))
        try:
            with torch.no_grad():
                plain(torch.tensor([p.ref_ids]))
        finally:
            h.remove()
        scores = W_U @ captured["out"]  # [N]
        rank = int((scores > scores[nums.index(p.answer_id)]).sum()) + 1
        mine = [t for t in top if t.layer == layer]
        answer = [t for t in mine if t.answer]
        assert len(answer) == 1 and answer[0].rank == rank and answer[0].number == p.answer, (layer, mine)
        assert len(mine) == 2 + (rank > 2)


def test_typed_attention_gives_each_token_its_role(model):
    """The typed prompt's END row token by token equals prompt_attention's, each token with its role: the operands'
    digits, the operator's tokens (where the prompt and its counterfactual differ); no operator without one."""
    from engine.techniques.promptlab import check_typed_text, typed_attention
    text = "The sum of 3 and 5 is"
    rows = typed_attention(model, text, 1, 3)
    ids = check_typed_text(model.tokenizer, text).ids
    assert [r.weight for r in rows] == [r.weight for r in prompt_attention(model, ids, 1, 3)]
    by_token = {r.token: r.role for r in rows}
    assert by_token["3"] == "operand A" and by_token["5"] == "operand B" and rows[0].role == FIRST_TOKEN
    assert [r.token for r in rows if r.role == "operator"] == ["su", "##m"]
    bare = typed_attention(model, "3 and 5", 1, 3)
    assert "operator" not in {r.role for r in bare} and {r.role for r in bare} >= {"operand A", "operand B"}


def test_analyse_prompt_equals_plain_hf(model, plain):
    """The prompt lab's numbers (top-5, P(answer), rank; the counterfactual's) == plain HF softmax of the last row,
    and under a knockout == plain HF with the heads' o_proj input slices set to the X_c means."""
    from engine.techniques.promptlab import analyse_prompt

    def plain_probs(ids, pre=None):
        hooks = [plain.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(fn) for layer, fn in pre or []]
        try:
            with torch.no_grad():
                return torch.softmax(plain(torch.tensor([ids])).logits[0, -1].float(), -1)
        finally:
            for h in hooks:
                h.remove()

    rep = analyse_prompt(model, "Q: What is 7 times 8? A:")
    assert rep.parsed is not None and rep.answer_id is not None and rep.cf_ids
    for ids, top5, p_ans in ((rep.ids, rep.top5, rep.p_answer), (rep.cf_ids, rep.cf_top5, rep.p_answer_cf)):
        probs = plain_probs(ids)
        assert [t.token_id for t in top5] == probs.topk(5).indices.tolist()
        assert all(abs(t.prob - float(probs[t.token_id])) < 1e-5 for t in top5)
        assert abs(p_ans - float(probs[rep.answer_id])) < 1e-5
    probs = plain_probs(rep.ids)
    assert rep.answer_rank == int((probs > probs[rep.answer_id]).sum()) + 1

    # under a knockout of head 1.7: a typed prompt has no template, so it takes the all-template mean (group '*')
    ps, _ = generate(model.tokenizer, PromptSetSpec(ops=("mul",), n=12, seed=5))
    means = mean_activations(model, ps)
    layer, head, d_head = 1, 7, model.facts.d_head
    ko_rep = analyse_prompt(model, "Q: What is 7 times 8? A:", ko=Knockout(((layer, head),)), means=means)
    n = len(rep.ids)
    repl = means.z[means.index(None), layer, :, head][:n].flip(0)  # [n, d_head], positions 0..n-1

    def pre_hook(mod, args):
        x = args[0].clone()
        x[0, :, head * d_head:(head + 1) * d_head] = repl
        return (x,) + args[1:]
    probs = plain_probs(rep.ids, [(layer, pre_hook)])
    assert [t.token_id for t in ko_rep.top5] == probs.topk(5).indices.tolist()
    assert abs(ko_rep.p_answer - float(probs[rep.answer_id])) < 1e-5
    assert ko_rep.answer_rank == int((probs > probs[rep.answer_id]).sum()) + 1
    assert ko_rep.cf_top5 == rep.cf_top5  # the counterfactual is never knocked out


def test_prompt_knockout_curve_equals_one_full_logits_pass_per_k(model, pairs):
    """The typed prompt under the top-k heads (k = 0..K, one batched END-only pass) == each knockout on its own,
    full logits."""
    from engine.techniques.knockout_curve import prompt_knockout_curve
    from engine.techniques.promptlab import check_typed_text
    from tests.helpers.references import prompt_knockout_full_logits
    means = mean_activations(model, pairs)
    typed = check_typed_text(model.tokenizer, "The sum of 3 and 5 is")
    ranked = [(1, 3), (1, 0), (5, 5), (1, 1), (3, 2), (6, 2)]
    pts = prompt_knockout_curve(model, typed.ids, typed.answer.answer_id, ranked, means, k_max=len(ranked))
    assert [p.k for p in pts] == list(range(len(ranked) + 1)) and pts[0].head == "" and pts[1].head == "1.3"
    for p in pts:
        want_p, want_top = prompt_knockout_full_logits(model, typed.ids, typed.answer.answer_id,
                                                       Knockout(tuple(ranked[:p.k])), means)
        assert abs(p.p_answer - want_p) < 1e-5 and p.top_id == want_top, p
        assert p.answer_top1 == (want_top == typed.answer.answer_id)
    assert pts[0].answer_top1  # the bundled model answers 8
    with pytest.raises(ValueError, match="the ranking has"):
        prompt_knockout_curve(model, typed.ids, typed.answer.answer_id, ranked, means, k_max=len(ranked) + 1)
