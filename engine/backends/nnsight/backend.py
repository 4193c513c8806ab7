"""The nnsight backend itself: :class:`NnsightBackend`, one traced forward pass per call with the active edits applied
at their sites (:mod:`engine.backends.nnsight.sites`), and the components techniques read (``W_O``, the unembedding,
the MLP and final-norm branches) from the local weights (:mod:`engine.backends.nnsight.offload`) or from NDIF
(:mod:`engine.backends.nnsight.ndif`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

from engine.backends.base import HookFn, ModelBackend, in_cpu_chunks, last_block, select_rows
from engine.backends.hooks import HookName
from engine.backends.layouts import LogitTransform, layout_for
from engine.backends.nnsight.ndif import NdifError, is_remote_failure, remote_backend, scrub, ship_the_lab
from engine.backends.nnsight.offload import execution_device, has_offload, materialized
from engine.backends.nnsight.sites import Site, plan_groups, read_site, site_of, write_site
from engine.models.facts import ModelFacts


class NnsightBackend(ModelBackend):
    """nnsight ``TransformersModel`` behind the lab's narrow interface (local, device-mapped or NDIF)."""

    name = "nnsight"

    def __init__(self, model: Any, tokenizer: Any, facts: ModelFacts, *, remote: bool | str = False,
                 host: str | None = None) -> None:
        self.model = model  # nnsight.modeling.transformers.TransformersModel
        self.tokenizer = tokenizer
        self.facts = facts
        self.layout = layout_for(facts.model_type)
        self.remote = remote
        self.host = host
        config = model._module.config
        self._parallel = self.layout.block.is_parallel(config)
        norm = self.hf_model.get_submodule(self.layout.final_norm)
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-5
        self._norm = ("layer" if isinstance(norm, torch.nn.LayerNorm) else "rms", float(eps))
        self._lock = threading.RLock()
        self._active: list[list[tuple[Site, HookFn]]] = []
        self._weights: dict[str, torch.Tensor] = {}
        self.requests_sent = 0  # remote requests (or forward traces) issued, for tests and benchmarks

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def hf_model(self) -> torch.nn.Module:
        """The wrapped Hugging Face model (meta tensors when remote)."""
        return self.model._module

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.remote is True else torch.device(self.facts.device)

    def _trace_kwargs(self) -> dict[str, Any]:
        if self.remote:
            ship_the_lab()
        if self.remote is True:
            return {"backend": remote_backend(self.model, self.host)}
        if self.remote:
            return {"remote": self.remote}  # "local": nnsight's serialise-deserialise dry run
        return {}

    @contextmanager
    def _remote_errors(self) -> Iterator[None]:
        """A failed NDIF request (server error, no network, bad key) as one NdifError, key never shown."""
        if self.remote is not True:
            yield
            return
        try:
            yield
        except Exception as e:  # noqa: BLE001 - classified below
            if is_remote_failure(e):
                raise NdifError(f"the NDIF request for {self.facts.spec} failed: "
                                f"{scrub(f'{type(e).__name__}: {e}')[:400]}") from None
            raise

    def _inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        from engine.models.load import validate_inputs
        validate_inputs(input_ids, attention_mask, self.facts.vocab_size)
        dev = self.device
        ids = input_ids.to(device=dev, dtype=torch.long)
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask.to(device=dev, dtype=torch.long)}
        return ids, kwargs

    def _sites(self, names: Sequence[HookName]) -> list[Site]:
        return [site_of(n, self.layout, self.facts, self._norm, self._parallel) for n in names]

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 names: Sequence[HookName], past: Any = None, upto: int | None = None) -> dict[str, Any]:
        """One traced forward pass with the active edits; returns {"logits": ..., name: act}.
        ``past``: a KV cache the new positions continue (:meth:`continue_end_logits`).  ``upto``: the last block
        read; the pass stops there (nnsight's ``tracer.stop()`` once the last site it reads or edits has run) and
        returns no logits."""
        reads = self._sites(names)
        edits = [e for block in self._active for e in block]
        plan = plan_groups(reads, edits)
        ids, kwargs = self._inputs(input_ids, attention_mask)
        if past is not None:
            kwargs["past_key_values"] = past
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(ids, **kwargs, **self._trace_kwargs()) as tracer:
                for group in plan:
                    envoy = model.get(group.path)
                    raw = envoy.input if group.attr == "input" else envoy.output
                    changed = False
                    for site, fns, read in group.items:
                        if fns:
                            value = read_site(raw, site)
                            for fn in fns:
                                act = value.clone()
                                out = fn(act)
                                value = act if out is None else out
                            raw = write_site(raw, value, site)
                            changed = True
                        if read:
                            res[site.name] = read_site(raw, site).detach()
                    if changed:
                        if group.attr == "input":
                            envoy.input = raw
                        else:
                            envoy.output = raw
                if upto is None:
                    res["logits"] = model.output.logits
                nnsight_save(res)
                if upto is not None:
                    tracer.stop()  # the rest of the pass does not run
        if upto is None:
            self.meter.record(ids, res["logits"])
        else:
            self.meter.record_upto(ids, upto + 1)
        return res

    # -- ModelBackend ----------------------------------------------------------------------------
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(input_ids, attention_mask, [])["logits"].to(self.device)

    def run_with_cache(self, input_ids, attention_mask, names):
        res = self._forward(input_ids, attention_mask, list(names))
        dev = self.device
        return res["logits"].to(dev), {n: res[str(n)].to(dev) for n in names}

    @property
    def stops_early(self) -> bool:
        return not self.remote  # a remote pass runs whole (one request either way)

    def activations_upto(self, input_ids, attention_mask, names):
        if not self.stops_early:
            return super().activations_upto(input_ids, attention_mask, names)
        asked = list(names)
        res = self._forward(input_ids, attention_mask, asked, upto=last_block(asked))
        dev = self.device
        return {n: res[str(n)].to(dev) for n in asked}

    @contextmanager
    def hooks(self, edits: Sequence[tuple[HookName, HookFn]]) -> Iterator[None]:
        block = [(site_of(n, self.layout, self.facts, self._norm, self._parallel), fn) for n, fn in edits]
        plan_groups([], block)  # refuse read-only sites now, not at the next forward pass
        with self._lock:
            self._active.append(block)
            try:
                yield
            finally:
                self._active.remove(block)

    @property
    def continues(self) -> bool:
        return not self.remote

    def prefix(self, input_ids: torch.Tensor) -> object:
        if self.remote:
            return super().prefix(input_ids)
        ids, _ = self._inputs(input_ids, None)
        with self._lock, torch.no_grad():
            out = self.hf_model(ids, use_cache=True)
        self.meter.record(ids, out.logits)
        return out.past_key_values

    def continue_end_logits(self, prefix, rows, input_ids, *, start=None):
        if self.remote:
            return super().continue_end_logits(prefix, rows, input_ids, start=start)
        with self.last_position_only(input_ids.shape[1]):
            lg = self._forward(input_ids, None, [], past=select_rows(prefix, rows, start))["logits"]
        return lg[:, -1].to(self.device)  # [n, vocab]

    @property
    def parallel_attn_mlp(self) -> bool:
        return self._parallel

    def W_O(self, layer: int) -> torch.Tensor:
        f = self.facts
        w = self._weight(f"{self.layout.layers}.{layer}.{self.layout.o_proj}.weight")
        if not self.layout.conv1d:  # nn.Linear: [d_model, H*d_head]
            w = w.T
        return w.reshape(f.n_heads, f.d_head, f.d_model)

    @property
    def attn_branch_is_identity(self) -> bool:
        return self.layout.block.attn_post_norm is None

    def attn_branch(self, layer: int, a: torch.Tensor) -> torch.Tensor:
        norm = self.layout.block.attn_post_norm
        return a if norm is None else self._apply([f"{self.layout.layers}.{layer}.{norm}"], a)

    def mlp_branch(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        base = f"{self.layout.layers}.{layer}"
        block = self.layout.block
        parts = [block.mlp_pre_norm, self.layout.mlp, block.mlp_post_norm]
        return self._apply([f"{base}.{p}" for p in parts if p], x)

    @property
    def logit_transform(self) -> LogitTransform:
        return self.layout.logits.transform(self.hf_model.config)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply([self.layout.final_norm], x)

    def unembed(self):
        W_U = self._weight(f"{self.layout.lm_head}.weight").T
        b_U = self._weight(f"{self.layout.lm_head}.bias", optional=True)
        if b_U is not None and not bool(b_U.any()):
            b_U = None
        return W_U, b_U

    # -- components ------------------------------------------------------------------------------
    def _weight(self, path: str, optional: bool = False) -> torch.Tensor | None:
        """A parameter by its Hugging Face name, detached, on ``self.device`` (memoised when remote)."""
        if path in self._weights:
            return self._weights[path]
        module_path, _, leaf = path.rpartition(".")
        module = self.hf_model.get_submodule(module_path)
        if getattr(module, leaf, None) is None:
            if optional:
                return None
            raise KeyError(f"the model has no parameter {path}")
        if self.remote is True:
            value = self._remote_weights([path])[path]
        else:
            with materialized(self.hf_model, module_path):
                value = getattr(module, leaf).detach().to(self.device, copy=True)
        if self.remote is True or has_offload(self.hf_model):
            self._weights[path] = value  # a download / a disk read: keep it
        return value

    def _apply(self, paths: list[str], x: torch.Tensor) -> torch.Tensor:
        """x -> module_n(...module_1(x)) for residual vectors x [n, d_model] (shape [n, 1, d] inside)."""
        if self.remote:
            return self._remote_apply(paths, x)

        def apply(rows: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, d_model]
            h = rows[:, None, :]
            for path in paths:
                module = self.hf_model.get_submodule(path)
                with materialized(self.hf_model, path):
                    h = module(h.to(execution_device(self.hf_model, path)))
                h = h[0] if isinstance(h, tuple) else h
            return h[:, 0, :].to(x.device)

        with self._lock:
            return in_cpu_chunks(apply, x, execution_device(self.hf_model, paths[0]))

    def _dummy(self) -> torch.Tensor:
        tok = self.tokenizer
        first = next((t for t in (getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None))
                      if t is not None), 0)
        return torch.tensor([[int(first)]])

    def server_dtype(self) -> str:
        """The dtype the (remote) model's weights are held in, as a DTYPES name (one request when remote)."""
        path = f"{self.layout.lm_head}.weight"
        if self.remote is not True:
            return str(self.hf_model.get_parameter(path).dtype).removeprefix("torch.")
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                res["dtype"] = str(model.get(path).dtype)
                nnsight_save(res)
        return res["dtype"].removeprefix("torch.")

    def _remote_weights(self, paths: list[str]) -> dict[str, torch.Tensor]:
        model = self.model
        res: dict[str, Any] = {}
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                for path in paths:
                    res[path] = model.get(path).detach().to("cpu")
                nnsight_save(res)
        return {k: v.to(self.device) for k, v in res.items()}

    def _remote_apply(self, paths: list[str], x: torch.Tensor) -> torch.Tensor:
        model = self.model
        res: dict[str, Any] = {}
        h0 = x[:, None, :].detach().to("cpu")
        with self._lock:
            self.requests_sent += 1
            with self._remote_errors(), model.trace(self._dummy(), **self._trace_kwargs()):
                h = h0
                for path in paths:
                    module = model.get(path)
                    h = module(h.to(module.device) if module.device is not None else h)
                    h = h[0] if isinstance(h, tuple) else h
                res["out"] = h.detach().to("cpu")
                nnsight_save(res)
        return res["out"][:, 0, :].to(x.device)


def nnsight_save(value: Any) -> Any:
    """``nnsight.save`` (marks a value a trace block returns -- from NDIF too)."""
    import nnsight
    return nnsight.save(value)
