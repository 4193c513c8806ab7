"""Plain-transformers references: the lab's methods on the Hugging Face model itself.

Everything here reads and writes activations with PyTorch hooks on the model's own modules, one full forward
pass per variant, full ``[batch, pos, vocab]`` logits -- written independently of the lab's backends, its
block model and its per-architecture table (:mod:`engine.backends.layouts`).  What it must know of an
architecture is in :data:`BRANCHES` below, written from each model's ``modeling_*.py``, and
:meth:`Plain.check_branches` verifies it against the model (the layer's output must be its input plus the
two contributions read through these modules).

Definitions (docs/methods.md, "What a head's and an MLP's output are"):

* a head's output is its slice of the attention's output projection's *input* (``o_proj``'s input, per head);
* an MLP's output is what the MLP branch adds to the residual stream: the output of the branch's last module
  (its post-norm where it has one), which is the contribution itself up to a fixed residual scale (Granite),
  so replacing it replaces the contribution;
* the MLP's input is the residual stream the branch reads (a parallel block's: the block input).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from engine.machinery.batching import pad

ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
O_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "o", "Wo")


@dataclass(frozen=True)
class Branches:
    """Where the MLP branch of one decoder layer starts and ends, by module name within the layer."""

    mlp_in: str | None     # the module whose *input* is the stream the MLP reads; None: the layer's input (parallel)
    mlp_out: str           # the module whose *output* is the MLP's contribution (up to a fixed scale)
    attn_out: str | None = None  # the module whose output is the attention's contribution (None: the attention's)
    parallel: bool = False


_LLAMA = Branches("post_attention_layernorm", "mlp")
_POST = Branches("mlp", "post_feedforward_layernorm", "post_attention_layernorm")  # OLMo 2/3, EXAONE 4
_SANDWICH = Branches("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_attention_layernorm")
BRANCHES: dict[str, Branches] = {
    **{mt: _LLAMA for mt in ("llama", "mistral", "ministral3", "qwen2", "qwen3", "gemma", "granite", "olmo", "phi3",
                             "starcoder2", "nemotron", "ernie4_5", "arcee", "seed_oss", "glm", "smollm3", "jais2",
                             "hunyuan_v1_dense", "nanochat", "bitnet", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe",
                             "minimax_m2", "laguna", "ernie4_5_moe", "glm4_moe", "gpt_oss")},
    "stablelm": _LLAMA,
    "granitemoe": Branches("post_attention_layernorm", "block_sparse_moe"),
    "apertus": Branches("feedforward_layernorm", "mlp"),
    "lfm2": Branches("ffn_norm", "feed_forward"),
    "vaultgemma": Branches("pre_feedforward_layernorm", "mlp"),
    "gemma2": _SANDWICH, "gemma3_text": _SANDWICH,
    "afmoe": Branches("pre_mlp_layernorm", "post_mlp_layernorm", "post_attention_layernorm"),
    "olmo2": _POST, "olmo3": _POST, "exaone4": _POST, "flex_olmo": _POST,
    "glm4": Branches("post_attention_layernorm", "post_mlp_layernorm", "post_self_attn_layernorm"),
    "gpt2": Branches("ln_2", "mlp"), "gpt_bigcode": Branches("ln_2", "mlp"),
    "bloom": Branches("post_attention_layernorm", "mlp.dense_4h_to_h"),  # BloomMLP adds the residual itself
    "mpt": Branches("norm_2", "ffn.down_proj"),                           # MptMLP too
    "openai-gpt": Branches("mlp", "mlp"),  # post-norm: the MLP reads ln_1(x + attn), the stream itself
    "modernbert-decoder": Branches("mlp_norm", "mlp"),
    "falcon_h1": Branches("pre_ff_layernorm", "feed_forward"),  # a Mamba mixer beside the attention
    "opt": Branches("final_layer_norm", "fc2"), "xglm": Branches("final_layer_norm", "fc2"),
    "gptj": Branches(None, "mlp", parallel=True), "codegen": Branches(None, "mlp", parallel=True),
    "cohere": Branches(None, "mlp", parallel=True), "cohere2": Branches(None, "mlp", parallel=True),
    "phi": Branches(None, "mlp", parallel=True), "falcon": Branches(None, "mlp", parallel=True),
    "gpt_neox": Branches(None, "mlp", parallel=True),
}


def layers_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers: the first ModuleList as long as the config says."""
    n = model.config.get_text_config().num_hidden_layers
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n:
            return mod
    raise LookupError("no ModuleList of the decoder layers")


def child(module: torch.nn.Module, names: Sequence[str]) -> torch.nn.Module:
    for name in names:
        if name in module._modules:
            return module._modules[name]
    raise LookupError(f"none of {names} in {type(module).__name__}")


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class Plain:
    """A plain HF causal LM with the lab's quantities read and replaced by torch hooks on its own modules."""

    def __init__(self, hf_model: torch.nn.Module, pad_id: int = 0) -> None:
        self.model = hf_model.eval()
        cfg = hf_model.config.get_text_config()
        self.model_type = hf_model.config.model_type
        self.branches = BRANCHES[self.model_type]
        self.layers = layers_of(hf_model)
        self.L = len(self.layers)
        self.H = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        self.pad_id = pad_id

    # -- modules --------------------------------------------------------------------------------
    def attn(self, layer: int) -> torch.nn.Module:
        return child(self.layers[layer], ATTN_NAMES)

    def o_proj(self, layer: int) -> torch.nn.Module:
        return child(self.attn(layer), O_NAMES)

    def mlp_out(self, layer: int) -> torch.nn.Module:
        return self.layers[layer].get_submodule(self.branches.mlp_out)

    # -- hooks ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def hooked(self, pre: dict | None = None, post: dict | None = None, shape: tuple[int, int] | None = None
               ) -> Iterator[None]:
        """Forward pre-hooks ``{module: fn(input) -> input}`` and hooks ``{module: fn(output) -> output}``; each fn
        sees its tensor as [batch, pos, ...] (OPT's MLP runs on [batch * pos, d]: ``shape`` unflattens it)."""
        def as3d(fn):
            def wrapped(x):
                if shape is not None and x.dim() == 2 and x.shape[0] == shape[0] * shape[1]:
                    return fn(x.reshape(*shape, -1)).reshape(x.shape)
                return fn(x)
            return wrapped
        def pre_hook(fn):
            def hook(m, args, kwargs):
                if args:
                    return (fn(args[0]),) + tuple(args[1:]), kwargs
                return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
            return hook

        def post_hook(fn):
            def hook(m, a, out):
                return (fn(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else fn(out)
            return hook
        handles = []
        try:
            for mod, fn in (pre or {}).items():
                handles.append(mod.register_forward_pre_hook(pre_hook(as3d(fn)), with_kwargs=True))
            for mod, fn in (post or {}).items():
                handles.append(mod.register_forward_hook(post_hook(as3d(fn))))
            yield
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def run(self, seqs: Sequence[Sequence[int]], pre: dict | None = None, post: dict | None = None, *,
            end_only: bool = False, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """(full logits [b, pos, vocab], END index [b]) of right-padded ``seqs`` under the hooks.  ``end_only``: the
        logits of the rows' END positions only, where the model's own ``forward`` offers it (transformers'
        ``logits_to_keep``, given the distinct END positions U): ([b, |U|, vocab], each row's END as an index into U),
        so ``lg[rows, end]`` still reads each row's END; full logits otherwise."""
        ids, mask, end = pad(seqs, self.pad_id)
        keep = torch.unique(end) if end_only and self.keeps_logits else None  # [U], sorted
        if keep is not None:
            kwargs["logits_to_keep"] = keep
        with self.hooked(pre, post, tuple(ids.shape)):
            out = self.model(input_ids=ids, attention_mask=mask, **kwargs)
        if keep is None:
            return out.logits.float(), end
        assert out.logits.shape[1] == len(keep), (out.logits.shape, keep)  # the model kept what it was asked for
        return out.logits.float(), torch.searchsorted(keep, end)

    @functools.cached_property
    def keeps_logits(self) -> bool:
        """Whether the model's ``forward`` takes ``logits_to_keep`` (the positions whose logits it computes)."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    @torch.no_grad()
    def capture(self, seqs: Sequence[Sequence[int]]) -> dict[str, list[torch.Tensor]]:
        """Per layer: ``z`` [b, pos, H, d_head] (o_proj inputs), ``mlp`` [b, pos, d] (MLP contributions),
        ``resid_pre`` [b, pos, d] (layer inputs), ``resid_post`` [b, pos, d] (layer outputs)."""
        got: dict[str, list] = {k: [None] * self.L for k in ("z", "mlp", "resid_pre", "resid_post", "mlp_in")}

        def keep(kind, layer, reshape=False):
            def fn(x):
                got[kind][layer] = x.reshape(*x.shape[:2], self.H, -1).clone() if reshape else x.clone()
                return x
            return fn
        pre, post = {}, {}
        for j in range(self.L):
            pre[self.o_proj(j)] = keep("z", j, reshape=True)
            post[self.mlp_out(j)] = keep("mlp", j)
            pre[self.layers[j]] = keep("resid_pre", j)
            post[self.layers[j]] = keep("resid_post", j)
            if self.branches.mlp_in is not None:
                pre[self.layers[j].get_submodule(self.branches.mlp_in)] = keep("mlp_in", j)
        self.run(seqs, pre, post)
        if self.branches.mlp_in is None:
            got["mlp_in"] = got["resid_pre"]
        return got


# ---------------------------------------------------------------------------------------------
# path patching: Algorithm 1, one forward pass per sender
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def path_patching(plain: Plain, pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logit_o [P], head [P, L, H], mlp [P, L]) answer logits: every head's o_proj input frozen at X_r, the
    sender's END slice (or the MLP's END contribution) from X_c."""
    ref = [p.ref_ids for p in pairs]
    cf = [p.cf_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    r, c = plain.capture(ref), plain.capture(cf)
    lg, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    logit_o = lg[rows, end, answer]
    L, H = plain.L, plain.H
    head = torch.empty(len(pairs), L, H)
    mlp = torch.empty(len(pairs), L)

    def frozen(layer, sender_head=None):
        def fn(x):
            x = r["z"][layer].clone()
            if sender_head is not None:
                x[rows, end, sender_head] = c["z"][layer][rows, end, sender_head]
            return x.reshape(*x.shape[:2], -1)
        return fn
    each_sender(plain, ref, c["mlp"], end, answer, L, frozen, dict, head, mlp)
    return logit_o, head, mlp


def each_sender(plain: Plain, ref, cf_mlp, end, answer, n_layers: int, frozen, post, head, mlp) -> None:
    """One forward pass per sender of layers < ``n_layers``: o_proj inputs from ``frozen(layer, sender_head)``,
    an MLP sender's END output from ``cf_mlp``, ``post()``'s hooks besides; answer logits into head / mlp."""
    rows = torch.arange(len(ref))
    for sl in range(n_layers):
        for sh in list(range(plain.H)) + [None]:
            pre = {plain.o_proj(j): frozen(j, sh if j == sl else None) for j in range(plain.L)}
            hooks = post()
            if sh is None:
                def put(x, sl=sl):
                    x = x.clone()
                    x[rows, end] = cf_mlp[sl][rows, end].to(x.dtype)
                    return x
                hooks[plain.mlp_out(sl)] = put
            lg, at = plain.run(ref, pre, hooks, end_only=True)  # [P, U, vocab]: only the END positions unembedded
            v = lg[rows, at, answer]
            if sh is None:
                mlp[:, sl] = v
            else:
                head[:, sl, sh] = v


# ---------------------------------------------------------------------------------------------
# head -> head: the receiver's q, k or v recomputed, the other two frozen at X_r
# ---------------------------------------------------------------------------------------------

def qkv_split(plain: Plain, layer: int) -> tuple[dict[str, torch.nn.Module], object]:
    """({"q"|"k"|"v"|"qkv": projection}, split) of a layer's attention: separate projections, or one fused
    projection and ``split(out) -> (q, k, v) slices`` of its last dimension, from the model's own code."""
    attn = plain.attn(layer)
    mods = attn._modules
    if all(n in mods for n in ("q_proj", "k_proj", "v_proj")):
        return {"q": mods["q_proj"], "k": mods["k_proj"], "v": mods["v_proj"]}, None
    cfg = plain.model.config
    H = plain.H
    if "c_attn" in mods:  # GPT-2 [q | k | v]; GPT-BigCode multi-query [q | k (1 head) | v (1 head)]
        d = cfg.n_embd
        kv = d // H if getattr(cfg, "multi_query", False) else d
        return {"qkv": mods["c_attn"]}, (slice(0, d), slice(d, d + kv), slice(d + kv, d + 2 * kv))
    if "qkv_proj" in mods and cfg.model_type == "phi3":  # [q (H d) | k (KV d) | v (KV d)]
        dh = cfg.hidden_size // H
        q, kv = H * dh, cfg.num_key_value_heads * dh
        return {"qkv": mods["qkv_proj"]}, (slice(0, q), slice(q, q + kv), slice(q + kv, q + 2 * kv))
    if "query_key_value" in mods and cfg.model_type in ("gpt_neox", "bloom"):  # per head [q k v]
        dh = cfg.hidden_size // H
        idx = torch.arange(3 * H * dh).reshape(H, 3, dh)
        return {"qkv": mods["query_key_value"]}, tuple(idx[:, i].reshape(-1) for i in range(3))
    if "Wqkv" in mods:  # MPT, ModernBERT: [q | k | v]
        d = mods["Wqkv"].out_features // 3
        return {"qkv": mods["Wqkv"]}, (slice(0, d), slice(d, 2 * d), slice(2 * d, 3 * d))
    if "qkv_proj" in mods and cfg.model_type == "codegen":  # mp_num blocks of [q | v | k] (modeling_codegen.py)
        mp, d = 4, cfg.n_embd
        idx = torch.arange(3 * d).reshape(mp, 3, d // mp)
        return {"qkv": mods["qkv_proj"]}, (idx[:, 0].reshape(-1), idx[:, 2].reshape(-1), idx[:, 1].reshape(-1))
    if "query_key_value" in mods and cfg.model_type == "falcon" and cfg.multi_query \
            and not cfg.new_decoder_architecture:  # [q (H d) | k (d) | v (d)]
        dh = cfg.hidden_size // H
        return {"qkv": mods["query_key_value"]}, (slice(0, H * dh), slice(H * dh, (H + 1) * dh),
                                                  slice((H + 1) * dh, (H + 2) * dh))
    raise LookupError(f"no plain q/k/v split for {cfg.model_type}")


@torch.no_grad()
def head_to_head(plain: Plain, pairs, receiver: tuple[int, int, str]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logit_o [P], head [P, L, H] (nan from the receiver's layer on), mlp [P, L]): per sender, two passes --
    the receiver (layer, head, "q"|"k"|"v") the only head computed (every other head's o_proj input frozen at X_r,
    the receiver layer's other two projections frozen at X_r, the sender's END output or MLP contribution from
    X_c), its o_proj input recorded; then X_r with every o_proj input frozen at X_r but the receiver's, the
    recorded one -- the answer logit carried only through the receiver's input."""
    lr, hr, inp = receiver
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    r, c = plain.capture(ref), plain.capture([p.cf_ids for p in pairs])
    proj, split = qkv_split(plain, lr)
    outs: dict[str, torch.Tensor] = {}
    keep = {m: (lambda x, m=m: outs.__setitem__(m, x.clone()) or x) for m in proj}
    plain.run(ref, post={mod: keep[name] for name, mod in proj.items()})
    lg, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    logit_o = lg[rows, end, answer]
    L, H = plain.L, plain.H
    head = torch.full((len(pairs), L, H), float("nan"))
    mlp = torch.full((len(pairs), L), float("nan"))

    def frozen_inputs() -> dict:
        if split is None:
            return {proj[k]: (lambda x, k=k: outs[k].to(x.dtype)) for k in "qkv" if k != inp}
        which = "qkv".index(inp)

        def fn(x):
            new = outs["qkv"].clone().to(x.dtype)
            new[..., split[which]] = x[..., split[which]]
            return new
        return {proj["qkv"]: fn}

    for sl in range(lr):
        for sh in list(range(H)) + [None]:
            recorded: dict[str, torch.Tensor] = {}

            def frozen(layer, sender_head, recorded=recorded):
                def fn(x):
                    new = r["z"][layer].clone()
                    if sender_head is not None:
                        new[rows, end, sender_head] = c["z"][layer][rows, end, sender_head]
                    if layer == lr:
                        new[:, :, hr] = recorded["z"] = x.reshape(*x.shape[:2], H, -1)[:, :, hr].clone()
                    return new.reshape(*x.shape[:2], -1)
                return fn
            post = frozen_inputs()
            if sh is None:
                def put(x, sl=sl):
                    x = x.clone()
                    x[rows, end] = c["mlp"][sl][rows, end].to(x.dtype)
                    return x
                post[plain.mlp_out(sl)] = put
            plain.run(ref, {plain.o_proj(j): frozen(j, sh if j == sl else None) for j in range(L)}, post,
                      end_only=True)

            def passed_on(layer, recorded=recorded):
                def fn(x):
                    new = r["z"][layer].clone()
                    if layer == lr:
                        new[:, :, hr] = recorded["z"]
                    return new.reshape(*x.shape[:2], -1).to(x.dtype)
                return fn
            lg, at = plain.run(ref, {plain.o_proj(j): passed_on(j) for j in range(L)}, end_only=True)
            v = lg[rows, at, answer]
            if sh is None:
                mlp[:, sl] = v
            else:
                head[:, sl, sh] = v
    return logit_o, head, mlp


# ---------------------------------------------------------------------------------------------
# direct effects: a component's own write at END removed, every head and MLP frozen at X_r
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def direct_effects(plain: Plain, pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """(head [P, L, H], mlp [P, L]) direct effects on the answer logit at END of X_r: the model's answer logit minus
    the one with every head's o_proj input and every MLP's output frozen at X_r and the component's own write at END
    removed (a head's o_proj input slice at END zeroed, an MLP's output at END zeroed), one pass per component."""
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    r = plain.capture(ref)
    lg, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    L, H = plain.L, plain.H
    head, mlp = torch.empty(len(pairs), L, H), torch.empty(len(pairs), L)

    def frozen(layer, sender_head=None):
        def fn(x):
            x = r["z"][layer].clone()
            if sender_head is not None:
                x[rows, end, sender_head] = 0
            return x.reshape(*x.shape[:2], -1)
        return fn

    def frozen_mlps():
        # a copy: Falcon adds the attention to the MLP's output in place
        return {plain.mlp_out(j): (lambda x, j=j: r["mlp"][j].to(x.dtype, copy=True)) for j in range(L)}
    each_sender(plain, ref, [torch.zeros_like(m) for m in r["mlp"]], end, answer, L, frozen, frozen_mlps, head, mlp)
    logit_o = lg[rows, end, answer]
    return logit_o[:, None, None] - head, logit_o[:, None] - mlp


# ---------------------------------------------------------------------------------------------
# layer x position: resid_pre[l] at one position from X_c
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def layer_position(plain: Plain, pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_o [P], patched [P, L, W]): the answer logit with layer l's input at END - rel from X_c."""
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    c = plain.capture([p.cf_ids for p in pairs])
    lg, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    W = max(len(s) for s in ref)
    out = torch.full((len(pairs), plain.L, W), float("nan"))
    for layer in range(plain.L):
        for rel in range(W):
            ok = end - rel >= 0
            pos = (end - rel).clamp_min(0)

            def put(x, layer=layer, pos=pos, ok=ok):
                x = x.clone()
                x[rows[ok], pos[ok]] = c["resid_pre"][layer][rows[ok], pos[ok]].to(x.dtype)
                return x
            got, _ = plain.run(ref, pre={plain.layers[layer]: put})
            out[ok, layer, rel] = got[rows, end, answer][ok]
    return lg[rows, end, answer], out


# ---------------------------------------------------------------------------------------------
# activation patching (nothing frozen) and the two gradients of attribution patching
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def activation_patching(plain: Plain, pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """(head [P, L, H], mlp [P, L]) answer logits with one sender's END output from X_c, nothing frozen."""
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    c = plain.capture([p.cf_ids for p in pairs])
    _, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    head = torch.empty(len(pairs), plain.L, plain.H)
    mlp = torch.empty(len(pairs), plain.L)
    for sl in range(plain.L):
        for sh in list(range(plain.H)) + [None]:
            if sh is None:
                def put(x, sl=sl):
                    x = x.clone()
                    x[rows, end] = c["mlp"][sl][rows, end].to(x.dtype)
                    return x
                got, _ = plain.run(ref, post={plain.mlp_out(sl): put})
                mlp[:, sl] = got[rows, end, answer]
            else:
                def put_z(x, sl=sl, sh=sh):
                    z = x.reshape(*x.shape[:2], plain.H, -1).clone()
                    z[rows, end, sh] = c["z"][sl][rows, end, sh].to(x.dtype)
                    return z.reshape(x.shape)
                got, _ = plain.run(ref, pre={plain.o_proj(sl): put_z})
                head[:, sl, sh] = got[rows, end, answer]
    return head, mlp


def atp(plain: Plain, pairs, *, frozen: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logit_o [P], head [P, L, H], mlp [P, L]) of attribution patching: logit_o + grad . (X_c - X_r) at END,
    the gradient with every head's o_proj input frozen at X_r (``frozen``: the estimate of path patching) or not
    (the estimate of activation patching)."""
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    r, c = plain.capture(ref), plain.capture([p.cf_ids for p in pairs])
    ids, mask, end = pad(ref, plain.pad_id)
    rows = torch.arange(len(pairs))
    L, H = plain.L, plain.H
    z_probe = [torch.zeros(len(pairs), H, r["z"][j].shape[-1], requires_grad=True) for j in range(L)]
    m_probe = [torch.zeros(len(pairs), r["mlp"][j].shape[-1], requires_grad=True) for j in range(L)]

    def at_end(probe):
        def add(x):
            extra = torch.zeros(x.shape, dtype=probe.dtype)
            extra = extra.index_put((rows, end), probe)
            return x + extra.to(x.dtype)
        return add
    pre, post = {}, {}
    for j in range(L):
        def z_fn(x, j=j):
            base = r["z"][j].detach() if frozen else x.reshape(*x.shape[:2], H, -1)
            return at_end(z_probe[j])(base).reshape(x.shape)
        pre[plain.o_proj(j)] = z_fn
        post[plain.mlp_out(j)] = at_end(m_probe[j])
    with torch.enable_grad(), plain.hooked(pre, post, tuple(ids.shape)):
        lg = plain.model(input_ids=ids, attention_mask=mask).logits.float()
        lo = lg[rows, end, answer]
        grads = torch.autograd.grad(lo.sum(), z_probe + m_probe)
    lo = lo.detach()
    head = torch.stack([lo[:, None] + (grads[j] * (c["z"][j] - r["z"][j])[rows, end]).sum(-1) for j in range(L)], 1)
    mlp = torch.stack([lo + (grads[L + j] * (c["mlp"][j] - r["mlp"][j])[rows, end]).sum(-1) for j in range(L)], 1)
    return lo, head, mlp


# ---------------------------------------------------------------------------------------------
# mean ablation
# ---------------------------------------------------------------------------------------------

def heads_by_layer(heads: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """{layer: [head, ...]} of (layer, head) pairs."""
    out: dict[int, list[int]] = {}
    for layer, h in heads:
        out.setdefault(layer, []).append(h)
    return out


@torch.no_grad()
def mean_ablation_logits(plain: Plain, pairs, heads: Sequence[tuple[int, int]], mlps: Sequence[int]) -> torch.Tensor:
    """Answer logits at END [P] with the given heads' o_proj input slices and MLPs' contributions replaced, at
    every position, by their means over the X_c prompts of the same template, aligned at END (an offset none of
    them has keeps the prompt's own value)."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p.template, []).append(i)
    cf = [p.cf_ids for p in pairs]
    c = plain.capture(cf)
    ends = [len(s) - 1 for s in cf]

    def mean_at(kind, layer, idx, offset):
        vals = [c[kind][layer][i, ends[i] - offset] for i in idx if ends[i] - offset >= 0]
        return torch.stack(vals).mean(0) if vals else None
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    _, end = plain.run(ref)
    rows = torch.arange(len(pairs))
    by_layer = heads_by_layer(heads)

    def z_fn(layer):
        def fn(x):
            z = x.reshape(*x.shape[:2], plain.H, -1).clone()
            for i, p in enumerate(pairs):
                for off in range(int(end[i]) + 1):
                    m = mean_at("z", layer, groups[p.template], off)
                    if m is not None:
                        z[i, int(end[i]) - off, by_layer[layer]] = m[by_layer[layer]].to(z.dtype)
            return z.reshape(x.shape)
        return fn

    def m_fn(layer):
        def fn(x):
            x = x.clone()
            for i, p in enumerate(pairs):
                for off in range(int(end[i]) + 1):
                    m = mean_at("mlp", layer, groups[p.template], off)
                    if m is not None:
                        x[i, int(end[i]) - off] = m.to(x.dtype)
            return x
        return fn
    pre = {plain.o_proj(layer): z_fn(layer) for layer in by_layer}
    post = {plain.mlp_out(layer): m_fn(layer) for layer in mlps}
    lg, _ = plain.run(ref, pre, post)
    return lg[rows, end, answer]


@torch.no_grad()
def interchange_margins(plain: Plain, pairs, heads: Sequence[tuple[int, int]], mlps: Sequence[int]) -> torch.Tensor:
    """(answer logit - mean logit) at END [P] with the given heads' o_proj input slices and MLPs' contributions
    replaced, at every position, by their values on the pair's own X_c (interchange ablation)."""
    c = plain.capture([p.cf_ids for p in pairs])
    ref = [p.ref_ids for p in pairs]
    answer = torch.tensor([p.answer_id for p in pairs])
    rows = torch.arange(len(pairs))
    by_layer = heads_by_layer(heads)

    def z_fn(layer):
        def fn(x):
            z = x.reshape(*x.shape[:2], plain.H, -1).clone()
            z[:, :, by_layer[layer]] = c["z"][layer][:, :z.shape[1], by_layer[layer]].to(z.dtype)
            return z.reshape(x.shape)
        return fn

    def m_fn(layer):
        return lambda x: c["mlp"][layer][:, :x.shape[1]].to(x.dtype).clone()
    lg, end = plain.run(ref, {plain.o_proj(layer): z_fn(layer) for layer in by_layer},
                        {plain.mlp_out(layer): m_fn(layer) for layer in mlps})
    at = lg[rows, end].float()  # [P, vocab]
    return at[rows, answer] - at.mean(-1)


# ---------------------------------------------------------------------------------------------
# attention rows, MLP projections, the logit lens, number features
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def end_rows(plain: Plain, seqs) -> list[torch.Tensor]:
    """Every head's END-row attention per prompt ([L, H, len]), from ``output_attentions`` (eager)."""
    ids, mask, end = pad(seqs, plain.pad_id)
    out = plain.model(input_ids=ids, attention_mask=mask, output_attentions=True)
    att = torch.stack([a.float() for a in out.attentions], 1)  # [b, L, H, q, k]
    return [att[i, :, :, int(end[i]), :int(end[i]) + 1] for i in range(len(seqs))]


def unembedding(plain: Plain) -> torch.Tensor:
    """W_U [d_model, vocab]."""
    return plain.model.get_output_embeddings().weight.detach().float().T


@torch.no_grad()
def mlp_vectors(plain: Plain, seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """(mlp_in, mlp_out) at END: [n, L, d_model] each (the contribution: the branch's last module, scaled)."""
    got = plain.capture(seqs)
    end = torch.tensor([len(s) - 1 for s in seqs])
    rows = torch.arange(len(seqs))
    scale = float(getattr(plain.model.config, "residual_multiplier", 1.0) or 1.0)
    mi = torch.stack([got["mlp_in"][j][rows, end] for j in range(plain.L)], 1).float()
    mo = torch.stack([got["mlp"][j][rows, end] for j in range(plain.L)], 1).float() * scale
    return mi, mo


@torch.no_grad()
def lens_logits(plain: Plain, seqs) -> list[torch.Tensor]:
    """The logit lens: per stream (the embedding, then every layer's output) the logits at END [n, vocab] that
    the model's own last steps give when the last layer's END output is replaced by that stream."""
    got = plain.capture(seqs)
    end = torch.tensor([len(s) - 1 for s in seqs])
    rows = torch.arange(len(seqs))
    streams = [got["resid_pre"][0]] + got["resid_post"]
    out = []
    for s in streams:
        def put(x, s=s):
            x = x.clone()
            x[rows, end] = s[rows, end].to(x.dtype)
            return x
        lg, _ = plain.run(seqs, post={plain.layers[plain.L - 1]: put})
        out.append(lg[rows, end])
    return out


@torch.no_grad()
def residual_at(plain: Plain, seqs, layer: int, positions: torch.Tensor) -> torch.Tensor:
    """x[layer] at ``positions`` [n, k]: layer -1 = the first layer's input, else layer ``layer``'s output."""
    got = plain.capture(seqs)
    x = got["resid_pre"][0] if layer < 0 else got["resid_post"][layer]
    return x[torch.arange(len(seqs))[:, None], positions].float()


@torch.no_grad()
def shifted_top(plain: Plain, seqs, layer: int, shift: torch.Tensor) -> torch.Tensor:
    """Top next token at END [n] with ``shift[i]`` added to layer ``layer``'s output at END."""
    end = torch.tensor([len(s) - 1 for s in seqs])
    return shifted_end_logits(plain, seqs, layer, end, shift).argmax(-1)


@torch.no_grad()
def shifted_end_logits(plain: Plain, seqs, layer: int, at: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Logits at END [n, vocab] with ``shift[i]`` added to x[layer] (-1: the first layer's input, else layer
    ``layer``'s output) at position ``at[i]`` only."""
    end = torch.tensor([len(s) - 1 for s in seqs])
    rows = torch.arange(len(seqs))

    def add(x):
        x = x.clone()
        x[rows, at] += shift.to(x.dtype)
        return x
    hooks = {"pre": {plain.layers[0]: add}} if layer < 0 else {"post": {plain.layers[layer]: add}}
    lg, _ = plain.run(seqs, **hooks)
    return lg[rows, end]


# ---------------------------------------------------------------------------------------------
# an MLP's hidden activations: the input of its down projection
# ---------------------------------------------------------------------------------------------

def down_proj(plain: Plain, layer: int, d_mlp: int) -> torch.nn.Module:
    """The layer's MLP down projection: its one linear map (``nn.Linear`` or GPT-2's ``Conv1D``) from ``d_mlp``
    features to the model's width, outside the attention; LookupError unless exactly one."""
    d = plain.model.config.get_text_config().hidden_size
    attn = set(plain.attn(layer).modules())

    def dims(m) -> tuple[int, int] | None:
        if isinstance(m, torch.nn.Linear):
            return m.in_features, m.out_features
        if type(m).__name__ == "Conv1D":
            return m.weight.shape[0], m.weight.shape[1]
        return None
    found = [m for m in plain.layers[layer].modules() if m not in attn and dims(m) == (d_mlp, d)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} linear maps from {d_mlp} to {d} features in layer {layer}")
    return found[0]


@torch.no_grad()
def mlp_hidden(plain: Plain, seqs, layer: int, d_mlp: int, new: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the MLP's hidden activation at END [n, d_mlp] -- its down projection's input --, the logits at END
    [n, vocab]) with that activation at END replaced by ``new`` [n, d_mlp] where it is not NaN (None: the model)."""
    end = torch.tensor([len(s) - 1 for s in seqs])
    rows = torch.arange(len(seqs))
    seen = {}

    def fn(x):
        if new is not None:
            x = x.clone()
            x[rows, end] = torch.where(torch.isnan(new), x[rows, end], new.to(x.dtype))
        seen["act"] = x[rows, end].float().clone()
        return x
    lg, _ = plain.run(seqs, pre={down_proj(plain, layer, d_mlp): fn})
    return seen["act"], lg[rows, end]


# ---------------------------------------------------------------------------------------------
# precise SFT: which weight entries belong to a head
# ---------------------------------------------------------------------------------------------

def head_slices(plain: Plain, heads: Sequence[tuple[int, int]], kv_rule: str = "any") -> dict[str, torch.Tensor]:
    """state_dict key -> bool mask of the entries precise SFT may change: the output features of q for the heads,
    of k / v for their KV groups (the rule), the input features of the output projection (an ``nn.Linear``
    stores features [out, in], a GPT-2 ``Conv1D`` [in, out])."""
    cfg = plain.model.config.get_text_config()
    H = plain.H
    kv = int(getattr(cfg, "num_key_value_heads", None) or H)
    names = {id(m): n for n, m in plain.model.named_modules()}
    sd = plain.model.state_dict()
    masks: dict[str, torch.Tensor] = {}
    by_layer: dict[int, set[int]] = {}
    for layer, h in heads:
        by_layer.setdefault(layer, set()).add(h)

    def out_dim(mod) -> int:  # the dimension of a weight that indexes output features
        return 0 if isinstance(mod, torch.nn.Linear) else 1

    def mark(mod, idx: torch.Tensor, weight_dim: int) -> None:
        for leaf in ("weight", "bias"):
            key = f"{names[id(mod)]}.{leaf}"
            if key in sd and len(idx):
                m = masks.get(key, torch.zeros_like(sd[key], dtype=torch.bool))
                m.index_fill_(weight_dim if leaf == "weight" else 0, idx, True)
                masks[key] = m
    for layer, hs in by_layer.items():
        proj, split = qkv_split(plain, layer)
        o = plain.o_proj(layer)
        in_dim = 1 - out_dim(o)
        dh = o.weight.shape[in_dim] // H
        g = H // kv
        groups = [k for k in range(kv) if any(q in hs for q in range(k * g, (k + 1) * g))]
        if kv_rule == "all":
            groups = [k for k in groups if all(q in hs for q in range(k * g, (k + 1) * g))]
        if kv_rule == "none":
            groups = []
        for i, (name, blocks) in enumerate((("q", sorted(hs)), ("k", groups), ("v", groups))):
            idx = torch.tensor([b * dh + j for b in blocks for j in range(dh)], dtype=torch.long)
            if split is None:
                mark(proj[name], idx, out_dim(proj[name]))
            else:
                fused = proj["qkv"]
                where = torch.arange(fused.weight.shape[out_dim(fused)])[split[i]]
                mark(fused, where[idx], out_dim(fused))
        cols = torch.tensor([b * dh + j for b in sorted(hs) for j in range(dh)], dtype=torch.long)
        key = f"{names[id(o)]}.weight"
        m = torch.zeros_like(sd[key], dtype=torch.bool)
        m.index_fill_(in_dim, cols, True)
        masks[key] = m
    return masks
