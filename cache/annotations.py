"""Pins and notes, and named workspaces: what a user writes, kept in the result cache's DuckDB file.

Two additive tables (``CREATE TABLE IF NOT EXISTS``: an older cache file gains them on its next write, nothing
migrates, no cached result is touched):

* ``pins`` -- one row per (model fingerprint, component): a pinned head ``3.1``, MLP ``3.mlp``, neuron
  ``3.mlp.120`` or head -> head edge ``1.3->5.5``, with its note (plain text, possibly empty);
* ``workspaces`` -- one row per name: the app state saved under it (JSON) and the fingerprint of its model.

A note is **plain text**: control characters but newlines and tabs are dropped, at most :data:`MAX_NOTE_CHARS`
characters (a longer one is refused with :class:`NoteError` saying so; the notes already kept stay as they
were).  Every reader shows it escaped (HTML in the report, Markdown on the pages): it is never markup.

All functions take an open connection and run inside the caller's transaction (``database.CacheDatabase``);
``ResultCache`` has the methods callers use.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

__all__ = ["MAX_NOTE_CHARS", "MAX_NAME_CHARS", "NoteError", "Pin", "Workspace", "check_component", "check_name",
           "clean_note"]

#: the longest note kept, in characters
MAX_NOTE_CHARS = 1000
#: the longest workspace name
MAX_NAME_CHARS = 80

DDL = (
    """CREATE TABLE IF NOT EXISTS pins (
        model_fingerprint VARCHAR,
        component VARCHAR,
        note VARCHAR,
        updated_at TIMESTAMP
    )""",
    """CREATE TABLE IF NOT EXISTS workspaces (
        name VARCHAR,
        model_fingerprint VARCHAR,
        state_json VARCHAR,
        updated_at TIMESTAMP
    )""",
)

_PART = r"\d{1,4}\.(?:\d{1,4}|mlp(?:\.\d{1,6})?)"
_COMPONENT = re.compile(rf"^{_PART}(?:->{_PART})?$")


class NoteError(ValueError):
    """A note, a component name or a workspace name the store refuses; the message says why and what to do."""


@dataclass(frozen=True)
class Pin:
    component: str      # "3.1", "3.mlp", "3.mlp.120" or "1.3->5.5"
    note: str           # plain text ("" for a pin without a note)
    updated_at: datetime


@dataclass(frozen=True)
class Workspace:
    name: str
    model_fingerprint: str
    state_json: str
    updated_at: datetime


def check_component(component: str) -> str:
    """``component`` stripped, or NoteError: a head ``3.1``, an MLP ``3.mlp``, a neuron ``3.mlp.120`` or an edge
    ``1.3->5.5``."""
    c = (component or "").strip().replace(" ", "")
    if not _COMPONENT.match(c):
        raise NoteError(f"{str(component)[:40]!r} names no component: pin a head (3.1), an MLP (3.mlp), a neuron "
                        f"(3.mlp.120) or an edge (1.3->5.5)")
    return c


def clean_note(note: str | None) -> str:
    """The note as kept: plain text, control characters but newline and tab dropped, ends stripped; NoteError
    when it is longer than :data:`MAX_NOTE_CHARS`."""
    text = "".join(ch for ch in (note or "") if ch in "\n\t" or unicodedata.category(ch)[0] != "C").strip()
    if len(text) > MAX_NOTE_CHARS:
        raise NoteError(f"a note holds at most {MAX_NOTE_CHARS:,} characters; this one has {len(text):,}: shorten "
                        f"it (nothing was saved, the notes already kept are unchanged)")
    return text


def check_name(name: str | None) -> str:
    """A workspace name stripped, or NoteError (empty, too long, or control characters)."""
    n = (name or "").strip()
    if not n:
        raise NoteError("give the workspace a name")
    if len(n) > MAX_NAME_CHARS or any(unicodedata.category(ch)[0] == "C" for ch in n):
        raise NoteError(f"a workspace name is one line of at most {MAX_NAME_CHARS} characters")
    return n


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    for statement in DDL:
        con.execute(statement)


def put_pin(con: duckdb.DuckDBPyConnection, fingerprint: str, component: str, note: str) -> None:
    ensure(con)
    con.execute("DELETE FROM pins WHERE model_fingerprint = ? AND component = ?", [fingerprint, component])
    con.execute("INSERT INTO pins VALUES (?, ?, ?, ?)", [fingerprint, component, note, _now()])


def delete_pin(con: duckdb.DuckDBPyConnection, fingerprint: str, component: str) -> bool:
    ensure(con)
    n = con.execute("SELECT count(*) FROM pins WHERE model_fingerprint = ? AND component = ?",
                    [fingerprint, component]).fetchone()[0]
    con.execute("DELETE FROM pins WHERE model_fingerprint = ? AND component = ?", [fingerprint, component])
    return bool(n)


def fetch_pins(con: duckdb.DuckDBPyConnection, fingerprint: str) -> list[Pin]:
    rows = con.execute("SELECT component, note, updated_at FROM pins WHERE model_fingerprint = ? "
                       "ORDER BY component", [fingerprint]).fetchall()
    return [Pin(c, n or "", _utc(t)) for c, n, t in rows]


def put_workspace(con: duckdb.DuckDBPyConnection, name: str, fingerprint: str, state_json: str) -> None:
    ensure(con)
    con.execute("DELETE FROM workspaces WHERE name = ?", [name])
    con.execute("INSERT INTO workspaces VALUES (?, ?, ?, ?)", [name, fingerprint, state_json, _now()])


def delete_workspace(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    ensure(con)
    n = con.execute("SELECT count(*) FROM workspaces WHERE name = ?", [name]).fetchone()[0]
    con.execute("DELETE FROM workspaces WHERE name = ?", [name])
    return bool(n)


def fetch_workspaces(con: duckdb.DuckDBPyConnection) -> list[Workspace]:
    rows = con.execute("SELECT name, model_fingerprint, state_json, updated_at FROM workspaces "
                       "ORDER BY updated_at DESC, name").fetchall()
    return [Workspace(n, f, s, _utc(t)) for n, f, s, t in rows]
