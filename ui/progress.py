"""Progress of a page computation: ``st.progress`` fed by the engine's callback, a Stop button, and
cancellation when the user leaves the page or the browser session ends."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, TypeVar

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException, StopException

from cache import CacheError
from engine.progress import cancel_check, collect_notes
from engine.prompts.pairs import PromptError

if TYPE_CHECKING:
    from engine.cost import Cost

T = TypeVar("T")
log = logging.getLogger(__name__)

FINISH_WINDOW_S = 3.0  # a computation this close to done finishes into the cache even when nobody waits
POLL_S = 0.25  # how often a running forward pass looks at the session (per-layer probe)
GONE_GRACE_S = 5.0  # a browser session disconnected this long is gone (a loaded server's websocket reconnects)


class Cancelled(StopException):
    """A page computation was stopped: Stop button, page left, or browser session gone.

    A ``StopException``: Streamlit ends the script run quietly and then serves whatever request is
    pending (the other page, the rerun after Stop); the cache stores nothing for the computation."""


def _pending(ctx) -> tuple[str, object | None]:
    """("continue" | "rerun" | "stop", rerun data) of the session's pending request; thread-safe."""
    req = getattr(ctx, "script_requests", None)
    if req is None:
        return "continue", None
    with req._lock:  # noqa: SLF001 - Streamlit keeps the pending request here (thread-safe under _lock)
        return str(getattr(req._state, "name", req._state)).lower(), req._rerun_data  # noqa: SLF001


def _session_active(ctx) -> bool:
    try:
        from streamlit.runtime import Runtime
        return Runtime.instance().is_active_session(ctx.session_id)
    except (RuntimeError, AttributeError):  # no server runtime (AppTest): the session is the test
        return True


class Overran(Exception):
    """A computation started unasked (:func:`compute_or_button`) ran past its time limit: stopped like a cancelled
    one (nothing stored, the model freed), so that the page asks instead.  ``projected``: its whole duration, judged
    from the share it had done."""

    def __init__(self, elapsed: float, projected: float) -> None:
        super().__init__(f"stopped after {elapsed:.1f} s of about {projected:.0f} s")
        self.elapsed, self.projected = elapsed, projected


class ProgressBar:
    """``st.progress`` fed by an engine callback: "k of N" and an ETA, a Stop button, and a
    computation that stops when nobody waits for it any more.

    Streamlit delivers a rerun (any click in the session) or a stop as an exception raised inside
    the next ``st.*`` call -- during a computation, inside the progress callback.  What happens then:

    * a click elsewhere on the same page: the exception is held back, the computation runs to the
      end and is stored in the cache, and :meth:`empty` raises it -- every result is computed once,
      however much the user clicks meanwhile;
    * **Stop** pressed, another page opened, the session stopped, or the browser session gone
      (tab closed, no request at all): the computation is cancelled (:class:`Cancelled`), unless it
      is less than ``FINISH_WINDOW_S`` from done (then it finishes into the cache).  The check also
      runs inside the forward passes (:meth:`check`, every layer, at most every ``POLL_S`` for the
      session's state), so the model lock is free within a fraction of a second.

    A cancelled computation leaves no cache row (the cache stores only finished computations).
    After Stop, the page shows "Stopped" and a Resume button instead of starting again.
    """

    limit_s: float | None = None  # an unasked computation: stopped (Overran) once it has worked longer
    _working_since: float | None = None  # the first sign of work: a check inside a forward pass, or a report

    def __init__(self, text: str, key: str | None = None, *, on_demand: bool = False,
                 limit_s: float | None = None) -> None:
        from streamlit.runtime.scriptrunner import get_script_run_ctx
        self.text = text
        self.limit_s = limit_s
        self.key = key or "".join(c if c.isalnum() else "_" for c in text.lower())
        self._ctx = get_script_run_ctx()
        flag = f"stopped:{self.key}"
        if on_demand:  # started by the page's own button: that click is the resume
            st.session_state.pop(flag, None)
        elif st.session_state.get(flag):
            st.warning(f"{text}: stopped. Nothing was stored; press Resume to compute it.")
            if not st.button("Resume", key=f"resume:{self.key}"):
                st.stop()
            del st.session_state[flag]
        self._bar = st.progress(0.0, text=f"{text} ...")
        self._stop = st.empty()
        self._stop.button("Stop", key=f"stop:{self.key}", help="Stop this computation (nothing is stored)")
        self._deferred: BaseException | None = None
        self._t0 = time.monotonic()
        self._done, self._total = 0, 0
        self._polled = 0.0
        self._away_since: float | None = None

    # -- the decision, from any thread ---------------------------------------------------------------
    def eta(self) -> float | None:
        if self._done <= 0 or self._total <= 0:
            return None
        elapsed = time.monotonic() - self._t0
        return elapsed * (self._total - self._done) / self._done

    def _stop_pressed(self, data) -> bool:
        states = getattr(data, "widget_states", None)
        suffix = f"-stop:{self.key}"
        return states is not None and any(w.id.endswith(suffix) and w.WhichOneof("value") == "trigger_value"
                                          and w.trigger_value for w in states.widgets)

    def reason(self) -> str | None:
        """Why the computation should stop now ("stop", "page", "gone"), or None to go on."""
        if self._ctx is None:
            return None
        state, data = _pending(self._ctx)
        if state == "rerun" and self._stop_pressed(data):
            return "stop"
        eta = self.eta()
        if eta is not None and eta < FINISH_WINDOW_S:
            return None  # a few seconds from done: finish into the cache
        if self.limit_s is not None and self.working_s() > self.limit_s:
            return "overran"
        if state == "stop":
            return "gone"
        if state == "rerun":
            page = getattr(data, "page_script_hash", "")
            if page and page != getattr(self._ctx, "page_script_hash", page):
                return "page"
        if _session_active(self._ctx):
            self._away_since = None
            return None
        now = time.monotonic()
        self._away_since = self._away_since or now
        return "gone" if now - self._away_since >= GONE_GRACE_S else None

    def working_s(self) -> float:
        """Seconds since the computation's first sign of work (a check inside a forward pass, which holds the model,
        or a progress report): the time it waited for the model, shared by every browser session, left out."""
        return 0.0 if self._working_since is None else time.monotonic() - self._working_since

    def check(self) -> None:
        """Raise :class:`Cancelled` if nobody waits for the computation any more (any thread; cheap:
        it looks at the session at most every ``POLL_S``)."""
        now = time.monotonic()
        if self._working_since is None:
            self._working_since = now
        if now - self._polled < POLL_S:
            return
        self._polled = now
        why = self.reason()
        if why is not None:
            self._cancel(why)

    def _cancel(self, why: str) -> None:
        if why == "overran":
            elapsed = self.working_s()
            share = self._done / self._total if self._total > 0 and self._done > 0 else 0.0
            log.warning("%s: stopped after %.1f s unasked (%d of %d)", self.text, elapsed, self._done, self._total)
            raise Overran(elapsed, elapsed / share if share else 2 * elapsed)
        if why == "stop" and self._ctx is not None:  # thread-safe: the check may run on a model thread
            self._ctx.session_state[f"stopped:{self.key}"] = True
        log.warning("%s: cancelled (%s) after %d of %d", self.text, why, self._done, self._total)
        raise Cancelled(f"{self.text}: cancelled ({why})")

    # -- the engine callback (script thread) ---------------------------------------------------------
    def __call__(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        self.check()
        if self._deferred is not None:
            return
        eta = self.eta()
        left = "" if eta is None else f" · about {eta:.0f} s left" if eta >= 1 else " · finishing"
        try:
            self._bar.progress(min(1.0, done / max(total, 1)), text=f"{self.text}: {done} of {total}{left}")
        except ScriptControlException as e:  # a rerun / stop request: decided on, or honoured in empty()
            self._deferred = e
            self._polled = 0.0
            self.check()

    def empty(self) -> None:
        self._bar.empty()
        self._stop.empty()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred


def progress_bar(text: str, key: str | None = None, *, on_demand: bool = False, limit_s: float | None = None
                 ) -> tuple[ProgressBar, ProgressBar]:
    """A progress bar with a Stop button and the engine callback that feeds it (the same object; run
    the computation inside ``with cancellable(bar):`` for a check inside the forward passes, and call
    ``.empty()`` after it).  ``on_demand``: the computation was started by a button of the page (no
    Resume button after a Stop: that button starts it again); ``limit_s``: see :class:`Overran`."""
    bar = ProgressBar(text, key, on_demand=on_demand, limit_s=limit_s)
    return bar, bar


def cancellable(bar: ProgressBar):
    """``with cancellable(bar):`` -- forward passes inside check ``bar`` at every layer."""
    return cancel_check(bar.check)


#: what a page computation reports as ``st.error`` (bad prompt set, cache trouble, bad input)
USER_ERRORS: tuple[type[BaseException], ...] = (PromptError, CacheError, ValueError)


def run_with_progress(text: str, failure: str, compute: Callable[[ProgressBar], T], *, key: str | None = None,
                      stop: bool = False, on_demand: bool = False, limit_s: float | None = None,
                      bars: list[ProgressBar] | None = None) -> T | None:
    """``compute(progress)`` under a progress bar with Stop (``on_demand``, ``limit_s``: see :func:`progress_bar`); a
    user error is one ``st.error`` ("Cannot {failure}: ...") and then None, or the end of the page when ``stop``.
    ``bars``: the bar is appended to it (its :meth:`ProgressBar.working_s` afterwards)."""
    bar, cb = progress_bar(text, key, on_demand=on_demand, limit_s=limit_s)
    if bars is not None:
        bars.append(bar)
    try:
        with cancellable(bar), collect_notes() as notes:
            out = compute(cb)
    except USER_ERRORS as e:
        bar.empty()  # nothing computes any more: the bar and its Stop button go, the error stays
        st.error(f"Cannot {failure}: {e}")
        if stop:
            st.stop()
        return None
    except Exception:  # a bug: its traceback, not a bar left at "finishing"
        bar.empty()
        raise
    bar.empty()
    for text_ in notes:  # a fast path that gave way to its textbook loop says so beside the numbers
        st.info(text_, icon=":material/info:")
    return out


UNASKED = "_unasked_s"  # seconds the page's current run has computed without a button press
OVERRUN = 1.5  # an unasked computation is stopped (and asked for) once the page run has spent this x HEAVY_S


def page_run_started() -> None:
    """A page run begins (``ui.session.setup_page``): nothing computed unasked yet."""
    st.session_state[UNASKED] = 0.0


def compute_or_button(compute: Callable[[ProgressBar | None], T], cost: "Cost | Callable[[], Cost]", *,
                      button: str, key: str, text: str, failure: str,
                      note: str | Callable[[], str] | None = None, stop: bool = False, model=None,
                      ask: bool = False) -> T | None:
    """The one gate of a page computation (nothing heavy unasked):

    * ``compute``'s result read from the cache when it holds it -- at once, no forward pass
      (``engine.results.cache_only``);
    * not cached, and ``cost`` (an ``engine.cost.Cost``, or a function giving it: called only on a miss) plus what
      this page run has already computed unasked at most ``engine.cost.HEAVY_S`` seconds: computed now under a
      progress bar (:func:`run_with_progress`);
    * else a button labelled "``button`` (estimated: about 40 s, 60 forward passes of the set)", with ``note``
      beside it (a function giving it: called only on a miss, as ``cost``): None until it is pressed, then
      computed under the progress bar (the button goes).

    None after a user error too (one ``st.error``, "Cannot {failure}: ..."); ``stop``: the page ends where this
    returns None.  ``model``: the backend the cost was estimated for -- the computation's measured seconds correct
    its next estimates (``engine.cost.observe``).  ``ask``: a button whatever the cost (a view the user opens on
    purpose: the knockout curve, the faithfulness curves, head -> head ...), labelled with the cost all the same."""
    from engine.cost import HEAVY_S, Cost, for_kind, observe, retime
    from engine.results import NotCached, cache_only
    try:
        with cache_only():
            return compute(None)
    except NotCached:
        pass
    except USER_ERRORS as e:
        return _failed(failure, e, stop)
    spent = float(st.session_state.get(UNASKED, 0.0))
    try:
        note = note() if callable(note) else note
        estimated = cost() if callable(cost) else cost
        c = estimated if model is None else for_kind(model, estimated, key)  # what this view took before, if measured
        if model is not None and callable(cost) and spent + c.seconds > HEAVY_S and retime(model):
            estimated = cost()  # the passes' timing was old and is faster now: a load that has passed
            c = for_kind(model, estimated, key)
    except USER_ERRORS as e:
        return _failed(failure, e, stop)

    def timed(on_demand: bool) -> T | None:
        bars: list[ProgressBar] = []
        # an unasked run that overran and the button's run can both happen in one script run: their bars' keys differ
        out = run_with_progress(text, failure, compute, key=key if on_demand else f"{key}:unasked", stop=stop,
                                on_demand=on_demand,
                                limit_s=None if on_demand else OVERRUN * HEAVY_S - spent, bars=bars)
        took = bars[0].working_s()  # its own work: waiting for the model behind other sessions is not
        if not on_demand:
            st.session_state[UNASKED] = spent + took
        if out is not None and model is not None:
            observe(model, estimated, took, kind=key)
        return out

    if not ask and spent + c.seconds <= HEAVY_S:
        try:
            return timed(False)
        except Overran as e:  # the estimate was short (a busy machine): stopped, nothing stored; ask instead
            st.session_state[UNASKED] = spent + e.elapsed
            if model is not None:
                observe(model, estimated, e.projected, kind=key)
            c = Cost(c.forward_equivalents, max(e.projected, c.seconds))
            note = f"{note + ' ' if note else ''}It was stopped after {e.elapsed:.0f} s: longer than estimated."
    go = st.empty()  # the button goes once pressed: nothing is left to press beside the result
    with go.container():
        pressed = st.button(f"{button} ({c.label()})", key=key,
                            help="The lab's cost model: forward passes counted from the code, seconds measured on "
                                 "this machine. The result is cached: next time it shows at once.")
        if not pressed and note:
            st.info(note)
    if not pressed:
        if stop:
            st.stop()
        return None
    go.empty()
    return timed(True)


def _failed(failure: str, e: BaseException, stop: bool) -> None:
    st.error(f"Cannot {failure}: {e}")
    if stop:
        st.stop()
    return None
