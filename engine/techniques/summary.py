"""Circuit summary: the paper's argument on the current model, one sentence per finding, each with its number.

Built only from results already in the cache (:func:`engine.results.cache_only`): nothing is computed
here.  Every technique of the registry (:mod:`engine.registry`) with a ``finding`` adds its sentence,
in the registry's order -- the paper's: key heads (path patching, §4.1), what they read (attention,
§4.2), the MLPs that write the answer (Fig. 6), the logit lens, the knockout (Fig. 3).  Each finding
names the page that shows it; one whose result is not cached yet says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.prompts.pairs import PromptPair
from engine.results import NotCached, cache_only


@dataclass(frozen=True)
class Finding:
    step: str      # "key heads", "attention", "MLPs", "logit lens", "knockout"
    text: str      # the sentence, with its number; empty when not computed yet
    page: str      # the page that shows it (URL path)
    computed: bool


def circuit_summary(model, pairs: Sequence[PromptPair], cache) -> list[Finding]:
    """The findings available in ``cache`` for this model and prompt set (see module docstring)."""
    from engine.registry import TECHNIQUES
    from engine.techniques.patching import cached_path_patching
    found = [t for t in TECHNIQUES if t.finding is not None]
    with cache_only():
        try:
            table, _ = cached_path_patching(model, pairs, cache=cache)
        except NotCached:  # every finding starts from the key heads
            return [Finding(found[0].step, "", found[0].page, False)]
        out = []
        for t in found:
            text = t.finding(model, pairs, cache, table)
            out.append(Finding(t.step, text or "", t.page, text is not None))
    return out
