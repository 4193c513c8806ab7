"""What every subcommand shares: its arguments' parsing helpers and the set-up, once.

A subcommand is ``register(sub)`` (its parser) and ``run(args, ctx) -> int``; ``ctx`` is a
:class:`Context` that opens the model, the result cache and the prompt pairs on first use, shows
progress as a context manager, and writes / prints the output.
"""

from __future__ import annotations

import argparse
import csv
import json
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.backends.base import BACKENDS
from engine.models import DTYPE_NAMES
from engine.prompts.pairs import ANY_CARRY, CARRY_SETS, COUNTERFACTUALS
from engine.prompts.templates import OPS
from engine.registry import positive_int


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, not the usage block
        raise CliError(f"{self.prog}: {message} (see --help)")


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="organism",
                   help="organism (bundled, default) | a local HF directory | a .gguf file | a hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--backend", default=BACKENDS[0], choices=BACKENDS,
                   help="bridge: TransformerBridge (transformer-lens, default) | nnsight: the plain HF model "
                        "through nnsight (same numbers; also runs on NDIF with --remote)")
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="spread a model over several GPUs (accelerate): auto | balanced | sequential | a JSON "
                        "object module -> device, e.g. '{\"model.layers.0\": 0, ...}' (instead of --device)")
    p.add_argument("--max-memory", default=None, metavar="JSON",
                   help="with --device-map auto: memory per device, e.g. '{\"0\": \"60GiB\", \"1\": \"80GiB\"}'")
    p.add_argument("--offload-folder", default=None, type=Path,
                   help="where a --device-map puts weights mapped to \"disk\"")
    p.add_argument("--remote", action="store_true",
                   help="run a hub model on NDIF (needs --backend nnsight and the key in $NDIF_API_KEY)")
    p.add_argument("--no-cache", action="store_true", help="compute without reading/writing the cache")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar on stderr (it is shown only when stderr is a terminal anyway)")


def set_args(p: argparse.ArgumentParser, families_default: str = "paper", with_file: bool = True) -> None:
    if with_file:
        p.add_argument("--prompts", type=Path, help="JSONL written by `prompts` (ids used as given)")
        p.add_argument("--pairs", type=Path, metavar="FILE",
                       help="JSONL of pairs you wrote, one per line: {\"prompt\": ..., \"counterfactual\": ..., "
                            "\"answer\": ...} (+ \"op\" when the prompt does not name it); kept where answered right")
    p.add_argument("--op", default="all", help="add, sub, mul, div, pow, a comma list, or all (+ - * /)")
    p.add_argument("--template", action="append", metavar="TEXT",
                   help="a template of your own instead of --families, the operator marked with [ ]: "
                        "'{A} apples [and] {B} pears make' (its operation: --op, one) or 'add:{A} ...'; repeatable")
    p.add_argument("--n", type=positive_int, default=100, help="prompts per operation (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default=families_default,
                   help="paper (Figure 8, 32 templates) | word (Figure 10) | extended (the project's own) | all | "
                        "comma list of families")
    p.add_argument("--operands", default="1-9", help="operand range LO-HI (default 1-9)")
    p.add_argument("--allow-negative", action="store_true", help="subtraction may go below zero")
    p.add_argument("--decimals", type=int, default=0, choices=(0, 1, 2),
                   help="decimal places of the operands (Figure 4's rational numbers: 1 gives 4.5; default 0)")
    p.add_argument("--counterfactual", default="operator-removed",
                   choices=tuple(COUNTERFACTUALS),
                   help="what X_c changes: the operator removed (the paper's, default), operand A or operand B "
                        "replaced by another operand of the range, or the operator swapped for the paired "
                        "operation's (+ and -, * and /) (docs/methods.md: counterfactual kinds)")
    p.add_argument("--digit", default="first", metavar="first|last|K",
                   help="the answer digit analysed: first (default), last (the units digit) or the K-th answer token; "
                        "the digits before it are teacher-forced in both prompts (docs/methods.md: the answer digit)")
    p.add_argument("--carry", default=ANY_CARRY, choices=tuple(CARRY_SETS),
                   help="keep only the problems with a carry / borrow in some column (yes) or with none (no); add and "
                        "sub only; every result is then of those pairs alone (docs/methods.md: the carry)")
    p.add_argument("--no-balance", action="store_true",
                   help="keep the first n sampled prompts per op instead of balancing their first answer tokens "
                        "(docs/methods.md: balance rule)")
    p.add_argument("--every", action="store_true",
                   help="every problem of the templates and operands, not a sample of --n per op: every prompt the "
                        "model answers right is kept (unbalanced; --n and --no-balance are ignored)")


def device_map(text: str | None):
    """--device-map: a strategy name, or a JSON object module -> device (GPU index, "cpu", "disk")."""
    if text is None or not text.strip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"--device-map is not valid JSON ({e.msg}); give auto, balanced, sequential or a "
                       f"JSON object module -> device") from None
    if not isinstance(value, dict):
        raise CliError("--device-map JSON must be an object module -> device")
    return value


def max_memory(text: str | None):
    """--max-memory: JSON object device -> size; GPU indices may be given as strings ("0")."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"--max-memory is not valid JSON ({e.msg}); e.g. '{{\"0\": \"60GiB\", \"cpu\": \"200GiB\"}}'"
                       ) from None
    if not isinstance(value, dict) or not value:
        raise CliError("--max-memory must be a JSON object device -> size, e.g. {\"0\": \"60GiB\"}")
    return {int(k) if str(k).isdigit() else k: v for k, v in value.items()}


#: How ``--text`` is read (part of the knockout cache params: results of an older reading never come back).
TEXT_RULE = "typed_prompt_ids: answer-token rule (v2)"


class Context:
    """The set-up of one subcommand run, each part made on first use: model, cache, prompt pairs."""

    text_rule = TEXT_RULE

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.result_cache = None  # the cache opened, if any: main() reports its warnings
        self.n_given = 0  # pairs in the --pairs / --prompts file (before the filter), once ``pairs`` read it

    # -- model, cache, prompt set -------------------------------------------------------------------
    def open_model(self, spec: str):
        """``spec`` with this command's device, dtype, backend, device map and remote choice."""
        from engine.backends import open_model
        a = self.args
        return open_model(spec, device=a.device, dtype=a.dtype, backend=getattr(a, "backend", "bridge"),
                          device_map=device_map(getattr(a, "device_map", None)),
                          max_memory=max_memory(getattr(a, "max_memory", None)),
                          offload_folder=getattr(a, "offload_folder", None), remote=getattr(a, "remote", False))

    @cached_property
    def model(self):
        return self.open_model(self.args.model)

    @cached_property
    def cache(self):
        if getattr(self.args, "no_cache", False):
            return None
        from cache import ResultCache
        self.result_cache = ResultCache()
        return self.result_cache

    def spec(self, families: str | None = None):
        """The prompt set of ``--op``, ``--n``, ``--families`` ... (``families`` overrides ``--families``)."""
        from engine.prompts.pairs import parse_digit
        from engine.prompts.promptsets import PromptSetSpec, parse_families, parse_operands, parse_ops
        a = self.args
        lo, hi = parse_operands(a.operands)
        ops, templates = parse_ops(a.op), self.templates()
        if templates:
            ops = tuple(dict.fromkeys(t.split(":", 1)[0] for t in templates))
        return PromptSetSpec(ops=ops, n=a.n, seed=a.seed,
                             families=parse_families(families or a.families), operand_lo=lo, operand_hi=hi,
                             allow_negative=a.allow_negative, decimals=a.decimals, balance=not a.no_balance,
                             every=getattr(a, "every", False),
                             counterfactual=getattr(a, "counterfactual", "operator-removed"), templates=templates,
                             digit=parse_digit(getattr(a, "digit", "first")), carry=getattr(a, "carry", ANY_CARRY))

    def templates(self) -> tuple[str, ...]:
        """``--template`` values as ``op:text`` (checked): an ``op:`` prefix, else the one operation of ``--op``."""
        from engine.prompts.custom import parse_param, parse_template
        from engine.prompts.promptsets import parse_ops
        out = []
        for text in getattr(self.args, "template", None) or ():
            head = text.split(":", 1)[0].strip()
            if ":" in text and head in OPS:
                out.append(parse_param(text).as_param())
                continue
            ops = parse_ops(self.args.op) if self.args.op != "all" else ()
            if len(ops) != 1:
                raise CliError("--template: say its operation with one --op (add, sub, mul, div or pow), or write "
                               "it as 'add:{A} ...'")
            out.append(parse_template(text, ops[0]).as_param())
        return tuple(out)

    @cached_property
    def pairs(self) -> list:
        """--prompts FILE (as given) or the generated set filtered to correct answers."""
        from engine.prompts.custom import none_right_message, read_text_pairs
        from engine.prompts.pairs import PromptError, read_jsonl
        from engine.techniques.accuracy import answered_right, kept_pairs
        model, a = self.model, self.args
        given = getattr(a, "pairs", None) or getattr(a, "prompts", None)
        if given and getattr(a, "counterfactual", "operator-removed") != "operator-removed":
            raise CliError(f"--counterfactual does not apply to {given.name}: each of its pairs brings its own "
                           f"counterfactual prompt; write the ones you want in the file")
        if given and getattr(a, "carry", ANY_CARRY) != ANY_CARRY:
            raise CliError(f"--carry does not apply to {given.name}: its pairs are used as given; keep the ones you "
                           f"want in the file")
        if given and getattr(a, "digit", "first") not in ("first", "1"):
            raise CliError(f"--digit does not apply to {given.name}: its pairs are read at their first answer token; "
                           f"write the earlier digits into the prompts to read a later one")
        if getattr(a, "pairs", None):
            written = read_text_pairs(model.tokenizer, str(a.pairs))
            self.n_given = len(written)
            with self.progress("checking answers") as bar:
                pairs = answered_right(model, written, cache=self.cache, progress=bar)
            if not pairs:
                raise PromptError(none_right_message(len(written), custom=True, file=str(a.pairs)))
            return pairs
        if getattr(a, "prompts", None):
            pairs = read_jsonl(str(a.prompts))
            self.n_given = len(pairs)
            if any(max(p.ref_ids + p.cf_ids + [p.answer_id]) >= model.facts.vocab_size for p in pairs):
                raise PromptError(f"{a.prompts} holds token ids outside this model's vocabulary: "
                                  f"it was written for another model")
            return pairs
        with self.progress("checking answers") as bar:
            spec = self.spec()
            pairs, n_generated = kept_pairs(model, spec, cache=self.cache, progress=bar)
        if not pairs:
            raise PromptError(none_right_message(n_generated, custom=bool(spec.templates)))
        return pairs

    # -- typed prompts --------------------------------------------------------------------------------
    def typed(self, text: str | None):
        """``--text`` after the answer-token rule (:func:`engine.prompts.typed.typed_prompt_ids`, the rule the pages
        and prompt files use), or None without ``--text``; PromptError (exit 2) for an empty, too long or
        unknown-word prompt -- the Prompt lab's checks, made before any computation."""
        if text is None:
            return None
        from engine.techniques.promptlab import check_typed_text
        return check_typed_text(self.model.tokenizer, text)

    def typed_summary(self, typed) -> dict[str, Any]:
        """What ``--text`` was read as: the analysed tokens (the last one is END) and the parsed problem."""
        tok = self.model.tokenizer
        out: dict[str, Any] = {"analysed_tokens": [str(t) for t in tok.convert_ids_to_tokens(typed.ids)]}
        if typed.parsed is not None:
            tp = typed.parsed
            out["parsed"] = {"op": tp.op, "a": tp.a, "b": tp.b, "answer": tp.answer,
                             "answer_token": str(tok.convert_ids_to_tokens([typed.answer.answer_id])[0])}
        else:
            out["parsed"] = {"error": typed.error}
        return out

    def answer_tokens(self, pairs) -> dict[str, Any]:
        """The distribution of ``pairs``' answer tokens at END (the chosen digit's), with its warning (docs/methods.md:
        balance rule)."""
        from engine.prompts.promptsets import answer_token_stats
        given = getattr(self.args, "pairs", None) or getattr(self.args, "prompts", None)
        digit = "first" if given or not hasattr(self.args, "digit") else self.spec().digit
        return answer_token_stats(self.model.tokenizer, pairs, digit).to_json()

    # -- running and output --------------------------------------------------------------------------
    @contextmanager
    def progress(self, label: str) -> Iterator[Callable[[int, int], None]]:
        """A tqdm bar on stderr for the block (counts + ETA; silent with --quiet or when not a terminal)."""
        from engine.progress import cli_bar
        bar = cli_bar(label, quiet=getattr(self.args, "quiet", False))
        try:
            yield bar
        finally:
            bar.close()

    def cached_json(self, method: str, params: dict, compute: Callable[[], dict]) -> tuple[dict, bool]:
        """A JSON-shaped result for this model and prompt pairs through the cache (as an artifact)."""
        from engine.results import run_cached
        _, art, computed = run_cached(self.model, self.pairs, method, params,
                                      lambda: ([], {"result": compute()}), self.cache)
        return art["result"], computed

    def with_pins(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` (one per head / MLP: ``component``, ``layer``, ``head``) with a ``note`` column -- each pinned
        component's note (``python -m engine pins``) -- when the model has pins; unchanged when it has none or the
        cache is off or unreadable."""
        from cache import CacheError
        try:
            labels = self.cache.labels(self.model.facts.fingerprint) if self.cache is not None else {}
        except CacheError:
            labels = {}
        if not labels:
            return rows
        from engine.machinery.components import site_name
        return [{**r, "note": labels.get(site_name(r["layer"], r["head"]), "")} for r in rows]

    @staticmethod
    def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
            w.writeheader()
            w.writerows(rows)

    @staticmethod
    def write_json(path: Path | None, obj: Any) -> None:
        """``obj`` as indented JSON in ``path`` (nothing when ``path`` is None)."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(obj, indent=2) + "\n")

    @staticmethod
    def print(obj: Any) -> None:
        print(json.dumps(obj, indent=2))
