"""Run a technique through the DuckDB result cache.

Key = sha256 of canonical JSON of (model fingerprint, prompt-set hash, method, params, schema
version) -- see :func:`cache.make_key`.  With ``cache=None`` the computation runs uncached, and the
caller decodes the same rows either way.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from engine.prompts.pairs import PromptPair, prompt_set_hash

Compute = Callable[[], tuple[Iterable[Any], Mapping[str, Any] | None]]


class NotCached(LookupError):
    """Inside :func:`cache_only`: the result is not in the cache (nothing was computed)."""


_CACHE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("cache_only", default=False)


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """Within the block, every cached technique reads the cache and raises :class:`NotCached` on a
    miss instead of computing (summaries of what has already been computed)."""
    token = _CACHE_ONLY.set(True)
    try:
        yield
    finally:
        _CACHE_ONLY.reset(token)


def run_cached(model, pairs: Sequence[PromptPair], method: str, params: Mapping[str, Any], compute: Compute,
               cache=None) -> tuple[list[Any], dict[str, Any], bool]:
    """(rows, artifacts, computed) of ``method`` on ``pairs``, from the cache or ``compute()``."""
    if _CACHE_ONLY.get():
        hit = stored(model, pairs, method, params, cache)
        if hit is None:
            raise NotCached(f"{method} is not in the cache")
        return hit[0], hit[1], False
    if cache is None:
        rows, artifacts = compute()
        return list(rows), dict(artifacts or {}), True
    from cache import make_key
    f = model.facts
    psh = prompt_set_hash(pairs)
    run, computed = cache.get_or_compute(make_key(f.fingerprint, psh, method, params), compute,
                                         model_fingerprint=f.fingerprint, prompt_set_hash=psh, method=method,
                                         params=params)
    return list(run.rows), dict(run.artifacts or {}), computed


def stored(model, pairs: Sequence[PromptPair], method: str, params: Mapping[str, Any], cache
           ) -> tuple[list[Any], dict[str, Any]] | None:
    """(rows, artifacts) of ``method`` on ``pairs`` if the cache holds them, else None (computes nothing)."""
    if cache is None:
        return None
    from cache import make_key
    f = model.facts
    run = cache.get(make_key(f.fingerprint, prompt_set_hash(pairs), method, params))
    return None if run is None else (list(run.rows), dict(run.artifacts or {}))
