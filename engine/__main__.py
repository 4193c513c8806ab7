"""``python -m engine`` -- see :mod:`engine.cli.main`.

A command's process ends as soon as its exit handlers have run: the interpreter's own teardown
of the ML stack a command imports (torch, transformers, transformer-lens and what they pull in)
walks every object with the garbage collector and adds about a second to each command, for
nothing -- the output is printed, the files are closed and the cache is detached by then.
"""

import atexit
import os
import sys

_status = 1  # until main() returns (an uncaught exception has printed its traceback by then)


def _end_now() -> None:
    """Registered first, so it runs last of the exit handlers: flush, then skip the teardown."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(_status)


atexit.register(_end_now)

from engine.cli.main import main  # noqa: E402 - after the handler, so every other one runs before it

try:
    _status = main()
except SystemExit as stop:  # argparse's --help
    _status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    raise
raise SystemExit(_status)
