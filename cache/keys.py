"""Canonical JSON and content-addressed cache keys.

A cache key is the sha256 hex digest of the canonical JSON of exactly::

    {"method": ..., "model_fingerprint": ..., "params": {...},
     "prompt_set_hash": ..., "schema_version": ...}

Canonical JSON = ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=True)`` over plain JSON values only.  Anything that has no
single JSON spelling (NaN/inf, non-str dict keys, sets, numpy scalars,
arbitrary objects) is rejected with an error naming the offending value and
where it sits, instead of being silently coerced into a colliding key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from . import schema as _schema

__all__ = ["JSONValue", "canonical_json", "hash_prompt_set", "make_key", "require_str", "sha256_hex"]

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None


def _to_plain(obj: object, where: str, active: set[int]) -> JSONValue:
    """Validate *obj* and convert Mappings/tuples to dicts/lists."""
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(
                f"canonical_json: non-finite float {obj!r} at {where} is not allowed "
                "(NaN and infinity have no JSON representation)"
            )
        return float(obj)
    if isinstance(obj, (Mapping, list, tuple)):
        if id(obj) in active:
            raise ValueError(f"canonical_json: circular reference at {where}")
        active.add(id(obj))
        try:
            if isinstance(obj, Mapping):
                out: dict[str, JSONValue] = {}
                for key, value in obj.items():
                    if not isinstance(key, str):
                        raise TypeError(
                            f"canonical_json: dict key {key!r} of type {type(key).__name__} at "
                            f"{where} is not allowed (keys must be str)"
                        )
                    out[key] = _to_plain(value, f"{where}[{key!r}]", active)
                return out
            return [_to_plain(value, f"{where}[{i}]", active) for i, value in enumerate(obj)]
        finally:
            active.discard(id(obj))
    raise TypeError(
        f"canonical_json: value {obj!r:.80} of type {type(obj).__module__}.{type(obj).__qualname__} "
        f"at {where} is not JSON-serializable (allowed: None, bool, int, finite float, str, "
        "list/tuple, dict with str keys)"
    )


def canonical_json(obj: object) -> str:
    """Deterministic ASCII JSON text of *obj* (sorted keys, no whitespace).

    Raises:
        ValueError: NaN/infinite floats or circular references.
        TypeError: non-JSON types or non-str dict keys.
    """
    plain = _to_plain(obj, "$", set())
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sha256_hex(text: str) -> str:
    """sha256 hex digest of the UTF-8 encoding of *text*."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def require_str(name: str, value: object) -> str:
    """*value* if it is a non-empty str, else ``TypeError``/``ValueError`` naming *name*."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    return value


def make_key(
    model_fingerprint: str,
    prompt_set_hash: str,
    method: str,
    params: Mapping[str, Any],
    schema_version: int | None = None,
) -> str:
    """Cache key (64 hex chars) of one computation.

    Dict ordering inside *params* is irrelevant; any change of a value,
    the method, the model, the prompts or the schema version changes the key.
    """
    require_str("model_fingerprint", model_fingerprint)
    require_str("prompt_set_hash", prompt_set_hash)
    require_str("method", method)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a Mapping, not {type(params).__name__}")
    if schema_version is None:  # read now, not at import: a version bump takes effect everywhere
        schema_version = _schema.SCHEMA_VERSION
    if isinstance(schema_version, bool) or not isinstance(schema_version, int):
        raise TypeError(f"schema_version must be int, not {type(schema_version).__name__}")
    payload = {
        "model_fingerprint": model_fingerprint,
        "prompt_set_hash": prompt_set_hash,
        "method": method,
        "params": params,
        "schema_version": schema_version,
    }
    return sha256_hex(canonical_json(payload))


def hash_prompt_set(items: Iterable[Mapping[str, Any]]) -> str:
    """sha256 hex of the canonical JSON list of *items* (order matters)."""
    if isinstance(items, (Mapping, str, bytes)):
        raise TypeError(f"items must be an iterable of Mappings, not a single {type(items).__name__}")
    materialised: list[Mapping[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TypeError(f"prompt set item {i} must be a Mapping, not {type(item).__name__}")
        materialised.append(item)
    return sha256_hex(canonical_json(materialised))
