"""Command-line interface: ``python -m engine SUBCOMMAND``.

Every subcommand prints JSON (or writes the file named by ``--out``); a bad argument or input exits
with status 2 and one line on stderr that says what is wrong and what to do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, not the usage block
        raise CliError(f"{self.prog}: {message} (see --help)")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {v}")
    return v


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="organism",
                   help="organism (bundled, default) | a local HF directory | a .gguf file | a hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))


def _set_args(p: argparse.ArgumentParser, families_default: str) -> None:
    p.add_argument("--op", default="all", help="add, sub, mul, div, pow, a comma list, or all (+ - * /)")
    p.add_argument("--n", type=_positive_int, default=100, help="prompts per operation (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default=families_default,
                   help="paper (the 36 templates) | word (Figure 10) | all | comma list of families")
    p.add_argument("--operands", default="1-9", help="operand range LO-HI (default 1-9)")
    p.add_argument("--allow-negative", action="store_true", help="subtraction may go below zero")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m engine", description="Arithmetic-circuits lab engine.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="model facts as JSON")
    _model_args(p)

    p = sub.add_parser("prompts", help="write the correctly answered (X_r, X_c) pairs as JSONL")
    _model_args(p)
    _set_args(p, "paper")
    p.add_argument("--out", required=True, type=Path, help="output .jsonl file")
    p.add_argument("--keep-all", action="store_true", help="also keep prompts the model gets wrong")

    p = sub.add_parser("accuracy", help="first-token and full-answer accuracy per op and template")
    _model_args(p)
    _set_args(p, "all")
    p.add_argument("--no-cache", action="store_true", help="compute without reading/writing the cache")
    return ap


def _spec(args):
    from engine.promptsets import PromptSetSpec, parse_families, parse_operands, parse_ops
    lo, hi = parse_operands(args.operands)
    return PromptSetSpec(ops=parse_ops(args.op), n=args.n, seed=args.seed,
                         families=parse_families(args.families), operand_lo=lo, operand_hi=hi,
                         allow_negative=args.allow_negative)


def _load(args):
    from engine.models import load_model
    return load_model(args.model, device=args.device, dtype=args.dtype)


def cmd_info(args) -> int:
    print(json.dumps(_load(args).facts.to_dict(), indent=2))
    return 0


def cmd_prompts(args) -> int:
    from engine.accuracy import keep_correct
    from engine.promptsets import generate
    from engine.prompts import write_jsonl
    spec = _spec(args)
    loaded = _load(args)
    pairs, dropped = generate(loaded.tokenizer, spec)
    kept = pairs if args.keep_all else keep_correct(loaded, pairs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    n = write_jsonl(str(args.out), kept)
    print(json.dumps({"out": str(args.out), "generated": len(pairs), "kept": n,
                      "dropped_no_counterfactual": dropped}))
    return 0


def cmd_accuracy(args) -> int:
    from engine.accuracy import accuracy_report
    spec = _spec(args)
    loaded = _load(args)
    cache = None
    if not args.no_cache:
        from cache import ResultCache
        cache = ResultCache()
    rows, computed = accuracy_report(loaded, spec, cache=cache)
    per_op = {r.op: {"n": r.n, "first_token": r.first_token, "full_answer": r.full_answer}
              for r in rows if r.template == "*"}
    per_template = [{"op": r.op, "template": r.template, "n": r.n, "first_token": r.first_token,
                     "full_answer": r.full_answer, "mean_p_answer": r.mean_p_answer}
                    for r in rows if r.template != "*"]
    print(json.dumps({"model": loaded.facts.spec, "fingerprint": loaded.facts.fingerprint,
                      "cached": not computed, "per_op": per_op, "per_template": per_template}, indent=2))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": cmd_info, "prompts": cmd_prompts, "accuracy": cmd_accuracy,
}


def main(argv: Sequence[str] | None = None) -> int:
    from cache import CacheError
    from engine.models import ModelLoadError
    from engine.prompts import PromptError
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.cmd](args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
    except (PromptError, ModelLoadError, CacheError) as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 2
