"""Reference / counterfactual prompt pairs (X_r, X_c) and the answer-token rule.

Zhang et al. (2024), Section 3: a reference prompt X_r states an arithmetic problem ("3 + 5 =");
its counterfactual X_c has the same template and operands but the operation removed ("3 @ 5 =").
Only prompts the model answers correctly are kept (see :mod:`engine.techniques.accuracy`).

**Answer-token rule.**  Tokenize ``prompt + " " + str(C)`` (no space where the template's answer
continues a number, see ``Template.answer_sep``).  The answer token is the first token of
the continuation that holds a digit (for a negative answer: its sign); whitespace-only tokens before
it (e.g. Llama-2's lone ``"▁"``) are appended to the prompt, so ``ref_ids`` ends exactly where the
model must emit the answer.  ``answer_ids`` are all the number's tokens, for full-answer accuracy.
Counterfactual ids get the same treatment and must have the same length as the reference ids
(position-aligned patching); fillers are tried in a seeded order until one fits.

**The chosen digit** (:data:`DIGITS`: the answer's first token, today's and the default; its last; or its k-th).
The answer's tokens before the chosen one are appended, teacher-forced, to X_r's ids *and* to X_c's ids (X_r's tokens
in both: the patched run is told the same answer so far), so END -- the last position -- predicts the chosen token,
``answer_id`` is that token and ``answer_ids`` the number's tokens from it on; ``forced`` counts the appended tokens
(0 at the first digit: the pair is the one it always was).  On tokenizers that split numbers into single digits
(Llama, Qwen2, SmolLM2, Gemma, the bundled model) the k-th token is the k-th digit ("last" is the units digit); where
a number token holds several digits (GPT-2, Llama 3's up to 999) it is the k-th *token*, and "last" of a one-token
answer is its first.  An answer with fewer than k tokens has no k-th: the problem is dropped, with that reason.

**Typed prompts** (CLI ``--text``, the pages) go through the same rule: :func:`engine.prompts.typed.typed_prompt_ids`
parses the operation, computes the answer and applies :func:`answer_tokens`, so the model is always
read at the position that predicts the answer's first digit -- never at a lone whitespace token.  A
prompt that does not parse is read at the position where a number would start (the rule applied
with a placeholder digit), or as typed when even that fails.

Everything is seeded: the same (ops, n, seed, operand range, families) gives the same prompts.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Iterable, Protocol, Sequence

from engine.prompts.templates import (
    CF_SYMBOLS,
    CF_WORDS,
    OPS,
    PAIRED_OP,
    PAPER_FAMILIES,
    PAPER_OPS,
    SWAPPED_OPERATOR,
    SWAPPED_OPERATOR_WORDS,
    TEMPLATES_BY_ID,
    Template,
    fill_slots,
    swap_words,
    templates_for,
)


class PromptError(ValueError):
    """A prompt cannot be used; the message says why and what to do."""


class TokenizerLike(Protocol):  # the part of a Hugging Face tokenizer we use
    def __call__(self, text: str, **kwargs: Any) -> Any: ...
    def convert_ids_to_tokens(self, ids: Any) -> Any: ...


@dataclass(frozen=True)
class OperandRange:
    """Inclusive operand range (default 1..9); ``max_exponent`` caps B for ``pow``."""

    lo: int = 1
    hi: int = 9
    allow_negative: bool = False
    max_exponent: int = 3
    #: decimal places of the operands (Figure 4's rational numbers: 1 gives 4.5, 2.3 ...; 0: integers)
    decimals: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.decimals <= 2:
            raise PromptError(f"decimals must be 0, 1 or 2, got {self.decimals}")
        if self.lo < 0 or self.hi < self.lo:
            raise PromptError(f"operand range {self.lo}..{self.hi} is empty or negative: use 0 <= lo <= hi")
        if self.hi > 9999:
            raise PromptError("operands above 9999 are not supported")
        if self.max_exponent < 1:
            raise PromptError("max_exponent must be at least 1")


def compute_answer(op: str, a: int, b: int) -> int:
    """C = A op B (integer; division must be exact)."""
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        if b == 0 or a % b:
            raise PromptError(f"{a} / {b} is not an exact integer division")
        return a // b
    if op == "pow":
        return a ** b
    raise PromptError(f"unknown operation {op!r}: choose from {', '.join(OPS)}")


def as_number(x: int, decimals: int) -> int | float:
    """An operand or answer kept in units of 10^-decimals, as the number it stands for."""
    return x if not decimals else round(x / 10 ** decimals, 2 * decimals)


def answer_value(op: str, a: int, b: int, decimals: int = 0) -> int | float:
    """C = A op B for operands in units of 10^-decimals (:func:`compute_answer` for integers)."""
    if not decimals:
        return compute_answer(op, a, b)
    if op in ("add", "sub"):
        return as_number(compute_answer(op, a, b), decimals)
    if op == "mul":
        return as_number(a * b, 2 * decimals)
    if op == "div":
        return compute_answer(op, a, b)  # the scales cancel: exact divisions have integer answers
    raise PromptError(f"decimal operands are for add, sub, mul and div, not {op}")


def valid_operands(op: str, r: OperandRange) -> list[tuple[int, int]]:
    """All (A, B) of the range that make a valid problem for ``op``.  With ``decimals`` the operands are
    counted in units of 10^-decimals (4.5 is 45), every one has exactly that many decimals (no 4.0), and
    so has the answer of +, - and * (no 4.5 + 2.5 = 7.0)."""
    if r.decimals:
        if op == "pow":
            raise PromptError("decimal operands are for add, sub, mul and div, not pow")
        scale = 10 ** r.decimals
        nums = [x for x in range(r.lo * scale, r.hi * scale + 1) if x % 10]
        pairs = [(a, b) for a in nums for b in nums]
        if op == "add":
            return [(a, b) for a, b in pairs if (a + b) % 10]
        if op == "sub":
            return [(a, b) for a, b in pairs if (r.allow_negative or a > b) and (a - b) % 10]
        if op == "mul":
            return [(a, b) for a, b in pairs if (a * b) % 10]
        return [(a, b) for a, b in pairs if a % b == 0]
    nums = range(r.lo, r.hi + 1)
    if op == "add" or op == "mul":
        return [(a, b) for a in nums for b in nums]
    if op == "sub":
        return [(a, b) for a in nums for b in nums if r.allow_negative or a > b]
    if op == "div":
        return [(a, b) for a in nums for b in nums if b != 0 and a % b == 0]
    if op == "pow":
        return [(a, b) for a in nums for b in range(max(1, r.lo), min(r.hi, r.max_exponent) + 1)]
    raise PromptError(f"unknown operation {op!r}: choose from {', '.join(OPS)}")


def template_operands(template: Template, r: OperandRange) -> list[tuple[int, int]]:
    """The (A, B) of the range valid for the template's operation and within its ``max_answer``."""
    pairs = valid_operands(template.op, r)
    if template.max_answer is None:
        return pairs
    return [(a, b) for a, b in pairs if answer_value(template.op, a, b, r.decimals) <= template.max_answer]


@dataclass(frozen=True)
class Problem:
    """A template instance, before tokenization."""

    template: Template
    a: int
    b: int
    slots: tuple[tuple[str, str], ...] = ()  # (slot name, word): names, objects, verbs ...
    #: counterfactuals in the order to try: operator fillers ("@", "nothing"), or for a template
    #: with starred slots the words that replace them (Figure 9: ("cups", "tables", "John"))
    fillers: tuple[str | tuple[str, ...], ...] = ()
    decimals: int = 0  # a and b are in units of 10^-decimals

    @property
    def answer(self) -> int | float:
        return answer_value(self.template.op, self.a, self.b, self.decimals)

    @property
    def operands(self) -> tuple[int | float, int | float]:
        """(A, B) as the numbers the prompt shows."""
        return as_number(self.a, self.decimals), as_number(self.b, self.decimals)

    @property
    def ref_text(self) -> str:
        return self.template.render(*self.operands, slots=dict(self.slots))

    def cf_text(self, filler: str | tuple[str, ...] | None = None) -> str:
        filler = filler or self.fillers[0]
        if isinstance(filler, tuple):
            return self.template.render(*self.operands, swaps=filler, slots=dict(self.slots))
        return self.template.render(*self.operands, filler=filler, slots=dict(self.slots))


def _fillers_for(template: Template, slots: tuple[tuple[str, str], ...], rng: random.Random
                 ) -> tuple[str | tuple[str, ...], ...]:
    if template.swapped_slots:
        return swap_words(template, slots, rng)
    pool = list(CF_SYMBOLS if template.operator_is_symbol else CF_WORDS)
    rng.shuffle(pool)
    return tuple(pool)


def make_problem(template: Template, a: int, b: int, rng: random.Random, decimals: int = 0) -> Problem:
    """One instance of a template: seeded slot words and counterfactual fillers."""
    slots = fill_slots(template, rng)
    return Problem(template, a, b, slots=slots, fillers=_fillers_for(template, slots, rng), decimals=decimals)


#: which problems a set keeps by their carry (:attr:`PromptPair.carry`): any, only those with a carry / borrow, only
#: those with none; the pages' words
ANY_CARRY = "any"
CARRY_SETS = {ANY_CARRY: "with or without a carry / borrow", "yes": "with a carry / borrow",
              "no": "without a carry / borrow"}


def check_carry_set(ops: Sequence[str], carry: str) -> None:
    """PromptError unless ``carry`` is one of :data:`CARRY_SETS` and, when it chooses, every operation is one a carry is
    defined for (addition: carry; subtraction: borrow)."""
    if carry not in CARRY_SETS:
        raise PromptError(f"carry {carry!r}: choose from {', '.join(CARRY_SETS)}")
    other = [op for op in ops if op not in ("add", "sub")]
    if carry != ANY_CARRY and other:
        raise PromptError(f"a carry / borrow is defined for additions and subtractions, not {', '.join(other)}: keep "
                          f"only add and sub to choose the prompts by their carry")


def sample_problems(ops: Sequence[str], n: int, seed: int, *, operands: OperandRange | None = None,
                    families: Sequence[str] | None = PAPER_FAMILIES,
                    templates: Sequence[Template] = (), carry: str = ANY_CARRY) -> list[Problem]:
    """Up to ``n`` distinct problems per operation, seeded.

    Per operation, every (template, A, B) combination is enumerated, shuffled with ``seed`` and
    the first ``n`` taken (fewer when fewer exist, e.g. exact divisions of 1..9).  ``families``
    None means every family of the operation (paper, Figure 10, extended, skills); ``templates``
    (written by a user, :mod:`engine.prompts.custom`) replace the families when given.  ``carry``
    (:data:`CARRY_SETS`): "yes" keeps only the problems whose sum carries (difference borrows) in some column, "no"
    only those with none: the first ``n`` of them in the same shuffled order, worded as in the set of any carry (with
    every problem, ``every``, they are exactly that set's problems of that carry, in its order).
    """
    check_carry_set(ops, carry)
    if n <= 0:
        raise PromptError(f"n must be a positive number of prompts, got {n}")
    r = operands or OperandRange()
    rng = random.Random(seed)
    out: list[Problem] = []
    for op in ops:
        if templates:
            tpls = [t for t in templates if t.op == op]
        else:
            tpls = templates_for([op], list(families) if families is not None else None)
        if not tpls and op not in PAPER_OPS and not templates:
            # exponentiation has only its own family (pow + paper): use it
            tpls = templates_for([op], None)
        if not tpls:  # e.g. sub + the word problems, which are additions only
            continue
        combos = [(t, a, b) for t in tpls for (a, b) in template_operands(t, r)]
        if not combos:
            raise PromptError(f"no valid {op} problems with operands {r.lo}..{r.hi}: widen the range")
        want = carry == "yes"
        if carry != ANY_CARRY and not any(column_carry(op, a, b) is want for _, a, b in combos):
            word = "a carry" if op == "add" else "a borrow"
            which = f"no {op} problem" if want else f"every {op} problem"
            raise PromptError(f"{which} with operands {r.lo}..{r.hi} has {word}: widen the operands (10 to 99 "
                              f"has both) or drop {op}")
        rng.shuffle(combos)
        if carry == ANY_CARRY:
            out.extend(make_problem(t, a, b, rng, r.decimals) for t, a, b in combos[:n])
            continue
        kept: list[Problem] = []
        for t, a, b in combos:  # each drawn in order, as above: the any-carry set's words, its problems of that carry
            problem = make_problem(t, a, b, rng, r.decimals)
            if column_carry(op, a, b) is want:
                kept.append(problem)
                if len(kept) == n:
                    break
        out.extend(kept)
    if not out:
        raise PromptError(f"no templates of famil(ies) {', '.join(families or ())} for {', '.join(ops)}: "
                          "the Figure 10 word problems are additions (use --op add)")
    return out


# ---------------------------------------------------------------------------------------------
# answer-token rule
# ---------------------------------------------------------------------------------------------

#: Names the answer-token rule below; part of every prompt set's params (cache keys).
ANSWER_TOKEN_RULE = "first digit-bearing continuation token; whitespace-only tokens before it join the prompt"


@dataclass(frozen=True)
class AnswerTokens:
    prompt_ids: list[int]  # prompt (+ whitespace-only continuation tokens), with special tokens
    answer_id: int         # the first answer token
    answer_ids: list[int]  # every token of the number


#: The answer digits a prompt set can analyse: "first" (the default), "last", or k >= 2 written as text ("2").
DIGITS = ("first", "last")
FIRST_DIGIT = "first"


def parse_digit(text: str | int) -> str:
    """``first`` / ``last`` / a whole number k >= 1 (the k-th answer token; 1 is ``first``) -> the spec's value."""
    t = str(text).strip().lower()
    if t in DIGITS:
        return t
    if t.isdigit() and int(t) >= 1:
        return FIRST_DIGIT if int(t) == 1 else str(int(t))
    raise PromptError(f"answer digit {text!r}: choose first, last or a number k >= 1 (the k-th answer token)")


def digit_words(digit: str) -> str:
    """The chosen digit in the pages' words: "first", "last (units)", "2nd" ..."""
    if digit in DIGITS:
        return "last (units)" if digit == "last" else digit
    k = int(digit)
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def at_digit(tokens: AnswerTokens, digit: str) -> tuple[AnswerTokens, int]:
    """``tokens`` read at the chosen digit (module docstring): the earlier answer tokens join the prompt; returns
    (the tokens, how many joined).  PromptError when the answer has no such token."""
    n = len(tokens.answer_ids)
    k = 0 if digit == FIRST_DIGIT else n - 1 if digit == "last" else int(digit) - 1
    if k >= n:
        raise PromptError(f"the answer has {n} token(s): it has no {digit_words(digit)} one")
    if k == 0:
        return tokens, 0
    ids = tokens.answer_ids
    return AnswerTokens(tokens.prompt_ids + ids[:k], ids[k], ids[k:]), k


def _is_number_piece(text: str, first: bool) -> bool:
    t = text.strip().lstrip("▁Ġ")
    return any(c.isdigit() for c in t) or (first and t in ("-", "−"))


def answer_tokens(tokenizer: TokenizerLike, prompt: str, answer: int | str, sep: str = " ") -> AnswerTokens:
    """Apply the answer-token rule (module docstring) to ``prompt`` and its answer.

    ``sep`` joins prompt and answer: a space, or "" where the answer continues a number (the
    time-span templates end with the first digits of a year)."""
    full = f"{prompt}{sep}{answer}"
    cut = len(prompt)
    enc = tokenizer(full, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"]]
    first_cont: int | None = None
    for i, (s, e) in enumerate(offsets):
        if e <= s:  # special token (BOS/EOS): no characters
            continue
        if s < cut < e:
            raise PromptError("the tokenizer merges the end of the prompt with the answer; "
                              "end the prompt with a space-free word or symbol such as '=' or 'is'")
        if s >= cut:
            first_cont = i
            break
    if first_cont is None:
        raise PromptError("the answer produced no tokens")
    i = first_cont
    while i < len(ids) and offsets[i][1] > offsets[i][0] and full[offsets[i][0]:offsets[i][1]].strip() == "":
        i += 1  # whitespace-only tokens belong to the prompt
    if i >= len(ids) or offsets[i][1] <= offsets[i][0]:
        raise PromptError("no answer token found after the prompt")
    if not _is_number_piece(full[offsets[i][0]:offsets[i][1]], first=True):
        raise PromptError(f"the first answer token {full[offsets[i][0]:offsets[i][1]]!r} holds no digit")
    start = i
    j = i + 1
    end = len(full)
    while j < len(ids) and offsets[j][1] > offsets[j][0] and (
            _is_number_piece(full[offsets[j][0]:offsets[j][1]], first=False)
            or (full[offsets[j][0]:offsets[j][1]].strip() == "." and offsets[j][1] < end)):  # 6.8: the point
        j += 1
    return AnswerTokens(prompt_ids=ids[:start], answer_id=ids[start], answer_ids=ids[start:j])


# ---------------------------------------------------------------------------------------------
# pairs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptPair:
    """One (X_r, X_c) pair, tokenized and ready to feed the model."""

    op: str
    template: str
    family: str
    a: int | float  # as the prompt shows it (4.5 for Figure 4's rational numbers)
    b: int | float
    answer: int | float
    ref_text: str
    cf_text: str
    ref_ids: list[int]
    cf_ids: list[int]
    answer_id: int
    answer_ids: list[int] = field(default_factory=list)
    #: the answer tokens before the chosen digit, teacher-forced at the end of ref_ids and of cf_ids (0: the first
    #: digit); the filter checks that the model predicts them too
    forced: int = 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.forced:  # a first-digit pair is written as it was before the digit could be chosen
            d.pop("forced")
        return d

    @property
    def forced_ids(self) -> list[int]:
        """The teacher-forced answer tokens before END's (empty at the first digit)."""
        return self.ref_ids[len(self.ref_ids) - self.forced:] if self.forced else []

    @property
    def carry(self) -> bool | None:
        """Addition: whether some column's digit sum carries; subtraction: whether some column borrows (operands
        aligned at the decimal point); None for the other operations and for negative operands."""
        return column_carry(self.op, self.a, self.b)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PromptPair":
        missing = [k for k in ("op", "template", "a", "b", "answer", "ref_text", "cf_text", "ref_ids",
                               "cf_ids", "answer_id") if k not in d]
        if missing:
            raise PromptError(f"prompt record lacks field(s) {missing}")
        if len(d["ref_ids"]) != len(d["cf_ids"]):
            raise PromptError(f"ref_ids and cf_ids differ in length in {d.get('ref_text')!r}")
        return cls(op=d["op"], template=d["template"], family=d.get("family", ""), a=_number(d["a"]),
                   b=_number(d["b"]), answer=_number(d["answer"]), ref_text=d["ref_text"], cf_text=d["cf_text"],
                   ref_ids=[int(x) for x in d["ref_ids"]], cf_ids=[int(x) for x in d["cf_ids"]],
                   answer_id=int(d["answer_id"]),
                   answer_ids=[int(x) for x in d.get("answer_ids", [d["answer_id"]])], forced=int(d.get("forced", 0)))


def column_carry(op: str, a: int | float, b: int | float) -> bool | None:
    """Schoolbook carry (``add``) or borrow (``sub``) in any column of |a| and |b| written with the same number of
    decimals; None for other operations or a negative operand."""
    if op not in ("add", "sub") or a < 0 or b < 0:
        return None
    places = max(len(repr(float(x)).split(".")[1].rstrip("0")) if isinstance(x, float) else 0 for x in (a, b))
    x, y = (int(round(v * 10 ** places)) for v in (a, b))
    carry = 0
    while x or y:
        dx, dy = x % 10, y % 10
        if op == "add":
            carry = (dx + dy + carry) >= 10
        else:
            carry = (dx - dy - carry) < 0
        if carry:
            return True
        x, y = x // 10, y // 10
    return False


def _number(x: Any) -> int | float:
    """A JSON number (or its text) as int when integral, else float (Figure 4's decimals)."""
    v = float(x)
    if not v == v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{x!r} is not a finite number")
    return int(v) if v.is_integer() and "." not in str(x) else v


#: The reason a problem is dropped when no filler keeps X_c as long (in tokens) as X_r.
LENGTH_MISMATCH = "length mismatch: no counterfactual filler gives the same token length as the reference"

#: The counterfactual kinds: what X_c changes (the first is the paper's and the default).
COUNTERFACTUALS: dict[str, str] = {
    "operator-removed": "the operator replaced by a neutral word or symbol (the paper's X_c)",
    "operand-a": "operand A replaced by another operand of the range (the operator kept; the answer changes)",
    "operand-b": "operand B replaced by another operand of the range (the operator kept; the answer changes)",
    "operator-swapped": "the operator replaced by the paired operation's (+ and -, * and /: the parallel template's "
                        "word; the answer changes)",
    "carry": "the operands' units digits changed so that the carry into the tens (addition) or the borrow from them "
             "(subtraction) flips, their other digits and the answer's units digit kept (the answer's tens change "
             "by one)",
}
OPERATOR_REMOVED = "operator-removed"
OPERATOR_SWAPPED = "operator-swapped"
#: each kind in the pages' words: (its short name, what a component whose patch lowers the answer logit carries)
COUNTERFACTUAL_WORDS: dict[str, tuple[str, str]] = {
    "operator-removed": ("operator removed", "the operation"),
    "operand-a": ("operand A changed", "operand A"),
    "operand-b": ("operand B changed", "operand B"),
    "operator-swapped": ("operator swapped", "the operation"),
    "carry": ("carry flipped", "the carry"),
}
CARRY = "carry"


def units_carry(op: str, a: int, b: int) -> bool:
    """Whether the units column of a op b carries (``add``: its digits sum to 10 or more) or borrows (``sub``: a's
    units digit below b's); a and b whole numbers (operands with decimals: in units of their last decimal)."""
    if op == "add":
        return a % 10 + b % 10 >= 10
    if op == "sub":
        return a % 10 < b % 10
    raise PromptError(f"the carry counterfactual is for add and sub, not {op}")


def carry_operands(op: str, a: int, b: int, candidates: Collection[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (A', B') of ``candidates`` (the valid operands: a set, for speed) that differ from (a, b) only in the
    carry: the same digits above the units, the answer's units digit kept, the units column's carry (borrow)
    flipped."""
    flipped = not units_carry(op, a, b)
    units = compute_answer(op, a, b) % 10
    same = [(a - a % 10 + i, b - b % 10 + j) for i in range(10) for j in range(10)]  # only the units digits change
    return [(x, y) for x, y in same if (x, y) in candidates and units_carry(op, x, y) == flipped
            and compute_answer(op, x, y) % 10 == units]


def counterfactual_words(kind: str | None) -> tuple[str, str]:
    """:data:`COUNTERFACTUAL_WORDS` of ``kind`` (None: the paper's, operator removed)."""
    return COUNTERFACTUAL_WORDS[kind or OPERATOR_REMOVED]


def check_counterfactual(kind: str) -> str:
    if kind not in COUNTERFACTUALS:
        raise PromptError(f"unknown counterfactual {kind!r}: choose from {', '.join(COUNTERFACTUALS)}")
    return kind


def _swapped_operator(problem: Problem) -> str:
    """The paired operation's operator for ``problem``'s template (:data:`SWAPPED_OPERATOR`; a template written by a
    user: :data:`SWAPPED_OPERATOR_WORDS`); PromptError saying why there is none."""
    t = problem.template
    if t.op not in PAIRED_OP:
        raise PromptError(f"no swapped operator for {t.op}: only add <-> sub and mul <-> div have a paired operation")
    if not t.operator:
        raise PromptError(f"no swapped operator for template {t.id}: it has no operator slot")
    builtin = TEMPLATES_BY_ID.get(t.id) == t
    swap = SWAPPED_OPERATOR.get(t.id) if builtin else SWAPPED_OPERATOR_WORDS.get((t.op, t.operator))
    if swap is None:
        word = dict(problem.slots).get(t.operator.strip("{}"), t.operator)  # a pooled verb slot: its word
        raise PromptError(f"no swapped operator for {word!r}" + (
            f" (template {t.id} has no parallel {PAIRED_OP[t.op]} template)" if builtin else ""))
    return swap


def _swapped_texts(problem: Problem) -> list[tuple[str, int | float]]:
    """The operator-swapped X_c: the same template, operands and slot words with the paired operation's operator;
    its answer that operation's (an inexact division: X_r's answer, for tokenization only)."""
    t, d = problem.template, problem.decimals
    text = t.render(*problem.operands, filler=_swapped_operator(problem), slots=dict(problem.slots))
    try:
        answer = answer_value(PAIRED_OP[t.op], problem.a, problem.b, d)
    except PromptError:  # A / B not an exact division: no integer answer, and not X_r's either (B != 1)
        return [(text, problem.answer)]
    if answer == problem.answer:
        raise PromptError(f"the swapped operation gives the same answer ({answer}): X_c would not change it")
    return [(text, answer)]


def _counterfactual_texts(problem: Problem, kind: str, r: OperandRange | None) -> list[tuple[str, int | float]]:
    """X_c candidates of ``problem`` in the order to try: (text, its answer)."""
    if kind == OPERATOR_REMOVED:
        return [(problem.cf_text(f), problem.answer) for f in problem.fillers]
    if kind == OPERATOR_SWAPPED:
        return _swapped_texts(problem)
    r = r or OperandRange()
    t, d = problem.template, problem.decimals
    if kind == CARRY:
        alts = carry_operands(t.op, problem.a, problem.b, set(template_operands(t, r)))
        random.Random(f"{t.id}|{problem.a}|{problem.b}|{kind}").shuffle(alts)  # seeded by the problem
        alts.sort(key=lambda ab: (ab[0] != problem.a) + (ab[1] != problem.b))  # one operand changed first
        return [(t.render(as_number(a, d), as_number(b, d), slots=dict(problem.slots)), answer_value(t.op, a, b, d))
                for a, b in alts]
    which = 0 if kind == "operand-a" else 1
    keep = (problem.a, problem.b)[1 - which]
    alts = [ab for ab in template_operands(t, r) if ab[1 - which] == keep and ab[which] != (problem.a, problem.b)[which]
            and answer_value(t.op, *ab, d) != problem.answer]
    random.Random(f"{t.id}|{problem.a}|{problem.b}|{kind}").shuffle(alts)  # seeded by the problem: reproducible
    slots = dict(problem.slots)
    return [(t.render(as_number(a, d), as_number(b, d), slots=slots), answer_value(t.op, a, b, d)) for a, b in alts]


def build_pair(tokenizer: TokenizerLike, problem: Problem, counterfactual: str = OPERATOR_REMOVED,
               operands: OperandRange | None = None, digit: str = FIRST_DIGIT) -> PromptPair:
    """Tokenize one problem with an X_c of the ``counterfactual`` kind (:data:`COUNTERFACTUALS`; operand kinds
    draw the other operand from ``operands``), read at the answer's ``digit`` (module docstring: X_r's answer tokens
    before it are appended to both prompts); raises PromptError when no X_c of equal length exists, the answer has
    no such digit, or (operator swapped) the template's operator has no swap or the swap leaves the answer
    unchanged (carry: no operands flip the carry)."""
    sep = problem.template.answer_sep
    ref, forced = at_digit(answer_tokens(tokenizer, problem.ref_text, problem.answer, sep), digit)
    tail = ref.prompt_ids[len(ref.prompt_ids) - forced:] if forced else []
    texts = _counterfactual_texts(problem, check_counterfactual(counterfactual), operands)
    if counterfactual == CARRY and not texts:
        raise PromptError("no operands of the range flip the carry and keep the answer's units digit")
    for cf_text, cf_answer in texts:
        cf = answer_tokens(tokenizer, cf_text, cf_answer, sep)
        if len(cf.prompt_ids) + forced == len(ref.prompt_ids):
            a, b = problem.operands
            return PromptPair(op=problem.template.op, template=problem.template.id,
                              family=problem.template.family, a=a, b=b,
                              answer=problem.answer, ref_text=problem.ref_text, cf_text=cf_text,
                              ref_ids=ref.prompt_ids, cf_ids=cf.prompt_ids + tail, answer_id=ref.answer_id,
                              answer_ids=ref.answer_ids, forced=forced)
    raise PromptError(LENGTH_MISMATCH)


def build_pairs(tokenizer: TokenizerLike, problems: Iterable[Problem], counterfactual: str = OPERATOR_REMOVED,
                operands: OperandRange | None = None, digit: str = FIRST_DIGIT
                ) -> tuple[list[PromptPair], list[tuple[Problem, str]]]:
    """Tokenize problems (X_c of the ``counterfactual`` kind, read at ``digit``); returns (pairs, dropped problems
    with the reason)."""
    pairs: list[PromptPair] = []
    dropped: list[tuple[Problem, str]] = []
    for p in problems:
        try:
            pairs.append(build_pair(tokenizer, p, counterfactual, operands, digit))
        except PromptError as e:
            dropped.append((p, str(e)))
    return pairs, dropped


def groups_of(pairs: Sequence[PromptPair], by: Sequence[str] = ("op", "template")) -> dict[str, list[int]]:
    """Pair indices of every breakdown group: ``*`` (all), then ``op:<op>`` and ``template:<id>`` (those of
    ``by``) in order of first appearance."""
    groups: dict[str, list[int]] = {"*": []}
    for i, p in enumerate(pairs):
        groups["*"].append(i)
        for kind in by:
            groups.setdefault(f"{kind}:{getattr(p, kind)}", []).append(i)
    return groups


#: the carry groups of :func:`groups_with_carry`, in the pages' words
CARRY_GROUPS = {"carry:yes": "with a carry / borrow", "carry:no": "without a carry / borrow"}


def groups_with_carry(pairs: Sequence[PromptPair]) -> dict[str, list[int]]:
    """:func:`groups_of` and ``carry:yes`` / ``carry:no``: the pairs whose sum carries (whose difference borrows) in
    some column and those with none (:attr:`PromptPair.carry`; addition and subtraction only); both omitted unless
    the set has pairs of each."""
    groups = groups_of(pairs)
    carry = {"carry:yes": [i for i, p in enumerate(pairs) if p.carry is True],
             "carry:no": [i for i, p in enumerate(pairs) if p.carry is False]}
    if carry["carry:yes"] and carry["carry:no"]:
        groups.update(carry)
    return groups


def prompt_set_hash(pairs: Sequence[PromptPair]) -> str:
    """sha256 of the canonical JSON of the pairs' token ids and answers (the cache's prompt key); a pair read past its
    first digit adds its ``forced`` count (a first-digit pair hashes as it did before the digit could be chosen)."""
    payload = [[p.ref_ids, p.cf_ids, p.answer_id, p.op, p.template] + ([p.forced] if p.forced else []) for p in pairs]
    return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()


def read_jsonl(path: str) -> list[PromptPair]:
    """Read pairs written by ``python -m engine prompts``."""
    pairs: list[PromptPair] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                pairs.append(PromptPair.from_json(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as e:
                raise PromptError(f"{path}:{lineno}: not a prompt record ({e})") from e
    if not pairs:
        raise PromptError(f"{path} holds no prompt pairs")
    return pairs


def write_jsonl(path: str, pairs: Iterable[PromptPair]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p.to_json()) + "\n")
            n += 1
    return n
