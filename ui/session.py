"""Model and prompt-set choice held in ``st.session_state`` and shared by every page."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from cache import CacheError, ResultCache
from engine.models import LoadedModel, ModelLoadError, load_model

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelChoice:
    spec: str = "organism"
    device: str = "auto"
    dtype: str = "float32"


@st.cache_resource(show_spinner="Loading the model ...", max_entries=3)
def _load(spec: str, device: str, dtype: str) -> LoadedModel:
    # st.cache_resource is used for the model only; results live in the DuckDB cache.
    return load_model(spec, device=None if device == "auto" else device, dtype=dtype)


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
            device = c1.selectbox("Device", DEVICES, index=DEVICES.index(current.device))
            dtype = c2.selectbox("Precision", DTYPES, index=DTYPES.index(current.dtype))
            if st.form_submit_button("Load model", width="stretch"):
                current = ModelChoice(spec.strip() or "organism", device, dtype)
                st.session_state["model_choice"] = current
    return current


def loaded_model(choice: ModelChoice) -> LoadedModel | None:
    """The loaded model, or None after showing an ``st.error`` that says what to do."""
    try:
        return _load(choice.spec, choice.device, choice.dtype)
    except ModelLoadError as e:
        st.error(f"Cannot load model `{choice.spec}`: {e}")
    except (OSError, ValueError, RuntimeError) as e:
        st.error(f"Cannot load model `{choice.spec}`: {e}. Check the path or pick `organism`.")
    return None


def result_cache() -> ResultCache | None:
    """The DuckDB result cache, or None (after an ``st.warning``) when it cannot be opened."""
    try:
        cache = ResultCache()
    except CacheError as e:
        st.warning(f"The result cache is unavailable ({e}); results are computed without caching.")
        return None
    if getattr(cache, "last_warning", None):
        st.warning(cache.last_warning)
    return cache
