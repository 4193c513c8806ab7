"""Benchmark data and scoring (engine.evaluation.benchmarks, the pure parts of engine.evaluation.evaluate).

Every normalized file in ../shared/data is loaded in full; the scorer must give 100 % to the gold
answers (as a model's text for math sets, as logits favouring the gold letter for multiple choice)
and 0 % to a wrong answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from engine.evaluation.benchmarks import (
    BENCHMARKS,
    CHOICE_BENCHMARKS,
    DIGITS,
    EVAL_SPLIT,
    LETTERS,
    BenchItem,
    BenchmarkError,
    OptionLabels,
    format_number,
    hub_row_to_item,
    load_benchmark,
    option_labels,
    parse_benches,
    render_prompt,
    select_exemplars,
    sft_examples,
    template_sft_examples,
)
from engine.evaluation.evaluate import (
    ItemResult,
    _item_set_hash,
    build_prompts,
    evaluate,
    extract_number,
    numbers_match,
    score_choice,
    score_completion,
    table1,
    table1_markdown,
)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
FILES = sorted(DATA.glob("*/*.normalized.jsonl")) if DATA.is_dir() else []
needs_data = pytest.mark.skipif(not FILES, reason=f"no benchmark data in {DATA}")


def _line_count(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


@pytest.fixture(scope="module")
def organism_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(REPO / "models" / "organism"))


@pytest.fixture(scope="module")
def gsm8k_train():
    return load_benchmark("gsm8k", data_dir=DATA, split="train")


# ---------------------------------------------------------------------------------------------
# every file of ../shared/data: load, gold answers score 100 %
# ---------------------------------------------------------------------------------------------

@needs_data
def test_shared_data_has_every_benchmark():
    assert {f.parent.name for f in FILES} == set(BENCHMARKS)
    for b in BENCHMARKS:
        assert (DATA / b / f"{EVAL_SPLIT[b]}.normalized.jsonl").is_file()


def _gold_texts(gold: int | float) -> list[str]:
    """A model's text stating the gold number, in the spellings the extractor must read."""
    plain = format_number(gold)
    commas = f"{gold:,}"
    dollar = f"-${commas[1:]}" if commas.startswith("-") else f"${commas}"
    return [f" {plain}.", f" {commas}", f" {dollar}.\n", f": we add 3 and 4 to get 7, so {plain}",
            f" 12 apples. Then 5 more.\nThe answer is {commas}."]


@needs_data
@pytest.mark.parametrize("path", FILES, ids=[f"{f.parent.name}/{f.name}" for f in FILES])
def test_every_file_loads_and_gold_answers_score_100_percent(path):
    bench, split = path.parent.name, path.name.split(".")[0]
    items = load_benchmark(bench, data_dir=DATA, split=split)
    assert len(items) == _line_count(path) > 0
    assert len({it.id for it in items}) == len(items)
    if all(it.answer is None for it in items):  # CSQA test: answers hidden upstream
        assert bench == "csqa" and split == "test"
        with pytest.raises(BenchmarkError, match="hidden"):
            evaluate(None, bench, items[:3])
        return
    assert all(it.answer is not None for it in items)
    if bench in CHOICE_BENCHMARKS:
        right = wrong = 0
        for it in items:
            gi = LETTERS.index(it.answer)
            scores = [0.0] * len(it.choices)
            scores[gi] = 1.0
            right += score_choice(it, scores).correct
            scores = [0.0] * len(it.choices)
            scores[(gi + 1) % len(it.choices)] = 1.0
            wrong += score_choice(it, scores).correct
        assert right == len(items) and wrong == 0
        assert all(len(it.choices) == (4 if bench == "mmlu" else 5) for it in items)
        if bench == "mmlu":
            assert all(it.subject for it in items)
        return
    right = wrong = 0
    for it in items:
        for text in _gold_texts(it.answer):
            r = score_completion(it, text)
            right += r.correct
            assert r.pred == it.answer, (it.id, text, r.pred)
        wrong += score_completion(it, f" {format_number(it.answer + 1)}.").correct
    assert right == len(items) * len(_gold_texts(0)) and wrong == 0


# ---------------------------------------------------------------------------------------------
# answer extraction
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("The answer is 42.", 42), ("so 3 + 4 = 7 and then 7 * 2 = 14", 14), ("It costs $1,234.50 in all", 1234.5),
    ("The answer is -5 degrees", -5), ("5-3=2", 2), ("the answer is 18. Then 20 more", 18),
    ("The answer is: $ 3", 3), ("1,000,000 people", 1_000_000), ("ratio 1,2345", 2345), ("0.25 of it", 0.25),
    ("The Answer Is 7, not 8", 7), ("x = (4)-2", 2), ("The answer is 10\nThe answer is 11", 11),
    ("no number at all", None), ("", None), ("The answer is unknown, maybe 9", 9),
])
def test_extract_number(text, value):
    assert extract_number(text) == value


def test_numbers_match_tolerance():
    assert numbers_match(9.43, 9.43) and numbers_match(0.1 + 0.2, 0.3) and numbers_match(0.0000005, 0)
    assert numbers_match(1e6 + 1e-5, 1e6) and numbers_match(2.0000019, 2)
    assert not numbers_match(9.44, 9.43) and not numbers_match(None, 3)
    assert not numbers_match(float("nan"), 3)
    assert not numbers_match(1e6 + 1, 1e6) and not numbers_match(2.000003, 2)


def test_choice_ties_go_to_the_earlier_option_and_bad_scores_raise():
    it = BenchItem("q", "?", "B", ("x", "y", "z"))
    assert score_choice(it, [1.0, 1.0, 0.0]).pred == "A"
    with pytest.raises(BenchmarkError, match="3 choices"):
        score_choice(it, [1.0, 2.0])
    with pytest.raises(BenchmarkError, match="not an answered math item"):
        score_completion(it, " 3")
    r = score_choice(it, [0.0, 2.0, 1.0])
    assert ItemResult.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert score_choice(it, [float("nan"), -5.0, -6.0]).pred == "B"
    r = score_choice(it, [float("-inf"), 2.0, float("nan")])  # fp16 overflow: still valid JSON
    assert r.pred == "B" and json.loads(json.dumps(r.to_json(), allow_nan=False))["scores"] == [None, 2.0, None]


# ---------------------------------------------------------------------------------------------
# prompts: zero-shot, k-shot, option labels
# ---------------------------------------------------------------------------------------------

@needs_data
def test_zero_shot_prompts():
    g = load_benchmark("gsm8k", data_dir=DATA, limit=1)[0]
    assert render_prompt("gsm8k", g) == f"Question: {g.question}\nAnswer: The answer is"
    c = load_benchmark("csqa", data_dir=DATA, limit=1)[0]
    p = render_prompt("csqa", c)
    assert p.startswith(f"Question: {c.question}\nA. {c.choices[0]}\nB. ")
    assert p.endswith(f"\nE. {c.choices[4]}\nAnswer:")
    m = load_benchmark("mmlu", data_dir=DATA, limit=1)[0]
    assert render_prompt("mmlu", m).startswith(
        "The following are multiple choice questions (with answers) about abstract algebra.\n\nQuestion: ")
    with pytest.raises(BenchmarkError, match="does not belong"):
        render_prompt("gsm8k", c)


@needs_data
def test_k_shot_math_exemplars_from_gsm8k_train(gsm8k_train):
    items = load_benchmark("svamp", data_dir=DATA, limit=4)
    ex = select_exemplars("svamp", items[0], 3, gsm8k_train, seed=0)
    assert len(ex) == 3 and all(e.id.startswith("gsm8k-train-") for e in ex)
    assert select_exemplars("svamp", items[1], 3, gsm8k_train, seed=0) == ex  # same for every item
    assert select_exemplars("svamp", items[0], 3, gsm8k_train, seed=1) != ex
    p = render_prompt("svamp", items[0], ex)
    assert p.count("Question: ") == 4 and p.endswith(f"Question: {items[0].question}\nAnswer: The answer is")
    for e in ex:
        assert f"Question: {e.question}\nAnswer: The answer is {format_number(e.answer)}.\n\n" in p
    # an item is never its own exemplar, even when the pool holds it
    own = gsm8k_train[:4]
    for it in own:
        assert it not in select_exemplars("gsm8k", it, 3, own, seed=0)


@needs_data
def test_k_shot_mmlu_same_subject_dev_and_csqa_train(organism_tokenizer):
    dev = load_benchmark("mmlu", data_dir=DATA, split="dev")
    items = [it for it in load_benchmark("mmlu", data_dir=DATA, limit=400) if it.subject != "abstract_algebra"][:2]
    prompts, labels = build_prompts(organism_tokenizer, "mmlu", items, few_shot=5, pool=dev)
    assert labels.labels == LETTERS  # the organism's tokenizer has A-E as single tokens
    for it, p in zip(items, prompts):
        ex = select_exemplars("mmlu", it, 5, dev)
        assert [e.subject for e in ex] == [it.subject] * 5 and ex == [e for e in dev if e.subject == it.subject]
        assert p.count("Question: ") == 6 and p.count("The following are multiple choice") == 1
        assert p.endswith("\nD. " + it.choices[3] + "\nAnswer:")
        assert f"\nAnswer: {ex[0].answer}\n\n" in p
    with pytest.raises(BenchmarkError, match="5 per subject"):
        select_exemplars("mmlu", items[0], 6, dev)
    train = load_benchmark("csqa", data_dir=DATA, split="train", limit=200)
    c = load_benchmark("csqa", data_dir=DATA, limit=1)[0]
    ex = select_exemplars("csqa", c, 2, train, seed=0)
    assert len(ex) == 2 and all(e in train for e in ex)
    assert render_prompt("csqa", c, ex).count("Question: ") == 3


def test_select_exemplars_bad_k():
    it = BenchItem(1, "q", 3)
    for k in (-1, 1.5, True):
        with pytest.raises(BenchmarkError, match="few-shot"):
            select_exemplars("gsm8k", it, k, [it])
    with pytest.raises(BenchmarkError, match="pool holds 1"):
        select_exemplars("gsm8k", it, 2, [BenchItem(2, "q", 1)])


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(["<unk>", *words])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")


def test_option_labels_rule(organism_tokenizer):
    lab = option_labels(organism_tokenizer, 5)
    assert lab.labels == LETTERS and lab.space and lab.style == "letter-space"
    assert lab.token_ids == tuple(organism_tokenizer.convert_tokens_to_ids(list("ABCDE")))
    digits = option_labels(_word_tokenizer(["Answer", ":", "A", "B", "1", "2", "3", "4", "5"]), 5)  # no C: digits
    assert digits.labels == DIGITS and digits.style == "digit-space" and len(set(digits.token_ids)) == 5
    letters = option_labels(_word_tokenizer(["Answer", ":", "A", "B", "C", "D"]), 4)
    assert letters.labels == LETTERS and letters.style == "letter-space" and len(set(letters.token_ids)) == 4
    with pytest.raises(BenchmarkError, match="no distinct single tokens"):
        option_labels(_word_tokenizer(["Answer", ":", "A"]), 4)
    with pytest.raises(BenchmarkError, match="n_choices"):
        option_labels(organism_tokenizer, 12)
    assert OptionLabels(LETTERS, False).answer_text(1) == "B"


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------

def test_unknown_benchmark_and_bench_lists():
    with pytest.raises(BenchmarkError, match="unknown benchmark 'gsm9k'"):
        load_benchmark("gsm9k", data_dir=DATA)
    assert parse_benches("all") == BENCHMARKS and parse_benches("mmlu, gsm8k,mmlu") == ("mmlu", "gsm8k")
    for bad in ("", " , ", "gsm8k,nope"):
        with pytest.raises(BenchmarkError):
            parse_benches(bad)


def test_missing_dir_and_file(tmp_path):
    with pytest.raises(BenchmarkError, match="does not exist"):
        load_benchmark("gsm8k", data_dir=tmp_path / "nope")
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.normalized.jsonl").write_text('{"id": 1, "question": "q", "answer": 1}\n')
    with pytest.raises(BenchmarkError, match=r"test\.normalized\.jsonl not found \(splits there: train\)"):
        load_benchmark("gsm8k", data_dir=tmp_path)
    assert load_benchmark("gsm8k", data_dir=tmp_path, split="train")[0].answer == 1
    for split in ("../x", "", ".hidden"):
        with pytest.raises(BenchmarkError, match="bad split"):
            load_benchmark("gsm8k", data_dir=tmp_path, split=split)
    for limit in (0, -2, True, 1.5):
        with pytest.raises(BenchmarkError, match="limit"):
            load_benchmark("gsm8k", data_dir=tmp_path, split="train", limit=limit)


@pytest.mark.parametrize("bench,line,phrase", [
    ("gsm8k", "{not json", ":2: not valid JSON"),
    ("gsm8k", '{"id": 2, "question": "q", "answer": "7"}', ":2: 'answer' of a gsm8k item must be a number"),
    ("gsm8k", '{"id": 2, "question": "q", "answer": true}', "must be a number"),
    ("gsm8k", '{"id": 2, "question": "  ", "answer": 1}', "'question' must be a non-empty string"),
    ("gsm8k", '[1, 2]', "expected a JSON object"),
    ("svamp", '{"question": "q", "answer": 1}', "missing or bad 'id'"),
    ("csqa", '{"id": "x", "question": "q", "answer": "F", "choices": ["a", "b", "c", "d", "e"]}',
     "must be one of A, B, C, D, E"),
    ("mmlu", '{"id": "x", "question": "q", "answer": "A", "choices": "abcd"}', "'choices'"),
    ("mmlu", '{"id": "x", "question": "q", "answer": "A", "choices": ["a"]}', "'choices'"),
])
def test_bad_lines_name_file_and_line(tmp_path, bench, line, phrase):
    good = ('{"id": 1, "question": "q", "answer": 1}' if bench not in CHOICE_BENCHMARKS
            else '{"id": "y", "question": "q", "answer": "B", "choices": ["a", "b", "c", "d"]}')
    (tmp_path / bench).mkdir()
    (tmp_path / bench / "test.normalized.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(BenchmarkError, match=phrase.replace("(", r"\(").replace(")", r"\)")) as e:
        load_benchmark(bench, data_dir=tmp_path, split="test")
    assert "test.normalized.jsonl" in str(e.value)


def test_empty_file_and_limit(tmp_path):
    (tmp_path / "addsub").mkdir()
    f = tmp_path / "addsub" / "test.normalized.jsonl"
    f.write_text("\n\n")
    with pytest.raises(BenchmarkError, match="holds no items"):
        load_benchmark("addsub", data_dir=tmp_path)
    f.write_text("".join(json.dumps({"id": i, "question": f"q{i}", "answer": i}) + "\n" for i in range(5)) + "{bad\n")
    assert [it.id for it in load_benchmark("addsub", data_dir=tmp_path, limit=3)] == [0, 1, 2]
    with pytest.raises(BenchmarkError, match=":6: not valid JSON"):
        load_benchmark("addsub", data_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# the hub fallback (no network: the error paths and the row mapping)
# ---------------------------------------------------------------------------------------------

def test_hub_fallback_without_datasets_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("ARITHLAB_DATA", str(tmp_path))  # the default directory lacks the file
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    with pytest.raises(BenchmarkError) as e:
        load_benchmark("gsm8k")
    assert "pip install datasets" in str(e.value) and "--data-dir" in str(e.value) and "openai/gsm8k" in str(e.value)
    with pytest.raises(BenchmarkError, match="no Hugging Face hub source"):
        load_benchmark("addsub")
    with pytest.raises(BenchmarkError, match="no split 'train'"):
        load_benchmark("mmlu", split="train")


def test_hub_fallback_offline(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("ARITHLAB_DATA", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BenchmarkError, match="offline"):
        load_benchmark("csqa")


def test_hub_rows_map_to_items():
    g = hub_row_to_item("gsm8k", {"question": " Q? ", "answer": "work <<2*3=6>>6\n#### 1,200"}, 4, "test")
    assert g == BenchItem("gsm8k-test-4", "Q?", 1200)
    s = hub_row_to_item("svamp", {"ID": "chal-9", "Body": "Dan had 3 apples.", "Question": "How many now?",
                                  "Equation": "( 3 - 1 )", "Answer": 2.0, "Type": "Subtraction"}, 0, "test")
    assert s == BenchItem("chal-9", "Dan had 3 apples. How many now?", 2) and isinstance(s.answer, int)
    c = hub_row_to_item("csqa", {"id": "abc", "question": "Where?", "question_concept": "x",
                                 "choices": {"label": ["A", "B", "C", "D", "E"], "text": list("vwxyz")},
                                 "answerKey": "C"}, 0, "dev")
    assert c == BenchItem("abc", "Where?", "C", tuple("vwxyz"))
    assert hub_row_to_item("csqa", {"id": "t", "question": "Q", "choices": {"label": list("ABCDE"),
                                    "text": list("vwxyz")}, "answerKey": ""}, 0, "test").answer is None
    m = hub_row_to_item("mmlu", {"question": "2+2?", "subject": "elementary_mathematics",
                                 "choices": ["3", "4", "5", "6"], "answer": 1}, 7, "val")
    assert m == BenchItem("elementary_mathematics-val-7", "2+2?", "B", ("3", "4", "5", "6"), "elementary_mathematics")
    with pytest.raises(BenchmarkError, match="#### <number>"):
        hub_row_to_item("gsm8k", {"question": "q", "answer": "no marker"}, 0, "test")
    with pytest.raises(BenchmarkError, match="outside the 4 choices"):
        hub_row_to_item("mmlu", {"question": "q", "subject": "s", "choices": list("abcd"), "answer": 4}, 0, "test")
    with pytest.raises(BenchmarkError, match="unexpected row layout"):
        hub_row_to_item("svamp", {"Body": "b"}, 0, "test")
    with pytest.raises(BenchmarkError, match="not A, B, C"):
        hub_row_to_item("csqa", {"id": "t", "question": "Q", "choices": {"label": list("12345"),
                                 "text": list("vwxyz")}, "answerKey": "1"}, 0, "dev")


# ---------------------------------------------------------------------------------------------
# SFT examples, cache key, Table 1
# ---------------------------------------------------------------------------------------------

@needs_data
def test_sft_examples_use_the_evaluation_format(organism_tokenizer):
    items = load_benchmark("gsm8k", data_dir=DATA, split="train", limit=5)
    ex = sft_examples("gsm8k", data_dir=DATA, limit=5)
    assert ex == [{"prompt": render_prompt("gsm8k", it), "answer": f" {format_number(it.answer)}"} for it in items]
    mm = sft_examples("mmlu", data_dir=DATA, limit=3)  # default: val
    assert all(e["prompt"].endswith("\nAnswer:") and e["answer"] in (" A", " B", " C", " D") for e in mm)
    assert mm[0]["answer"] == " " + load_benchmark("mmlu", data_dir=DATA, split="val", limit=1)[0].answer
    cs = sft_examples("csqa", data_dir=DATA, limit=2, tokenizer=organism_tokenizer)
    assert "\nA. " in cs[0]["prompt"] and cs[0]["answer"] in tuple(f" {d}" for d in "ABCDE")
    with pytest.raises(BenchmarkError, match="no training split"):
        sft_examples("svamp", data_dir=DATA)
    with pytest.raises(BenchmarkError, match="not found"):
        sft_examples("mmlu", split="train", data_dir=DATA)
    tpl = template_sft_examples(("add", "mul"), n=4, seed=0)
    assert len(tpl) == 8 and all(e["answer"].startswith(" ") and e["answer"][1:].isdigit() for e in tpl)


def test_item_set_hash_depends_on_prompts_and_answers():
    a = [BenchItem(1, "q", 3)]
    assert _item_set_hash(a, ["p"]) == _item_set_hash([BenchItem(1, "q", 3)], ["p"])
    assert _item_set_hash(a, ["p"]) != _item_set_hash(a, ["p2"])
    assert _item_set_hash(a, ["p"]) != _item_set_hash([BenchItem(1, "q", 4)], ["p"])


def test_table1_rows_and_markdown():
    base = {"gsm8k": 0.25, "mmlu": 0.4}
    rows = table1(base, {"precise-sft": {"gsm8k": 0.3, "mmlu": 0.395}, "lora": {"gsm8k": 0.2, "csqa": 0.5}})
    assert [r.model for r in rows] == ["base", "precise-sft", "lora"]
    assert rows[0].delta == {"gsm8k": None, "mmlu": None}
    assert rows[1].delta["gsm8k"] == pytest.approx(5.0) and rows[1].delta["mmlu"] == pytest.approx(-0.5)
    assert rows[2].delta == {"gsm8k": pytest.approx(-5.0), "csqa": None}
    md = table1_markdown(rows).splitlines()
    assert md[0] == "| model | GSM8K | MMLU | CSQA |"
    assert md[2] == "| base | 25.0 | 40.0 | – |"
    assert md[3] == "| precise-sft | 30.0 (+5.0) | 39.5 (-0.5) | – |"
    assert md[4] == "| lora | 20.0 (-5.0) | – | 50.0 |"
    for bad in ({"gsm8k": 1.5}, {"gsm8k": "0.3"}, {"nope": 0.1}, {"gsm8k": True}):
        with pytest.raises(BenchmarkError):
            table1(bad, {})
    with pytest.raises(BenchmarkError):
        table1(base, {"x": {"mmlu": -0.1}})
