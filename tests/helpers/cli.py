"""``python -m engine`` for the tests: in this process (:func:`run_cli`) or as a real process (:func:`run_cli_process`).

A command in this process runs as ``engine/__main__.py`` runs it -- ``engine.cli.main.main(argv)``, its exit status
main's return value or a ``SystemExit``'s code (argparse's), its stdout and stderr what it printed -- but pays no
interpreter start, no import of the ML stack and no teardown (about 7 CPU-seconds a command on this project's 2-core
machine, 49 commands in the integration tests).  The result cache is switched for the command and given back after
it, the working directory is the repository's (as the process version's ``cwd``), and the process-wide memo of answer
scores (``engine.techniques.accuracy``) is emptied before it, as a new process starts without one.

What only a real process shows -- the exit status after the interpreter's early end, nothing but the one error line on
stderr (no library warning reaching it), ``--help`` -- is tested with :func:`run_cli_process` in
``tests/integration/test_cli.py`` (the CLI's contract) and ``tests/reliability``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

REPO = Path(__file__).resolve().parents[2]


def run_cli_process(*args: str, cache: Path, timeout: int = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m engine *args`` in a process of its own, in ``cwd``, on the result cache ``cache``."""
    env = dict(os.environ, ARITHLAB_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_cli(*args: str, cache: Path, timeout: int = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m engine *args`` in this process (module docstring), on the result cache ``cache``: its exit status,
    stdout and stderr, as :func:`run_cli_process` returns them (``timeout`` applies to that one only)."""
    from engine.cli.main import main
    from engine.techniques.accuracy import forget_scores
    out, err = io.StringIO(), io.StringIO()
    with patch.dict(os.environ, {"ARITHLAB_CACHE": str(cache)}), contextlib.chdir(cwd), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        forget_scores()
        try:
            status = main(list(args))
        except SystemExit as stop:  # as engine/__main__.py reads it
            status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    return subprocess.CompletedProcess(["python", "-m", "engine", *args], status, out.getvalue(), err.getvalue())
