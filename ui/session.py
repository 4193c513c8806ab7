"""Model and prompt-set choice held in ``st.session_state`` and shared by every page."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from cache import CacheError, ResultCache
from engine.backend import ModelBackend, open_model
from engine.models import ORGANISM_DIR, ORGANISM_SPEC, REPO_ROOT, ModelLoadError

if TYPE_CHECKING:
    from engine.promptsets import PromptSetSpec

MULTI_GPU = "all GPUs"  # device choice: accelerate's device_map="auto" over every visible GPU
DEVICES = ("auto", "cpu", "cuda", MULTI_GPU)
DTYPES = ("float32", "bfloat16", "float16")
BACKEND_CHOICES = {"bridge": "TransformerBridge (transformer-lens)", "nnsight": "nnsight (plain HF model)"}


@dataclass(frozen=True)
class ModelChoice:
    spec: str = "organism"
    device: str = "auto"
    dtype: str = "float32"
    backend: str = "bridge"
    remote: bool = False  # nnsight only: run on NDIF with $NDIF_API_KEY


@st.cache_resource(show_spinner="Loading the model ...", max_entries=3)
def _load(spec: str, device: str, dtype: str, files_stamp: str, backend: str = "bridge",
          remote: bool = False) -> ModelBackend:
    # st.cache_resource is used for the model only; results live in the DuckDB cache.
    # files_stamp is part of the key: weights replaced on disk are loaded again (new fingerprint).
    if remote:
        return open_model(spec, dtype=dtype, backend=backend, remote=True)
    if device == MULTI_GPU:
        return open_model(spec, dtype=dtype, backend=backend, device_map="auto")
    return open_model(spec, device=None if device == "auto" else device, dtype=dtype, backend=backend)


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
    with st.sidebar:
        st.subheader("Model")
        with st.form("model_form", border=False):
            spec = st.text_input(
                "Model", value=current.spec, key="model_spec_input",
                help="`organism` (the bundled arithmetic model), a local Hugging Face directory, "
                     "a .gguf file, or a hub id such as Qwen/Qwen2.5-0.5B (needs the internet).")
            c1, c2 = st.columns(2)
            device = c1.selectbox("Device", DEVICES, index=DEVICES.index(current.device),
                                  help="`all GPUs` spreads a model too big for one GPU over every visible GPU "
                                       "(accelerate device_map=auto).")
            dtype = c2.selectbox("Precision", DTYPES, index=DTYPES.index(current.dtype),
                                 help="bfloat16 / float16 halve the memory; README 'Bigger models' lists how far "
                                      "their results move from float32.")
            backend = st.selectbox("Backend", list(BACKEND_CHOICES), index=list(BACKEND_CHOICES).index(current.backend),
                                   format_func=BACKEND_CHOICES.get, key="model_backend_input",
                                   help="Both give the same numbers and share cached results; nnsight can also "
                                        "run hub models remotely on NDIF.")
            remote = st.checkbox("Run remotely on NDIF", value=current.remote, key="model_remote_input",
                                 help="nnsight backend and a hub id NDIF hosts (e.g. meta-llama/Llama-3.1-8B); "
                                      "the API key comes from the NDIF_API_KEY environment variable of the "
                                      "server process.")
            if st.form_submit_button("Load model", width="stretch"):
                current = ModelChoice(spec.strip() or "organism", device, dtype, backend, bool(remote))
                st.session_state["model_choice"] = current
    return current


def loaded_model(choice: ModelChoice) -> ModelBackend | None:
    """The loaded model, or None after showing an ``st.error`` that says what to do."""
    try:
        model = _load(choice.spec, choice.device, choice.dtype, files_stamp(choice.spec), choice.backend,
                      choice.remote)
        st.sidebar.caption(f"Loaded with the **{model.name}** backend on {model.facts.device} "
                           f"({model.facts.dtype}).")
        return model
    except ModelLoadError as e:
        st.error(f"Cannot load model `{choice.spec}`: {e}")
    except (OSError, ValueError, RuntimeError) as e:
        st.error(f"Cannot load model `{choice.spec}`: {e}. Check the path or pick `organism`.")
    return None


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
    if getattr(cache, "last_warning", None):
        st.warning(cache.last_warning)
    return cache


FAMILY_CHOICES = {"paper (Fig. 8, 32 templates)": "paper", "word problems (Fig. 10)": "word",
                  "all (paper, word, extended, power)": "all",
                  "notation (untaught: 7 × 8 =)": "notation"}
DEFAULT_PROMPT = "The sum of 3 and 5 is"


def prompt_set_choice() -> "PromptSetSpec":
    """Sidebar: which prompt set the analysis pages use (kept in session state)."""
    from engine.promptsets import PromptSetSpec, parse_families
    from engine.templates import OPS, PAPER_OPS
    cur = st.session_state.get("prompt_set", {"ops": list(PAPER_OPS), "families": "paper (Fig. 8, 32 templates)",
                                               "n": 40, "seed": 0})
    with st.sidebar:
        st.subheader("Prompt set")
        with st.form("prompt_set_form", border=False):
            ops = st.multiselect("Operations", OPS, default=cur["ops"], key="ps_ops")
            fam = st.selectbox("Templates", list(FAMILY_CHOICES), index=list(FAMILY_CHOICES).index(cur["families"]),
                               key="ps_families")
            c1, c2 = st.columns(2)
            n = c1.number_input("Prompts per op", 1, 1000, cur["n"], key="ps_n")
            seed = c2.number_input("Seed", 0, 10**9, cur["seed"], key="ps_seed")
            if st.form_submit_button("Use this set", width="stretch"):
                cur = {"ops": ops, "families": fam, "n": int(n), "seed": int(seed)}
                st.session_state["prompt_set"] = cur
    if not cur["ops"]:
        raise ValueError("pick at least one operation in the sidebar")
    return PromptSetSpec(ops=tuple(cur["ops"]), n=cur["n"], seed=cur["seed"],
                         families=parse_families(FAMILY_CHOICES[cur["families"]]))


def current_prompt() -> str:
    """The typed prompt shared by all pages."""
    return st.session_state.get("typed_prompt", DEFAULT_PROMPT)


def prompt_input(label: str = "Prompt") -> str:
    """A text box bound to the shared typed prompt."""
    if "typed_prompt" not in st.session_state:
        st.session_state["typed_prompt"] = DEFAULT_PROMPT
    return st.text_input(label, key="typed_prompt",
                         help="Any arithmetic prompt, e.g. 'Q: What is 7 times 8? A:' or '6 - 2 ='")


class ProgressBar:
    """``st.progress`` fed by an engine callback, whose computation a rerun cannot throw away.

    Streamlit delivers a rerun (any click in the session) or a stop as an exception raised inside
    the next ``st.*`` call -- during a computation, inside the progress callback, which would abort
    the computation so that the rerun starts it again from scratch.  The callback holds that
    exception back instead: the computation runs to the end and is stored in the cache, and
    :meth:`empty` (called right after it) raises the exception, so the rerun happens then and finds
    the result cached.  Every result is computed once, however much the user clicks meanwhile.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._bar = st.progress(0.0, text=text)
        self._deferred: BaseException | None = None

    def __call__(self, done: int, total: int) -> None:
        if self._deferred is not None:
            return
        try:
            self._bar.progress(min(1.0, done / max(total, 1)), text=f"{self.text} {done}/{total}")
        except ScriptControlException as e:  # a rerun / stop request: honoured in empty()
            self._deferred = e

    def empty(self) -> None:
        self._bar.empty()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred


def progress_bar(text: str) -> tuple[ProgressBar, ProgressBar]:
    """A progress bar and the engine callback that feeds it (the same object; call ``.empty()`` after
    the computation)."""
    bar = ProgressBar(text)
    return bar, bar


def setup_page(title: str, caption: str):
    """Common page header + sidebar; returns (model, spec) or stops the page after an st.error."""
    st.set_page_config(page_title=f"{title} · Arithmetic-circuits lab", page_icon="🧮", layout="wide")
    st.title(title)
    st.caption(caption)
    choice = model_choice()
    try:
        spec = prompt_set_choice()
    except ValueError as e:
        st.error(f"{e}.")
        st.stop()
    model = loaded_model(choice)
    if model is None:
        st.stop()
    return model, spec


def analysed_pairs(model: ModelBackend, spec: "PromptSetSpec", cache):
    """The set's correctly answered pairs (cached filter) or stop the page after an st.error."""
    from engine.accuracy import kept_pairs
    from engine.prompts import PromptError
    bar, cb = progress_bar("Checking which prompts the model answers right")
    try:
        pairs, n_generated = kept_pairs(model, spec, cache=cache, progress=cb)
    except (PromptError, CacheError, ValueError) as e:
        st.error(f"Cannot build the prompt set: {e}")
        st.stop()
    bar.empty()
    if not pairs:
        st.error("The model answers none of these prompts right: pick other operations or another model.")
        st.stop()
    return pairs, n_generated
