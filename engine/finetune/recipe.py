"""The default training recipe: one for the ``finetune`` CLI, the Improve page and the benchmarks.

The paper trains LLaMA2-7B/13B with lr 2e-5, batch 128, 2 epochs, warm-up 2 %, weight decay 0.1,
the same for precise and full SFT (§5.3), on the training data of four math sets (thousands of
examples).  Taken literally on a 135M-parameter model and the 400 template prompts of
``--data arith`` that is 7 optimizer steps at a 7B model's step size: full SFT moves a little and
precise SFT not at all.  A recipe must therefore scale with the model and with the data:

* **Anchors.**  Three measured recipes (:data:`ANCHORS`): the bundled model (1.22 M parameters;
  the skill demonstration's schedule, ``engine.finetune.skill_demo``), SmolLM2-135M (learning rate
  per method picked on a validation split by ``bench/improve.py --sweep``: held-out operand pairs
  of the training templates), and the paper's 7B setting (LoRA: QLoRA's 2e-4 for 7B models).
* **Learning rate, per method.**  Log-log interpolation in the number of parameters between the
  two anchors around the model (bigger models take smaller steps), clamped outside them.  Precise
  SFT trains < 5 % of the weights and takes larger steps than full SFT at small scale, as LoRA does.
* **Schedule** (batch, epochs, at least ``min_steps`` optimizer steps, warm-up, weight decay): the
  nearest anchor in log-parameters.  ``min_steps`` makes a small data set still get enough steps
  (the paper's 2 epochs of 400 prompts at batch 32 would be 26 steps).

``TrainConfig`` fields left at None take the recipe's value (:meth:`TrainConfig.resolved`), so
an explicit ``--lr`` etc. always wins, and the run record stores the values actually used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.finetune.errors import FinetuneError

#: Methods a recipe covers (engine.finetune.train.METHODS).
RECIPE_METHODS: tuple[str, ...] = ("precise", "full", "lora")


@dataclass(frozen=True)
class Anchor:
    """A measured recipe for a model of ``n_params`` parameters."""

    name: str
    n_params: float
    lr: dict[str, float]  # per method
    batch_size: int
    epochs: float
    min_steps: int
    warmup: float
    weight_decay: float
    source: str


ANCHORS: tuple[Anchor, ...] = (
    Anchor("the bundled model", 1.22e6, {"precise": 3e-3, "full": 3e-3, "lora": 3e-3},
           batch_size=32, epochs=30.0, min_steps=0, warmup=0.05, weight_decay=0.0,
           source="the skill demonstration's schedule (engine/finetune/skill_demo.py)"),
    Anchor("SmolLM2-135M", 1.345e8, {"precise": 1e-3, "full": 6e-5, "lora": 3e-3},
           batch_size=32, epochs=2.0, min_steps=50, warmup=0.02, weight_decay=0.1,
           source="learning rates picked on a validation split by bench/improve.py --sweep"),
    Anchor("the paper's 7B models", 7e9, {"precise": 2e-5, "full": 2e-5, "lora": 2e-4},
           batch_size=128, epochs=2.0, min_steps=0, warmup=0.02, weight_decay=0.1,
           source="Zhang et al. 2024, §5.3 (LoRA: QLoRA's 2e-4 for 7B models)"),
)


@dataclass(frozen=True)
class Recipe:
    """Training hyper-parameters for one method and model size, and why."""

    method: str
    lr: float
    batch_size: int
    epochs: float
    min_steps: int
    warmup: float
    weight_decay: float
    reason: str

    def steps(self, n_examples: int) -> int:
        """Optimizer steps on ``n_examples``: ``epochs`` epochs, at least ``min_steps``."""
        return training_steps(n_examples, self.batch_size, self.epochs, self.min_steps)


def training_steps(n_examples: int, batch_size: int, epochs: float, min_steps: int = 0) -> int:
    """Optimizer steps of ``epochs`` passes over ``n_examples`` at ``batch_size``, at least ``min_steps`` (and 1)."""
    per_epoch = max(1, math.ceil(n_examples / batch_size))
    return max(1, math.ceil(per_epoch * epochs), min_steps)


def _interpolated_lr(method: str, n_params: float) -> tuple[float, str]:
    lo, hi = ANCHORS[0], ANCHORS[-1]
    if n_params <= lo.n_params:
        return lo.lr[method], f"at or below {lo.name}'s size"
    if n_params >= hi.n_params:
        return hi.lr[method], f"at or above {hi.name}' size"
    for a, b in zip(ANCHORS, ANCHORS[1:]):
        if a.n_params <= n_params <= b.n_params:
            t = (math.log(n_params) - math.log(a.n_params)) / (math.log(b.n_params) - math.log(a.n_params))
            lr = math.exp(math.log(a.lr[method]) + t * (math.log(b.lr[method]) - math.log(a.lr[method])))
            return float(f"{lr:.2g}"), f"log-log between {a.name} ({a.lr[method]:.0e}) and {b.name} " \
                                       f"({b.lr[method]:.0e})"
    raise AssertionError("unreachable: ANCHORS are sorted by size")


def default_recipe(method: str, n_params: int) -> Recipe:
    """The recipe for ``method`` on a model of ``n_params`` parameters (see module docstring)."""
    if method not in RECIPE_METHODS:
        raise FinetuneError(f"unknown method {method!r}: choose from {', '.join(RECIPE_METHODS)}")
    if n_params <= 0:
        raise FinetuneError(f"the number of parameters must be positive, got {n_params}")
    lr, where = _interpolated_lr(method, n_params)
    near = min(ANCHORS, key=lambda a: abs(math.log(n_params) - math.log(a.n_params)))
    reason = (f"{method} SFT of {n_params / 1e6:.3g} M parameters: lr {lr:.1e} ({where}); batch {near.batch_size}, "
              f"{near.epochs:g} epochs" + (f" and at least {near.min_steps} steps" if near.min_steps else "")
              + f", warm-up {near.warmup:g}, weight decay {near.weight_decay:g} ({near.name}: {near.source})")
    return Recipe(method, lr, near.batch_size, near.epochs, near.min_steps, near.warmup, near.weight_decay, reason)


__all__ = ["ANCHORS", "Anchor", "RECIPE_METHODS", "Recipe", "default_recipe", "training_steps"]
