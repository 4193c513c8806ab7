"""The Prompt lab's typed prompt (engine/techniques/promptlab.py): token roles, attention and the prediction
against plain Hugging Face on the bundled model."""

from __future__ import annotations

import torch

from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import FIRST_TOKEN, prompt_attention
from engine.techniques.knockout import Knockout, mean_activations


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


def test_the_typed_pair_at_a_later_digit_is_read_as_a_sets_pair(model):
    """The typed prompt read at the answer's last (units) digit: the earlier digits appended to X_r and X_c alike,
    END's next token the units digit -- the pair build_pair makes of the same problem, and its path patching that
    of the set's machinery on it; a digit the answer lacks is a PromptError saying so."""
    import pytest

    from engine.prompts.pairs import PromptError
    from engine.techniques.path_patching import path_patching
    from engine.techniques.promptlab import typed_pair
    tok = model.tokenizer
    text = "Q: What is 7 plus 8? A:"
    first, last = typed_pair(tok, text), typed_pair(tok, text, "last")
    assert (first.forced, last.forced) == (0, 1)
    assert tok.decode([first.answer_id]).strip() == "1" and tok.decode([last.answer_id]).strip() == "5"
    assert last.ref_ids == first.ref_ids + [first.answer_id] and last.cf_ids == first.cf_ids + [first.answer_id]
    assert last.forced_ids == [first.answer_id] and last.answer_ids == first.answer_ids[1:]
    assert typed_pair(tok, text, "2") == last
    assert typed_pair(tok, "Q: What is 3 plus 5? A:", "last").forced == 0  # a one-digit answer: last = first
    with pytest.raises(PromptError, match="no 2nd one"):
        typed_pair(tok, "Q: What is 3 plus 5? A:", "2")
    from engine.techniques.attention import prompt_attention
    from engine.techniques.promptlab import typed_attention
    rows = typed_attention(model, text, 1, 3, "last")  # END: the forced tens digit, the position read at the units
    assert [r.weight for r in rows] == [r.weight for r in prompt_attention(model, last.ref_ids, 1, 3)]
    assert len(rows) == len(first.ref_ids) + 1 and rows[-1].token.strip() == "1"
    assert [r.role for r in rows][:-1] == [r.role for r in typed_attention(model, text, 1, 3)]
    table = path_patching(model, [last])
    alone = path_patching(model, [first])
    assert not torch.equal(table.head_logit, alone.head_logit)  # another position, another logit
    assert table.head_logit.shape == alone.head_logit.shape
