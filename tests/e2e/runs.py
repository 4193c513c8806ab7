"""When has a Streamlit page finished what it was asked to do?  Read from its runs, not from a fixed pause.

Streamlit marks its app root with the state of the script run (``data-test-script-state``: ``running`` while a run
goes, ``notRunning`` once it is over).  The state alone cannot tell a run that is over from one that has not started
yet: a click reaches the server, and the run it causes starts, some milliseconds later (more on a loaded machine).
A fixed pause before reading the state (300 ms, until 2026-12-06) waited on every call, also where nothing had been
asked, and still missed a run that started later than the pause.

So every page gets a small recorder (:data:`RECORDER`, installed before the page's own scripts run): it counts the
runs (a change of the state to a busy one) and the user's input (pointer, key, input and change events, seen in the
capture phase), each with its time, and the time of the last change of the page's DOM.  :func:`idle` then waits until
the state is ``notRunning`` (for :data:`QUIET_MS`, so that a run that asks for another -- ``st.rerun`` -- is seen) and

* on a page just opened: its first run has been seen, or :data:`GRACE_MS` have passed;
* after input since the last :func:`idle`: a run started after the last input, or :data:`GRACE_MS` have passed
  since it (input that asks for no run: a tab, an expander, a text not yet entered);
* with nothing asked since the last :func:`idle`: at once.

Where the recorder cannot tell (its page opened before it, a run it did not see), the wait is the old one: the
grace, then the state.  :func:`charts_drawn` waits, at most a few seconds and without failing, until every chart on
view has been drawn by Vega and the page's DOM has been still for a moment.
"""

from __future__ import annotations

import itertools
import weakref

#: how long the state must stay ``notRunning`` before a run counts as over (ms)
QUIET_MS = 100
#: how long a page may take to start the run a click or a new page asks for, where no run is seen (ms)
GRACE_MS = 300

#: the recorder, one per document (``window.__runs``)
RECORDER = """(() => {
  if (window.__runs) return;
  const BUSY = new Set(['running', 'rerunRequested', 'stopRequested']);
  const r = window.__runs = {runs: 0, busy: false, runAt: -1, changeAt: performance.now(), inputs: 0,
                             inputAt: -1, domAt: performance.now(), acked: null, token: null, t0: 0, last: null};
  r.state = () => {
    const a = document.querySelector('[data-testid="stApp"]');
    return a ? a.getAttribute('data-test-script-state') : null;
  };
  r.sample = () => {
    const v = r.state();
    if (v === r.last) return;
    const now = performance.now();
    r.changeAt = now;
    if (BUSY.has(v) && !r.busy) { r.runs += 1; r.runAt = now; }
    r.busy = BUSY.has(v);
    r.last = v;
  };
  const seen = () => { r.inputs += 1; r.inputAt = performance.now(); };
  for (const t of ['pointerdown', 'click', 'keydown', 'input', 'change']) window.addEventListener(t, seen, true);
  new MutationObserver(r.sample)
    .observe(document, {subtree: true, attributes: true, attributeFilter: ['data-test-script-state']});
  new MutationObserver(() => { r.domAt = performance.now(); }).observe(document, {subtree: true, childList: true});
})()"""

#: the page is done: the arguments are [token, quiet, grace]
_DONE = """([token, quiet, grace]) => {
  const r = window.__runs;
  if (!r) return false;
  const now = performance.now();
  if (r.token !== token) { r.token = token; r.t0 = now; }
  r.sample();
  if (r.state() !== 'notRunning' || now - r.changeAt < quiet) return false;
  let done = true;
  if (r.acked === null) done = r.runs > 0 || now - r.t0 >= grace;  // the inputs counted at the last idle
  else if (r.inputs > r.acked) done = r.runAt > r.inputAt || now - Math.max(r.inputAt, r.t0) >= grace;
  if (done) r.acked = r.inputs;
  return done;
}"""

#: every chart on view drawn, and the DOM still for [quiet] ms
_DRAWN = """([quiet]) => {
  const r = window.__runs;
  if (r && performance.now() - r.domAt < quiet) return false;
  return [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
    .filter(c => c.getClientRects().length > 0)
    .every(c => !!c.querySelector('svg.marks g.role-axis, svg.marks g.role-mark, canvas'));
}"""

_recorded: weakref.WeakSet = weakref.WeakSet()
_tokens = itertools.count()


def record(page) -> None:
    """Install the recorder on ``page``: for every document it opens from now on, and on the one it shows."""
    if page not in _recorded:
        page.add_init_script(RECORDER)
        _recorded.add(page)
    from playwright.sync_api import Error as PlaywrightError
    try:
        page.evaluate(RECORDER)
    except PlaywrightError:  # the page is navigating: the new document gets the recorder from its init script
        pass


def idle(page, timeout: int = 600_000) -> None:
    """Wait until the page has finished the run it was asked for (see the module's docstring), at most ``timeout``
    ms."""
    record(page)
    page.wait_for_function(_DONE, arg=[next(_tokens), QUIET_MS, GRACE_MS], timeout=timeout)


def charts_drawn(page, timeout: int = 5_000, quiet: int = 150) -> bool:
    """Wait until every chart on view has been drawn and the DOM has been still for ``quiet`` ms, at most
    ``timeout`` ms; whether it was so (a chart that never draws is for the caller's reading to report)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_function(_DRAWN, arg=[quiet], timeout=timeout)
    except PlaywrightTimeout:
        return False
    return True
