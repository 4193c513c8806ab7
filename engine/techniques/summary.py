"""Circuit summary: the paper's argument on the current model, one sentence per finding, each with its number.

Built only from results already in the cache (:func:`engine.results.cache_only`): nothing is computed
here.  In the paper's order --

1. **Key heads** (path patching, §4.1): the top heads by effect, and how few heads matter;
2. **what they read** (attention, §4.2): the top head's last-token attention on the operands and
   the operator;
3. **the MLPs that write the answer** (path patching's MLP senders; MLP projections, Fig. 6; the
   logit lens): where the answer is lifted;
4. **knockout** (Fig. 3): accuracy after knocking out the top-3 heads vs 3 random heads (the curve the
   Knockout page computes with its default settings).

Each finding names the page that shows it.  A finding whose result is not cached yet says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.prompts.pairs import PromptPair
from engine.results import NotCached, cache_only

#: a head "matters" when patching it moves the answer logit by at least this relative effect
KEY_EFFECT = -0.05


@dataclass(frozen=True)
class Finding:
    step: str      # "key heads", "attention", "MLPs", "logit lens", "knockout"
    text: str      # the sentence, with its number; empty when not computed yet
    page: str      # the page that shows it (URL path)
    computed: bool


def circuit_summary(model, pairs: Sequence[PromptPair], cache) -> list[Finding]:
    """The findings available in ``cache`` for this model and prompt set (see module docstring)."""
    from engine.techniques.patching import cached_path_patching
    with cache_only():
        try:
            table, _ = cached_path_patching(model, pairs, cache=cache)
        except NotCached:
            return [Finding("key heads", "", "Patching_heatmap", False)]
        out = [_key_heads(table)]
        top = table.top_heads(1)
        out.append(_attention(model, pairs, cache, top[0][:2]) if top else
                   Finding("attention", "", "Patching_heatmap", False))
        out.append(_mlps(model, pairs, cache, table))
        out.append(_lens(model, pairs, cache))
        out.append(_knockout(model, pairs, cache, table))
    return out


def sparsity(table) -> tuple[int, int]:
    """(heads whose path-patching effect is KEY_EFFECT or stronger, all heads)."""
    heads = [v for v in table.values if v.component == "head" and v.metric == "effect" and v.group == "*"]
    return sum(1 for v in heads if v.value <= KEY_EFFECT), len(heads)


def _key_heads(table) -> Finding:
    n_key, n = sparsity(table)
    top = table.top_heads(3)
    names = ", ".join(f"{layer}.{h} ({e:+.2f})" for layer, h, e in top)
    share = 100 * n_key / max(1, n)
    return Finding("key heads", f"Path patching on {table.n_pairs} prompt pairs: the top heads are {names}; "
                   f"{n_key} of {n} heads ({share:.1f} %) change the answer logit by "
                   f"{abs(KEY_EFFECT):.0%} or more.", "Patching_heatmap", True)


def _attention(model, pairs, cache, head: tuple[int, int]) -> Finding:
    from engine.techniques.attention import cached_role_attention
    try:
        roles, _ = cached_role_attention(model, pairs, cache=cache)
    except NotCached:
        return Finding("attention", "", "Patching_heatmap", False)
    layer, h = head
    mine = {r.role: r.value for r in roles if r.layer == layer and r.head == h}
    on_problem = sum(v for role, v in mine.items() if role.startswith(("operand", "operator")))
    best = max(mine, key=mine.get)
    return Finding("attention", f"The top head {layer}.{h} puts {on_problem:.0%} of its last-token attention on the "
                   f"operands and the operator (most on {best}: {mine[best]:.0%}).", "Patching_heatmap", True)


def _mlps(model, pairs, cache, table) -> Finding:
    mlps = [v for v in table.values if v.component == "mlp" and v.metric == "effect" and v.group == "*"]
    strongest = min(mlps, key=lambda v: v.value)
    text = (f"MLP {strongest.layer}'s output at the last token matters most: patching it alone changes the "
            f"answer logit by {strongest.value:+.2f} (relative).")
    from engine.techniques.projections import cached_mlp_projections
    try:
        vals, _ = cached_mlp_projections(model, pairs, cache=cache)
        ans = {v.layer: v.value for v in vals if v.metric == "cos_out_C"}
        other = {v.layer: v.value for v in vals if v.metric == "cos_out_other"}
        best = max(ans, key=ans.get)
        text += (f" MLP {best}'s contribution points most towards the answer's unembedding "
                 f"(cos {ans[best]:.2f} vs {other.get(best, float('nan')):.2f} for other numbers).")
        page = "MLP_projections"
    except NotCached:
        page = "Patching_heatmap"
    return Finding("MLPs", text, page, True)


def _lens(model, pairs, cache) -> Finding:
    from engine.techniques.logit_lens import cached_logit_lens
    try:
        rows, _ = cached_logit_lens(model, pairs, cache=cache)
    except NotCached:
        return Finding("logit lens", "", "MLP_projections", False)
    overall = [r for r in rows if r.group == "*"]
    first = next((r for r in overall if r.top1 >= 0.5), None)
    last = overall[-1]
    if first is None:
        text = "Read through the logit lens, the answer never tops the last token's prediction for half of the prompts."
    else:
        text = (f"Read through the logit lens, the answer becomes the top token for half of the prompts after "
                f"{'the embedding' if first.layer < 0 else f'layer {first.layer}'} (P = {first.mean_prob:.2f}), "
                f"and reaches P = {last.mean_prob:.2f} after the last layer.")
    return Finding("logit lens", text, "MLP_projections", True)


#: the Knockout page's defaults: its curve is the one the summary can quote
KNOCKOUT_K, KNOCKOUT_DRAWS = 10, 10


def _knockout(model, pairs, cache, table) -> Finding:
    from engine.techniques.ablation import stored_knockout_curve
    f = model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(layer, h) for layer, h, _ in table.top_heads(k_max)]
    pts = stored_knockout_curve(model, pairs, ranked, k_max=k_max, draws=KNOCKOUT_DRAWS, cache=cache)
    if not pts:
        return Finding("knockout", "", "Knockout", False)
    at = next((p for p in pts if p.k == 3), pts[-1])
    base = pts[0].top_accuracy
    return Finding("knockout", f"Knocking out the top {at.k} heads leaves {at.top_accuracy:.0%} first-token accuracy "
                   f"(from {base:.0%}), {at.k} random heads {at.random_mean:.0%} "
                   f"(mean of {KNOCKOUT_DRAWS} draws): a gap "
                   f"of {100 * (at.random_mean - at.top_accuracy):.0f} points.", "Knockout", True)
