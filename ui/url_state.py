"""The app state (``ui.state``) mirrored into the address bar (``st.query_params``): every page's URL is a link
that shows the same model, prompt set, typed prompt, selection and knockout set in a fresh session.

The router (app.py) calls :func:`sync` before it runs a page: on the first run of a session the link's
parameters are read into the app state (checked; a bad value is dropped with a note that names it, the rest of
the link is kept).  From then on the app state is the source of truth: :func:`to_url` writes its non-default
values into the URL and removes the keys at their default -- before the page, in ``ui.session.setup_page``
(after the sidebar's forms), after the page, and in ``st.stop`` (wrapped when this module is imported: a page
that changed the state and then stopped sends nothing after ``st.stop``).
``setup_page`` also finishes what needs the model: a link's model that cannot be loaded gives way to the
default model (:func:`model_loaded`), the link's selection and knockouts are checked against the loaded model's
layers and heads (:func:`check_picks`), and the notes are shown on the page the link opened (:func:`notes`).

Keys (all optional; absent = the default)::

    model=PATH-OR-ID  device=cpu|cuda|all GPUs  dtype=bfloat16|float16  backend=nnsight
    ops=add,mul  families=word|all|notation  tpl=OP:TEMPLATE  n=40  seed=0  balance=0  every=1  cf=operand-a|operand-b
    digit=last|2|3...  operands=10-99  carry=yes|no
    prompt=TEXT  head=LAYER.HEAD | head=LAYER.mlp  ko=LAYER.HEAD,...  ko_mlp=LAYER,...

and each page's own controls (:data:`CHOICES`: the Story's ``step=`` and ``large=1``, Path patching's
``pp_metric=``/``pp_group=``/``pp_k=``/``pp_tab=``, Knockout's ``ko_k=``/``ko_kmax=``/``ko_draws=``, the
Circuit's ``circ_k=``/``circ_mlps=``/``circ_hh=1`` and its edge circuit's
``circ_edges=1``/``circ_ranking=``/``circ_top=``, Transfer's ``tr_set=``/``tr_k=``, ...). A page control's value
that the page alone can check (a layer of the model, an operation of the set) is checked by the page before it
draws the control (:func:`check`).

A link never turns on remote (NDIF) execution: that spends the server's API key and stays a sidebar choice.
Other keys in the address bar (the Improve page's ``job``) are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, NoReturn

import streamlit as st

from engine.models import DTYPE_NAMES
from engine.prompts.custom import parse_param
from engine.prompts.pairs import (
    ANY_CARRY,
    CARRY_SETS,
    COUNTERFACTUALS,
    FIRST_DIGIT,
    OPERATOR_REMOVED,
    OperandRange,
    PromptError,
    parse_digit,
)
from engine.prompts.promptsets import parse_operands
from engine.prompts.templates import OPS as OP_NAMES
from engine.techniques.circuit import MAX_DRAWN_EDGES
from engine.techniques.edge_scores import RANKINGS
from ui import state
from ui.state import BACKEND_CHOICES, DEVICES, FAMILY_CHOICES, ModelChoice, default_prompt_set

MODEL, DEVICE, DTYPE, BACKEND = "model", "device", "dtype", "backend"
OPS, FAMILIES, N, SEED, BALANCE, CF, TPL = "ops", "families", "n", "seed", "balance", "cf", "tpl"
EVERY, DIGIT, OPERANDS, CARRY = "every", "digit", "operands", "carry"
PROMPT, HEAD, KO, KO_MLP = "prompt", "head", "ko", "ko_mlp"
MODEL_KEYS = (MODEL, DEVICE, DTYPE, BACKEND)
#: the Transfer page's second sets (its selectbox, in order)
TRANSFER_SETS = ("word problems (Fig. 10)", "multi-digit integers (Fig. 4)", "decimals (Fig. 4)", "paper templates",
                 "SVAMP questions", "GSM8K questions")


@dataclass(frozen=True)
class Choice:
    """A page's control in the link: its URL key, the app-state entry its widget is bound to (``ui.state.bind``)
    and the values the link may give it: ``values`` (text), a whole number from ``lo`` to ``hi``, or ``flag``
    (1 / 0); none of them: any text, checked by the page (:func:`check`).  ``default`` (None: the page's own,
    e.g. one that depends on the model) is left out of the URL."""

    key: str
    entry: str
    widget: str
    default: Any = None
    values: tuple[str, ...] = ()
    lo: int | None = None
    hi: int | None = None
    flag: bool = False

    def parse(self, raw: str) -> tuple[Any, str | None]:
        """(the value, None), or (None, why the text is not one)."""
        text = raw.strip()
        if self.flag:
            return (_BOOL[text.lower()], None) if text.lower() in _BOOL else (None, "use 1 or 0")
        if self.lo is not None:
            hi = self.hi if self.hi is not None else 10**6
            if _INT.match(text) and self.lo <= int(text) <= hi:
                return int(text), None
            return None, f"not a whole number from {self.lo} to {hi}"
        if self.values:
            return (text, None) if text in self.values else (None, f"choose from {', '.join(self.values)}")
        return (text, None) if text and len(text) <= 200 else (None, "empty" if not text else "too long")

    def text(self, value: Any) -> str:
        return ("1" if value else "0") if self.flag else str(value)


#: every page's controls kept in the link, in URL order (docs/dashboard.md lists them)
CHOICES: tuple[Choice, ...] = (
    Choice("step", "story_step", "story_step_input", 1, lo=1, hi=99),
    Choice("large", "story_large", "story_large_input", False, flag=True),
    Choice("pp_metric", "pp_metric", "pp_metric_input", "effect", values=("effect", "logit_diff")),
    Choice("pp_group", "pp_group", "pp_group_input", "*"),
    Choice("pp_k", "pp_k", "pp_k_input", 5, lo=1),
    Choice("pp_tab", "pp_tab", "pp_tab_input", "Heatmap"),
    Choice("ko_k", "ko_k", "ko_k_input", 3, lo=1),
    Choice("ko_kmax", "ko_kmax", "ko_kmax_input", lo=1, hi=30),
    Choice("ko_draws", "ko_draws", "ko_draws_input", 10, lo=2, hi=30),
    Choice("lens_group", "lens_group_pick", "lens_group", "*"),
    Choice("pos_group", "pos_group", "lp_group"),
    Choice("pos_metric", "pos_metric", "lp_metric", "logit_diff", values=("logit_diff", "restored")),
    Choice("num_pos", "num_pos", "numbers_position"),
    Choice("num_target", "num_target", "numbers_target", "C"),
    Choice("num_layer", "num_layer", "numbers_layer", lo=0),
    Choice("faith_draws", "faith_draws", "faith_draws_input", lo=2, hi=20),
    Choice("faith_ablation", "faith_ablation_pick", "faith_ablation"),
    Choice("faith_metric", "faith_metric_pick", "faith_metric", "logit", values=("logit", "accuracy")),
    Choice("atlas_template", "atlas_template_pick", "atlas_template"),
    Choice("atlas_layer", "atlas_layer", "atlas_neuron_layer", lo=0),
    Choice("atlas_top", "atlas_top", "atlas_neuron_top", 20, lo=1, hi=200),
    Choice("circ_k", "circuit_k", "circuit_k_input", lo=1),
    Choice("circ_mlps", "circuit_mlps", "circuit_mlps_input", lo=0),
    Choice("circ_hh", "circuit_senders", "circuit_senders_input", False, flag=True),
    Choice("circ_edges", "circuit_edges", "circuit_edges_input", False, flag=True),
    Choice("circ_ranking", "circuit_ranking", "circuit_ranking_input", "eap", values=RANKINGS),
    Choice("circ_top", "circuit_top", "circuit_top_input", 20, lo=1, hi=MAX_DRAWN_EDGES),
    Choice("tr_set", "transfer_second", "transfer_second_input", TRANSFER_SETS[0], values=TRANSFER_SETS),
    Choice("tr_k", "transfer_k", "transfer_k_input", lo=1),
)
CHOICE = {c.key: c for c in CHOICES}
KEYS = (MODEL, DEVICE, DTYPE, BACKEND, OPS, FAMILIES, TPL, N, SEED, BALANCE, EVERY, CF, DIGIT, CARRY, OPERANDS,
        PROMPT, HEAD, KO, KO_MLP, *CHOICE)

READ = "_url_read"              # set once the session's first run has read the link
NOTES = "_url_notes"            # what the link held that was ignored, and why
NOTES_PAGE = "_url_notes_page"  # the page the link opened: the notes are shown there, and dropped elsewhere
MODEL_PENDING = "_url_model"    # the link's model parameters, until setup_page has tried to load that model
PICKS_PENDING = "_url_picks"    # the link's selection / knockout parameters, until checked against the model
CHOICES_PENDING = "_url_choices"  # the link's page controls that their page checks (:func:`check`), until it has

_HEAD = re.compile(r"^(\d{1,4})\.(\d{1,4})$")
_MLP = re.compile(r"^(\d{1,4})\.mlp$", re.IGNORECASE)
_INT = re.compile(r"^\d{1,10}$")
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


# ------------------------------------------------------------------------------------------------
# app state -> URL
# ------------------------------------------------------------------------------------------------

def head_param(sel: tuple[int, int]) -> str:
    """``3.1`` for head 1 of layer 3, ``4.mlp`` for the MLP of layer 4."""
    return f"{sel[0]}.mlp" if sel[1] == state.MLP else f"{sel[0]}.{sel[1]}"


def url_params() -> dict[str, str]:
    """The app state's non-default values as query parameters, in the order of :data:`KEYS`."""
    out: dict[str, str] = {}
    choice = st.session_state.get("model_choice") or ModelChoice()
    base = ModelChoice()
    for key, value, default in ((MODEL, choice.spec, base.spec), (DEVICE, choice.device, base.device),
                                (DTYPE, choice.dtype, base.dtype), (BACKEND, choice.backend, base.backend)):
        if value != default:
            out[key] = str(value)
    cur, dflt = st.session_state.get("prompt_set") or default_prompt_set(), default_prompt_set()
    if list(cur.get("ops", [])) != list(dflt["ops"]):
        out[OPS] = ",".join(cur.get("ops", []))
    fam = FAMILY_CHOICES.get(cur.get("families"), "paper")
    if cur.get("template"):  # a written template replaces the families (and brings its operation)
        out[TPL] = cur["template"]
        out.pop(OPS, None)
    elif fam != FAMILY_CHOICES[dflt["families"]]:
        out[FAMILIES] = fam
    for key in (N, SEED):
        if key in cur and int(cur[key]) != int(dflt[key]):
            out[key] = str(int(cur[key]))
    if not cur.get("balance", True):
        out[BALANCE] = "0"
    if cur.get("every"):
        out[EVERY] = "1"
    if cur.get("counterfactual", OPERATOR_REMOVED) != OPERATOR_REMOVED:
        out[CF] = cur["counterfactual"]
    if cur.get("digit", FIRST_DIGIT) != FIRST_DIGIT:
        out[DIGIT] = cur["digit"]
    if cur.get("carry", ANY_CARRY) != ANY_CARRY:
        out[CARRY] = cur["carry"]
    if (cur.get("operand_lo", 1), cur.get("operand_hi", 9)) != (1, 9):
        out[OPERANDS] = f"{cur.get('operand_lo', 1)}-{cur.get('operand_hi', 9)}"
    if state.prompt() != state.DEFAULT_PROMPT:
        out[PROMPT] = state.prompt()
    sel = state.selected()
    if sel is not None:
        out[HEAD] = head_param(sel)
    if state.ko_heads():  # sorted: one knockout set, one link
        out[KO] = ",".join(sorted(set(state.ko_heads()), key=lambda h: tuple(map(int, h.split(".")))))
    if state.ko_mlps():
        out[KO_MLP] = ",".join(map(str, sorted(set(state.ko_mlps()))))
    for c in CHOICES:
        value = st.session_state.get(c.entry)
        if value is not None and value != c.default:
            out[c.key] = c.text(value)
    return {k: out[k] for k in KEYS if k in out}


def to_url() -> None:
    """Write the app state into ``st.query_params`` (one message, and only when the address bar differs);
    keys at their default are removed, keys that are not the app state's are kept.  Nothing before the
    session has read its link (a page run on its own, without the router)."""
    if READ not in st.session_state:
        return
    want = url_params()
    qp = st.query_params
    have = {k: qp.get_all(k) for k in qp}
    if {k: v for k, v in have.items() if k in KEYS} == {k: [v] for k, v in want.items()}:
        return
    qp.from_dict({**want, **{k: v for k, v in have.items() if k not in KEYS}})


# ------------------------------------------------------------------------------------------------
# URL -> app state (first run of a session)
# ------------------------------------------------------------------------------------------------

def note_text(key: str, raw: str, why: str, default: str, todo: str = "") -> str:
    """The note that the link's parameter ``key=raw`` was ignored, why, and what is used instead."""
    shown = raw if len(raw) <= 80 else raw[:77] + "..."
    todo = todo or "Change it on the page: the address bar then holds a working link."
    return f"Link parameter `{key}={shown}` ignored: {why}. Using {default} instead. {todo}"


def ignored(key: str, raw: str, why: str, default: str, todo: str = "") -> None:
    """Note (shown by the page the link opened, :func:`notes`) that the link's ``key=raw`` was ignored."""
    st.session_state.setdefault(NOTES, []).append(note_text(key, raw, why, default, todo))


def notes(page: str) -> list[str]:
    """The link's notes, for the page the link opened (``page``: its title); dropped once another page is shown."""
    if NOTES not in st.session_state:
        return []
    if st.session_state.setdefault(NOTES_PAGE, page) != page:
        st.session_state.pop(NOTES, None)
        return []
    return list(st.session_state[NOTES])

def _int(key: str, raw: str, lo: int, hi: int, default: Any) -> int | None:
    if _INT.match(raw.strip()) and lo <= int(raw) <= hi:
        return int(raw)
    ignored(key, raw, f"not a whole number from {lo} to {hi}", f"`{default}`")
    return None


def from_url() -> None:
    """Read the link's parameters into the app state; each bad value is dropped with a note."""
    qp = st.query_params
    given = {k: qp[k] for k in KEYS if k in qp}
    if not given:
        return

    # the model: spec and, when not default, device / dtype / backend (loaded and checked by setup_page)
    if any(k in given for k in MODEL_KEYS):
        choice: ModelChoice = st.session_state.get("model_choice") or ModelChoice()
        fields = {"spec": choice.spec, "device": choice.device, "dtype": choice.dtype, "backend": choice.backend}
        for key, field, allowed in ((MODEL, "spec", None), (DEVICE, "device", DEVICES), (DTYPE, "dtype", DTYPE_NAMES),
                                    (BACKEND, "backend", tuple(BACKEND_CHOICES))):
            if key not in given:
                continue
            raw = given[key]
            if allowed is None and raw.strip():
                fields[field] = raw.strip()
            elif allowed is not None and raw in allowed:
                fields[field] = raw
            else:
                why = "empty" if not raw.strip() else f"choose from {', '.join(allowed or ())}"
                ignored(key, raw, why, f"`{fields[field]}`")
        new = ModelChoice(fields["spec"], fields["device"], fields["dtype"], fields["backend"], False)
        st.session_state["model_choice"] = new
        st.session_state[MODEL_PENDING] = {k: given[k] for k in MODEL_KEYS if k in given}

    # the prompt set: only the fields the link names; the others keep their value
    if any(k in given for k in (OPS, FAMILIES, TPL, N, SEED, BALANCE, EVERY, CF, DIGIT, CARRY, OPERANDS)):
        cur = dict(st.session_state.get("prompt_set") or default_prompt_set())
        if OPS in given:
            ops = [o.strip() for o in given[OPS].split(",") if o.strip()]
            bad = [o for o in ops if o not in OP_NAMES]
            if bad or not ops:
                why = f"unknown operation {', '.join(bad)}" if bad else "no operation"
                ignored(OPS, given[OPS], f"{why} (choose from {', '.join(OP_NAMES)})",
                                   f"`{','.join(cur['ops'])}`")
            else:
                cur["ops"] = list(dict.fromkeys(ops))
        if FAMILIES in given:
            labels = {v: k for k, v in FAMILY_CHOICES.items()}
            if given[FAMILIES] in labels:
                cur["families"] = labels[given[FAMILIES]]
            else:
                ignored(FAMILIES, given[FAMILIES], f"choose from {', '.join(labels)}",
                                   f"`{FAMILY_CHOICES.get(cur['families'], 'paper')}`")
        if TPL in given:
            try:
                param = parse_param(given[TPL]).as_param()
                cur.update(template=param, families=state.template_label(param), ops=[param.split(":", 1)[0]])
            except PromptError as e:
                ignored(TPL, given[TPL], str(e), f"`{FAMILY_CHOICES.get(cur['families'], 'paper')}`",
                        "Write the template on the page 'Your templates': the address bar then holds a working link.")
        for key, lo, hi in ((N, 1, 1000), (SEED, 0, 10**9)):
            if key in given:
                value = _int(key, given[key], lo, hi, cur[key])
                if value is not None:
                    cur[key] = value
        for key, field, default in ((BALANCE, "balance", True), (EVERY, "every", False)):
            if key in given:
                if given[key].lower() in _BOOL:
                    cur[field] = _BOOL[given[key].lower()]
                else:
                    ignored(key, given[key], "use 1 or 0", f"`{int(cur.get(field, default))}`")
        if CF in given:
            if given[CF] in COUNTERFACTUALS:
                cur["counterfactual"] = given[CF]
            else:
                ignored(CF, given[CF], f"choose from {', '.join(COUNTERFACTUALS)}",
                        f"`{cur.get('counterfactual', OPERATOR_REMOVED)}`")
        if DIGIT in given:
            try:
                cur["digit"] = parse_digit(given[DIGIT])
            except PromptError:
                ignored(DIGIT, given[DIGIT], "choose first, last or a number k (the k-th answer digit)",
                        f"`{cur.get('digit', FIRST_DIGIT)}`")
        if CARRY in given:
            if given[CARRY] in CARRY_SETS:
                cur["carry"] = given[CARRY]
            else:
                ignored(CARRY, given[CARRY], f"choose from {', '.join(CARRY_SETS)}", f"`{cur.get('carry', ANY_CARRY)}`")
        if OPERANDS in given:
            try:
                lo, hi = parse_operands(given[OPERANDS])
                OperandRange(lo, hi)
                cur.update(operand_lo=lo, operand_hi=hi)
            except PromptError as e:
                ignored(OPERANDS, given[OPERANDS], str(e), f"`{cur.get('operand_lo', 1)}-{cur.get('operand_hi', 9)}`")
        st.session_state["prompt_set"] = cur

    if PROMPT in given:
        state.put(state.PROMPT, given[PROMPT])

    # the selection and the knockout set: their form here, their range once the model is loaded
    picks = {}
    if HEAD in given:
        raw = given[HEAD].strip()
        m, mlp = _HEAD.match(raw), _MLP.match(raw)
        if m or mlp:
            state.select(int((m or mlp).group(1)), int(m.group(2)) if m else state.MLP)
            picks[HEAD] = given[HEAD]
        else:
            ignored(HEAD, given[HEAD], "not of the form LAYER.HEAD (e.g. `3.1`) or LAYER.mlp "
                               "(e.g. `4.mlp`)", "no selection (the page shows its top head)")
    if KO in given:
        items = [h.strip() for h in given[KO].split(",") if h.strip()]
        bad = [h for h in items if not _HEAD.match(h)]
        if bad:
            ignored(KO, given[KO], f"{', '.join(bad)} not of the form LAYER.HEAD (e.g. `3.1,5.0`)",
                               "no knockout heads")
        else:
            state.put(state.KO_HEADS, sorted({f"{int(a)}.{int(b)}" for a, b in (h.split(".") for h in items)},
                                             key=lambda h: tuple(map(int, h.split(".")))))
            picks[KO] = given[KO]
    if KO_MLP in given:
        items = [m.strip() for m in given[KO_MLP].split(",") if m.strip()]
        bad = [m for m in items if not _INT.match(m)]
        if bad:
            ignored(KO_MLP, given[KO_MLP], f"{', '.join(bad)} not a layer number (e.g. `4` or `2,4`)",
                               "no knockout MLPs")
        else:
            state.put(state.KO_MLPS, sorted({int(m) for m in items}))
            picks[KO_MLP] = given[KO_MLP]
    if picks:
        st.session_state[PICKS_PENDING] = picks

    # each page's controls: their form here (a number, one of fixed values), the rest on their page (check)
    pending = {}
    for c in CHOICES:
        if c.key not in given:
            continue
        value, why = c.parse(given[c.key])
        if why is not None:
            ignored(c.key, given[c.key], why, "the page's default" if c.default is None else f"`{c.text(c.default)}`")
            continue
        st.session_state[c.entry] = value
        pending[c.key] = given[c.key]
    if pending:
        st.session_state[CHOICES_PENDING] = pending
    # the picks belong to the link's model: follow_model must not clear them as picked on another one
    state.adopt((st.session_state.get("model_choice") or ModelChoice()).spec)


def model_pending() -> bool:
    """Whether the link named a model that ``setup_page`` has not tried to load yet."""
    return MODEL_PENDING in st.session_state


def model_loaded(error: str | None) -> None:
    """``setup_page`` tried the link's model: ``error`` None = loaded; else the default model instead, with a
    note (the rest of the link -- prompt, prompt set, selection, knockouts -- is kept)."""
    given = st.session_state.pop(MODEL_PENDING, None) or {}
    if error is None or not given:
        return
    default = ModelChoice()
    key = MODEL if MODEL in given else next(iter(given))
    also = [f"`{k}={v}`" for k, v in given.items() if k != key]
    ignored(key, given[key], error.rstrip(".") + (f" (ignored with it: {', '.join(also)})" if also else ""),
            f"the default model `{default.spec}`", "The rest of the link is kept; load another model in the sidebar.")
    st.session_state["model_choice"] = default
    state.adopt(default.spec)


def check_picks(n_layers: int, n_heads: int, spec: str) -> None:
    """Drop the link's selection / knockouts that the loaded model does not have (once, after its first load)."""
    picks = st.session_state.pop(PICKS_PENDING, None)
    if not picks:
        return
    has = f"`{spec}` has layers 0-{n_layers - 1} and heads 0-{n_heads - 1}"
    sel = state.selected()
    if HEAD in picks and sel is not None and (sel[0] >= n_layers or sel[1] >= n_heads):
        st.session_state.pop(state.SELECTED, None)
        ignored(HEAD, picks[HEAD], f"{has} (an MLP: `head=LAYER.mlp`)", "no selection (the page shows its top head)")
    bad = [h for h in state.ko_heads() if not all(int(x) < n for x, n in zip(h.split("."), (n_layers, n_heads)))]
    if KO in picks and bad:
        state.put(state.KO_HEADS, [h for h in state.ko_heads() if h not in bad])
        ignored(KO, picks[KO], f"{has}: no head {', '.join(bad)}",
                f"the other heads ({', '.join(state.ko_heads()) or 'none'})")
    bad_mlps = [m for m in state.ko_mlps() if m >= n_layers]
    if KO_MLP in picks and bad_mlps:
        state.put(state.KO_MLPS, [m for m in state.ko_mlps() if m < n_layers])
        ignored(KO_MLP, picks[KO_MLP], f"`{spec}` has layers 0-{n_layers - 1}",
                f"the other MLPs ({', '.join(map(str, state.ko_mlps())) or 'none'})")


def from_link(key: str) -> bool:
    """Whether the value of the page control ``key`` came from the link and its page has not checked it yet."""
    return key in (st.session_state.get(CHOICES_PENDING) or {})


def bound(key: str, default: Any = None) -> dict:
    """``state.bind``'s keyword arguments for the widget of the page control ``key`` (:data:`CHOICES`): bound to
    its app-state entry, seeded with the control's default (``default``: the page's own, where it depends on
    the model or the set)."""
    c = CHOICE[key]
    return state.bind(c.widget, c.entry, c.default if default is None else default)


def check(key: str, allowed: Collection, why: str = "") -> None:
    """Before its page draws the control of :data:`CHOICES` ``key``: the value must be one of ``allowed`` (the
    control's options, or a ``range``; known only to the page: the model's layers, the set's operations).  A
    value that is not goes back to the page's default -- with a warning naming the parameter when the link
    gave it, quietly when the page's own control did (another model or set since)."""
    c = CHOICE[key]
    raw = (st.session_state.get(CHOICES_PENDING) or {}).pop(key, None)
    bad = [name for name in (c.entry, c.widget) if name in st.session_state and st.session_state[name] not in allowed]
    for name in bad:
        st.session_state.pop(name)
    if bad:
        to_url()  # at once: the page may stop before the router writes the URL after it
    if raw is not None and bad:
        if not why:
            if isinstance(allowed, range):
                why = f"not a whole number from {allowed.start} to {allowed.stop - 1} here"
            else:
                shown = [str(a) for a in allowed]
                why = "choose from " + ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")
        st.warning(note_text(key, raw, why, "the page's default" if c.default is None else f"`{c.text(c.default)}`"))


def sync() -> None:
    """The router's call before it runs a page: on a session's first run read the link into the app state;
    then write the app state into the URL."""
    if READ not in st.session_state:
        st.session_state[READ] = True
        from_url()
    to_url()


def _keep_url_on_stop(stop: Callable[[], NoReturn]) -> Callable[[], NoReturn]:
    """``st.stop`` that first writes the app state into the URL.

    After ``st.stop()`` Streamlit sends nothing more in that run, so the router's :func:`to_url` after the
    page could not update the address bar: a page that changes the app state while it runs (a heatmap click
    that selects an MLP) and then stops would leave the previous link there until the next run."""
    if getattr(stop, "_keeps_url", False):
        return stop

    def stop_keeping_url() -> NoReturn:
        to_url()
        stop()

    stop_keeping_url._keeps_url = True  # type: ignore[attr-defined]
    return stop_keeping_url


st.stop = _keep_url_on_stop(st.stop)  # once per process (module import)
