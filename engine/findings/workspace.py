"""Workspaces: the whole view saved under a name, reopened, deleted, and handed over as one JSON file.

A workspace is the app state as the dashboard's link holds it (``ui.url_state``: the model, the prompt set,
a written template, the counterfactual kind, the typed prompt, the selected head, the knockout set, each
page's choices), its model's spec and weights fingerprint, and the model's pins and notes
(:mod:`engine.findings.notes`).  It is kept by name in the result cache's file (``cache.annotations``) and
exported as one JSON file of schema :data:`SCHEMA` version :data:`VERSION`::

    {"schema": "arithlab-workspace", "version": 1, "name": "...", "saved_at": "...",
     "model": {"spec": "...", "fingerprint": "..."}, "state": {"ops": "add", "head": "1.3", ...},
     "pins": [{"component": "1.3", "note": "operator mover"}, ...]}

Reading a file (:func:`read_file`) checks all of it before anything changes: a damaged file, another
schema or version, a state that is not text for text: :class:`WorkspaceError` saying what is wrong.  Its model
is found by fingerprint (the model loaded now) or by path (:func:`model_of`); one found by neither is a clear
message, nothing changed.  Importing its pins (:func:`import_pins`) adds them under *their* model's fingerprint
and never replaces a note already kept (nothing lost).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from cache import MAX_NOTE_CHARS, NoteError

SCHEMA = "arithlab-workspace"
VERSION = 1
MAX_FILE_BYTES = 2_000_000
MAX_PINS = 2000


class WorkspaceError(ValueError):
    """A workspace file or name the lab cannot use; the message says why and that nothing was changed."""


@dataclass
class Workspace:
    name: str
    model_spec: str
    fingerprint: str
    state: dict[str, str]
    pins: list[dict[str, str]] = field(default_factory=list)
    saved_at: str = ""

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "name": self.name, "saved_at": self.saved_at,
                "model": {"spec": self.model_spec, "fingerprint": self.fingerprint}, "state": dict(self.state),
                "pins": [dict(p) for p in self.pins]}

    def dumps(self) -> str:
        """The file's text."""
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n"


def make(name: str, model_spec: str, fingerprint: str, state: dict[str, str], cache) -> Workspace:
    """The current view as a workspace: ``state`` (the link's parameters) and the model's pins from ``cache``."""
    pins = [{"component": p.component, "note": p.note} for p in cache.pins(fingerprint)] if cache is not None else []
    return Workspace(name, model_spec, fingerprint, {str(k): str(v) for k, v in state.items()}, pins,
                     datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def from_json(d: object) -> Workspace:
    """A workspace from its parsed JSON, checked whole; WorkspaceError saying what is wrong."""
    def bad(why: str) -> WorkspaceError:
        return WorkspaceError(f"this is not a workspace file the lab can open: {why}. Nothing was changed")
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise bad(f"it has no \"schema\": \"{SCHEMA}\"")
    if d.get("version") != VERSION:
        raise bad(f"it is version {d.get('version')!r} of the format; this lab reads version {VERSION}")
    model, state, pins = d.get("model"), d.get("state"), d.get("pins", [])
    if not isinstance(model, dict) or not all(isinstance(model.get(k), str) and model.get(k)
                                              for k in ("spec", "fingerprint")):
        raise bad("its \"model\" has no spec and fingerprint")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in state.items()):
        raise bad("its \"state\" is not a table of texts")
    if not isinstance(pins, list) or len(pins) > MAX_PINS or not all(
            isinstance(p, dict) and isinstance(p.get("component"), str) and isinstance(p.get("note", ""), str)
            for p in pins):
        raise bad("its \"pins\" are not a list of {component, note}")
    name = d.get("name")
    return Workspace(name if isinstance(name, str) and name.strip() else "imported", model["spec"],
                     model["fingerprint"], dict(state), [{"component": p["component"], "note": p.get("note", "")}
                                                         for p in pins], str(d.get("saved_at", "")))


def read_file(data: bytes | str) -> Workspace:
    """A workspace file's contents (bytes or text) -> Workspace; WorkspaceError for a damaged or foreign file."""
    if isinstance(data, bytes):
        if len(data) > MAX_FILE_BYTES:
            raise WorkspaceError(f"this file is {len(data):,} bytes; a workspace file is at most "
                                 f"{MAX_FILE_BYTES:,}. Nothing was changed")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise WorkspaceError("this file is not text (UTF-8): not a workspace file. Nothing was changed") from None
    try:
        d = json.loads(data)
    except json.JSONDecodeError as e:
        raise WorkspaceError(f"this file is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}): damaged or "
                             f"not a workspace file. Nothing was changed") from None
    return from_json(d)


def model_of(ws: Workspace, loaded_spec: str, loaded_fingerprint: str) -> str:
    """The model spec to open for ``ws``: the loaded one when its fingerprint is the workspace's (found by
    fingerprint), else the workspace's own spec when it is the bundled model, an existing path or a hub id
    (found by path); WorkspaceError when the workspace's model is a path this machine does not have."""
    if ws.fingerprint == loaded_fingerprint:
        return loaded_spec
    spec = ws.model_spec
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") > 1
    if spec != "organism" and looks_like_path and not Path(spec).expanduser().exists():
        raise WorkspaceError(f"this workspace was saved with the model {spec} (weights fingerprint {ws.fingerprint}), "
                             f"which is not on this machine at that path and is not the model loaded now "
                             f"({loaded_spec}): put the model there, or load it in the sidebar, then open the file "
                             f"again. Nothing was changed")
    return spec


def import_pins(ws: Workspace, cache) -> tuple[int, int]:
    """Add the workspace's pins under its model's fingerprint: (added, kept as they were).  A component already
    pinned keeps its note (nothing lost); a pin the store refuses (a bad name, a note over the limit) is skipped."""
    if cache is None:
        return 0, 0
    have = cache.labels(ws.fingerprint)
    added = kept = 0
    for p in ws.pins:
        if p["component"].replace(" ", "") in have:
            kept += 1
            continue
        try:
            cache.pin(ws.fingerprint, p["component"], p["note"][:MAX_NOTE_CHARS + 1])
            added += 1
        except NoteError:
            kept += 1
    return added, kept


def save(ws: Workspace, cache) -> None:
    """Keep ``ws`` under its name in ``cache`` (replacing one of that name); NoteError for a bad name."""
    cache.save_workspace(ws.name, ws.fingerprint, ws.dumps())


def saved(cache) -> list[Workspace]:
    """The saved workspaces, newest first (a stored one that no longer reads is left out)."""
    out = []
    for w in cache.workspaces() if cache is not None else []:
        try:
            out.append(read_file(w.state_json))
        except WorkspaceError:
            continue
    return out


def delete(name: str, cache) -> bool:
    return cache.delete_workspace(name)
