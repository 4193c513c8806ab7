"""Model loading: one entry point, ``load_model(spec)``, for every model the lab studies.

A *spec* names a model in one of four ways (``resolve_spec`` decides which):

* ``"organism"`` (the default) -- the lab's own small Llama in ``<repo>/models/organism/``
  (``python -m engine.organism train`` writes it);
* a local Hugging Face directory (``config.json`` + ``*.safetensors`` + tokenizer files);
* a ``.gguf`` file (transformers dequantizes it to a dense float model; the tokenizer comes from
  the same file) -- e.g. the real SmolLM2-135M-Instruct from ``smollm2_gguf_path()``;
* a hub id ``org/name`` -- only when the Hugging Face hub is reachable (or the model is already in
  the local HF cache while ``HF_HUB_OFFLINE=1``).

Loading is deliberately strict: safetensors only (pickle checkpoints can run code), never
``trust_remote_code``, local paths never touch the network, and every failure is a
``ModelLoadError`` whose message says what is wrong and what to do.

The loaded Hugging Face model is wrapped, weights untouched, in a transformer-lens 4.x
``TransformerBridge`` (``TransformerBridge.boot_transformers(..., hf_model=..., tokenizer=...)``),
which exposes TransformerLens hook names (see ``engine.backends.hooks``) and ``run_with_cache`` /
``run_with_hooks`` / ``hooks()``.  Logits through the bridge equal the plain model's logits.

Tokenization policy: ``LoadedModel.tokenizer`` is the model's own tokenizer, unmodified (it adds
BOS if and only if the checkpoint's tokenizer does), and ``bridge.tokenizer`` is the very same
object.  ``bridge.cfg.default_prepend_bos`` is aligned with it, so ``bridge("text")`` and
``bridge(tokenizer("text").input_ids)`` see the same tokens.  Engine code should build token ids
itself and call ``logits(loaded, input_ids, attention_mask)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:  # transformers / transformer_lens are imported lazily, inside the functions
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.models import DTYPE_NAMES, converted
from engine.models.facts import ModelFacts, facts_from_config
from engine.models.fingerprint import canonical_tensors, weights_fingerprint
from engine.models.placement import DevicePlacement, parse_placement, place
from engine.models.spec import (
    ORGANISM_SPEC,
    ModelLoadError,
    ResolvedSpec,
    SourceKind,
    check_architecture,
    refuse_remote_code,
    resolve_spec,
    unsupported_architecture,
)

DTYPES: dict[str, torch.dtype] = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedModel:
    """A loaded model: the bridge (hooks), the wrapped HF model, its tokenizer, and facts.

    ``bridge`` wraps ``hf_model`` in place: both share the same parameters (train either one),
    but after bridging ``hf_model``'s submodules are bridge components: its ``state_dict()`` keys
    contain ``_original_component``, ``lm_head`` gains a zero ``bias`` buffer, and
    ``hf_model.save_pretrained`` fails -- save with ``save_model(loaded, out_dir)``.
    """

    bridge: "TransformerBridge"
    hf_model: "PreTrainedModel"
    tokenizer: "PreTrainedTokenizerBase"
    facts: ModelFacts



def _parse_dtype(dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name, value
    elif isinstance(dtype, str) and dtype in DTYPES:
        return dtype, DTYPES[dtype]
    raise ModelLoadError(f"unsupported dtype {dtype!r}: dtype must be one of {', '.join(DTYPES)}")



def hub_offline() -> bool:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _from_pretrained_kwargs(resolved: ResolvedSpec) -> dict[str, Any]:
    """Arguments shared by AutoConfig / AutoTokenizer / AutoModel ``from_pretrained`` calls."""
    kwargs: dict[str, Any] = {"trust_remote_code": False}
    if resolved.kind is not SourceKind.HUB or hub_offline():
        kwargs["local_files_only"] = True  # local paths never touch the network
    if resolved.gguf_file is not None:
        kwargs["gguf_file"] = resolved.gguf_file
    return kwargs


def preload() -> None:
    """Resolve transformers' lazily imported classes the loaders use, once, in the calling thread: two sessions
    opening their first model at the same moment resolved them concurrently from their own threads, and one got
    ``ImportError: cannot import name 'AutoConfig' from 'transformers'`` (the dashboard calls this at start)."""
    import transformers
    for name in ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "PreTrainedModel", "PreTrainedTokenizerBase"):
        getattr(transformers, name)


def load_config(resolved: ResolvedSpec) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolved.load_target, **_from_pretrained_kwargs(resolved))
    except Exception as e:  # noqa: BLE001 - every failure becomes a ModelLoadError
        text = str(e)
        if resolved.kind is SourceKind.HUB:
            if hub_offline():
                raise ModelLoadError(
                    f"{resolved.spec!r} looks like a Hugging Face hub id, but no local path of that name "
                    f"exists, the hub is offline (HF_HUB_OFFLINE=1) and the model is not in the local "
                    f"HF cache; download it elsewhere and pass its local directory or .gguf file") from e
            raise ModelLoadError(f"could not fetch the config of hub model {resolved.spec!r} "
                                 f"({type(e).__name__}: {text[:300]}); check the id and the network, or "
                                 f"pass a local directory") from e
        if "does not recognize this architecture" in text or "Unrecognized model" in text \
                or "not supported" in text.lower():
            raise unsupported_architecture(f"transformers cannot read the config at {resolved.location} "
                               f"({text.splitlines()[0][:200] if text else type(e).__name__})") from e
        raise ModelLoadError(f"could not read the model config at {resolved.location} "
                             f"({type(e).__name__}: {text[:300]})") from e
    if getattr(config, "auto_map", None):
        refuse_remote_code({"auto_map": config.auto_map}, resolved.location)
    return config


def load_tokenizer(resolved: ResolvedSpec, **extra: Any) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolved.load_target, **_from_pretrained_kwargs(resolved), **extra)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"could not load the tokenizer from {resolved.location} "
                             f"({type(e).__name__}: {str(e)[:300]}); save it with "
                             f"tokenizer.save_pretrained(model_dir)") from e


def _load_hf_model(resolved: ResolvedSpec, config: Any, torch_dtype: torch.dtype,
                   placement: DevicePlacement | None = None) -> "PreTrainedModel":
    from transformers import AutoModelForCausalLM

    kwargs = _from_pretrained_kwargs(resolved)
    kwargs.update(config=config, dtype=torch_dtype, use_safetensors=True, attn_implementation="eager")
    if placement is not None:
        kwargs.update(placement.from_pretrained_kwargs())
    if resolved.kind is SourceKind.GGUF:
        from transformers import GgufConfig

        # Always a dense float model: with the optional `kernels` package transformers would
        # otherwise keep Q4 blocks packed, which neither the bridge nor fine-tuning can use.
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved.load_target, **kwargs)
    except ImportError as e:  # device_map needs accelerate
        raise ModelLoadError(f"device_map needs the accelerate package ({e}); install the pinned "
                             f"requirements (make setup)") from e
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"could not load the model weights from {resolved.location} "
                             f"({type(e).__name__}: {str(e)[:400]}); the checkpoint may be corrupt, "
                             f"truncated or not match its config.json -- re-download or re-save it") from e
    if resolved.kind is SourceKind.GGUF:
        _drop_gguf_quantizer(model, resolved)
    return model


def _drop_gguf_quantizer(model: "PreTrainedModel", resolved: ResolvedSpec) -> None:
    """A dequantized GGUF model is a plain float model: forget the quantizer bookkeeping.

    Otherwise ``model.is_quantized`` stays True, and Trainer/``.float()``/``save_pretrained``
    treat the dense weights as a quantized checkpoint."""
    bad = sorted({str(p.dtype) for p in model.parameters() if not p.dtype.is_floating_point})
    if bad:
        raise ModelLoadError(f"{resolved.location} was loaded with packed (non-float) weights {bad}; "
                             f"the lab needs a dense model -- this GGUF quantization type cannot be "
                             f"dequantized by transformers")
    model.hf_quantizer = None
    for cfg in (model.config, getattr(model.config, "text_config", None)):
        if cfg is not None and "quantization_config" in cfg.__dict__:
            del cfg.quantization_config


_GGUF_LOCK = threading.Lock()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, one parse of a GGUF file serves the config, the tokenizer and the weights.

    transformers 5.23 builds a new ``gguf.GGUFReader`` for each of the three (each parses every
    metadata field: seconds apiece for a large vocabulary and its merges) and a new
    ``gguf.TensorNameMap`` for every module it maps (hundreds per model: seconds).  Both are read-only once
    built, and transformers imports them from ``gguf`` at call time, so within the block it gets
    memoized ones; the lock keeps two loads from stacking the swap.  Its "Converting and de-quantizing"
    progress bar (tqdm, which transformers' progress-bar switch does not reach) is silenced too: it
    would land in the CLI's stderr and the server log."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with _GGUF_LOCK:
        make_reader, make_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        bar = gguf_utils.tqdm
        gguf_utils.tqdm = functools.partial(bar, disable=True)
        readers: dict[tuple[str, str], Any] = {}

        def reader(path: Any, mode: str = "r") -> Any:
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = make_reader(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(make_name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, make_name_map
            gguf_utils.tqdm = bar


@contextlib.contextmanager
def _tokenizer_used_as_is(tokenizer: "PreTrainedTokenizerBase") -> Iterator[None]:
    """Keep TransformerBridge from swapping the tokenizer.

    ``boot_transformers`` runs ``get_tokenizer_with_bos``, which *reloads* the tokenizer with
    ``AutoTokenizer.from_pretrained(name_or_path, add_bos_token=True)`` unless
    ``init_kwargs['add_bos_token']`` is truthy.  That reload fails for GGUF tokenizers, could
    reach the hub for hub ids, and would silently give the bridge a tokenizer that tokenizes
    differently from ``LoadedModel.tokenizer``.  The flag is only read there, so set it for
    the duration of the boot and restore it afterwards.
    """
    missing = object()
    old = tokenizer.init_kwargs.get("add_bos_token", missing)
    tokenizer.init_kwargs["add_bos_token"] = True
    try:
        yield
    finally:
        if old is missing:
            tokenizer.init_kwargs.pop("add_bos_token", None)
        else:
            tokenizer.init_kwargs["add_bos_token"] = old


def _boot_bridge(resolved: ResolvedSpec, hf_model: "PreTrainedModel",
                 tokenizer: "PreTrainedTokenizerBase", device: torch.device,
                 torch_dtype: torch.dtype) -> "TransformerBridge":
    from transformer_lens.model_bridge import TransformerBridge

    try:
        with _tokenizer_used_as_is(tokenizer):
            bridge = TransformerBridge.boot_transformers(
                resolved.location, hf_model=hf_model, tokenizer=tokenizer, device=str(device),
                dtype=torch_dtype)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"TransformerBridge could not wrap {resolved.location} "
                             f"({type(e).__name__}: {str(e)[:400]})") from e
    if bridge.tokenizer is not tokenizer:  # pragma: no cover - guards a transformer-lens change
        raise ModelLoadError("TransformerBridge replaced the tokenizer; engine/models/load.py needs updating "
                             "for this transformer-lens version")
    bridge.set_use_hook_mlp_in(True)
    # bridge("text") tokenizes exactly like tokenizer("text") (see module docstring)
    bridge.cfg.default_prepend_bos = bool(bridge.cfg.tokenizer_prepends_bos)
    bridge.eval()
    return bridge


def load_model(spec: str = ORGANISM_SPEC, *, device: str | torch.device | None = None,
               dtype: str | torch.dtype = "float32", device_map: str | dict[str, Any] | None = None,
               max_memory: dict[Any, str] | None = None, offload_folder: str | Path | None = None
               ) -> LoadedModel:
    """Load ``spec`` (see ``resolve_spec``) and wrap it in a TransformerBridge.

    ``device`` None picks "cuda" when available, else "cpu"; ``dtype`` is "float32",
    "bfloat16" or "float16".  ``device_map`` ("auto", "balanced", "sequential" or a dict
    module -> device, as in ``from_pretrained``) spreads a model that does not fit one GPU over
    several (accelerate; ``max_memory`` / ``offload_folder`` as there) -- then ``device`` must be
    None, and ``facts.device`` is the device of the input embedding.  The model is in eval mode
    with gradients enabled (fine-tuning works on ``hf_model`` / ``bridge`` directly).  Raises
    ModelLoadError on any failure.
    """
    return bridge_plain(load_plain(spec, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory,
                                   offload_folder=offload_folder))


@dataclasses.dataclass(frozen=True, eq=False)
class PlainModel:
    """A loaded Hugging Face model *without* the TransformerBridge (fine-tuning, nnsight).

    Same checks as ``load_model`` (safetensors only, no remote code, supported architecture);
    ``hf_model.save_pretrained`` works on it.
    """

    hf_model: "PreTrainedModel"
    tokenizer: "PreTrainedTokenizerBase"
    resolved: ResolvedSpec
    architecture: str
    dtype: str
    device: str  # the input embedding's device (the first one of a device_map)

    def facts(self) -> ModelFacts:
        """The same :class:`ModelFacts` ``load_model`` gives for these weights (fingerprint included)."""
        return plain_facts(self)


def load_plain(spec: str = ORGANISM_SPEC, *, device: str | torch.device | None = None,
               dtype: str | torch.dtype = "float32", device_map: str | dict[str, Any] | None = None,
               max_memory: dict[Any, str] | None = None, offload_folder: str | Path | None = None
               ) -> PlainModel:
    """Load ``spec`` as a plain HF causal LM (eval mode, on ``device`` or spread by ``device_map``,
    see ``load_model``); raises ModelLoadError."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # no "Loading weights" bars in the CLI's output or the server log
    dtype_name, torch_dtype = _parse_dtype(dtype)
    placement = parse_placement(device, device_map, max_memory, offload_folder)
    resolved = resolve_spec(spec)
    loaded = None
    if (copy := converted.existing_copy(resolved, dtype_name)) is not None:  # a GGUF opened before: its copy
        try:
            loaded = _load_parts(copy, torch_dtype, placement, converted.tokenizer_kwargs(copy))
        except (ModelLoadError, OSError, ValueError):  # a damaged copy: dropped, the GGUF opened as before
            converted.discard(Path(copy.location))
    if loaded is None:
        with _gguf_parsed_once() if resolved.kind is SourceKind.GGUF else contextlib.nullcontext():
            loaded = _load_parts(resolved, torch_dtype, placement)
        if placement.device_map is None:  # a device_map open reads a copy but never writes one
            converted.keep_copy(resolved, dtype_name, loaded[2], loaded[1])
    architecture, tokenizer, hf_model = loaded
    dev = place(hf_model, placement)
    return PlainModel(hf_model=hf_model, tokenizer=tokenizer, resolved=resolved,
                      architecture=architecture, dtype=dtype_name, device=str(dev))


def _load_parts(resolved: ResolvedSpec, torch_dtype: torch.dtype, placement: DevicePlacement | None,
                tokenizer_kwargs: dict[str, Any] | None = None
                ) -> tuple[str, "PreTrainedTokenizerBase", "PreTrainedModel"]:
    """The architecture, tokenizer and model of ``resolved`` (config first: an unsupported architecture is refused
    before any weight is read)."""
    config = load_config(resolved)  # hub ids while offline: local HF cache only, else a clear error
    architecture = check_architecture(config)
    tokenizer = load_tokenizer(resolved, **(tokenizer_kwargs or {}))
    return architecture, tokenizer, _load_hf_model(resolved, config, torch_dtype, placement)


def bridge_plain(plain: PlainModel) -> LoadedModel:
    """Wrap an already loaded plain model in the TransformerBridge, as ``load_model`` would have.

    The bridge wraps ``plain.hf_model`` in place (see :class:`LoadedModel`): use ``plain`` only
    through the returned LoadedModel afterwards."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    dtype_name, torch_dtype = _parse_dtype(plain.dtype)
    dev = torch.device(plain.device)
    facts = plain_facts(plain)
    bridge = _boot_bridge(plain.resolved, plain.hf_model, plain.tokenizer, dev, torch_dtype)
    return LoadedModel(bridge=bridge, hf_model=plain.hf_model, tokenizer=plain.tokenizer, facts=facts)

def plain_facts(plain: PlainModel) -> ModelFacts:
    """ModelFacts of a plain model: equal to what ``load_model`` reports for the same weights."""
    return model_facts(plain.resolved, plain.architecture, plain.hf_model, plain.dtype, plain.device)


def model_facts(resolved: ResolvedSpec, architecture: str, hf_model: "PreTrainedModel", dtype_name: str,
                device: Any) -> ModelFacts:
    """The facts of a loaded (not yet bridged) HF model: sizes from its config, unique parameters
    (``parameters()`` counts tied weights once), the embedding's row count and the fingerprint."""
    n_params = sum(p.numel() for p in hf_model.parameters())
    return facts_from_config(resolved, architecture, hf_model.config, dtype_name, device, n_params,
                             weights_fingerprint(hf_model),
                             vocab_size=int(hf_model.get_input_embeddings().weight.shape[0]))



def logits(loaded: LoadedModel, input_ids: torch.Tensor,
           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of ``input_ids`` through the bridge.  # [batch, pos, vocab]

    ``input_ids``: integer tensor [batch, pos]; ``attention_mask``: 0/1 tensor [batch, pos] or
    None.  Padding may be on either side: the bridge derives position ids from the mask.  Runs
    in the caller's grad mode (wrap in ``torch.no_grad()`` for inference).
    """
    validate_inputs(input_ids, attention_mask, loaded.facts.vocab_size)
    device = torch.device(loaded.facts.device)
    kwargs: dict[str, Any] = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(device=device, dtype=torch.long)
    return loaded.bridge(input_ids.to(device=device, dtype=torch.long), return_type="logits", **kwargs)


def validate_inputs(input_ids: Any, attention_mask: Any, vocab_size: int) -> None:
    """TypeError / ValueError unless ``input_ids`` is an integer [batch, pos] tensor of token ids in
    ``[0, vocab_size)`` and ``attention_mask`` is None or a tensor of the same shape (every backend)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape [batch, pos], got {tuple(input_ids.shape)}; "
                         f"use input_ids[None] for a single sequence")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(f"input_ids must lie in [0, {vocab_size}), got "
                         f"[{int(input_ids.min())}, {int(input_ids.max())}]")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must be a tensor of shape {tuple(input_ids.shape)}, got "
                             f"{getattr(attention_mask, 'shape', type(attention_mask).__name__)}")



def save_model(loaded: LoadedModel, out_dir: str | Path) -> Path:
    """Save a (possibly fine-tuned) loaded model as a safetensors HF directory ``load_model`` reads.

    Needed because ``loaded.hf_model.save_pretrained(...)`` fails once the bridge has wrapped it
    (bridge aliases show up as shared tensors under ``_original_component`` names).  Saves the
    plain-name weights, the config and the tokenizer; the reloaded model has the same
    fingerprint and logits.  Also turns a slow-to-load GGUF into a fast safetensors directory.
    """
    if not isinstance(loaded, LoadedModel):
        raise TypeError(f"save_model needs a LoadedModel, got {type(loaded).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    canonical_tensors(loaded.hf_model, "", tensors)
    bridge_owned = sorted(k for k in tensors if "<bridge>." in k)
    if bridge_owned:
        raise ValueError(f"the bridge holds processed weights {bridge_owned[:3]} (compatibility mode?); "
                         f"save a model loaded with load_model() without weight processing")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # save_pretrained drops tied duplicates from the dict it is given: pass a copy
    loaded.hf_model.save_pretrained(out, state_dict=dict(tensors), safe_serialization=True)
    loaded.tokenizer.save_pretrained(out)
    return out

