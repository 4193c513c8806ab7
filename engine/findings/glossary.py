"""The lab's words in plain words: one or two sentences each, for a student who has not read the paper.

Each :class:`Term` is one word or phrase as the pages write it (``name``), other spellings of it (``aliases``:
``END`` is also "the last position") and what it means (``plain``), checked against the paper (Zhang et al.
2024, §3-§4) and docs/methods.md.  The dashboard shows them beside the Story's steps ("Words used here") and
in the ``help=`` icons of the controls that use them (:func:`help_text`); the report and the CLI can read
the same table.  Plain data: no torch, no Streamlit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One word of the lab and its meaning in plain words."""

    name: str                      # as the pages write it ("answer logit")
    plain: str                     # one or two plain sentences
    aliases: tuple[str, ...] = ()  # other ways the pages write it ("the last position")


TERMS: tuple[Term, ...] = (
    Term("token", "The pieces a language model reads and writes, one at a time: a word, part of a word, a digit "
                  "or a sign. `3 + 5 =` is a few tokens; the model predicts the next one."),
    Term("prompt", "The text the model is given, e.g. `The sum of 3 and 5 is`; the model's answer is the token it "
                   "predicts next. The paper calls it the reference prompt, X_r.", ("X_r", "reference prompt")),
    Term("operand", "One of the two numbers of the problem: A and B in `A + B`.", ("operand A", "operand B")),
    Term("operator", "The word or sign that names the operation: `+`, `plus`, `times`, `divided by`."),
    Term("counterfactual", "The same prompt with one thing changed: by default the operator becomes a meaningless "
                           "word or sign (`3 @ 5 =`), so the prompt no longer asks for the answer. Comparing the "
                           "model on the prompt (X_r) and on its counterfactual (X_c) shows which parts of it carry "
                           "what was changed.",
         ("X_c", "counterfactual prompt")),
    Term("END", "The position of the prompt's last token. The model predicts the answer there, so the lab reads "
                "everything at this position.", ("the last position", "the last token", "last-token")),
    Term("layer", "A model is a stack of layers, each with attention heads and then an MLP; information flows "
                  "from layer 0 upwards, and the last layer's result becomes the prediction."),
    Term("attention head", "A small part of a layer that chooses which earlier tokens to look at and copies "
                           "information from them to the current position. The lab names a head layer.head: 1.3 is "
                           "head 3 of layer 1.", ("head", "heads")),
    Term("attention", "How a head at one position spreads its looking over the earlier tokens: weights that add "
                      "up to 1 (97 % on one token means it reads almost only that token).",
         ("attention weight", "END-row attention")),
    Term("attention sink", "The first token, where many heads put the attention they do not need; a high weight "
                           "there means the head reads little else.", ("first token",)),
    Term("token role", "What a token is in the problem: operand A, operand B, the operator, the first token, or "
                       "other (template words such as `is`). Circuits at token positions count END, the last "
                       "position, as a role of its own and the first token as other.", ("role", "by role")),
    Term("MLP", "The second part of every layer (a multi-layer perceptron): it works on each position on its "
                "own, after the heads. In the paper, later MLPs write the answer.", ("MLPs",)),
    Term("residual stream", "The running list of numbers (a vector) at each position that every head and MLP "
                            "reads from and adds its output to; at END, the last layer's stream becomes the "
                            "prediction.", ("residual",)),
    Term("logit", "The model's raw score for each possible next token, before the scores are turned into "
                  "probabilities; a higher logit means a more likely token.", ("logits",)),
    Term("probability", "The chance the model gives a token to come next (P); the probabilities of all tokens "
                        "add up to 1.", ("P(answer)",)),
    Term("answer logit", "The logit of the answer's token at END -- its first digit, or the digit the sidebar's "
                         "Answer digit picks (the digits before it given to the model): how strongly the model "
                         "votes for the right answer. The lab's measurements are changes of this number."),
    Term("rank", "The answer's place among all tokens, most likely first: rank 1 means the model would write "
                 "it.", ("median rank", "top-1")),
    Term("unembedding", "The model's last matrix, W_U: it turns the residual stream at a position into one logit "
                        "per token of the vocabulary.", ("W_U",)),
    Term("W_U[C]", "The unembedding's direction for the answer token C: a vector pointing along it raises the "
                   "answer's logit. cos(x, W_U[C]) says how much x points towards the answer."),
    Term("cosine", "How much two vectors point the same way: 1 the same direction, 0 unrelated, −1 opposite.",
         ("cos",)),
    Term("path patching", "Run the prompt, but give one head (or MLP) its output from the counterfactual at END "
                          "while every other head keeps its normal output; the change in the answer logit says "
                          "how much the answer depends on that one component (the paper's §4.1)."),
    Term("effect", "Path patching's measure: the change of the answer logit divided by the answer logit "
                   "(relative change). −0.30 means the answer logit drops by 30 % when that component sees the "
                   "counterfactual: the component carries the operation."),
    Term("logit difference", "The change of the answer logit itself: patched minus original (logit_diff). "
                             "Negative means the component helped produce the answer.", ("logit_diff",)),
    Term("key heads", "The few heads whose path patching lowers the answer logit most (the most negative "
                      "effect); the top-k are the k first of them.", ("top-k", "top k", "key head")),
    Term("knockout", "Switching a component off: its output is replaced by its average over the counterfactual "
                     "prompts (mean ablation), so it carries nothing about the operation. If accuracy collapses, "
                     "the component was needed.", ("mean ablation", "knock out", "knocked out", "ablation")),
    Term("accuracy", "The share of prompts whose answer's first token is the model's most likely next token "
                     "(first-token accuracy).", ("first-token accuracy",)),
    Term("logit lens", "Reading the residual stream after each layer as if the model stopped there (through its "
                       "final norm and unembedding): the layer where the answer appears."),
    Term("MLP projection", "How much an MLP's input points to the operands (W_U[A], W_U[B]) and how much what it "
                           "adds points to the answer (W_U[C]), as cosines, layer by layer (the paper's Fig. 6).",
         ("MLP projections",)),
    Term("faithfulness", "How much of the model's answer a circuit keeps when everything outside it is switched "
                         "off: f = (circuit − nothing) / (model − nothing); 1 keeps it all, 0 nothing.", ("f",)),
    Term("circuit", "The few components that do the task (here the top heads and MLPs), with everything else "
                    "switched off."),
    Term("CPR", "Circuit performance ratio (MIB): the area under the faithfulness curve over the circuit sizes; "
                "higher is better."),
    Term("CMD", "Circuit-model distance (MIB): the area between the faithfulness curve and 1 (the whole model); "
                "lower is better."),
    Term("bootstrap interval", "The range a number would take on another sample of prompts like these: the "
                               "prompt pairs are redrawn with replacement 1000 times and the number recomputed; "
                               "the middle 95 % of the results is the interval.",
         ("95 % interval", "interval", "intervals", "95 % bootstrap interval")),
    Term("shuffled head labels", "A chance baseline: each prompt pair's head effects are shuffled among the heads "
                                 "before the top heads' share is computed. Top heads that carry no more than under "
                                 "shuffled labels stand out by chance only."),
    Term("attribution patching", "A fast estimate of patching from one gradient (AtP) instead of one run per "
                                 "component; the lab shows it beside the exact value.", ("AtP",)),
    Term("edge", "A link in the model's graph from a sender (the input, a head, an MLP) to what a receiver reads "
                 "(a head's query, key or value, an MLP's input, the logits). An edge circuit keeps some links and "
                 "cuts the rest; at token positions, a link can be kept at END and cut at the operands.",
         ("edges", "edge × position", "node × position")),
    Term("EAP", "Edge attribution patching: attribution patching for every edge at once, from one gradient; EAP-IG "
                "averages the gradient over points between the counterfactual and the prompt (integrated "
                "gradients), MIB's most faithful way to rank edges.", ("EAP-IG",)),
    Term("forward pass", "One run of the model over a batch of prompts: the lab's unit of cost.",
         ("forward passes",)),
    Term("precise SFT", "Fine-tuning (supervised) only the key heads' weights and leaving the rest of the model as "
                        "it was (the paper's §4.3); full SFT tunes every weight.", ("SFT", "fine-tuning")),
)

_BY_NAME = {t.name.lower(): t for t in TERMS}
_ALIAS = {a.lower(): t for t in TERMS for a in t.aliases}


def term(name: str) -> Term:
    """The term called ``name`` (or one of its aliases), case-insensitive; KeyError naming the terms otherwise."""
    key = name.strip().lower()
    found = _BY_NAME.get(key) or _ALIAS.get(key)
    if found is None:
        raise KeyError(f"no glossary term {name!r}: the terms are {', '.join(t.name for t in TERMS)}")
    return found


def terms(*names: str) -> list[Term]:
    """The terms called ``names``, in that order, each once."""
    return list(dict.fromkeys(term(n) for n in names))


def define(name: str) -> str:
    """``name``'s plain meaning."""
    return term(name).plain


def help_text(*names: str, lead: str = "") -> str:
    """A help icon's text: ``lead`` (what the control does), then each term in bold with its meaning."""
    lines = [lead] if lead else []
    lines += [f"**{t.name}**: {t.plain}" for t in terms(*names)]
    return "\n\n".join(lines)


def used_in(text: str) -> list[Term]:
    """The terms whose name or an alias appears in ``text`` as a whole word (case-insensitive, but ``END`` and the
    other short ones as written), in the order of :data:`TERMS`; a word inside a longer one found ("logit" in
    "answer logit") does not count."""
    spans = []
    for t in TERMS:
        for word in (t.name, *t.aliases):
            flags = 0 if word.isupper() or len(word) <= 3 else re.IGNORECASE
            spans += [(m.start(), m.end(), t) for m in re.finditer(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text,
                                                                     flags)]
    taken: list[tuple[int, int]] = []
    found = set()
    for start, end, t in sorted(spans, key=lambda s: s[0] - s[1]):  # longest first
        if all(end <= a or start >= b for a, b in taken):
            taken.append((start, end))
            found.add(t.name)
    return [t for t in TERMS if t.name in found]
