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
import enum
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:  # transformers / transformer_lens are imported lazily, inside the functions
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from engine.models import DTYPE_NAMES
from engine.paths import REPO_ROOT

ORGANISM_SPEC = "organism"
ORGANISM_DIR = REPO_ROOT / "models" / "organism"


DTYPES: dict[str, torch.dtype] = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))

_GGUF_MAGIC = b"GGUF"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".json", ".txt", ".zip", ".whl")
_PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# config keys that say how a model was loaded or saved, not what it computes ("architectures" is
# None for GGUF configs and is filled in by save_pretrained, in place, on the live config)
_VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "name_or_path", "dtype", "torch_dtype", "quantization_config", "architectures",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "attn_implementation",
})


class ModelLoadError(RuntimeError):
    """A model spec could not be resolved or loaded; the message says why and what to do."""


class SourceKind(str, enum.Enum):
    """Where a model comes from."""

    ORGANISM = "organism"
    LOCAL_DIR = "local_dir"
    GGUF = "gguf"
    HUB = "hub"


@dataclasses.dataclass(frozen=True)
class ResolvedSpec:
    """A spec turned into something loadable (existence and file type already checked)."""

    spec: str
    kind: SourceKind
    path: Path | None  # model directory, or the .gguf file; None for hub ids
    repo_id: str | None = None  # hub ids only

    @property
    def load_target(self) -> str:
        """First argument for ``from_pretrained``: a directory or a hub id."""
        if self.kind is SourceKind.HUB:
            return str(self.repo_id)
        if self.path is None:
            raise ModelLoadError(f"spec {self.spec!r} of kind {self.kind.value} has no path")
        return str(self.path.parent if self.kind is SourceKind.GGUF else self.path)

    @property
    def gguf_file(self) -> str | None:
        """The ``gguf_file=`` argument for ``from_pretrained`` (GGUF only)."""
        return self.path.name if self.kind is SourceKind.GGUF and self.path is not None else None

    @property
    def location(self) -> str:
        """Human-readable location (path or hub id)."""
        return str(self.repo_id if self.kind is SourceKind.HUB else self.path)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the dashboard and the result cache need to know about a loaded model."""

    spec: str
    source_kind: str  # SourceKind value
    source: str  # resolved path or hub id
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama"
    n_layers: int
    n_heads: int
    n_kv_heads: int  # < n_heads for grouped-query attention
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int  # rows of the embedding matrix (the tokenizer may know fewer tokens)
    dtype: str  # "float32" | "bfloat16" | "float16"
    device: str
    n_params: int  # unique parameters (tied embeddings counted once)
    fingerprint: str  # weights_fingerprint(model), 16 hex chars

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable copy."""
        return dataclasses.asdict(self)


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


# ---------------------------------------------------------------------------------------------
# spec resolution
# ---------------------------------------------------------------------------------------------

def resolve_spec(spec: str = ORGANISM_SPEC) -> ResolvedSpec:
    """Decide what ``spec`` names and check that it exists; raises ModelLoadError otherwise.

    Relative paths are tried against the current directory, then against the repository root.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise ModelLoadError(f"model spec must be a string or path, got {type(spec).__name__}")
    spec_str = os.fspath(spec).strip()
    if not spec_str:
        raise ModelLoadError("empty model spec: pass 'organism', a model directory, a .gguf file "
                             "or a hub id like 'org/name'")
    if spec_str == ORGANISM_SPEC:
        if not ORGANISM_DIR.exists():
            raise ModelLoadError(
                f"the organism model directory {ORGANISM_DIR} does not exist yet: train it with "
                f"`python -m engine.organism train`, or pass another model (a directory, a .gguf "
                f"file or a hub id)")
        _check_model_dir(ORGANISM_DIR)
        return ResolvedSpec(spec_str, SourceKind.ORGANISM, ORGANISM_DIR)

    path = _existing_path(spec_str)
    if path is None:
        if _looks_like_hub_id(spec_str):
            return ResolvedSpec(spec_str, SourceKind.HUB, None, repo_id=spec_str)
        raw = Path(spec_str).expanduser()
        where = "" if raw.is_absolute() else \
            f" (looked in {', '.join(dict.fromkeys(str(d) for d in (Path.cwd(), REPO_ROOT)))})"
        raise ModelLoadError(f"model path {spec_str!r} does not exist{where}; pass an existing model "
                             f"directory or .gguf file")
    if path.is_file():
        _check_gguf_file(path)
        return ResolvedSpec(spec_str, SourceKind.GGUF, path)
    if path.is_dir():
        _check_model_dir(path)
        return ResolvedSpec(spec_str, SourceKind.LOCAL_DIR, path)
    raise ModelLoadError(f"model path {str(path)!r} is neither a file nor a directory")


def _existing_path(spec: str) -> Path | None:
    raw = Path(spec).expanduser()
    candidates = [raw] if raw.is_absolute() else [Path.cwd() / raw, REPO_ROOT / raw]
    for candidate in candidates:
        if candidate.exists():
            return candidate.resolve()
    return None


def _looks_like_hub_id(spec: str) -> bool:
    """``org/name`` that is not meant as a local path (``models/x`` or ``<existing dir>/x`` is a path)."""
    if not _HUB_ID.match(spec) or spec.startswith(".") or ".." in spec \
            or spec.lower().endswith(_FILE_SUFFIXES):
        return False
    first = spec.split("/", 1)[0]
    return first != "models" and not any((base / first).is_dir() for base in (Path.cwd(), REPO_ROOT))


def _check_gguf_file(path: Path) -> None:
    if path.suffix.lower() != ".gguf":
        hint = (" -- it looks like a weights file; pass the directory that holds it"
                if path.suffix.lower() in (".safetensors", ".bin") else "")
        raise ModelLoadError(f"{path} is a file but not a .gguf file{hint}; pass a model directory "
                             f"or a .gguf file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a valid GGUF file (bad magic bytes {magic!r}); "
                             f"the download is corrupt or the file is something else")


def _check_model_dir(path: Path) -> None:
    """Cheap structural checks of a local HF model directory (no weights are read)."""
    config_path = path / "config.json"
    if not config_path.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = (f"; it holds GGUF file(s) {ggufs} -- pass the .gguf file itself" if ggufs
                else "; expected config.json, *.safetensors and tokenizer files (save_pretrained)")
        raise ModelLoadError(f"{path} is not a Hugging Face model directory: no config.json{hint}")
    raw = _read_json(config_path)
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{config_path} does not hold a JSON object")
    _refuse_remote_code(raw, config_path)
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        tok_raw = _read_json(tok_cfg)
        if isinstance(tok_raw, dict):
            _refuse_remote_code(tok_raw, tok_cfg)
    _check_safetensors(path)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the "
                             f"tokenizer next to the model with tokenizer.save_pretrained({str(path)!r})")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); re-save the model") from e


def _refuse_remote_code(raw: dict[str, Any], where: Path | str) -> None:
    if raw.get("auto_map"):
        raise ModelLoadError(
            f"{where} has an auto_map: the model needs custom remote code (trust_remote_code), "
            f"which this lab never runs; use a model whose architecture is built into transformers")


def _check_safetensors(path: Path) -> None:
    shards = sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        index_raw = _read_json(index)
        weight_map = index_raw.get("weight_map", {}) if isinstance(index_raw, dict) else {}
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise ModelLoadError(f"{path} is missing safetensors shard(s) {missing} listed in "
                                 f"{index.name}; re-download or re-save the model")
    if not shards:
        pickles = sorted({p.name for pat in _PICKLE_PATTERNS for p in path.glob(pat)})
        if pickles:
            raise ModelLoadError(
                f"{path} only has pickle weights ({', '.join(pickles)}); pickle checkpoints can run "
                f"arbitrary code, so this lab loads safetensors only. Convert it once, in an "
                f"environment you trust: AutoModelForCausalLM.from_pretrained(dir)"
                f".save_pretrained(dir, safe_serialization=True)")
        raise ModelLoadError(f"{path} has a config.json but no *.safetensors weights; save the model "
                             f"with save_pretrained(..., safe_serialization=True)")
    for shard in shards:
        _check_safetensors_file(shard)


def _check_safetensors_file(path: Path) -> None:
    """Header sanity and size check: catches truncated/corrupt files before loading."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"only {size} bytes")
            header_len = int.from_bytes(head, "little")
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} does not fit in {size} bytes")
            header = json.loads(f.read(header_len))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} is not a valid safetensors file ({e}); it is corrupt or truncated "
                             f"-- re-download or re-save the model") from e
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        raise ModelLoadError(f"{path} is truncated: the header promises {expected} bytes but the file "
                             f"has {size}; re-download or re-save the model")


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def supported_architectures() -> tuple[str, ...]:
    """Causal-LM architectures that both transformers and the TransformerBridge support."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal.update([value] if isinstance(value, str) else value)
    return tuple(sorted(a for a in SUPPORTED_ARCHITECTURES if a in causal))


def _unsupported(what: str) -> ModelLoadError:
    return ModelLoadError(f"unsupported architecture: {what}. Supported causal-LM architectures: "
                          f"{', '.join(supported_architectures())}")


def check_architecture(config: Any) -> str:
    """The TransformerBridge architecture name for ``config``, or ModelLoadError."""
    from transformer_lens.model_bridge.sources.transformers import determine_architecture_from_hf_config

    model_type = getattr(config, "model_type", None)
    declared = getattr(config, "architectures", None) or []
    try:
        arch = determine_architecture_from_hf_config(config)
    except ValueError:
        raise _unsupported(f"model_type {model_type!r} / architectures {declared} is not supported "
                           f"by the transformer-lens TransformerBridge") from None
    if arch not in supported_architectures():
        raise _unsupported(f"{arch} (model_type {model_type!r}) is not a causal language model the "
                           f"TransformerBridge and AutoModelForCausalLM both support")
    return arch


def _parse_dtype(dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    if isinstance(dtype, torch.dtype):
        for name, value in DTYPES.items():
            if value == dtype:
                return name, value
    elif isinstance(dtype, str) and dtype in DTYPES:
        return dtype, DTYPES[dtype]
    raise ModelLoadError(f"unsupported dtype {dtype!r}: dtype must be one of {', '.join(DTYPES)}")


def _parse_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"invalid device {device!r} ({e}); use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available; use device='cpu' "
                             f"or leave device=None to pick automatically")
    return dev


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
            raise _unsupported(f"transformers cannot read the config at {resolved.location} "
                               f"({text.splitlines()[0][:200] if text else type(e).__name__})") from e
        raise ModelLoadError(f"could not read the model config at {resolved.location} "
                             f"({type(e).__name__}: {text[:300]})") from e
    if getattr(config, "auto_map", None):
        _refuse_remote_code({"auto_map": config.auto_map}, resolved.location)
    return config


def load_tokenizer(resolved: ResolvedSpec) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolved.load_target, **_from_pretrained_kwargs(resolved))
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"could not load the tokenizer from {resolved.location} "
                             f"({type(e).__name__}: {str(e)[:300]}); save it with "
                             f"tokenizer.save_pretrained(model_dir)") from e


def _load_hf_model(resolved: ResolvedSpec, config: Any, torch_dtype: torch.dtype,
                   placement: "DevicePlacement | None" = None) -> "PreTrainedModel":
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
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # no "Loading weights" bars in the CLI's output or the server log
    dtype_name, torch_dtype = _parse_dtype(dtype)
    placement = _parse_placement(device, device_map, max_memory, offload_folder)
    resolved = resolve_spec(spec)
    config = load_config(resolved)  # hub ids while offline: local HF cache only, else a clear error
    architecture = check_architecture(config)
    tokenizer = load_tokenizer(resolved)
    hf_model = _load_hf_model(resolved, config, torch_dtype, placement)
    dev = _place(hf_model, placement)
    n_params = sum(p.numel() for p in hf_model.parameters())  # parameters() dedupes tied weights
    bridge = _boot_bridge(resolved, hf_model, tokenizer, dev, torch_dtype)
    facts = _facts(resolved, architecture, bridge, hf_model, dtype_name, dev, n_params)
    return LoadedModel(bridge=bridge, hf_model=hf_model, tokenizer=tokenizer, facts=facts)


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
    hf_logging.disable_progress_bar()
    dtype_name, torch_dtype = _parse_dtype(dtype)
    placement = _parse_placement(device, device_map, max_memory, offload_folder)
    resolved = resolve_spec(spec)
    config = load_config(resolved)
    architecture = check_architecture(config)
    tokenizer = load_tokenizer(resolved)
    hf_model = _load_hf_model(resolved, config, torch_dtype, placement)
    dev = _place(hf_model, placement)
    return PlainModel(hf_model=hf_model, tokenizer=tokenizer, resolved=resolved,
                      architecture=architecture, dtype=dtype_name, device=str(dev))


def bridge_plain(plain: PlainModel) -> LoadedModel:
    """Wrap an already loaded plain model in the TransformerBridge, as ``load_model`` would have.

    The bridge wraps ``plain.hf_model`` in place (see :class:`LoadedModel`): use ``plain`` only
    through the returned LoadedModel afterwards."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    dtype_name, torch_dtype = _parse_dtype(plain.dtype)
    dev = torch.device(plain.device)
    n_params = sum(p.numel() for p in plain.hf_model.parameters())
    bridge = _boot_bridge(plain.resolved, plain.hf_model, plain.tokenizer, dev, torch_dtype)
    facts = _facts(plain.resolved, plain.architecture, bridge, plain.hf_model, dtype_name, dev, n_params)
    return LoadedModel(bridge=bridge, hf_model=plain.hf_model, tokenizer=plain.tokenizer, facts=facts)


@dataclasses.dataclass(frozen=True)
class DevicePlacement:
    """Where the weights go: one ``device``, or accelerate's ``device_map`` (several GPUs, offload)."""

    device: torch.device | None
    device_map: str | dict[str, Any] | None = None
    max_memory: dict[Any, str] | None = None
    offload_folder: str | None = None

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        if self.device_map is None:
            return {}
        kwargs: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory is not None:
            kwargs["max_memory"] = self.max_memory
        if self.offload_folder is not None:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _parse_placement(device: str | torch.device | None, device_map: str | dict[str, Any] | None,
                     max_memory: dict[Any, str] | None, offload_folder: str | Path | None) -> DevicePlacement:
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise ModelLoadError("max_memory / offload_folder only apply together with a device_map")
        return DevicePlacement(_parse_device(device))
    if device is not None:
        raise ModelLoadError(f"pass either device ({device!r}) or device_map, not both: a device_map "
                             f"places every module itself")
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ModelLoadError(f"unknown device_map {device_map!r}: use one of "
                                 f"{', '.join(DEVICE_MAP_STRATEGIES)} or a dict module -> device")
    elif not isinstance(device_map, dict) or not device_map:
        raise ModelLoadError(f"device_map must be a strategy name or a non-empty dict module -> device, "
                             f"got {device_map!r}")
    else:
        for target in device_map.values():
            if str(target) == "meta":
                raise ModelLoadError("device_map target 'meta' holds no weights; use a GPU index, "
                                     "'cpu' or 'disk'")
            if str(target) == "disk" and offload_folder is None:
                raise ModelLoadError("device_map offloads to 'disk': pass offload_folder as well")
            if str(target) not in ("cpu", "disk"):
                _parse_device(target if not isinstance(target, int) else f"cuda:{target}")
    try:
        import accelerate  # noqa: F401
    except ImportError as e:  # pragma: no cover - pinned in requirements.txt
        raise ModelLoadError("device_map needs the accelerate package; run `make setup`") from e
    return DevicePlacement(None, device_map, max_memory,
                           None if offload_folder is None else str(offload_folder))


def _place(hf_model: "PreTrainedModel", placement: DevicePlacement) -> torch.device:
    """Move the model (single device) or leave accelerate's placement; eval mode; its input device."""
    if placement.device is not None:
        hf_model.to(placement.device)
    hf_model.eval()
    return input_device(hf_model)


def input_device(hf_model: "PreTrainedModel") -> torch.device:
    """Where input ids must go: the input embedding's execution device (accelerate-aware)."""
    emb = hf_model.get_input_embeddings()
    hook = getattr(emb, "_hf_hook", None)
    if hook is not None and getattr(hook, "execution_device", None) is not None:
        return torch.device(hook.execution_device)
    device_map = getattr(hf_model, "hf_device_map", None) or {}
    for name, target in device_map.items():  # hooks sit on the map's modules, maybe above the embedding
        if str(target) not in ("disk", "meta"):
            mod = hf_model.get_submodule(name) if name else hf_model
            if any(m is emb for m in mod.modules()):
                return torch.device(f"cuda:{target}" if isinstance(target, int) else str(target))
    for p in emb.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def plain_facts(plain: PlainModel) -> ModelFacts:
    """ModelFacts read from the Hugging Face config (no bridge): equal to what ``load_model`` reports."""
    hf_model = plain.hf_model
    n_params = sum(p.numel() for p in hf_model.parameters())
    return facts_from_config(plain.resolved, plain.architecture, hf_model.config, plain.dtype, plain.device,
                             n_params, weights_fingerprint(hf_model),
                             vocab_size=int(hf_model.get_input_embeddings().weight.shape[0]))


def facts_from_config(resolved: ResolvedSpec, architecture: str, config: Any, dtype_name: str, device: Any,
                      n_params: int, fingerprint: str, vocab_size: int | None = None) -> ModelFacts:
    """ModelFacts from a Hugging Face config alone (also for models whose weights are remote)."""
    cfg = getattr(config, "text_config", None) or config

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            value = getattr(cfg, name, None)
            if value is not None:
                return value
        return default

    d_model = int(first("hidden_size", "n_embd", "d_model"))
    n_heads = int(first("num_attention_heads", "n_head", "num_heads"))
    n_kv = int(first("num_key_value_heads", "num_kv_heads", default=n_heads))
    d_head = int(first("head_dim", default=d_model // n_heads))
    d_mlp = int(first("intermediate_size", "n_inner", "ffn_dim", default=4 * d_model))
    return ModelFacts(
        spec=resolved.spec,
        source_kind=resolved.kind.value,
        source=resolved.location,
        architecture=architecture,
        model_type=str(getattr(config, "model_type", "")),
        n_layers=int(first("num_hidden_layers", "n_layer", "num_layers")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_model=d_model,
        d_head=d_head,
        d_mlp=d_mlp,
        vocab_size=int(vocab_size if vocab_size is not None else first("vocab_size")),
        dtype=dtype_name,
        device=str(device),
        n_params=int(n_params),
        fingerprint=fingerprint,
    )


def _facts(resolved: ResolvedSpec, architecture: str, bridge: "TransformerBridge",
           hf_model: "PreTrainedModel", dtype_name: str, device: torch.device,
           n_params: int) -> ModelFacts:
    cfg = bridge.cfg
    n_heads = int(cfg.n_heads)
    n_kv = getattr(cfg, "n_key_value_heads", None)
    return ModelFacts(
        spec=resolved.spec,
        source_kind=resolved.kind.value,
        source=resolved.location,
        architecture=architecture,
        model_type=str(getattr(hf_model.config, "model_type", "")),
        n_layers=int(cfg.n_layers),
        n_heads=n_heads,
        n_kv_heads=int(n_kv) if n_kv else n_heads,
        d_model=int(cfg.d_model),
        d_head=int(cfg.d_head),
        d_mlp=int(cfg.d_mlp) if cfg.d_mlp is not None else 0,
        vocab_size=int(cfg.d_vocab),
        dtype=dtype_name,
        device=str(device),
        n_params=int(n_params),
        fingerprint=weights_fingerprint(hf_model),
    )


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# fingerprint
# ---------------------------------------------------------------------------------------------

def _is_bridge_wrapper(module: torch.nn.Module) -> bool:
    return "_original_component" in module._modules and type(module).__module__.startswith(
        "transformer_lens.")


def _canonical_tensors(module: torch.nn.Module, prefix: str, out: dict[str, torch.Tensor]) -> None:
    """Parameters and persistent buffers under their plain Hugging Face names.

    TransformerBridge wraps submodules (``layer._original_component.self_attn...``) and adds
    alias children (``self_attn.q`` for ``q_proj``); following only ``_original_component``
    through wrappers gives exactly the names of the un-bridged model.  The bridge also registers
    a persistent all-zero ``bias`` *buffer* on a bias-free ``lm_head``; an all-zero Linear bias
    buffer computes nothing, so it is left out (a non-zero one is hashed)."""
    if _is_bridge_wrapper(module):
        for name, p in module._parameters.items():  # weights a wrapper owns itself (none by default)
            if p is not None:
                out[f"{prefix}<bridge>.{name}"] = p
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                out[f"{prefix}<bridge>.{name}"] = b
        _canonical_tensors(module._modules["_original_component"], prefix, out)
        return
    for name, p in module._parameters.items():
        if p is not None:
            out[prefix + name] = p
    for name, b in module._buffers.items():
        if b is None or name in module._non_persistent_buffers_set:
            continue
        if name == "bias" and isinstance(module, torch.nn.Linear) and not bool(b.any()):
            continue  # the bridge's synthetic zero unembedding bias: same function as no bias
        out[prefix + name] = b
    for name, child in module._modules.items():
        if child is not None:
            _canonical_tensors(child, f"{prefix}{name}.", out)


def canonical_config_json(config: Any) -> str:
    def clean(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items()
                    if not str(k).startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    data = config.to_dict() if hasattr(config, "to_dict") else {}
    return json.dumps(clean(data), sort_keys=True, separators=(",", ":"), default=str)


def weights_fingerprint(model: Any, *, length: int = 16) -> str:
    """sha256 (hex, first ``length`` chars) of every parameter and persistent buffer plus the config.

    ``model``: a LoadedModel, a TransformerBridge or a (bridged or plain) HF model -- a model
    and its bridged self give the same fingerprint.  Tensors are hashed in name order as
    (name, dtype, shape, raw bytes); tied tensors are hashed once and recorded as aliases.  Any
    change to any weight element changes the fingerprint.
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 64:
        raise ValueError(f"length must be an int in 1..64, got {length!r}")
    if isinstance(model, LoadedModel):
        model = model.hf_model
    bridge_mod = sys.modules.get("transformer_lens.model_bridge")
    if bridge_mod is not None and isinstance(model, bridge_mod.TransformerBridge):
        model = model.original_model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weights_fingerprint needs a LoadedModel, TransformerBridge or nn.Module, "
                        f"got {type(model).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    _canonical_tensors(model, "", tensors)
    offloaded = _offloaded_owners(model)
    h = hashlib.sha256()
    h.update(b"arith-lab-fingerprint-v1\0")
    h.update(canonical_config_json(getattr(model, "config", None)).encode())
    seen: dict[tuple[Any, ...], str] = {}
    with torch.no_grad(), _OffloadReader(offloaded) as reader:
        for name in sorted(tensors):
            t = tensors[name].detach()
            if t.device.type == "meta":  # accelerate offload (device_map with "cpu"/"disk" targets)
                key: tuple[Any, ...] = ("meta", id(tensors[name]))  # tied weights are one Parameter
            else:
                key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                       t.stride(), t.dtype)
            h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
            if key in seen:
                h.update(f"alias-of\0{seen[key]}".encode())
                continue
            seen[key] = name
            if t.device.type == "meta":
                t = reader.value(name)
            flat = t.to("cpu").contiguous().reshape(-1)
            if flat.numel():
                h.update(flat.view(torch.uint8).numpy())  # raw bytes; bf16 etc. are viewed, not cast
    return h.hexdigest()[:length]


def _offloaded_owners(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Canonical name prefix -> module whose accelerate hook holds offloaded weights (none usually)."""
    modules: dict[str, torch.nn.Module] = {}
    _canonical_modules(model, "", modules)
    if not any(getattr(m, "_hf_hook", None) is not None for m in modules.values()):
        return {}
    from accelerate.utils import has_offloaded_params
    return {prefix: m for prefix, m in modules.items() if has_offloaded_params(m)}


def _canonical_modules(module: torch.nn.Module, prefix: str, out: dict[str, torch.nn.Module]) -> None:
    """Modules under their plain Hugging Face name prefixes (bridge wrappers skipped, as in
    ``_canonical_tensors``)."""
    if _is_bridge_wrapper(module):
        _canonical_modules(module._modules["_original_component"], prefix, out)
        return
    out[prefix] = module
    for name, child in module._modules.items():
        if child is not None:
            _canonical_modules(child, f"{prefix}{name}.", out)


class _OffloadReader:
    """Reads offloaded (meta) weights by materializing their owner module on the CPU, one at a time."""

    def __init__(self, owners: dict[str, torch.nn.Module]) -> None:
        self.owners = owners
        self._open: tuple[str, Any, dict[str, torch.Tensor]] | None = None

    def __enter__(self) -> "_OffloadReader":
        return self

    def value(self, name: str) -> torch.Tensor:
        prefix = max((p for p in self.owners if name.startswith(p)), key=len, default=None)
        if prefix is None:
            raise ValueError(f"weight {name} is on the meta device and no accelerate hook holds it; "
                             f"the model has no data to fingerprint")
        if self._open is None or self._open[0] != prefix:
            self._close()
            from accelerate.utils import align_module_device
            ctx = align_module_device(self.owners[prefix], torch.device("cpu"))
            ctx.__enter__()
            real: dict[str, torch.Tensor] = {}
            self._open = (prefix, ctx, real)
            _canonical_tensors(self.owners[prefix], prefix, real)
        return self._open[2][name].detach()

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].__exit__(None, None, None)
            self._open = None

    def __exit__(self, *exc: Any) -> None:
        self._close()


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
    _canonical_tensors(loaded.hf_model, "", tensors)
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


# ---------------------------------------------------------------------------------------------
# the real model: SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI
# ---------------------------------------------------------------------------------------------
