"""Model specs: what a spec names (``resolve_spec``) and the safety checks done before any weight is read.

A *spec* names a model in one of four ways:

* ``"organism"`` (the default) -- the lab's own small Llama in ``<repo>/models/organism/``
  (``python -m engine.organism train`` writes it);
* a local Hugging Face directory (``config.json`` + ``*.safetensors`` + tokenizer files);
* a ``.gguf`` file (transformers dequantizes it to a dense float model; the tokenizer comes from
  the same file);
* a hub id ``org/name`` -- only when the Hugging Face hub is reachable (or the model is already in
  the local HF cache while ``HF_HUB_OFFLINE=1``).

Checks are deliberately strict: safetensors only (pickle checkpoints can run code), never
``trust_remote_code`` (an ``auto_map`` is refused), truncated or corrupt files are caught from their
headers, and the architecture must be one both transformers and the TransformerBridge support.
Every failure is a :class:`ModelLoadError` whose message says what is wrong and what to do.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from pathlib import Path
from typing import Any

from engine.paths import REPO_ROOT

ORGANISM_SPEC = "organism"
ORGANISM_DIR = REPO_ROOT / "models" / "organism"
_GGUF_MAGIC = b"GGUF"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".json", ".txt", ".zip", ".whl")
_PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


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
    refuse_remote_code(raw, config_path)
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        tok_raw = _read_json(tok_cfg)
        if isinstance(tok_raw, dict):
            refuse_remote_code(tok_raw, tok_cfg)
    _check_safetensors(path)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); save the "
                             f"tokenizer next to the model with tokenizer.save_pretrained({str(path)!r})")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); re-save the model") from e


def refuse_remote_code(raw: dict[str, Any], where: Path | str) -> None:
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


#: architectures the TransformerBridge opens but whose blocks hold a mixer beside attention and MLP: the
#: lab's components (heads, MLPs) would not account for the residual stream, so it refuses them up front
NOT_STUDIED: dict[str, str] = {
    "FalconH1ForCausalLM": "every block adds a Mamba-2 mixer in parallel with attention",
}


def supported_architectures() -> tuple[str, ...]:
    """Causal-LM architectures that both transformers and the TransformerBridge support (less NOT_STUDIED)."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal.update([value] if isinstance(value, str) else value)
    return tuple(sorted(a for a in SUPPORTED_ARCHITECTURES if a in causal and a not in NOT_STUDIED))


def unsupported_architecture(what: str) -> ModelLoadError:
    """The error for an architecture the lab cannot study, listing those it can."""
    return ModelLoadError(f"unsupported architecture: {what}. Supported causal-LM architectures: "
                          f"{', '.join(supported_architectures())}")


def causal_lm_class(model_type: str | None) -> str | None:
    """The causal-LM class transformers builds for ``model_type`` (``gemma3_text`` -> ``Gemma3ForCausalLM``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(model_type)) if model_type else None
    return name if isinstance(name, str) else None


def check_architecture(config: Any) -> str:
    """The TransformerBridge architecture name for ``config``, or ModelLoadError.

    A config without ``architectures`` (a GGUF file's, some saved configs) is given the causal-LM class of
    its ``model_type`` first, so it is judged by the same table as any other."""
    from transformer_lens.model_bridge.sources.transformers import determine_architecture_from_hf_config

    model_type = getattr(config, "model_type", None)
    if not getattr(config, "architectures", None) and causal_lm_class(model_type):
        config.architectures = [causal_lm_class(model_type)]
    declared = getattr(config, "architectures", None) or []
    try:
        arch = determine_architecture_from_hf_config(config)
    except ValueError:
        raise unsupported_architecture(f"model_type {model_type!r} / architectures {declared} is not supported "
                           f"by the transformer-lens TransformerBridge") from None
    if arch in NOT_STUDIED:
        raise ModelLoadError(f"{arch} cannot be studied exactly here: {NOT_STUDIED[arch]} -- the lab patches "
                             f"attention heads and MLPs, and they do not make up this model's residual stream")
    if arch not in supported_architectures():
        raise unsupported_architecture(f"{arch} (model_type {model_type!r}) is not a causal language model the "
                           f"TransformerBridge and AutoModelForCausalLM both support")
    return arch

