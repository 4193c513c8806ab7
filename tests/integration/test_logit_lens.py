"""The logit lens (engine/techniques/logit_lens.py) against a plain reference: the final norm and unembedding applied
to each layer's residual stream at END, one forward pass per prompt."""

from __future__ import annotations

import torch

from engine.backends import hooks
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.logit_lens import cached_logit_lens, logit_lens


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
