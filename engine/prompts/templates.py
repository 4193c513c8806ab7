"""Prompt templates of the arithmetic tasks (Zhang et al., ICML 2024, Appendix A, Figures 8-10).

**Family ``paper`` (Figure 8, verbatim).**  Nine rows per operation are printed, one of them twice
("The addition of {A} and {B} equals to"), so eight *distinct* templates per operation (32 in all);
the operation's words are the paper's: plus / addition / sum, minus / difference, times / product,
over / ratio, and the signs + - * /.  :meth:`Template.as_printed` writes a template in the paper's
notation; a test compares every one with ``../shared/paper/zhang2024.md``.

**Families ``time_span`` (Figure 10, templates 1-8) and ``object_accumulation`` (9-12), verbatim.**
Their slots come from the paper's pools, which it prints with an ellipsis; the words it prints are
kept and the rest completed in the same spirit (:data:`PAPER_POOL_WORDS` lists the paper's own):
<EVENT> from {"war", "conflict", ..., "project"}, <VERB> from {"last", "span", ..., "extend"},
<MONTH> from {"Jan.", ..., "Dec."}, <YYY> from {100, ..., 199} (so "the year <YYY>{B}" reads
"the year 1894"), <OBJECT> from {"apple", "orange", ..., "pear"}, the accumulation <VERB> from
{"get", "obtain", ..., "acquire"}, <NAME> from 100 English first names.  The pools hold lemmas; a
template writes the verb in the form its grammar needs ("lasted", "will last"; "gets", "they get",
"got ... yesterday") and the object in the plural ("3 apples").  Where the answer continues a
number (the end year "<YYY>{C}") it follows with no space and is one digit (A + B <= 9); the hour
templates keep C <= 12.

**Counterfactuals** (Section 3, Appendix A): X_c keeps the template and operands but removes the
operation -- the operator slot ``[...]`` is replaced by a neutral word (the paper's {"none",
"nothing", ..., "null"}) when it is a word, by a neutral symbol ({"<", ">", ..., "@"}) when it is a
symbol; in the time-span problems the verb is the operator slot.  The object-accumulation
counterfactual follows Figure 9 ("Mary has 3 apples, then Mary gains 4 cups. What is the total number
of tables that John has?"): the starred slots ``{OBJECT*}``, ``{NAME*}`` take *other* words of their
pool, so that nothing accumulates.

**Family ``extended`` (the project's own, never the paper's).**  Equation, statement and
question-answer phrasings and word problems written for this project ("Calculate {A} + {B} =",
"If you add {B} to {A}, the result is", "A train leaves at {A} o'clock ..."): more surface forms to
train and test the bundled model on.  **``notation``** (typeset signs) and **``power``**
(exponentiation) are skills the bundled model is *not* trained on (used by fine-tuning demos).

Template syntax: ``{A}`` and ``{B}`` are the operands; other ``{NAME}``-style slots are filled from
:data:`SLOT_POOLS` (slots sharing a pool get different words: ``{NAME}`` != ``{NAME2}``; the forms of
one verb, :data:`VERB_FORMS`, share its lemma); at most one ``[...]`` marks the operator slot, which
may itself be a pooled slot (``[{SPAN_VERB}]``); a ``*`` marks a slot the counterfactual swaps.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Mapping

Op = Literal["add", "sub", "mul", "div", "pow"]
OPS: tuple[Op, ...] = ("add", "sub", "mul", "div", "pow")
#: The paper's four operations; ``all`` in the CLI means these.
PAPER_OPS: tuple[Op, ...] = ("add", "sub", "mul", "div")
OP_SYMBOLS: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}

#: Figure 8 (the paper's own templates, verbatim).
PAPER_FAMILIES: tuple[str, ...] = ("paper",)
#: Figure 10 (time span 1-8, object accumulation 9-12, verbatim).
WORD_PROBLEM_FAMILIES: tuple[str, ...] = ("time_span", "object_accumulation")
#: The project's own phrasings, trained and tested but never called the paper's.
EXTENDED_FAMILIES: tuple[str, ...] = ("extended",)
#: Families the bundled organism never saw: skills to teach by fine-tuning (engine/finetune/skill_demo.py).
SKILL_FAMILIES: tuple[str, ...] = ("notation", "power")
FAMILIES: tuple[str, ...] = PAPER_FAMILIES + WORD_PROBLEM_FAMILIES + EXTENDED_FAMILIES + SKILL_FAMILIES

#: Neutral fillers that replace the operator slot in counterfactual prompts.
CF_WORDS: tuple[str, ...] = ("none", "nothing", "null", "blank", "void")
CF_SYMBOLS: tuple[str, ...] = ("@", "<", ">", "#", "&", "|")

#: Names of the project's own templates, distractors and the bundled model's control facts.
NAMES: tuple[str, ...] = (
    "Anna", "Ben", "Carl", "Dana", "Emma", "Fred", "Gina", "Hugo", "Iris", "Jack", "Kate", "Leo",
)
OBJECTS: tuple[str, ...] = (
    "apples", "pens", "books", "cards", "coins", "eggs", "balls", "cups", "shells", "stamps",
)
#: Figure 10's <NAME>: "a pool of 100 English first names" (Mary and John are Figure 9's).
PAPER_NAMES: tuple[str, ...] = (
    "Mary", "John", "James", "Robert", "Michael", "William", "David", "Richard", "Joseph", "Thomas",
    "Charles", "Daniel", "Matthew", "Anthony", "Mark", "Paul", "Steven", "Andrew", "Kenneth", "Joshua",
    "Kevin", "Brian", "George", "Edward", "Ronald", "Timothy", "Jason", "Jeffrey", "Ryan", "Jacob",
    "Gary", "Nicholas", "Eric", "Jonathan", "Stephen", "Larry", "Justin", "Scott", "Brandon", "Benjamin",
    "Samuel", "Gregory", "Frank", "Alexander", "Raymond", "Patrick", "Jack", "Dennis", "Jerry", "Tyler",
    "Patricia", "Jennifer", "Linda", "Elizabeth", "Barbara", "Susan", "Jessica", "Sarah", "Karen", "Nancy",
    "Lisa", "Betty", "Margaret", "Sandra", "Ashley", "Kimberly", "Emily", "Donna", "Michelle", "Dorothy",
    "Carol", "Amanda", "Melissa", "Deborah", "Stephanie", "Rebecca", "Sharon", "Laura", "Cynthia", "Kathleen",
    "Amy", "Angela", "Shirley", "Anna", "Brenda", "Pamela", "Emma", "Nicole", "Helen", "Samantha",
    "Katherine", "Christine", "Debra", "Rachel", "Carolyn", "Janet", "Catherine", "Maria", "Heather", "Diane",
)
#: Figure 10's <OBJECT> ("apple", "orange", ..., "pear"; cups and tables are Figure 9's), plural.
PAPER_OBJECTS: tuple[str, ...] = (
    "apples", "oranges", "pears", "bananas", "peaches", "lemons", "cherries", "plums", "cups", "tables",
    "books", "pens", "balls", "coins", "eggs", "cards",
)
#: Verb lemmas and their forms (base, third person, past); a template names the form by its slot.
VERB_FORMS: dict[str, dict[str, tuple[str, str, str]]] = {
    # time span <VERB>: "last", "span", ..., "extend"
    "SPAN_VERB": {"last": ("last", "lasts", "lasted"), "span": ("span", "spans", "spanned"),
                  "run": ("run", "runs", "ran"), "continue": ("continue", "continues", "continued"),
                  "extend": ("extend", "extends", "extended")},
    # object accumulation <VERB>: "get", "obtain", ..., "acquire" (Figure 9: "gains")
    "ACC_VERB": {"get": ("get", "gets", "got"), "obtain": ("obtain", "obtains", "obtained"),
                 "gain": ("gain", "gains", "gained"), "buy": ("buy", "buys", "bought"),
                 "receive": ("receive", "receives", "received"), "collect": ("collect", "collects", "collected"),
                 "find": ("find", "finds", "found"), "acquire": ("acquire", "acquires", "acquired")},
}
#: Slot name -> (verb, form): ``{SPAN_VERB_PAST}`` "lasted", ``{SPAN_VERB}`` "last", ``{ACC_VERB_S}`` "gets".
_FORM_SUFFIX = {"": 0, "_S": 1, "_PAST": 2}
VERB_SLOTS: dict[str, tuple[str, int]] = {v + suffix: (v, i) for v in VERB_FORMS for suffix, i in _FORM_SUFFIX.items()}
#: Slot vocabularies.  Figure 10's pools are the paper's words completed in the same spirit
#: (:data:`PAPER_POOL_WORDS`); ``N1``/``N2``/``OBJ`` serve the project's own templates.
SLOT_POOLS: dict[str, tuple[str, ...]] = {
    "N1": NAMES, "N2": NAMES, "OBJ": OBJECTS,
    "NAME": PAPER_NAMES, "NAME2": PAPER_NAMES, "OBJECT": PAPER_OBJECTS,
    "EVENT": ("war", "conflict", "festival", "drought", "expedition", "campaign", "strike", "journey",
              "project"),
    "MONTH": ("Jan.", "Feb.", "Mar.", "Apr.", "May", "Jun.", "Jul.", "Aug.", "Sep.", "Oct.", "Nov.", "Dec."),
    "YYY": tuple(str(y) for y in range(100, 200)),
    **{slot: tuple(forms[i] for forms in VERB_FORMS[v].values()) for slot, (v, i) in VERB_SLOTS.items()},
}
#: The words of each Figure 10 pool that the paper prints (Appendix A; Figure 9 for cups, tables, gain).
PAPER_POOL_WORDS: dict[str, tuple[str, ...]] = {
    "EVENT": ("war", "conflict", "project"), "SPAN_VERB": ("last", "span", "extend"),
    "MONTH": ("Jan.", "Feb.", "Dec."), "YYY": ("100", "199"),
    "OBJECT": ("apples", "oranges", "pears", "cups", "tables"), "ACC_VERB": ("get", "obtain", "gain", "acquire"),
    "NAME": ("Mary", "John"),
}

_SLOT = re.compile(r"\[([^\[\]]+)\]")
_FIELD = re.compile(r"\{([A-Z][A-Z0-9_]*)\*?\}")
_SWAPPED = re.compile(r"\{([A-Z][A-Z0-9_]*)\*\}")


@dataclass(frozen=True)
class Template:
    """One prompt template.  ``text`` holds the ``[operator]`` slot and ``{SLOT*}`` swap markup.

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
        """The operator slot's text, e.g. ``+``, ``sum`` or ``{SPAN_VERB_PAST}``; "" when the template
        has none (its counterfactual swaps slots instead)."""
        m = _SLOT.search(self.text)
        return m.group(1) if m else ""

    @property
    def operator_is_symbol(self) -> bool:
        return bool(self.operator) and not any(c.isalpha() for c in self.operator)

    @property
    def swapped_slots(self) -> tuple[str, ...]:
        """The slots the counterfactual gives other words (Figure 9), one per starred occurrence, in order."""
        return tuple(_SWAPPED.findall(self.text))

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The pooled slots of the template (not the operands), in order of first appearance."""
        return tuple(dict.fromkeys(s for s in _FIELD.findall(self.text) if s not in ("A", "B")))

    def operator_words(self) -> tuple[str, ...]:
        """Every word the operator slot can take (a pooled slot: its whole pool)."""
        if not self.operator:
            return ()
        m = _FIELD.fullmatch(self.operator)
        return SLOT_POOLS[m.group(1)] if m else (self.operator,)

    def render(self, a: int | float, b: int | float, *, filler: str | None = None, swaps: tuple[str, ...] | None = None,
               slots: Mapping[str, str] | None = None) -> str:
        """The prompt with operands and slots filled in.  X_c: ``filler`` replaces the operator, or
        ``swaps`` the starred slots (one word each, in order)."""
        text = self.text
        if self.operator:
            slot = filler if filler is not None else self.operator
            text = _SLOT.sub(lambda _: slot, text, count=1)
        if swaps is not None:
            if len(swaps) != len(self.swapped_slots):
                raise ValueError(f"template {self.id} swaps {len(self.swapped_slots)} slot(s), "
                                 f"got {len(swaps)} word(s)")
            it = iter(swaps)
            text = _SWAPPED.sub(lambda _: next(it), text)
        text = text.replace("{A}", str(a)).replace("{B}", str(b))
        values = slots or {}
        missing = [s for s in _FIELD.findall(text) if s not in values]
        if missing:
            raise ValueError(f"template {self.id} needs slot word(s) for {missing}")
        return _FIELD.sub(lambda m: values[m.group(1)], text)

    def as_printed(self) -> str:
        """The template in the paper's notation (Appendix A): ``<EVENT> <VERB> {A} ... <YYY>{C}``,
        the answer ``{C}`` written where the paper writes it (not after a "Q: ... A:" row)."""
        def slot(m: re.Match) -> str:
            name = m.group(1)
            if name in ("A", "B"):
                return m.group(0)
            return "<VERB>" if name in VERB_SLOTS else f"<{name}>"
        text = _FIELD.sub(slot, _SLOT.sub(lambda m: m.group(1), self.text))
        return text if text.endswith("A:") else f"{text}{self.answer_sep}{{C}}"


def fill_slots(template: Template, rng: random.Random) -> tuple[tuple[str, str], ...]:
    """Seeded slot words for one instance; slots sharing a pool get different words (NAME != NAME2)
    and the forms of one verb share its lemma (``{ACC_VERB_S}`` gets, ``{ACC_VERB}`` get)."""
    used: set[str] = set()
    lemma: dict[str, int] = {}
    out = []
    for name in template.slot_names:
        if name in VERB_SLOTS:
            verb, form = VERB_SLOTS[name]
            forms = list(VERB_FORMS[verb].values())
            lemma.setdefault(verb, rng.randrange(len(forms)))
            word = forms[lemma[verb]][form]
        else:
            word = rng.choice([w for w in SLOT_POOLS[name] if w not in used])
        used.add(word)
        out.append((name, word))
    return tuple(out)


def swap_words(template: Template, slots: tuple[tuple[str, str], ...], rng: random.Random,
               k: int = 6) -> tuple[tuple[str, ...], ...]:
    """``k`` seeded choices of words for the starred slots (Figure 9's X_c): each a word of the slot's
    pool that appears nowhere in X_r and differs from the other swapped words."""
    taken = {w for _, w in slots}
    out = []
    for _ in range(k):
        chosen: list[str] = []
        for name in template.swapped_slots:
            chosen.append(rng.choice([w for w in SLOT_POOLS[name] if w not in taken and w not in chosen]))
        out.append(tuple(chosen))
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


def _time_span() -> list[Template]:
    """Figure 10, templates 1-8 ("time span"): the verb is the operator slot."""
    past, will = "[{SPAN_VERB_PAST}]", "will [{SPAN_VERB}]"
    years = (f"The {{EVENT}} {past} {{A}} years from the year {{YYY}}{{B}} to the year {{YYY}}",
             f"The {{EVENT}} {past} {{A}} years from {{YYY}}{{B}} to {{YYY}}")
    days = tuple(f"The {{EVENT}} {v} {{A}} days from {{MONTH}} {{B}} to {{MONTH}}" for v in (past, will))
    hours = tuple(f"The {{EVENT}} {v} {{A}} hours from {{B}} {m} to" for m in ("pm", "am") for v in (past, will))
    return (_t("add", "time_span", years, answer_sep="", max_answer=9)
            + [Template(f"add.time_span.{2 + i}", "add", "time_span", t) for i, t in enumerate(days)]
            + [Template(f"add.time_span.{4 + i}", "add", "time_span", t, max_answer=12) for i, t in enumerate(hours)])


TEMPLATES: tuple[Template, ...] = tuple(
    # ---- Figure 8: the paper's templates, 8 distinct per operation -----------------------------
    _t("add", "paper", _figure8("+", "plus", "addition", "sum"))
    + _t("sub", "paper", _figure8("-", "minus", "difference", "difference"))
    + _t("mul", "paper", _figure8("*", "times", "product", "product"))
    + _t("div", "paper", _figure8("/", "over", "ratio", "ratio"))
    # ---- Figure 10: the word problems, 1-8 time span, 9-12 object accumulation -----------------
    + _time_span()
    + _t("add", "object_accumulation", (
        "{NAME} has {A} {OBJECT}, then {NAME} {ACC_VERB_S} {B} {OBJECT*}. What's the total number of "
        "{OBJECT*} that {NAME*} has? The answer is",
        "{NAME} {ACC_VERB_S} {A} {OBJECT}, and {NAME2} {ACC_VERB_S} {B} {OBJECT*}. What's the total number of "
        "{OBJECT*} that they {ACC_VERB}? The answer is",
        "{NAME} has {A} {OBJECT}, and {NAME2} has {B} {OBJECT*}. What's the total number of {OBJECT*} that "
        "they have? The answer is",
        "{NAME} {ACC_VERB_PAST} {A} {OBJECT} yesterday, and {NAME} {ACC_VERB_PAST} {B} {OBJECT*} today. What's "
        "the total number of {OBJECT*} that {NAME*} {ACC_VERB_PAST}? The answer is",
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

#: The paired operation of the ``operator-swapped`` counterfactual (pow has none).
PAIRED_OP: dict[str, str] = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}


def _parallel_operators() -> dict[str, str]:
    """Template id -> the operator of the same row of the same family for the paired operation.  Parallel rows:
    those of the paper and extended families that all four operations have (Figure 8's eight; the extended
    equations and phrasings, not its addition/subtraction word problems), each with a literal operator."""
    out: dict[str, str] = {}
    for t in TEMPLATES:
        if t.family not in PAPER_FAMILIES + EXTENDED_FAMILIES or t.op not in PAIRED_OP:
            continue
        row = {op: TEMPLATES_BY_ID.get(op + t.id[len(t.op):]) for op in PAIRED_OP}  # ".paper.2" of every op
        if all(r is not None and r.operator_words() == (r.operator,) for r in row.values()):
            out[t.id] = row[PAIRED_OP[t.op]].operator
    return out


def _most_parallel_swaps(swaps: dict[str, str]) -> dict[tuple[str, str], str]:
    words: dict[tuple[str, str], list[str]] = {}
    for tid, word in swaps.items():
        words.setdefault((TEMPLATES_BY_ID[tid].op, TEMPLATES_BY_ID[tid].operator), []).append(word)
    return {key: Counter(ws).most_common(1)[0][0] for key, ws in words.items()}


#: Template id -> the paired operation's operator in the parallel template (``add.paper.2`` "addition" ->
#: ``sub.paper.2``'s "difference"; ``mul.extended.5`` "multiply" -> "divide"), derived from TEMPLATES by position.
SWAPPED_OPERATOR: dict[str, str] = _parallel_operators()
#: (op, operator word or sign) -> its swap, for templates written by users: the swap most parallel rows give
#: (ties: the first, Figure 8's), e.g. ("sub", "difference") -> "sum", ("mul", "times") -> "over".
SWAPPED_OPERATOR_WORDS: dict[tuple[str, str], str] = _most_parallel_swaps(SWAPPED_OPERATOR)


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
