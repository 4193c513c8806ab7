"""A prompt set: which prompts to generate (ops, families, n, seed, operand range), for one tokenizer.

The same :class:`PromptSetSpec` is used by the CLI, the pages and the cache key, so that a set is
described once and generated identically everywhere.

**Balance rule** (``balance=True``, the default).  Tokenizers that split numbers into digits (Llama,
Qwen2, SmolLM2, the bundled model) give every answer from 10 to 19 -- all additions of 1..9 above 9 --
the same first answer token "1", so an unbalanced set measures mostly "predict a 1".  A balanced set
samples ``BALANCE_OVERSAMPLE`` times ``n`` candidate problems per operation (seeded, as usual),
tokenizes them, groups them by first answer token and takes them round-robin over the groups (in
order of first appearance) until ``n`` are chosen: no first answer token holds more than its share
unless the other tokens run out of candidates.  The flag and :data:`BALANCE_RULE` are part of the
spec's params, and the chosen pairs are part of the prompt-set hash, so cached results of balanced
and unbalanced sets never mix.  :func:`answer_token_stats` reports the distribution of any set and
warns when one token holds more than :data:`DOMINANT_SHARE` of it.

**The answer digit** (``digit``: "first", the default; "last"; or the k-th token, :mod:`engine.prompts.pairs`).  A set
read past its first digit is built with the earlier answer tokens teacher-forced in both prompts, and then everything
above follows the chosen digit: the balance rule takes its groups by the chosen digit's token (``answer_id``), the
distribution and its warning count that token, and the spec's params carry ``digit`` (only when it is not "first": a
first-digit set keeps the cache keys it had before the choice existed).

**The carry** (``carry``: "any", the default; "yes"; "no").  A set can keep only the problems whose sum carries (whose
difference borrows) in some column, or only those with none -- chosen among the templates' problems before the sample
is drawn, so ``n`` per operation still holds where the problems allow it.  Every technique then runs on those pairs
alone: the carry is a split of every result, not only of path patching's groups.  Additions and subtractions only;
``carry`` joins the params only when it chooses.
"""

from __future__ import annotations

import weakref
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from engine.numerics.intervals import share_texts
from engine.prompts.custom import CUSTOM_FAMILY, WrittenTemplate, check_kind, explain_dropped, parse_param
from engine.prompts.pairs import (
    ANSWER_TOKEN_RULE,
    ANY_CARRY,
    CARRY,
    CARRY_SETS,
    FIRST_DIGIT,
    OPERATOR_REMOVED,
    OperandRange,
    Problem,
    PromptError,
    PromptPair,
    build_pairs,
    check_carry_set,
    check_counterfactual,
    digit_words,
    parse_digit,
    sample_problems,
)
from engine.prompts.templates import FAMILIES, OPS, PAPER_FAMILIES, PAPER_OPS, WORD_PROBLEM_FAMILIES

FAMILY_GROUPS: dict[str, tuple[str, ...]] = {
    "paper": PAPER_FAMILIES,
    "word": WORD_PROBLEM_FAMILIES,
    # every family of the paper's operations plus exponentiation's own; the "notation" skill family
    # (typeset signs the bundled model was never taught) is only used when named
    "all": tuple(f for f in FAMILIES if f != "notation"),
}


#: Candidates sampled per wanted prompt when balancing (module docstring).
BALANCE_OVERSAMPLE = 10
#: Names the balance rule in the spec's params (change it when the rule changes: old cache entries stay apart).
BALANCE_RULE = f"round-robin over first answer tokens of {BALANCE_OVERSAMPLE}x n candidates per op (v1)"
#: A set whose most frequent first answer token holds more than this share gets a warning.
DOMINANT_SHARE = 0.40


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
    decimals: int = 0  # decimal places of the operands (Figure 4's rational numbers)
    balance: bool = True  # balanced first answer tokens (module docstring)
    #: every problem of the templates and operands instead of a sample of ``n`` per operation (``n`` and
    #: ``balance`` are then ignored): all the prompts the model can be asked, so all it answers right are kept --
    #: unbalanced, the first answer tokens follow the problems (every sum from 10 to 18 starts with "1")
    every: bool = False
    counterfactual: str = "operator-removed"  # what X_c changes (engine.prompts.pairs.COUNTERFACTUALS)
    #: templates written by a user, ``op:text`` (engine.prompts.custom); they replace ``families`` when given
    templates: tuple[str, ...] = ()
    #: the answer digit analysed: "first", "last" or the k-th token as text ("2"); engine.prompts.pairs.DIGITS
    digit: str = FIRST_DIGIT
    #: the problems kept by their carry: "any", "yes" (a carry / borrow in some column) or "no";
    #: engine.prompts.pairs.CARRY_SETS
    carry: str = ANY_CARRY

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise PromptError(f"n must be a positive number of prompts, got {self.n}")
        if self.n > 100_000:
            raise PromptError(f"n={self.n} is too large: at most 100000 prompts per operation")
        parse_ops(",".join(self.ops))
        check_counterfactual(self.counterfactual)
        if parse_digit(self.digit) != self.digit:
            raise PromptError(f"answer digit {self.digit!r}: write it as {parse_digit(self.digit)!r}")
        check_carry_set(self.ops, self.carry)
        if self.counterfactual == CARRY and any(op not in ("add", "sub") for op in self.ops):
            raise PromptError("the carry counterfactual is for additions and subtractions: keep only add and sub")
        for written in self.written:
            check_kind(written, self.counterfactual)
            if written.op not in self.ops:
                raise PromptError(f"the template '{written.text}' is a {written.op} template: add {written.op} to "
                                  f"the operations")
        OperandRange(self.operand_lo, self.operand_hi, self.allow_negative, self.max_exponent, self.decimals)

    def to_params(self) -> dict[str, Any]:
        d = asdict(self)
        d["ops"] = list(self.ops)
        d["families"] = list(self.families)
        d["answer_token_rule"] = ANSWER_TOKEN_RULE
        d["balance_rule"] = BALANCE_RULE if self.balance and not self.every else "none"
        if self.every:  # n and balance play no part: one set whatever they are
            d.update(n=EVERY_CAP, balance=False)
        else:  # a sample keeps the keys it had before the choice existed
            d.pop("every")
        if not self.decimals:  # integer sets keep the cache keys they had before decimals existed
            d.pop("decimals")
        if self.counterfactual == OPERATOR_REMOVED:  # the paper's X_c keeps the keys it had before the kinds
            d.pop("counterfactual")
        if self.carry == ANY_CARRY:  # a set of any carry keeps the keys it had before the choice existed
            d.pop("carry")
        if self.digit == FIRST_DIGIT:  # the first digit keeps the keys it had before the digit could be chosen
            d.pop("digit")
        if self.templates:  # written templates replace the families
            d["templates"] = list(self.templates)
            d["families"] = [CUSTOM_FAMILY]
        else:
            d.pop("templates")
        return d

    @property
    def written(self) -> tuple[WrittenTemplate, ...]:
        """The user's templates, checked (PromptError says what to change)."""
        return tuple(parse_param(t) for t in self.templates)

    @property
    def operand_range(self) -> OperandRange:
        return OperandRange(self.operand_lo, self.operand_hi, self.allow_negative, self.max_exponent, self.decimals)


#: "every problem": at most this many per operation (the paper's 8 templates of an operation over operands 1..9
#: give 648; a wider operand range is capped here, the first ones after the seeded shuffle)
EVERY_CAP = 100_000


@dataclass(frozen=True)
class GeneratedSet:
    pairs: list[PromptPair]               # the set, n per operation at most
    dropped: list[tuple[Problem, str]]    # candidates that could not be tokenized into a pair, and why
    candidates: int                       # problems sampled (BALANCE_OVERSAMPLE x n per op when balanced)


#: Other formats of the same problems (Figure 4's multi-digit integers and rational numbers, Figure 10's
#: word problems): the sets whose key heads and attention the paper transfers to (Fig. 4, Fig. 7).
FORMATS: dict[str, str] = {
    "word": "the Figure 10 word problems (additions)",
    "multi-digit": "multi-digit integers, operands 10..99 (Figure 4)",
    "decimals": "rational numbers with one decimal, 1.1..9.9 (Figure 4: \"The addition of 4.5 and 2.3 is\")",
}


def format_spec(spec: PromptSetSpec, fmt: str) -> PromptSetSpec:
    """``spec``'s problems in another format (:data:`FORMATS`): same size, the next seed, the paper's four
    operations of ``spec`` (additions only for the word problems)."""
    from dataclasses import replace
    ops = tuple(o for o in spec.ops if o in PAPER_OPS) or ("add",)
    if fmt == "word":
        return replace(spec, ops=("add",), families=WORD_PROBLEM_FAMILIES, templates=(), seed=spec.seed + 1)
    if fmt == "multi-digit":
        return replace(spec, ops=ops, operand_lo=10, operand_hi=99, decimals=0, seed=spec.seed + 1)
    if fmt == "decimals":
        return replace(spec, ops=ops, operand_lo=1, operand_hi=9, decimals=1, seed=spec.seed + 1)
    raise PromptError(f"unknown format {fmt!r}: choose from {', '.join(FORMATS)}")


def balanced(pairs: Sequence[PromptPair], n: int) -> list[PromptPair]:
    """Per operation, ``n`` pairs taken round-robin over the groups of equal first answer token.

    Groups are visited in order of their first appearance, each group in its own order, so the choice
    is as seeded as ``pairs``; the chosen pairs keep their original order.
    """
    chosen: set[int] = set()
    by_op: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for i, p in enumerate(pairs):
        by_op[p.op].setdefault(p.answer_id, []).append(i)
    for groups in by_op.values():
        queues = [list(reversed(g)) for g in groups.values()]
        taken = 0
        while taken < n and any(queues):
            for q in queues:
                if q and taken < n:
                    chosen.add(q.pop())
                    taken += 1
    return [p for i, p in enumerate(pairs) if i in chosen]


#: the sets generated with each tokenizer, by spec (a set is a function of the two): a page run asks for the same
#: sets many times -- its estimates, each counterfactual kind's -- and tokenizing 10 x n candidates per operation took
#: a quarter of a real model's Path patching page.  Weak keys: a tokenizer's sets go with it; at most MEMO_SETS each.
_SETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
MEMO_SETS = 256


def generate_set(tokenizer, spec: PromptSetSpec) -> GeneratedSet:
    """Tokenized pairs of the spec (balanced when ``spec.balance``; every problem when ``spec.every``), with every
    dropped candidate (each call its own lists; a spec generated before with this tokenizer is not tokenized
    again)."""
    try:
        memo = _SETS.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: generated each time
        memo = {}
    got = memo.get(spec)
    if got is None:
        got = memo[spec] = tokenized_set(tokenizer, spec)
        while len(memo) > MEMO_SETS:
            memo.pop(next(iter(memo)), None)
    return GeneratedSet(list(got.pairs), list(got.dropped), got.candidates)


def tokenized_set(tokenizer, spec: PromptSetSpec) -> GeneratedSet:
    """:func:`generate_set`'s work: the spec's problems sampled and tokenized into pairs, balanced."""
    n_sample = EVERY_CAP if spec.every else spec.n * BALANCE_OVERSAMPLE if spec.balance else spec.n
    written = spec.written
    problems = sample_problems(spec.ops, n_sample, spec.seed, operands=spec.operand_range,
                               families=spec.families, templates=[w.template for w in written], carry=spec.carry)
    pairs, dropped = build_pairs(tokenizer, problems, spec.counterfactual, spec.operand_range, spec.digit)
    if not pairs and written:
        raise PromptError(explain_dropped(written, [r for _, r in dropped], tokenizer))
    if not pairs:
        reason = dropped[0][1] if dropped else "no problems"
        if dropped and all(r.startswith("the answer has ") for _, r in dropped):
            raise PromptError(f"no answer of these problems has a {digit_words(spec.digit)} token: pick an earlier "
                              f"digit or wider operands")
        if dropped and all(r.startswith("no swapped operator") for _, r in dropped):  # the kind, not the tokenizer
            raise PromptError(f"{reason}: the operator-swapped counterfactual needs an operator with a paired "
                              f"operation (+ and -, * and /); pick other templates or another counterfactual")
        raise PromptError(f"no usable prompt pairs for this tokenizer: {reason}")
    if spec.balance and not spec.every:
        pairs = balanced(pairs, spec.n)
    return GeneratedSet(pairs, dropped, len(problems))


def problem_count(spec: PromptSetSpec) -> int:
    """How many problems the spec's templates and operands give in all (what ``every`` takes; a sample of ``n`` per
    operation takes at most ``n`` of each operation's)."""
    return len(sample_problems(spec.ops, EVERY_CAP, spec.seed, operands=spec.operand_range, families=spec.families,
                               templates=[w.template for w in spec.written], carry=spec.carry))


def sample_words(spec: PromptSetSpec) -> str:
    """How the spec picks its prompts, in the pages' words."""
    only = "" if spec.carry == ANY_CARRY else f" {CARRY_SETS[spec.carry]}"
    if spec.every:
        return f"every problem of its templates{only}"
    return f"{'a balanced sample' if spec.balance else 'a sample'} of {spec.n} per operation{only}"


def generate(tokenizer, spec: PromptSetSpec) -> tuple[list[PromptPair], int]:
    """Tokenized pairs of the spec, and how many candidates had to be dropped (no equal-length X_c)."""
    gen = generate_set(tokenizer, spec)
    return gen.pairs, len(gen.dropped)


# ---------------------------------------------------------------------------------------------
# answer-token distribution
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AnswerTokenStats:
    """Distribution of the first answer tokens of a set of pairs, in all and per operation."""

    n: int
    counts: dict[str, int]               # first answer token (as the tokenizer writes it) -> pairs, most first
    per_op: dict[str, dict[str, int]]    # the same per operation
    top_op: str                          # the operation whose most frequent token has the largest share
    top_token: str
    top_share: float                     # that token's share of that operation's pairs
    digit: str = FIRST_DIGIT             # the answer digit counted (the pairs' answer_id)

    @property
    def top_count(self) -> str:
        """How many of the top operation's pairs start with its top token, in words ("2 of 2")."""
        counts = self.per_op[self.top_op]  # most frequent first
        return f"{next(iter(counts.values()))} of {sum(counts.values())}"

    @property
    def warning(self) -> str | None:
        """A sentence when one token holds more than DOMINANT_SHARE of an operation's pairs, else None."""
        if self.top_share <= DOMINANT_SHARE:
            return None
        if self.digit != FIRST_DIGIT:
            which = digit_words(self.digit).split(" ")[0]
            return (f"{self.top_share:.0%} of the {self.top_op} prompts ({self.top_count}) have the same {which} "
                    f"answer token "
                    f"{self.top_token!r}: the analysis mostly measures whether the model predicts {self.top_token!r}. "
                    f"Balance the set (on by default); if it is balanced already, keeping only the prompts the model "
                    f"answers right unbalanced it: use more prompts or other operations.")
        return (f"{self.top_share:.0%} of the {self.top_op} prompts ({self.top_count}) have the same first answer "
                f"token {self.top_token!r}: the analysis mostly measures whether the model predicts "
                f"{self.top_token!r}. Balance the set's first answer tokens (on by default); if it is balanced "
                f"already, keeping only the prompts the model answers right unbalanced it: use more prompts or other "
                f"operations.")

    def summary(self) -> str:
        """One line (Markdown) for the pages: each token with its count and share."""
        shares = share_texts(list(self.counts.values()))  # equal counts, equal shares; 100 % where rounding allows
        return " · ".join(f"`{t}` {c} ({s})" for (t, c), s in zip(self.counts.items(), shares))

    def to_json(self) -> dict[str, Any]:
        d = {"n": self.n, "counts": self.counts, "per_op": self.per_op, "top_op": self.top_op,
             "top_token": self.top_token, "top_share": round(self.top_share, 4), "warning": self.warning}
        if self.digit != FIRST_DIGIT:
            d["digit"] = self.digit
        return d


def _token_counts(tokenizer, pairs: Sequence[PromptPair]) -> dict[str, int]:
    ids = Counter(p.answer_id for p in pairs)
    toks = tokenizer.convert_ids_to_tokens(list(ids))
    return {str(t): c for t, c in sorted(zip(toks, ids.values()), key=lambda x: (-x[1], str(x[0])))}


def answer_token_stats(tokenizer, pairs: Sequence[PromptPair], digit: str = FIRST_DIGIT) -> AnswerTokenStats:
    """How often each answer token at END (the first digit's, or ``digit``'s of a set read there) occurs in ``pairs``
    (real tokenization: the pairs' ids)."""
    if not pairs:
        raise PromptError("no prompt pairs: nothing to count")
    by_op: dict[str, list[PromptPair]] = defaultdict(list)
    for p in pairs:
        by_op[p.op].append(p)
    per_op = {op: _token_counts(tokenizer, ps) for op, ps in by_op.items()}
    top_op = max(per_op, key=lambda op: next(iter(per_op[op].values())) / len(by_op[op]))
    top_token, top_n = next(iter(per_op[top_op].items()))
    return AnswerTokenStats(len(pairs), _token_counts(tokenizer, pairs), per_op, top_op, top_token,
                            top_n / len(by_op[top_op]), digit)
