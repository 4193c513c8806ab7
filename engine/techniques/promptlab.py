"""One typed prompt, analysed: tokens, parsed operation and counterfactual, next-token predictions.

The prompt lab's engine call.  A typed prompt such as "What is 7 times 8?" is parsed into operands
and operator (:func:`engine.prompts.typed.parse_typed_prompt`); if that works, the answer-token rule gives
the ids the model should answer from (``ids``), the answer token and its probability, and the
counterfactual prompt (operator replaced) with the same measures.  If it does not parse, the prompt
is read at the position where a number would start (the same rule with a placeholder digit) and
``parse_error`` says why no counterfactual exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.backends.base import ModelBackend
from engine.prompts.pairs import FIRST_DIGIT, LENGTH_MISMATCH, PromptError, PromptPair, answer_tokens, at_digit
from engine.prompts.templates import CF_SYMBOLS, CF_WORDS
from engine.prompts.typed import MAX_TYPED_CHARS, TypedIds, TypedProblem, parse_typed_prompt, typed_prompt_ids
from engine.techniques.attention import TokenAttention, prompt_attention, roles_of, token_roles
from engine.techniques.knockout import Knockout, MeanActivations, TokenProb, next_token_probs, top_of


@dataclass
class PromptReport:
    text: str
    ids: list[int]                      # what the model reads (after the answer-token rule)
    tokens: list[str]
    top5: list[TokenProb]
    parsed: TypedProblem | None = None
    parse_error: str | None = None
    answer_id: int | None = None
    answer_token: str | None = None
    p_answer: float | None = None
    answer_rank: int | None = None      # 1 = the model's top prediction
    cf_ids: list[int] = field(default_factory=list)
    cf_top5: list[TokenProb] = field(default_factory=list)
    p_answer_cf: float | None = None
    notes: list[str] = field(default_factory=list)  # what the reader should know (unknown tokens, ...)


def _prob_and_rank(probs: torch.Tensor, token: int) -> tuple[float, int]:
    """P(token) and its rank (1 = the most likely) in a next-token distribution ``probs`` ([vocab])."""
    return float(probs[token]), int((probs > probs[token]).sum()) + 1


def _check_text(text: str | None) -> None:
    if text is None or not text.strip():
        raise PromptError("the prompt is empty: type an arithmetic question such as 'What is 7 times 8?'")
    if len(text) > MAX_TYPED_CHARS:
        raise PromptError(f"the prompt has {len(text)} characters; keep it under {MAX_TYPED_CHARS}")


def _check_known(tok, ids: list[int]) -> None:
    if not ids:
        raise PromptError("the prompt produced no tokens")
    unk = getattr(tok, "unk_token_id", None)
    if unk is not None and all(i == unk for i in ids if i != getattr(tok, "bos_token_id", None)):
        raise PromptError("none of the prompt's words is in this model's vocabulary: use words like "
                          "'plus', 'times', 'sum of' and digits")


def check_typed_text(tok, text: str | None) -> TypedIds:
    """A typed prompt after the answer-token rule (:func:`engine.prompts.typed.typed_prompt_ids`); PromptError
    when the text is empty, longer than MAX_TYPED_CHARS or holds no word the model knows -- the checks
    of :func:`analyse_prompt`, for callers (the CLI's ``--text``) that need only the ids."""
    _check_text(text)
    typed = typed_prompt_ids(tok, text)
    _check_known(tok, typed.ids)
    return typed


def typed_pair(tok, text: str | None, digit: str = FIRST_DIGIT) -> PromptPair:
    """The typed prompt as one (X_r, X_c) pair (template ``typed``), its counterfactual's filler the first that
    tokenizes to the same length, read at the answer's ``digit`` as a prompt set's pairs are
    (``engine.prompts.pairs.build_pair``: the answer's tokens before it appended to both prompts); PromptError saying
    why when the prompt has no such counterfactual or its answer no such digit."""
    typed = check_typed_text(tok, text)
    if typed.parsed is None or typed.answer is None:
        raise PromptError(f"it has no counterfactual: {typed.error}")
    p = typed.parsed
    ref, forced = at_digit(typed.answer, digit)
    tail = ref.prompt_ids[len(ref.prompt_ids) - forced:] if forced else []
    for seed in range(max(len(CF_WORDS), len(CF_SYMBOLS))):
        cf_text = parse_typed_prompt(p.text, filler_seed=seed).cf_text.rstrip()
        cf = answer_tokens(tok, cf_text, p.answer)
        if len(cf.prompt_ids) + forced == len(ref.prompt_ids):
            return PromptPair(op=p.op, template="typed", family="typed", a=p.a, b=p.b, answer=p.answer,
                              ref_text=p.text.rstrip(), cf_text=cf_text, ref_ids=ref.prompt_ids,
                              cf_ids=cf.prompt_ids + tail, answer_id=ref.answer_id, answer_ids=ref.answer_ids,
                              forced=forced)
    raise PromptError(LENGTH_MISMATCH)


def typed_attention(backend: ModelBackend, text: str | None, layer: int, head: int,
                    digit: str = FIRST_DIGIT) -> list[TokenAttention]:
    """Head (layer, head)'s END row on the typed prompt, token by token, each token with its role: the operands and
    the operator of the prompt and its counterfactual (:func:`typed_pair`, :func:`~engine.techniques.attention.
    token_roles`); a prompt with no counterfactual has operands (its two digit runs) but no operator.  ``digit``:
    END is the position that predicts that answer digit, the answer's tokens before it written after the prompt (the
    typed pair's X_r: what Path patching's typed heatmap reads at that digit)."""
    typed = check_typed_text(backend.tokenizer, text)
    try:
        pair = typed_pair(backend.tokenizer, text, digit)
    except PromptError:
        if digit != FIRST_DIGIT:
            raise
        pair = None
    ids = list(typed.ids) + (pair.forced_ids if pair is not None else [])
    if pair is not None and list(pair.ref_ids) == ids:
        roles = token_roles(backend, pair)
    else:
        roles = roles_of(backend.tokenizer.convert_ids_to_tokens(ids), [False] * len(ids))
    return prompt_attention(backend, ids, layer, head, roles)


def _notes(tok, ids: list[int], parsed: TypedProblem | None) -> list[str]:
    notes = []
    unk = getattr(tok, "unk_token_id", None)
    n_unk = sum(i == unk for i in ids) if unk is not None else 0
    if n_unk:
        notes.append(f"{n_unk} of the prompt's {len(ids)} tokens are not in this model's vocabulary "
                     f"(shown as {tok.unk_token}): the model reads each as the same placeholder")
    if parsed is not None:
        for x in dict.fromkeys((parsed.a, parsed.b)):
            pieces = tok.convert_ids_to_tokens(tok(str(abs(x)), add_special_tokens=False)["input_ids"])
            n = sum(any(c.isdigit() for c in str(p)) for p in pieces)
            if n > 1:
                notes.append(f"operand {x} is {n} tokens for this model; the prompt sets of the analysis "
                             f"pages use single-token operands (1-9 by default), this prompt is analysed "
                             f"as typed")
    return notes


def analyse_prompt(model: ModelBackend, text: str, *, ko: Knockout | None = None,
                   means: MeanActivations | None = None) -> PromptReport:
    """Analyse a typed prompt (optionally under a knockout); PromptError for unusable text."""
    tok = model.tokenizer
    typed = check_typed_text(tok, text)
    ids, parsed, at = typed.ids, typed.parsed, typed.answer
    probs = next_token_probs(model, ids, ko=ko, means=means)  # [vocab]: one pass serves top-5, P and rank
    rep = PromptReport(text=text, ids=ids, tokens=[str(t) for t in tok.convert_ids_to_tokens(ids)],
                       top5=top_of(model, probs), parsed=parsed, parse_error=typed.error,
                       notes=_notes(tok, ids, parsed))
    if parsed is not None and at is not None:
        rep.answer_id = at.answer_id
        rep.answer_token = str(tok.convert_ids_to_tokens([at.answer_id])[0])
        rep.p_answer, rep.answer_rank = _prob_and_rank(probs, at.answer_id)
        try:
            cf = answer_tokens(tok, parsed.cf_text.rstrip(), parsed.answer)
            rep.cf_ids = cf.prompt_ids
            cf_probs = next_token_probs(model, cf.prompt_ids)
            rep.cf_top5 = top_of(model, cf_probs)
            rep.p_answer_cf, _ = _prob_and_rank(cf_probs, at.answer_id)
        except PromptError:
            pass
    return rep
