"""One app state that follows the user across pages and reruns.

Streamlit drops the state of a keyed widget at the end of every run in which the widget is not
shown, so a value kept only under a widget key is lost as soon as another page is opened.  The app's
own entries below are never widget keys; each widget that edits one is *bound* to it: the widget is
seeded from the app entry when it (re)appears, and its ``on_change`` writes back.

* ``prompt``          -- the typed prompt every page analyses (widget ``typed_prompt``, Prompt lab);
* ``prompt_set``      -- the sidebar's prompt set (``ui.session.prompt_set_choice``; a dict, see
  :func:`default_prompt_set`; ``template``: a template the user wrote, ``op:text``, see :func:`use_template`);
* ``model_choice``    -- the sidebar's model (``ui.session.model_choice``; a :class:`ModelChoice`);
* ``selected_head``   -- the selected component, ``(layer, head)``; ``head == -1`` is the layer's MLP;
* ``ko_heads`` / ``ko_mlps`` -- the knockout set (widgets ``knockout_heads`` / ``knockout_mlps``).

The selection and the knockout set belong to one model: when the model changes they are cleared and
a note says so (:func:`follow_model`), so one model's heads are never applied to another.

The address bar mirrors these entries (``ui.url_state``), so that a page's URL is a shareable link: the
first run of a session (the router's) reads the link's query parameters (``model=``/``device=``/``dtype=``/
``backend=``, ``ops=``/``families=``/``n=``/``seed=``/``balance=``, ``prompt=``, ``head=3.1`` or
``head=4.mlp``, ``ko=3.1,5.0``, ``ko_mlp=4``, and each page's controls: ``ui.url_state.CHOICES``, e.g. the
Story's ``story_step`` and ``story_large``) into the entries above; from then on the entries are the source
of truth, and every run writes their non-default values into the URL and removes the keys at their default.
A link's selection and knockouts belong to the link's model (:func:`adopt`), so :func:`follow_model` keeps
them; they are checked against that model's layers and heads once it is loaded, and each bad value is
dropped with a note that names the parameter (the rest of the link is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import streamlit as st

from engine.backends.base import BACKENDS

DEFAULT_PROMPT = "The sum of 3 and 5 is"
PROMPT = "prompt"
SELECTED = "selected_head"
KO_HEADS = "ko_heads"
KO_MLPS = "ko_mlps"
OWNER = "picks_model"     # the model spec the selection and the knockout set belong to
NOTE = "model_note"       # the note shown after a model change cleared them
MLP = -1                  # ``head`` of a selected MLP

MULTI_GPU = "all GPUs"  # device choice: accelerate's device_map="auto" over every visible GPU
DEVICES = ("auto", "cpu", "cuda", MULTI_GPU)
BACKEND_LABELS = {"bridge": "TransformerBridge (transformer-lens)", "nnsight": "nnsight (plain HF model)"}
BACKEND_CHOICES = {b: BACKEND_LABELS.get(b, b) for b in BACKENDS}  # the engine's list, in its order
FAMILY_CHOICES = {"paper (Fig. 8, 32 templates)": "paper", "word problems (Fig. 10)": "word",
                  "all (paper, word, extended, power)": "all",
                  "notation (untaught: 7 × 8 =)": "notation"}


@dataclass(frozen=True)
class ModelChoice:
    """The ``model_choice`` entry."""
    spec: str = "organism"
    device: str = "auto"
    dtype: str = "float32"
    backend: str = "bridge"
    remote: bool = False  # nnsight only: run on NDIF with $NDIF_API_KEY


#: The sidebar's label of a template written by the user (``prompt_set["template"]``, ``op:text``).
CUSTOM_PREFIX = "yours: "


def template_label(param: str) -> str:
    """``add:{A} [plus] {B} is`` -> ``yours: {A} [plus] {B} is (add)``."""
    op, _, text = param.partition(":")
    return f"{CUSTOM_PREFIX}{text} ({op})"


def use_template(param: str) -> None:
    """Make the written template ``param`` (``op:text``, checked) the prompt set of every page (from a callback)."""
    cur = dict(st.session_state.get("prompt_set") or default_prompt_set())
    cur.update(template=param, families=template_label(param), ops=[param.split(":", 1)[0]])
    st.session_state["prompt_set"] = cur  # the sidebar's boxes show it from the next run on


def use_digit(digit: str) -> None:
    """Make ``digit`` (first / last / k) the answer digit of every page's prompt set, the sidebar's box showing it
    (from a callback)."""
    cur = dict(st.session_state.get("prompt_set") or default_prompt_set())
    cur["digit"] = digit
    st.session_state["prompt_set"] = cur
    st.session_state["ps_digit"] = digit


def default_prompt_set() -> dict:
    """The ``prompt_set`` entry before the user picks a set: ops, families (a ``FAMILY_CHOICES`` label), n, seed
    (and ``balance``, True when absent)."""
    from engine.prompts.templates import PAPER_OPS
    return {"ops": list(PAPER_OPS), "families": "paper (Fig. 8, 32 templates)", "n": 40, "seed": 0}


def get(key: str, default: Any = None) -> Any:
    return st.session_state.get(key, default)


def put(key: str, value: Any) -> None:
    st.session_state[key] = value


def prompt() -> str:
    return st.session_state.get(PROMPT, DEFAULT_PROMPT)


def selected() -> tuple[int, int] | None:
    sel = st.session_state.get(SELECTED)
    return (int(sel[0]), int(sel[1])) if sel else None


def select(layer: int, head: int) -> None:
    """Select a head (``head >= 0``) or the MLP of ``layer`` (``head == MLP``)."""
    st.session_state[SELECTED] = (int(layer), int(head))


def ko_heads() -> list[str]:
    return list(st.session_state.get(KO_HEADS, []))


def ko_mlps() -> list[int]:
    return list(st.session_state.get(KO_MLPS, []))


def set_knockout(heads: list[str] | None = None, mlps: list[int] | None = None) -> None:
    """Set the knockout set (the app entries and, when shown, their widgets)."""
    st.session_state.pop(NOTE, None)
    if heads is not None:
        st.session_state[KO_HEADS] = sorted(set(heads), key=_head_order)
        st.session_state["knockout_heads"] = st.session_state[KO_HEADS]
    if mlps is not None:
        st.session_state[KO_MLPS] = sorted(set(int(m) for m in mlps))
        st.session_state["knockout_mlps"] = st.session_state[KO_MLPS]


def add_knockout_head(layer: int, head: int) -> None:
    set_knockout(heads=ko_heads() + [f"{layer}.{head}"])


def _head_order(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split("."))


def bind(widget_key: str, app_key: str, default: Any, to_app: Callable[[Any], Any] = lambda v: v) -> dict:
    """Keyword arguments for a widget bound to an app entry: seed the widget from the app entry when it
    appears (``st.session_state[widget_key]``, no ``value=``/``default=``), write back on change."""
    if widget_key not in st.session_state:
        st.session_state[widget_key] = st.session_state.get(app_key, default)

    def write_back() -> None:
        st.session_state[app_key] = to_app(st.session_state[widget_key])
        if app_key in (KO_HEADS, KO_MLPS):
            st.session_state.pop(NOTE, None)

    return {"key": widget_key, "on_change": write_back}


def follow_model(spec: str) -> None:
    """Clear the model-dependent picks (selection, knockout set) when the model is not the one they were
    made on, leaving a note (:func:`model_note`) that says what was cleared."""
    owner = st.session_state.get(OWNER)
    st.session_state[OWNER] = spec
    if owner is None or owner == spec:
        return
    cleared = []
    if ko_heads():
        cleared.append(f"knockout heads {', '.join(ko_heads())}")
    if ko_mlps():
        cleared.append(f"knockout MLPs {', '.join(map(str, ko_mlps()))}")
    sel = selected()
    if sel:
        cleared.append(f"selected {'MLP ' + str(sel[0]) if sel[1] == MLP else 'head ' + '.'.join(map(str, sel))}")
    for key in (KO_HEADS, KO_MLPS, SELECTED, "knockout_heads", "knockout_mlps"):
        st.session_state.pop(key, None)
    if cleared:
        st.session_state[NOTE] = (f"The model changed from `{owner}` to `{spec}`: cleared the {'; '.join(cleared)} "
                                  f"(they were picked on `{owner}` and do not apply to `{spec}`).")


def adopt(spec: str) -> None:
    """The selection and the knockout set now belong to model ``spec`` (a link's picks, made on its model)."""
    st.session_state[OWNER] = spec


def model_note() -> str | None:
    return st.session_state.get(NOTE)
