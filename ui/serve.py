"""Start the dashboard: ``python -m ui.serve app.py [streamlit run options]`` (``make run`` and the tests use it).

Streamlit treats an app with a ``pages/`` folder beside its main script as a legacy (v1) multipage app
until some run calls ``st.navigation``: a session whose first visit is a page's URL then runs that page's
script without the router (app.py), and sessions starting at the same moment can see the mode switch
under them.  The lab's router is ``st.navigation``, so the switch is set before the server exists; no
session ever runs in the legacy mode.  (``ui.session`` keeps a fallback for a plain ``streamlit run``.)
"""

from __future__ import annotations

import sys


def main() -> None:
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    from engine.models.load import preload
    PagesManager.uses_pages_directory = False  # what st.navigation sets; read when each session starts
    preload()  # transformers' classes resolved here, not by two sessions' threads at once
    sys.argv = ["streamlit", "run", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
