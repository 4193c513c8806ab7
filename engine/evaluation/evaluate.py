"""Benchmark evaluation as in Zhang et al. (2024), Table 1: accuracy on math and generic sets,
and its change after fine-tuning.

Protocol (prompt text in :mod:`engine.evaluation.benchmarks`):

* **Math sets** (GSM8K, AddSub, SingleEq, SVAMP): the prompt ``Question: {q}\\nAnswer: The answer
  is`` (zero-shot, or after k solved exemplars drawn deterministically from GSM8K train -- the
  other math sets have no training split) is continued by **greedy decoding** of at most
  ``max_new_tokens`` tokens, stopping at a newline or the end-of-sequence token.  The predicted
  number is read from the completion by :func:`extract_number` (the first number after the last
  "the answer is" when the model wrote one, else the last number; thousands commas, signs,
  decimals, ``$``) and is right when it equals the gold number within a relative tolerance of 1e-6 (at most
  1e-4 absolute).
* **Multiple choice** (MMLU, CommonsenseQA): the prompt lists the options and ends with
  ``Answer:``; the prediction is the option whose label token has the highest next-token logit
  (one forward pass, no generation).  Labels follow :func:`engine.evaluation.benchmarks.option_labels`,
  chosen once per tokenizer: `` A`` .. `` E`` for usual BPE / SentencePiece tokenizers.  k-shot
  exemplars: MMLU dev of the same subject (the standard 5-shot), CSQA train (seeded sample).
* Prompts longer than the model's context are cut from the left (counted in ``truncated``).

Greedy decoding uses only ``ModelBackend.logits(input_ids, attention_mask)`` (left padding,
batches; no KV cache), so it runs on every backend; :func:`greedy_decode` reproduces Hugging
Face ``generate(do_sample=False)`` token for token (tested on SmolLM2).

Results are cached (key = model fingerprint + hash of the item ids, prompts and answers + method
``benchmark_eval`` + params); :func:`table1` and :func:`table1_markdown` give the paper's rows:
accuracy per set and Δ (points) against the base model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from engine.evaluation.benchmarks import (
    ANSWER_CUE,
    BENCHMARKS,
    CHOICE_BENCHMARKS,
    DEFAULT_LABELS,
    EVAL_SPLIT,
    LETTERS,
    BenchItem,
    BenchmarkError,
    OptionLabels,
    check_bench,
    exemplar_pool,
    load_benchmark,
    option_labels,
    render_prompt,
    select_exemplars,
)
from engine.progress import ProgressFn

METHOD = "benchmark_eval"
FORMAT_VERSION = 1  # bump when prompt text, extraction or scoring changes (part of the cache key)
REL_TOL = 1e-6
ABS_CAP = 1e-4
DEFAULT_MAX_NEW_TOKENS = 16
LOGITS_BUDGET = 1 << 27  # max batch*pos*vocab floats per forward pass (512 MiB in float32)
DISPLAY = {"gsm8k": "GSM8K", "addsub": "AddSub", "singleeq": "SingleEq", "svamp": "SVAMP", "mmlu": "MMLU",
           "csqa": "CSQA"}


# ---------------------------------------------------------------------------------------------
# answer extraction and scoring (pure)
# ---------------------------------------------------------------------------------------------

# a number: optional sign (not a binary minus: no word char or closing bracket before it), optional
# "$", integer part with thousands commas (1,234,567) or plain digits, optional decimals.
_NUMBER = re.compile(r"(?:(?<![\w)\]])(?P<sign>-))?(?:\$\s?)?"
                     r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?")
_CUE = re.compile(re.escape(ANSWER_CUE), re.IGNORECASE)


def _to_number(m: re.Match) -> float:
    text = m.group("int").replace(",", "") + (m.group("frac") or "")
    v = float(text)
    return -v if m.group("sign") else v


def extract_number(text: str) -> float | None:
    """The answer number in a model's text, or None.

    The first number after the last "the answer is" (any case); without that cue (or no number
    after it), the last number in the text.  ``1,234`` -> 1234, ``-5`` -> -5, ``$3.50`` -> 3.5,
    ``18.`` -> 18; a minus between two numbers (``5-3``) is not a sign.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    cues = list(_CUE.finditer(text))
    if cues:
        m = _NUMBER.search(text, cues[-1].end())
        if m is not None:
            return _to_number(m)
    found = list(_NUMBER.finditer(text))
    return _to_number(found[-1]) if found else None


def numbers_match(pred: float | None, gold: float) -> bool:
    """|pred - gold| <= min(1e-6 * max(1, |gold|), 1e-4): a relative 1e-6 absorbs float noise, and the
    cap keeps a gold above a million from accepting an integer off by one."""
    if pred is None or not math.isfinite(pred):
        return False
    return abs(pred - gold) <= min(REL_TOL * max(1.0, abs(gold)), ABS_CAP)


@dataclass(frozen=True)
class ItemResult:
    id: str | int
    gold: int | float | str
    pred: int | float | str | None
    correct: bool
    output: str = ""  # math: the completion (up to the stop); multiple choice: ""
    scores: tuple[float, ...] = ()  # multiple choice: the option labels' logits

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "gold": self.gold, "pred": self.pred, "correct": self.correct,
                "output": self.output, "scores": [s if math.isfinite(s) else None for s in self.scores]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "ItemResult":
        return ItemResult(d["id"], d["gold"], d["pred"], bool(d["correct"]), d.get("output", ""),
                          tuple(float("nan") if s is None else float(s) for s in d.get("scores", ())))


@dataclass(frozen=True)
class StoredScore:
    """A cached benchmark's rows (the result itself is its ``result`` artifact): each item's ``correct``
    and the benchmark's ``accuracy`` (item ``"*"``)."""

    item: str
    metric: str
    value: float


def _as_number(x: float) -> int | float:
    return int(x) if float(x).is_integer() and abs(x) < 2 ** 53 else float(x)


def score_completion(item: BenchItem, completion: str) -> ItemResult:
    """Score a math item from the model's continuation of its prompt (:func:`extract_number`)."""
    if item.is_choice or item.answer is None:
        raise BenchmarkError(f"item {item.id!r} is not an answered math item")
    pred = extract_number(completion)
    return ItemResult(item.id, item.answer, None if pred is None else _as_number(pred),
                      numbers_match(pred, float(item.answer)), completion)


def score_choice(item: BenchItem, option_scores: Sequence[float]) -> ItemResult:
    """Score a multiple-choice item from its options' next-token logits (highest wins; ties go
    to the earlier option; NaN counts as lowest)."""
    if not item.is_choice or item.answer is None:
        raise BenchmarkError(f"item {item.id!r} is not an answered multiple-choice item")
    scores = [float(s) for s in option_scores]
    if len(scores) != len(item.choices):
        raise BenchmarkError(f"item {item.id!r}: {len(scores)} scores for {len(item.choices)} choices")
    best = max(range(len(scores)), key=lambda i: (-math.inf if math.isnan(scores[i]) else scores[i], -i))
    pred = LETTERS[best]
    return ItemResult(item.id, item.answer, pred, pred == item.answer, "", tuple(scores))


# ---------------------------------------------------------------------------------------------
# model side: batched forward passes through the narrow backend interface
# ---------------------------------------------------------------------------------------------

def context_length(model) -> int | None:
    """The model's context window (bridge config ``n_ctx``, HF ``max_position_embeddings``), or None."""
    for obj in (model, getattr(model, "bridge", None)):
        n = getattr(getattr(obj, "cfg", None), "n_ctx", None)
        if isinstance(n, int) and n > 0:
            return n
    for holder in (model, getattr(model, "loaded", None)):
        hf = getattr(holder, "hf_model", None)
        n = getattr(getattr(hf, "config", None), "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
    n = getattr(getattr(model, "tokenizer", None), "model_max_length", None)
    return n if isinstance(n, int) and 0 < n < 1_000_000 else None


def _rows_per_pass(batch_size: int, width: int, vocab: int) -> int:
    return max(1, min(batch_size, LOGITS_BUDGET // max(1, width * vocab)))


def last_logits(model, seqs: Sequence[Sequence[int]], batch_size: int = 8):
    """Next-token logits after each sequence (left padding, batches). # [n, vocab] float32"""
    import torch

    from engine.machinery.batching import pad_batch, tokenizer_pad_id
    if not seqs or any(len(s) == 0 for s in seqs):
        raise BenchmarkError("last_logits needs non-empty token sequences")
    pad = tokenizer_pad_id(model.tokenizer)
    vocab = int(model.facts.vocab_size)
    out = []
    start = 0
    while start < len(seqs):
        width = max(len(s) for s in seqs[start:start + batch_size])
        rows = _rows_per_pass(batch_size, width, vocab)
        chunk = seqs[start:start + rows]
        ids, mask, _ = pad_batch(chunk, pad, left=True)
        end = torch.full((len(chunk),), ids.shape[1] - 1)  # left padding: every row ends in the last column
        with torch.no_grad():
            out.append(model.end_logits(ids, mask, end).float().cpu())  # [rows, vocab]: only END is unembedded
        start += len(chunk)
    return torch.cat(out, 0)


def greedy_decode(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                  stop_ids: Sequence[int] | None = None, stop_on_newline: bool = True, batch_size: int = 8,
                  progress: ProgressFn | None = None) -> list[list[int]]:
    """Greedy continuation of each prompt (token ids), built on :func:`last_logits` only.

    Each step runs the whole (left-padded) sequence again -- no KV cache, so any backend works --
    and appends the argmax token (only the last position is unembedded).  A row stops after
    emitting a token of ``stop_ids`` (default: the tokenizer's EOS) or, with ``stop_on_newline``, a
    token whose text holds a newline; the stopping token is included in the output, as in
    ``generate``.  Finished rows leave the batch.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise BenchmarkError(f"max_new_tokens must be a positive whole number, got {max_new_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise BenchmarkError(f"batch_size must be a positive whole number, got {batch_size!r}")
    tok = model.tokenizer
    if stop_ids is None:
        eos = getattr(tok, "eos_token_id", None)
        stop_ids = () if eos is None else (int(eos),)
    stops = {int(s) for s in stop_ids}
    newline: dict[int, bool] = {}

    def is_newline(t: int) -> bool:
        if t not in newline:
            try:
                newline[t] = "\n" in tok.decode([t])
            except Exception:  # noqa: BLE001 - ids beyond the tokenizer's vocabulary decode to nothing
                newline[t] = False
        return newline[t]

    outputs: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    done = 0
    for b in range(0, len(order), batch_size):
        active = list(order[b:b + batch_size])
        if any(len(prompts[i]) == 0 for i in active):
            raise BenchmarkError("greedy_decode needs non-empty prompts")
        for _ in range(max_new_tokens):
            if not active:
                break
            seqs = [list(prompts[i]) + outputs[i] for i in active]
            nxt = [int(t) for t in last_logits(model, seqs, batch_size).argmax(-1).tolist()]
            still = []
            for i, t in zip(active, nxt):
                outputs[i].append(t)
                if not (t in stops or (stop_on_newline and is_newline(t))):
                    still.append(i)
            active = still
        done += len(order[b:b + batch_size])
        if progress is not None:
            progress(done, len(prompts))
    return outputs


def completion_text(tokenizer, ids: Sequence[int]) -> str:
    """Decoded continuation up to (not including) the first newline; special tokens dropped."""
    return tokenizer.decode(list(ids), skip_special_tokens=True).split("\n", 1)[0]


# ---------------------------------------------------------------------------------------------
# one benchmark
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchResult:
    bench: str
    split: str
    n: int
    accuracy: float
    few_shot: int
    max_new_tokens: int
    label_style: str  # multiple choice: letter-space / letter / digit-space / digit; math: ""
    truncated: int  # prompts cut from the left to fit the context
    records: tuple[ItemResult, ...] = field(repr=False, default=())

    def summary(self) -> dict[str, Any]:
        return {"bench": self.bench, "split": self.split, "n": self.n, "accuracy": self.accuracy,
                "correct": sum(r.correct for r in self.records), "few_shot": self.few_shot,
                "max_new_tokens": self.max_new_tokens, "label_style": self.label_style,
                "truncated": self.truncated}

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "records": [r.to_json() for r in self.records]}


def check_items(bench: str, items: Sequence[BenchItem]) -> None:
    """Raise BenchmarkError unless ``items`` are answered items of ``bench``."""
    if not items:
        raise BenchmarkError(f"no {bench} items to evaluate")
    hidden = [it.id for it in items if it.answer is None]
    if hidden:
        raise BenchmarkError(f"{len(hidden)} {bench} item(s) have no answer (e.g. {hidden[0]!r}): this split's "
                             f"answers are hidden; evaluate on {EVAL_SPLIT[bench]}")
    if any(it.is_choice != (bench in CHOICE_BENCHMARKS) for it in items):
        raise BenchmarkError(f"the items do not belong to {bench}")


def build_prompts(tokenizer, bench: str, items: Sequence[BenchItem], *, few_shot: int = 0,
                  pool: Sequence[BenchItem] = (), seed: int = 0) -> tuple[list[str], OptionLabels]:
    """Prompt texts of ``items`` (k-shot with exemplars from ``pool``) and the option labels used."""
    check_bench(bench)
    labels = DEFAULT_LABELS
    if bench in CHOICE_BENCHMARKS:
        labels = option_labels(tokenizer, max(len(it.choices) for it in items))
    prompts = [render_prompt(bench, it, select_exemplars(bench, it, few_shot, pool, seed), labels)
               for it in items]
    return prompts, labels


def _tokenize(model, prompts: Sequence[str], reserve: int) -> tuple[list[list[int]], int]:
    """Token ids of each prompt, cut from the left to fit the context minus ``reserve``."""
    ctx = context_length(model)
    out, cut = [], 0
    for p in prompts:
        ids = list(model.tokenizer(p)["input_ids"])
        if ctx is not None and len(ids) > ctx - reserve:
            keep = max(1, ctx - reserve)
            ids, cut = ids[-keep:], cut + 1
        out.append(ids)
    return out, cut


def evaluate(model, bench: str, items: Sequence[BenchItem], *, few_shot: int = 0,
             pool: Sequence[BenchItem] = (), seed: int = 0, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
             batch_size: int = 8, split: str = "", progress: ProgressFn | None = None) -> BenchResult:
    """Accuracy of ``model`` (a :class:`engine.backends.base.ModelBackend`) on ``items`` (see module docstring)."""
    check_bench(bench)
    check_items(bench, items)
    prompts, labels = build_prompts(model.tokenizer, bench, items, few_shot=few_shot, pool=pool, seed=seed)
    if bench in CHOICE_BENCHMARKS:
        ids, cut = _tokenize(model, prompts, 0)
        if any(t >= model.facts.vocab_size for t in labels.token_ids):
            raise BenchmarkError("the option label tokens lie outside the model's vocabulary")
        logits = last_logits(model, ids, batch_size)  # [n, vocab]
        records = []
        for i, it in enumerate(items):
            records.append(score_choice(it, [float(logits[i, t]) for t in labels.token_ids[:len(it.choices)]]))
            if progress is not None:
                progress(i + 1, len(items))
        style = labels.style
    else:
        ids, cut = _tokenize(model, prompts, max_new_tokens)
        outs = greedy_decode(model, ids, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress)
        records = [score_completion(it, completion_text(model.tokenizer, o)) for it, o in zip(items, outs)]
        style = ""
    acc = sum(r.correct for r in records) / len(records)
    return BenchResult(bench, split, len(records), acc, few_shot, max_new_tokens, style, cut, tuple(records))


def _item_set_hash(items: Sequence[BenchItem], prompts: Sequence[str]) -> str:
    from cache import hash_prompt_set
    return hash_prompt_set([{"id": str(it.id), "prompt": p, "answer": it.answer} for it, p in zip(items, prompts)])


def load_eval_set(bench: str, *, data_dir: str | Path | None = None, split: str | None = None,
                  limit: int | None = None, few_shot: int = 0, seed: int = 0
                  ) -> tuple[str, list[BenchItem], list[BenchItem]]:
    """(split, items, exemplar pool) of a benchmark, checked: answered items, and k exemplars exist
    for every item (no model needed, so the CLI fails fast on bad data)."""
    check_bench(bench)
    split = split if split is not None else EVAL_SPLIT[bench]
    items = load_benchmark(bench, data_dir=data_dir, split=split, limit=limit)
    check_items(bench, items)
    pool = exemplar_pool(bench, few_shot, data_dir)
    for it in items:
        select_exemplars(bench, it, few_shot, pool, seed)
    return split, items, pool


def evaluate_cached(model, bench: str, *, data_dir: str | Path | None = None, split: str | None = None,
                    limit: int | None = None, few_shot: int = 0, seed: int = 0,
                    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, batch_size: int = 8, cache=None,
                    progress: ProgressFn | None = None) -> tuple[BenchResult, bool]:
    """Load ``bench`` (:func:`engine.evaluation.benchmarks.load_benchmark`), evaluate it and cache the result.

    Returns (result, computed) -- ``computed`` is False when the result came from the cache.
    Key: model fingerprint + hash of (item id, prompt, answer) + method + params.
    """
    split, items, pool = load_eval_set(bench, data_dir=data_dir, split=split, limit=limit, few_shot=few_shot,
                                       seed=seed)
    prompts, labels = build_prompts(model.tokenizer, bench, items, few_shot=few_shot, pool=pool, seed=seed)
    params = {"bench": bench, "split": split, "few_shot": few_shot, "seed": seed,
              "max_new_tokens": max_new_tokens if bench not in CHOICE_BENCHMARKS else 0,
              "labels": labels.style if bench in CHOICE_BENCHMARKS else "", "dtype": model.facts.dtype,
              "format": FORMAT_VERSION}

    def compute():
        from engine.results import encode_rows
        res = evaluate(model, bench, items, few_shot=few_shot, pool=pool, seed=seed,
                       max_new_tokens=max_new_tokens, batch_size=batch_size, split=split, progress=progress)
        rows = [StoredScore(str(r.id), "correct", float(r.correct)) for r in res.records]
        rows.append(StoredScore("*", "accuracy", res.accuracy))
        return encode_rows(rows), {"result": res.to_json()}

    if cache is None:
        _, art = compute()
        computed = True
    else:
        from cache import make_key
        from engine.results import keyed
        fp = model.facts.fingerprint
        psh = _item_set_hash(items, prompts)
        params = keyed(params)
        run, computed = cache.get_or_compute(make_key(fp, psh, METHOD, params), compute, model_fingerprint=fp,
                                             prompt_set_hash=psh, method=METHOD, params=params)
        art = dict(run.artifacts or {})
    d = art["result"]
    res = BenchResult(d["bench"], d["split"], int(d["n"]), float(d["accuracy"]), int(d["few_shot"]),
                      int(d["max_new_tokens"]), d["label_style"], int(d["truncated"]),
                      tuple(ItemResult.from_json(r) for r in d["records"]))
    return res, computed


# ---------------------------------------------------------------------------------------------
# Table 1
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Table1Row:
    model: str
    acc: dict[str, float]  # bench -> accuracy in [0, 1]
    delta: dict[str, float | None]  # bench -> accuracy points vs the base (None: base row / no base value)


def _check_accs(name: str, accs: Mapping[str, float]) -> None:
    if not isinstance(accs, Mapping):
        raise BenchmarkError(f"accuracies of {name!r} must be a mapping bench -> accuracy")
    for b, a in accs.items():
        check_bench(b)
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= float(a) <= 1.0:
            raise BenchmarkError(f"accuracy of {name!r} on {b} must be a number in [0, 1], got {a!r}")


def table1(base: Mapping[str, float], tuned: Mapping[str, Mapping[str, float]],
           base_name: str = "base") -> list[Table1Row]:
    """The paper's Table 1: the base model's accuracy per set, then each tuned model's accuracy
    and Δ = 100 * (tuned - base) in points (None where the base lacks that set)."""
    _check_accs(base_name, base)
    if not isinstance(tuned, Mapping):
        raise BenchmarkError("tuned must be a mapping model name -> {bench: accuracy}")
    rows = [Table1Row(base_name, {b: float(base[b]) for b in BENCHMARKS if b in base},
                      {b: None for b in BENCHMARKS if b in base})]
    for name, accs in tuned.items():
        _check_accs(name, accs)
        acc = {b: float(accs[b]) for b in BENCHMARKS if b in accs}
        rows.append(Table1Row(str(name), acc, {b: (100.0 * (a - float(base[b])) if b in base else None)
                                               for b, a in acc.items()}))
    return rows


def table1_markdown(rows: Sequence[Table1Row]) -> str:
    """Markdown table: one column per set, cells ``acc%`` or ``acc% (+Δ)``."""
    if not rows:
        raise BenchmarkError("no rows to render")
    benches = [b for b in BENCHMARKS if any(b in r.acc for r in rows)]
    lines = ["| model | " + " | ".join(DISPLAY[b] for b in benches) + " |",
             "| --- | " + " | ".join("---:" for _ in benches) + " |"]
    for r in rows:
        cells = []
        for b in benches:
            if b not in r.acc:
                cells.append("–")
                continue
            d = r.delta.get(b)
            cells.append(f"{100 * r.acc[b]:.1f}" + ("" if d is None else f" ({d:+.1f})"))
        lines.append(f"| {r.model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
