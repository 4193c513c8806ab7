"""The dashboard's Streamlit settings (.streamlit/config.toml, read by ``python -m ui.serve`` from the checkout)."""

from __future__ import annotations

from pathlib import Path

import tomllib

CONFIG = Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml"


def test_no_full_garbage_collection_after_each_rerun():
    """Streamlit's ``runner.postScriptGC`` (on by default) runs gc.collect(2) after every script run; with a model's
    objects in memory it held the interpreter lock ~250 ms while the rerun's messages waited (Intervene's live
    update: 350 ms -> 120 ms, docs/benchmarks.md). The option must exist in the pinned Streamlit and be off here."""
    from streamlit import config
    assert "runner.postScriptGC" in config.get_config_options()
    assert tomllib.loads(CONFIG.read_text())["runner"]["postScriptGC"] is False


def test_loopback_and_no_file_watcher():
    server = tomllib.loads(CONFIG.read_text())["server"]
    assert server["address"] == "127.0.0.1" and server["fileWatcherType"] == "none"
