"""The paper's argument, one :class:`Step` per finding, in the paper's order: identify the key heads, validate
them by knockout, analyse what they read and what the MLPs write, carry the finding to other formats, tasks
and models, improve the model by tuning the key heads.

Every reader of the argument iterates over :data:`STEPS` (read it as ``steps.STEPS`` at call time):

* the circuit summary (:func:`engine.findings.summary.circuit_summary`; Home, the report): each step with a
  ``sentence`` -- the technique's own sentence from cached results;
* the paper's verdicts (:func:`engine.findings.paper.paper_findings`; the Paper page, ``engine reproduce``,
  the report): each step with a ``check`` (:mod:`engine.findings.checks`);
* the Story page (``ui/story.py``): one screen per distinct ``story`` title, in this order.

A step names the technique that shows it by its registry name (``technique``); the dashboard maps that name
to a page.  Adding a finding is one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from engine.findings import checks

TECHNIQUES = "engine.techniques."


@dataclass(frozen=True)
class Step:
    key: str                    # the finding's name: summary label, Paper row, Story screen
    figure: str                 # where the paper shows it ("Fig. 2 / 15"; "" = beyond the paper)
    claim: str                  # the paper's finding, in words
    paper: str                  # the paper's number
    technique: str              # the registry name of the technique that shows it
    sentence: str | Callable | None = None  # "module:function" under engine.techniques (or a function):
    #                             (model, pairs, cache, table) -> the summary sentence from cached results, or None
    check: Callable[[checks.Evidence], checks.Verdict] | None = None  # the paper's verdict on this model
    weight: int = 10            # its share of the Paper page's progress bar
    story: str = ""             # the Story screen that tells it ("" = none; steps may share a screen)

    def summary_sentence(self) -> Callable | None:
        """The sentence function (imported on use: the techniques load torch)."""
        if self.sentence is None or callable(self.sentence):
            return self.sentence
        mod, _, fn = self.sentence.partition(":")
        return getattr(importlib.import_module(TECHNIQUES + mod), fn)


STEPS: tuple[Step, ...] = (
    Step("key heads", "Fig. 2 / 15", "Fewer than 5 % of the heads matter for the answer", "< 5 % of heads",
         "path-patching", "path_patching:finding", checks.key_heads, 40, "A few key heads"),
    Step("knockout", "Fig. 3", "Knocking out the top heads collapses accuracy; random heads do not",
         "top-10 -69 %, random within -2 %", "knockout-curve", "knockout_curve:finding", checks.knockout, 20,
         "Knock out the key heads"),
    Step("attention", "Fig. 5", "The key heads attend to the operands and the operator",
         "attention mostly on operands / operators", "attention", "attention:finding", checks.attention, 10,
         "What the top head reads"),
    Step("MLPs", "Fig. 6 / 13 / 14", "Later MLPs write the answer (output aligned with W_U[C])",
         "layers 17-28 of 32 lift C", "mlp-projections", "mlp_projections:finding", checks.mlps, 10,
         "The MLPs write the answer"),
    Step("logit lens", "", "The answer appears in the residual stream in the later layers",
         "", "logit-lens", "logit_lens:finding", story="The MLPs write the answer"),
    Step("numbers", "", "The answer is linearly decodable from the residual stream, and the model uses it",
         "", "numbers", "numbers:finding"),
    Step("faithfulness", "MIB", "Circuits of the top components beat random circuits of the same size",
         "beyond the paper (MIB's CPR: area under the faithfulness curve)", "faithfulness", "faithfulness:finding",
         checks.faithfulness, 20),
    Step("transfer", "Fig. 7", "The key heads' attention transfers to unseen formats (multi-digit, decimals, words)",
         "attention mainly on the operands", "transfer", check=checks.transfer),
    Step("power", "Table 3", "Exponentiation has key heads too; knocking them out hurts",
         "-66 % (^) / -62 % (to the power of)", "knockout", check=checks.power, weight=30),
    Step("gsm8k", "Table 4", "GSM8K's key heads overlap the templates'; knocking them out hurts",
         "6 of 10 shared; -65 % on GSM8K", "transfer", check=checks.gsm8k, weight=30),
    Step("models", "Fig. 12", "Other models show the same sparse key heads", "sparse in LLaMA2-13B, Mistral-7B",
         "path-patching", check=checks.models),
    Step("sft", "Tables 1 / 2 / 5", "Precise SFT of the key heads matches full SFT",
         "LLaMA2-7B GSM8K +12.8 precise vs +10.0 full (Table 1)", "finetune", check=checks.sft,
         story="Improve with precise SFT"),
)


def step(key: str) -> Step:
    """The step called ``key``; KeyError with the table's keys otherwise."""
    for s in STEPS:
        if s.key == key:
            return s
    raise KeyError(f"no step {key!r}: the steps are {', '.join(s.key for s in STEPS)}")
