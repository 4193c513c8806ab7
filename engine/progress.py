"""Progress of long computations: the ``progress(done, total)`` callbacks every sweep accepts.

Engine functions call ``progress(done, total)`` after each unit of work (a batch, a knockout
pass); a caller that wants to stop a computation raises from the callback (the dashboard does, see
``ui/session.py``), and the engine's ``with`` blocks restore the model on the way out.

* :func:`cancel_check` installs a check that techniques call *inside* their forward passes (every
  layer), so a stop does not wait for the end of a long batched pass;
* :func:`collect_notes` / :func:`note` carry what the user must read beside a result (a fallback)
  from the technique to the CLI's stderr or the page;
* :class:`Stages` turns a computation made of several stages (e.g. path patching of two prompt
  sets, then their knockouts) into one ``(done, total)`` count;
* :func:`cli_bar` is the command line's bar: ``tqdm`` on stderr with counts and ETA, silent when
  stderr is not a terminal or with ``--quiet``.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

ProgressFn = Callable[[int, int], None]  # (done, total)


_LOCAL = threading.local()


@contextmanager
def cancel_check(check: Callable[[], None]) -> Iterator[None]:
    """Within the block (this thread), techniques that support it call ``check()`` inside their forward
    passes (every layer); ``check`` raises to stop the computation -- the dashboard's Stop."""
    stack = _LOCAL.__dict__.setdefault("checks", [])
    stack.append(check)
    try:
        yield
    finally:
        stack.pop()


def current_check() -> Callable[[], None] | None:
    """The innermost ``cancel_check`` of this thread, or None."""
    stack = getattr(_LOCAL, "checks", None)
    return stack[-1] if stack else None


@contextmanager
def collect_notes() -> Iterator[list[str]]:
    """Within the block (this thread), what a technique must tell the user beside its numbers -- a fast path
    that did not reproduce the model and gave way to its textbook loop -- is gathered into the yielded list
    (each text once); the CLI prints each as one line, a page shows each as a note."""
    stack = _LOCAL.__dict__.setdefault("notes", [])
    notes: list[str] = []
    stack.append(notes)
    try:
        yield notes
    finally:
        stack.pop()


def note(text: str) -> None:
    """Tell the user ``text`` (through the innermost :func:`collect_notes` of this thread; dropped without one)."""
    stack = getattr(_LOCAL, "notes", None)
    if stack and text and text not in stack[-1]:
        stack[-1].append(text)


class Stages:
    """One ``(done, total)`` count over stages of known sizes (in the stages' own units)."""

    def __init__(self, progress: ProgressFn | None, sizes: Sequence[int]) -> None:
        self.progress = progress
        self.sizes = [max(1, int(s)) for s in sizes]
        self.total = sum(self.sizes)

    def stage(self, i: int) -> ProgressFn | None:
        """The callback of stage ``i``: its (done, total) mapped into the overall count."""
        if self.progress is None:
            return None
        offset, size = sum(self.sizes[:i]), self.sizes[i]

        def fn(done: int, total: int) -> None:
            self.progress(offset + min(size, size * done // max(total, 1)), self.total)
        return fn

    def finish(self, i: int) -> None:
        """Stage ``i`` is over (also when it had nothing to compute, e.g. read from the cache)."""
        if self.progress is not None:
            self.progress(sum(self.sizes[:i + 1]), self.total)


class CliBar:
    """A ``tqdm`` bar on stderr fed by ``progress(done, total)``; one bar per label."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm
            try:
                cols = os.get_terminal_size(sys.stderr.fileno()).columns
            except (OSError, ValueError):
                cols = 0
            # a terminal that reports no width (0 columns: some ptys) would get an empty bar
            self._bar = tqdm(total=total, desc=self.label, file=sys.stderr, leave=False,
                             dynamic_ncols=cols > 0, ncols=None if cols > 0 else 100)
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def relabel(self, label: str) -> None:
        """What the bar is computing now (its description)."""
        self.label = label
        if self._bar is not None:
            self._bar.set_description(label)

    def note(self, line: str) -> None:
        """One line above the bar (nothing when the bar is off)."""
        if self.enabled:
            from tqdm import tqdm
            tqdm.write(line, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def cli_bar(label: str, *, quiet: bool = False) -> CliBar:
    """A progress callback drawing a tqdm bar on stderr (counts + ETA), unless ``quiet`` or stderr is
    not a terminal; call ``.close()`` when the computation ends."""
    return CliBar(label, enabled=not quiet and sys.stderr.isatty())
