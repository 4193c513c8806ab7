"""Transfer of key heads between prompt sets (Zhang et al. 2024, §5.2, Table 4).

Path patching is run on two prompt sets (e.g. the equation templates vs the Figure 10 word
problems, or template prompts vs pairs built from SVAMP / GSM8K questions); we report

* the overlap of their top-k key heads (count and Jaccard index), and
* for each set, the accuracy before and after knocking out (mean ablation) its own top-k heads and
  the *other* set's top-k heads -- if the heads transfer, both knockouts hurt.

Benchmark questions become pairs by appending `` The answer is`` and, for X_c, replacing each
**operation word** (more, less, left, total, each, times, gave, ...) with a neutral filler of the
same token length; questions without such a word, or whose filler changes the length, are skipped.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from engine.backends.base import ModelBackend
from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import PromptError, PromptPair, answer_tokens
from engine.prompts.templates import CF_WORDS
from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations
from engine.techniques.path_patching import cached_path_patching

BENCH_FILES = {"svamp": "svamp/test.normalized.jsonl", "gsm8k": "gsm8k/test.normalized.jsonl",
               "addsub": "addsub/test.normalized.jsonl", "singleeq": "singleeq/test.normalized.jsonl"}
OPERATION_WORDS = ("more", "less", "fewer", "left", "total", "altogether", "each", "every", "times",
                   "twice", "half", "gave", "give", "gives", "ate", "eats", "spent", "bought", "sold",
                   "lost", "found", "added", "removed", "remaining", "sum", "difference", "product",
                   "plus", "minus", "per", "divided", "multiplied", "shared", "split", "together")
_OP_RE = re.compile(r"\b(" + "|".join(OPERATION_WORDS) + r")\b", re.IGNORECASE)
SUFFIX = " The answer is"
PP_BATCH = 32  # cached_path_patching's default: its progress counts batches of 32 pairs


def benchmark_pairs(tokenizer, data_dir: str | Path, bench: str, n: int, seed: int = 0,
                    max_chars: int = 400) -> list[PromptPair]:
    """(X_r, X_c) pairs from a math benchmark's questions (see module docstring)."""
    if bench not in BENCH_FILES:
        raise PromptError(f"unknown benchmark {bench!r}: choose from {', '.join(BENCH_FILES)}")
    path = Path(data_dir) / BENCH_FILES[bench]
    if not path.is_file():
        raise PromptError(f"{path} not found: pass --data-dir pointing at a folder laid out like ../shared/data")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(records)
    out: list[PromptPair] = []
    for rec in records:
        if len(out) >= n:
            break
        q, ans = rec.get("question", ""), rec.get("answer")
        if not isinstance(ans, int) or ans < 0 or len(q) > max_chars or not _OP_RE.search(q):
            continue
        ref_text = q.strip() + SUFFIX
        try:
            ref = answer_tokens(tokenizer, ref_text, ans)
        except PromptError:
            continue
        for filler in CF_WORDS:
            cf_text = _OP_RE.sub(filler, q.strip()) + SUFFIX
            try:
                cf = answer_tokens(tokenizer, cf_text, ans)
            except PromptError:
                continue
            if len(cf.prompt_ids) == len(ref.prompt_ids):
                out.append(PromptPair("mixed", f"{bench}", bench, 0, 0, ans, ref_text, cf_text,
                                      ref.prompt_ids, cf.prompt_ids, ref.answer_id, ref.answer_ids))
                break
    return out


@dataclass(frozen=True)
class SetTransfer:
    name: str
    n_pairs: int
    top_heads: list[tuple[int, int]]
    accuracy: float
    accuracy_ko_own: float
    accuracy_ko_other: float


@dataclass(frozen=True)
class TransferResult:
    k: int
    a: SetTransfer
    b: SetTransfer
    overlap: int
    jaccard: float

    def to_json(self) -> dict:
        return asdict(self)


def transfer(backend: ModelBackend, pairs_a: Sequence[PromptPair], pairs_b: Sequence[PromptPair], *,
             names: tuple[str, str] = ("A", "B"), k: int = 10, cache=None,
             progress: ProgressFn | None = None) -> TransferResult:
    """Top-k overlap and cross knockouts between two (correctly answered) prompt sets."""
    if not pairs_a or not pairs_b:
        raise PromptError("both prompt sets need at least one correctly answered pair")
    n_heads = backend.facts.n_layers * backend.facts.n_heads
    if not 1 <= k <= n_heads:
        raise ValueError(f"k must lie in 1..{n_heads} (the model's heads), got {k}")
    stages = Stages(progress, [-(-len(pairs_a) // PP_BATCH), -(-len(pairs_b) // PP_BATCH), 1, 1])
    tops = []
    for i, p in enumerate((pairs_a, pairs_b)):
        tops.append(top_heads_of(backend, p, k, cache=cache, progress=stages.stage(i)))
        stages.finish(i)
    sets = []
    for i, pairs in enumerate((pairs_a, pairs_b)):
        means = mean_activations(backend, pairs)
        own, other = tops[i], tops[1 - i]
        # no knockout, own top-k, other's top-k: one batched END-only pass (identical sets once)
        base, ko_own, ko_other = knockout_accuracies(
            backend, pairs, [Knockout(), Knockout(tuple(own)), Knockout(tuple(other))], means,
            progress=stages.stage(2 + i))
        sets.append(SetTransfer(names[i], len(pairs), own, base, ko_own, ko_other))
        stages.finish(2 + i)
    return TransferResult(k, sets[0], sets[1], *overlap(tops[0], tops[1]))


def transfer_work(backend: ModelBackend, pairs_a: Sequence[PromptPair], pairs_b: Sequence[PromptPair], *, cache=None):
    """The forward work of :func:`transfer` (``engine.cost.Work``): per set, path patching unless cached, its means
    and one END-only evaluation of three knockout sets."""
    from engine.cost import NO_WORK, unless_cached
    from engine.techniques.knockout import knockout_end_work, mean_activations_work
    from engine.techniques.path_patching import path_patching_work
    w = NO_WORK
    kos = [Knockout(), Knockout(((0, 0),)), Knockout(((0, 1),))]  # stand-ins: three distinct sets
    for pairs in (pairs_a, pairs_b):
        if pairs:
            w += unless_cached(lambda p=pairs: cached_path_patching(backend, p, cache=cache, batch_size=PP_BATCH),
                               lambda p=pairs: path_patching_work(backend, p, batch_size=PP_BATCH))
            w += mean_activations_work(backend, pairs) + knockout_end_work(backend, pairs, kos)
    return w


def compare_work(backend: ModelBackend, spec, candidates_b: Sequence[PromptPair], *, cache=None):
    """The forward work of the Transfer page's comparison (``engine.cost.Work``) and set A's pairs (the unit): the
    filters of ``spec`` (A) and of B's ``candidates_b``, each unless cached, and :func:`transfer_work` -- a set not
    filtered yet counted on all its prompts (A) or as many as A keeps of its own (B)."""
    from engine.cost import NO_WORK
    from engine.prompts.promptsets import generate
    from engine.results import NotCached, cache_only
    from engine.techniques.accuracy import answered_right, kept_pairs, scoring_work
    gen_a, _ = generate(backend.tokenizer, spec)
    w = NO_WORK
    try:
        with cache_only():
            pairs_a, _ = kept_pairs(backend, spec, cache=cache)
    except NotCached:
        w, pairs_a = scoring_work(backend, gen_a, full=False), list(gen_a)
    try:
        with cache_only():
            pairs_b = answered_right(backend, candidates_b, cache=cache)
    except NotCached:
        w += scoring_work(backend, candidates_b, full=False)
        pairs_b = list(candidates_b[:max(1, round(len(pairs_a) / max(1, len(gen_a)) * len(candidates_b)))])
    return w + transfer_work(backend, pairs_a, pairs_b, cache=cache), pairs_a


def top_heads_of(backend: ModelBackend, pairs: Sequence[PromptPair], k: int, *, cache=None,
                 progress: ProgressFn | None = None) -> list[tuple[int, int]]:
    """The set's top-k heads by path patching (through the result cache)."""
    table = cached_path_patching(backend, pairs, cache=cache, batch_size=PP_BATCH, progress=progress)[0]
    return [(layer, head) for layer, head, _ in table.top_heads(k)]


def overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> tuple[int, float]:
    """(heads in both lists, Jaccard index)."""
    inter, union = len(set(a) & set(b)), len(set(a) | set(b))
    return inter, inter / union if union else 0.0

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine transfer``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Table 4 on the sidebar set (A) and ``--b-families`` or ``--b-bench`` (B) -> JSON."""
    from engine.techniques.accuracy import keep_correct, kept_pairs
    model, cache = ctx.model, ctx.cache
    pairs_a, _ = kept_pairs(model, ctx.spec(), cache=cache)
    if args.b_bench:
        pairs_b = keep_correct(model, benchmark_pairs(model.tokenizer, args.data_dir, args.b_bench, args.n,
                                                      args.seed))
        name_b = args.b_bench
    else:
        pairs_b, _ = kept_pairs(model, ctx.spec(args.b_families), cache=cache)
        name_b = args.b_families
    with ctx.progress("transfer") as bar:
        res = transfer(model, pairs_a, pairs_b, names=(args.families, name_b), k=args.k, cache=cache,
                       progress=bar).to_json()
    res["answer_tokens"] = {name: ctx.answer_tokens(ps) for name, ps in
                            ((args.families, pairs_a), (name_b, pairs_b)) if ps}
    ctx.write_json(args.out, res)
    return res
