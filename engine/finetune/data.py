"""Supervised fine-tuning data: JSONL files and built-in sets.

A data source D (``finetune --data D``) is either

* a JSONL file of ``{"prompt": ..., "answer": ...}`` lines (the answer is appended after a space
  and followed by EOS; the loss covers the answer only), or
* a built-in set name (``BUILTIN_SETS``):

  - ``notation`` / ``power`` -- the *skill* template families the bundled organism never trained on
    (typeset operator signs "7 × 8 =", "x", "over"; exponentiation), training split only: about a
    third of the (template, A, B) combinations are held out for evaluation (``skill_split``);
  - ``notation+replay`` -- ``notation`` plus the organism's 72 control facts as replay data (so
    that a method cannot trade the control task away; the demonstration in ``engine.finetune.skill_demo``);
  - ``arith`` -- the paper's Figure 8 templates (32), operands 1..9 (for real models);
  - ``gsm8k``, ``csqa``, ``mmlu`` -- benchmark training splits (``engine.evaluation.benchmarks.sft_examples``)
    read from the data directory (``--data-dir`` / ``$ARITHLAB_DATA`` / ``../shared/data``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from engine.finetune.errors import FinetuneError
from engine.finetune.train import SFTExample

SKILL_SETS: tuple[str, ...] = ("notation", "power")
BENCH_SETS: tuple[str, ...] = ("gsm8k", "csqa", "mmlu")
BUILTIN_SETS: tuple[str, ...] = SKILL_SETS + ("notation+replay", "arith") + BENCH_SETS
#: About 1/HOLDOUT_MOD of a skill family's (template, A, B) combinations are evaluation-only.
HOLDOUT_MOD = 3
_SKILL_OPS = {"notation": ("sub", "mul", "div"), "power": ("pow",)}


def held_out(template_id: str, a: int, b: int, mod: int = HOLDOUT_MOD) -> bool:
    """The split rule: a hash of (template, A, B), so it never depends on sampling order."""
    return hashlib.sha256(f"skill|{template_id}|{a}|{b}".encode()).digest()[0] % mod == 0


def skill_problems(family: str, split: str, operands: tuple[int, int] = (1, 9)) -> list:
    """Every problem of a skill family in ``split`` ("train" or "test"), in a fixed order."""
    import random

    from engine.prompts.pairs import OperandRange, make_problem, valid_operands
    from engine.prompts.templates import templates_for

    if family not in SKILL_SETS:
        raise FinetuneError(f"unknown skill {family!r}: choose from {', '.join(SKILL_SETS)}")
    if split not in ("train", "test"):
        raise FinetuneError(f"split must be train or test, got {split!r}")
    r = OperandRange(*operands)
    rng = random.Random(0)  # counterfactual fillers, fixed
    out = []
    for op in _SKILL_OPS[family]:
        for t in templates_for([op], [family]):
            for a, b in valid_operands(op, r):
                if held_out(t.id, a, b) == (split == "test"):
                    out.append(make_problem(t, a, b, rng))
    return out


def skill_pairs(tokenizer, family: str, split: str) -> list:
    """(X_r, X_c) prompt pairs of a skill family's split (for accuracy and patching)."""
    from engine.prompts.pairs import build_pairs

    pairs, _ = build_pairs(tokenizer, skill_problems(family, split))
    return pairs


def _template_examples(family: str) -> list[SFTExample]:
    return [SFTExample(p.ref_text, str(p.answer)) for p in skill_problems(family, "train")]


def _arith_examples(n: int = 100, seed: int = 0) -> list[SFTExample]:
    from engine.prompts.pairs import sample_problems

    return [SFTExample(p.ref_text, str(p.answer)) for p in sample_problems(["add", "sub", "mul", "div"], n, seed)]


def read_jsonl(path: Path) -> list[SFTExample]:
    if not path.is_file():
        raise FinetuneError(f"data file {path} does not exist (give a JSONL file of "
                            f"{{\"prompt\": ..., \"answer\": ...}} lines or one of {', '.join(BUILTIN_SETS)})")
    out: list[SFTExample] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise FinetuneError(f"cannot read {path}: {e}") from e
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise FinetuneError(f"{path}:{i}: not valid JSON ({e.msg})") from e
        if not isinstance(row, dict) or "prompt" not in row or "answer" not in row:
            raise FinetuneError(f"{path}:{i}: each line needs \"prompt\" and \"answer\" fields")
        prompt, answer = str(row["prompt"]), str(row["answer"]).strip()
        if not prompt.strip() or not answer:
            raise FinetuneError(f"{path}:{i}: empty prompt or answer")
        out.append(SFTExample(prompt, answer))
    if not out:
        raise FinetuneError(f"{path} holds no examples")
    return out


def load_sft_data(source: str, *, data_dir: str | Path | None = None, limit: int | None = None
                  ) -> list[SFTExample]:
    """Examples of a built-in set name or a JSONL path (see module docstring)."""
    if source in SKILL_SETS:
        out = _template_examples(source)
    elif source == "notation+replay":
        from engine.organism.recipe import control_prompts

        out = _template_examples("notation") + [SFTExample(p, a) for p, a in control_prompts(0)]
    elif source == "arith":
        out = _arith_examples()
    elif source in BENCH_SETS:
        from engine.evaluation.benchmarks import sft_examples

        try:
            rows = sft_examples(source, data_dir=data_dir, limit=limit)
        except (OSError, ValueError) as e:
            raise FinetuneError(str(e)) from e
        out = [SFTExample(str(r["prompt"]), str(r["answer"])) for r in rows]
    else:
        out = read_jsonl(Path(source))
    if limit is not None:
        out = out[:limit]
    return out


def data_hash(examples: Sequence[SFTExample]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.prompt, ex.answer]).encode())
    return h.hexdigest()[:16]
