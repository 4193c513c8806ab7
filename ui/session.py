"""Model and prompt-set choice held in ``st.session_state`` and shared by every page."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import streamlit as st

from cache import CacheError, ResultCache
from engine.backends import open_model
from engine.backends.base import ModelBackend
from engine.models import DTYPE_NAMES
from engine.models.spec import ORGANISM_DIR, ORGANISM_SPEC, ModelLoadError
from engine.paths import REPO_ROOT
from ui import state, url_state
from ui.nav import ROUTED, page_link
from ui.progress import compute_or_button, page_run_started
from ui.state import (
    BACKEND_CHOICES,
    DEVICES,
    FAMILY_CHOICES,
    MULTI_GPU,
    ModelChoice,
    default_prompt_set,
    template_label,
)

if TYPE_CHECKING:
    from engine.prompts.promptsets import PromptSetSpec

@st.cache_resource(show_spinner="Loading the model ...", max_entries=3)
def _load(spec: str, device: str, dtype: str, files_stamp: str, backend: str = "bridge",
          remote: bool = False) -> ModelBackend:
    # st.cache_resource is used for the model only; results live in the DuckDB cache.
    # files_stamp is part of the key: weights replaced on disk are loaded again (new fingerprint).
    from engine.cost import pass_timing
    if remote:
        return open_model(spec, dtype=dtype, backend=backend, remote=True)
    if device == MULTI_GPU:
        model = open_model(spec, dtype=dtype, backend=backend, device_map="auto")
    else:
        model = open_model(spec, device=None if device == "auto" else device, dtype=dtype, backend=backend)
    pass_timing(model)  # a forward call timed once, under the loading spinner: every page's cost estimates use it
    return model


def files_stamp(spec: str) -> str:
    """Name, size, inode and mtime of a local model's files, hashed ('' for hub ids / missing paths).

    Only ``stat`` calls, cheap enough for every rerun: a long-running dashboard notices that a
    model directory's weights were replaced and loads (and fingerprints) them again instead of
    serving the old model -- and the old model's cached results -- under the same name.
    """
    spec = spec.strip()
    if spec == ORGANISM_SPEC:
        candidates = [ORGANISM_DIR]
    else:
        raw = Path(spec).expanduser()
        candidates = [raw] if raw.is_absolute() else [Path.cwd() / raw, REPO_ROOT / raw]
    h = hashlib.sha256()
    try:
        path = next((c for c in candidates if c.exists()), None)
        if path is None:
            return ""
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        for f in files:
            st_ = f.stat()
            h.update(f"{f.name}\0{st_.st_size}\0{st_.st_ino}\0{st_.st_mtime_ns}\n".encode())
    except (OSError, ValueError):  # unreadable / odd paths: open_model reports the problem
        return ""
    return h.hexdigest()[:16]


def model_choice() -> ModelChoice:
    """The sidebar's model picker; the choice persists across pages in session state."""
    current: ModelChoice = st.session_state.get("model_choice", ModelChoice())
    for key, value in _model_widget_values(current).items():  # seeded from the choice (no value= below)
        # re-assigned on every run, not only seeded: each page's sidebar is another widget with the same key,
        # and Streamlit would otherwise show it empty on every other page change
        st.session_state[key] = st.session_state.get(key, value)
    with st.sidebar:
        st.subheader("Model")
        with st.form("model_form", border=False):
            spec = st.text_input(
                "Model", key="model_spec_input",
                help="`organism` (the bundled arithmetic model), a local Hugging Face directory, "
                     "a .gguf file, or a hub id such as Qwen/Qwen2.5-0.5B (needs the internet).")
            c1, c2 = st.columns(2)
            device = c1.selectbox("Device", DEVICES, key="model_device_input",
                                  help="`all GPUs` spreads a model too big for one GPU over every visible GPU "
                                       "(accelerate device_map=auto).")
            dtype = c2.selectbox("Precision", DTYPE_NAMES, key="model_dtype_input",
                                 help="bfloat16 / float16 halve the memory; README 'Bigger models' lists how far "
                                      "their results move from float32.")
            backend = st.selectbox("Backend", list(BACKEND_CHOICES),
                                   format_func=BACKEND_CHOICES.get, key="model_backend_input",
                                   help="Both give the same numbers and share cached results; nnsight can also "
                                        "run hub models remotely on NDIF.")
            remote = st.checkbox("Run remotely on NDIF", key="model_remote_input",
                                 help="nnsight backend and a hub id NDIF hosts (e.g. meta-llama/Llama-3.1-8B); "
                                      "the API key comes from the NDIF_API_KEY environment variable of the "
                                      "server process.")
            if st.form_submit_button("Load model", width="stretch"):
                current = ModelChoice(spec.strip() or "organism", device, dtype, backend, bool(remote))
                st.session_state["model_choice"] = current
    state.follow_model(current.spec)
    return current


def _model_widget_values(choice: ModelChoice) -> dict:
    return {"model_spec_input": choice.spec, "model_device_input": choice.device, "model_dtype_input": choice.dtype,
            "model_backend_input": choice.backend, "model_remote_input": choice.remote}


def use_model(choice: ModelChoice) -> None:
    """Make ``choice`` the model of every page, the sidebar's boxes included (call from a widget callback:
    values set through the session state are sent to the browser, which shows them)."""
    st.session_state["model_choice"] = choice
    st.session_state.update(_model_widget_values(choice))
    state.follow_model(choice.spec)


def _try_load(choice: ModelChoice) -> tuple[ModelBackend | None, str]:
    """(the loaded model, "") or (None, what went wrong and what to do)."""
    try:
        return _load(choice.spec, choice.device, choice.dtype, files_stamp(choice.spec), choice.backend,
                     choice.remote), ""
    except ModelLoadError as e:
        return None, f"Cannot load model `{choice.spec}`: {e}"
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"Cannot load model `{choice.spec}`: {e}. Check the path or pick `organism`."


def second_model(choice: ModelChoice) -> tuple[ModelBackend | None, str]:
    """A second model beside the sidebar's (Compare's B), loaded like it: (the model, "") or (None, what went wrong
    and what to do); nothing is drawn in the sidebar."""
    return _try_load(choice)


def loaded_model(choice: ModelChoice) -> ModelBackend | None:
    """The loaded model, or None after showing an ``st.error`` that says what to do."""
    model, error = _try_load(choice)
    if model is None:
        st.error(error)
        return None
    st.sidebar.caption(f"Loaded with the **{model.name}** backend on {model.facts.device} "
                       f"({model.facts.dtype}).")
    return model


def _load_link_model() -> None:
    """A link's model (``ui.url_state``) is tried before the sidebar is drawn: one that cannot be loaded
    gives way to the default model, with a note, and the rest of the link is kept."""
    if not url_state.model_pending():
        return
    choice = st.session_state.get("model_choice", ModelChoice())
    model, error = _try_load(choice)
    url_state.model_loaded(None if model is not None else error.removeprefix(f"Cannot load model `{choice.spec}`: "))


CACHE_NOTICE = "cache_notice"  # a problem the sidebar met opening the cache, for the page to show


def result_cache() -> ResultCache | None:
    """The DuckDB result cache, or None (after an ``st.warning``) when it cannot be opened.

    A problem met while the page computes (a damaged cache file moved aside, a result that could
    not be stored: read-only file, full disk) is shown as an ``st.error`` where it happens, once per
    page run; the page still shows its results.
    """
    shown: list[str] = []

    def show(message: str) -> None:
        if not shown:  # later messages of the same run have the same cause
            shown.append(message)
            st.error(message)

    try:
        cache = ResultCache(on_warning=show)
    except CacheError as e:
        st.warning(f"The result cache is unavailable ({e}); results are computed without caching.")
        return None
    earlier = st.session_state.pop(CACHE_NOTICE, None)  # met by the sidebar before the page opened the cache
    if earlier:
        show(earlier)
    if getattr(cache, "last_warning", None):
        st.warning(cache.last_warning)
    return cache


DEFAULT_PROMPT = state.DEFAULT_PROMPT


def _saved_templates() -> list[str]:
    """The written templates kept in the cache (``op:text``), newest first; none when the cache cannot be read.
    A problem met opening it (a damaged file moved aside) is kept for the page's :func:`result_cache` to show."""
    from engine.prompts.custom import saved_templates

    def keep(message: str) -> None:
        st.session_state[CACHE_NOTICE] = message
    try:
        return [w.as_param() for w in saved_templates(ResultCache(on_warning=keep))]
    except CacheError:
        return []


#: the sidebar's "Answer digit" choices (a link may give another k: it is added to them)
DIGIT_CHOICES = ("first", "last", "2", "3", "4")
#: the sidebar's "Which prompts": label -> (balance, every)
SAMPLES = {"balanced sample": (True, False), "unbalanced sample": (False, False),
           "every prompt answered right": (True, True)}


def prompt_set_choice() -> "PromptSetSpec":
    """Sidebar: which prompt set the analysis pages use (kept in session state)."""
    from engine.prompts.pairs import ANY_CARRY, CARRY_SETS, COUNTERFACTUALS, FIRST_DIGIT, OPERATOR_REMOVED, digit_words
    from engine.prompts.promptsets import PromptSetSpec, parse_families
    from engine.prompts.templates import OPS
    cur = st.session_state.get("prompt_set") or default_prompt_set()
    written = list(dict.fromkeys(([cur["template"]] if cur.get("template") else []) + _saved_templates()))
    choices = {**{label: None for label in FAMILY_CHOICES}, **{template_label(t): t for t in written}}
    # the two boxes show the set on every run but the form's submit (not default=/index=): a set changed on a page
    # (a written template) or read from a link must show in them, on this page and after a page change
    if not st.session_state.get("ps_submit"):
        st.session_state["ps_families"] = cur["families"] if cur["families"] in choices else next(iter(choices))
        st.session_state["ps_ops"] = list(cur["ops"])
    with st.sidebar:
        st.subheader("Prompt set")
        with st.form("prompt_set_form", border=False):
            ops = st.multiselect("Operations", OPS, key="ps_ops", help="A template you wrote brings its own operation.")
            fam = st.selectbox("Templates", list(choices), key="ps_families",
                               help="The paper's families, or a template you wrote (page 'Your templates').")
            c1, c2 = st.columns(2)
            n = c1.number_input("Prompts per op", 1, 1000, cur["n"], key="ps_n")
            seed = c2.number_input("Seed", 0, 10**9, cur["seed"], key="ps_seed")
            lo = c1.number_input("Operands from", 0, 9999, cur.get("operand_lo", 1), key="ps_operand_lo",
                                 help="The smallest operand A and B may be (1 to 9 by default; 10 to 99 gives "
                                      "two-digit problems, whose units digit and carry the 'Answer digit' reads).")
            hi = c2.number_input("to", 0, 9999, cur.get("operand_hi", 9), key="ps_operand_hi",
                                 help="The largest operand.")
            labels = list(SAMPLES)
            shown = labels[2] if cur.get("every") else labels[0] if cur.get("balance", True) else labels[1]
            sample = st.selectbox("Which prompts", labels, index=labels.index(shown), key="ps_sample",
                                  help="A sample takes 'Prompts per op' problems of each operation; a balanced one "
                                       "takes them round-robin over their first answer token, so that e.g. the '1' "
                                       "of every sum from 10 to 18 does not dominate. 'Every prompt answered right' "
                                       "uses all the problems of the templates ('Prompts per op' is then ignored) "
                                       "and keeps every one the model answers right: more pairs and narrower "
                                       "intervals, but unbalanced -- the heatmap then partly measures predicting the "
                                       "most common first token.")
            balance, every = SAMPLES[sample]
            kinds = list(COUNTERFACTUALS)
            cf = st.selectbox("Counterfactual (X_c)", kinds, index=kinds.index(cur.get("counterfactual", kinds[0])),
                              key="ps_counterfactual", format_func=lambda k: k.replace("-", " "),
                              help="What the counterfactual prompt changes: " + "; ".join(
                                  f"{k.replace('-', ' ')}: {v}" for k, v in COUNTERFACTUALS.items()) + ".")
            digits = list(dict.fromkeys([*DIGIT_CHOICES, cur.get("digit", FIRST_DIGIT)]))
            digit = st.selectbox("Answer digit", digits, index=digits.index(cur.get("digit", FIRST_DIGIT)),
                                 key="ps_digit", format_func=digit_words,
                                 help="Which digit of the answer the pages analyse: the first (the paper's), the "
                                      "last (the units digit, where the sum's arithmetic and its carry happen) or "
                                      "the k-th. The digits before it are given to the model (in the prompt and "
                                      "its counterfactual alike) and must be predicted right too.")
            carries = list(CARRY_SETS)
            carry = st.selectbox("Carry / borrow", carries, index=carries.index(cur.get("carry", ANY_CARRY)),
                                 key="ps_carry", format_func=lambda c: CARRY_SETS[c],
                                 help="Keep only the problems whose sum carries (whose difference borrows) in some "
                                      "column, or only those with none: every page then analyses those prompts "
                                      "alone, so switching it compares the two. Additions and subtractions only; "
                                      "1 to 9 has no borrow (operands 10 to 99 have both).")
            if st.form_submit_button("Use this set", width="stretch", key="ps_submit"):
                cur = {"ops": ops, "families": fam, "n": int(n), "seed": int(seed), "balance": bool(balance),
                       "every": every, "counterfactual": cf, "digit": digit, "carry": carry, "operand_lo": int(lo),
                       "operand_hi": int(hi)}
                if choices.get(fam):
                    cur.update(template=choices[fam], ops=[choices[fam].split(":", 1)[0]])
                st.session_state["prompt_set"] = cur
    if not cur["ops"]:
        raise ValueError("pick at least one operation in the sidebar")
    template = cur.get("template")
    families = parse_families(FAMILY_CHOICES.get(cur["families"], "paper"))
    return PromptSetSpec(ops=tuple(cur["ops"]), n=cur["n"], seed=cur["seed"], families=families,
                         balance=cur.get("balance", True), every=bool(cur.get("every")),
                         counterfactual=cur.get("counterfactual", OPERATOR_REMOVED),
                         templates=(template,) if template else (), digit=cur.get("digit", FIRST_DIGIT),
                         carry=cur.get("carry", ANY_CARRY),
                         operand_lo=cur.get("operand_lo", 1), operand_hi=cur.get("operand_hi", 9))


def use_typed_template(text: str, cache: ResultCache | None) -> None:
    """The typed prompt's template (its operands as {A}/{B}, its operator marked) as every page's prompt set, saved
    in the cache beside the other written templates (page 'Your templates')."""
    from engine.prompts.custom import save_template, template_from_typed
    written = template_from_typed(text)
    if cache is not None:
        save_template(cache, written)
    state.use_template(written.as_param())


def current_prompt() -> str:
    """The typed prompt shared by all pages (the app's own entry, kept when the Prompt lab is not shown)."""
    return state.prompt()


def prompt_input(label: str = "Prompt") -> str:
    """A text box bound to the shared typed prompt (seeded from it, writes back on change)."""
    text = st.text_input(label, **state.bind("typed_prompt", state.PROMPT, DEFAULT_PROMPT),
                         help="Any arithmetic prompt, e.g. 'Q: What is 7 times 8? A:' or '6 - 2 ='. Every page "
                              "analyses the prompt typed here.")
    state.put(state.PROMPT, text)  # the box and the app state agree, however the box got its value
    return text


def prompt_caption() -> None:
    """The typed prompt a page analyses, with a link to change it."""
    c1, c2 = st.columns([5, 1])
    c1.markdown(f"Typed prompt: **`{current_prompt()}`**")
    page_link("pages/3_Prompt_lab.py", "change it", ":material/edit:", where=c2)


def words_used(*names: str, label: str = "Words used here", where=None) -> None:
    """A popover button (``label``) opening each of the glossary's terms ``names`` (``engine.findings.glossary``) in
    plain words: beside the page's text, and out of the page (a closed popover's text is not drawn at all, so the
    page's own words are the only ones a reader -- or a browser test -- finds on it)."""
    from engine.findings.glossary import terms
    with (where or st).popover(label, icon=":material/menu_book:"):
        st.markdown("\n".join(f"- **{t.name}**: {t.plain}" for t in terms(*names)))


def sidebar() -> tuple[ModelChoice, "PromptSetSpec | ValueError"]:
    """The sidebar every page shares: model picker and prompt-set picker (drawn once per run, by setup_page)."""
    choice = model_choice()
    try:
        spec = prompt_set_choice()
    except ValueError as e:
        spec = e
    return choice, spec


def model_facts_sidebar(model: ModelBackend) -> None:
    """The loaded model's facts, one per line (wrapped, never cut off)."""
    f = model.facts
    with st.sidebar.expander("Model facts", expanded=False):
        st.markdown(f"- **spec** `{f.spec}`\n- **architecture** {f.architecture}\n- **layers** {f.n_layers}\n"
                    f"- **heads (KV)** {f.n_heads} ({f.n_kv_heads})\n- **d_model / d_head** {f.d_model} / {f.d_head}"
                    f"\n- **parameters** {f.n_params / 1e6:.2f} M\n- **device** {f.device} · {f.dtype}\n"
                    f"- **fingerprint** `{f.fingerprint[:12]}`")


def _run_under_the_router() -> None:
    """Rerun a page that Streamlit ran without the router, this time through app.py.

    Streamlit 1.67 treats an app with a ``pages/`` folder beside its main script as a "pages directory"
    (v1) app until some run calls ``st.navigation``: it runs the page script itself, not app.py.  So the
    first session of a freshly started dashboard that opens a page's URL (a shared link) got no router --
    no page list, no link read from the URL -- as long as nobody had opened the Home page.  Leaving that
    mode is what ``st.navigation`` does itself; the rerun then runs app.py for the same page (same URL
    path, same query string).  A page run on its own (AppTest of a page script) has no ``pages/`` folder
    beside it; AppTest of app.py sets the mode again before every run, and a rerun there would drop the
    run's button clicks: both are left alone."""
    from streamlit import config
    from streamlit.runtime.pages_manager import PagesManager
    if getattr(PagesManager, "uses_pages_directory", False) and not config.get_option("global.appTest"):
        PagesManager.uses_pages_directory = False
        st.rerun()


def setup_page(title: str, caption: "str | Callable[[PromptSetSpec | None], str]"):
    """Common page header + sidebar; returns (model, spec) or stops the page after an st.error.  ``caption`` may
    be a function of the sidebar's prompt set (None when the set is not valid): the page's words then follow the
    set (its counterfactual kind, its templates).

    Under the router (app.py) the page config is set there; a page run on its own (AppTest) sets it here.
    The sidebar is drawn here, below the router's page list, and not by the router itself: AppTest
    (Streamlit 1.67) loses the router's own elements on every rerun (it runs the page script without
    app.py, see :func:`_run_under_the_router`), so its widgets could not be tested.  For the same reason
    the app state is written into the URL here too (``ui.url_state.to_url``), not only by the router."""
    if st.session_state.get(ROUTED) is None:
        _run_under_the_router()
        st.set_page_config(page_title=f"{title} · Arithmetic-circuits lab", page_icon="🧮", layout="wide")
    _load_link_model()
    choice, spec = sidebar()
    st.title(title)
    st.caption(caption(None if isinstance(spec, ValueError) else spec) if callable(caption) else caption)
    note = state.model_note()
    if note:
        st.warning(note)
    if isinstance(spec, ValueError):
        st.error(f"{spec}.")
        st.stop()
    model = loaded_model(choice)
    page_run_started()
    if model is not None:  # a link's selection and knockouts are checked against the model's layers and heads
        url_state.check_picks(model.facts.n_layers, model.facts.n_heads, choice.spec)
    for text in url_state.notes(title):  # what a link held that was ignored (until another page is opened)
        st.warning(text)
    url_state.to_url()  # the address bar: this run's app state (sidebar forms, widget callbacks, the link's checks)
    if model is None:
        st.stop()
    model_facts_sidebar(model)
    from ui.circuit_panels import report_section
    with st.sidebar:
        st.subheader("Report")
        report_section(model, spec, result_cache())
    return model, spec


def set_size_text(spec: "PromptSetSpec", n_kept: int, n_generated: int) -> str:
    """"N of M prompts answered right", and why those counts: how the set was picked and from how many problems."""
    from engine.prompts.promptsets import problem_count, sample_words
    total = problem_count(spec)
    text = (f"{n_kept} of {n_generated} prompts answered right ({sample_words(spec)}, of the {total} problems its "
            f"templates and operands give)")
    if not spec.every and total > n_generated:
        text += ("; 'Which prompts' → 'every prompt answered right' in the sidebar keeps every one of the "
                 f"{total} problems the model answers right")
    if spec.digit != "first":
        from engine.prompts.pairs import digit_words
        text += (f"; read at the answer's {digit_words(spec.digit)} digit, the digits before it given to the model "
                 f"in both prompts and answered right too")
    return text


def analysed_pairs(model: ModelBackend, spec: "PromptSetSpec", cache):
    """The set's correctly answered pairs (cached filter) or stop the page after an st.error; a set of fewer than
    ``SMALL_SET`` pairs is said plainly, with how to get more."""
    from engine.techniques.accuracy import kept_pairs, kept_pairs_cost
    pairs, n_generated = compute_or_button(lambda cb: kept_pairs(model, spec, cache=cache, progress=cb),
                                           lambda: kept_pairs_cost(model, spec), model=model, stop=True,
                                           button="Check which prompts the model answers right", key="filter",
                                           text="Checking which prompts the model answers right",
                                           failure="build the prompt set",
                                           note="Every page analyses only the prompts the model answers right: this "
                                                "set is large for this model, so the check waits for the button.")
    if not pairs:
        from engine.prompts.custom import none_right_message
        msg = none_right_message(n_generated, custom=bool(spec.templates))
        st.error(msg[0].upper() + msg[1:].replace("your template", "your template (page 'Your templates')") + ".")
        st.stop()
    from engine.numerics.intervals import small_set_note
    note = small_set_note(len(pairs))
    if note:
        st.info(f"{note} {set_size_text(spec, len(pairs), n_generated)}.", icon=":material/info:")
    return pairs, n_generated
