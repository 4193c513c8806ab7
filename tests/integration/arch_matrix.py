"""The architecture matrix: every technique of the lab on every decoder architecture it opens, against plain
transformers.

For each ``model_type`` of :data:`MATRIX` -- the causal-LM architectures TransformerBridge supports that
transformers builds from a config (:mod:`tests.integration.tiny_models`: 3 layers, 4 heads / 2 KV heads,
random init, the organism's word-level tokenizer) -- the lab opens the model on the bridge backend (and on
the nnsight backend where its table maps it) and runs every technique on four prompt pairs of two lengths;
each result is compared with its plain-transformers reference (:mod:`tests.helpers.plain`: torch hooks on
the model's own modules, one forward pass per variant).  An architecture ends

* **exact** -- every technique equal to its reference (1e-4 relative), a fast path that gave way to its
  textbook loop saying so (``fallback``), a technique that does not apply refusing with one line; or
* **refused** up front -- ``open_model`` says in one line why the lab cannot study it exactly;

never a traceback, never a wrong number (``test_architectures.py`` asserts it).  docs/scaling.md's coverage
table is :func:`table` of these results: ``python -m tests.integration.arch_matrix --write`` rewrites it, and
the test fails when the file differs.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from engine.paths import REPO_ROOT

#: every model_type of the matrix, in the order of the table
MATRIX: tuple[str, ...] = (
    # dense decoders, pre-norm
    "llama", "mistral", "ministral3", "qwen2", "qwen3", "gemma", "granite", "olmo", "phi3", "stablelm",
    "starcoder2", "nemotron", "ernie4_5", "apertus", "arcee", "seed_oss", "glm", "smollm3", "jais2",
    "hunyuan_v1_dense", "nanochat", "bitnet", "gpt2", "gpt_bigcode", "opt", "xglm", "bloom", "mpt",
    "modernbert-decoder",
    # post-norms on the branches
    "gemma2", "gemma3_text", "vaultgemma", "olmo2", "olmo3", "exaone4", "glm4",
    # parallel attention + MLP
    "gpt_neox", "gptj", "codegen", "cohere", "cohere2", "phi", "falcon",
    # mixture of experts
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "ernie4_5_moe", "glm4_moe", "minimax_m2",
    "laguna", "flex_olmo", "afmoe", "gpt_oss",
    # what the lab refuses
    "lfm2", "openai-gpt", "jetmoe", "hrm_text", "deepseek_v2", "deepseek_v3", "youtu", "glm4_moe_lite",
    "mamba", "falcon_mamba", "rwkv", "jamba", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h",
    "olmo_hybrid", "qwen3_next", "recurrent_gemma", "bert",
)

TOL = 1e-4
TECHNIQUES = ("path patching", "path AtP", "activation patching", "AtP (total)", "head -> head", "layer x position",
              "knockout", "circuits (X_c)", "attention", "MLP projections", "logit lens", "numbers",
              "operand grid", "helix patching", "heuristic neurons", "edge patching", "EAP", "edge circuits",
              "intervene", "precise SFT slices")
HELIX = ("C", "END")  # helix patching's target and position (at the second-to-last layer's output)


@dataclass
class Cell:
    status: str        # "exact" | "refused" | "WRONG" | "TRACEBACK"
    err: float = 0.0   # largest difference from the reference, relative (1 + |reference|)
    note: str = ""     # a fallback's or a refusal's one line


@dataclass
class ArchResult:
    model_type: str
    architecture: str = ""
    refused: str | None = None              # open_model's one line, when the lab refuses the architecture
    cells: dict[str, Cell] = field(default_factory=dict)     # bridge backend
    nnsight: dict[str, Cell] | None = None  # None: the nnsight backend has no module map for it
    seconds: float = 0.0

    @property
    def exact(self) -> bool:
        cells = list(self.cells.values()) + list((self.nnsight or {}).values())
        return self.refused is None and all(c.status in ("exact", "refused") for c in cells)

    @property
    def failures(self) -> list[str]:
        out = [f"bridge {t}: {c.status} {c.err:.2g} {c.note}" for t, c in self.cells.items()
               if c.status not in ("exact", "refused")]
        out += [f"nnsight {t}: {c.status} {c.err:.2g} {c.note}" for t, c in (self.nnsight or {}).items()
                if c.status not in ("exact", "refused")]
        return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape:
        return float("inf")
    ok = ~torch.isnan(want)
    if not bool(torch.equal(ok, ~torch.isnan(got))):
        return float("inf")
    if not bool(ok.any()):
        return 0.0
    return float(((got - want).abs() / (1 + want.abs()))[ok].max())


# ---------------------------------------------------------------------------------------------
# the references of one model (computed once, shared by both backends)
# ---------------------------------------------------------------------------------------------

class References:
    """Every technique's plain-transformers reference on one tiny model, computed on first use."""

    def __init__(self, model_dir: Path, pairs, tokenizer_pad: int) -> None:
        from transformers import AutoModelForCausalLM

        from tests.helpers.plain import Plain
        hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
        self.plain = Plain(hf, pad_id=tokenizer_pad)
        self.pairs = pairs
        self._memo: dict[str, object] = {}

    def get(self, name: str, fn: Callable[[], object]) -> object:
        if name not in self._memo:
            self._memo[name] = fn()
        return self._memo[name]


def receiver(L: int) -> tuple[int, int, str]:
    return (L - 1, 0, "q")


KNOCKOUT_HEADS = ((0, 0), (2, 1))
KNOCKOUT_MLPS = (1,)
SFT_HEADS = ((0, 1), (2, 0), (2, 3))
INTERVENE_HEADS = ((0, 2), (2, 1))


def checks(backend, refs: References) -> dict[str, Callable[[], tuple[float, str]]]:
    """Technique -> a function returning (relative error against the reference, fallback note)."""
    from tests.helpers import plain as P
    pairs, pl = refs.pairs, refs.plain

    def path_patching():
        from engine.techniques.path_patching import path_patching
        raw = path_patching(backend, pairs)
        lo, head, mlp = refs.get("pp", lambda: P.path_patching(pl, pairs))
        return max(rel_err(raw.logit_o, lo), rel_err(raw.head_logit, head), rel_err(raw.mlp_logit, mlp)), \
            raw.fallback or ""

    def path_atp():
        from engine.techniques.attribution import path_atp
        raw = path_atp(backend, pairs)
        lo, head, mlp = refs.get("atp", lambda: P.atp(pl, pairs, frozen=True))
        return max(rel_err(raw.logit_o, lo), rel_err(raw.head_logit, head), rel_err(raw.mlp_logit, mlp)), \
            raw.fallback or ""

    def activation():
        from engine.techniques.attribution import activation_patching
        raw = activation_patching(backend, pairs)
        head, mlp = refs.get("act", lambda: P.activation_patching(pl, pairs))
        return max(rel_err(raw.head_logit, head), rel_err(raw.mlp_logit, mlp)), ""

    def atp_total():
        from engine.techniques.attribution import total_atp
        raw = total_atp(backend, pairs)
        lo, head, mlp = refs.get("atp_total", lambda: P.atp(pl, pairs, frozen=False))
        return max(rel_err(raw.head_logit, head), rel_err(raw.mlp_logit, mlp)), ""

    def head_to_head():
        from engine.techniques.head_patching import Receiver, head_path_patching
        lr, hr, inp = receiver(backend.facts.n_layers)
        raw = head_path_patching(backend, pairs, Receiver(lr, hr, inp))
        lo, head, mlp = refs.get("h2h", lambda: P.head_to_head(pl, pairs, (lr, hr, inp)))
        return max(rel_err(raw.head_logit[:, :lr], head[:, :lr]), rel_err(raw.mlp_logit[:, :lr], mlp[:, :lr])), \
            raw.fallback or ""

    def position():
        from engine.techniques.position_patching import layer_position_patching
        raw = layer_position_patching(backend, pairs)
        lo, patched = refs.get("pos", lambda: P.layer_position(pl, pairs))
        return max(rel_err(raw.logit_o, lo), rel_err(raw.patched, patched)), raw.fallback or ""

    def knockout():
        from engine.machinery.batching import pad, pad_id
        from engine.techniques.knockout import Knockout, knocked_out, mean_activations
        means = mean_activations(backend, pairs)
        ids, mask, end = pad([p.ref_ids for p in pairs], pad_id(backend))
        with torch.no_grad(), knocked_out(backend, Knockout(KNOCKOUT_HEADS, KNOCKOUT_MLPS), means,
                                          [p.template for p in pairs], end.tolist()):
            lg = backend.logits(ids, mask)
        got = lg[torch.arange(len(pairs)), end, torch.tensor([p.answer_id for p in pairs])]
        want = refs.get("ko", lambda: P.mean_ablation_logits(pl, pairs, KNOCKOUT_HEADS, KNOCKOUT_MLPS))
        return rel_err(got, want), ""

    def circuits():  # faithfulness circuits: everything outside each set takes its X_c value (a continued prefix)
        from engine.techniques.knockout import Knockout, knockout_end
        L, H = backend.facts.n_layers, backend.facts.n_heads
        kos = [Knockout(((layer, h),), (layer,)) for layer in range(L) for h in range(H)]
        kos.append(Knockout(KNOCKOUT_HEADS, KNOCKOUT_MLPS))
        got = knockout_end(backend, pairs, kos, None, sets_per_pass=4).margin  # [K, P]
        want = refs.get("circuits", lambda: torch.stack([P.interchange_margins(pl, pairs, ko.heads, ko.mlps)
                                                         for ko in kos]))
        return rel_err(got, want), ""

    def attention():
        from engine.techniques.attention import end_row_patterns, role_attention
        rows = end_row_patterns(backend, pairs)
        role_attention(backend, pairs)  # the technique itself runs on these rows
        want = refs.get("att", lambda: P.end_rows(pl, [p.ref_ids for p in pairs]))
        return max(rel_err(g, w) for g, w in zip(rows, want)), ""

    def projections():
        from engine.techniques.mlp_projections import mlp_projections, number_token, number_tokens
        rows = {(r.layer, r.metric): r.value for r in mlp_projections(backend, pairs)}

        def plain_rows():
            mi, mo = P.mlp_vectors(pl, [p.ref_ids for p in pairs])  # [P, L, d]
            W = P.unembedding(pl)
            cos = lambda x, w: (x * w).sum(-1) / (x.norm(dim=-1) * w.norm(dim=-1)).clamp_min(1e-12)  # noqa: E731
            a = torch.tensor([number_token(backend, p.ref_text, p.a) for p in pairs])
            b = torch.tensor([number_token(backend, p.ref_text, p.b) for p in pairs])
            c = torch.tensor([p.answer_id for p in pairs])
            nums = torch.tensor(sorted(number_tokens(backend, pairs[0].ref_text)))
            wn = W[:, nums].T
            cos_all = (mo @ wn.T) / (mo.norm(dim=-1, keepdim=True) * wn.norm(dim=-1)).clamp_min(1e-12)
            other = nums[None, :] != c[:, None]
            vals = {"cos_in_A": cos(mi, W[:, a].T[:, None]), "cos_in_B": cos(mi, W[:, b].T[:, None]),
                    "cos_out_C": cos(mo, W[:, c].T[:, None]),
                    "cos_out_other": (cos_all * other[:, None]).sum(-1) / other.sum(-1)[:, None]}
            return {(layer, m): float(v[:, layer].mean()) for m, v in vals.items() for layer in range(pl.L)}
        want = refs.get("proj", plain_rows)
        keys = sorted(want)
        return rel_err(torch.tensor([rows[k] for k in keys]), torch.tensor([want[k] for k in keys])), ""

    def lens():
        from engine.techniques.logit_lens import logit_lens
        raw = logit_lens(backend, pairs)
        streams = refs.get("lens", lambda: P.lens_logits(pl, [p.ref_ids for p in pairs]))
        answer = torch.tensor([p.answer_id for p in pairs])
        want = torch.stack([torch.softmax(s, -1)[torch.arange(len(pairs)), answer] for s in streams], 1)
        return rel_err(raw.prob, want), raw.fallback or ""

    def numbers():
        from engine.techniques.numbers import (
            POSITIONS,
            positions,
            residuals,
            residuals_and_end_logits,
            residuals_and_prefixes,
            shifted_top_tokens,
        )
        L = backend.facts.n_layers
        layers = [-1, 0, L - 1]
        got = torch.tensor(residuals(backend, pairs, layers))  # [layers, 3, P, d]
        at = torch.tensor([[positions(backend, p)[n] for n in POSITIONS] for p in pairs])  # [P, 3]

        def plain_x():
            return torch.stack([P.residual_at(pl, [p.ref_ids for p in pairs], layer, at).transpose(0, 1)
                                for layer in layers])
        err = rel_err(got, refs.get("num_x", plain_x))
        if backend.continues:  # the pass that keeps the prefixes: the same residuals and END logits, its check holds
            (fx, flg), kept = residuals_and_prefixes(backend, pairs, layers)
            _, plg = residuals_and_end_logits(backend, pairs, layers)
            err = max(err, rel_err(torch.tensor(fx), got), rel_err(flg, plg),
                      max(rel_err(k.clean, plg[k.idx]) for k in kept))
        shift = torch.randn(len(pairs), backend.facts.d_model, generator=torch.Generator().manual_seed(0)) * 3
        top = torch.tensor(shifted_top_tokens(backend, pairs, 1, shift.double().numpy()))
        want = refs.get("num_top", lambda: P.shifted_top(pl, [p.ref_ids for p in pairs], 1, shift))
        return max(err, 0.0 if torch.equal(top, want) else float("inf")), ""

    def grid():  # the Atlas's operand grid on the matrix's pairs: direct effects, END-row attention on A and B
        from engine.techniques.attention import token_roles
        from engine.techniques.operand_grid import direct_effects, operand_attention
        got = direct_effects(backend, pairs)
        head, mlp = refs.get("direct", lambda: P.direct_effects(pl, pairs))
        att = operand_attention(backend, pairs)
        rows = refs.get("att", lambda: P.end_rows(pl, [p.ref_ids for p in pairs]))  # the "attention" column's
        want = [torch.stack([r[:, :, [j for j, x in enumerate(token_roles(backend, p)) if x == role]].sum(-1)
                             for r, p in zip(rows, pairs)]) for role in ("operand A", "operand B")]
        return max(rel_err(got.head, head), rel_err(got.mlp, mlp), rel_err(att[0], want[0]),
                   rel_err(att[1], want[1])), got.fallback or ""

    def helix():  # success, stays and the logit difference of every patch, the shifts applied by plain hooks
        from engine.techniques import helix_patch as Hx
        from engine.techniques.numbers import positions, target_values
        layer, (target, position) = backend.facts.n_layers - 2, HELIX
        rows = {r.method: r for r in Hx.helix_patch(backend, pairs, layer, position, target)}

        def plain_rows():
            d = Hx.donors(backend, pairs, target)
            at = torch.tensor([[positions(backend, p)[position]] for p in pairs])
            X = P.residual_at(pl, [p.ref_ids for p in pairs], layer, at)[:, 0].double().numpy()
            _, delta = Hx.shifts(X, target_values(pairs)[target], d)
            tokens = torch.tensor([[t, pairs[i].answer_id] for t, i in zip(d.new_token, d.idx)])
            out = []
            for name in Hx.PATCHES:
                lg = P.shifted_end_logits(pl, [pairs[i].ref_ids for i in d.idx], layer, at[d.idx, 0],
                                          torch.from_numpy(delta[name]).float())
                top, picked = lg.argmax(-1), lg.gather(1, tokens)
                out.append([float((top == tokens[:, 0]).float().mean()), float((top == tokens[:, 1]).float().mean()),
                            float((picked[:, 0] - picked[:, 1]).mean())])
            return torch.tensor(out)
        got = torch.tensor([[rows[m].success, rows[m].stays, rows[m].logit_diff] for m in Hx.PATCHES])
        return rel_err(got, refs.get("helix", plain_rows)), ""

    def neurons():  # the last MLP's hidden activations at END on X_r and X_c, the reaction, the margins with half
        from engine.techniques.heuristic_neurons import end_activations, end_margins  # its neurons at the X_c mean
        layer, d_mlp = backend.facts.n_layers - 1, backend.facts.d_mlp
        ref, cf = [p.ref_ids for p in pairs], [p.cf_ids for p in pairs]

        def half_at_mean(act_c):
            new = act_c.mean(0).expand(len(pairs), -1).clone()
            new[:, ::2] = float("nan")
            return new
        act_r, act_c = end_activations(backend, ref, layer), end_activations(backend, cf, layer)
        margins, _ = end_margins(backend, pairs, layer, half_at_mean(act_c))

        def plain_side():
            (pr, _), (pc, _) = P.mlp_hidden(pl, ref, layer, d_mlp), P.mlp_hidden(pl, cf, layer, d_mlp)
            _, lg = P.mlp_hidden(pl, ref, layer, d_mlp, half_at_mean(pc))
            return pr, pc, lg[torch.arange(len(pairs)), [p.answer_id for p in pairs]] - lg.mean(-1)
        pr, pc, m = refs.get("neurons", plain_side)
        reaction = rel_err((act_r - act_c).abs().mean(0), (pr - pc).abs().mean(0))
        return max(rel_err(act_r, pr), rel_err(act_c, pc), reaction, rel_err(torch.from_numpy(margins).float(), m)), ""

    def edges():  # a sample of MIB's edges of every kind (into q/k/v, MLPs, the logits; from the input), each patched
        from engine.techniques.edges import edge_graph, edge_patching
        from tests.helpers.plain_edges import PlainEdges
        sample = edge_sample(edge_graph(backend))
        raw = edge_patching(backend, pairs, sample)
        ref = refs.get("edges", lambda: PlainEdges(pl, pairs))
        return max([rel_err(raw.logit_o, ref.logit_o)]
                   + [rel_err(raw.patched[i], ref.patched(e.name)) for i, e in enumerate(sample)]), ""

    def eap():  # EAP's scores of the same sample against autograd through the hand-patched plain runs
        from engine.techniques.eap import eap as eap_scores
        from engine.techniques.edges import edge_graph
        from tests.helpers.plain_edges import PlainEdges
        sample = edge_sample(edge_graph(backend))
        raw = eap_scores(backend, pairs, sample)
        ref = refs.get("edges", lambda: PlainEdges(pl, pairs))
        return max(rel_err(raw.scores[i], ref.derivative(e.name)) for i, e in enumerate(sample)), ""

    def edge_circuits():  # MIB's edge ablation of a random half of every edge, against the hand-made layer loop
        import numpy as np

        from engine.techniques.edge_faithfulness import edge_circuits as run_circuits
        from engine.techniques.edges import edge_graph
        from tests.helpers.plain_edges import edge_circuit
        names = [e.name for e in edge_graph(backend)]
        kept = np.random.default_rng(0).random(len(names)) < 0.5
        out = run_circuits(backend, pairs, kept[None])
        logit, margin = refs.get("edge_circuit", lambda: edge_circuit(pl, pairs, names,
                                                                      {n for n, k in zip(names, kept) if k}))
        return max(rel_err(out.logit[0], logit), rel_err(out.margin[0], margin)), ""

    def intervene():  # patch a head at END from X_c with every other head frozen: path patching's answer logit
        from engine.techniques.intervene import Intervention, intervened_logits, parse_targets
        lo, head, _ = refs.get("pp", lambda: P.path_patching(pl, pairs))
        f = backend.facts
        got, want = [], []
        for layer, h in INTERVENE_HEADS:
            t = parse_targets(f"{layer}.{h}", f.n_layers, f.n_heads)
            for i, p in enumerate(pairs):
                before, after = intervened_logits(backend, p.ref_ids, Intervention("patch", t, source=tuple(p.cf_ids),
                                                                                   freeze=True))
                got += [before[p.answer_id], after[p.answer_id]]
                want += [lo[i], head[i, layer, h]]
        return rel_err(torch.stack(got), torch.stack(want)), ""

    return {"path patching": path_patching, "path AtP": path_atp, "activation patching": activation,
            "AtP (total)": atp_total, "head -> head": head_to_head, "layer x position": position,
            "knockout": knockout, "circuits (X_c)": circuits, "attention": attention,
            "MLP projections": projections, "logit lens": lens,
            "numbers": numbers, "operand grid": grid, "helix patching": helix, "heuristic neurons": neurons,
            "edge patching": edges, "EAP": eap, "edge circuits": edge_circuits, "intervene": intervene}


def edge_sample(edges: list) -> list:
    from tests.helpers.plain_edges import cover
    return cover(edges)


def sft_cell(model_dir: Path, refs: References) -> Cell:
    """Precise SFT's slices: one training step on a plain copy changes exactly the key heads' entries."""
    from engine.finetune.data import load_sft_data
    from engine.finetune.errors import FinetuneError
    from engine.finetune.train import TrainConfig, train
    from engine.models.load import load_plain
    from tests.helpers import plain as P
    pm = load_plain(str(model_dir), device="cpu")
    before = {k: v.detach().clone() for k, v in pm.hf_model.state_dict().items()}
    cfg = TrainConfig(method="precise", heads=SFT_HEADS, lr=1e-2, batch_size=8, micro_batch=8, max_steps=1,
                      warmup=0.0, weight_decay=0.0)
    try:
        train(pm.hf_model, pm.tokenizer, load_sft_data("notation")[:8], cfg)
    except FinetuneError as e:
        return Cell("refused", note=one_line(e))
    try:
        masks = P.head_slices(P.Plain(pm.hf_model), SFT_HEADS)
    except LookupError as e:
        return Cell("WRONG", float("inf"), f"the lab trained slices the reference cannot name ({e})")
    after = pm.hf_model.state_dict()
    outside = [k for k, old in before.items()
               if not torch.equal(after[k][~masks[k]] if k in masks else after[k],
                                  old[~masks[k]] if k in masks else old)]
    # a key bias shifts every score of a query alike (no gradient): biases holding keys are not asked to move
    moved = [k for k, m in masks.items() if not k.endswith(("k_proj.bias", "attn.bias", "query_key_value.bias"))
             and bool((after[k][m] == before[k][m]).any())]
    if outside or moved:
        return Cell("WRONG", float("inf"), f"changed outside the slices: {outside[:3]}; slice entries that did "
                                          f"not move: {moved[:3]}")
    return Cell("exact")


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def run_checks(backend, refs: References) -> dict[str, Cell]:
    from engine.backends.base import MissingActivation
    from engine.finetune.errors import FinetuneError
    from engine.models.spec import ModelLoadError
    out = {}
    for name, fn in checks(backend, refs).items():
        try:
            err, why = fn()
        except (ModelLoadError, FinetuneError, MissingActivation) as e:
            out[name] = Cell("refused", note=one_line(e))
            continue
        except Exception:  # noqa: BLE001 - the matrix records it; the test fails on it
            out[name] = Cell("TRACEBACK", float("inf"), traceback.format_exc(limit=-3).strip()[-600:])
            continue
        out[name] = Cell("exact" if err <= TOL else "WRONG", err, why)
    return out


def stored_result(model_type: str, folder: Path) -> ArchResult:
    """:func:`run_arch`'s result for ``model_type``, computed once per ``folder``: the first process that asks runs
    it under a file lock and leaves it there for the others (the xdist workers share the matrix's cases, and the
    table's tests read what either worker computed)."""
    import fcntl
    import pickle
    folder.mkdir(parents=True, exist_ok=True)
    name = model_type.replace("-", "_")
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / f"{name}.pickle"
        if done.exists():
            return pickle.loads(done.read_bytes())
        r = run_arch(model_type, folder)
        done.write_bytes(pickle.dumps(r))
        return r


def run_arch(model_type: str, root: Path) -> ArchResult:
    """Build ``model_type`` tiny, open it on both backends, run every technique against the references."""
    from engine.backends import open_model
    from engine.backends.layouts import LAYOUTS
    from engine.machinery.batching import pad_id
    from engine.models.spec import ModelLoadError
    from engine.prompts.promptsets import PromptSetSpec, generate
    from tests.integration.tiny_models import build_tiny
    t0 = time.perf_counter()
    res = ArchResult(model_type)
    model_dir = build_tiny(model_type, root / model_type.replace("-", "_"))
    try:
        backend = open_model(str(model_dir), device="cpu")
    except ModelLoadError as e:
        res.refused = one_line(e)
        res.seconds = time.perf_counter() - t0
        return res
    except Exception:  # noqa: BLE001 - a traceback where a one-line refusal belongs: the test fails on it
        res.cells["open"] = Cell("TRACEBACK", float("inf"), traceback.format_exc(limit=-3).strip()[-600:])
        return res
    res.architecture = backend.facts.architecture
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=1))
    refs = References(model_dir, pairs, pad_id(backend))
    res.cells = run_checks(backend, refs)
    try:
        res.cells["precise SFT slices"] = sft_cell(model_dir, refs)
    except Exception:  # noqa: BLE001
        res.cells["precise SFT slices"] = Cell("TRACEBACK", float("inf"), traceback.format_exc(limit=-3)[-600:])
    if model_type in LAYOUTS:
        res.nnsight = run_checks(open_model(str(model_dir), device="cpu", backend="nnsight"), refs)
    res.seconds = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------------------------
# the coverage table of docs/scaling.md
# ---------------------------------------------------------------------------------------------

BEGIN, END = "<!-- coverage table: generated by tests/integration/arch_matrix.py -->", "<!-- end of coverage table -->"


def _fallbacks(cells: dict[str, Cell]) -> list[str]:
    return [t for t, c in cells.items() if c.status == "exact" and c.note]


def table(results: list[ArchResult]) -> str:
    """The Markdown coverage table (one row per architecture) and its summary line."""
    exact = [r for r in results if r.exact]
    refused = [r for r in results if r.refused is not None]
    lines = [BEGIN, "",
             f"{len(exact)} of {len(results)} architectures exact on every technique, {len(refused)} refused up front, "
             f"{len(results) - len(exact) - len(refused)} failing.", "",
             "| model_type | architecture | bridge | nnsight | textbook loop instead of a fast path | not offered |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r.refused is not None:
            lines.append(f"| `{r.model_type}` | {_arch_name(r)} | refused: {_why(r.refused)} | – | – | – |")
            continue
        bridge = "exact" if r.exact else "FAILING: " + "; ".join(r.failures)[:200]
        nns = "–" if r.nnsight is None else ("exact" if all(c.status in ("exact", "refused")
                                                            for c in r.nnsight.values()) else "FAILING")
        loops = ", ".join(_fallbacks(r.cells)) or "–"
        refusals = ", ".join(t for t, c in r.cells.items() if c.status == "refused") or "–"
        lines.append(f"| `{r.model_type}` | {r.architecture} | {bridge} | {nns} | {loops} | {refusals} |")
    return "\n".join(lines + ["", END])


def _arch_name(r: ArchResult) -> str:
    m = re.match(r"^(\w+(ForCausalLM|Model))\b", r.refused or "")
    return m.group(1) if m else (r.architecture or "–")


def _why(refusal: str) -> str:
    """The reason of a one-line refusal, without the architecture's name and the lab's general rule."""
    why = refusal.split(" -- ")[0]
    why = re.sub(r"^\w+ cannot be studied (exactly )?here: ", "", why)
    return why.replace("|", "/")


def replace_table(text: str, new: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"docs/scaling.md has no {BEGIN} ... {END} block")
    return text[:text.index(BEGIN)] + new + text[text.index(END) + len(END):]


SCALING = REPO_ROOT / "docs" / "scaling.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite docs/scaling.md's coverage table")
    ap.add_argument("model_types", nargs="*", help="only these (default: the whole matrix)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mt in args.model_types or MATRIX:
            r = run_arch(mt, Path(tmp))
            results.append(r)
            print(f"{mt:20s} {r.seconds:5.1f}s {'refused' if r.refused else 'exact' if r.exact else 'FAILING'} "
                  f"{(r.refused or '; '.join(r.failures))[:300]}", flush=True)
    if args.write:
        SCALING.write_text(replace_table(SCALING.read_text(), table(results)))


if __name__ == "__main__":
    main()
