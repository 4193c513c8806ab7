"""Streamlit helpers shared by the pages: model choice, cached model resource, error display.

The only Streamlit code outside ``app.py`` and ``pages/``.  No torch here: the engine does the work.
"""
