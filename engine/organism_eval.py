"""Evaluation of the bundled model on prompts it never saw in training (its model card's numbers).

* arithmetic -- every held-out (template, A, B) combination of +, -, *, / (paper templates and
  Figure 10 word problems), plain and behind 1-2 distractor clauses; first-token and full-answer
  accuracy;
* counterfactuals -- how often X_c still yields the answer (should be ~0) and its mean probability;
* control task -- in-context retrieval on fresh random prompts;
* exponentiation -- never trained (the skill fine-tuning is meant to teach).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from engine.accuracy import score_pairs
from engine.organism import Recipe, _distractors, control_example, training_combos
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


def evaluate_organism(loaded, recipe: Recipe | None = None, seed: int = 12345) -> dict[str, Any]:
    """All model-card numbers for a loaded organism."""
    import torch

    from engine.models import logits as model_logits

    recipe = recipe or Recipe()
    tok = loaded.tokenizer
    rng = random.Random(seed)
    pairs, _ = build_pairs(tok, _held_out_problems(recipe, seed))
    scores = score_pairs(loaded, pairs)
    distracted = [_with_prefix(tok, p, _distractors(rng, rng.randint(1, 2)) + " ") for p in pairs]
    d_scores = score_pairs(loaded, distracted)

    # counterfactuals: does X_c still produce the answer?
    cf_pairs = [PromptPair(p.op, p.template, p.family, p.a, p.b, p.answer, p.cf_text, p.cf_text,
                           p.cf_ids, p.cf_ids, p.answer_id, p.answer_ids) for p in pairs]
    cf_scores = score_pairs(loaded, cf_pairs)

    # control task
    ctrl = [control_example(rng) for _ in range(1000)]
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
            out = model_logits(loaded, ids, mask)
        for j, (e, (_, ans)) in enumerate(zip(enc, chunk)):
            ok += int(out[j, len(e) - 1].argmax().item() == tok.convert_tokens_to_ids(ans))

    pow_pairs, _ = build_pairs(tok, sample_problems(["pow"], 200, seed, operands=OperandRange(1, 9)))
    pow_scores = score_pairs(loaded, pow_pairs)
    return {
        "held_out_by_op": _acc(pairs, scores, lambda p: p.op),
        "held_out_by_family": _acc(pairs, scores, lambda p: f"{p.op}/{p.family}"),
        "held_out_with_distractors_by_op": _acc(distracted, d_scores, lambda p: p.op),
        "counterfactual_predicts_answer": sum(s.first_ok for s in cf_scores) / len(cf_scores),
        "counterfactual_mean_p_answer": sum(s.p_answer for s in cf_scores) / len(cf_scores),
        "reference_mean_p_answer": sum(s.p_answer for s in scores) / len(scores),
        "control_accuracy": ok / len(ctrl),
        "pow_first_token": sum(s.first_ok for s in pow_scores) / len(pow_scores),
        "n_held_out": len(pairs),
    }
