"""Arithmetic SFT data with nothing shared with the evaluation: held-out operand pairs *and* templates.

Training on the same Figure 8 templates and operands that the accuracy is read from measures
memory as much as skill.  This split (used by ``bench/improve.py``) keeps them apart:

* **operand pairs**: a third of the (A, B) pairs (a hash of the pair, so the rule never depends on
  sampling order) are *test* operands, never trained on;
* **templates**: three of the eight Figure 8 templates of each operation (:data:`HELD_OUT`:
  "{A} plus {B} equals to", "The addition of {A} and {B} equals to", "Q: What is the result of
  {A} plus {B}? A:" and their -, *, / twins) are *test* templates, never trained on;
* **train**: the other five Figure 8 templates plus the project's ``extended`` family, train
  operands only (``n`` per operation, seeded);
* **validation**: the training templates on the test operands (picks learning rates);
* **test**: the held-out templates on the test operands;
* **word**: the Figure 10 word problems (time span, object accumulation), never trained on.
"""

from __future__ import annotations

import hashlib
import random

from engine.prompts.pairs import OperandRange, Problem, make_problem, template_operands
from engine.prompts.templates import EXTENDED_FAMILIES, PAPER_FAMILIES, PAPER_OPS, WORD_PROBLEM_FAMILIES, templates_for

#: Figure 8 row numbers (0-based, as in ``engine.prompts.templates._figure8``) held out of training.
HELD_OUT: tuple[int, ...] = (1, 3, 6)
#: 1 in TEST_MOD operand pairs is a test pair.
TEST_MOD = 3
SPLITS: tuple[str, ...] = ("train", "val", "test", "word")


def test_operands(a: int, b: int) -> bool:
    return hashlib.sha256(f"operands|{a}|{b}".encode()).digest()[0] % TEST_MOD == 0


def _held_out(template_id: str) -> bool:
    _, family, row = template_id.split(".")
    return family in PAPER_FAMILIES and int(row) in HELD_OUT


def split_problems(split: str, *, n: int | None = None, seed: int = 0,
                   operands: OperandRange | None = None) -> list[Problem]:
    """The problems of ``split`` (module docstring); ``n`` per operation (seeded sample), None = all."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: choose from {', '.join(SPLITS)}")
    r = operands or OperandRange()
    if split == "word":
        tpls = templates_for(list(PAPER_OPS), list(WORD_PROBLEM_FAMILIES))
    else:
        tpls = [t for t in templates_for(list(PAPER_OPS), list(PAPER_FAMILIES + EXTENDED_FAMILIES))
                if (split == "test") == _held_out(t.id) and (split != "test" or t.family in PAPER_FAMILIES)]
    want_test_operands = split in ("val", "test")
    rng = random.Random(seed)
    out: list[Problem] = []
    for op in PAPER_OPS:
        combos = [(t, a, b) for t in tpls if t.op == op for a, b in template_operands(t, r)
                  if split == "word" or test_operands(a, b) == want_test_operands]
        rng.shuffle(combos)
        out.extend(make_problem(t, a, b, rng) for t, a, b in (combos if n is None else combos[:n]))
    return out


__all__ = ["HELD_OUT", "SPLITS", "TEST_MOD", "split_problems", "test_operands"]
