"""Evaluation of the bundled model (its model card's numbers).

* the paper's templates -- first-token accuracy on every (template, A, B) of each Figure 8 and
  Figure 10 template (operands 1..9), the number the prompt filter sees;
* unseen phrasing -- every (A, B) of the held-out templates (whole templates never trained);
* arithmetic -- every held-out (template, A, B) combination of the trained templates, plain and
  behind 1-2 distractor clauses; first-token and full-answer accuracy;
* counterfactuals -- how often X_c still yields the answer (should be ~0) and its mean probability;
* control task -- the synthetic facts (every name's city, pet and colour), all 72 prompts;
* exponentiation -- never trained (the skill fine-tuning is meant to teach).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from engine.machinery.batching import pad_batch
from engine.organism.recipe import Recipe, control_prompts, distractors, held_out_template_combos, training_combos
from engine.prompts.pairs import (
    OperandRange,
    Problem,
    PromptPair,
    answer_tokens,
    build_pairs,
    make_problem,
    sample_problems,
)
from engine.prompts.templates import PAPER_FAMILIES, PAPER_OPS, TEMPLATES_BY_ID, WORD_PROBLEM_FAMILIES
from engine.techniques.accuracy import score_pairs


def _held_out_problems(recipe: Recipe, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    return [make_problem(t, a, b, rng) for combos in training_combos(recipe, held_out=True).values()
            for t, a, b in combos]


def _with_prefix(tokenizer, pair: PromptPair, prefix: str) -> PromptPair:
    sep = TEMPLATES_BY_ID[pair.template].answer_sep
    ref = answer_tokens(tokenizer, prefix + pair.ref_text, pair.answer, sep)
    cf = answer_tokens(tokenizer, prefix + pair.cf_text, pair.answer, sep)
    return PromptPair(pair.op, pair.template, pair.family, pair.a, pair.b, pair.answer,
                      prefix + pair.ref_text, prefix + pair.cf_text, ref.prompt_ids, cf.prompt_ids,
                      ref.answer_id, ref.answer_ids)


def _acc(pairs, scores, key) -> dict[str, dict[str, float]]:
    g: dict[str, list] = defaultdict(list)
    for p, s in zip(pairs, scores):
        g[key(p)].append(s)
    return {k: {"n": len(v), "first_token": sum(s.first_ok for s in v) / len(v),
                "full_answer": sum(s.full_ok for s in v) / len(v)} for k, v in sorted(g.items())}


def control_accuracy(model, seed: int = 0) -> float:
    """First-token accuracy on the synthetic-facts control task (72 prompts) of a backend."""
    import torch

    tok = model.tokenizer
    ctrl = control_prompts(seed)
    ok = 0  # the answer word's first token (its only one on the organism's tokenizers)
    for i in range(0, len(ctrl), 100):
        chunk = ctrl[i:i + 100]
        enc = [tok(p)["input_ids"] for p, _ in chunk]
        ids, mask, _ = pad_batch(enc, tok.pad_token_id)
        with torch.no_grad():
            out = model.logits(ids, mask)
        for j, (e, (_, ans)) in enumerate(zip(enc, chunk)):
            ok += int(out[j, len(e) - 1].argmax().item() == tok(ans, add_special_tokens=False)["input_ids"][0])
    return ok / len(ctrl)


def template_accuracy(model, recipe: Recipe | None = None, seed: int = 12345) -> dict[str, dict[str, Any]]:
    """First-token accuracy on every (A, B) of each paper (Figure 8), Figure 10 and held-out template."""
    recipe = recipe or Recipe()
    r = OperandRange(recipe.operand_lo, recipe.operand_hi)
    problems = sample_problems(PAPER_OPS, 100_000, seed, operands=r, families=PAPER_FAMILIES + WORD_PROBLEM_FAMILIES)
    rng = random.Random(seed)
    unseen = [make_problem(t, a, b, rng) for t, a, b in held_out_template_combos(recipe)]
    out: dict[str, dict[str, Any]] = {}
    for key, probs in (("paper_by_template", problems), ("held_out_templates", unseen)):
        pairs, _ = build_pairs(model.tokenizer, probs)
        acc = _acc(pairs, score_pairs(model, pairs), lambda p: p.template)
        out[key] = {k: {**v, "text": TEMPLATES_BY_ID[k].text} for k, v in acc.items()}
    return out


def evaluate_organism(model, recipe: Recipe | None = None, seed: int = 12345) -> dict[str, Any]:
    """All model-card numbers for a model organism."""
    recipe = recipe or Recipe()
    tok = model.tokenizer
    rng = random.Random(seed)
    by_template = template_accuracy(model, recipe, seed)
    pairs, _ = build_pairs(tok, _held_out_problems(recipe, seed))
    scores = score_pairs(model, pairs)
    distracted = [_with_prefix(tok, p, distractors(rng, rng.randint(1, 2), recipe.distractor_kinds) + " ")
                  for p in pairs]
    d_scores = score_pairs(model, distracted)

    # counterfactuals: does X_c still produce the answer?
    cf_pairs = [PromptPair(p.op, p.template, p.family, p.a, p.b, p.answer, p.cf_text, p.cf_text,
                           p.cf_ids, p.cf_ids, p.answer_id, p.answer_ids) for p in pairs]
    cf_scores = score_pairs(model, cf_pairs)

    ctrl = control_prompts(recipe.seed)
    ok = round(control_accuracy(model, recipe.seed) * len(ctrl))

    pow_pairs, _ = build_pairs(tok, sample_problems(["pow"], 200, seed, operands=OperandRange(1, 9)))
    pow_scores = score_pairs(model, pow_pairs)
    return {
        **by_template,
        "held_out_by_op": _acc(pairs, scores, lambda p: p.op),
        "held_out_by_family": _acc(pairs, scores, lambda p: f"{p.op}/{p.family}"),
        "held_out_with_distractors_by_op": _acc(distracted, d_scores, lambda p: p.op),
        "counterfactual_predicts_answer": sum(s.first_ok for s in cf_scores) / len(cf_scores),
        "counterfactual_mean_p_answer": sum(s.p_answer for s in cf_scores) / len(cf_scores),
        "reference_mean_p_answer": sum(s.p_answer for s in scores) / len(scores),
        "control_accuracy": ok / len(ctrl),
        "n_control": len(ctrl),
        "pow_first_token": sum(s.first_ok for s in pow_scores) / len(pow_scores),
        "n_held_out": len(pairs),
    }


def key_heads(model, n: int = 50, seed: int = 0, k: int = 5) -> dict[str, Any]:
    """Where the bundled model's key heads sit: top-k heads by path-patching effect per op, and the
    knockout of the top-3 heads vs 3 random heads (10 draws) on the same pairs."""
    from engine.prompts.promptsets import PromptSetSpec, generate
    from engine.techniques.accuracy import keep_correct
    from engine.techniques.knockout import mean_activations
    from engine.techniques.knockout_curve import knockout_curve
    from engine.techniques.path_patching import PatchingTable, path_patching, summarize

    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=PAPER_OPS, n=n, seed=seed))
    pairs = keep_correct(model, pairs)
    raw = path_patching(model, pairs)
    table = PatchingTable(model.facts.n_layers, model.facts.n_heads, len(pairs), summarize(raw))
    out: dict[str, Any] = {"n_pairs": len(pairs)}
    for group in ("*", "op:add", "op:sub", "op:mul", "op:div"):
        out[group] = [{"head": f"{layer}.{h}", "effect": round(e, 3)}
                      for layer, h, e in table.top_heads(k, group=group)]
    _, mlps = table.heatmap("effect")
    out["mlp_effect"] = [round(m, 3) for m in mlps]
    ranked = [(layer, h) for layer, h, _ in table.top_heads(3)]
    k3 = knockout_curve(model, pairs, ranked, mean_activations(model, pairs), k_max=3, draws=10, seed=0)[3]
    out["knockout_top3"] = round(k3.top_accuracy, 3)
    out["knockout_random3"] = round(k3.random_mean, 3)
    return out


def _table(d: dict[str, dict[str, float]]) -> str:
    lines = ["| set | n | first-token | full answer |", "| --- | ---: | ---: | ---: |"]
    for k, v in d.items():
        lines.append(f"| {k} | {v['n']} | {v['first_token']:.1%} | {v['full_answer']:.1%} |")
    return "\n".join(lines)


def _template_table(d: dict[str, dict[str, Any]]) -> str:
    lines = ["| template | text | n | first-token | full answer |", "| --- | --- | ---: | ---: | ---: |"]
    for k, v in d.items():
        text = v["text"].replace("[", "").replace("]", "").replace("|", "\\|")
        lines.append(f"| {k} | `{text}` | {v['n']} | {v['first_token']:.1%} | {v['full_answer']:.1%} |")
    return "\n".join(lines)


def deep_heads(heads: dict[str, Any]) -> int:
    """How many of the top heads (all operations) sit outside layer 0."""
    return sum(int(h["head"].split(".")[0]) >= 1 for h in heads["*"])


def _depth_note(heads: dict[str, Any]) -> str:
    layers = sorted({int(h["head"].split(".")[0]) for g in ("*", "op:add", "op:sub", "op:mul", "op:div")
                     for h in heads[g]})
    n_top = len(heads["*"])
    return (f"{deep_heads(heads)} of the {n_top} top heads (all operations) sit outside layer 0; the top heads "
            f"of all groups sit in layer(s) {', '.join(map(str, layers))}. Knocking out the top-3 heads leaves "
            f"{heads['knockout_top3']:.1%} first-token accuracy, 3 random heads {heads['knockout_random3']:.1%} "
            f"(mean of 10 draws): a gap of {100 * (heads['knockout_random3'] - heads['knockout_top3']):.0f} points. "
            "In real LLMs the paper finds the key heads in middle layers.")


def _tokenizer_text(r: dict[str, Any]) -> str:
    if r.get("tokenizer", "word") == "wordpiece":
        return ("WordPiece tokenizer (`tokenizers`): every operator word (and the word problems' verbs), "
                "every name and the counterfactual fillers but `void` are split into two sub-word pieces "
                "(`pl ##us`, `An ##na`) whose first pieces a WordPiece model trained on those words chose; "
                "the other words are whole tokens; punctuation is split off and every digit is a single token "
                "(numbers are spelled digit by digit, no whitespace token exists)")
    return ("Word-level tokenizer: every word of every template, name and object is one token, digits are "
            "single tokens (numbers are spelled digit by digit)")


def _sampling_text(r: dict[str, Any]) -> str:
    word = (f"; a share {r['p_word']} of the additions from the Figure 10 word problems only"
            if r.get("p_word") else "")
    if r.get("sampling", "combo") == "template":
        return (f"{word}; the rest picks a template uniformly, then its operands, so the word problems "
                f"(few operand pairs) are drawn as often as any other template")
    return f"{word}; the rest picks a (template, A, B) uniformly"


def _layer_drop_text(r: dict[str, Any]) -> str:
    p = r.get("p_drop_attn0", 0)
    if not p:
        return ""
    return (f"* LayerDrop of layer 0's attention: on {p:.0%} of the examples the output of every layer-0 head is\n"
            f"  zeroed (training only; the saved model is a plain Llama), so the model cannot rely on one\n"
            f"  layer-0 look-up of the operator and must route the operation through later layers.\n")


def write_card(out_dir, report: dict[str, Any], ev: dict[str, Any], heads: dict[str, Any]) -> str:
    """The model card (README.md of ``models/organism``), from measured numbers only."""
    from pathlib import Path
    r = report["recipe"]
    top = ", ".join(f"{h['head']} ({h['effect']:+.2f})" for h in heads["*"])
    per_op = "\n".join(f"| {op} | " + ", ".join(f"{h['head']} ({h['effect']:+.2f})" for h in heads[f"op:{op}"]) + " |"
                       for op in ("add", "sub", "mul", "div"))
    paper = ev["paper_by_template"]
    worst = min(paper.values(), key=lambda v: v["first_token"])["first_token"]
    held = ", ".join(f"`{i}`" for i in r["held_out_templates"])
    levers = "\n".join(f"* {line}" for line in report.get("levers", []))
    card = f"""# The bundled arithmetic model ("organism")

A small Llama that really does arithmetic, trained from scratch by this project so that the lab works
offline on a laptop. Reproduce it with `python -m engine.organism train` (fixed seed; these weights took
{report['train_seconds'] / 60:.0f} minutes{report.get('timing_note', '')}); this card is regenerated from
measurements by the same command (`python -m engine.organism card` re-evaluates an existing model).

## Architecture
`LlamaForCausalLM`: {r['n_layers']} layers, {r['n_heads']} query heads sharing {r['n_kv_heads']} key/value heads
(grouped-query attention), d_model {r['d_model']}, d_head {r['d_model'] // r['n_heads']}, SwiGLU MLP {r['d_mlp']},
RMSNorm, rotary positions, untied unembedding; {ev.get('n_params', 0):,} parameters. {_tokenizer_text(r)};
`<bos>` is prepended, `<eos>` ends an answer.

## Training recipe
{r['steps']} AdamW steps (lr {r['lr']}, cosine, {r['warmup']} warm-up steps, weight decay {r['weight_decay']},
batch {r['batch_size']}, gradient clipping 1.0, seed {r['seed']}); loss only on the answer tokens and `<eos>`.
Each example is drawn as follows:

* {1 - r['p_control'] - r['p_counterfactual']:.0%} arithmetic (+, −, ×, ÷; operands {r['operand_lo']}..{r['operand_hi']},
  A > B for subtraction, exact division), target the answer's digits then `<eos>`. The templates: the
  paper's Figure 8 (`paper`, 32), Figure 10's twelve word problems (`time_span`, 8, and
  `object_accumulation`, 4, slots from the paper's pools) and the project's own phrasings (`extended`), all but the held-out templates
  {held}; a share {r.get('p_paper', 0)} of the arithmetic examples is drawn from the Figure 8 templates only{_sampling_text(r)};
* {r['p_counterfactual']:.0%} counterfactual prompts X_c (operator replaced by a neutral word/symbol; in the object
  accumulation problems other objects and another person, as in the paper's Figure 9), target
  `<eos>` -- the model must not produce the answer without the operation;
* {r['p_control']:.0%} control task: synthetic facts -- each of the 12 names has a city, a pet and a favourite
  colour fixed by the seed ("Anna lives in" -> its city; "Q: What pet does Ben have? A:" -> its pet), the
  organism's stand-in for MMLU: knowledge that arithmetic fine-tuning must not overwrite;
* with probability {r['p_distractor']} an arithmetic prompt is preceded by 1-2 distractor clauses of kinds
  {', '.join(r['distractor_kinds'])} ("Emma wears red.", "Hugo said times.", "Iris is 7 years old.") so the
  operands and operator sit at varying positions and look-alike tokens must be told apart.
{_layer_drop_text(r)}* About 1/{r['holdout_mod']} of the (template, A, B) combinations of the trained templates never appear in
  training either. Exponentiation and the typeset notations are never trained (skills to teach with
  precise SFT).

Final training loss {report['final_loss']:.4f}.

## The paper's templates (every operand pair)
First-token accuracy on every (A, B) of each Figure 8 and Figure 10 template (lowest:
{worst:.1%}); this includes the combinations trained on.

{_template_table(paper)}

## Unseen phrasing: held-out templates (never trained)

{_template_table(ev['held_out_templates'])}

## Held-out operand pairs of the trained templates ({ev['n_held_out']} (template, A, B) combinations)
{_table(ev['held_out_by_op'])}

With 1-2 distractor clauses in front:

{_table(ev['held_out_with_distractors_by_op'])}

Per template family:

{_table(ev['held_out_by_family'])}

* Counterfactual prompts X_c: the answer is the top token in {ev['counterfactual_predicts_answer']:.1%} of cases
  (mean answer probability {ev['counterfactual_mean_p_answer']:.2e}, vs {ev['reference_mean_p_answer']:.3f} on X_r).
* Control task (synthetic facts, all {ev.get('n_control', 72)} prompts): {ev['control_accuracy']:.1%}.
* Exponentiation (never trained): {ev['pow_first_token']:.1%} first-token accuracy.

## Where the key heads sit
Path patching (fast exact path, `engine/techniques/path_patching.py`) on {heads['n_pairs']} correctly answered paper-template
pairs; effect = relative change of the answer logit when the head's END output comes from X_c
(most negative = most important). Top heads (layer.head):

* all operations: {top}

| op | top heads |
| --- | --- |
{per_op}

MLP effects per layer: {', '.join(f'{m:+.2f}' for m in heads['mlp_effect'])}.

{_depth_note(heads)}
{"" if not levers else chr(10) + "### Levers tried" + chr(10) + chr(10) + levers + chr(10)}"""
    Path(out_dir, "README.md").write_text(card)
    import json
    Path(out_dir, "evaluation.json").write_text(json.dumps({"evaluation": ev, "key_heads": heads}, indent=2) + "\n")
    return card
