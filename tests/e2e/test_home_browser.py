"""The home page in real Chromium: facts and accuracy appear; a bad model path shows an error."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import ask_all, shot

pytestmark = pytest.mark.e2e


def test_home_page_renders_model_and_accuracy(server, page):
    t0 = time.time()
    page.goto(server)
    page.get_by_text("Arithmetic accuracy").first.wait_for(timeout=120_000)
    ask_all(page)  # on a busy machine the scoring waits for its button (its estimate is over the limit)
    page.get_by_text("first-token accuracy").first.wait_for(timeout=120_000)
    assert page.get_by_text("LlamaForCausalLM").count() >= 1
    print(f"home page with accuracy chart in {time.time() - t0:.1f}s")
    shot(page, "home")


def test_bad_model_path_shows_error(server, page):
    page.goto(server)
    page.get_by_text("Arithmetic accuracy").first.wait_for(timeout=120_000)
    box = page.get_by_label("Model", exact=True)
    box.fill("/no/such/model")
    page.get_by_role("button", name="Load model").click()
    page.get_by_text("does not exist").first.wait_for(timeout=60_000)
    shot(page, "home_bad_model")
