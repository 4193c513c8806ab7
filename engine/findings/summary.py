"""Circuit summary: the paper's argument on the current model, one sentence per finding, each with its number.

Built only from results already in the cache (:func:`engine.results.cache_only`): nothing is computed
here.  Every step of :data:`engine.findings.steps.STEPS` with a ``sentence`` adds it, in the table's order --
the paper's: key heads (path patching, §4.1), the knockout (Fig. 3), what the heads read (attention, §4.2),
the MLPs that write the answer (Fig. 6), the logit lens, then the lab's steps beyond the paper.  Each
finding names the technique that shows it; one whose result is not cached yet says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.findings import steps
from engine.prompts.pairs import PromptPair
from engine.results import NotCached, cache_only


@dataclass(frozen=True)
class Finding:
    step: str       # the step's key: "key heads", "knockout", "attention", "MLPs", "logit lens" ...
    text: str       # the sentence, with its number; empty when not computed yet
    technique: str  # the registry name of the technique that shows it
    computed: bool


def circuit_summary(model, pairs: Sequence[PromptPair], cache) -> list[Finding]:
    """The findings available in ``cache`` for this model and prompt set (see module docstring)."""
    from engine.techniques.path_patching import cached_path_patching
    told = [s for s in steps.STEPS if s.sentence is not None]
    with cache_only():
        try:
            table, _ = cached_path_patching(model, pairs, cache=cache)
        except NotCached:  # every finding starts from the key heads
            return [Finding(told[0].key, "", told[0].technique, False)]
        out = []
        for s in told:
            text = s.summary_sentence()(model, pairs, cache, table)
            out.append(Finding(s.key, text or "", s.technique, text is not None))
    return out
