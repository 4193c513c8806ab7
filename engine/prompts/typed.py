"""Typed prompts: what a user types in the Prompt lab or passes with ``--text`` ("What is 7 times 8?").

:func:`parse_typed_prompt` finds the two operands and the operation (symbols or the paper's words),
computes the answer and builds the counterfactual X_c by replacing the operator, as the prompt sets
do; :func:`typed_prompt_ids` applies the one answer-token rule (:func:`engine.prompts.pairs.answer_tokens`)
so every page and subcommand analyses the position that predicts the answer's first digit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.prompts.pairs import AnswerTokens, PromptError, TokenizerLike, answer_tokens, compute_answer
from engine.prompts.templates import CF_SYMBOLS, CF_WORDS

MAX_TYPED_CHARS = 2000
_NUM = r"(-?[0-9]+)"  # ASCII digits only: "٣" is a digit to Python, not to the tokenizer
# (regex, op, operands reversed?, operator group index).  Order matters: phrases before symbols.
_PATTERNS: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(p, re.IGNORECASE), op, rev) for p, op, rev in (
        (rf"{_NUM}\s*to the (power) of\s*{_NUM}", "pow", False),
        (rf"\b(sum|addition) of {_NUM} and {_NUM}", "add", False),
        (rf"\b(difference|subtraction) (?:between|of) {_NUM} and {_NUM}", "sub", False),
        (rf"\b(product|multiplication) of {_NUM} and {_NUM}", "mul", False),
        (rf"\b(quotient|ratio|division) of {_NUM} and {_NUM}", "div", False),
        (rf"\b(add) {_NUM} to {_NUM}", "add", True),
        (rf"\b(subtract) {_NUM} from {_NUM}", "sub", True),
        (rf"\b(multiply) {_NUM} by {_NUM}", "mul", False),
        (rf"\b(divide) {_NUM} by {_NUM}", "div", False),
        (rf"{_NUM}\s+(plus)\s+{_NUM}", "add", False),
        (rf"{_NUM}\s+(minus)\s+{_NUM}", "sub", False),
        (rf"{_NUM}\s+(times|multiplied)(?: by)?\s+{_NUM}", "mul", False),
        (rf"{_NUM}\s+(divided|over)(?: by)?\s+{_NUM}", "div", False),
        (rf"{_NUM}\s*(\+)\s*{_NUM}", "add", False),
        (rf"([0-9]+)\s*(-|−)\s*{_NUM}", "sub", False),
        (rf"{_NUM}\s*(\*|×|x)\s*{_NUM}", "mul", False),
        (rf"{_NUM}\s*(/|÷)\s*{_NUM}", "div", False),
        (rf"{_NUM}\s*(\^|\*\*)\s*{_NUM}", "pow", False),
    )
)


@dataclass(frozen=True)
class TypedProblem:
    """A typed prompt parsed into operands and operator, with its counterfactual."""

    text: str
    op: str
    a: int
    b: int
    answer: int
    operator: str
    cf_text: str


@dataclass(frozen=True)
class TypedLocation:
    """Where a typed prompt's operands and operator are: character spans ``(start, end)`` of ``problem.text``."""

    problem: TypedProblem
    a_span: tuple[int, int]
    b_span: tuple[int, int]
    op_span: tuple[int, int]


def parse_typed_prompt(text: str, *, filler_seed: int = 0) -> TypedProblem:
    """Find the operation and operands in free text ("What is 7 times 8?").

    Raises PromptError with a message that says why the prompt cannot be used.
    """
    return locate_typed(text, filler_seed=filler_seed).problem


def locate_typed(text: str, *, filler_seed: int = 0) -> TypedLocation:
    """:func:`parse_typed_prompt` with the spans of the operands and the operator in the text."""
    if text is None or not text.strip():
        raise PromptError("the prompt is empty: type an arithmetic question such as 'What is 7 times 8?'")
    if len(text) > MAX_TYPED_CHARS:
        raise PromptError(f"the prompt has {len(text)} characters; keep it under {MAX_TYPED_CHARS}")
    numbers = re.findall(r"[0-9]+", text)
    if not numbers:
        raise PromptError("the prompt contains no numbers (digits 0-9): write two operands, e.g. '3 + 5 ='")
    if len(numbers) < 2:
        raise PromptError("the prompt contains only one number: an operation needs two operands")
    matches = []
    for pat, op, rev in _PATTERNS:
        m = pat.search(text)
        if m:
            matches.append((m, op, rev))
    if not matches:
        raise PromptError("no operation found: use +, -, *, /, ^ or words such as plus, minus, times, "
                          "divided by, sum of, difference between, product of, quotient of")
    m, op, rev = min(matches, key=lambda x: x[0].start())
    groups = m.groups()
    if groups[0] is not None and not groups[0].lstrip("-").isdigit():  # operator first: "sum of A and B"
        operator, x, y = groups[0], int(groups[1]), int(groups[2])
        op_span, x_span, y_span = m.span(1), m.span(2), m.span(3)
    else:
        x, operator, y = int(groups[0]), groups[1], int(groups[2])
        x_span, op_span, y_span = m.span(1), m.span(2), m.span(3)
    a, b = (y, x) if rev else (x, y)
    a_span, b_span = (y_span, x_span) if rev else (x_span, y_span)
    if op == "div" and (b == 0 or a % b):
        raise PromptError(f"{a} / {b} is not a whole number: the lab studies exact integer answers")
    if op == "pow" and (b < 0 or b > 12):
        raise PromptError("exponents must lie between 0 and 12")
    answer = compute_answer(op, a, b)
    pool = list(CF_WORDS if operator[0].isalpha() else CF_SYMBOLS)
    filler = pool[filler_seed % len(pool)]
    cf_text = text[:op_span[0]] + filler + text[op_span[1]:]
    problem = TypedProblem(text=text, op=op, a=a, b=b, answer=answer, operator=operator, cf_text=cf_text)
    return TypedLocation(problem, a_span, b_span, op_span)


@dataclass(frozen=True)
class TypedIds:
    """A typed prompt after the answer-token rule: what the model reads, and what was understood."""

    ids: list[int]                      # the prompt ids, ending where the answer's first token is predicted
    parsed: TypedProblem | None         # None when the prompt does not parse (``error`` says why)
    answer: AnswerTokens | None         # the answer's tokens (parsed prompts only)
    error: str | None = None            # why no answer / counterfactual is known
    rule_applied: bool = True           # False: read exactly as typed (the rule could not be applied)


def typed_prompt_ids(tokenizer: TokenizerLike, text: str) -> TypedIds:
    """The answer-token rule for a typed prompt -- the one function behind CLI ``--text`` and the pages.

    Parsed prompts: :func:`answer_tokens` with the computed answer.  Unparsed prompts: the same rule
    with a placeholder digit (the whitespace a tokenizer emits before a number does not depend on the
    number), so the last position is still where a number would be predicted.
    """
    stripped = text.rstrip()
    try:
        parsed: TypedProblem | None = parse_typed_prompt(text)
        error = None
    except PromptError as e:
        parsed, error = None, str(e)
    if parsed is not None:
        try:
            at = answer_tokens(tokenizer, stripped, parsed.answer)
            return TypedIds(at.prompt_ids, parsed, at)
        except PromptError as e:
            error = f"the answer cannot be located in the tokens ({e})"
    try:
        return TypedIds(answer_tokens(tokenizer, stripped, 0).prompt_ids, None, None, error)
    except PromptError:
        return TypedIds(list(tokenizer(text)["input_ids"]), None, None, error, rule_applied=False)
