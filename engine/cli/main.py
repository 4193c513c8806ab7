"""Command-line interface: ``python -m engine SUBCOMMAND``.

One subcommand per technique of the registry (:mod:`engine.registry`) and one per module of
:mod:`engine.cli.commands` (info, prompts, accuracy, evaluate, finetune, report, reproduce); each is
``run(args, ctx)`` with the shared set-up in ``ctx`` (:class:`engine.cli.context.Context`).

Every subcommand prints JSON (and writes the file named by ``--out``); results are read from / written
to the DuckDB result cache (``$ARITHLAB_CACHE``), so a repeated call does no forward pass.  A bad
argument or input exits with status 2 and one line on stderr that says what is wrong.  When the cache
could not store a result (read-only file, full disk) or moved a damaged cache file aside, the output
is still printed and written, and one ``error:`` line on stderr says what happened (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Callable, Sequence

from engine.cli.commands import AFTER, BEFORE
from engine.cli.context import CliError, Context, Parser, model_args, set_args
from engine.progress import collect_notes
from engine.registry import TECHNIQUES

Command = Callable[[argparse.Namespace, Context], int]


def _technique_command(t) -> Command:
    def run(args: argparse.Namespace, ctx: Context) -> int:
        ctx.print(t.run(args, ctx))
        return 0
    return run


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The parser and, per subcommand, what runs it."""
    ap = Parser(prog="python -m engine", description="Arithmetic-circuits lab engine.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    commands: dict[str, Command] = {}

    def plain(name: str) -> None:
        mod = importlib.import_module(f"engine.cli.commands.{name}")
        mod.register(sub)
        commands[name] = mod.run

    for name in BEFORE:
        plain(name)
    for t in TECHNIQUES:
        p = sub.add_parser(t.name, help=t.help, aliases=list(t.aliases))
        model_args(p)
        set_args(p, t.families, with_file=t.prompts_file)
        t.add_arguments(p)
        for name in (t.name, *t.aliases):  # an old name keeps working
            commands[name] = _technique_command(t)
    for name in AFTER:
        plain(name)
    return ap, commands


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    from cache import CacheError
    from engine.models.spec import ModelLoadError
    from engine.prompts.pairs import PromptError
    # the lab's library loggers (arithlab.cache) stay quiet: what the user must know is in the one
    # error line below (a warning-level record would otherwise reach stderr via logging.lastResort)
    lab_logger = logging.getLogger("arithlab")
    if not lab_logger.handlers:
        lab_logger.addHandler(logging.NullHandler())
    try:
        parser, commands = build_parser()
        args = parser.parse_args(argv)
        ctx = Context(args)
        with collect_notes() as notes:
            status = commands[args.cmd](args, ctx)
        for text in notes:  # what the user must read beside the numbers (a fast path's fallback)
            print(_one_line(f"note: {text}"), file=sys.stderr)
        cache = ctx.result_cache
        warning = cache.last_warning if cache is not None else None
        if status == 0 and warning:
            # the output above is complete, but the cache did not do its job: say so, exit 2
            print(_one_line(f"error: {warning} The output above is complete; --no-cache skips the cache."),
                  file=sys.stderr)
            return 2
        return status
    except CliError as e:
        print(_one_line(f"error: {e}"), file=sys.stderr)
    except (PromptError, ModelLoadError, CacheError, ValueError) as e:
        print(_one_line(f"error: {e}"), file=sys.stderr)
    except OSError as e:
        print(_one_line(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": ")), file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 2
