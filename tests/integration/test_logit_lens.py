"""The logit lens (engine/techniques/logit_lens.py) against a plain reference: the final norm and unembedding applied
to each layer's residual stream at END, one forward pass per prompt."""

from __future__ import annotations

import torch

from engine.backends import hooks
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.logit_lens import LensRow, cached_logit_lens, logit_lens, top1_words


def _plain_lens(backend, pairs):
    L = backend.facts.n_layers
    names = [hooks.resid_pre(0)] + [hooks.resid_post(layer) for layer in range(L)]
    W_U, b_U = backend.unembed()
    prob, rank = [], []
    for p in pairs:
        _, c = backend.run_with_cache(torch.tensor([p.ref_ids]), None, names)
        pr, rk = [], []
        for n in names:
            lg = backend.final_norm(c[n][:, -1]) @ W_U + (0 if b_U is None else b_U)
            pr.append(float(torch.softmax(lg[0], -1)[p.answer_id]))
            rk.append(int((lg[0] > lg[0, p.answer_id]).sum()) + 1)
        prob.append(pr)
        rank.append(rk)
    return torch.tensor(prob), torch.tensor(rank)


def test_logit_lens_equals_plain_reference_and_ends_at_the_model_output(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul"), n=4, seed=2))
    raw = logit_lens(organism, pairs, batch_size=3)
    prob, rank = _plain_lens(organism, pairs)
    assert torch.allclose(raw.prob, prob, atol=1e-5) and torch.equal(raw.rank, rank)
    ref, mask, end = pad([p.ref_ids for p in pairs], pad_id(organism))
    with torch.no_grad():
        final = torch.softmax(organism.logits(ref, mask)[torch.arange(len(pairs)), end], -1)
    want = final[torch.arange(len(pairs)), torch.tensor([p.answer_id for p in pairs])]
    assert torch.allclose(raw.prob[:, -1], want, atol=1e-5)  # the last layer's lens is the model's output


def test_cached_lens_is_served_from_cache(organism, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("sub",), n=3, seed=4))
    x, c3 = cached_logit_lens(organism, pairs, cache=cache)
    y, c4 = cached_logit_lens(organism, pairs, cache=cache)
    assert c3 and not c4 and x == y and {r.layer for r in y} == set(range(-1, organism.facts.n_layers))


def _rows(top1: list[float]) -> list[LensRow]:
    return [LensRow(layer - 1, "*", 0.5, 1.0, t) for layer, t in enumerate(top1)]  # layer -1: the embedding


def test_top1_words_say_from_layer_on_only_when_no_later_layer_falls_below_half():
    """SmolLM2-135M's lens rises above half at layer 26 and dips to 0.375 at layer 28: not "from layer 26 on"."""
    monotone = _rows([0.0] * 27 + [0.5, 0.6, 0.7, 0.9])  # layers -1..29, half from layer 26 on
    assert top1_words(monotone) == "the answer is the top token for at least half of the prompts from layer 26 on"
    dips = _rows([0.0] * 27 + [0.5, 0.625, 0.375, 0.625])
    words = top1_words(dips)
    assert "from layer 26 on" not in words, words  # the old caption said so
    assert words == ("the answer is the top token for at least half of the prompts first at layer 26 "
                     "(and at 2 of the 3 layers after it; 62% of them after the last layer)"), words
    assert top1_words(_rows([0.0, 0.5, 0.25, 0.0])).endswith("first at layer 0 (but at none of the 2 layers after "
                                                            "it; 0% of them after the last layer)")
    assert top1_words(_rows([0.0, 0.6, 0.4])).endswith("first at layer 0 (but not at the last layer: 40% of them)")
    assert top1_words(_rows([0.5, 0.5])).endswith("from the embedding on")
    assert top1_words(_rows([0.1, 0.49])) == "the answer never tops the lens for half of the prompts"
