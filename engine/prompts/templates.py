"""Prompt templates of the arithmetic tasks (Zhang et al., ICML 2024, Figure 8 and Figure 10).

**Family ``paper`` (Figure 8, verbatim).**  The paper builds reference prompts X_r from templates
listed in its Figure 8, shown there for addition; the other operations swap the operation's words
(minus / subtraction / difference, times / multiplication / product, over / division / ratio) and
the symbol (- * /).  The extracted figure shows nine rows per operation, one of them repeated, so
eight *distinct* templates per operation (32 in all) are recoverable; we do not invent a ninth.

**Families ``time_span`` and ``object_accumulation`` (Figure 10).**  The paper's twelve addition
word-problem templates test whether the key heads transfer.  Only one skeleton of each kind is
recoverable here (the figure itself is not available offline), shipped verbatim:

* time span -- "The <EVENT> <VERB> {A} years from the year <YYY>{B} to the year <YYY>{C}": the
  prompt ends at "to the year <YYY>" and the answer C = A + B is the last digit of the end year,
  written with no space before it (so A + B <= 9 for this template);
* object accumulation -- "<NAME> has {A} <OBJECT>, then <NAME> <VERB> {B} <OBJECT>. What's the
  total number of <OBJECT> that <NAME> has? The answer is {C}".

The slot words (EVENT, VERB, YYY, NAME, OBJECT pools below) are the project's: plausible words,
each a single word.  The other ten templates of Figure 10 are not recoverable and not invented.

**Family ``extended`` (the project's own, never the paper's).**  Equation, statement and
question-answer phrasings and word problems written for this project ("Calculate {A} + {B} =",
"If you add {B} to {A}, the result is", "A train leaves at {A} o'clock ..."): more surface forms to
train and test the bundled model on.  **``notation``** (typeset signs) and **``power``**
(exponentiation) are skills the bundled model is *not* trained on (used by fine-tuning demos).

**Counterfactuals** (Section 3 / Appendix A): X_c keeps the template and operands but removes the
operation -- the operator slot is replaced by a neutral word (``none``, ``nothing`` ...) when it is
a word, by a neutral symbol (``@``, ``<`` ...) when it is a symbol.  In the word problems the
operation is named by the verb ("lasted", "buys"), so the verb is the operator slot:
"Anna has 3 pens, then Anna none 5 pens. ..." states no accumulation.

Template syntax: ``{A}`` and ``{B}`` are the operands; other ``{NAME}``-style slots are filled from
:data:`SLOT_POOLS` (``{N1}``/``{N2}`` are two different names); exactly one ``[...]`` marks the
operator slot, which may itself be a pooled slot (``[{VERB}]``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal, Mapping

Op = Literal["add", "sub", "mul", "div", "pow"]
OPS: tuple[Op, ...] = ("add", "sub", "mul", "div", "pow")
#: The paper's four operations; ``all`` in the CLI means these.
PAPER_OPS: tuple[Op, ...] = ("add", "sub", "mul", "div")
OP_SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}

#: Figure 8 (the paper's own templates, verbatim).
PAPER_FAMILIES: tuple[str, ...] = ("paper",)
#: Figure 10 (the recoverable word-problem skeletons, verbatim).
WORD_PROBLEM_FAMILIES: tuple[str, ...] = ("time_span", "object_accumulation")
#: The project's own phrasings, trained and tested but never called the paper's.
EXTENDED_FAMILIES: tuple[str, ...] = ("extended",)
#: Families the bundled organism never saw: skills to teach by fine-tuning (engine/organism/skill_demo.py).
SKILL_FAMILIES: tuple[str, ...] = ("notation", "power")
FAMILIES: tuple[str, ...] = PAPER_FAMILIES + WORD_PROBLEM_FAMILIES + EXTENDED_FAMILIES + SKILL_FAMILIES

#: Neutral fillers that replace the operator slot in counterfactual prompts.
CF_WORDS: tuple[str, ...] = ("none", "nothing", "null", "blank", "void")
CF_SYMBOLS: tuple[str, ...] = ("@", "<", ">", "#", "&", "|")

NAMES: tuple[str, ...] = (
    "Anna", "Ben", "Carl", "Dana", "Emma", "Fred", "Gina", "Hugo", "Iris", "Jack", "Kate", "Leo",
)
OBJECTS: tuple[str, ...] = (
    "apples", "pens", "books", "cards", "coins", "eggs", "balls", "cups", "shells", "stamps",
)
#: Slot vocabularies (ours: the paper's "..." filled with plausible single words).
SLOT_POOLS: dict[str, tuple[str, ...]] = {
    "N1": NAMES, "N2": NAMES, "NAME": NAMES, "OBJ": OBJECTS, "OBJECT": OBJECTS,
    "EVENT": ("war", "festival", "drought", "expedition", "campaign", "project", "strike", "reign"),
    "SPAN_VERB": ("lasted", "ran", "continued", "went"),
    "ACC_VERB": ("buys", "gets", "finds", "receives", "collects", "wins"),
    "YYY": ("175", "180", "186", "190", "194", "196", "198", "199", "200", "201"),
}

_SLOT = re.compile(r"\[([^\[\]]+)\]")
_FIELD = re.compile(r"\{([A-Z][A-Z0-9_]*)\}")


@dataclass(frozen=True)
class Template:
    """One prompt template.  ``text`` holds the ``[operator]`` slot markup.

    ``answer_sep`` is what separates the prompt from its answer ("" when the answer continues a
    number, as the end year of the time-span problems); ``max_answer`` limits the answer (the
    time-span answer is one digit).
    """

    id: str
    op: Op
    family: str
    text: str
    answer_sep: str = " "
    max_answer: int | None = None

    @property
    def operator(self) -> str:
        """The operator slot's text, e.g. ``+``, ``sum`` or ``{ACC_VERB}``."""
        return _SLOT.search(self.text).group(1)  # type: ignore[union-attr]

    @property
    def operator_is_symbol(self) -> bool:
        return not any(c.isalpha() for c in self.operator)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The pooled slots of the template (not the operands), in order of first appearance."""
        return tuple(dict.fromkeys(s for s in _FIELD.findall(self.text) if s not in ("A", "B")))

    def operator_words(self) -> tuple[str, ...]:
        """Every word the operator slot can take (a pooled slot: its whole pool)."""
        m = _FIELD.fullmatch(self.operator)
        return SLOT_POOLS[m.group(1)] if m else (self.operator,)

    def render(self, a: int, b: int, *, filler: str | None = None,
               slots: Mapping[str, str] | None = None) -> str:
        """The prompt with operands and slots filled in; ``filler`` replaces the operator (X_c)."""
        slot = filler if filler is not None else self.operator
        text = _SLOT.sub(lambda _: slot, self.text, count=1).replace("{A}", str(a)).replace("{B}", str(b))
        values = slots or {}
        missing = [s for s in _FIELD.findall(text) if s not in values]
        if missing:
            raise ValueError(f"template {self.id} needs slot word(s) for {missing}")
        return _FIELD.sub(lambda m: values[m.group(1)], text)


def fill_slots(template: Template, rng: random.Random) -> tuple[tuple[str, str], ...]:
    """Seeded slot words for one instance; slots sharing a pool get different words (N1 != N2)."""
    used: set[str] = set()
    out = []
    for name in template.slot_names:
        word = rng.choice([w for w in SLOT_POOLS[name] if w not in used])
        used.add(word)
        out.append((name, word))
    return tuple(out)


def _t(op: Op, family: str, texts: tuple[str, ...], **kw) -> list[Template]:
    return [Template(f"{op}.{family}.{i}", op, family, t, **kw) for i, t in enumerate(texts)]


def _figure8(symbol: str, word: str, noun: str, result: str) -> tuple[str, ...]:
    """Figure 8's eight distinct rows for one operation (addition: +, plus, addition, sum)."""
    return (
        f"{{A}} [{symbol}] {{B}} =",
        f"{{A}} [{word}] {{B}} equals to",
        f"The [{noun}] of {{A}} and {{B}} is",
        f"The [{noun}] of {{A}} and {{B}} equals to",
        f"Q: How much is {{A}} [{word}] {{B}}? A:",
        f"Q: What is {{A}} [{word}] {{B}}? A:",
        f"Q: What is the result of {{A}} [{word}] {{B}}? A:",
        f"Q: What is the [{result}] of {{A}} and {{B}}? A:",
    )


_EQUATIONS = ("{A} [%s] {B} =", "{A} [%s] {B} equals", "Calculate {A} [%s] {B} =")

TEMPLATES: tuple[Template, ...] = tuple(
    # ---- Figure 8: the paper's templates, 8 distinct per operation -----------------------------
    _t("add", "paper", _figure8("+", "plus", "addition", "sum"))
    + _t("sub", "paper", _figure8("-", "minus", "subtraction", "difference"))
    + _t("mul", "paper", _figure8("*", "times", "multiplication", "product"))
    + _t("div", "paper", _figure8("/", "over", "division", "ratio"))
    # ---- Figure 10: the recoverable word-problem skeletons ---------------------------------------
    + _t("add", "time_span", (
        "The {EVENT} [{SPAN_VERB}] {A} years from the year {YYY}{B} to the year {YYY}",
    ), answer_sep="", max_answer=9)
    + _t("add", "object_accumulation", (
        "{NAME} has {A} {OBJECT}, then {NAME} [{ACC_VERB}] {B} {OBJECT}. What's the total number of "
        "{OBJECT} that {NAME} has? The answer is",
    ))
    # ---- the project's own templates (not the paper's) -------------------------------------------
    + _t("add", "extended", tuple(e % "+" for e in _EQUATIONS) + (
        "The [sum] of {A} and {B} is",
        "{A} [plus] {B} is equal to",
        "If you [add] {B} to {A}, the result is",
        "Question: What is the [sum] of {A} and {B}? Answer:",
        "The movie starts at {A} o'clock and runs for {B} hours, so it [ends] at",
        "A train leaves at {A} o'clock and travels for {B} hours. It [arrives] at",
        "{N1} has {A} {OBJ}. {N2} [gives] {N1} {B} {OBJ}. Now {N1} has",
        "There are {A} {OBJ} in a box. {N1} [puts] {B} {OBJ} in the box. Now the box has",
    ))
    + _t("sub", "extended", tuple(e % "-" for e in _EQUATIONS) + (
        "The [difference] between {A} and {B} is",
        "{A} [minus] {B} is equal to",
        "If you [subtract] {B} from {A}, the result is",
        "Question: What is the [difference] between {A} and {B}? Answer:",
        "The movie finishes at {A} o'clock after running for {B} hours, so it [started] at",
        "A train stops at {A} o'clock after a trip of {B} hours. It [left] at",
        "{N1} has {A} {OBJ}. {N2} [takes] {B} {OBJ} from {N1}. Now {N1} has",
        "There are {A} {OBJ} in a box. {N1} [removes] {B} {OBJ} from the box. Now the box has",
    ))
    + _t("mul", "extended", tuple(e % "*" for e in _EQUATIONS) + (
        "The [product] of {A} and {B} is",
        "{A} [times] {B} is equal to",
        "If you [multiply] {A} by {B}, the result is",
        "Question: What is the [product] of {A} and {B}? Answer:",
    ))
    + _t("div", "extended", tuple(e % "/" for e in _EQUATIONS) + (
        "The [quotient] of {A} and {B} is",
        "{A} [divided] by {B} is equal to",
        "If you [divide] {A} by {B}, the result is",
        "Question: What is the [quotient] of {A} and {B}? Answer:",
    ))
    # ---- notations the organism never trained on: typeset operator signs, "x" and "over" -------
    # ("over" is also Figure 8's division word, so the bundled model knows that one template)
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
OPERATOR_TERMS: frozenset[str] = frozenset(w for t in TEMPLATES for w in t.operator_words())


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
    """The paper's Figure 8 templates (8 distinct per operation, 32)."""
    return [t for t in TEMPLATES if t.family in PAPER_FAMILIES]
