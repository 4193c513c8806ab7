"""Train the bundled organism (the recipe is :mod:`engine.organism.recipe`) and write its card.

``python -m engine.organism train`` trains from scratch with the fixed seed and saves the model
(Hugging Face format) plus ``training_report.json``; ``python -m engine.organism card`` re-evaluates
an existing model and rewrites its README.md (:mod:`engine.organism.card`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, Sequence

from engine.organism.recipe import DEFAULT_DIR, Recipe, build_tokenizer, encode_batch, sample_example, training_combos


@contextlib.contextmanager
def layer_drop(attention, keep: list) -> Iterator[None]:
    """LayerDrop of one layer's attention: inside the block, the module's output is multiplied by
    ``keep[0]`` (# [batch, 1, 1], 0 = dropped for that example; ``keep`` empty = untouched).  The hook
    is always removed, so the trained model is a plain Llama."""

    def hook(module, args, output):
        # output[0]: the attention output  # [batch, pos, d_model]
        return (output[0] * keep[0],) + tuple(output[1:]) if keep else output

    handle = attention.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def build_model(recipe: Recipe, vocab_size: int, tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(recipe.seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.d_model, intermediate_size=recipe.d_mlp,
        num_hidden_layers=recipe.n_layers, num_attention_heads=recipe.n_heads,
        num_key_value_heads=recipe.n_kv_heads, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02, rope_theta=10000.0)
    return LlamaForCausalLM(cfg)


def train(recipe: Recipe, out_dir: Path = DEFAULT_DIR, log: Callable[[str], None] = print,
          checkpoint_every: int = 0) -> dict:
    """Train the organism and save it (HF format) plus ``training_report.json`` into ``out_dir``."""
    import torch
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t0 = time.time()
    tokenizer = build_tokenizer(recipe)
    model = build_model(recipe, len(tokenizer), tokenizer)
    model.train()
    rng = random.Random(recipe.seed)
    combos = training_combos(recipe, held_out=False)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr,
                            betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < recipe.warmup:
            return recipe.lr * (step + 1) / recipe.warmup
        frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return recipe.lr * 0.5 * (1 + math.cos(math.pi * frac))

    drop_gen = torch.Generator().manual_seed(recipe.seed)
    keep: list[torch.Tensor] = []  # [batch, 1, 1]: 0 where layer 0's attention is dropped
    dropping = recipe.p_drop_attn0 > 0
    losses: list[float] = []
    with contextlib.ExitStack() as stack:
        if dropping:
            stack.enter_context(layer_drop(model.model.layers[0].self_attn, keep))
        for step in range(recipe.steps):
            batch = [sample_example(rng, recipe, combos) for _ in range(recipe.batch_size)]
            ids, mask, lab = encode_batch(tokenizer, batch)
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            if dropping:
                keep[:] = [(torch.rand(len(batch), 1, 1, generator=drop_gen) >= recipe.p_drop_attn0).float()]
            out = model(input_ids=ids, attention_mask=mask, labels=lab)
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(out.loss.detach()))
            if checkpoint_every and step and step % checkpoint_every == 0:
                ckpt = out_dir / f"checkpoint-{step}"
                model.save_pretrained(ckpt, safe_serialization=True)
                tokenizer.save_pretrained(ckpt)
            if step % 100 == 0 or step == recipe.steps - 1:
                log(f"step {step:5d}  loss {sum(losses[-100:]) / len(losses[-100:]):.4f}  "
                    f"{time.time() - t0:6.0f}s")
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    report = {"recipe": asdict(recipe), "train_seconds": round(time.time() - t0, 1),
              "final_loss": sum(losses[-100:]) / len(losses[-100:])}
    (out_dir / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.organism",
                                 description="Train or evaluate the bundled arithmetic model.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train from scratch (fixed seed) and save to --out")
    tr.add_argument("--out", type=Path, default=DEFAULT_DIR)
    tr.add_argument("--steps", type=int, default=Recipe.steps)
    tr.add_argument("--seed", type=int, default=Recipe.seed)
    tr.add_argument("--layers", type=int, default=Recipe.n_layers)
    tr.add_argument("--d-mlp", type=int, default=Recipe.d_mlp)
    tr.add_argument("--tokenizer", choices=("word", "wordpiece"), default=Recipe.tokenizer)
    tr.add_argument("--sampling", choices=("template", "combo"), default=Recipe.sampling)
    tr.add_argument("--p-word", type=float, default=Recipe.p_word,
                    help="share of the addition examples drawn from the Figure 10 word problems")
    tr.add_argument("--template-weight", action="append", default=[], metavar="ID=W",
                    help="draw this template W times as often (repeatable), e.g. add.time_span.0=4")
    tr.add_argument("--p-drop-attn0", type=float, default=Recipe.p_drop_attn0,
                    help="share of training examples with layer 0's attention dropped (LayerDrop)")
    tr.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps")
    tr.add_argument("--no-card", action="store_true", help="skip the evaluation and model card")
    cd = sub.add_parser("card", help="evaluate a trained organism and (re)write its model card")
    cd.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    if args.cmd == "train":
        if min(args.steps, args.layers, args.d_mlp) <= 0:
            ap.error("--steps, --layers and --d-mlp must be positive")
        if not 0 <= args.p_drop_attn0 < 1 or not 0 <= args.p_word <= 1:
            ap.error("--p-drop-attn0 must be in [0, 1) and --p-word in [0, 1]")
        try:
            weights = tuple((t, float(w)) for t, w in (x.split("=", 1) for x in args.template_weight))
        except ValueError:
            ap.error("--template-weight takes ID=W, e.g. add.time_span.0=4")
        if weights and any(w <= 0 for _, w in weights):
            ap.error("--template-weight weights must be positive")
        report = train(Recipe(seed=args.seed, steps=args.steps, n_layers=args.layers, d_mlp=args.d_mlp,
                              tokenizer=args.tokenizer, sampling=args.sampling, p_word=args.p_word,
                              template_weights=weights or Recipe.template_weights,
                              p_drop_attn0=args.p_drop_attn0), args.out,
                       checkpoint_every=args.checkpoint_every)
        print(json.dumps(report, indent=2))
        if not args.no_card:
            make_card(args.out)
    elif args.cmd == "card":
        make_card(args.dir)
    return 0


def make_card(model_dir: Path) -> None:
    """Evaluate the model in ``model_dir`` and write its README.md model card."""
    from engine.backends import open_model
    from engine.organism.card import evaluate_organism, key_heads, write_card
    report = json.loads((model_dir / "training_report.json").read_text())
    recipe = Recipe(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                       for k, v in report["recipe"].items()})
    model = open_model(str(model_dir), device="cpu")
    ev = evaluate_organism(model, recipe)
    ev["n_params"] = model.facts.n_params
    heads = key_heads(model)
    write_card(model_dir, report, ev, heads)
    print(json.dumps({"held_out_by_op": ev["held_out_by_op"], "control": ev["control_accuracy"],
                      "key_heads": heads["*"]}, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
