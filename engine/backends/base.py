"""The narrow interface every technique and page talks to (cf. llm-transparency-tool's TransparentLlm).

Techniques never touch TransformerBridge (or nnsight) directly: they call a :class:`ModelBackend`,
which offers exactly what the paper's methods need --

* ``logits`` / ``run_with_cache`` / ``hooks`` -- forward passes, cached activations by TransformerLens
  hook name (built with :mod:`engine.backends.hooks`), and interventions in a ``with`` block that always
  removes its hooks (the loaded model is shared by every browser session);
* ``logits_at`` / ``end_logits`` / ``run_with_cache_at`` -- the final norm and the unembedding at chosen positions only
  (the END row of each prompt), never the full ``[batch, pos, vocab]`` tensor: an edit of the final
  norm's input keeps those positions (``hooks.ln_final_in``), so it works on every backend;
* per-layer *components* for exact single-position computations: the per-head output projection
  W_O, the MLP branch (its norm included) and the final norm + unembedding.  Fast path patching
  (:mod:`engine.techniques.patching`) chains these at the END position only.

``open_model(spec, backend="bridge" | "nnsight")`` is the one entry point the CLI and pages use:
``bridge`` is TransformerBridge (transformer-lens 4), ``nnsight`` the nnsight wrapper of the plain
Hugging Face model (:mod:`engine.backends.nnsight`), which can also run on NDIF (``remote=True``).
Both give the same numbers (``tests/integration/test_backends.py``) and the same weights
fingerprint, so their results share the cache entries.  ``device_map`` spreads a model over
several GPUs (accelerate); activations, weights and component outputs come back on the
embedding's device either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.backends import hooks as hook_names
from engine.backends.hooks import HookName
from engine.backends.layouts import final_norm_takes_rows
from engine.models.facts import ModelFacts

HookFn = Callable[[torch.Tensor], torch.Tensor | None]

BACKENDS: tuple[str, ...] = ("bridge", "nnsight")


@dataclass
class WorkMeter:
    """Work a backend has done, for benchmarks and tests (never used for results).

    ``forward_calls`` counts forward passes; ``body_tokens`` the positions they carried through
    every block (padding included); ``unembed_rows`` the positions that went through the final norm
    and the unembedding (``batch * pos`` for full logits, ``batch`` for END-only logits).
    """

    forward_calls: int = 0
    body_tokens: int = 0
    unembed_rows: int = 0

    def record(self, input_ids: torch.Tensor, logits: torch.Tensor) -> None:
        self.forward_calls += 1
        self.body_tokens += int(input_ids.numel())
        self.unembed_rows += int(logits.shape[:-1].numel())


def macs_per_position(facts: ModelFacts) -> tuple[float, float, float]:
    """Multiply-accumulates per position: (all blocks, the unembedding, one MLP branch).

    Blocks: the q/k/v/o projections (grouped-query k/v counted at their width) and the MLP (three
    matrices when gated, two otherwise); attention scores are left out.  The unit of the lab's
    forward-equivalent counts (``bench/sweeps.py``, the Knockout page's cost estimate)."""
    d = facts.d_model
    attn = 2 * d * facts.d_head * (facts.n_heads + facts.n_kv_heads)
    gated = facts.model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma")
    mlp = (3 if gated else 2) * d * facts.d_mlp
    return float(facts.n_layers * (attn + mlp)), float(d * facts.vocab_size), float(mlp)


class ModelBackend(ABC):
    """A loaded causal LM seen through the lab's narrow interface."""

    name: str
    facts: ModelFacts
    tokenizer: object

    @property
    def meter(self) -> WorkMeter:
        """Forward passes and tokens so far (see :class:`WorkMeter`); reset by assigning a new one."""
        if "_meter" not in self.__dict__:
            self._meter = WorkMeter()
        return self._meter

    @meter.setter
    def meter(self, value: WorkMeter) -> None:
        self._meter = value

    @abstractmethod
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """# [batch, pos, vocab]"""

    @abstractmethod
    def run_with_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       names: Sequence[HookName]) -> tuple[torch.Tensor, dict[HookName, torch.Tensor]]:
        """Logits and the named activations (detached)."""

    @abstractmethod
    def hooks(self, edits: Sequence[tuple[HookName, HookFn]]) -> AbstractContextManager[None]:
        """Forward hooks active inside the ``with`` block; ``fn(act)`` may edit in place or return."""

    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  positions: torch.Tensor) -> torch.Tensor:
        """Logits at ``positions[i]`` of row i only: the final norm and the unembedding run on those.

        positions: [batch, m] -> [batch, m, vocab].  Active ``hooks`` apply as in :meth:`logits`.
        """
        return self.run_with_cache_at(input_ids, attention_mask, [], positions)[0]

    def run_with_cache_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                          names: Sequence[HookName], positions: torch.Tensor
                          ) -> tuple[torch.Tensor, dict[HookName, torch.Tensor]]:
        """:meth:`run_with_cache` with the logits at ``positions[i]`` of row i only, as in :meth:`logits_at`.

        positions: [batch, m] -> ([batch, m, vocab], the named activations)."""
        pos = positions.to(torch.long)

        def rows_at(act: torch.Tensor) -> torch.Tensor:  # [batch, pos, ...] -> [batch, m, ...]
            rows = torch.arange(act.shape[0], device=act.device)[:, None]
            return act[rows, pos.to(act.device)]

        if not final_norm_takes_rows(self.facts.model_type):  # GPT-2: full logits, then the rows
            lg, cache = self.run_with_cache(input_ids, attention_mask, names)  # [batch, pos, vocab]
            return rows_at(lg), cache
        with self.hooks([(hook_names.ln_final_in(), rows_at)]):
            return self.run_with_cache(input_ids, attention_mask, names)

    def end_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   end: torch.Tensor) -> torch.Tensor:
        """Next-token logits at each row's END position only.  end: [batch] -> [batch, vocab]"""
        return self.logits_at(input_ids, attention_mask, end.reshape(-1, 1))[:, 0]

    # -- continuing the reference run: only the positions a patch changes -----------------------
    @property
    def continues(self) -> bool:
        """Whether :meth:`prefix` / :meth:`continue_end_logits` run here (a local model; NDIF: no)."""
        return False

    def prefix(self, input_ids: torch.Tensor) -> object:
        """The keys and values of unpadded prompts: the model's own KV cache, opaque.  # [batch, pos]"""
        raise NotImplementedError(f"the {self.name} backend cannot keep a prefix's keys and values")

    def continue_end_logits(self, prefix: object, rows: torch.Tensor, input_ids: torch.Tensor, *,
                            start: int | None = None) -> torch.Tensor:
        """Next-token logits after ``input_ids`` [n, m], row i continuing prompt ``rows[i]`` of ``prefix``
        (its first ``start`` positions; default all).

        Only the m new positions run (active ``hooks`` see ``[n, m, ...]``); they attend to the
        prefix's cached keys and values, so the result equals the last position's logits of the
        whole sequence.  -> [n, vocab]"""
        raise NotImplementedError(f"the {self.name} backend cannot continue a prefix")

    def last_position_only(self, m: int) -> AbstractContextManager[None]:
        """Within the block, the final norm and the unembedding see only the last of ``m`` new positions
        (where the architecture allows it, see :func:`final_norm_takes_rows`)."""
        if m <= 1 or not final_norm_takes_rows(self.facts.model_type):
            return nullcontext()
        return self.hooks([(hook_names.ln_final_in(), lambda act: act[:, -1:])])  # [n, m, d] -> [n, 1, d]

    # -- components for exact END-position chains ------------------------------------------------
    @property
    @abstractmethod
    def parallel_attn_mlp(self) -> bool:
        """True when the MLP reads the block input (GPT-J/NeoX), not the post-attention stream."""

    @abstractmethod
    def W_O(self, layer: int) -> torch.Tensor:
        """Per-head output projection. # [head, d_head, d_model]"""

    @abstractmethod
    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """MLP(norm2(x)) for residual vectors x. # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm. # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def unembed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W_U # [d_model, vocab], b_U # [vocab] or None)."""

    def answer_logits(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Logit of ``token_ids[i]`` for residual vector ``x[i]`` (only those columns are computed).

        x: [n, d_model], token_ids: [n] -> [n]
        """
        W_U, b_U = self.unembed()
        h = self.final_norm(x)
        out = (h * W_U[:, token_ids].T).sum(-1)
        if b_U is not None:
            out = out + b_U[token_ids]
        return out

    @property
    def device(self) -> torch.device:
        return torch.device(self.facts.device)


#: Rows per call of a component on a CPU: with 1,024 END vectors the MLP's [rows, d_mlp] intermediates stay
#: in cache, about 1.3x faster than a layer's ~10,000 path-patching chains at once (a GPU takes them all).
CPU_COMPONENT_ROWS = 1024


def in_cpu_chunks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``fn`` over the rows of ``x`` [n, d_model], ``CPU_COMPONENT_ROWS`` at a time when it runs on a CPU
    (``device``: where the component's weights are), all at once elsewhere."""
    step = CPU_COMPONENT_ROWS
    if device.type != "cpu" or x.shape[0] <= step:
        return fn(x)
    return torch.cat([fn(x[s:s + step]) for s in range(0, x.shape[0], step)])


def select_rows(cache, rows: torch.Tensor, start: int | None = None):
    """A copy of a Hugging Face KV cache holding the first ``start`` positions (default all) of prompt
    ``rows[i]`` in row i (the original is left as it is)."""
    import copy
    out = copy.deepcopy(cache)
    if start is not None and start < out.get_seq_length():
        out.crop(start - out.get_seq_length())  # a negative count: the tokens to remove
    out.batch_select_indices(rows.to(torch.long))
    return out
