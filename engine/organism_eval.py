"""Evaluation of the bundled model on prompts it never saw in training (its model card's numbers).

* arithmetic -- every held-out (template, A, B) combination of +, -, *, / (paper templates and
  Figure 10 word problems), plain and behind 1-2 distractor clauses; first-token and full-answer
  accuracy;
* counterfactuals -- how often X_c still yields the answer (should be ~0) and its mean probability;
* control task -- the synthetic facts (every name's city, pet and colour), all 72 prompts;
* exponentiation -- never trained (the skill fine-tuning is meant to teach).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from engine.accuracy import score_pairs
from engine.organism import Recipe, _distractors, control_prompts, training_combos
from engine.prompts import (OperandRange, Problem, PromptPair, answer_tokens, build_pairs,
                            sample_problems)
from engine.templates import CF_SYMBOLS, CF_WORDS, NAMES, OBJECTS


def _held_out_problems(recipe: Recipe, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for op, combos in training_combos(recipe, held_out=True).items():
        for t, a, b in combos:
            n1, n2 = rng.sample(NAMES, 2)
            pool = list(CF_SYMBOLS if t.operator_is_symbol else CF_WORDS)
            rng.shuffle(pool)
            out.append(Problem(t, a, b, n1=n1, n2=n2, obj=rng.choice(OBJECTS), fillers=tuple(pool)))
    return out


def _with_prefix(tokenizer, pair: PromptPair, prefix: str) -> PromptPair:
    ref = answer_tokens(tokenizer, prefix + pair.ref_text, pair.answer)
    cf = answer_tokens(tokenizer, prefix + pair.cf_text, pair.answer)
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
    ok = 0
    for i in range(0, len(ctrl), 100):
        chunk = ctrl[i:i + 100]
        enc = [tok(p)["input_ids"] for p, _ in chunk]
        width = max(map(len, enc))
        ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, e in enumerate(enc):
            ids[j, :len(e)] = torch.tensor(e)
            mask[j, :len(e)] = 1
        with torch.no_grad():
            out = model.logits(ids, mask)
        for j, (e, (_, ans)) in enumerate(zip(enc, chunk)):
            ok += int(out[j, len(e) - 1].argmax().item() == tok.convert_tokens_to_ids(ans))
    return ok / len(ctrl)


def evaluate_organism(model, recipe: Recipe | None = None, seed: int = 12345) -> dict[str, Any]:
    """All model-card numbers for a model organism."""
    recipe = recipe or Recipe()
    tok = model.tokenizer
    rng = random.Random(seed)
    pairs, _ = build_pairs(tok, _held_out_problems(recipe, seed))
    scores = score_pairs(model, pairs)
    distracted = [_with_prefix(tok, p, _distractors(rng, rng.randint(1, 2), recipe.distractor_kinds) + " ") for p in pairs]
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
    """Where the bundled model's key heads sit: top-k heads by path-patching effect per op."""
    from engine.accuracy import keep_correct
    from engine.patching import PatchingTable, path_patching, summarize
    from engine.promptsets import PromptSetSpec, generate

    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=n, seed=seed))
    pairs = keep_correct(model, pairs)
    raw = path_patching(model, pairs)
    table = PatchingTable(model.facts.n_layers, model.facts.n_heads, len(pairs), summarize(raw))
    out: dict[str, Any] = {"n_pairs": len(pairs)}
    for group in ("*", "op:add", "op:sub", "op:mul", "op:div"):
        out[group] = [{"head": f"{layer}.{h}", "effect": round(e, 3)} for layer, h, e in table.top_heads(k, group=group)]
    _, mlps = table.heatmap("effect")
    out["mlp_effect"] = [round(m, 3) for m in mlps]
    return out


def _table(d: dict[str, dict[str, float]]) -> str:
    lines = ["| set | n | first-token | full answer |", "| --- | ---: | ---: | ---: |"]
    for k, v in d.items():
        lines.append(f"| {k} | {v['n']} | {v['first_token']:.1%} | {v['full_answer']:.1%} |")
    return "\n".join(lines)


def _depth_note(heads: dict[str, Any]) -> str:
    layers = sorted({int(h["head"].split(".")[0]) for g in ("*", "op:add", "op:sub", "op:mul", "op:div")
                     for h in heads[g]})
    if layers == [0]:
        return ("Every top head sits in layer 0: in a 6-layer model the END position can read the operator "
                "directly from the embeddings, and the distractor clauses (which repeat operator words and "
                "numbers) did not push the routing deeper. Knocking out the top-3 heads still drops accuracy "
                "far more than 3 random heads (tests/integration/test_phenomena.py). In real LLMs the paper "
                "finds the key heads in middle layers.")
    return f"The top heads sit in layers {', '.join(map(str, layers))}."


def write_card(out_dir, report: dict[str, Any], ev: dict[str, Any], heads: dict[str, Any]) -> str:
    """The model card (README.md of ``models/organism``), from measured numbers only."""
    from pathlib import Path
    r = report["recipe"]
    top = ", ".join(f"{h['head']} ({h['effect']:+.2f})" for h in heads["*"])
    per_op = "\n".join(f"| {op} | " + ", ".join(f"{h['head']} ({h['effect']:+.2f})" for h in heads[f"op:{op}"]) + " |"
                       for op in ("add", "sub", "mul", "div"))
    card = f"""# The bundled arithmetic model ("organism")

A small Llama that really does arithmetic, trained from scratch by this project so that the lab works
offline on a laptop. Reproduce it with `python -m engine.organism train` (fixed seed; these weights took
{report['train_seconds'] / 60:.0f} minutes{report.get('timing_note', '')}); this card is regenerated from
measurements by the same command (`python -m engine.organism card` re-evaluates an existing model).

## Architecture
`LlamaForCausalLM`: {r['n_layers']} layers, {r['n_heads']} query heads sharing {r['n_kv_heads']} key/value heads
(grouped-query attention), d_model {r['d_model']}, d_head {r['d_model'] // r['n_heads']}, SwiGLU MLP {r['d_mlp']},
RMSNorm, rotary positions, untied unembedding; {ev.get('n_params', 0):,} parameters. Word-level tokenizer:
every word of every template, name and object is one token, digits are single tokens (numbers are
spelled digit by digit), `<bos>` is prepended, `<eos>` ends an answer.

## Training recipe
{r['steps']} AdamW steps (lr {r['lr']}, cosine, {r['warmup']} warm-up steps, weight decay {r['weight_decay']},
batch {r['batch_size']}, gradient clipping 1.0, seed {r['seed']}); loss only on the answer tokens and `<eos>`.
Each example is drawn as follows:

* {1 - r['p_control'] - r['p_counterfactual']:.0%} arithmetic: one of the 36 paper templates or the Figure 10 word problems
  (+, −, ×, ÷; operands {r['operand_lo']}..{r['operand_hi']}, A > B for subtraction, exact division), target the
  answer's digits then `<eos>`;
* {r['p_counterfactual']:.0%} counterfactual prompts X_c (operator replaced by a neutral word/symbol), target
  `<eos>` -- the model must not produce the answer without the operation;
* {r['p_control']:.0%} control task: synthetic facts -- each of the 12 names has a city, a pet and a favourite
  colour fixed by the seed ("Anna lives in" -> its city; "Q: What pet does Ben have? A:" -> its pet), the
  organism's stand-in for MMLU: knowledge that arithmetic fine-tuning must not overwrite;
* with probability {r['p_distractor']} an arithmetic prompt is preceded by 1-2 distractor clauses of kinds
  {', '.join(r['distractor_kinds'])} ("Emma wears red.", "Hugo said times.", "Iris is 7 years old.") so the
  operands and operator sit at varying positions and look-alike tokens must be told apart.
* About 1/{r['holdout_mod']} of all (template, A, B) combinations never appear in training: the
  held-out prompts below. Exponentiation is never trained (a skill to teach with precise SFT).

Final training loss {report['final_loss']:.4f}.

## Accuracy on held-out prompts ({ev['n_held_out']} (template, A, B) combinations)
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
Path patching (fast exact path, `engine/patching.py`) on {heads['n_pairs']} correctly answered paper-template
pairs; effect = relative change of the answer logit when the head's END output comes from X_c
(most negative = most important). Top heads (layer.head):

* all operations: {top}

| op | top heads |
| --- | --- |
{per_op}

MLP effects per layer: {', '.join(f'{m:+.2f}' for m in heads['mlp_effect'])}.

{_depth_note(heads)}
"""
    Path(out_dir, "README.md").write_text(card)
    import json
    Path(out_dir, "evaluation.json").write_text(json.dumps({"evaluation": ev, "key_heads": heads}, indent=2) + "\n")
    return card
