"""Where the key heads look: END-row attention (Zhang et al. 2024, §4.2, Figs. 4-5).

For a head (l, h) and a prompt, the END row of its attention pattern -- softmax(q_END . k_j) over
key positions j -- shows which tokens it reads when the answer is produced.  Over a prompt set the
row is summarized by **token role** (the five masses sum to 1; :data:`ROLE_DEFINITIONS`):

* ``first token (attention sink)`` -- position 0: the BOS token for models that add one (Llama,
  the bundled model), the prompt's first token for models that add none (Qwen2, SmolLM2, GPT-2).
  Heads park unused attention on the first position whatever it holds, so it is one role either way;
  when position 0 is itself an operand or the operator (``3 + 5 =`` without BOS), that role wins;
* ``operand A`` / ``operand B`` -- the digit tokens of each operand;
* ``operator`` -- the tokens the counterfactual replaces (none under an operand counterfactual, which replaces an
  operand: its tokens keep the operand's role);
* ``other`` -- every remaining token (template words, ``=``, whitespace before the answer).

Roles are found without parsing text: the operator's positions are exactly where X_r and X_c differ
(the operator kinds of counterfactual replace only the operator), outside the operands; operands are the runs of
digit tokens of the prompt, the first run being whichever of {A}, {B} comes first in the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import pad, pad_id
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.prompts.templates import TEMPLATES_BY_ID

FIRST_TOKEN = "first token (attention sink)"
ROLES: tuple[str, ...] = (FIRST_TOKEN, "operand A", "operand B", "operator", "other")
ROLE_DEFINITIONS: dict[str, str] = {
    FIRST_TOKEN: "position 0: the BOS token when the model adds one, else the prompt's first token "
                 "(unless that is an operand or the operator); heads park spare attention there",
    "operand A": "the digit tokens of the first operand of the operation (A in A op B; a decimal point in it too)",
    "operand B": "the digit tokens of the second operand (B)",
    "operator": "the tokens that differ between the prompt and its counterfactual, outside the operands (the "
                "operation's word or sign; none when the counterfactual changes an operand)",
    "other": "every other token: template words, '=', whitespace before the answer, and the answer's digits "
             "teacher-forced before the chosen one (a set read past its first digit)",
}
#: Bumped when the role labels or their rules change (part of the cache params).
ROLES_VERSION = 4  # 4: an operand counterfactual's changed digits stay the operand's (they were "operator")
METHOD = "attention_roles"


def token_roles(backend: ModelBackend, pair: PromptPair) -> list[str]:
    """The role of every position of ``pair.ref_ids``; the teacher-forced answer tokens at its end (``pair.forced``)
    are "other" (the same in X_r and X_c, and no operand)."""
    ids = pair.ref_ids[:len(pair.ref_ids) - pair.forced]
    toks = backend.tokenizer.convert_ids_to_tokens(ids)
    tpl = TEMPLATES_BY_ID.get(pair.template)
    a_first = tpl is None or tpl.text.index("{A}") < tpl.text.index("{B}")
    return roles_of(toks, [r != c for r, c in zip(ids, pair.cf_ids)], a_first=a_first) + ["other"] * pair.forced


#: The token roles a position-resolved circuit keeps a node or an edge at (:func:`circuit_roles`): the operands, the
#: operator, END (the position the answer is read at) and everything else (the first token among it)
CIRCUIT_ROLES: tuple[str, ...] = ("operand A", "operator", "operand B", "END", "other")


def circuit_roles(backend: ModelBackend, pairs: Sequence[PromptPair], width: int) -> torch.Tensor:
    """Each position's index in :data:`CIRCUIT_ROLES`, right-padded pairs ``width`` positions wide: END is the
    prompt's last position (whatever :func:`token_roles` calls it), the first token and the padding are "other".
    # [P, width] long"""
    at = {r: i for i, r in enumerate(CIRCUIT_ROLES)}
    out = torch.full((len(pairs), width), at["other"], dtype=torch.long)
    for i, p in enumerate(pairs):
        roles = token_roles(backend, p)
        out[i, :len(roles)] = torch.tensor([at.get(r, at["other"]) for r in roles])
        out[i, len(p.ref_ids) - 1] = at["END"]
    return out


def roles_of(toks: Sequence[str | None], operator: Sequence[bool], *, a_first: bool = True) -> list[str]:
    """The role of every token of a prompt: ``operator[i]`` marks the positions its counterfactual replaces (all
    False for a prompt with no counterfactual: no operator role); the two runs of digit tokens are the operands,
    the first one A when ``a_first``, and keep that role where the counterfactual replaces them (operand kinds)."""
    roles = ["other"] * len(toks)
    if toks:
        roles[0] = FIRST_TOKEN  # operand / operator roles below take precedence
    runs: list[list[int]] = []
    digit = [t is not None and any(c.isdigit() for c in t) for t in toks]
    for i, t in enumerate(toks):
        point = (t is not None and t.lstrip("▁Ġ#") == "." and 0 < i < len(toks) - 1 and digit[i - 1]
                 and digit[i + 1])  # the decimal point of 4.5 belongs to its number
        if digit[i] or point:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    if len(runs) == 2:
        first, second = ("operand A", "operand B") if a_first else ("operand B", "operand A")
        for i in runs[0]:
            roles[i] = first
        for i in runs[1]:
            roles[i] = second
    operands = {i for run in runs for i in run} if len(runs) == 2 else set()
    for i, differs in enumerate(operator):
        if differs and i not in operands:
            roles[i] = "operator"
    return roles


@torch.no_grad()
def end_row_patterns(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64,
                     progress: ProgressFn | None = None) -> list[torch.Tensor]:
    """END row of every head's attention, per pair: [L, H, len(ref_ids)] each."""
    L = backend.facts.n_layers
    names = [hooks.attn_pattern(layer) for layer in range(L)]
    pad_token = pad_id(backend)
    out: list[torch.Tensor] = []
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        ids, mask, end = pad([p.ref_ids for p in chunk], pad_token)
        c = backend.activations(ids, mask, names)
        pat = torch.stack([c[n] for n in names], 1).float().cpu()  # [b, L, H, q, k]
        for i in range(len(chunk)):
            e = int(end[i])
            out.append(pat[i, :, :, e, :e + 1])
        if progress is not None:
            progress(min(s + batch_size, len(pairs)), len(pairs))
    return out


@dataclass(frozen=True)
class RoleAttention:
    layer: int
    head: int
    role: str
    value: float  # mean attention mass of the END row on tokens of this role


def end_rows_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, batch_size: int = 64):
    """The forward work of :func:`end_row_patterns` (``engine.cost.Work``), which the attention by role runs: one
    pass per batch whose logits nobody reads (one position unembedded per row)."""
    from engine.cost import padded_passes
    return padded_passes([p.ref_ids for p in pairs], batch_size)


def role_attention(backend: ModelBackend, pairs: Sequence[PromptPair], *,
                   progress: ProgressFn | None = None) -> list[RoleAttention]:
    """Every head's END-row attention mass per token role, averaged over the pairs."""
    return roles_with_pairs(backend, pairs, progress=progress)[0]


PROBLEM_ROLES = ("operand A", "operand B", "operator")  # what Fig. 5 says the key heads read


def roles_with_pairs(backend: ModelBackend, pairs: Sequence[PromptPair], *,
                     progress: ProgressFn | None = None) -> tuple[list[RoleAttention], torch.Tensor]:
    """:func:`role_attention`'s rows and each pair's END-row mass on :data:`PROBLEM_ROLES`, [P, L, H]
    (the intervals' input)."""
    if not pairs:
        raise ValueError("no prompt pairs")
    L, H = backend.facts.n_layers, backend.facts.n_heads
    acc = torch.zeros(L, H, len(ROLES), dtype=torch.float64)
    problem = torch.zeros(len(pairs), L, H, dtype=torch.float64)
    for i, (p, row) in enumerate(zip(pairs, end_row_patterns(backend, pairs, progress=progress))):
        roles = token_roles(backend, p)
        for r_i, role in enumerate(ROLES):
            idx = [j for j, r in enumerate(roles) if r == role]
            if idx:
                mass = row[:, :, idx].sum(-1).double()  # [L, H]
                acc[:, :, r_i] += mass
                if role in PROBLEM_ROLES:
                    problem[i] += mass
    acc /= len(pairs)
    return [RoleAttention(layer, h, role, float(acc[layer, h, r]))
            for layer in range(L) for h in range(H) for r, role in enumerate(ROLES)], problem


@dataclass(frozen=True)
class TokenAttention:
    position: int
    token: str
    weight: float
    role: str = "other"  # the token's role (:data:`ROLES`), when the caller gave them


@torch.no_grad()
def prompt_attention(backend: ModelBackend, ids: Sequence[int], layer: int, head: int,
                     roles: Sequence[str] | None = None) -> list[TokenAttention]:
    """The END row of head (layer, head) on one prompt, token by token (``roles``: each token's role, e.g.
    :func:`token_roles`)."""
    hooks.validate_layer(layer, backend.facts.n_layers)
    if not 0 <= head < backend.facts.n_heads:
        raise ValueError(f"head {head} does not exist: heads 0..{backend.facts.n_heads - 1}")
    if not ids:
        raise ValueError("empty prompt")
    if roles is not None and len(roles) != len(ids):
        raise ValueError(f"{len(roles)} roles for {len(ids)} tokens")
    _, c = backend.run_with_cache(torch.tensor([list(ids)]), None, [hooks.attn_pattern(layer)])
    row = c[hooks.attn_pattern(layer)][0, head, -1].float().cpu()
    toks = backend.tokenizer.convert_ids_to_tokens(list(ids))
    roles = roles or ["other"] * len(ids)
    return [TokenAttention(i, str(t), float(w), r) for i, (t, w, r) in enumerate(zip(toks, row.tolist(), roles))]


def cached_role_attention(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                          progress: ProgressFn | None = None) -> tuple[list[RoleAttention], bool]:
    """:func:`role_attention` through the result cache: (values, computed)."""
    rows, _, computed = _cached(backend, pairs, cache, progress)
    return rows, computed


def cached_problem_share(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                         progress: ProgressFn | None = None):
    """Each pair's END-row attention on the operands and the operator, [P, L, H] (numpy), through the cache
    (the same cached result as :func:`cached_role_attention`)."""
    from engine.results import decode_array
    return decode_array(_cached(backend, pairs, cache, progress)[1]["problem_share"])


def _cached(backend: ModelBackend, pairs: Sequence[PromptPair], cache, progress: ProgressFn | None):
    from engine.results import encode_array, run_cached_rows

    def compute():
        rows, problem = roles_with_pairs(backend, pairs, progress=progress)
        return rows, {"problem_share": encode_array(problem)}

    params = {"roles": list(ROLES), "roles_version": ROLES_VERSION, "dtype": backend.facts.dtype,
              "per_pair": list(PROBLEM_ROLES)}
    return run_cached_rows(backend, pairs, METHOD, params, compute, RoleAttention, ("value",), cache)

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def finding(model, pairs, cache, table) -> str | None:
    """What the top head reads (§4.2): its last-token attention on the operands and the operator."""
    from engine.results import NotCached
    top = table.top_heads(1)
    if not top:
        return None
    try:
        roles, _ = cached_role_attention(model, pairs, cache=cache)
    except NotCached:
        return None
    layer, h, _ = top[0]
    mine = {r.role: r.value for r in roles if r.layer == layer and r.head == h}
    on_problem, best = role_shares(mine)
    return (f"The top head {layer}.{h} puts {on_problem:.0%} of its last-token attention on the operands and the "
            f"operator (most on {best}: {mine[best]:.0%}).")


def role_shares(mine: dict[str, float]) -> tuple[float, str]:
    """Of one head's END-row attention by role (``mine``: role -> mass): the mass on :data:`PROBLEM_ROLES` (the
    operands and the operator) and the role that holds the most."""
    return sum(v for role, v in mine.items() if role in PROBLEM_ROLES), max(mine, key=mine.get)

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine attention``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Every head's END row by token role -> CSV; or, with ``--text``, one head's END row token by token."""
    if args.text is not None:
        if args.layer is None or args.head is None:
            raise ValueError("--text needs --layer and --head")
        typed = ctx.typed(args.text)
        rows = [t.__dict__ for t in prompt_attention(ctx.model, typed.ids, args.layer, args.head)]
        ctx.write_csv(args.out, rows)
        return {"out": str(args.out), "layer": args.layer, "head": args.head, **ctx.typed_summary(typed),
                "tokens": rows}
    pairs = ctx.pairs
    with ctx.progress("attention") as bar:
        vals, computed = cached_role_attention(ctx.model, pairs, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [v.__dict__ for v in vals])
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "rows": len(vals),
            "answer_tokens": ctx.answer_tokens(pairs)}
