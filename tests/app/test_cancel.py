"""A page computation nobody waits for is cancelled: no partial cache rows, the model lock free within a second.

The dashboard's :class:`ui.progress.ProgressBar` looks at the Streamlit session's pending request (a
rerun to another page, a stop, the Stop button) and at whether the browser session is still
connected, from its progress callback and from inside every forward pass (``cancellable``).  Here the
session is simulated: the same objects Streamlit gives the script thread, with a request arriving
while the knockout curve computes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.knockout_curve import cached_knockout_curve

pytestmark = pytest.mark.slow


@dataclass
class FakeRequests:
    """Streamlit's ScriptRequests as the progress bar reads it (state + rerun data under a lock)."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _state: str = "CONTINUE"
    _rerun_data: object = None


@dataclass
class FakeRerun:
    page_script_hash: str
    widget_states: object = None


@dataclass
class FakeCtx:
    script_requests: FakeRequests
    page_script_hash: str = "knockout-page"
    session_id: str = "s1"
    session_state: dict = field(default_factory=dict)


@pytest.mark.parametrize("request_kind", ["other_page", "session_stopped"])
def test_cancelled_computation_leaves_no_rows_and_frees_the_lock(model, tmp_path, monkeypatch, request_kind):
    from cache import ResultCache
    from ui.progress import Cancelled, ProgressBar, cancellable
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "c.duckdb"))
    cache = ResultCache()
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=40, seed=4))
    ranked = [(5, h) for h in range(8)] + [(4, 0), (4, 1)]
    bar = ProgressBar("Knocking out", key="t")
    ctx = FakeCtx(FakeRequests())
    bar._ctx = ctx  # the script thread's context, as get_script_run_ctx() gives it in the server
    asked = {}

    def leave() -> None:  # the browser asks for another page (or the session stops) 1 s in
        time.sleep(1.0)
        with ctx.script_requests._lock:
            if request_kind == "other_page":
                ctx.script_requests._state, ctx.script_requests._rerun_data = "RERUN", FakeRerun("other-page")
            else:
                ctx.script_requests._state = "STOP"
        asked["t"] = time.monotonic()
    threading.Thread(target=leave, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        with cancellable(bar):
            cached_knockout_curve(model, pairs, ranked, k_max=10, draws=30, cache=cache, progress=bar)
    ended = time.monotonic()
    assert "t" in asked and ended - asked["t"] < 1.0, f"cancelled {ended - asked.get('t', t0):.2f} s after the request"
    assert bar.eta() is None or bar.eta() > 1.0  # it was not about to finish anyway
    # the model lock is free: another thread takes it at once
    got = []
    th = threading.Thread(target=lambda: got.append(model._lock.acquire(timeout=0.5)) or model._lock.release())
    th.start()
    th.join()
    assert got == [True]
    # nothing of the cancelled computation is cached; the same computation later completes and is stored
    assert [r for r in cache.list_runs() if r.method == "knockout_curve"] == []
    pts, computed = cached_knockout_curve(model, pairs, ranked, k_max=2, draws=2, cache=cache)
    assert computed and len(pts) == 3
    assert len([r for r in cache.list_runs() if r.method == "knockout_curve"]) == 1


def test_computation_a_few_seconds_from_done_finishes(model, tmp_path, monkeypatch):
    """A request that arrives when the computation is about to end lets it finish into the cache."""
    from cache import ResultCache
    from ui.progress import FINISH_WINDOW_S, ProgressBar, cancellable
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "c.duckdb"))
    cache = ResultCache()
    pairs, _ = generate(model.tokenizer, PromptSetSpec(ops=("add",), n=10, seed=4))
    bar = ProgressBar("Knocking out", key="t2")
    ctx = FakeCtx(FakeRequests())
    bar._ctx = ctx
    etas = []

    def progress(done: int, total: int) -> None:  # the other page is asked for after the first pass
        with ctx.script_requests._lock:
            ctx.script_requests._state, ctx.script_requests._rerun_data = "RERUN", FakeRerun("other-page")
        bar(done, total)
        etas.append(bar.eta())
    with cancellable(bar):
        pts, computed = cached_knockout_curve(model, pairs, [(5, 0), (5, 1)], k_max=2, draws=3, cache=cache,
                                              progress=progress)
    assert computed and len(pts) == 3 and max(etas) < FINISH_WINDOW_S
    assert len([r for r in cache.list_runs() if r.method == "knockout_curve"]) == 1
