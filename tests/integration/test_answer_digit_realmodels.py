"""The units digit on the real SmolLM2-135M and Gemma 3 270M (issue 49's acceptance): the position read is the one
whose next token is the units digit, after the tens teacher-forced in both prompts, and fast path patching there
equals the textbook loop (one forward pass per sender) within 1e-4.

The pairs are the generated ones, not only those answered right: exactness does not depend on the answer, and these
small models get few units digits right (SmolLM2 kept 1 of 12 sums of 1..9 at the units digit, tens and units right).
"""

from __future__ import annotations

import pytest

from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.path_patching import Sender, path_patching, path_patching_reference

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

#: sums of 1..9 read at their last (units) digit: those from 10 on have their tens digit forced
UNITS = PromptSetSpec(ops=("add",), n=12, seed=0, digit="last")


def _check_units_position(model, pairs):
    """Each pair's END is followed by its units digit: X_r's ids and the answer token are a prefix of the tokenized
    prompt + answer (read independently of the pair's construction) whose last token decodes to the units digit,
    after the tens; X_c ends with the same forced tens."""
    tok = model.tokenizer
    assert pairs
    for p in pairs:
        text = str(int(p.answer))
        assert p.forced == len(text) - 1 == 1 and len(p.ref_ids) == len(p.cf_ids)
        full = tok(f"{p.ref_text} {text}")["input_ids"]
        assert full[:len(p.ref_ids) + 1] == p.ref_ids + [p.answer_id]
        assert tok.decode(full[len(p.ref_ids)]).strip() == text[-1]  # the position's next token: the units digit
        assert tok.decode(p.forced_ids).strip() == text[:-1]
        assert p.cf_ids[-p.forced:] == p.forced_ids


def _senders(model):
    L, H = model.facts.n_layers, model.facts.n_heads
    return [Sender("head", 0, 0), Sender("head", L // 2, H - 1), Sender("head", L - 1, H - 1),
            Sender("head", L - 2, 0), Sender("mlp", 1), Sender("mlp", L - 2)]


def _fast_equals_textbook(model, pairs):
    fast = path_patching(model, pairs)
    assert fast.fallback is None
    ref = path_patching_reference(model, pairs, _senders(model))
    scale = fast.logit_o.abs().clamp_min(1e-3)
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        assert float(((f - v).abs() / scale).max()) < 1e-4, s
    assert float((fast.head_logit - fast.logit_o[:, None, None]).abs().max()) > 1e-3  # the patch moves something


def _units_pairs(model, n=6):
    pairs, _ = generate(model.tokenizer, UNITS)
    return [p for p in pairs if p.forced][:n]  # sums from 10 on: the tens forced


def test_units_digit_path_patching_on_smollm2():
    from engine.techniques.promptlab import typed_pair
    from tests.helpers.smollm2 import open_smollm2
    smol = open_smollm2()
    typed = typed_pair(smol.tokenizer, "Q: What is 7 plus 8? A:", "last")  # Path patching's 'the typed prompt alone'
    pairs = _units_pairs(smol) + [typed]
    _check_units_position(smol, pairs)
    _fast_equals_textbook(smol, pairs)


def test_units_digit_path_patching_on_gemma3():
    from engine.machinery.batching import pad_id
    from engine.models.load import load_plain
    from tests.helpers.gemma3 import gemma3_gguf_path, open_gemma3
    from tests.helpers.plain import Plain
    from tests.helpers.plain import path_patching as plain_path_patching
    gemma = open_gemma3()
    pairs = _units_pairs(gemma, 3)  # the plain loop below runs every sender
    _check_units_position(gemma, pairs)
    _fast_equals_textbook(gemma, pairs)
    # and against plain transformers' own per-sender loop (hooks on the HF modules, every sender)
    fast = path_patching(gemma, pairs)
    pm = load_plain(str(gemma3_gguf_path()), device="cpu")
    lo, head, mlp = plain_path_patching(Plain(pm.hf_model, pad_id=pad_id(gemma)), pairs)
    scale = lo.abs().clamp_min(1.0)
    assert float(((fast.logit_o - lo).abs() / scale).max()) < 1e-4
    assert float(((fast.head_logit - head).abs() / scale[:, None, None]).max()) < 1e-4
    assert float(((fast.mlp_logit - mlp).abs() / scale[:, None]).max()) < 1e-4
