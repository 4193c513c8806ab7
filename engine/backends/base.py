"""The narrow interface every technique and page talks to (cf. llm-transparency-tool's TransparentLlm).

Techniques never touch TransformerBridge (or nnsight) directly: they call a :class:`ModelBackend`,
which offers exactly what the paper's methods need --

* ``logits`` / ``run_with_cache`` / ``hooks`` -- forward passes, cached activations by TransformerLens
  hook name (built with :mod:`engine.backends.hooks`), and interventions in a ``with`` block that always
  removes its hooks (the loaded model is shared by every browser session);
* ``logits_at`` / ``end_logits`` / ``run_with_cache_at`` -- the final norm and the unembedding at chosen positions only
  (the END row of each prompt), never the full ``[batch, pos, vocab]`` tensor: an edit of the final
  norm's input keeps those positions (``hooks.ln_final_in``), so it works on every backend;
* per-layer *components* for exact single-position computations, after the block model of
  :mod:`engine.backends.layouts`: the per-head output projection W_O, the attention branch (a post-attention
  norm and a residual scale, the identity on most models), the MLP branch (its norms and scale included),
  the final norm, the unembedding and the transform a model applies to its logits (a soft cap, a scale).
  The exact END chains (:mod:`engine.machinery.end_chain`) compose these at the END position only.

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


class MissingActivation(KeyError, ValueError):
    """A technique asked for an activation this model (or this backend) does not have: the message says which.

    A ValueError too, so the CLI and the pages report it in one line like any other bad request."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""

BACKENDS: tuple[str, ...] = ("bridge", "nnsight")


@dataclass
class WorkMeter:
    """Work a backend has done, for benchmarks and tests (never used for results).

    ``forward_calls`` counts forward passes; ``body_tokens`` the positions they carried through
    every block (padding included); ``unembed_rows`` the positions that went through the final norm
    and the unembedding (``batch * pos`` for full logits, ``batch`` for END-only logits);
    ``layer_tokens`` positions times blocks of the passes stopped after a block
    (:meth:`ModelBackend.activations_upto`: they count there, not in ``body_tokens``); ``attention_tokens``
    positions through one block's attention only (a block run alone that stopped there).
    """

    forward_calls: int = 0
    body_tokens: int = 0
    unembed_rows: int = 0
    layer_tokens: int = 0
    attention_tokens: int = 0

    def record(self, input_ids: torch.Tensor, logits: torch.Tensor) -> None:
        self.forward_calls += 1
        self.body_tokens += int(input_ids.numel())
        self.unembed_rows += int(logits.shape[:-1].numel())

    def record_upto(self, input_ids: torch.Tensor, blocks: int) -> None:
        """A pass that stopped after its first ``blocks`` blocks (nothing unembedded)."""
        self.forward_calls += 1
        self.layer_tokens += int(input_ids.numel()) * blocks

    def record_block(self, resid: torch.Tensor, attention_only: bool = False) -> None:
        """One block run alone on a residual stream ``resid`` [rows, pos, d_model]
        (:meth:`ModelBackend.block_activations`); ``attention_only``: it stopped in its attention."""
        self.forward_calls += 1
        if attention_only:
            self.attention_tokens += int(resid.shape[0] * resid.shape[1])
        else:
            self.layer_tokens += int(resid.shape[0] * resid.shape[1])


def last_block(names: Sequence[HookName]) -> int:
    """The last block that :meth:`ModelBackend.activations_upto`'s ``names`` lie in; ValueError for none or for a
    name outside the blocks."""
    layers = [hook_names.layer_of(n) for n in names]
    if not layers or None in layers:
        raise ValueError(f"activations_upto reads block activations only, not {list(names)}")
    return max(layers)


@dataclass(frozen=True)
class BlockCalls:
    """How a forward pass of some rows called each block (:meth:`ModelBackend.block_calls`): per layer, the
    arguments besides the residual stream (the attention mask, the positions and their rotary embeddings, ...),
    so that one block can be run again alone on another stream of the same rows, repeated."""

    rows: int  # P: the rows of the pass the calls were taken from
    calls: tuple  # [n_layers] of (positional args after the stream, keyword args, stream given positionally)


class PassStopped(Exception):
    """Raised by a hook to end a forward pass once what it was run for has been read
    (:meth:`ModelBackend.activations_upto`); never leaves the backend."""


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

        if not self.end_rows_ok():  # GPT-2, GPT-J: full logits, then the rows
            lg, cache = self.run_with_cache(input_ids, attention_mask, names)  # [batch, pos, vocab]
            return rows_at(lg), cache
        with self.hooks([(hook_names.ln_final_in(), rows_at)]):
            return self.run_with_cache(input_ids, attention_mask, names)

    def activations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    names: Sequence[HookName]) -> dict[HookName, torch.Tensor]:
        """The named activations of a forward pass whose logits nobody reads: the final norm and the unembedding
        run on one position per row (:meth:`run_with_cache_at`), not on every position.  ``names`` must lie
        before the final norm (a block's activations)."""
        first = torch.zeros(input_ids.shape[0], 1, dtype=torch.long)  # [batch, 1]
        return self.run_with_cache_at(input_ids, attention_mask, names, first)[1]

    @property
    def stops_early(self) -> bool:
        """Whether :meth:`activations_upto` ends its pass after the last block it reads (else: a whole pass)."""
        return False

    def activations_upto(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                         names: Sequence[HookName]) -> dict[HookName, torch.Tensor]:
        """:meth:`activations` of block hooks only, from a pass that may stop after the last block they lie in
        (:attr:`stops_early`; the meter then counts that pass's blocks, :meth:`WorkMeter.record_upto`).  Active
        ``hooks`` apply as in :meth:`activations`; the caller keeps them in those blocks or before them (one of a
        later block would not fire).  This default runs the whole pass."""
        return self.activations(input_ids, attention_mask, names)

    @property
    def runs_one_block(self) -> bool:
        """Whether :meth:`block_activations` can run a block alone on a given residual stream.  A technique that
        uses it checks it first (:mod:`engine.machinery.shortcut`: the blocks chained on X_r's stream must give
        X_r's) and otherwise runs whole passes."""
        return False

    def block_calls(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> BlockCalls:
        """One forward pass of these rows, keeping what each block was called with besides its input stream."""
        raise NotImplementedError(f"{type(self).__name__} does not run a block alone")

    def block_activations(self, calls: BlockCalls, layer: int, resid_pre: torch.Tensor,
                          names: Sequence[HookName], *, stop: bool = False) -> dict[HookName, torch.Tensor]:
        """Block ``layer`` alone on ``resid_pre`` [S * P, pos, d_model] (S repeats of the P rows ``calls`` were
        taken from, repeat-major), active ``hooks`` applied, in the caller's grad mode (a gradient can flow back to
        ``resid_pre``); its ``names`` activations (block ``layer``'s only, detached).  ``stop``: the block ends once
        they are read (the attention's: its MLP is not run).  The meter counts one block of S * P rows, or, stopped
        with attention activations only, its attention (:meth:`WorkMeter.record_block`)."""
        raise NotImplementedError(f"{type(self).__name__} does not run a block alone")

    def end_rows_ok(self) -> bool:
        """Whether the final norm and the unembedding may run on a few positions of each row.

        The table says no for the architectures known to reshape the final norm's output to the input's
        length (GPT-2, GPT-J); any other is checked once when it is opened (:meth:`check_end_rows`)."""
        if not final_norm_takes_rows(self.facts.model_type):
            return False
        return bool(self.__dict__.get("_end_rows", True))

    @torch.no_grad()
    def check_shapes(self) -> None:
        """ModelLoadError unless the activations the techniques read and patch have the shapes of
        :mod:`engine.backends.hooks` on a short batch (a model whose hooks merge positions or heads cannot be
        patched at a position), and unless the model is causal (an encoder's earlier positions see later ones)."""
        from engine.models.spec import ModelLoadError
        f = self.facts
        ids = (torch.arange(10) * 5 + 2).remainder(max(1, f.vocab_size)).reshape(2, 5)  # [2, 5]
        want = {hook_names.resid_pre(0): (2, 5, f.d_model), hook_names.attn_z(0): (2, 5, f.n_heads, f.d_head),
                hook_names.attn_proj_out(0): (2, 5, f.d_model), hook_names.attn_out(0): (2, 5, f.d_model),
                hook_names.mlp_out(0): (2, 5, f.d_model), hook_names.resid_post(0): (2, 5, f.d_model),
                hook_names.attn_pattern(0): (2, f.n_heads, 5, 5)}
        try:
            _, cache = self.run_with_cache(ids, None, list(want))
        except KeyError as e:  # a hook point the adapter declares but the model never reaches
            raise ModelLoadError(f"{e} -- the lab reads every layer's residual stream, heads and MLP, so it cannot "
                                 f"study this architecture exactly") from None
        late = ids.clone()
        late[:, -1] = (late[:, -1] + 1).remainder(max(1, f.vocab_size))  # only the last token differs
        if not torch.allclose(self.logits(late)[:, :-1], self.logits(ids)[:, :-1], rtol=1e-4, atol=1e-5):
            raise ModelLoadError(f"{f.architecture} cannot be studied here: its attention is not causal (a later token "
                                 f"changes the logits of earlier positions) -- the lab reads a causal LM's next-token "
                                 f"prediction at the last position")
        bad = {str(n): tuple(cache[n].shape) for n, shape in want.items() if tuple(cache[n].shape) != shape}
        if bad:
            name, shape = next(iter(bad.items()))
            raise ModelLoadError(f"{f.architecture} cannot be studied exactly here: its activation {name} has shape "
                                 f"{shape} on a [2, 5] batch, not {want[hook_names.HookName(name)]} -- the lab places "
                                 f"its patches by (prompt, position), and this model's layers do not keep them apart")

    @torch.no_grad()
    def check_end_rows(self) -> bool:
        """The END-only logits checked on a short input: the last position's logits computed that way must
        equal a full forward pass's, else (or if the model fails on it) every later call computes full
        logits.  Run once, with no hooks active (``open_model`` does)."""
        if not final_norm_takes_rows(self.facts.model_type):
            return False
        ids = (torch.arange(6) * 7 + 3).remainder(max(1, self.facts.vocab_size))[None]  # [1, 6]
        try:
            want = self.logits(ids)[0, -1].float()
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            from engine.models.spec import ModelLoadError
            raise ModelLoadError(f"{self.facts.architecture} cannot be studied here: the {self.name} backend cannot "
                                 f"run a forward pass of it ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                                 ) from None
        try:  # (a model without a final norm: no hook to cut at, full logits)
            with self.hooks([(hook_names.ln_final_in(), lambda act: act[:, -1:])]):
                got = self.logits(ids)
            ok = got.shape[1] == 1 and bool(torch.allclose(got[0, 0].float(), want, rtol=1e-4,
                                                           atol=1e-5 * float(want.abs().max()) + 1e-6))
        except (RuntimeError, ValueError, IndexError, KeyError):  # no final norm hook, a reshape of its output
            ok = False
        self._end_rows = ok
        return ok

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

    def prefix_with_cache_at(self, input_ids: torch.Tensor, names: Sequence[HookName], positions: torch.Tensor
                             ) -> tuple[object, torch.Tensor, dict[HookName, torch.Tensor]]:
        """(:meth:`prefix` of unpadded prompts [n, T], their last position's logits [n, vocab], the activations
        ``names`` at ``positions`` [n, m] as {name: [n, m, ...]}).  Here two passes; a backend that can read
        activations while it keeps the keys and values does it in one."""
        last = torch.full((input_ids.shape[0], 1), input_ids.shape[1] - 1, dtype=torch.long)
        lg, acts = self.run_with_cache_at(input_ids, None, names, last)  # acts: every position
        rows = torch.arange(input_ids.shape[0])[:, None]
        return self.prefix(input_ids), lg[:, 0], {n: a[rows, positions.to(a.device)] for n, a in acts.items()}

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
        (where the architecture allows it, see :meth:`end_rows_ok`)."""
        if m <= 1 or not self.end_rows_ok():
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
    def attn_branch(self, layer: int, a: torch.Tensor) -> torch.Tensor:
        """The attention's contribution to the residual stream from its module output ``a`` = o_proj(z)
        (:func:`engine.backends.hooks.attn_proj_out`): the post-attention norm and the residual scale where
        the block has them, else ``a`` itself.  # [n, d_model] -> [n, d_model]"""

    @property
    def attn_branch_is_identity(self) -> bool:
        """True when :meth:`attn_branch` returns its input (no post-attention norm, no residual scale)."""
        return False

    @abstractmethod
    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The MLP's contribution to the residual stream for residual vectors x (the stream it reads):
        its pre-norm (if any), the MLP, its post-norm (if any), the residual scale.  # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm. # [n, d_model] -> [n, d_model]"""

    @abstractmethod
    def unembed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W_U # [d_model, vocab], b_U # [vocab] or None)."""

    @property
    @abstractmethod
    def logit_transform(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """What the model does to ``final_norm(x) @ W_U + b_U`` before returning logits (elementwise)."""

    def answer_logits(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Logit of ``token_ids[i]`` for residual vector ``x[i]`` (only those columns are computed).

        x: [n, d_model], token_ids: [n] -> [n]
        """
        W_U, b_U = self.unembed()
        h = self.final_norm(x)
        out = (h * W_U[:, token_ids].T).sum(-1)
        if b_U is not None:
            out = out + b_U[token_ids]
        return self.logit_transform(out)

    def final_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logits the model gives for residual vectors ``x`` as its last stream.  # [n, d_model] -> [n, vocab]"""
        W_U, b_U = self.unembed()
        lg = self.final_norm(x) @ W_U
        if b_U is not None:
            lg = lg + b_U
        return self.logit_transform(lg)

    def components_fail(self) -> str | None:
        """None when the exact components run on this model, else why not: W_O, the attention and MLP branches,
        the final norm and the unembedding are tried once, on a zero vector at layer 0 (a block whose MLP is
        not a module of its own, or that takes the residual as an argument, cannot be run piece by piece)."""
        if "_components_fail" not in self.__dict__:
            f = self.facts
            try:
                W_O = self.W_O(0)
                if tuple(W_O.shape) != (f.n_heads, f.d_head, f.d_model):
                    raise ValueError(f"W_O has shape {tuple(W_O.shape)}, not (heads, d_head, d_model)")
                x = torch.zeros(1, f.d_model, dtype=W_O.dtype, device=self.device)
                for out in (self.attn_branch(0, x), self.mlp_branch(0, x), self.final_norm(x)):
                    if tuple(out.shape) != (1, f.d_model):
                        raise ValueError(f"a component returned shape {tuple(out.shape)}")
                self.unembed()
                self._components_fail = None
            except Exception as e:  # noqa: BLE001 - any failure means: not piece by piece
                self._components_fail = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        return self._components_fail

    @property
    def device(self) -> torch.device:
        return torch.device(self.facts.device)


#: Rows per call of a component on a CPU: with 1,024 END vectors the MLP's [rows, d_mlp] intermediates stay
#: in cache, faster than a layer's ~10,000 path-patching chains at once (docs/benchmarks.md; a GPU takes them all).
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
