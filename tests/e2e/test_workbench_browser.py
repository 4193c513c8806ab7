"""Issue 51's walk in Chromium, on the bundled model: pin and annotate two heads on Path patching, save the workspace,
export it, open the file in a fresh browser; its view and the notes (as text) are back on Path patching."""

from __future__ import annotations

import json

from tests.e2e.conftest import WAIT, goto, idle

PROMPT = "Q: What is 7 plus 8? A:"
NOTES = {"1.1": "operand mover A", "5.5": "answer <i>writer</i>"}


def pin(page, server: str, path: str, head: str, note: str) -> None:
    """Open the Path patching link ``path`` (its head selected) and pin ``head`` with ``note``."""
    goto(page, server, path)
    idle(page)
    page.get_by_role("textbox", name=f"Note on head {head}").fill(note)
    page.keyboard.press("Tab")
    idle(page)
    page.get_by_role("button", name="Pin with this note").or_(page.get_by_role("button", name="Save the note")) \
        .first.click()
    idle(page)
    page.get_by_text(f"Pinned: head {head}").wait_for()  # the button's rerun draws it


def save_and_export(page, name: str, path):
    """On the Workspaces page, save the current view as ``name`` and export it to ``path``; the file's JSON."""
    page.get_by_role("link", name="Workspaces").first.click()
    idle(page)
    page.get_by_role("textbox", name="Save the current view as").fill(name)
    page.keyboard.press("Tab")
    idle(page)
    page.get_by_role("button", name="Save", exact=True).click()
    idle(page)
    with page.expect_download() as download:
        page.get_by_role("button", name="Export", exact=True).click()
    download.value.save_as(path)
    ws = json.loads(path.read_text())
    assert ws["name"] == name  # the one just saved, whatever another session saved meanwhile on the same dashboard
    return ws


def open_in_fresh_browser(browser, server: str, path, name: str):
    """A new browser context that opens the workspace file ``path`` (saved as ``name``): (context, page)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    fresh = ctx.new_page()
    fresh.set_default_timeout(WAIT)
    goto(fresh, server, "Workspaces")
    idle(fresh)
    fresh.locator("input[type=file]").set_input_files(str(path))
    idle(fresh)
    idle(fresh)
    fresh.get_by_text(f"Opened the file's workspace '{name}'").wait_for()
    return ctx, fresh


def test_pin_save_export_and_reopen_in_a_fresh_browser(server, page, browser, tmp_path):
    page.set_default_timeout(WAIT)
    for head, note in NOTES.items():
        pin(page, server, f"Path_patching?ops=add&n=20&head={head}&prompt=Q%3A+What+is+7+plus+8%3F+A%3A", head, note)
    path = tmp_path / "sevens.workspace.json"
    ws = save_and_export(page, "sevens", path)
    assert ws["state"]["prompt"] == PROMPT and ws["state"]["head"] == "5.5"
    assert {p["component"]: p["note"] for p in ws["pins"]}.items() >= NOTES.items()

    ctx, fresh = open_in_fresh_browser(browser, server, path, "sevens")
    try:
        fresh.get_by_role("link", name="Path patching").first.click()
        idle(fresh)
        assert fresh.get_by_text(PROMPT).count() >= 1
        fresh.get_by_text("Pinned: head 5.5").wait_for()
        assert fresh.get_by_text(NOTES["5.5"], exact=True).count() >= 1  # as typed: the tags shown, not applied
        assert fresh.locator("i", has_text="writer").count() == 0
    finally:
        ctx.close()
