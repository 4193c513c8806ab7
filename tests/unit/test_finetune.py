"""Fine-tuning (engine.finetune.train, engine.finetune.data): precise SFT of head slices, full SFT, LoRA.

Exactness on random-init tiny models of several architectures (Llama and Qwen2 with GQA, Mistral
with one KV head, GPT-2 with the fused Conv1D ``c_attn``) and on the bundled organism (8 heads /
2 KV heads):

* one precise step changes exactly the selected Q/K/V rows and O columns (per the GQA rule),
  nothing else -- bit for bit;
* a slice's gradient is (n_heads / h_l) x the same rows of the plain model's full-weight gradient;
* installing slices does not change the forward pass; merging them back is bit-exact;
* a tuned model saves and reloads (plain and bridged) with identical weights and a new fingerprint;
* full SFT moves every parameter, LoRA merges back into a plain model touching attention only;
* parameter / optimizer-state counts equal hand computations; bad inputs raise FinetuneError.

The expected rows/columns are computed here from the model config (not with the module's helpers).
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.finetune.data import load_sft_data, read_jsonl
from engine.finetune.errors import FinetuneError
from engine.finetune.slices import HeadSlices, attn_layout, kv_groups, parse_heads
from engine.finetune.train import SFTExample, TrainConfig, _batch, answer_loss, encode_examples, train, trainable
from engine.models.fingerprint import weights_fingerprint
from engine.models.load import load_model, load_plain
from tests.integration.tiny_models import build_tiny_model

ARCHS = ("llama", "qwen2", "mistral", "gpt2")


# ---------------------------------------------------------------------------------------------
# fixtures and independent helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_ft")
    return {arch: build_tiny_model(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def examples() -> list[SFTExample]:
    """Real training data: the built-in 'notation' skill set (organism word-level vocabulary)."""
    ex = load_sft_data("notation")
    assert len(ex) >= 16
    return ex[:16]


@pytest.fixture(scope="module")
def organism():
    """The bundled organism, read-only (tests that train load their own copy)."""
    return load_plain("organism", device="cpu")


def _fresh(spec: str):
    return load_plain(spec, device="cpu")


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _dims(cfg) -> tuple[int, int, int, int, int]:
    """(layers, heads, kv heads, head dim, d_model) straight from the HF config."""
    if cfg.model_type == "gpt2":
        return cfg.n_layer, cfg.n_head, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.n_embd
    h = cfg.num_attention_heads
    kv = cfg.num_key_value_heads or h
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    return cfg.num_hidden_layers, h, kv, dh, cfg.hidden_size


def _groups_by_hand(selected: set[int], n_heads: int, n_kv: int, rule: str) -> list[int]:
    g = n_heads // n_kv
    if rule == "none":
        return []
    groups = [k for k in range(n_kv) if any(q in selected for q in range(k * g, (k + 1) * g))]
    if rule == "all":
        groups = [k for k in groups if all(q in selected for q in range(k * g, (k + 1) * g))]
    return groups


def _idx(blocks, d_head: int, offset: int = 0) -> torch.Tensor:
    return torch.tensor([offset + b * d_head + i for b in blocks for i in range(d_head)], dtype=torch.long)


def _by_layer(heads) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for layer, h in heads:
        out.setdefault(layer, set()).add(h)
    return out


def expected_selection(model, heads, rule: str = "any") -> dict[str, list[tuple[int, torch.Tensor]]]:
    """state_dict key -> [(dim, indices)] of the elements precise SFT may change.

    Split projections (Llama ...): rows of q_proj (+bias) for the selected heads, rows of
    k_proj/v_proj (+bias) for the KV groups of the rule, columns of o_proj.  GPT-2 (Conv1D, weight
    stored [in, out]): the same output features are *columns* of c_attn.weight (q | k | v blocks)
    and entries of c_attn.bias; o_proj's input features are *rows* of c_proj.weight.
    """
    cfg = model.config
    _, H, KV, dh, d = _dims(cfg)
    sel: dict[str, list[tuple[int, torch.Tensor]]] = {}
    sd_keys = set(model.state_dict())
    for layer, hs in _by_layer(heads).items():
        q = _idx(sorted(hs), dh)
        kv = _idx(_groups_by_hand(hs, H, KV, rule), dh)
        if cfg.model_type == "gpt2":
            p = f"transformer.h.{layer}.attn"
            cols = torch.cat([q, kv + d, kv + 2 * d])
            sel[f"{p}.c_attn.weight"] = [(1, cols)]
            sel[f"{p}.c_attn.bias"] = [(0, cols)]
            sel[f"{p}.c_proj.weight"] = [(0, q)]
        else:
            p = f"model.layers.{layer}.self_attn"
            for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                if len(rows):
                    sel[f"{p}.{name}.weight"] = [(0, rows)]
                    if f"{p}.{name}.bias" in sd_keys:
                        sel[f"{p}.{name}.bias"] = [(0, rows)]
            sel[f"{p}.o_proj.weight"] = [(1, q)]
    return sel


def _mask(t: torch.Tensor, parts) -> torch.Tensor:
    m = torch.zeros_like(t, dtype=torch.bool)
    for dim, idx in parts:
        m.index_fill_(dim, idx, True)
    return m


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _one_step(method: str, **kw) -> TrainConfig:
    """One optimizer step with a learning rate large enough that every trained element moves
    (Adam's first step is ~lr * sign(grad)); no weight decay, so only gradients move weights."""
    base = {"method": method, "lr": 1e-2, "batch_size": 8, "micro_batch": 8, "max_steps": 1, "warmup": 0.0,
            "weight_decay": 0.0}
    base.update(kw)
    return TrainConfig(**base)


# heads used throughout: on 4-head / 2-KV models layer 0 selects one head of KV group 0 (any: tuned,
# all: not), layer 2 selects heads 0,1 (group 0 complete) and 3 (group 1 incomplete); layer 1 untouched
TINY_HEADS = ((0, 1), (2, 0), (2, 1), (2, 3))


# ---------------------------------------------------------------------------------------------
# one precise step changes exactly the selected slices
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,rule", [("llama", "any"), ("llama", "all"), ("llama", "none"),
                                       ("qwen2", "any"), ("mistral", "all"), ("gpt2", "any")])
def test_precise_step_changes_only_selected_slices(tiny_dirs, examples, arch, rule):
    pm = _fresh(str(tiny_dirs[arch]))
    model = pm.hf_model
    modules_before = {n: type(m) for n, m in model.named_modules()}
    before = _snapshot(model)
    res = train(model, pm.tokenizer, examples[:8], _one_step("precise", heads=TINY_HEADS, kv_rule=rule))
    assert res.steps == 1 and not res.stopped
    after = model.state_dict()
    # the original modules are back (slices merged), nothing added or removed
    assert {n: type(m) for n, m in model.named_modules()} == modules_before
    assert set(after) == set(before)
    assert all(p.requires_grad for p in model.parameters())

    sel = expected_selection(model, TINY_HEADS, rule)
    d = _dims(model.config)[4]
    assert all(k in before for k in sel), sorted(set(sel) - set(before))
    for key, old in before.items():
        new = after[key]
        m = _mask(old, sel.get(key, []))
        assert torch.equal(new[~m], old[~m]), f"{arch}/{rule}: {key} changed outside the selected slices"
        if "k_proj.bias" in key:
            continue  # a key bias shifts every score of a query equally: zero gradient (softmax)
        if key.endswith("c_attn.bias"):
            m[d:2 * d] = False  # GPT-2's key bias block, likewise
        if m.any():
            assert bool((new[m] != old[m]).all()), \
                f"{arch}/{rule}: {key}: {(new[m] == old[m]).sum()} selected elements did not move"
    if arch == "llama":  # the GQA rule made visible: which layers' K/V rows moved
        k_changed = {layer for layer in range(3)
                     if not torch.equal(before[f"model.layers.{layer}.self_attn.k_proj.weight"],
                                        after[f"model.layers.{layer}.self_attn.k_proj.weight"])}
        assert k_changed == {"any": {0, 2}, "all": {2}, "none": set()}[rule]


# ---------------------------------------------------------------------------------------------
# gradient rescaling H / h_l
# ---------------------------------------------------------------------------------------------

def _full_grads(model, batch) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    answer_loss(model, *batch).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_slice_gradient_is_rescaled_full_gradient(tiny_dirs, examples, arch):
    pm = _fresh(str(tiny_dirs[arch]))
    base = pm.hf_model.double().eval()  # float64: the comparison is about the factor, not rounding
    ref = copy.deepcopy(base)  # unmodified copy: plain full-weight backward
    batch = _batch(encode_examples(pm.tokenizer, examples[:8]), pm.tokenizer.pad_token_id, "cpu")
    full = _full_grads(ref, batch)
    _, H, KV, dh, d = _dims(base.config)
    heads = ((0, 1), (2, 0), (2, 1), (2, 3))  # h_0 = 1 -> x4, h_2 = 3 -> x4/3
    mlp_layer = 1
    for rescale in (True, False):
        with HeadSlices(base, heads, mlps=(mlp_layer,), rescale=rescale, kv_rule="any"):
            base.zero_grad(set_to_none=True)
            answer_loss(base, *batch).backward()
            for layer, hs in _by_layer(heads).items():
                factor = H / len(hs) if rescale else 1.0
                q = _idx(sorted(hs), dh)
                kv = _idx(_groups_by_hand(hs, H, KV, "any"), dh)
                checks = []  # (name, slice grad, expected)
                if arch == "gpt2":
                    attn = base.transformer.h[layer].attn
                    p = f"transformer.h.{layer}.attn"
                    rows = torch.cat([q, kv + d, kv + 2 * d])
                    assert torch.equal(attn.c_attn.rows, rows) and torch.equal(attn.c_proj.cols, q)
                    checks += [("c_attn.weight", attn.c_attn.weight_slice.grad, full[f"{p}.c_attn.weight"].t()[rows]),
                               ("c_attn.bias", attn.c_attn.bias_slice.grad, full[f"{p}.c_attn.bias"][rows]),
                               ("c_proj.weight", attn.c_proj.weight_slice.grad, full[f"{p}.c_proj.weight"].t()[:, q])]
                else:
                    attn = base.model.layers[layer].self_attn
                    p = f"model.layers.{layer}.self_attn"
                    assert torch.equal(attn.q_proj.rows, q) and torch.equal(attn.k_proj.rows, kv)
                    checks += [("q_proj", attn.q_proj.weight_slice.grad, full[f"{p}.q_proj.weight"][q]),
                               ("k_proj", attn.k_proj.weight_slice.grad, full[f"{p}.k_proj.weight"][kv]),
                               ("v_proj", attn.v_proj.weight_slice.grad, full[f"{p}.v_proj.weight"][kv]),
                               ("o_proj", attn.o_proj.weight_slice.grad, full[f"{p}.o_proj.weight"][:, q])]
                for name, got, want in checks:
                    assert got is not None, f"{arch} layer {layer} {name}: no gradient"
                    assert float(want.abs().max()) > 0, f"{arch} layer {layer} {name}: zero reference gradient"
                    torch.testing.assert_close(got, factor * want, rtol=1e-6, atol=1e-12 * float(want.abs().max()),
                                               msg=lambda m, ctx=f"{arch} layer {layer} {name} rescale={rescale}":
                                               f"{ctx}: {m}")
            # the MLP layer is tuned whole and never rescaled
            mlp = (base.transformer.h if arch == "gpt2" else base.model.layers)[mlp_layer].mlp
            prefix = f"transformer.h.{mlp_layer}.mlp" if arch == "gpt2" else f"model.layers.{mlp_layer}.mlp"
            for n, prm in mlp.named_parameters():
                want = full[f"{prefix}.{n}"]
                torch.testing.assert_close(prm.grad, want, rtol=1e-6, atol=1e-12 * float(want.abs().max()))
            # frozen weights get no gradient at all
            assert base.lm_head.weight.grad is None


# ---------------------------------------------------------------------------------------------
# the GQA rule
# ---------------------------------------------------------------------------------------------

def test_kv_groups_rule_on_8_heads_2_kv(organism):
    lay = attn_layout(organism.hf_model)
    assert (lay.n_heads, lay.n_kv_heads, lay.d_head, lay.d_model) == (8, 2, 16, 128)
    cases = {  # selected query heads -> (any, all)   [group 0 = heads 0-3, group 1 = heads 4-7]
        (1,): ([0], []),
        (0, 1, 2, 3): ([0], [0]),
        (0, 1, 2, 3, 5): ([0, 1], [0]),
        (0, 4, 5, 6, 7): ([0, 1], [1]),
        (3, 4): ([0, 1], []),
        tuple(range(8)): ([0, 1], [0, 1]),
    }
    for heads, (want_any, want_all) in cases.items():
        assert kv_groups(lay, heads, "any") == want_any, heads
        assert kv_groups(lay, heads, "all") == want_all, heads
        assert kv_groups(lay, heads, "none") == [], heads
    with pytest.raises(FinetuneError, match="unknown kv_rule 'some'"):
        kv_groups(lay, (0,), "some")


def test_kv_rule_without_gqa_tunes_each_heads_own_kv(tiny_dirs):
    lay = attn_layout(_fresh(str(tiny_dirs["gpt2"])).hf_model)
    assert lay.n_kv_heads == lay.n_heads == 4 and lay.fused_qkv
    for heads in ((1,), (0, 3), (0, 1, 2, 3)):
        assert kv_groups(lay, heads, "any") == kv_groups(lay, heads, "all") == sorted(heads)


@pytest.mark.parametrize("rule", ["any", "all", "none"])
def test_kv_rule_on_organism_selects_kv_rows(organism, rule):
    model = organism.hf_model
    heads = ((1, 0), (1, 1), (1, 2), (1, 3), (1, 5), (4, 6))
    want = {"any": {1: [0, 1], 4: [1]}, "all": {1: [0], 4: []}, "none": {1: [], 4: []}}[rule]
    before = _snapshot(model)
    with HeadSlices(model, heads, kv_rule=rule) as hs:
        for layer, groups in want.items():
            attn = model.model.layers[layer].self_attn
            if groups:
                assert torch.equal(attn.k_proj.rows, _idx(groups, 16))
                assert torch.equal(attn.v_proj.rows, _idx(groups, 16))
            else:  # no KV group tuned: the frozen projections stay in place
                assert isinstance(attn.k_proj, torch.nn.Linear) and isinstance(attn.v_proj, torch.nn.Linear)
        for layer in (0, 2, 3, 5):  # no head selected: untouched
            assert isinstance(model.model.layers[layer].self_attn.q_proj, torch.nn.Linear)
        n_kv_rows = 16 * sum(len(g) for g in want.values())
        assert sum(p.numel() for p in hs.parameters()) == 6 * 16 * 128 * 2 + n_kv_rows * 128 * 2
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # merge is bit-exact


# ---------------------------------------------------------------------------------------------
# forward equivalence
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["organism", "llama", "qwen2", "gpt2"])
def test_installed_slices_leave_logits_unchanged(tiny_dirs, examples, organism, arch):
    model = organism.hf_model if arch == "organism" else _fresh(str(tiny_dirs[arch])).hf_model
    tok = organism.tokenizer
    ids, _, _ = _batch(encode_examples(tok, examples[:4]), tok.pad_token_id, "cpu")
    plain = _logits(model, ids)
    before = _snapshot(model)
    heads = ((1, 0), (1, 5), (3, 2)) if arch == "organism" else TINY_HEADS
    with HeadSlices(model, heads, kv_rule="any"):
        sliced = _logits(model, ids)
    torch.testing.assert_close(sliced, plain, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(_logits(model, ids), plain)  # merged back: bit-identical model


# ---------------------------------------------------------------------------------------------
# save / reload of a tuned model
# ---------------------------------------------------------------------------------------------

def test_tuned_model_saves_and_reloads(tmp_path, examples, organism):
    pm = _fresh("organism")
    model = pm.hf_model
    base_fp = weights_fingerprint(organism.hf_model)
    assert weights_fingerprint(model) == base_fp
    train(model, pm.tokenizer, examples[:8], _one_step("precise", heads=((1, 0), (3, 5))))
    tuned_fp = weights_fingerprint(model)
    assert tuned_fp != base_fp
    out = tmp_path / "tuned"
    model.save_pretrained(out)
    pm.tokenizer.save_pretrained(out)

    ids, _, _ = _batch(encode_examples(pm.tokenizer, examples[8:12]), pm.tokenizer.pad_token_id, "cpu")
    want = _logits(model.eval(), ids)
    sd = model.state_dict()
    plain = load_plain(str(out), device="cpu")
    bridged = load_model(str(out), device="cpu")
    for name, m in (("load_plain", plain.hf_model), ("load_model", bridged.hf_model)):
        # the bridge wraps the HF modules in place (".._original_component.." in the names, plus aliases)
        got = {k.replace("._original_component", ""): v for k, v in m.state_dict().items()}
        assert set(sd) <= set(got), f"{name}: missing {sorted(set(sd) - set(got))[:3]}"
        assert all(torch.equal(got[k], sd[k]) for k in sd), f"{name}: weights differ after reload"
    torch.testing.assert_close(_logits(plain.hf_model, ids), want, rtol=0, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(bridged.bridge(ids), want, rtol=1e-5, atol=1e-5)
    assert weights_fingerprint(plain.hf_model) == weights_fingerprint(bridged) == tuned_fp
    assert bridged.facts.fingerprint == tuned_fp != load_model("organism", device="cpu").facts.fingerprint


# ---------------------------------------------------------------------------------------------
# baselines: full SFT and LoRA
# ---------------------------------------------------------------------------------------------

def test_full_sft_changes_every_parameter(tiny_dirs, examples):
    pm = _fresh(str(tiny_dirs["llama"]))
    model = pm.hf_model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train(model, pm.tokenizer, examples[:8], _one_step("full", lr=1e-3))
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, f"full SFT left {unchanged} untouched"
    n = sum(p.numel() for p in before.values())
    assert res.trainable_params == res.total_params == n
    assert res.optimizer_state_numel == 2 * n


def _lora_targets_by_hand(model) -> dict[str, tuple[int, int]]:
    """Attention projection weight key -> (in_features, out_features)."""
    L, H, KV, dh, d = _dims(model.config)
    out = {}
    for layer in range(L):
        if model.config.model_type == "gpt2":
            out[f"transformer.h.{layer}.attn.c_attn.weight"] = (d, 3 * d)
            out[f"transformer.h.{layer}.attn.c_proj.weight"] = (d, d)
        else:
            p = f"model.layers.{layer}.self_attn"
            out.update({f"{p}.q_proj.weight": (d, H * dh), f"{p}.k_proj.weight": (d, KV * dh),
                        f"{p}.v_proj.weight": (d, KV * dh), f"{p}.o_proj.weight": (H * dh, d)})
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lora_merges_into_plain_model_on_attention_only(tiny_dirs, examples, tmp_path, arch):
    pm = _fresh(str(tiny_dirs[arch]))
    model = pm.hf_model
    cls = type(model)
    before = _snapshot(model)
    res = train(model, pm.tokenizer, examples[:8], _one_step("lora", lora_r=4))
    assert type(model) is cls
    peft_mods = [n for n, m in model.named_modules() if type(m).__module__.startswith("peft")]
    assert not peft_mods, f"peft modules remain: {peft_mods[:3]}"
    after = model.state_dict()
    assert set(after) == set(before) and not any("lora" in k or "base_layer" in k for k in after)
    targets = _lora_targets_by_hand(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == set(targets), f"{arch}: LoRA changed {sorted(changed ^ set(targets))[:4]} unexpectedly"
    assert res.trainable_params == sum(4 * (i + o) for i, o in targets.values())
    assert res.optimizer_state_numel == 2 * res.trainable_params
    model.save_pretrained(tmp_path / "lora")
    pm.tokenizer.save_pretrained(tmp_path / "lora")
    reloaded = load_plain(str(tmp_path / "lora"), device="cpu").hf_model.state_dict()
    assert all(torch.equal(reloaded[k], after[k]) for k in after)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_lora_merge_keeps_the_adapted_function(tiny_dirs, examples, arch):
    """The merged plain model computes what the peft model with its adapters computed (GPT-2:
    Conv1D weights stored [in, out], so the merge must respect fan_in_fan_out)."""
    pm = _fresh(str(tiny_dirs[arch]))
    model, tok = pm.hf_model, pm.tokenizer
    ids, _, _ = _batch(encode_examples(tok, examples[:4]), tok.pad_token_id, "cpu")
    base = _logits(model, ids)
    with trainable(model, _one_step("lora", lora_r=4)) as (net, params, _):
        torch.manual_seed(0)
        with torch.no_grad():  # lora_B starts at zero: give both factors non-trivial values
            for p in params:
                p.add_(0.05 * torch.randn_like(p))
        adapted = _logits(net.eval(), ids)
    merged = _logits(model.eval(), ids)
    assert float((adapted - base).abs().max()) > 1e-2  # the adapters change the function
    torch.testing.assert_close(merged, adapted, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# parameter and optimizer-state counts
# ---------------------------------------------------------------------------------------------

def _precise_count_by_hand(model, heads, rule: str, mlps=()) -> int:
    cfg = model.config
    _, H, KV, dh, d = _dims(cfg)
    bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
    n = 0
    for hs in _by_layer(heads).values():
        nq, nkv = len(hs), len(_groups_by_hand(hs, H, KV, rule))
        n += nq * dh * d * 2 + nkv * dh * d * 2  # W_Q rows + W_O columns, W_K + W_V rows
        if bias:
            n += nq * dh + 2 * nkv * dh  # q/k/v biases of those rows (o_proj has none)
    inter = cfg.intermediate_size
    n += len(mlps) * 3 * d * inter  # gate, up, down (no biases)
    return n


def _full_count_by_hand(cfg) -> int:
    L, H, KV, dh, d = _dims(cfg)
    per_layer = d * H * dh * 2 + d * KV * dh * 2 + 3 * d * cfg.intermediate_size + 2 * d
    if cfg.model_type == "qwen2":
        per_layer += H * dh + 2 * KV * dh
    lm_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * d
    return cfg.vocab_size * d + L * per_layer + d + lm_head


@pytest.mark.parametrize("case", ["organism-any", "organism-none-mlp", "qwen2-any", "organism-full"])
def test_trainable_and_optimizer_counts(tiny_dirs, examples, case):
    spec = "organism" if case.startswith("organism") else str(tiny_dirs["qwen2"])
    pm = _fresh(spec)
    model = pm.hf_model
    if case == "organism-full":
        res = train(model, pm.tokenizer, examples[:8], _one_step("full", lr=1e-4))
        want = _full_count_by_hand(model.config)
        assert want == 1223552  # 8 x (attention 40960 + MLP 98304 + norms 256) + embed/unembed (2 x 419 x 128) + norm
    else:
        heads = ((1, 0), (1, 1), (1, 2), (1, 3), (1, 5), (4, 6)) if spec == "organism" else TINY_HEADS
        rule = "none" if "none" in case else "any"
        mlps = (2,) if "mlp" in case else ()
        res = train(model, pm.tokenizer, examples[:8], _one_step("precise", heads=heads, kv_rule=rule, mlps=mlps))
        want = _precise_count_by_hand(model, heads, rule, mlps)
        if case == "organism-any":
            assert want == 36864  # layer 1: 5 q heads + 2 KV groups; layer 4: 1 q head + 1 KV group
    assert res.trainable_params == want
    assert res.optimizer_state_numel == 2 * want  # AdamW: exp_avg + exp_avg_sq per trainable element
    assert res.total_params == _full_count_by_hand(model.config)


# ---------------------------------------------------------------------------------------------
# the loss, the schedule, progress and stopping
# ---------------------------------------------------------------------------------------------

def test_reported_loss_is_answer_token_cross_entropy(tiny_dirs, examples):
    """Step 1's loss = mean CE over the answer tokens (+ EOS) of the whole batch, by hand."""
    pm = _fresh(str(tiny_dirs["llama"]))
    tok, model = pm.tokenizer, pm.hf_model
    batch = examples[:6]
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in batch:
            ids = tok(f"{ex.prompt} {ex.answer}")["input_ids"]
            if ids[-1] != tok.eos_token_id:
                ids = ids + [tok.eos_token_id]
            n_ans = len(tok(ex.answer, add_special_tokens=False)["input_ids"]) + 1  # answer + EOS
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            tgt = torch.tensor(ids[-n_ans:])
            total += float(F.cross_entropy(logits[-n_ans - 1:-1], tgt, reduction="sum"))
            count += n_ans
    res = train(model, tok, batch, _one_step("precise", heads=((0, 0),), batch_size=6, micro_batch=4))
    assert res.losses[0] == pytest.approx(total / count, rel=1e-5)


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (answer_loss must slice the logits itself)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_answer_loss_unembeds_only_answer_positions(tiny_dirs, examples, arch):
    """answer_loss = CE over every position's logits with non-answer labels ignored, while the LM head
    sees only the positions that predict an answer token (uneven lengths: right padding)."""
    pm = _fresh(str(tiny_dirs[arch]))
    model, tok = pm.hf_model, pm.tokenizer
    exs = [examples[0], SFTExample("Anna has 3 apples . 3 − 1 =", "2"), examples[5]]
    ids, mask, labels = _batch(encode_examples(tok, exs), tok.pad_token_id, "cpu")
    assert len(set(mask.sum(1).tolist())) > 1  # the batch really is padded
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    want = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    seen_positions = []
    hook = model.lm_head.register_forward_hook(lambda m, inp, out: seen_positions.append(inp[0].shape[1]))
    try:
        with torch.no_grad():
            got = answer_loss(model, ids, mask, labels)
            got_wrapped = answer_loss(_NoLogitsToKeep(model), ids, mask, labels)
    finally:
        hook.remove()
    n_predicting = int((labels[:, 1:] != -100).any(0).sum())
    assert seen_positions == [n_predicting, ids.shape[1]] and n_predicting < ids.shape[1] - 1
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_wrapped, want, rtol=1e-6, atol=1e-6)


def test_micro_batches_accumulate_to_the_same_step(tiny_dirs, examples):
    results = []
    for micro in (8, 3):
        pm = _fresh(str(tiny_dirs["llama"]))
        res = train(pm.hf_model, pm.tokenizer, examples[:8],
                    _one_step("precise", heads=TINY_HEADS, micro_batch=micro, lr=1e-3))
        results.append((res.losses[0], pm.hf_model.state_dict()))
    (l1, sd1), (l2, sd2) = results
    assert l1 == pytest.approx(l2, rel=1e-5)
    for k in sd1:
        torch.testing.assert_close(sd1[k], sd2[k], rtol=0, atol=1e-6)


def test_progress_once_per_step_and_should_stop(tiny_dirs, examples):
    cfg = TrainConfig(method="precise", heads=TINY_HEADS, lr=1e-3, batch_size=4, max_steps=5, warmup=0.2)
    pm = _fresh(str(tiny_dirs["llama"]))
    seen = []
    res = train(pm.hf_model, pm.tokenizer, examples, cfg, progress=seen.append)
    assert [p.step for p in seen] == [1, 2, 3, 4, 5] and {p.total_steps for p in seen} == {5}
    assert [p.samples_seen for p in seen] == [4, 8, 12, 16, 20]
    assert all(a.elapsed_s <= b.elapsed_s for a, b in itertools.pairwise(seen))
    assert [p.loss for p in seen] == res.losses and not res.stopped and res.steps == 5
    lrs = [p.lr for p in seen]  # 1 warm-up step, then linear decay
    assert lrs == pytest.approx([1e-3, 1e-3, 0.75e-3, 0.5e-3, 0.25e-3])

    pm = _fresh(str(tiny_dirs["llama"]))
    before = _snapshot(pm.hf_model)
    seen2: list = []
    polls = []
    res2 = train(pm.hf_model, pm.tokenizer, examples, cfg, progress=seen2.append,
                 should_stop=lambda: polls.append(len(seen2)) or len(seen2) >= 2)
    assert res2.stopped and res2.steps == 2 and res2.samples == 8 and len(res2.losses) == 2
    assert [p.step for p in seen2] == [1, 2] and polls == [0, 1, 2]
    assert res2.losses == res.losses[:2]  # same seed, same first steps
    after = pm.hf_model.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the 2 steps' updates are kept
    assert all(isinstance(layer.self_attn.q_proj, torch.nn.Linear) for layer in pm.hf_model.model.layers)


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------

def test_bad_config_raises():
    with pytest.raises(FinetuneError, match="unknown method 'sgd'.*precise, full, lora"):
        TrainConfig(method="sgd")
    with pytest.raises(FinetuneError, match="precise SFT needs heads"):
        TrainConfig(method="precise")
    with pytest.raises(FinetuneError, match="unknown kv_rule 'some'"):
        TrainConfig(heads=((0, 0),), kv_rule="some")
    with pytest.raises(FinetuneError, match="lr must be > 0"):
        TrainConfig(heads=((0, 0),), lr=0)
    TrainConfig(method="full")  # the baselines need no heads
    assert TrainConfig.from_dict(TrainConfig(heads=((1, 2),), mlps=(3,)).to_dict()).heads == ((1, 2),)


def test_parse_heads():
    assert parse_heads("3.1, 5.0,3.1") == ((3, 1), (5, 0))
    for bad in ("3-1", "a.b", "1.2.3", "3.", "-1.0"):
        with pytest.raises(FinetuneError, match=f"bad head '{bad}'"):
            parse_heads(bad)
    with pytest.raises(FinetuneError, match="no heads given"):
        parse_heads(" , ")


@pytest.mark.parametrize("head", [(8, 0), (0, 8)])
def test_head_out_of_range_leaves_model_intact(examples, head):
    pm = _fresh("organism")
    before = _snapshot(pm.hf_model)
    with pytest.raises(FinetuneError, match=rf"head {head[0]}\.{head[1]} does not exist.*8 layers x 8 heads"):
        train(pm.hf_model, pm.tokenizer, examples, TrainConfig(heads=((0, 0), head), max_steps=1))
    assert all(isinstance(layer.self_attn.q_proj, torch.nn.Linear) for layer in pm.hf_model.model.layers)
    assert all(torch.equal(v, before[k]) for k, v in pm.hf_model.state_dict().items())


def test_empty_data_raises(organism):
    with pytest.raises(FinetuneError, match="no training examples"):
        train(organism.hf_model, organism.tokenizer, [], TrainConfig(heads=((0, 0),)))
    with pytest.raises(FinetuneError, match="example 0: prompt and answer must be non-empty"):
        encode_examples(organism.tokenizer, [SFTExample("1 + 1 =", " ")])


def test_read_jsonl(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "3 − 1 =", "answer": "2"}) + "\n\n"
                    + json.dumps({"prompt": "2 × 4 =", "answer": 8}) + "\n", encoding="utf-8")
    assert read_jsonl(good) == [SFTExample("3 − 1 =", "2"), SFTExample("2 × 4 =", "8")]
    assert load_sft_data(str(good)) == read_jsonl(good)

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n\n{"prompt": "1 + 2 =", "answer": \n', encoding="utf-8")
    with pytest.raises(FinetuneError, match=rf"{broken}:3: not valid JSON"):
        read_jsonl(broken)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n{"prompt": "1 + 2 ="}\n', encoding="utf-8")
    with pytest.raises(FinetuneError, match=rf"{missing}:2: each line needs \"prompt\" and \"answer\""):
        read_jsonl(missing)
    empty_answer = tmp_path / "empty_answer.jsonl"
    empty_answer.write_text('{"prompt": "1 + 1 =", "answer": "  "}\n', encoding="utf-8")
    with pytest.raises(FinetuneError, match=rf"{empty_answer}:1: empty prompt or answer"):
        read_jsonl(empty_answer)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(FinetuneError, match="holds no examples"):
        read_jsonl(blank)
    with pytest.raises(FinetuneError, match="does not exist"):
        load_sft_data(str(tmp_path / "nope.jsonl"))


def test_job_eta_follows_the_pace_so_far():
    from engine.finetune.jobs import JobStatus, job_eta
    s = JobStatus("j", "running", step=10, total_steps=50, started=100.0, updated=120.0)
    assert job_eta(s) == pytest.approx(80.0)  # 2 s a step, 40 steps left
    assert job_eta(JobStatus("j", "running", step=0, total_steps=50, started=100.0, updated=100.0)) is None
    assert job_eta(JobStatus("j", "finished", step=50, total_steps=50, started=100.0, updated=200.0)) is None
