"""Arithmetic-circuits lab engine: prompts, models, techniques (no Streamlit here)."""
