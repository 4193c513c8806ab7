"""The ``finetune`` subcommand.

    python -m engine finetune --model SPEC --method {precise,full,lora} --heads 3.1,5.0 [--mlps 4]
                              --data D --out DIR

``--heads`` may be replaced by ``--top-k K`` (the top-K heads of the base model's cached
path-patching run).  D is a JSONL file of {"prompt": ..., "answer": ...} lines or a built-in set
(listed in --help).  Prints the run record (also written to DIR/finetune.json) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from engine.cli.context import model_args
from engine.finetune.data import BUILTIN_SETS
from engine.registry import positive_int

if TYPE_CHECKING:
    from engine.finetune.train import TrainConfig


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def register(sub) -> None:
    p = sub.add_parser(
        "finetune", help="precise SFT of key heads (or full SFT / LoRA) -> a tuned model directory",
        description="Fine-tune a model and save it (save_pretrained) as a new model SPEC. "
                    f"--data: a JSONL file of {{\"prompt\": ..., \"answer\": ...}} lines or a built-in set: "
                    f"{', '.join(BUILTIN_SETS)} (notation/power: skill families the bundled model never "
                    f"trained on, training split; notation+replay: notation plus the control facts; arith: "
                    f"the paper's templates; gsm8k/csqa/mmlu: benchmark training splits from --data-dir).")
    model_args(p)
    p.add_argument("--method", default="precise", choices=("precise", "full", "lora"))
    p.add_argument("--heads", default=None, help="heads to tune, LAYER.HEAD comma list (precise)")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help="tune the top-K heads of the base model's path-patching run instead of --heads")
    p.add_argument("--mlps", default=None, help="also tune these whole MLP layers, e.g. 4 or 3,4 (precise)")
    p.add_argument("--kv-rule", default="any", choices=("any", "all", "none"),
                   help="GQA: tune a K/V group when any / all of its query heads are selected, or never")
    p.add_argument("--no-rescale", action="store_true", help="do not multiply slice gradients by H/h")
    p.add_argument("--data", required=True, help=f"JSONL file or one of: {', '.join(BUILTIN_SETS)}")
    p.add_argument("--data-dir", default=None, help="benchmark data directory (layout of ../shared/data)")
    p.add_argument("--limit", type=positive_int, default=None, help="use at most N training examples")
    p.add_argument("--out", required=True, help="output directory (a new model SPEC)")
    recipe = " (default: the recipe for the method and model size, engine/finetune/recipe.py)"
    p.add_argument("--lr", type=_float, default=None, help="learning rate" + recipe)
    p.add_argument("--batch-size", type=positive_int, default=None, help="examples per optimizer step" + recipe)
    p.add_argument("--micro-batch", type=positive_int, default=32)
    p.add_argument("--epochs", type=_float, default=None,
                   help="passes over the data" + recipe + "; giving it drops the recipe's minimum number of steps")
    p.add_argument("--warmup", type=_float, default=None, help="warm-up fraction of the steps" + recipe)
    p.add_argument("--weight-decay", type=_float, default=None, help="AdamW weight decay" + recipe)
    p.add_argument("--max-steps", type=positive_int, default=None)
    p.add_argument("--lora-r", type=positive_int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job-dir", default=None, help=argparse.SUPPRESS)  # set by engine.finetune.jobs


def config_from_args(args, heads) -> "TrainConfig":
    from engine.finetune.run import parse_mlps
    from engine.finetune.train import TrainConfig

    return TrainConfig(method=args.method, heads=tuple(heads), mlps=parse_mlps(args.mlps), lr=args.lr,
                       batch_size=args.batch_size, epochs=args.epochs, warmup=args.warmup,
                       weight_decay=args.weight_decay, max_steps=args.max_steps, micro_batch=args.micro_batch,
                       rescale=not args.no_rescale, kv_rule=args.kv_rule, lora_r=args.lora_r,
                       lora_alpha=2 * args.lora_r, seed=args.seed)


def run(args, ctx) -> int:
    from engine.finetune.errors import FinetuneError
    from engine.finetune.run import FinetuneRequest, run_finetune, top_heads
    from engine.finetune.slices import parse_heads

    if args.remote or args.device_map:
        raise FinetuneError("finetune trains a local copy of the model: --remote and --device-map are not supported")
    writer = None
    if args.job_dir:
        from engine.finetune.jobs import JobWriter
        writer = JobWriter(args.job_dir)
    try:
        if args.heads and args.top_k:
            raise FinetuneError("give --heads or --top-k, not both")
        heads: tuple = ()
        if args.heads:
            heads = parse_heads(args.heads)
        elif args.top_k:
            heads = top_heads(args.model, args.top_k, device=args.device, dtype=args.dtype, cache=ctx.cache)
        elif args.method == "precise" and not args.mlps:
            raise FinetuneError("precise SFT needs --heads LAYER.HEAD,... or --top-k K (or --mlps)")
        if args.method != "precise" and (heads or args.mlps):
            raise FinetuneError(f"--heads/--top-k/--mlps only apply to --method precise, not {args.method}")
        req = FinetuneRequest(spec=args.model, config=config_from_args(args, heads), data=args.data,
                              out_dir=args.out, data_dir=args.data_dir, limit=args.limit, device=args.device,
                              dtype=args.dtype)
        record = run_finetune(req, progress=writer.progress if writer else None,
                              should_stop=writer.should_stop if writer else None)
    except BaseException as e:
        if writer is not None:
            writer.finish("failed", f"{type(e).__name__}: {e}")
        raise
    if writer is not None:
        writer.finish("stopped" if record["result"]["stopped"] else "finished", out_dir=args.out)
    summary = dict(record)
    summary["result"] = {k: v for k, v in record["result"].items() if k != "losses"}
    summary["result"]["first_loss"] = record["result"]["losses"][0] if record["result"]["losses"] else None
    summary["result"]["last_loss"] = record["result"]["losses"][-1] if record["result"]["losses"] else None
    print(json.dumps(summary, indent=2), file=sys.stdout)
    return 0
