"""Accuracy of a model on prompt pairs, and the filter that keeps only correctly answered prompts.

Zhang et al. keep only the reference prompts the model answers right before any analysis.  Two
measures are reported:

* **first-token accuracy** -- argmax of the next-token logits at END (the last prompt position,
  after the answer-token rule of :mod:`engine.prompts.pairs`) equals the first answer token;
* **full-answer accuracy** -- greedy decoding reproduces every token of the number and then stops
  the number (the next greedy token holds no digit).  Computed exactly with one teacher-forced
  forward pass over ``ref_ids + answer_ids``: greedy decoding emits the gold tokens if and only if
  the argmax at each of those positions is the gold token.  This is cheaper than greedy decoding
  even with a KV cache (one pass for every answer token at once, no decoding loop), and only the
  ``len(answer) + 1`` positions from END on go through the final norm and the unembedding
  (``ModelBackend.logits_at``), never the full ``[batch, pos, vocab]`` tensor.

**A set read past its first digit** (``PromptPair.forced`` > 0: the earlier answer tokens are teacher-forced at the end
of the prompt, :mod:`engine.prompts.pairs`): a pair is answered right when the argmax at every forced token's position
and at END is that token -- every answer token up to the chosen one right; the full answer adds the tokens after it.
The same pass reads the ``forced`` positions before END as well (a first-digit pair: END alone, as before).

The scores of a prompt set are memoized per (model fingerprint, prompt-set hash).  The prompt filter
(:func:`kept_pairs`) needs only the first-token measure: it reads the memo when the accuracy table
(:func:`accuracy_report`) has scored the set, else it runs the prompts alone (END is their last position,
no answer token after it: 15 to 20 % fewer positions on the paper's sets).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair


@dataclass(frozen=True)
class PairScore:
    first_ok: bool
    full_ok: bool
    p_answer: float  # softmax probability of the first answer token at END


_PIECES: dict[str, "set[int]"] = {}


def _number_piece_ids(model) -> "set[int]":
    """The token ids with a digit in them (the vocabulary read once per model fingerprint)."""
    key = model.facts.fingerprint
    if key not in _PIECES:
        tokenizer = model.tokenizer
        toks = tokenizer.convert_ids_to_tokens(list(range(min(model.facts.vocab_size, len(tokenizer)))))
        _PIECES[key] = {i for i, t in enumerate(toks) if t is not None and any(c.isdigit() for c in t)}
    return _PIECES[key]


_SCORES: dict[tuple[str, str, int], list[PairScore]] = {}


def forget_scores() -> None:
    """Empty the memo of :func:`score_pairs` (the next filter of a set runs its own pass)."""
    _SCORES.clear()


def _memo_key(model, pairs: Sequence[PromptPair]) -> tuple[str, str, int]:
    from engine.prompts.pairs import prompt_set_hash
    return model.facts.fingerprint, prompt_set_hash(pairs), hash(tuple((tuple(p.answer_ids), p.forced) for p in pairs))


def score_pairs(model, pairs: Sequence[PromptPair], *, batch_size: int = 64,
                progress: ProgressFn | None = None) -> list[PairScore]:
    """First-token / full-answer correctness of each pair (see module docstring).

    ``model`` is an :class:`engine.backends.base.ModelBackend`.  Memoized per (model fingerprint,
    prompt-set hash): the filter and the accuracy table of one set run the forward pass once.
    """
    if not pairs:
        return []
    key = _memo_key(model, pairs)
    if key not in _SCORES:
        scores = _score(model, pairs, batch_size=batch_size, progress=progress)
        if len(_SCORES) > 32:
            _SCORES.clear()
        _SCORES[key] = scores
    return list(_SCORES[key])


def first_token_right(model, pairs: Sequence[PromptPair], *, batch_size: int = 64,
                      progress: ProgressFn | None = None) -> list[bool]:
    """Whether each pair's first answer token is the argmax at END: read from :func:`score_pairs`'s memo when it
    holds the set, else one pass of the prompts alone (no answer tokens after END: the filter that needs only the
    first token does not pay for the teacher-forced answer)."""
    if not pairs:
        return []
    key = _memo_key(model, pairs)
    scores = _SCORES[key] if key in _SCORES else _score(model, pairs, batch_size=batch_size, progress=progress,
                                                        full=False)
    return [s.first_ok for s in scores]


def _score(model, pairs: Sequence[PromptPair], *, batch_size: int, progress: ProgressFn | None,
           full: bool = True) -> list[PairScore]:
    """Scores of ``pairs``; ``full`` False: END only (``full_ok`` False, not computed)."""
    import torch

    from engine.machinery.batching import call_tokens, length_batches, pad_id
    from engine.machinery.batching import pad as pad_batch

    digit_ids = _number_piece_ids(model)
    pad = pad_id(model)
    scores: list[PairScore | None] = [None] * len(pairs)
    done = 0
    # batches of similar length (least padding for the calls they take), the scores back in the pairs' order
    def answer(p: PromptPair) -> list[int]:  # the teacher-forced answer after END (none: END only)
        return p.answer_ids if full else []

    for idx in length_batches([len(p.ref_ids) + len(answer(p)) for p in pairs], batch_size,
                              call_tokens(model.facts)):
        chunk = [pairs[i] for i in idx]
        seqs = [p.ref_ids + answer(p) for p in chunk]
        ids, mask, _ = pad_batch(seqs, pad)
        # positions END - forced .. END + len(answer) of each row (the last one repeated as padding)
        m = max(p.forced + len(answer(p)) for p in chunk) + 1
        pos = torch.tensor([[min(len(p.ref_ids) - 1 - p.forced + j, len(s) - 1) for j in range(m)]
                            for p, s in zip(chunk, seqs)])  # [batch, m]
        with torch.no_grad():
            out = model.logits_at(ids, mask, pos).float()  # [batch, m, vocab]
        for i, p in enumerate(chunk):
            f, gold = p.forced, p.forced_ids + p.answer_ids
            pred = out[i, :f + len(p.answer_ids) + 1].argmax(-1).tolist()
            first_ok = pred[:f + 1] == gold[:f + 1]  # every answer token up to the chosen one (END's)
            full_ok = full and pred[:len(gold)] == gold and pred[len(gold)] not in digit_ids
            prob = torch.softmax(out[i, f], -1)[p.answer_id].item()
            scores[idx[i]] = PairScore(first_ok, full_ok, prob)
        done += len(idx)
        if progress is not None:
            progress(done, len(pairs))
    return scores


def scoring_work(model, pairs: Sequence[PromptPair], *, full: bool = True, batch_size: int = 64):
    """The forward work of :func:`score_pairs` (``full``) or of the filter's END-only pass (not ``full``): the same
    batches as :func:`_score`, counted without running them (``engine.cost.Work``)."""
    from engine.cost import NO_WORK, one_pass
    from engine.machinery.batching import call_tokens, length_batches

    def answer(p: PromptPair) -> list[int]:
        return p.answer_ids if full else []

    w = NO_WORK
    for idx in length_batches([len(p.ref_ids) + len(answer(p)) for p in pairs], batch_size,
                              call_tokens(model.facts)):
        chunk = [pairs[i] for i in idx]
        width = max(len(p.ref_ids) + len(answer(p)) for p in chunk)
        w += one_pass(len(chunk), width, len(chunk) * (max(p.forced + len(answer(p)) for p in chunk) + 1))
    return w


def kept_pairs_cost(model, spec):
    """The ``engine.cost.Cost`` of :func:`kept_pairs` on a cold cache: one END-only pass of the set's generated
    prompts (the unit)."""
    from engine.cost import estimate
    from engine.prompts.promptsets import generate
    pairs, _ = generate(model.tokenizer, spec)
    return estimate(model, pairs, scoring_work(model, pairs, full=False))


def accuracy_cost(model, spec):
    """The ``engine.cost.Cost`` of :func:`accuracy_report` on a cold cache: one pass of the set's prompts with their
    answers teacher-forced."""
    from engine.cost import estimate
    from engine.prompts.promptsets import generate
    pairs, _ = generate(model.tokenizer, spec)
    return estimate(model, pairs, scoring_work(model, pairs, full=True))


def keep_correct(model, pairs: Sequence[PromptPair], *, require_full: bool = False,
                 progress: ProgressFn | None = None) -> list[PromptPair]:
    """Only the pairs the model answers right (first token; also the full number if asked)."""
    return [pairs[i] for i in right_indices(model, pairs, require_full=require_full, progress=progress)]


def right_indices(model, pairs: Sequence[PromptPair], *, require_full: bool = False,
                  progress: ProgressFn | None = None) -> list[int]:
    """The indices of the pairs the model answers right (first token; also the full number if asked)."""
    if require_full:
        return [i for i, s in enumerate(score_pairs(model, pairs, progress=progress)) if s.full_ok]
    return [i for i, ok in enumerate(first_token_right(model, pairs, progress=progress)) if ok]


@dataclass(frozen=True)
class AccuracyRow:
    op: str
    template: str  # template id, or "*" for the op's total
    n: int
    first_token: float
    full_answer: float
    mean_p_answer: float


def summarize(pairs: Sequence[PromptPair], scores: Sequence[PairScore]) -> list[AccuracyRow]:
    """Accuracy per op and template, plus one ``template="*"`` row per op."""
    groups: dict[tuple[str, str], list[PairScore]] = defaultdict(list)
    for p, s in zip(pairs, scores):
        groups[(p.op, p.template)].append(s)
        groups[(p.op, "*")].append(s)
    rows = []
    for (op, tpl), ss in sorted(groups.items()):
        n = len(ss)
        rows.append(AccuracyRow(op, tpl, n, sum(s.first_ok for s in ss) / n,
                                sum(s.full_ok for s in ss) / n, sum(s.p_answer for s in ss) / n))
    return rows


METHOD = "accuracy"
_METRICS = ("n", "first_token", "full_answer", "mean_p_answer")


def accuracy_report(model, spec, *, cache=None, progress: ProgressFn | None = None
                    ) -> tuple[list[AccuracyRow], bool]:
    """Accuracy table of a prompt set (``engine.prompts.promptsets.PromptSetSpec``), via the result cache.

    Returns (rows, computed) -- ``computed`` is False when the table came from the cache.
    """
    from engine.prompts.promptsets import generate
    from engine.results import run_cached_rows

    pairs, _ = generate(model.tokenizer, spec)
    params = {"spec": spec.to_params(), "dtype": model.facts.dtype}

    def compute():
        return summarize(pairs, score_pairs(model, pairs, progress=progress)), None

    rows, _, computed = run_cached_rows(model, pairs, METHOD, params, compute, AccuracyRow, _METRICS, cache)
    return sorted(rows, key=lambda r: (r.op, r.template)), computed


def kept_pairs(model, spec, *, cache=None, require_full: bool = False,
               progress: ProgressFn | None = None) -> tuple[list[PromptPair], int]:
    """The spec's pairs that the model answers right, and how many were generated.

    The filter's outcome is cached (method ``kept_prompts``), so a cached analysis of the same
    set needs no forward pass at all.
    """
    from engine.prompts.promptsets import generate

    pairs, _ = generate(model.tokenizer, spec)
    return answered_right(model, pairs, cache=cache, require_full=require_full, progress=progress), len(pairs)


def answered_right(model, pairs: Sequence[PromptPair], *, cache=None, require_full: bool = False,
                   progress: ProgressFn | None = None) -> list[PromptPair]:
    """The pairs the model answers right (first answer token, or every token with ``require_full``), cached as
    method ``kept_prompts`` under the pairs' hash: a generated set and a file of written pairs alike."""
    from engine.results import run_cached

    params = {"require_full": require_full, "dtype": model.facts.dtype}

    def compute():
        return [], {"kept": right_indices(model, pairs, require_full=require_full, progress=progress)}

    _, art, _ = run_cached(model, pairs, "kept_prompts", params, compute, cache)
    return [pairs[i] for i in art["kept"]]
