"""engine/progress.py: the CLI's tqdm bar (terminal only, --quiet) and the staged (done, total) count."""

from __future__ import annotations

import io
import re
import sys
import time

from engine.progress import Stages, cancel_check, cli_bar, current_check


class FakeTerminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def fileno(self) -> int:
        raise OSError("no file descriptor")  # as a terminal whose width cannot be read


def _run_bar(monkeypatch, tty: bool, quiet: bool) -> str:
    err = FakeTerminal(tty)
    monkeypatch.setattr(sys, "stderr", err)
    bar = cli_bar("knockout sets", quiet=quiet)
    for done in (2, 5, 9):
        time.sleep(0.15)  # tqdm redraws at most every 0.1 s
        bar(done, 9)
    bar.close()
    return err.getvalue()


def test_bar_with_counts_and_eta_on_a_terminal(monkeypatch):
    shown = _run_bar(monkeypatch, tty=True, quiet=False)
    assert "knockout sets" in shown and re.search(r"\b[25]/9 \[", shown), shown
    assert re.search(r"<\d\d:\d\d", shown) or "<?" in shown  # tqdm's ETA field


def test_silent_when_quiet_or_not_a_terminal(monkeypatch):
    assert _run_bar(monkeypatch, tty=True, quiet=True) == ""
    assert _run_bar(monkeypatch, tty=False, quiet=False) == ""


def test_stages_map_into_one_count():
    seen = []
    st = Stages(lambda d, t: seen.append((d, t)), [2, 1, 3])
    st.stage(0)(1, 2)
    st.finish(0)
    st.stage(2)(1, 3)
    st.finish(2)
    assert seen == [(1, 6), (2, 6), (4, 6), (6, 6)]
    assert Stages(None, [1]).stage(0) is None


def test_cancel_check_is_per_block():
    assert current_check() is None
    calls = []
    with cancel_check(lambda: calls.append(1)):
        current_check()()
    assert calls == [1] and current_check() is None


def test_a_page_computation_survives_a_short_disconnect(monkeypatch):
    """ui/progress.py: a browser session away for less than GONE_GRACE_S (a websocket reconnecting on a
    loaded server) does not cancel the computation; one away longer does."""
    from types import SimpleNamespace

    import ui.progress as progress
    bar = object.__new__(progress.ProgressBar)
    bar._ctx, bar._done, bar._total, bar._away_since = SimpleNamespace(session_id="s"), 0, 0, None
    active, clock = [True], [100.0]
    monkeypatch.setattr(progress, "_session_active", lambda ctx: active[0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    assert bar.reason() is None
    active[0] = False
    assert bar.reason() is None
    clock[0] += progress.GONE_GRACE_S - 0.5
    assert bar.reason() is None
    active[0] = True  # reconnected: the clock starts again at the next disconnect
    assert bar.reason() is None
    active[0] = False
    clock[0] += 1.0
    assert bar.reason() is None
    clock[0] += progress.GONE_GRACE_S
    assert bar.reason() == "gone"


def test_reproduce_names_the_row_it_computes_and_times_each_finished_one():
    """`engine reproduce`'s bar: a line per finished row with its seconds, the bar named after the next row."""
    from engine.cli.commands.reproduce import row_timer
    from engine.findings.paper import checked_steps

    class Bar:
        def __init__(self):
            self.notes, self.labels = [], []

        def note(self, line):
            self.notes.append(line)

        def relabel(self, label):
            self.labels.append(label)
    bar = Bar()
    done = row_timer(bar)
    keys = [s.key for s in checked_steps()]
    for key in ["inputs"] + keys:
        done(key)
    assert [n.rsplit(":", 1)[0] for n in bar.notes] == ["the report and the prompt sets"] + keys
    assert all(n.endswith(" s") for n in bar.notes)
    assert bar.labels == [f"reproduce: {k}" for k in keys]  # after the last row: no next label
