"""Templates you write: your own phrasing of a problem, checked, and run as a prompt family on every page.

A template is text with ``{A}`` and ``{B}`` where the operands go, ending where the answer starts (an optional
``{C}`` at the very end says so), with the word or sign that names the operation marked by ``[ ]``:
``{A} apples [and] {B} pears make``.  Its operation (add, sub, mul, div, pow) is chosen beside it; the word
pools of the paper's Figure 10 (``{NAME}``, ``{OBJECT}`` ...) may be used and are filled as there.

The counterfactual rule is the prompt set's kind (:data:`engine.prompts.pairs.COUNTERFACTUALS`): the paper's
``operator-removed`` replaces the marked word by a neutral word (none, nothing ...) -- a sign by a neutral symbol
(@, # ...) -- exactly as for the paper's templates; the operand kinds change A or B and need no mark.

:func:`parse_template` checks the text alone and says what to change; :func:`check_set` builds the set's pairs
with a tokenizer and turns every way that fails (the answer merging with the prompt, X_c never as long in
tokens as X_r) into a sentence that says what to change.  :func:`read_text_pairs` reads a JSONL file of written
pairs (prompt, counterfactual, answer), the same checks per line.  Nothing here runs a model: whether the model
answers the prompts right is the accuracy filter's (``engine.techniques.accuracy``), and
:func:`none_right_message` is its sentence for a template.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Sequence

from engine.prompts.pairs import (
    LENGTH_MISMATCH,
    OPERATOR_REMOVED,
    PromptError,
    PromptPair,
    TokenizerLike,
    answer_tokens,
)
from engine.prompts.templates import (
    CF_SYMBOLS,
    CF_WORDS,
    OPERATOR_TERMS,
    OPS,
    SLOT_POOLS,
    SWAPPED_OPERATOR_WORDS,
    Template,
)

#: The family name of every template written by a user (``PromptPair.family``, the sets' ``families``).
CUSTOM_FAMILY = "custom"
MAX_TEMPLATE_CHARS = 300
EXAMPLE = "{A} apples [and] {B} pears make"

_BRACES = re.compile(r"\{([^{}]*)\}")
_MARK = re.compile(r"\[([^\[\]]*)\]")


@dataclass(frozen=True)
class WrittenTemplate:
    """A checked template: its operation and its text with the operator marked (the form that is stored)."""

    op: str
    text: str

    @property
    def template(self) -> Template:
        digest = hashlib.sha256(f"{self.op}\0{self.text}".encode()).hexdigest()[:8]
        return Template(f"{CUSTOM_FAMILY}.{self.op}.{digest}", self.op, CUSTOM_FAMILY, self.text)

    @property
    def operator(self) -> str:
        return self.template.operator

    def as_param(self) -> str:
        """``add:{A} apples [and] {B} pears make`` -- the form of links and ``--template``."""
        return f"{self.op}:{self.text}"


def mark_operator(text: str, word: str) -> str:
    """``text`` with the first whole-word occurrence of ``word`` (outside ``{...}``) marked as the operator."""
    word = word.strip()
    if not word:
        return text
    if "[" in text or "]" in text:
        raise PromptError("the template marks its operator with [ ] already: pick the operator there, or remove "
                          "the brackets")
    edge = r"(?<![\w{])" if word[0].isalnum() else ""
    tail = r"(?![\w}])" if word[-1].isalnum() else ""
    m = re.search(edge + re.escape(word) + tail, text)
    if m is None:
        raise PromptError(f"the operator {word!r} is not a word of the template: pick one of its words")
    return f"{text[:m.start()]}[{word}]{text[m.end():]}"


def template_words(text: str) -> list[str]:
    """The words and signs of a template an operator can be (not the ``{...}`` slots), in order, once each."""
    plain = _BRACES.sub(" ", _MARK.sub(lambda m: f" {m.group(1)} ", text))
    return list(dict.fromkeys(re.findall(r"[^\W\d_]+|[^\w\s{}\[\]?.,:;!'\"]+", plain)))


def guess_operator(text: str) -> str:
    """The word of ``text`` marked ``[ ]``, else the first one the paper's templates use for an operation, else ""."""
    m = _MARK.search(text)
    if m:
        return m.group(1)
    return next((w for w in template_words(text) if w in OPERATOR_TERMS), "")


def parse_template(text: str, op: str) -> WrittenTemplate:
    """Check a template's text (module docstring); PromptError says what to change."""
    text = " ".join((text or "").split())
    if not text:
        raise PromptError(f"the template is empty: write a phrase with {{A}} and {{B}}, e.g. '{EXAMPLE}'")
    if len(text) > MAX_TEMPLATE_CHARS:
        raise PromptError(f"the template has {len(text)} characters: keep it under {MAX_TEMPLATE_CHARS}")
    if op not in OPS:
        raise PromptError(f"unknown operation {op!r}: choose from {', '.join(OPS)}")
    if text.count("{") != text.count("}") or text.count("[") != text.count("]"):
        raise PromptError("the template's braces { } or brackets [ ] do not pair up: close every one you open")
    if "{C}" in text:
        if text.count("{C}") > 1 or not text.endswith("{C}"):
            raise PromptError("the answer {C} must come last: the model is read where the answer starts, so end "
                              "the template with {C} (or leave {C} out)")
        text = text[:-3].rstrip()
    for name in ("A", "B"):
        count = text.count(f"{{{name}}}")
        if count == 0:
            raise PromptError(f"the template has no {{{name}}}: write {{{name}}} where operand {name} goes, "
                              f"e.g. '{EXAMPLE}'")
        if count > 1:
            raise PromptError(f"{{{name}}} appears {count} times: write each operand once")
    unknown = [s for s in _BRACES.findall(text) if s.rstrip("*") not in ("A", "B", *SLOT_POOLS)]
    if unknown:
        raise PromptError(f"unknown slot {{{unknown[0]}}}: use {{A}}, {{B}}, {{C}} at the end, or a word pool "
                          f"({', '.join('{' + s + '}' for s in ('NAME', 'OBJECT', 'EVENT', 'MONTH'))} ...)")
    marks = _MARK.findall(text)
    if len(marks) > 1:
        raise PromptError(f"{len(marks)} words are marked [ ]: mark only the one that names the operation")
    if marks and (not marks[0].strip() or "{" in marks[0]):
        raise PromptError("the operator [ ] must hold the word or sign that names the operation, not nothing "
                          "or an operand")
    if re.search(r"\{[AB]\}\W*$", text) and not text.endswith(("=", "?")):
        raise PromptError("the template ends with an operand, so the answer would read as its next digits: end it "
                          "with a word or sign such as 'is', 'make' or '='")
    return WrittenTemplate(op, text)


def parse_param(value: str) -> WrittenTemplate:
    """``op:text`` (a link's ``tpl=``, ``--template`` with its ``--op``) -> the checked template."""
    op, sep, text = (value or "").partition(":")
    if not sep or op.strip() not in OPS:
        raise PromptError(f"a template is written OP:TEXT with OP one of {', '.join(OPS)}, e.g. 'add:{EXAMPLE}'")
    return parse_template(text, op.strip())


def check_kind(written: WrittenTemplate, counterfactual: str) -> None:
    """The counterfactual kind needs what the template has: a marked operator for the operator kinds."""
    if counterfactual != OPERATOR_REMOVED and not counterfactual.startswith("operator"):
        return
    if not written.operator:
        raise PromptError(f"mark the word that names the operation with [ ] (e.g. '{EXAMPLE}'): the "
                          f"'{counterfactual.replace('-', ' ')}' counterfactual replaces it; or pick an operand "
                          "counterfactual")


def explain_dropped(written: Sequence[WrittenTemplate], reasons: Sequence[str], tokenizer: TokenizerLike) -> str:
    """Why no pair of the written templates could be built, and what to change (``reasons``: one per problem)."""
    if reasons and all(r == LENGTH_MISMATCH for r in reasons):
        ops = [w.operator for w in written if w.operator]
        if ops:
            word = ops[0]
            pool = CF_SYMBOLS if not any(c.isalpha() for c in word) else CF_WORDS
            n_op = len(tokenizer(f" {word}", add_special_tokens=False)["input_ids"])
            lens = sorted({len(tokenizer(f" {w}", add_special_tokens=False)["input_ids"]) for w in pool})
            return (f"the counterfactual never has as many tokens as the prompt: this tokenizer splits the operator "
                    f"{word!r} into {n_op} token(s) and the neutral {'symbols' if pool is CF_SYMBOLS else 'words'} "
                    f"({', '.join(pool)}) into {'/'.join(map(str, lens))}; pick an operator word of "
                    f"{'/'.join(map(str, lens))} token(s) or an operand counterfactual")
        return ("the counterfactual never has as many tokens as the prompt: the other operands of the range are "
                "written with other numbers of tokens; widen the operand range or pick another counterfactual")
    first = next(iter(reasons), "no problems")
    if reasons and all(r.startswith("no swapped operator") for r in reasons):
        words = [w for op in dict.fromkeys(t.op for t in written) for (o, w) in SWAPPED_OPERATOR_WORDS if o == op]
        if not words:
            return f"{first}: pick another counterfactual"
        return (f"{first}: the operator-swapped counterfactual replaces the marked operator by the paired operation's "
                f"(+ and -, * and /); mark one of {', '.join(repr(w) for w in words)}, or pick another counterfactual")
    return f"no prompt of the template could be used: {first}"


def none_right_message(n_generated: int, custom: bool, *, file: str | None = None) -> str:
    """The sentence for a set the model answers none of right (pages and CLI); ``file``: pairs read from it."""
    if file is not None:
        return (f"the model answers none of the {n_generated} pairs of {file} right: check each pair's answer, end "
                f"each prompt where the answer starts (with 'is', 'make' or '='), or try another model")
    if custom:
        return (f"the model answers none of the {n_generated} prompts of your template right: rephrase it so that "
                f"the answer follows naturally (end with 'is', 'make' or '='), try another operation, or another "
                f"model")
    return "the model answers none of these prompts right: pick other operations, more prompts or another model"


def template_from_typed(text: str) -> WrittenTemplate:
    """The template of a typed prompt ("What is 7 times 8?" -> "What is {A} [times] {B}?", mul): its operands
    replaced by ``{A}``/``{B}`` and its operator marked -- the Prompt lab's prompt as a whole set."""
    from engine.prompts.typed import locate_typed
    loc = locate_typed(text)
    spans = sorted([(loc.a_span, "{A}"), (loc.b_span, "{B}"), (loc.op_span, f"[{loc.problem.operator}]")],
                   reverse=True)
    out = text.rstrip()
    for (s, e), repl in spans:
        out = out[:s] + repl + out[e:]
    return parse_template(out, loc.problem.op)


def read_text_pairs(tokenizer: TokenizerLike, path: str) -> list[PromptPair]:
    """Written pairs from JSONL: ``{"prompt": ..., "counterfactual": ..., "answer": ..., "op": ...}`` per line
    (``op`` optional when the prompt names its operation as a typed prompt does); the answer-token rule applied to
    both, which must have the same length in tokens.  PromptError names the line and what to change."""
    from engine.prompts.typed import parse_typed_prompt
    pairs: list[PromptPair] = []
    try:
        with open(path, encoding="utf-8") as f:  # lines end at "\n" only: a prompt may hold U+2028
            lines = [line.rstrip("\n") for line in f]
    except OSError as e:
        raise PromptError(f"cannot read {path}: {e.strerror or e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("prompt", "counterfactual")) \
                or "answer" not in rec:
            raise PromptError(f"{where}: write an object with \"prompt\", \"counterfactual\" (text) and \"answer\"")
        try:
            parsed = parse_typed_prompt(rec["prompt"])
        except PromptError:
            parsed = None
        op = rec.get("op") or (parsed.op if parsed else None)
        if op is None:
            raise PromptError(f"{where}: say which operation it is, e.g. \"op\": \"add\"")
        if op not in OPS:
            raise PromptError(f"{where}: unknown operation {op!r}: choose from {', '.join(OPS)}")
        answer = _answer(rec["answer"], where)
        try:
            ref = answer_tokens(tokenizer, rec["prompt"].rstrip(), answer)
            cf = answer_tokens(tokenizer, rec["counterfactual"].rstrip(), answer)
        except PromptError as e:
            raise PromptError(f"{where}: {e}") from None
        if len(cf.prompt_ids) != len(ref.prompt_ids):
            raise PromptError(f"{where}: the counterfactual has {len(cf.prompt_ids)} tokens and the prompt "
                              f"{len(ref.prompt_ids)}: patching needs them aligned; change a word so both match")
        pairs.append(PromptPair(op=op, template=f"file.{lineno}", family=CUSTOM_FAMILY,
                                a=parsed.a if parsed else 0, b=parsed.b if parsed else 0,
                                answer=answer, ref_text=rec["prompt"].rstrip(),
                                cf_text=rec["counterfactual"].rstrip(), ref_ids=ref.prompt_ids,
                                cf_ids=cf.prompt_ids, answer_id=ref.answer_id, answer_ids=ref.answer_ids))
    if not pairs:
        raise PromptError(f"{path} holds no pairs: one JSON object per line")
    return pairs


def _answer(value, where: str) -> int | float:
    """A pair's answer as the number it is (``8``, ``"8"``, ``6.8``); PromptError otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PromptError(f"{where}: the answer {value!r} is not a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise PromptError(f"{where}: the answer {value!r} is not a finite number")
    return int(number) if number.is_integer() and "." not in str(value) else number


#: The cache method under which written templates are kept (one run each, no rows; ``params``: op, text).
SAVED_METHOD = "user_template"


def save_template(cache, written: WrittenTemplate) -> None:
    """Keep ``written`` in the result cache (``cache``: a ``cache.ResultCache``), listed by :func:`saved_templates`."""
    digest = hashlib.sha256(written.as_param().encode()).hexdigest()
    cache.put(f"{SAVED_METHOD}:{digest[:32]}", model_fingerprint="-", prompt_set_hash=digest, method=SAVED_METHOD,
              params={"op": written.op, "text": written.text}, rows=[])


def forget_template(cache, written: WrittenTemplate) -> bool:
    """Remove a saved template; True when it was saved."""
    digest = hashlib.sha256(written.as_param().encode()).hexdigest()
    return cache.delete(f"{SAVED_METHOD}:{digest[:32]}")


def saved_templates(cache) -> list[WrittenTemplate]:
    """The templates kept in the cache, newest first (ones that no longer pass the checks are left out)."""
    out = []
    for run in cache.list_runs(SAVED_METHOD):
        try:
            out.append(parse_template(run.params.get("text", ""), run.params.get("op", "")))
        except PromptError:
            continue
    return out


def unknown_words(tokenizer: TokenizerLike, written: WrittenTemplate) -> list[str]:
    """The template's words this tokenizer reads as its unknown token (a word-level vocabulary such as the bundled
    model's): the model cannot tell them apart."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return []
    return [w for w in template_words(written.text)
            if unk in tokenizer(f" {w}", add_special_tokens=False)["input_ids"]]
