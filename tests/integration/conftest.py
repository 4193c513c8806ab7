"""Fixtures of the integration tests that check techniques on the bundled model against plain Hugging Face:
``plain`` (the same weights, plain transformers) and ``pairs`` (a small set the bundled model answers right).
A test module's own fixture of the same name wins."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from engine.models.spec import resolve_spec
from engine.prompts.promptsets import PromptSetSpec, generate


@pytest.fixture(scope="module")
def plain():
    """The same weights as a plain transformers model (eager attention, no bridge)."""
    m = AutoModelForCausalLM.from_pretrained(resolve_spec("organism").load_target, attn_implementation="eager")
    return m.eval()


@pytest.fixture(scope="module")
def pairs(model):
    from engine.techniques.accuracy import keep_correct
    ps, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=5))
    return keep_correct(model, ps)
