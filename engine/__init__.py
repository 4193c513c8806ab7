"""The arithmetic-circuits lab's engine: the public API a notebook needs, in one import.

    from engine import open_model, PromptSetSpec, kept_pairs, cached_path_patching, Knockout, ...

Names are imported lazily on first use (PEP 562), so ``import engine`` and the CLI's argument
checks stay fast; each name lives in the module shown below.  ``docs/notebook.md`` walks through
them (the tests run it).  The subpackages by concern:

* ``engine.models``      -- resolve a spec safely, load it, facts, weights fingerprint
* ``engine.backends``    -- the narrow :class:`ModelBackend` (TransformerBridge / nnsight), hook names,
  THE per-architecture table of module names (``layouts``)
* ``engine.prompts``     -- the paper's templates, prompt pairs and the answer-token rule, prompt sets
* ``engine.techniques``  -- one module per technique (path patching, knockout, knockout curve, attention,
  MLP projections, attribution, head/position patching, logit lens, numbers, transfer, faithfulness,
  stability, carries, circuit) + batching
* ``engine.results``     -- every technique through the DuckDB result cache
* ``engine.findings``    -- the paper's argument, one step per finding: summary, verdicts, report
* ``engine.evaluation``, ``engine.finetune``, ``engine.organism``, ``engine.cli``
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
API: dict[str, str] = {
    # models and backends
    "open_model": "engine.backends",
    "ModelBackend": "engine.backends.base",
    "ModelFacts": "engine.models.facts",
    "ModelLoadError": "engine.models.spec",
    # prompts
    "PromptSetSpec": "engine.prompts.promptsets",
    "generate": "engine.prompts.promptsets",
    "answer_token_stats": "engine.prompts.promptsets",
    "PromptPair": "engine.prompts.pairs",
    "PromptError": "engine.prompts.pairs",
    "typed_prompt_ids": "engine.prompts.typed",
    "parse_template": "engine.prompts.custom",
    "read_text_pairs": "engine.prompts.custom",
    # techniques (the paper's steps)
    "kept_pairs": "engine.techniques.accuracy",
    "accuracy_report": "engine.techniques.accuracy",
    "path_patching": "engine.techniques.path_patching",
    "cached_path_patching": "engine.techniques.path_patching",
    "PatchingTable": "engine.techniques.path_patching",
    "Knockout": "engine.techniques.knockout",
    "mean_activations": "engine.techniques.knockout",
    "knockout_accuracy": "engine.techniques.knockout",
    "knockout_curve": "engine.techniques.knockout_curve",
    "top_next_tokens": "engine.techniques.knockout",
    "role_attention": "engine.techniques.attention",
    "prompt_attention": "engine.techniques.attention",
    "mlp_projections": "engine.techniques.mlp_projections",
    "logit_lens": "engine.techniques.logit_lens",
    "attribution": "engine.techniques.attribution",
    "transfer": "engine.techniques.transfer",
    "cached_faithfulness": "engine.techniques.faithfulness",
    "mib_submission": "engine.techniques.faithfulness",
    "head_stability": "engine.techniques.stability",
    "what_heads_carry": "engine.techniques.carries",
    "circuit_diagram": "engine.techniques.circuit",
    "edge_diagram": "engine.techniques.circuit",
    "Intervention": "engine.techniques.intervene",
    "intervene": "engine.techniques.intervene",
    "parse_targets": "engine.techniques.intervene",
    "number_token": "engine.techniques.intervene",
    "class_mean_direction": "engine.techniques.numbers.directions",
    "number_direction": "engine.techniques.numbers.directions",
    "probe_direction": "engine.techniques.numbers.directions",
    # pins and notes (kept per model in the result cache)
    "pin": "engine.findings.notes",
    "unpin": "engine.findings.notes",
    "pins": "engine.findings.notes",
    # the paper's argument
    "circuit_summary": "engine.findings.summary",
    "paper_findings": "engine.findings.paper",
    "reproduce": "engine.findings.paper",
    # the result cache
    "ResultCache": "cache",
}

__all__ = sorted(API)


def __getattr__(name: str) -> Any:
    if name not in API:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
