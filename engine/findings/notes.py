"""Pins and notes on a model's components: "1.3 = operator mover", kept per model (its weights fingerprint).

A pin marks a head (``1.3``), an MLP (``1.mlp``), a neuron (``1.mlp.120``) or a head -> head edge
(``1.3->5.5``) of one model, with a note in plain text (at most ``cache.MAX_NOTE_CHARS`` characters).
They are kept in the result cache's DuckDB file (``cache.annotations``: its own table, so clearing results
by method does not touch them; ``make clean-cache`` deletes the file and them with it), found again by the
model's weights fingerprint whatever path or name it was opened by, and shown on the Path patching heatmap
(the cell outlined, the note in the tooltip), on the Circuit diagram (the node ringed, the note under it), on the
Atlas, in the circuit JSON (a ``label`` on each node), the report, the path-patching CSVs (a ``note`` column, the
page's and the CLI's) and the CLI's ``pins`` command.  The notebook
calls the functions below with the model.
"""

from __future__ import annotations

from cache import NoteError, Pin
from cache.annotations import check_component

__all__ = ["labels", "pin", "pins", "unpin"]


def _cache(cache):
    if cache is None:
        from cache import ResultCache
        return ResultCache()
    return cache


def _check_on(model, component: str) -> str:
    """``component`` named as kept, or NoteError when this model has no such layer, head, neuron or edge order."""
    c = check_component(component)
    f = model.facts
    for part in c.split("->"):
        bits = part.split(".")
        layer = int(bits[0])
        if layer >= f.n_layers:
            raise NoteError(f"the model has layers 0-{f.n_layers - 1}, not {layer} ({c})")
        if bits[1] != "mlp" and int(bits[1]) >= f.n_heads:
            raise NoteError(f"the model has heads 0-{f.n_heads - 1}, not {bits[1]} ({c})")
        if len(bits) == 3 and int(bits[2]) >= f.d_mlp:
            raise NoteError(f"the MLPs have neurons 0-{f.d_mlp - 1}, not {bits[2]} ({c})")
    if "->" in c:
        a, b = c.split("->")
        if "mlp" in c or int(a.split(".")[0]) >= int(b.split(".")[0]):
            raise NoteError(f"an edge runs from a head to a head of a later layer, e.g. 1.3->5.5 (not {c})")
    return c


def pin(model, component: str, note: str = "", cache=None) -> Pin:
    """Pin ``component`` of ``model`` with ``note`` (replacing its note); NoteError, nothing written, for a component
    the model lacks or a note over the limit.  ``cache`` None: the default result cache."""
    return _cache(cache).pin(model.facts.fingerprint, _check_on(model, component), note)


def unpin(model, component: str, cache=None) -> bool:
    """Remove the pin (and note) of ``component``; True when it was pinned."""
    return _cache(cache).unpin(model.facts.fingerprint, check_component(component))


def pins(model, cache=None) -> list[Pin]:
    """Every pin of ``model``, by component."""
    return _cache(cache).pins(model.facts.fingerprint)


def labels(fingerprint: str, cache) -> dict[str, str]:
    """Component -> note of the model with ``fingerprint`` (a pin without a note: "pinned"); {} without a cache or
    when the cache cannot be read (a note is never worth failing a page or a command)."""
    if cache is None:
        return {}
    from cache import CacheError
    try:
        return cache.labels(fingerprint)
    except CacheError:
        return {}
