"""Prompt templates of the arithmetic tasks (Zhang et al., ICML 2024, Section 3 and Figure 10).

The paper builds reference prompts X_r from 36 templates -- nine per operation (+, -, *, /), in three
surface forms: equations ("3 + 5 ="), statements ("The sum of 3 and 5 is") and question-answer
prompts ("Q: What is 3 plus 5? A:") -- and counterfactual prompts X_c of the same shape in which the
operation is removed ("3 @ 5 =", "The nothing of 3 and 5 is").  Figure 10 adds word problems
("time span", "object accumulation") to test whether the key heads transfer; we also ship
exponentiation templates, a skill the bundled model is *not* trained on (used by fine-tuning demos).

Template syntax: ``{A}`` and ``{B}`` are the operands, ``{N1}``/``{N2}`` person names, ``{OBJ}`` a
plural object, and exactly one ``[...]`` marks the operator slot -- the text that the counterfactual
replaces by a neutral word (``none``, ``nothing`` ...) when the slot is a word, or by a neutral
symbol (``@``, ``<`` ...) when it is a symbol.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Op = Literal["add", "sub", "mul", "div", "pow"]
OPS: tuple[Op, ...] = ("add", "sub", "mul", "div", "pow")
#: The paper's four operations; ``all`` in the CLI means these.
PAPER_OPS: tuple[Op, ...] = ("add", "sub", "mul", "div")
OP_SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}

#: Surface forms.  The first three are the paper's 36 templates, the next two its Figure 10.
PAPER_FAMILIES: tuple[str, ...] = ("equation", "statement", "qa")
WORD_PROBLEM_FAMILIES: tuple[str, ...] = ("time_span", "object_accumulation")
#: Families the bundled organism never saw: skills to teach by fine-tuning (engine/skill.py).
SKILL_FAMILIES: tuple[str, ...] = ("notation", "power")
FAMILIES: tuple[str, ...] = PAPER_FAMILIES + WORD_PROBLEM_FAMILIES + SKILL_FAMILIES

#: Neutral fillers that replace the operator slot in counterfactual prompts.
CF_WORDS: tuple[str, ...] = ("none", "nothing", "null", "blank", "void")
CF_SYMBOLS: tuple[str, ...] = ("@", "<", ">", "#", "&", "|")

NAMES: tuple[str, ...] = (
    "Anna", "Ben", "Carl", "Dana", "Emma", "Fred", "Gina", "Hugo", "Iris", "Jack", "Kate", "Leo",
)
OBJECTS: tuple[str, ...] = (
    "apples", "pens", "books", "cards", "coins", "eggs", "balls", "cups", "shells", "stamps",
)

_SLOT = re.compile(r"\[([^\[\]]+)\]")


@dataclass(frozen=True)
class Template:
    """One prompt template.  ``text`` holds the ``[operator]`` slot markup."""

    id: str
    op: Op
    family: str
    text: str

    @property
    def operator(self) -> str:
        """The operator slot's text, e.g. ``+`` or ``sum``."""
        return _SLOT.search(self.text).group(1)  # type: ignore[union-attr]

    @property
    def operator_is_symbol(self) -> bool:
        return not self.operator.isalpha()

    @property
    def needs_names(self) -> bool:
        return "{N1}" in self.text or "{N2}" in self.text

    @property
    def needs_object(self) -> bool:
        return "{OBJ}" in self.text

    def render(self, a: int, b: int, *, filler: str | None = None, n1: str = "", n2: str = "",
               obj: str = "") -> str:
        """The prompt with operands filled in; ``filler`` replaces the operator (counterfactual)."""
        slot = filler if filler is not None else self.operator
        text = _SLOT.sub(slot, self.text, count=1)
        return (text.replace("{A}", str(a)).replace("{B}", str(b)).replace("{N1}", n1)
                .replace("{N2}", n2).replace("{OBJ}", obj))


def _t(op: Op, family: str, texts: tuple[str, ...]) -> list[Template]:
    return [Template(f"{op}.{family}.{i}", op, family, t) for i, t in enumerate(texts)]


_EQUATIONS = ("{A} [%s] {B} =", "{A} [%s] {B} equals", "Calculate {A} [%s] {B} =")

TEMPLATES: tuple[Template, ...] = tuple(
    # ---- the paper's 36: 9 per operation -------------------------------------------------------
    _t("add", "equation", tuple(e % "+" for e in _EQUATIONS))
    + _t("add", "statement", (
        "The [sum] of {A} and {B} is",
        "{A} [plus] {B} is equal to",
        "If you [add] {B} to {A}, the result is",
    ))
    + _t("add", "qa", (
        "Q: What is {A} [plus] {B}? A:",
        "Question: What is the [sum] of {A} and {B}? Answer:",
        "Q: How much is {A} [plus] {B}? A:",
    ))
    + _t("sub", "equation", tuple(e % "-" for e in _EQUATIONS))
    + _t("sub", "statement", (
        "The [difference] between {A} and {B} is",
        "{A} [minus] {B} is equal to",
        "If you [subtract] {B} from {A}, the result is",
    ))
    + _t("sub", "qa", (
        "Q: What is {A} [minus] {B}? A:",
        "Question: What is the [difference] between {A} and {B}? Answer:",
        "Q: How much is {A} [minus] {B}? A:",
    ))
    + _t("mul", "equation", tuple(e % "*" for e in _EQUATIONS))
    + _t("mul", "statement", (
        "The [product] of {A} and {B} is",
        "{A} [times] {B} is equal to",
        "If you [multiply] {A} by {B}, the result is",
    ))
    + _t("mul", "qa", (
        "Q: What is {A} [times] {B}? A:",
        "Question: What is the [product] of {A} and {B}? Answer:",
        "Q: How much is {A} [times] {B}? A:",
    ))
    + _t("div", "equation", tuple(e % "/" for e in _EQUATIONS))
    + _t("div", "statement", (
        "The [quotient] of {A} and {B} is",
        "{A} [divided] by {B} is equal to",
        "If you [divide] {A} by {B}, the result is",
    ))
    + _t("div", "qa", (
        "Q: What is {A} [divided] by {B}? A:",
        "Question: What is the [quotient] of {A} and {B}? Answer:",
        "Q: How much is {A} [divided] by {B}? A:",
    ))
    # ---- Figure 10: word problems ----------------------------------------------------------------
    + _t("add", "time_span", (
        "The movie starts at {A} o'clock and runs for {B} hours, so it [ends] at",
        "A train leaves at {A} o'clock and travels for {B} hours. It [arrives] at",
    ))
    + _t("sub", "time_span", (
        "The movie finishes at {A} o'clock after running for {B} hours, so it [started] at",
        "A train stops at {A} o'clock after a trip of {B} hours. It [left] at",
    ))
    + _t("add", "object_accumulation", (
        "{N1} has {A} {OBJ}. {N2} [gives] {N1} {B} {OBJ}. Now {N1} has",
        "There are {A} {OBJ} in a box. {N1} [puts] {B} {OBJ} in the box. Now the box has",
    ))
    + _t("sub", "object_accumulation", (
        "{N1} has {A} {OBJ}. {N2} [takes] {B} {OBJ} from {N1}. Now {N1} has",
        "There are {A} {OBJ} in a box. {N1} [removes] {B} {OBJ} from the box. Now the box has",
    ))
    # ---- notations the organism never trained on: typeset operator signs and "x" / "over" --------
    + _t("sub", "notation", ("{A} [−] {B} =", "compute {A} [−] {B} :"))
    + _t("mul", "notation", ("{A} [×] {B} =", "{A} [x] {B} ="))
    + _t("div", "notation", ("{A} [÷] {B} =", "{A} [over] {B} ="))
    # ---- exponentiation (not in the paper; a skill to teach by fine-tuning) --------------------
    + _t("pow", "power", (
        "{A} [^] {B} =",
        "{A} to the [power] of {B} equals",
    ))
)

TEMPLATES_BY_ID: dict[str, Template] = {t.id: t for t in TEMPLATES}

#: Every word or symbol that names an operation; a counterfactual prompt contains none of them.
OPERATOR_TERMS: frozenset[str] = frozenset(t.operator for t in TEMPLATES)


def templates_for(ops: tuple[str, ...] | list[str], families: tuple[str, ...] | list[str] | None = None
                  ) -> list[Template]:
    """Templates of the given operations and families (``None``: every family of those ops)."""
    unknown_ops = [o for o in ops if o not in OPS]
    if unknown_ops:
        raise ValueError(f"unknown operation(s) {unknown_ops}: choose from {', '.join(OPS)}")
    if families is not None:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown template famil(ies) {unknown}: choose from {', '.join(FAMILIES)}")
    return [t for t in TEMPLATES if t.op in ops and (families is None or t.family in families)]


def paper_templates() -> list[Template]:
    """The paper's 36 templates (9 per operation)."""
    return [t for t in TEMPLATES if t.family in PAPER_FAMILIES]
