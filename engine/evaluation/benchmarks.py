"""Benchmark data of Zhang et al. (2024), Table 1: loading, prompt text and SFT examples.

Six sets: the math sets **GSM8K, AddSub, SingleEq, SVAMP** (answer = a number) and the generic
sets **MMLU, CommonsenseQA** (answer = an option letter).  Items are read from a local directory
laid out like ``../shared/data`` -- ``<data_dir>/<bench>/<split>.normalized.jsonl``, one JSON
object a line::

    {"id": ..., "question": str, "answer": number | "A".."E" | null, "choices": [str, ...], "subject": str}

(``choices`` only for multiple choice, ``subject`` only for MMLU).  The data directory is the
argument ``data_dir``, else ``$ARITHLAB_DATA``, else ``<repo>/../shared/data``.  When no
``data_dir`` is given and the default directory lacks the file, the set is loaded from the
Hugging Face hub with the optional ``datasets`` package (GSM8K ``openai/gsm8k`` main, SVAMP
``ChilleD/SVAMP``, CommonsenseQA ``tau/commonsense_qa``, MMLU ``cais/mmlu`` all), mapped to the
same item type; AddSub and SingleEq have no hub source.  An explicit ``data_dir`` is local only.

**Prompt format** (shared by evaluation and supervised fine-tuning, so a tuned model sees at test
time exactly what it was trained on):

* math: ``Question: {q}\\nAnswer: The answer is`` -- the model continues with the number
  (`` 18.``); target of an SFT example: `` 18``;
* multiple choice: ``Question: {q}\\nA. {c1}\\nB. {c2}\\n...\\nAnswer:``, MMLU with the standard
  header ``The following are multiple choice questions (with answers) about {subject}.\\n\\n``;
  target: `` B``.  Options are labelled A, B, C ... unless the tokenizer has no distinct
  single-token letters (then 1, 2, 3 ..., see :func:`option_labels`);
* k-shot: k solved exemplars, each followed by a blank line, before the question.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from engine.paths import default_data_dir

BENCHMARKS: tuple[str, ...] = ("gsm8k", "addsub", "singleeq", "svamp", "mmlu", "csqa")
MATH_BENCHMARKS: tuple[str, ...] = ("gsm8k", "addsub", "singleeq", "svamp")
CHOICE_BENCHMARKS: tuple[str, ...] = ("mmlu", "csqa")

#: the split evaluated by default (CSQA's test answers are hidden upstream, so dev)
EVAL_SPLIT: dict[str, str] = {"gsm8k": "test", "addsub": "test", "singleeq": "test", "svamp": "test",
                              "mmlu": "test", "csqa": "dev"}
#: the split supervised fine-tuning reads by default (sets without one: none)
TRAIN_SPLIT: dict[str, str] = {"gsm8k": "train", "csqa": "train", "mmlu": "val"}
#: where k-shot exemplars come from: (bench, split); MMLU's come from dev, same subject
EXEMPLAR_SOURCE: dict[str, tuple[str, str]] = {"gsm8k": ("gsm8k", "train"), "addsub": ("gsm8k", "train"),
                                               "singleeq": ("gsm8k", "train"), "svamp": ("gsm8k", "train"),
                                               "mmlu": ("mmlu", "dev"), "csqa": ("csqa", "train")}

#: Hugging Face hub sources: bench -> (dataset id, config or None, {our split: hub split})
HUB_SOURCES: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "gsm8k": ("openai/gsm8k", "main", {"train": "train", "test": "test"}),
    "svamp": ("ChilleD/SVAMP", None, {"train": "train", "test": "test"}),
    "csqa": ("tau/commonsense_qa", None, {"train": "train", "dev": "validation", "test": "test"}),
    "mmlu": ("cais/mmlu", "all", {"test": "test", "val": "validation", "dev": "dev"}),
}


LETTERS = "ABCDEFGHIJ"
DIGITS = "123456789"
ANSWER_CUE = "The answer is"
LABEL_PROBE = "Answer:"


class BenchmarkError(ValueError):
    """Benchmark data cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class BenchItem:
    """One benchmark question.  ``answer`` is a number (math), a letter (multiple choice) or None
    (hidden, e.g. CSQA test); ``choices`` is empty for math sets."""

    id: str | int
    question: str
    answer: int | float | str | None
    choices: tuple[str, ...] = ()
    subject: str | None = None

    @property
    def is_choice(self) -> bool:
        return bool(self.choices)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "question": self.question, "answer": self.answer}
        if self.choices:
            d["choices"] = list(self.choices)
        if self.subject is not None:
            d["subject"] = self.subject
        return d


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------

def check_bench(name: str) -> str:
    if not isinstance(name, str) or name not in BENCHMARKS:
        raise BenchmarkError(f"unknown benchmark {name!r}: choose from {', '.join(BENCHMARKS)}")
    return name


def parse_benches(text: str) -> tuple[str, ...]:
    """``gsm8k`` / ``gsm8k,mmlu`` / ``all`` -> tuple of benchmark names (no duplicates)."""
    if text is None or not str(text).strip():
        raise BenchmarkError(f"no benchmark given: choose from {', '.join(BENCHMARKS)} or all")
    if text.strip() == "all":
        return BENCHMARKS
    out: list[str] = []
    for b in (x.strip() for x in text.split(",")):
        if b and b not in out:
            out.append(check_bench(b))
    if not out:
        raise BenchmarkError(f"no benchmark given: choose from {', '.join(BENCHMARKS)} or all")
    return tuple(out)


def _check_limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise BenchmarkError(f"limit must be a positive whole number or None, got {limit!r}")
    return limit


def _check_split(split: str) -> str:
    if not isinstance(split, str) or not split or "/" in split or "\\" in split or split.startswith("."):
        raise BenchmarkError(f"bad split name {split!r}: e.g. test, train, dev, val")
    return split


def format_number(x: int | float) -> str:
    """A gold number as text: integral values without a decimal point (``18``, ``-5``, ``9.43``)."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


# ---------------------------------------------------------------------------------------------
# records -> items
# ---------------------------------------------------------------------------------------------

def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def item_from_record(bench: str, rec: Any, where: str = "record") -> BenchItem:
    """Validate one normalized record of ``bench``; raises BenchmarkError naming ``where``."""
    check_bench(bench)
    if not isinstance(rec, dict):
        raise BenchmarkError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    rid = rec.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise BenchmarkError(f"{where}: missing or bad 'id' {rid!r}")
    q = rec.get("question")
    if not isinstance(q, str) or not q.strip():
        raise BenchmarkError(f"{where}: 'question' must be a non-empty string")
    ans = rec.get("answer")
    subject = rec.get("subject")
    if subject is not None and not isinstance(subject, str):
        raise BenchmarkError(f"{where}: 'subject' must be a string")
    if bench in MATH_BENCHMARKS:
        if ans is not None and not _is_number(ans):
            raise BenchmarkError(f"{where}: 'answer' of a {bench} item must be a number, got {ans!r}")
        return BenchItem(rid, q, ans, (), subject)
    choices = rec.get("choices")
    if (not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS)
            or not all(isinstance(c, str) for c in choices)):
        raise BenchmarkError(f"{where}: 'choices' of a {bench} item must be a list of 2 to {len(LETTERS)} strings")
    if ans is not None and (not isinstance(ans, str) or ans not in LETTERS[:len(choices)]):
        raise BenchmarkError(f"{where}: 'answer' must be one of {', '.join(LETTERS[:len(choices)])} "
                             f"(or null), got {ans!r}")
    return BenchItem(rid, q, ans, tuple(choices), subject)


def read_items(bench: str, path: Path, limit: int | None = None) -> list[BenchItem]:
    """Items of a normalized JSONL file (the first ``limit`` when given)."""
    items: list[BenchItem] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchmarkError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            items.append(item_from_record(bench, rec, f"{path}:{lineno}"))
    if not items:
        raise BenchmarkError(f"{path} holds no items")
    return items


# ---------------------------------------------------------------------------------------------
# the hub (optional `datasets` package)
# ---------------------------------------------------------------------------------------------

def _integral(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def hub_row_to_item(bench: str, row: Mapping[str, Any], index: int, split: str) -> BenchItem:
    """Map one row of the bench's hub dataset (see :data:`HUB_SOURCES`) to a :class:`BenchItem`."""
    where = f"{HUB_SOURCES[bench][0] if bench in HUB_SOURCES else bench} {split} row {index}"
    try:
        if bench == "gsm8k":
            tail = str(row["answer"]).split("####")
            if len(tail) != 2:
                raise BenchmarkError(f"{where}: answer has no single '#### <number>' line")
            ans = _integral(float(tail[1].strip().replace(",", "")))
            rec = {"id": f"gsm8k-{split}-{index}", "question": str(row["question"]).strip(), "answer": ans}
        elif bench == "svamp":
            q = row.get("question_concat") or f"{str(row['Body']).strip()} {str(row['Question']).strip()}"
            rec = {"id": str(row.get("ID") or f"svamp-{split}-{index}"), "question": str(q).strip(),
                   "answer": _integral(float(row["Answer"]))}
        elif bench == "csqa":
            labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
            if labels != list(LETTERS[:len(labels)]):
                raise BenchmarkError(f"{where}: choice labels {labels} are not A, B, C, ...")
            key = row.get("answerKey") or None
            rec = {"id": str(row["id"]), "question": str(row["question"]).strip(), "answer": key,
                   "choices": texts}
        elif bench == "mmlu":
            a = row["answer"]
            choices = list(row["choices"])
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(choices):
                raise BenchmarkError(f"{where}: answer index {a!r} outside the {len(choices)} choices")
            subject = str(row["subject"])
            rec = {"id": f"{subject}-{split}-{index}", "question": str(row["question"]),
                   "answer": LETTERS[a], "choices": choices, "subject": subject}
        else:
            raise BenchmarkError(f"{bench} has no Hugging Face hub source")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, BenchmarkError):
            raise
        raise BenchmarkError(f"{where}: unexpected row layout ({type(e).__name__}: {e})") from None
    return item_from_record(bench, rec, where)


def hub_offline() -> bool:
    from engine.models.load import hub_offline as offline
    return offline()


def load_from_hub(bench: str, split: str, limit: int | None = None) -> list[BenchItem]:
    """Items of ``bench``/``split`` from the Hugging Face hub (needs ``pip install datasets``)."""
    if bench not in HUB_SOURCES:
        raise BenchmarkError(f"{bench} has no Hugging Face hub source: pass --data-dir DIR laid out "
                             f"like ../shared/data")
    repo, config, splits = HUB_SOURCES[bench]
    if split not in splits:
        raise BenchmarkError(f"{repo} has no split {split!r} for {bench}: choose from {', '.join(splits)}")
    try:
        import datasets  # optional dependency
    except ImportError:
        raise BenchmarkError(f"no local {bench}/{split}.normalized.jsonl and the `datasets` package is not "
                             f"installed: `pip install datasets` to load {repo} from the Hugging Face hub, "
                             f"or pass --data-dir DIR laid out like ../shared/data") from None
    if hub_offline():
        raise BenchmarkError(f"no local {bench}/{split}.normalized.jsonl and the Hugging Face hub is offline "
                             f"(HF_HUB_OFFLINE): pass --data-dir DIR laid out like ../shared/data")
    hub_split = splits[split] if limit is None else f"{splits[split]}[:{limit}]"
    try:
        ds = datasets.load_dataset(repo, config, split=hub_split)
    except Exception as e:  # noqa: BLE001 - network / hub errors of any kind become one clear line
        raise BenchmarkError(f"could not load {repo} ({hub_split}) from the hub: {type(e).__name__}: {e}") from None
    items = [hub_row_to_item(bench, row, i, split) for i, row in enumerate(ds)]
    if not items:
        raise BenchmarkError(f"{repo} ({hub_split}) holds no items")
    return items


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def benchmark_path(name: str, split: str, data_dir: str | Path | None = None) -> Path:
    return Path(data_dir if data_dir is not None else default_data_dir()) / name / f"{split}.normalized.jsonl"


def load_benchmark(name: str, *, data_dir: str | Path | None = None, split: str | None = None,
                   limit: int | None = None) -> list[BenchItem]:
    """The items of benchmark ``name`` (first ``limit`` in file order), from ``data_dir`` or the hub.

    ``split`` defaults to the evaluation split (:data:`EVAL_SPLIT`).  See the module docstring for
    where data is looked up.  Raises :class:`BenchmarkError` with a clear message otherwise.
    """
    check_bench(name)
    split = _check_split(split if split is not None else EVAL_SPLIT[name])
    limit = _check_limit(limit)
    if data_dir is not None:
        root = Path(data_dir)
        if not root.is_dir():
            raise BenchmarkError(f"data directory {root} does not exist: pass --data-dir DIR laid out "
                                 f"like ../shared/data (<DIR>/{name}/{split}.normalized.jsonl)")
        path = benchmark_path(name, split, root)
        if not path.is_file():
            have = sorted(p.name.split(".")[0] for p in (root / name).glob("*.normalized.jsonl"))
            hint = f" (splits there: {', '.join(have)})" if have else ""
            raise BenchmarkError(f"{path} not found{hint}: the data directory must hold "
                                 f"<DIR>/{name}/{split}.normalized.jsonl")
        return read_items(name, path, limit)
    path = benchmark_path(name, split)
    if path.is_file():
        return read_items(name, path, limit)
    return load_from_hub(name, split, limit)


# ---------------------------------------------------------------------------------------------
# prompt text (evaluation and SFT share it)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OptionLabels:
    """How options are labelled in the prompt and which next tokens score them.

    ``labels[i]`` names option i in the prompt (``A`` / ``1``); ``answers[i]`` is the text that
    follows ``Answer:`` (`` A`` or ``A``); ``token_ids[i]`` its single token (empty when built
    without a tokenizer)."""

    labels: str = LETTERS
    space: bool = True
    token_ids: tuple[int, ...] = ()

    def answer_text(self, i: int) -> str:
        return (" " if self.space else "") + self.labels[i]

    @property
    def style(self) -> str:
        return ("letter" if self.labels == LETTERS else "digit") + ("-space" if self.space else "")


DEFAULT_LABELS = OptionLabels()


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def option_labels(tokenizer, n_choices: int = 5) -> OptionLabels:
    """The option labels a tokenizer can score, chosen once per tokenizer (documented rule).

    Tried in order: letters after a space (``Answer: A``), letters without one (``Answer:A``),
    digits after a space, digits without.  A variant is taken when, for every label L of the first
    ``n_choices``, tokenizing ``"Answer:" + variant(L)`` gives the tokens of ``"Answer:"`` plus
    exactly one more token, and these tokens are distinct and not the unknown token.  (SmolLM2,
    GPT-2, Llama and the bundled model: `` A``; a tokenizer that knows no ``C`` gets digits.)
    """
    if not 2 <= n_choices <= len(DIGITS):
        raise BenchmarkError(f"n_choices must lie in 2..{len(DIGITS)}, got {n_choices}")
    base = _encode(tokenizer, LABEL_PROBE)
    unk = getattr(tokenizer, "unk_token_id", None)
    for labels in (LETTERS, DIGITS):
        for space in (True, False):
            ids: list[int] = []
            for L in labels[:n_choices]:
                full = _encode(tokenizer, LABEL_PROBE + (" " if space else "") + L)
                if full[:len(base)] != base or len(full) != len(base) + 1:
                    break
                ids.append(full[-1])
            if len(ids) == n_choices and len(set(ids)) == n_choices and (unk is None or unk not in ids):
                return OptionLabels(labels, space, tuple(ids))
    raise BenchmarkError("this tokenizer has no distinct single tokens for option letters or digits "
                         "after 'Answer:': multiple-choice sets cannot be scored by next-token logits")


def _subject_words(subject: str) -> str:
    return subject.replace("_", " ")


def _question_block(item: BenchItem, labels: OptionLabels) -> str:
    if not item.is_choice:
        return f"Question: {item.question.strip()}\nAnswer: {ANSWER_CUE}"
    if len(item.choices) > len(labels.labels):
        raise BenchmarkError(f"item {item.id!r} has {len(item.choices)} choices, more than the "
                             f"{len(labels.labels)} labels {labels.labels}")
    opts = "".join(f"\n{labels.labels[i]}. {c}" for i, c in enumerate(item.choices))
    return f"Question: {item.question.strip()}{opts}\nAnswer:"


def answer_text(item: BenchItem, labels: OptionLabels = DEFAULT_LABELS) -> str:
    """What follows the prompt in a solved example: `` 18`` / `` B`` (or ``B`` / `` 2``)."""
    if item.answer is None:
        raise BenchmarkError(f"item {item.id!r} has no answer (hidden in this split)")
    if item.is_choice:
        return labels.answer_text(LETTERS.index(str(item.answer)))
    return " " + format_number(item.answer)  # type: ignore[arg-type]


def render_prompt(bench: str, item: BenchItem, exemplars: Sequence[BenchItem] = (),
                  labels: OptionLabels = DEFAULT_LABELS) -> str:
    """The prompt for ``item`` with solved ``exemplars`` before it (see module docstring)."""
    check_bench(bench)
    if item.is_choice != (bench in CHOICE_BENCHMARKS):
        raise BenchmarkError(f"item {item.id!r} does not belong to {bench}")
    parts: list[str] = []
    if bench == "mmlu" and item.subject:
        parts.append(f"The following are multiple choice questions (with answers) about "
                     f"{_subject_words(item.subject)}.\n\n")
    for ex in exemplars:
        end = "." if not ex.is_choice else ""
        parts.append(_question_block(ex, labels) + answer_text(ex, labels) + end + "\n\n")
    parts.append(_question_block(item, labels))
    return "".join(parts)


def select_exemplars(bench: str, item: BenchItem, k: int, pool: Sequence[BenchItem],
                     seed: int = 0) -> list[BenchItem]:
    """k exemplars for ``item``, deterministic: MMLU the first k dev items of the item's subject;
    otherwise a seeded sample of the pool (the same for every item), never the item itself."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise BenchmarkError(f"few-shot k must be a whole number >= 0, got {k!r}")
    if k == 0:
        return []
    if bench == "mmlu":
        same = [e for e in pool if e.subject == item.subject and e.id != item.id and e.answer is not None]
        if len(same) < k:
            raise BenchmarkError(f"only {len(same)} MMLU dev exemplars for subject {item.subject!r}, "
                                 f"{k}-shot asked (MMLU dev has 5 per subject)")
        return same[:k]
    usable = [e for e in pool if e.answer is not None]
    if len(usable) < k + 1:
        raise BenchmarkError(f"the exemplar pool holds {len(usable)} answered items, {k}-shot asked")
    picked = random.Random(seed).sample(usable, k + 1)
    return [e for e in picked if e.id != item.id][:k]


def exemplar_pool(bench: str, k: int, data_dir: str | Path | None = None) -> list[BenchItem]:
    """The items k-shot exemplars of ``bench`` are drawn from (:data:`EXEMPLAR_SOURCE`)."""
    if k == 0:
        return []
    src, split = EXEMPLAR_SOURCE[bench]
    return load_benchmark(src, data_dir=data_dir, split=split)


# ---------------------------------------------------------------------------------------------
# supervised fine-tuning examples
# ---------------------------------------------------------------------------------------------

def sft_examples(name: str, split: str | None = None, data_dir: str | Path | None = None,
                 limit: int | None = None, *, tokenizer=None) -> list[dict[str, str]]:
    """``[{"prompt", "answer"}]`` from a training split, in the evaluation's zero-shot format.

    ``split`` defaults to :data:`TRAIN_SPLIT` (gsm8k train, csqa train, mmlu val); math sets
    without a training split raise (fine-tune on gsm8k).  ``answer`` is the continuation
    (`` 72``, `` B``); with ``tokenizer`` the option labels follow :func:`option_labels` exactly
    as evaluation does.  Items without an answer are skipped.
    """
    check_bench(name)
    if split is None:
        if name not in TRAIN_SPLIT:
            raise BenchmarkError(f"{name} has no training split: fine-tune on gsm8k (math) or csqa / mmlu")
        split = TRAIN_SPLIT[name]
    items = load_benchmark(name, data_dir=data_dir, split=split, limit=limit)
    labels = DEFAULT_LABELS
    if tokenizer is not None and name in CHOICE_BENCHMARKS:
        labels = option_labels(tokenizer, max(len(i.choices) for i in items))
    return [{"prompt": render_prompt(name, it, (), labels), "answer": answer_text(it, labels)}
            for it in items if it.answer is not None]


def template_sft_examples(ops: Iterable[str] = ("add", "sub", "mul", "div"), n: int = 100, seed: int = 0,
                          families: Sequence[str] | None = None) -> list[dict[str, str]]:
    """``[{"prompt", "answer"}]`` from the paper's arithmetic templates (:mod:`engine.prompts.templates`):
    ``{"prompt": "3 + 5 =", "answer": " 8"}``; ``n`` per operation, seeded; ``families`` None =
    the paper's Figure 8 templates."""
    from engine.prompts.pairs import sample_problems
    from engine.prompts.templates import PAPER_FAMILIES
    problems = sample_problems(tuple(ops), n, seed, families=PAPER_FAMILIES if families is None else families)
    return [{"prompt": p.ref_text, "answer": f" {p.answer}"} for p in problems]
