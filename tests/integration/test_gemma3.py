"""The real Gemma 3 270M (Google's base model, Q4_K_M GGUF from PyPI): the second real model.

Gemma 3 is the architecture the lab was silently wrong on (issue 31): its blocks normalise the attention and
MLP branches before the residual add, scale the embeddings and use one KV head.  Here the ``.gguf`` opens
(its config names no ``architectures``), the prompts are read at the digit position, and fast path patching
equals a plain-transformers per-sender loop (:func:`tests.helpers.plain.path_patching`: torch hooks on the
model's own o_proj and MLP modules, one forward pass per sender) -- with no fallback taken.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine.prompts.promptsets import PromptSetSpec, generate
from tests.helpers.cli import run_cli_process
from tests.helpers.gemma3 import gemma3_gguf_path, open_gemma3

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma():
    return open_gemma3()


@pytest.fixture(scope="module")
def pairs(gemma):
    ps, _ = generate(gemma.tokenizer, PromptSetSpec(ops=("add", "sub"), n=3, seed=0))
    return ps


def test_the_gguf_opens_as_gemma3(gemma):
    f = gemma.facts
    assert (f.model_type, f.architecture) == ("gemma3_text", "Gemma3ForCausalLM")
    assert (f.n_layers, f.n_heads, f.n_kv_heads, f.d_model) == (18, 4, 1, 640)


def test_prompts_are_read_at_the_digit_position(gemma, pairs):
    tok = gemma.tokenizer
    assert pairs
    for p in pairs:  # END is the last prompt token; the answer's first token is its first digit
        assert tok.decode(p.answer_ids).strip() == str(p.answer)
        assert tok.decode([p.answer_id]).strip() == str(p.answer)[0]
        assert not tok.decode([p.ref_ids[-1]]).strip()[-1:].isdigit()
        assert len(p.ref_ids) == len(p.cf_ids)


def test_fast_path_patching_equals_the_plain_per_sender_loop(gemma, pairs):
    from engine.machinery.batching import pad_id
    from engine.models.load import load_plain
    from engine.techniques.path_patching import path_patching
    from tests.helpers.plain import Plain
    from tests.helpers.plain import path_patching as plain_path_patching
    fast = path_patching(gemma, pairs)
    assert fast.fallback is None  # the block model describes Gemma 3: the self-check held
    pm = load_plain(str(gemma3_gguf_path()), device="cpu")
    lo, head, mlp = plain_path_patching(Plain(pm.hf_model, pad_id=pad_id(gemma)), pairs)
    scale = lo.abs().clamp_min(1.0)[:, None, None]
    assert float(((fast.logit_o - lo).abs() / scale[:, 0, 0]).max()) < 1e-4
    assert float(((fast.head_logit - head).abs() / scale).max()) < 1e-4
    assert float(((fast.mlp_logit - mlp).abs() / scale[:, :, 0]).max()) < 1e-4
    # the symptom: layers 0-1 were reported at effect ~ -0.30 where the true effect is ~ 0
    true_early = (head[:, :2] - lo[:, None, None]).abs().max()
    got_early = (fast.head_logit[:, :2] - fast.logit_o[:, None, None]).abs().max()
    assert abs(float(got_early - true_early)) < 1e-3
    assert torch.isfinite(fast.head_logit).all()


def test_cli_patch_on_the_gguf(tmp_path):
    out = tmp_path / "effects.csv"
    r = run_cli_process("path-patching", "--model", str(gemma3_gguf_path()), "--op", "add", "--n", "24",
                        "--out", str(out), cache=tmp_path / "results.duckdb", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary.get("fallback") is None, summary
    assert "Converting" not in r.stderr and "note:" not in r.stderr, r.stderr[-500:]
    rows = out.read_text().splitlines()
    assert len(rows) > 18 * 5
