"""`python -m engine report` writes one HTML file that opens in Chromium with no network and draws every chart."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import ARTIFACTS
from tests.integration.test_cli import run_cli

pytestmark = pytest.mark.e2e


def test_report_opens_offline_with_its_charts_drawn(browser, tmp_path):
    out, images = tmp_path / "report.html", tmp_path / "img"
    r = run_cli("report", "--model", "organism", "--op", "add,mul", "--n", "12", "--k-max", "4", "--draws", "2",
                "--out", str(out), "--images", str(images), cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["prompt_set"]["n_kept"] > 0 and len(res["prompt_set"]["hash"]) >= 16
    charts = ("patching", "roles", "projections", "lens", "knockout", "circuit")
    assert sorted(p.name for p in images.iterdir()) == sorted(f"{n}.{e}" for n in charts for e in ("svg", "png"))
    ctx = browser.new_context(offline=True, viewport={"width": 1100, "height": 3000})
    requests: list[str] = []
    ctx.on("request", lambda req: requests.append(req.url))
    page = ctx.new_page()
    page.goto(out.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.chart').length === 6 && "
                           "document.querySelectorAll('.chart svg.marks').length === 6", timeout=60_000)
    assert page.get_by_text("chart error").count() == 0
    text = page.inner_text("body")
    assert "fingerprint" in text and res["prompt_set"]["hash"] in text and "transformer-lens" in text
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    ctx.close()
