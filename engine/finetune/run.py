"""A fine-tuning run end to end: pick heads, load the base, train, save, record.

``run_finetune`` is what the ``finetune`` CLI and the Improve page's background jobs execute:

1. heads -- the given list, or the top-k (effect rank) of the cached path-patching run of the
   base model on a prompt set (default: the paper's Figure 8 templates (32), operands 1..9);
2. the base model is loaded *without* the TransformerBridge (``engine.models.load.load_plain``) and
   trained in place by ``engine.finetune.train.train``;
3. the tuned model is saved with ``save_pretrained`` (safetensors) plus its tokenizer -- the output
   directory is a model SPEC like any other -- together with ``tuned_slices.safetensors`` (precise
   SFT: only the tuned slices and their row/column indices, the head list in the metadata) and
   ``finetune.json`` (base spec and fingerprint, config, data, losses, speed, parameter counts).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from engine.finetune.data import data_hash, load_sft_data
from engine.finetune.errors import FinetuneError
from engine.finetune.slices import Head
from engine.finetune.train import ProgressFn, StopFn, TrainConfig, train

SLICES_FILE = "tuned_slices.safetensors"
RECORD_FILE = "finetune.json"


def top_heads(spec: str, k: int, *, device: str | None = None, dtype: str = "float32", cache=None,
              prompt_set=None) -> tuple[Head, ...]:
    """The top-k heads (most negative effect) of the cached path-patching run of ``spec``."""
    from engine.backends import open_model
    from engine.prompts.promptsets import PromptSetSpec
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching

    if k <= 0:
        raise FinetuneError(f"k must be a positive number of heads, got {k}")
    model = open_model(spec, device=device, dtype=dtype)
    pairs, _ = kept_pairs(model, prompt_set or PromptSetSpec(), cache=cache)
    if not pairs:
        raise FinetuneError(f"{spec} answers none of the prompt set right: no patching run to rank heads; "
                            f"give --heads explicitly")
    table, _ = cached_path_patching(model, pairs, cache=cache)
    return tuple((int(layer), int(head)) for layer, head, _ in table.top_heads(k))


@dataclass(frozen=True)
class FinetuneRequest:
    spec: str
    config: TrainConfig
    data: str  # built-in set name or JSONL path
    out_dir: str
    data_dir: str | None = None
    limit: int | None = None
    device: str | None = None
    dtype: str = "float32"

    def cli_args(self) -> list[str]:
        """The ``python -m engine finetune`` arguments that run this request (what a background job runs).

        Schedule fields left at None are not passed, so the worker takes the default recipe."""
        c = self.config
        args = ["--model", self.spec, "--dtype", self.dtype, "--method", c.method, "--data", self.data,
                "--out", self.out_dir, "--micro-batch", str(c.micro_batch), "--kv-rule", c.kv_rule,
                "--lora-r", str(c.lora_r), "--seed", str(c.seed)]
        for flag, value in (("--lr", c.lr), ("--batch-size", c.batch_size), ("--epochs", c.epochs),
                            ("--warmup", c.warmup), ("--weight-decay", c.weight_decay),
                            ("--max-steps", c.max_steps), ("--device", self.device),
                            ("--data-dir", self.data_dir), ("--limit", self.limit)):
            if value is not None:
                args += [flag, str(value)]
        if c.heads:
            args += ["--heads", heads_text(c.heads)]
        if c.mlps:
            args += ["--mlps", ",".join(str(m) for m in c.mlps)]
        if not c.rescale:
            args.append("--no-rescale")
        return args


def check_out_dir(out: str | Path) -> None:
    """A tuned model goes into a new directory: an existing file, or a non-empty directory (an earlier
    run's model included), is refused rather than overwritten."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FinetuneError(f"--out {out} exists and is not a directory: pick a new directory")
    if out.is_dir() and any(out.iterdir()):
        what = "a tuned model" if (out / RECORD_FILE).exists() else "a non-empty directory"
        raise FinetuneError(f"--out {out} is already {what}: pick a new directory (or delete it first)")


def run_finetune(req: FinetuneRequest, *, progress: ProgressFn | None = None,
                 should_stop: StopFn | None = None) -> dict:
    """Train and save (see module docstring); returns the record written to ``finetune.json``."""
    from safetensors.torch import save_file

    from engine.models.fingerprint import weights_fingerprint
    from engine.models.load import load_plain

    out = Path(req.out_dir)
    check_out_dir(out)
    examples = load_sft_data(req.data, data_dir=req.data_dir, limit=req.limit)
    plain = load_plain(req.spec, device=req.device, dtype=req.dtype)
    if out.resolve() == Path(plain.resolved.location).resolve():
        raise FinetuneError("--out must not be the base model's own directory")
    base_fp = weights_fingerprint(plain.hf_model)
    slices: dict[str, torch.Tensor] = {}
    result = train(plain.hf_model, plain.tokenizer, examples, req.config, progress=progress,
                   should_stop=should_stop, on_slices=lambda s: slices.update(s.state_dict()))
    plain.hf_model.eval()
    # write everything into a sibling temp directory, then move it into place: a run that dies
    # half way never leaves a directory that looks like a finished model
    tmp_dir = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp_dir.exists():
        shutil.rmtree(tmp_dir)
    tmp_dir.mkdir(parents=True)
    plain.hf_model.save_pretrained(tmp_dir, safe_serialization=True)
    plain.tokenizer.save_pretrained(tmp_dir)
    heads = [list(h) for h in req.config.heads]
    if slices:
        save_file(slices, str(tmp_dir / SLICES_FILE), metadata={
            "heads": json.dumps(heads), "mlps": json.dumps(list(req.config.mlps)),
            "kv_rule": req.config.kv_rule, "base_fingerprint": base_fp})
    record = {
        "base_spec": req.spec, "base_fingerprint": base_fp,
        "tuned_fingerprint": weights_fingerprint(plain.hf_model),
        "config": result.config, "data": req.data, "data_hash": data_hash(examples),
        "n_examples": len(examples), "dtype": req.dtype, "device": str(plain.device),
        "result": result.to_dict(),
    }
    (tmp_dir / RECORD_FILE).write_text(json.dumps(record, indent=2))
    if out.is_dir():  # empty (check_out_dir)
        out.rmdir()
    os.replace(tmp_dir, out)
    return record


def read_record(model_dir: str | Path) -> dict | None:
    """The ``finetune.json`` of a tuned model directory, or None for a model that was not tuned here."""
    p = Path(model_dir) / RECORD_FILE
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FinetuneError(f"{p} is unreadable ({e}); the tuned model itself may still load") from e


def apply_slices(model: torch.nn.Module, slices_file: str | Path) -> list[Head]:
    """Write a ``tuned_slices.safetensors`` file into a base model (in place); returns its heads.

    The base must be the model the slices were trained from (its fingerprint is in the metadata;
    the caller checks it when it matters).
    """
    from safetensors import safe_open

    from engine.finetune.slices import attn_layout, weight_out_in

    path = Path(slices_file)
    if not path.is_file():
        raise FinetuneError(f"slices file {path} does not exist")
    modules = dict(model.named_modules())
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        keys = set(f.keys())
        with torch.no_grad():
            for key in sorted(keys):
                if key.startswith("mlp."):
                    _, layer, pname = key.split(".", 2)
                    target = dict(attn_layout(model).mlp(model, int(layer)).named_parameters())[pname]
                    target.copy_(f.get_tensor(key).to(target))
                    continue
                mod_name, pname = key.rsplit(".", 1)
                if pname not in ("weight_slice", "bias_slice"):
                    continue
                if mod_name not in modules:
                    raise FinetuneError(f"{path}: the model has no module {mod_name!r} (wrong base model?)")
                module = modules[mod_name]
                value = f.get_tensor(key)
                if f"{mod_name}.rows" in keys:
                    idx = f.get_tensor(f"{mod_name}.rows").long()
                    if pname == "weight_slice":
                        W = weight_out_in(module)
                        W[idx] = value.to(W)
                    else:
                        module.bias[idx] = value.to(module.bias)
                else:
                    idx = f.get_tensor(f"{mod_name}.cols").long()
                    W = weight_out_in(module)
                    W[:, idx] = value.to(W)
    return [tuple(h) for h in json.loads(meta.get("heads", "[]"))]


def parse_mlps(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise FinetuneError(f"bad --mlps {text!r}: give layer numbers such as 4 or 3,4") from None


def heads_text(heads: Sequence[Head]) -> str:
    return ",".join(f"{layer}.{head}" for layer, head in heads)
