"""Command-line interface: ``python -m engine SUBCOMMAND``.

Every subcommand prints JSON (and writes the file named by ``--out``); results are read from / written
to the DuckDB result cache (``$ARITHLAB_CACHE``), so a repeated call does no forward pass.  A bad
argument or input exits with status 2 and one line on stderr that says what is wrong.  When the cache
could not store a result (read-only file, full disk) or moved a damaged cache file aside, the output
is still printed and written, and one ``error:`` line on stderr says what happened (exit status 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.models import DTYPE_NAMES


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


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="organism",
                   help="organism (bundled, default) | a local HF directory | a .gguf file | a hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--backend", default="bridge", choices=("bridge", "nnsight"),
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


def _set_args(p: argparse.ArgumentParser, families_default: str, with_file: bool) -> None:
    if with_file:
        p.add_argument("--prompts", type=Path, help="JSONL written by `prompts` (ids used as given)")
    p.add_argument("--op", default="all", help="add, sub, mul, div, pow, a comma list, or all (+ - * /)")
    p.add_argument("--n", type=_positive_int, default=100, help="prompts per operation (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default=families_default,
                   help="paper (Figure 8, 32 templates) | word (Figure 10) | extended (the project's own) | all | "
                        "comma list of families")
    p.add_argument("--operands", default="1-9", help="operand range LO-HI (default 1-9)")
    p.add_argument("--allow-negative", action="store_true", help="subtraction may go below zero")
    p.add_argument("--decimals", type=int, default=0, choices=(0, 1, 2),
                   help="decimal places of the operands (Figure 4's rational numbers: 1 gives 4.5; default 0)")
    p.add_argument("--no-balance", action="store_true",
                   help="keep the first n sampled prompts per op instead of balancing their first answer tokens "
                        "(README: balance rule)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m engine", description="Arithmetic-circuits lab engine.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="model facts as JSON")
    _model_args(p)

    p = sub.add_parser("prompts", help="write the correctly answered (X_r, X_c) pairs as JSONL")
    _model_args(p)
    _set_args(p, "paper", with_file=False)
    p.add_argument("--out", required=True, type=Path, help="output .jsonl file")
    p.add_argument("--keep-all", action="store_true", help="also keep prompts the model gets wrong")
    p.add_argument("--show-dropped", action="store_true",
                   help="also list every dropped prompt with its reason (the model's token when it answered wrong)")

    p = sub.add_parser("accuracy", help="first-token and full-answer accuracy per op and template")
    _model_args(p)
    _set_args(p, "paper", with_file=False)

    p = sub.add_parser("patch", help="path patching of every head and MLP -> CSV")
    _model_args(p)
    _set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path, help="output .csv")
    p.add_argument("--by", choices=("all", "op", "template"), default="all",
                   help="one row per sender (all) or per sender and op / template")
    p.add_argument("--with-prob", action="store_true", help="also the answer-probability metric")
    p.add_argument("--batch-size", type=_positive_int, default=32)
    p.add_argument("--receiver", default=None, metavar="LAYER.HEAD[:q|k|v]",
                   help="instead of the answer logit, a head as receiver: every earlier sender's effect carried "
                        "only through that head's query (default), key or value at END, e.g. 3.1:q")

    p = sub.add_parser("knockout", help="accuracy before/after mean-ablating heads / MLPs -> JSON")
    _model_args(p)
    _set_args(p, "paper", with_file=True)
    p.add_argument("--heads", default="", help="LAYER.HEAD list, e.g. 3.1,5.0")
    p.add_argument("--mlps", default="", help="MLP layers, e.g. 4,5")
    p.add_argument("--text", help="also show this prompt's top-5 next tokens before/after")
    p.add_argument("--out", type=Path, help="also write the JSON here")

    p = sub.add_parser("knockout-curve", help="Fig. 3: top-k (effect rank) vs k random heads -> CSV")
    _model_args(p)
    _set_args(p, "paper", with_file=True)
    p.add_argument("--k-max", type=_nonneg_int, default=10)
    p.add_argument("--draws", type=_positive_int, default=10)
    p.add_argument("--out", required=True, type=Path)

    p = sub.add_parser("attention", help="END-row attention per token role (all heads) -> CSV")
    _model_args(p)
    _set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--text", help="instead: one prompt's END row of --layer/--head, token by token")
    p.add_argument("--layer", type=_nonneg_int)
    p.add_argument("--head", type=_nonneg_int)

    p = sub.add_parser("mlp-projection", help="MLP in/out cosines with W_U of A, B, C per layer -> CSV")
    _model_args(p)
    _set_args(p, "paper", with_file=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--text", help="also: this prompt's top number tokens per layer (Fig. 6c)")

    p = sub.add_parser("transfer", help="Table 4: key-head overlap and cross knockouts of two sets -> JSON")
    _model_args(p)
    _set_args(p, "paper", with_file=False)
    p.add_argument("--b-families", default="word", help="families of the second set (default word)")
    p.add_argument("--b-bench", choices=("svamp", "gsm8k", "addsub", "singleeq"),
                   help="second set from a math benchmark instead (needs --data-dir)")
    p.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    p.add_argument("--k", type=_positive_int, default=10)
    p.add_argument("--out", type=Path)

    p = sub.add_parser("evaluate", help="Table 1: accuracy on GSM8K, AddSub, SingleEq, SVAMP, MMLU, CSQA -> JSON")
    _model_args(p)
    p.add_argument("--bench", required=True,
                   help="gsm8k, addsub, singleeq, svamp, mmlu, csqa, a comma list, or all")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder laid out like ../shared/data (default: $ARITHLAB_DATA, else ../shared/data, "
                        "else the Hugging Face hub when `datasets` is installed)")
    p.add_argument("--split", default=None, help="split to evaluate (default: test; csqa: dev)")
    p.add_argument("--limit", type=_positive_int, default=None, help="only the first N items of each set")
    p.add_argument("--few-shot", type=_nonneg_int, default=0, help="k solved exemplars before each question")
    p.add_argument("--seed", type=int, default=0, help="seed of the exemplar draw")
    p.add_argument("--max-new-tokens", type=_positive_int, default=16, help="greedy tokens for math sets")
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--base", default=None, help="also evaluate this base model and print Table 1 rows (Acc, Δ)")
    p.add_argument("--out", type=Path, help="also write the JSON, with every item's prediction, here")

    from engine.cli import circuits as cli_circuits
    from engine.cli import finetune as cli_finetune
    cli_finetune.add_parser(sub, _model_args, _positive_int)
    cli_circuits.add_parsers(sub, _model_args, _set_args)
    return ap


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _spec(args, families: str | None = None):
    from engine.prompts.promptsets import PromptSetSpec, parse_families, parse_operands, parse_ops
    lo, hi = parse_operands(args.operands)
    return PromptSetSpec(ops=parse_ops(args.op), n=args.n, seed=args.seed,
                         families=parse_families(families or args.families), operand_lo=lo, operand_hi=hi,
                         allow_negative=args.allow_negative, decimals=args.decimals, balance=not args.no_balance)


def _device_map(text: str | None):
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


def _max_memory(text: str | None):
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


def _model(args):
    from engine.backends import open_model
    return open_model(args.model, device=args.device, dtype=args.dtype, backend=getattr(args, "backend", "bridge"),
                      device_map=_device_map(getattr(args, "device_map", None)),
                      max_memory=_max_memory(getattr(args, "max_memory", None)),
                      offload_folder=getattr(args, "offload_folder", None), remote=getattr(args, "remote", False))


def _cache(args):
    if getattr(args, "no_cache", False):
        return None
    from cache import ResultCache
    cache = ResultCache()
    args.result_cache = cache  # main() reports its warnings (damaged file moved aside, result not stored)
    return cache


def _typed(model, text: str | None):
    """``--text`` after the answer-token rule (:func:`engine.prompts.typed.typed_prompt_ids`, the rule the pages
    and prompt files use), or None without ``--text``; PromptError (exit 2) for an empty, too long or
    unknown-word prompt -- the Prompt lab's checks, made before any computation."""
    if text is None:
        return None
    from engine.techniques.promptlab import check_typed_text
    return check_typed_text(model.tokenizer, text)


def _typed_summary(model, typed) -> dict[str, Any]:
    """What ``--text`` was read as: the analysed tokens (the last one is END) and the parsed problem."""
    tok = model.tokenizer
    out: dict[str, Any] = {"analysed_tokens": [str(t) for t in tok.convert_ids_to_tokens(typed.ids)]}
    if typed.parsed is not None:
        tp = typed.parsed
        out["parsed"] = {"op": tp.op, "a": tp.a, "b": tp.b, "answer": tp.answer,
                         "answer_token": str(tok.convert_ids_to_tokens([typed.answer.answer_id])[0])}
    else:
        out["parsed"] = {"error": typed.error}
    return out


#: How ``--text`` is read (part of the knockout cache params: results of an older reading never come back).
TEXT_RULE = "typed_prompt_ids: answer-token rule (v2)"


def _answer_token_summary(model, pairs) -> dict[str, Any]:
    """The first-answer-token distribution of the analysed pairs, with its warning (README: balance rule)."""
    from engine.prompts.promptsets import answer_token_stats
    return answer_token_stats(model.tokenizer, pairs).to_json()


def _bar(args, label: str):
    """A tqdm progress callback on stderr (counts + ETA; silent with --quiet or when not a terminal)."""
    from engine.progress import cli_bar
    return cli_bar(label, quiet=getattr(args, "quiet", False))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _pairs(args, model, cache):
    """--prompts FILE (as given) or the generated set filtered to correct answers."""
    from engine.prompts.pairs import PromptError, read_jsonl
    from engine.techniques.accuracy import kept_pairs
    if getattr(args, "prompts", None):
        pairs = read_jsonl(str(args.prompts))
        bad = [p for p in pairs if max(p.ref_ids + p.cf_ids + [p.answer_id]) >= model.facts.vocab_size]
        if bad:
            raise PromptError(f"{args.prompts} holds token ids outside this model's vocabulary: "
                              f"it was written for another model")
        return pairs
    bar = _bar(args, "checking answers")
    pairs, _ = kept_pairs(model, _spec(args), cache=cache, progress=bar)
    bar.close()
    if not pairs:
        raise PromptError("the model answers none of these prompts right: try another op, "
                          "more prompts or another model")
    return pairs


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        w.writerows(rows)


def _cached_json(cache, model, pairs, method: str, params: dict, compute: Callable[[], dict]) -> tuple[dict, bool]:
    """A JSON-shaped result through the cache (as an artifact)."""
    from engine.results import run_cached
    _, art, computed = run_cached(model, pairs, method, params, lambda: ([], {"result": compute()}), cache)
    return art["result"], computed


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


# ---------------------------------------------------------------------------------------------
# subcommands
# ---------------------------------------------------------------------------------------------

def cmd_info(args) -> int:
    _print(_model(args).facts.to_dict())
    return 0


def cmd_prompts(args) -> int:
    import dataclasses
    from collections import Counter

    from engine.prompts.pairs import write_jsonl
    from engine.prompts.promptsets import generate_set
    from engine.techniques.ablation import top_next_tokens
    from engine.techniques.accuracy import score_pairs
    spec = _spec(args)
    model = _model(args)
    tok = model.tokenizer
    gen = generate_set(tok, spec)
    bar = _bar(args, "checking answers")
    scores = score_pairs(model, gen.pairs, progress=bar)
    bar.close()
    kept = gen.pairs if args.keep_all else [p for p, s in zip(gen.pairs, scores) if s.first_ok]
    dropped: list[dict[str, Any]] = [{"ref_text": prob.ref_text, "reason": why} for prob, why in gen.dropped]
    if not args.keep_all:
        for p, s in zip(gen.pairs, scores):
            if not s.first_ok:
                said = top_next_tokens(model, p.ref_ids, k=1)[0].token
                dropped.append({"ref_text": p.ref_text, "reason": "wrong answer", "model_token": said,
                                "answer_token": str(tok.convert_ids_to_tokens([p.answer_id])[0])})
    # informative, not a filter: X_c whose top token is still the answer (the operator was not needed)
    cf_scores = score_pairs(model, [dataclasses.replace(p, ref_ids=p.cf_ids) for p in kept]) if kept else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    n = write_jsonl(str(args.out), kept)
    res: dict[str, Any] = {
        "out": str(args.out), "balanced": spec.balance, "candidates": gen.candidates,
        "generated": len(gen.pairs), "kept": n, "dropped": len(dropped),
        "dropped_by_reason": dict(Counter(d["reason"] for d in dropped).most_common()),
        "kept_counterfactual_still_answers": sum(s.first_ok for s in cf_scores)}
    if kept:
        res["answer_tokens"] = _answer_token_summary(model, kept)
    if args.show_dropped:
        res["dropped_prompts"] = dropped
        res["kept_counterfactual_still_answers_prompts"] = [p.cf_text for p, s in zip(kept, cf_scores) if s.first_ok]
    print(json.dumps(res))
    return 0


def cmd_accuracy(args) -> int:
    from engine.prompts.promptsets import generate
    from engine.techniques.accuracy import accuracy_report
    spec = _spec(args)
    model = _model(args)
    bar = _bar(args, "accuracy")
    rows, computed = accuracy_report(model, spec, cache=_cache(args), progress=bar)
    bar.close()
    pairs, _ = generate(model.tokenizer, spec)
    per_op = {r.op: {"n": r.n, "first_token": r.first_token, "full_answer": r.full_answer}
              for r in rows if r.template == "*"}
    per_template = [{"op": r.op, "template": r.template, "n": r.n, "first_token": r.first_token,
                     "full_answer": r.full_answer, "mean_p_answer": r.mean_p_answer}
                    for r in rows if r.template != "*"]
    _print({"model": model.facts.spec, "fingerprint": model.facts.fingerprint, "cached": not computed,
            "answer_tokens": _answer_token_summary(model, pairs), "per_op": per_op, "per_template": per_template})
    return 0


def cmd_patch(args) -> int:
    from engine.techniques.patching import cached_path_patching
    if args.receiver is not None:
        if args.by != "all" or args.with_prob:
            raise CliError("--receiver gives one row per sender: drop --by and --with-prob")
        return _circuits_command("head-patch")(args)
    model = _model(args)
    cache = _cache(args)
    pairs = _pairs(args, model, cache)
    bar = _bar(args, "path patching")
    table, computed = cached_path_patching(model, pairs, cache=cache, with_prob=args.with_prob,
                                           batch_size=args.batch_size, progress=bar)
    bar.close()
    metrics = ["effect", "logit_diff"] + (["prob_diff"] if args.with_prob else [])
    counts: dict[str, int] = {"*": len(pairs)}
    for p in pairs:
        counts[f"op:{p.op}"] = counts.get(f"op:{p.op}", 0) + 1
        counts[f"template:{p.template}"] = counts.get(f"template:{p.template}", 0) + 1
    prefix = {"all": "*", "op": "op:", "template": "template:"}[args.by]
    rows: dict[tuple, dict[str, Any]] = {}
    for v in table.values:
        if v.metric not in metrics or not (v.group == "*" if args.by == "all" else v.group.startswith(prefix)):
            continue
        key = (v.group, v.component, v.layer, v.head)
        row = rows.setdefault(key, {**({} if args.by == "all" else {"group": v.group.split(":", 1)[1]}),
                                    "component": v.component, "layer": v.layer, "head": v.head})
        row[v.metric] = v.value
        row["n"] = counts.get(v.group, 0)
    out = sorted(rows.values(), key=lambda r: (r.get("group", ""), r["layer"], r["component"] == "mlp", r["head"]))
    _write_csv(args.out, out)
    ranking = table.ranking_metric()
    top = table.top_heads(5, ranking)
    excluded, _ = table.guard_counts()
    _print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "senders": len(out),
            "answer_tokens": _answer_token_summary(model, pairs),
            "effect_guard": {"excluded_pairs": excluded, "ranked_by": ranking, "note": table.effect_note()},
            "top_heads": [{"layer": layer, "head": h, ranking: e} for layer, h, e in top]})
    return 0


def _knockout_result(model, pairs, ko, text, typed, progress=None):
    from engine.techniques.ablation import Knockout, knockout_accuracies, mean_activations, top_next_tokens
    means = mean_activations(model, pairs)
    before, after = knockout_accuracies(model, pairs, [Knockout(), ko], means, progress=progress)
    res = {"heads": [f"{a}.{b}" for a, b in ko.heads], "mlps": list(ko.mlps), "n_pairs": len(pairs),
           "accuracy_before": before, "accuracy_after": after}
    if typed is not None:
        ids = typed.ids
        res["text"] = text
        res.update(_typed_summary(model, typed))
        res["top5_before"] = [t.__dict__ for t in top_next_tokens(model, ids)]
        res["top5_after"] = [t.__dict__ for t in top_next_tokens(model, ids, ko=ko, means=means)]
    return res


def cmd_knockout(args) -> int:
    from engine.techniques.ablation import Knockout, parse_heads, parse_layers
    model = _model(args)
    ko = Knockout(parse_heads(args.heads), parse_layers(args.mlps)).validate(model.facts.n_layers,
                                                                            model.facts.n_heads)
    if ko.empty:
        raise CliError("nothing to knock out: give --heads LAYER.HEAD,... and/or --mlps LAYER,...")
    typed = _typed(model, args.text)
    cache = _cache(args)
    pairs = _pairs(args, model, cache)
    # text_rule: --text is read after the answer-token rule (results of the raw reading never come back)
    params = {"heads": [list(h) for h in ko.heads], "mlps": list(ko.mlps), "text": args.text or "",
              "text_ids": typed.ids if typed is not None else [], "text_rule": TEXT_RULE,
              "dtype": model.facts.dtype}
    bar = _bar(args, "knockout")
    res, computed = _cached_json(cache, model, pairs, "knockout", params,
                                 lambda: _knockout_result(model, pairs, ko, args.text, typed, bar))
    bar.close()
    res = {**res, "cached": not computed, "answer_tokens": _answer_token_summary(model, pairs)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    _print(res)
    return 0


def cmd_knockout_curve(args) -> int:
    from engine.techniques.ablation import cached_knockout_curve
    from engine.techniques.patching import cached_path_patching
    model = _model(args)
    n_heads = model.facts.n_layers * model.facts.n_heads
    if args.k_max > n_heads:
        raise CliError(f"--k-max {args.k_max} exceeds the model's {n_heads} heads")
    cache = _cache(args)
    pairs = _pairs(args, model, cache)
    bar = _bar(args, "path patching")
    table, _ = cached_path_patching(model, pairs, cache=cache, progress=bar)
    bar.close()
    ranked = [(layer, h) for layer, h, _ in table.top_heads(args.k_max)]
    bar = _bar(args, "knockout sets")
    pts, computed = cached_knockout_curve(model, pairs, ranked, k_max=args.k_max, draws=args.draws,
                                          seed=args.seed, cache=cache, progress=bar)
    bar.close()
    points = [p.__dict__ for p in pts]
    _write_csv(args.out, points)
    _print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
            "answer_tokens": _answer_token_summary(model, pairs), "ranked_by": table.ranking_metric(),
            "effect_note": table.effect_note(), "ranked_heads": [f"{a}.{b}" for a, b in ranked], "points": points})
    return 0


def cmd_attention(args) -> int:
    model = _model(args)
    if args.text is not None:
        from engine.techniques.attention import prompt_attention
        if args.layer is None or args.head is None:
            raise CliError("--text needs --layer and --head")
        typed = _typed(model, args.text)
        rows = [t.__dict__ for t in prompt_attention(model, typed.ids, args.layer, args.head)]
        _write_csv(args.out, rows)
        _print({"out": str(args.out), "layer": args.layer, "head": args.head, **_typed_summary(model, typed),
                "tokens": rows})
        return 0
    from engine.techniques.attention import cached_role_attention
    cache = _cache(args)
    pairs = _pairs(args, model, cache)
    vals, computed = cached_role_attention(model, pairs, cache=cache)
    _write_csv(args.out, [v.__dict__ for v in vals])
    _print({"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "rows": len(vals),
            "answer_tokens": _answer_token_summary(model, pairs)})
    return 0


def cmd_mlp_projection(args) -> int:
    from engine.techniques.projections import cached_mlp_projections, top_number_tokens
    model = _model(args)
    typed = _typed(model, args.text)
    cache = _cache(args)
    pairs = _pairs(args, model, cache)
    vals, computed = cached_mlp_projections(model, pairs, cache=cache)
    _write_csv(args.out, [v.__dict__ for v in vals])
    res: dict[str, Any] = {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
                           "answer_tokens": _answer_token_summary(model, pairs),
                           "per_layer": [v.__dict__ for v in vals]}
    if typed is not None:
        res.update(_typed_summary(model, typed))
        res["top_number_tokens"] = [t.__dict__ for t in top_number_tokens(model, args.text, typed.ids)]
    _print(res)
    return 0


def cmd_transfer(args) -> int:
    from engine.techniques.accuracy import keep_correct, kept_pairs
    from engine.techniques.transfer import benchmark_pairs, transfer
    model = _model(args)
    cache = _cache(args)
    pairs_a, _ = kept_pairs(model, _spec(args), cache=cache)
    if args.b_bench:
        pairs_b = keep_correct(model, benchmark_pairs(model.tokenizer, args.data_dir, args.b_bench, args.n,
                                                      args.seed))
        name_b = args.b_bench
    else:
        pairs_b, _ = kept_pairs(model, _spec(args, args.b_families), cache=cache)
        name_b = args.b_families
    bar = _bar(args, "transfer")
    res = transfer(model, pairs_a, pairs_b, names=(args.families, name_b), k=args.k, cache=cache,
                   progress=bar).to_json()
    bar.close()
    res["answer_tokens"] = {name: _answer_token_summary(model, ps) for name, ps in
                            ((args.families, pairs_a), (name_b, pairs_b)) if ps}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    _print(res)
    return 0


def cmd_evaluate(args) -> int:
    from engine.evaluation.benchmarks import parse_benches
    from engine.evaluation.evaluate import evaluate_cached, load_eval_set, table1, table1_markdown
    benches = parse_benches(args.bench)
    for b in benches:  # bad data fails before a model is loaded
        load_eval_set(b, data_dir=args.data_dir, split=args.split, limit=args.limit, few_shot=args.few_shot,
                      seed=args.seed)
    cache = _cache(args)

    def run(model) -> dict[str, Any]:
        out = {}
        for b in benches:
            res, computed = evaluate_cached(model, b, data_dir=args.data_dir, split=args.split, limit=args.limit,
                                            few_shot=args.few_shot, seed=args.seed,
                                            max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                            cache=cache)
            out[b] = {**res.to_json(), "cached": not computed}
        return out

    model = _model(args)
    full: dict[str, Any] = {"model": model.facts.spec, "fingerprint": model.facts.fingerprint,
                            "results": run(model)}
    if args.base:
        import copy
        base_args = copy.copy(args)
        base_args.model = args.base  # same backend, device map and remote choice as the tuned model
        base = _model(base_args)
        full["base"] = {"model": base.facts.spec, "fingerprint": base.facts.fingerprint, "results": run(base)}
        rows = table1({b: r["accuracy"] for b, r in full["base"]["results"].items()},
                      {args.model: {b: r["accuracy"] for b, r in full["results"].items()}}, base_name=args.base)
        full["table1"] = [r.__dict__ for r in rows]
        full["table1_markdown"] = table1_markdown(rows)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(full, indent=2) + "\n")

    def brief(results: dict[str, Any]) -> dict[str, Any]:
        return {b: {k: v for k, v in r.items() if k != "records"} for b, r in results.items()}
    shown = {**full, "results": brief(full["results"])}
    if "base" in full:
        shown["base"] = {**full["base"], "results": brief(full["base"]["results"])}
    _print(shown)
    return 0


def cmd_finetune(args) -> int:
    from engine.cli import finetune as cli_finetune
    if args.remote or args.device_map:
        raise CliError("finetune trains a local copy of the model: --remote and --device-map are not supported")
    return cli_finetune.cmd_finetune(args, _cache)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": cmd_info, "prompts": cmd_prompts, "accuracy": cmd_accuracy, "patch": cmd_patch,
    "knockout": cmd_knockout, "knockout-curve": cmd_knockout_curve, "attention": cmd_attention,
    "mlp-projection": cmd_mlp_projection, "transfer": cmd_transfer, "evaluate": cmd_evaluate,
    "finetune": cmd_finetune,
}


def _circuits_command(name: str) -> Callable[[argparse.Namespace], int]:
    from engine.cli import circuits as cli_circuits
    tools = cli_circuits.CliTools(model=_model, cache=_cache, pairs=_pairs, write_csv=_write_csv, print=_print,
                                  spec=_spec)
    return lambda args: cli_circuits.COMMANDS[name](args, tools)


COMMANDS.update({name: _circuits_command(name)
                 for name in ("attribution", "position-patch", "logit-lens", "report", "reproduce")})



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
        args = build_parser().parse_args(argv)
        status = COMMANDS[args.cmd](args)
        cache = getattr(args, "result_cache", None)
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
