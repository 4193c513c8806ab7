"""A prompt set: which prompts to generate (ops, families, n, seed, operand range), for one tokenizer.

The same :class:`PromptSetSpec` is used by the CLI, the pages and the cache key, so that a set is
described once and generated identically everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.prompts import (OperandRange, PromptError, PromptPair, build_pairs, sample_problems)
from engine.templates import FAMILIES, OPS, PAPER_FAMILIES, PAPER_OPS, WORD_PROBLEM_FAMILIES

FAMILY_GROUPS: dict[str, tuple[str, ...]] = {
    "paper": PAPER_FAMILIES,
    "word": WORD_PROBLEM_FAMILIES,
    # every family of the paper's operations plus exponentiation's own; the "notation" skill family
    # (typeset signs the bundled model was never taught) is only used when named
    "all": tuple(f for f in FAMILIES if f != "notation"),
}


def parse_ops(text: str) -> tuple[str, ...]:
    """``add`` / ``add,mul`` / ``all`` (= the paper's +, -, *, /) -> tuple of ops."""
    if text is None or not str(text).strip():
        raise PromptError("no operation given: choose add, sub, mul, div, pow or all")
    if text.strip() == "all":
        return PAPER_OPS
    ops = tuple(o.strip() for o in text.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise PromptError(f"unknown operation {', '.join(bad)}: choose from {', '.join(OPS)} or all")
    return ops


def parse_families(text: str) -> tuple[str, ...]:
    """``paper`` (default) / ``word`` / ``all`` / a comma list of family names."""
    if text in FAMILY_GROUPS:
        return FAMILY_GROUPS[text]
    fams = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        raise PromptError(f"unknown template family {', '.join(bad) or repr(text)}: choose paper, word, "
                          f"all or from {', '.join(FAMILIES)}")
    return fams


def parse_operands(text: str) -> tuple[int, int]:
    """``1-9`` -> (1, 9)."""
    try:
        lo, hi = (int(x) for x in text.split("-", 1))
    except ValueError as e:
        raise PromptError(f"operand range {text!r} is not of the form LO-HI, e.g. 1-9") from e
    return lo, hi


@dataclass(frozen=True)
class PromptSetSpec:
    ops: tuple[str, ...] = PAPER_OPS
    n: int = 100  # per op
    seed: int = 0
    families: tuple[str, ...] = PAPER_FAMILIES
    operand_lo: int = 1
    operand_hi: int = 9
    allow_negative: bool = False
    max_exponent: int = 3

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise PromptError(f"n must be a positive number of prompts, got {self.n}")
        if self.n > 100_000:
            raise PromptError(f"n={self.n} is too large: at most 100000 prompts per operation")
        parse_ops(",".join(self.ops))
        OperandRange(self.operand_lo, self.operand_hi, self.allow_negative, self.max_exponent)

    def to_params(self) -> dict[str, Any]:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["families"] = list(self.families)
        return d

    @property
    def operand_range(self) -> OperandRange:
        return OperandRange(self.operand_lo, self.operand_hi, self.allow_negative, self.max_exponent)


def generate(tokenizer, spec: PromptSetSpec) -> tuple[list[PromptPair], int]:
    """Tokenized pairs of the spec, and how many problems had to be dropped (no equal-length X_c)."""
    problems = sample_problems(spec.ops, spec.n, spec.seed, operands=spec.operand_range,
                               families=spec.families)
    pairs, dropped = build_pairs(tokenizer, problems)
    if not pairs:
        reason = dropped[0][1] if dropped else "no problems"
        raise PromptError(f"no usable prompt pairs for this tokenizer: {reason}")
    return pairs, len(dropped)
