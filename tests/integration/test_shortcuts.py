"""Every fast path checks itself before it reports, and gives way to its textbook loop -- saying so -- when the
check fails (engine/machinery/shortcut.py).

Each test breaks one assumption of a fast path on a live model (a component that no longer matches the model, a
KV cache that no longer gives back its logits) and asserts: the result carries the fallback's note, equals the
textbook reference, and the note reaches the user (the CLI's one line on stderr, the cached artifacts).
"""

from __future__ import annotations

import json

import pytest
import torch

from engine.backends import open_model
from engine.backends.bridge import BridgeBackend
from engine.progress import collect_notes
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attribution import path_atp
from engine.techniques.head_patching import Receiver, head_path_patching, head_path_patching_reference
from engine.techniques.logit_lens import logit_lens
from engine.techniques.path_patching import cached_path_patching, path_patching, path_patching_reference
from engine.techniques.position_patching import layer_position_patching
from tests.integration.tiny_models import build_tiny


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """A tiny Gemma 2: post-norms on both branches and a soft cap -- every part of the block model in use."""
    return open_model(str(build_tiny("gemma2", tmp_path_factory.mktemp("g2") / "gemma2")), device="cpu")


@pytest.fixture(scope="module")
def pairs(gemma2):
    return generate(gemma2.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=1))[0]


def _patched(backend, monkeypatch, method: str, wrong):
    """``backend.method`` replaced by ``wrong(original, *args)`` for the test."""
    original = getattr(backend, method)
    monkeypatch.setattr(backend, method, lambda *a, **k: wrong(original, *a, **k))


def _equal_to_reference(backend, pairs, raw) -> None:
    ref = path_patching_reference(backend, pairs)
    for s, v in ref.items():
        got = raw.head_logit[:, s.layer, s.head] if s.component == "head" else raw.mlp_logit[:, s.layer]
        assert torch.allclose(got, v, atol=1e-4), s


def test_fast_path_holds_on_gemma2(gemma2, pairs):
    raw = path_patching(gemma2, pairs)
    assert raw.fallback is None
    _equal_to_reference(gemma2, pairs, raw)


def test_wrong_mlp_branch_falls_back_to_the_loop(gemma2, pairs, monkeypatch):
    """The MLP branch without its post-norm (the block model before this check existed): the unchanged chain no
    longer gives back the model's logit, so the loop computes the numbers, and they are right."""
    def without_post_norm(original, layer, x):
        parts = gemma2.block_parts(layer)
        h = x[:, None, :]
        return parts["mlp"](parts["mlp_pre_norm"](h))[:, 0, :]
    monkeypatch.setattr(gemma2, "mlp_branch", lambda layer, x: without_post_norm(None, layer, x))
    raw = path_patching(gemma2, pairs)
    assert raw.fallback and "unchanged END chain" in raw.fallback and "textbook loop" in raw.fallback
    _equal_to_reference(gemma2, pairs, raw)


def test_wrong_attention_branch_is_caught(gemma2, pairs, monkeypatch):
    """A head's change added after the post-attention norm instead of before it passes the unchanged chain at
    a glance, but not the check of the attention branch: the loop runs."""
    _patched(gemma2, monkeypatch, "attn_branch", lambda original, layer, a: original(layer, a) * 1.001)
    raw = path_patching(gemma2, pairs)
    assert raw.fallback and "attention branch" in raw.fallback
    _equal_to_reference(gemma2, pairs, raw)


def test_wrong_logit_transform_is_caught(gemma2, pairs, monkeypatch):
    """A final transform that is not the model's (its logits doubled): path patching and the logit lens both
    notice on the unchanged stream and give way to the model's own last steps."""
    from engine.backends.layouts import LogitTransform
    right = logit_lens(gemma2, pairs)
    monkeypatch.setattr(BridgeBackend, "logit_transform", property(lambda self: LogitTransform(scale=2.0)))
    raw = path_patching(gemma2, pairs)
    assert raw.fallback and "unchanged END chain" in raw.fallback
    _equal_to_reference(gemma2, pairs, raw)
    lens = logit_lens(gemma2, pairs)
    assert lens.fallback and "logit lens" in lens.fallback
    assert torch.allclose(lens.prob, right.prob, atol=1e-5)
    assert torch.equal(lens.rank, right.rank)


def test_path_atp_falls_back_to_hooked_gradients(gemma2, pairs, monkeypatch):
    right = path_atp(gemma2, pairs)
    assert right.fallback is None
    _patched(gemma2, monkeypatch, "mlp_branch", lambda original, layer, x: original(layer, x) * 1.01)
    got = path_atp(gemma2, pairs)
    assert got.fallback and "path attribution patching" in got.fallback
    assert torch.allclose(got.head_logit, right.head_logit, atol=1e-4)
    assert torch.allclose(got.mlp_logit, right.mlp_logit, atol=1e-4)


def test_continuation_that_does_not_reproduce_falls_back(gemma2, pairs, monkeypatch):
    """A KV cache that no longer gives back the model's logits: head -> head and layer x position run whole
    prompts instead, and equal their textbook loops."""
    receiver = Receiver(2, 1, "q")
    want = head_path_patching_reference(gemma2, pairs, receiver)
    pos_right = layer_position_patching(gemma2, pairs)
    _patched(gemma2, monkeypatch, "continue_end_logits", lambda original, *a, **k: original(*a, **k) + 0.5)
    got = head_path_patching(gemma2, pairs, receiver)
    assert got.fallback and "continuing the prompts" in got.fallback
    done = ~torch.isnan(want.head_logit)
    assert torch.allclose(got.head_logit[done], want.head_logit[done], atol=1e-4)
    pos = layer_position_patching(gemma2, pairs)
    assert pos.fallback and "layer x position" in pos.fallback
    assert torch.allclose(pos.patched.nan_to_num(), pos_right.patched.nan_to_num(), atol=1e-4)


def test_the_note_reaches_the_cache_and_the_cli(gemma2, pairs, monkeypatch, tmp_path, capsys):
    from cache import ResultCache
    _patched(gemma2, monkeypatch, "mlp_branch", lambda original, layer, x: original(layer, x) * 1.01)
    cache = ResultCache(tmp_path / "c.duckdb")
    with collect_notes() as notes:
        table, computed = cached_path_patching(gemma2, pairs, cache=cache)
    assert computed and table.fallback and notes == [table.fallback]
    with collect_notes() as notes:  # read back from the cache: the same note
        again, computed = cached_path_patching(gemma2, pairs, cache=cache)
    assert not computed and again.fallback == table.fallback and notes == [table.fallback]

    # the command line: one "note:" line on stderr, the JSON says it too, exit status 0
    from engine.cli import main as cli_main
    monkeypatch.setattr(BridgeBackend, "mlp_branch", _scaled)  # every model the command opens
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "cli.duckdb"))
    model_dir = gemma2.facts.source
    prompts = tmp_path / "pairs.jsonl"
    assert cli_main.main(["prompts", "--model", model_dir, "--op", "add", "--n", "2", "--keep-all",
                          "--out", str(prompts), "--quiet"]) == 0
    capsys.readouterr()
    status = cli_main.main(["path-patching", "--model", model_dir, "--prompts", str(prompts),
                            "--out", str(tmp_path / "p.csv"), "--quiet"])
    out, err = capsys.readouterr()
    assert status == 0
    lines = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(lines) == 1 and "textbook loop" in lines[0]
    assert "textbook loop" in json.loads(out)["fallback"]


_ORIGINAL_MLP = BridgeBackend.mlp_branch


def _scaled(self, layer, x):
    """An MLP branch 1 % off the model's."""
    return _ORIGINAL_MLP(self, layer, x) * 1.01
