"""Precise SFT of key heads, with full SFT and LoRA as baselines (Zhang et al. 2024, §4.3 / §5.3).

The paper's method, as implemented here:

1. **Select heads.**  H = the top-k heads of a path-patching run (``engine.techniques.path_patching``), or a list
   given by the user ("3.1,5.0"); optionally whole MLP layers too.
2. **Make only their slices trainable.**  For a selected head h of layer l the trainable parameters
   are the rows of W_Q that produce h's queries, the rows of W_K / W_V that produce its key/value
   head, and the columns of W_O that read h's output (biases of those rows too).  Everything else
   is frozen.  The slices are *real parameters* (``HeadSlices``) with their own optimizer state;
   the frozen matrices take part in the forward pass without any weight gradient, so memory and
   time fall with the tuned fraction.
3. **Grouped-query attention rule** (``kv_rule``).  With n_kv < n_heads, key/value head g serves
   query heads g*G .. g*G+G-1 (G = n_heads / n_kv).  Default ``"any"``: a KV group is tuned when
   *any* of its query heads is selected -- its K/V slice is then shared by the selected and the
   unselected query heads of the group, so tuning it also changes heads that were not selected.
   ``"all"``: a KV group is tuned only when *all* its query heads are selected (nothing
   unselected changes); ``"none"``: only W_Q and W_O slices are tuned.  Without GQA (G = 1) the
   three rules coincide.
4. **Gradient rescaling.**  Each tuned slice's gradient is multiplied by H / h_l, where H is the
   number of heads per layer and h_l the number of selected heads of layer l (so a layer with few
   tuned heads receives the update size of a fully tuned layer).  K/V slices use their layer's
   factor; MLP layers are not rescaled.
5. **Train** with AdamW, linear warm-up then linear decay.  The paper's setting for 7B models is
   lr 2e-5, batch 128, 2 epochs, warm-up 2 %, weight decay 0.1; the default recipe
   (``engine.finetune.recipe``) scales it to the model's size and the data's, per method.  The
   loss is the next-token cross-entropy of the answer tokens only (the prompt is context).
6. **Merge** the slices back into the full matrices (``HeadSlices.merge``): every weight outside
   the slices is bit-identical to the base model.

Baselines on the same data and schedule: full SFT (every parameter) and LoRA (``peft``, rank r on
the attention projections).  Models are plain Hugging Face models (``engine.models.load.load_plain``);
the tuned model is saved with ``save_pretrained`` and is a model SPEC like any other.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.finetune.errors import FinetuneError
from engine.finetune.recipe import default_recipe, training_steps
from engine.finetune.slices import KV_RULES, Head, HeadSlices, attn_layout
from engine.machinery.batching import pad_batch

Method = Literal["precise", "full", "lora"]
METHODS: tuple[str, ...] = ("precise", "full", "lora")


# ---------------------------------------------------------------------------------------------
# configuration and data
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a fine-tuning run.

    The schedule fields left at None (lr, batch_size, epochs, min_steps, warmup, weight_decay) take
    the default recipe's value for the method and the model's size (``engine.finetune.recipe``;
    :meth:`resolved`), so every entry point trains alike unless told otherwise."""

    method: str = "precise"
    heads: tuple[Head, ...] = ()
    mlps: tuple[int, ...] = ()
    lr: float | None = None
    batch_size: int | None = None
    epochs: float | None = None
    min_steps: int | None = None  # at least this many optimizer steps (small data sets)
    warmup: float | None = None  # fraction of the steps
    weight_decay: float | None = None
    max_steps: int | None = None  # stop early (benchmarks)
    micro_batch: int = 32  # gradient accumulation chunk (memory)
    rescale: bool = True  # gradient x H/h_l for head slices
    kv_rule: str = "any"  # GQA: tune a KV group when "any" / "all" of its query heads are selected, or "none"
    lora_r: int = 8
    lora_alpha: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise FinetuneError(f"unknown method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.method == "precise" and not self.heads and not self.mlps:
            raise FinetuneError("precise SFT needs heads (e.g. 3.1,5.0 or the top-k of a patching run) "
                                "or MLP layers to tune")
        for name in ("lr", "epochs"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise FinetuneError(f"{name} must be > 0, got {value}")
        for name in ("batch_size", "micro_batch", "lora_r"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FinetuneError(f"{name} must be a positive whole number, got {value}")
        if self.kv_rule not in KV_RULES:
            raise FinetuneError(f"unknown kv_rule {self.kv_rule!r}: choose from {', '.join(KV_RULES)}")
        if self.warmup is not None and not 0 <= self.warmup < 1:
            raise FinetuneError(f"warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise FinetuneError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise FinetuneError(f"max_steps must be positive, got {self.max_steps}")
        if self.min_steps is not None and self.min_steps < 0:
            raise FinetuneError(f"min_steps must be >= 0, got {self.min_steps}")

    def resolved(self, n_params: int) -> "TrainConfig":
        """This config with every schedule field left at None set from the default recipe.

        ``min_steps`` follows the recipe only while ``epochs`` does too: a user who asks for
        1 epoch gets 1 epoch."""
        r = default_recipe(self.method, n_params)
        min_steps = self.min_steps if self.min_steps is not None else (r.min_steps if self.epochs is None else 0)
        return replace(self, lr=r.lr if self.lr is None else self.lr,
                       batch_size=r.batch_size if self.batch_size is None else self.batch_size,
                       epochs=r.epochs if self.epochs is None else self.epochs, min_steps=min_steps,
                       warmup=r.warmup if self.warmup is None else self.warmup,
                       weight_decay=r.weight_decay if self.weight_decay is None else self.weight_decay)

    @property
    def is_resolved(self) -> bool:
        return None not in (self.lr, self.batch_size, self.epochs, self.min_steps, self.warmup, self.weight_decay)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["heads"] = [list(h) for h in self.heads]
        d["mlps"] = list(self.mlps)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["heads"] = tuple((int(a), int(b)) for a, b in d.get("heads", ()))
        d["mlps"] = tuple(int(m) for m in d.get("mlps", ()))
        return cls(**d)


@dataclass(frozen=True)
class SFTExample:
    prompt: str
    answer: str


@dataclass
class TrainProgress:
    step: int
    total_steps: int
    loss: float
    lr: float
    samples_seen: int
    elapsed_s: float


@dataclass
class TrainResult:
    method: str
    steps: int
    samples: int
    losses: list[float]
    seconds: float
    samples_per_s: float
    trainable_params: int
    optimizer_state_numel: int
    total_params: int
    peak_memory_bytes: int | None
    stopped: bool = False
    config: dict = field(default_factory=dict)  # the resolved TrainConfig (recipe values filled in)

    def to_dict(self) -> dict:
        return asdict(self)


ProgressFn = Callable[[TrainProgress], None]
StopFn = Callable[[], bool]


def encode_examples(tokenizer, examples: Sequence[SFTExample]) -> list[tuple[list[int], int]]:
    """Token ids of prompt + " " + answer (+ EOS) and the index where the answer starts.

    The answer's tokens are those that cover the characters after the prompt (the same rule as
    ``engine.prompts.pairs.answer_tokens``), so word-level and BPE tokenizers split alike.
    """
    out: list[tuple[list[int], int]] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for i, ex in enumerate(examples):
        if not ex.prompt.strip() or not str(ex.answer).strip():
            raise FinetuneError(f"example {i}: prompt and answer must be non-empty")
        full = f"{ex.prompt} {str(ex.answer).strip()}"
        enc = tokenizer(full, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        cut = len(ex.prompt)
        start = next((j for j, (s, e) in enumerate(enc["offset_mapping"]) if e > s and e > cut
                      and full[max(s, cut):e].strip()), None)
        if start is None or start == 0:
            raise FinetuneError(f"example {i}: the answer {ex.answer!r} produced no tokens after the prompt")
        if eos is not None and ids[-1] != eos:
            ids.append(int(eos))
        out.append((ids, start))
    return out


def _batch(encoded: Sequence[tuple[list[int], int]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and labels (-100 outside the answer)."""
    seqs = [seq for seq, _ in encoded]
    ids, mask, labels = pad_batch(seqs, pad_id, labels=[[-100] * start + seq[start:] for seq, start in encoded])
    return ids.to(device), mask.to(device), labels.to(device)


def _takes_logits_to_keep(model: nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrapper
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def answer_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the answer tokens given everything before them.

    Only the positions that predict an answer token go through the unembedding (``logits_to_keep``,
    where the model takes it): with a large vocabulary the LM head over every position would
    otherwise be a large share of the step (forward, backward, and the logits' memory).
    """
    keep = (labels[:, 1:] != -100).any(0).nonzero().squeeze(1)  # [n_keep] positions p: labels[:, p+1] is an answer
    if _takes_logits_to_keep(model):
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits  # [batch, n_keep, vocab]
    else:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, keep]
    return F.cross_entropy(logits.flatten(0, 1).float(), labels[:, keep + 1].flatten(),
                           ignore_index=-100, reduction=reduction)


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def trainable(model: nn.Module, config: TrainConfig) -> Iterator[tuple[nn.Module, list[nn.Parameter], object]]:
    """(module to call, parameters to optimize, slices) for ``config.method``; restores on exit.

    precise: head slices (merged into the model on exit); full: every parameter; lora: a peft
    wrapper whose adapters are merged into the model on exit.
    """
    if config.method == "precise":
        with HeadSlices(model, config.heads, config.mlps, config.rescale, config.kv_rule) as slices:
            yield model, slices.parameters(), slices
    elif config.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        yield model, [p for p in model.parameters()], None
    else:
        from peft import LoraConfig, get_peft_model

        layout = attn_layout(model)
        lcfg = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                          target_modules=layout.lora_targets(), task_type="CAUSAL_LM",
                          fan_in_fan_out=layout.modules.conv1d)  # GPT-2's Conv1D stores [in, out]
        peft_model = get_peft_model(model, lcfg)
        try:
            yield peft_model, [p for p in peft_model.parameters() if p.requires_grad], None
        finally:
            peft_model.merge_and_unload()
            for p in model.parameters():
                p.requires_grad_(True)


def _lr_at(step: int, total: int, warmup_steps: int, lr: float) -> float:
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    rest = max(1, total - warmup_steps)
    return lr * max(0.0, (total - step) / rest)


def optimizer_state_numel(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() for st in opt.state.values() for v in st.values()
               if isinstance(v, torch.Tensor) and v.ndim > 0)


def train(model: nn.Module, tokenizer, examples: Sequence[SFTExample], config: TrainConfig, *,
          progress: ProgressFn | None = None, should_stop: StopFn | None = None,
          on_slices: Callable[[HeadSlices], None] | None = None) -> TrainResult:
    """Fine-tune ``model`` (a plain HF causal LM) in place on ``examples``; see module docstring.

    ``progress`` is called after every optimizer step; ``should_stop()`` is polled between steps
    (a stopped run keeps the updates made so far and is flagged ``stopped``).  ``on_slices`` sees
    the installed head slices before they are merged (to save the small slices file).
    """
    if not examples:
        raise FinetuneError("no training examples")
    n_total = sum(p.numel() for p in model.parameters())
    config = config.resolved(n_total)
    encoded = encode_examples(tokenizer, examples)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device
    total = training_steps(len(encoded), config.batch_size, config.epochs, config.min_steps)
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup_steps = int(round(config.warmup * total))
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    was_training = model.training
    losses: list[float] = []
    seen = 0
    stopped = False
    t0 = time.perf_counter()
    with trainable(model, config) as (net, params, slices):
        n_train = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        net.train()
        order: list[int] = []
        for step in range(total):
            if should_stop is not None and should_stop():
                stopped = True
                break
            if len(order) < config.batch_size:
                perm = list(range(len(encoded)))
                rng.shuffle(perm)
                order.extend(perm)
            batch_idx, order = order[:config.batch_size], order[config.batch_size:]
            lr = _lr_at(step, total, warmup_steps, config.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            n_tokens = sum(len(encoded[i][0]) - encoded[i][1] for i in batch_idx)
            step_loss = 0.0
            for c in range(0, len(batch_idx), config.micro_batch):
                chunk = [encoded[i] for i in batch_idx[c:c + config.micro_batch]]
                ids, mask, labels = _batch(chunk, pad, device)
                loss = answer_loss(net, ids, mask, labels, reduction="sum") / n_tokens
                loss.backward()
                step_loss += float(loss.detach())
            opt.step()
            seen += len(batch_idx)
            losses.append(step_loss)
            if progress is not None:
                progress(TrainProgress(step + 1, total, step_loss, lr, seen, time.perf_counter() - t0))
        state_numel = optimizer_state_numel(opt)
        if slices is not None and on_slices is not None:
            on_slices(slices)
    model.train(was_training)
    seconds = time.perf_counter() - t0
    return TrainResult(
        method=config.method, steps=len(losses), samples=seen, losses=losses, seconds=seconds,
        samples_per_s=seen / seconds if seconds > 0 else 0.0, trainable_params=n_train,
        optimizer_state_numel=state_numel, total_params=n_total,
        peak_memory_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else None,
        stopped=stopped, config=config.to_dict())


__all__ = ["METHODS", "TrainConfig", "SFTExample", "TrainProgress", "TrainResult", "encode_examples",
           "answer_loss", "train", "trainable", "optimizer_state_numel"]
