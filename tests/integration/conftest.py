"""Fixtures of the integration tests that check techniques on the bundled model against plain Hugging Face:
``plain`` (the same weights, plain transformers) and ``pairs`` (a small set the bundled model answers right);
``matrix_folder``, where the architecture matrix's results are stored.
A test module's own fixture of the same name wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from engine.models.spec import resolve_spec
from engine.prompts.promptsets import PromptSetSpec, generate
from tests.helpers.shared import shared_folder


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


@pytest.fixture(scope="session")
def matrix_folder(tmp_path_factory) -> Path:
    """Where the architecture matrix's results are stored: the run's shared folder (both xdist workers), else
    this process's own."""
    shared = shared_folder()
    return shared / "matrix" if shared is not None else tmp_path_factory.mktemp("matrix")
