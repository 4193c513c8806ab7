"""Run dashboard pages with Streamlit's AppTest in a separate process and print what they show.

Used by the reliability suite where the test process cannot create the condition itself: file
permissions, which root ignores, apply to this process when it is started without
CAP_DAC_OVERRIDE (``setpriv``, see ``conftest.unprivileged``).

    python page_runner.py '[{"page": "app.py", "cache": "/tmp/x.duckdb", "model": null,
                             "prompt_set": {...}}, ...]'

prints one JSON line: per scenario the page's exception, error, warning, info and caption texts
and its number of charts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(scenario: dict) -> dict:
    from streamlit.testing.v1 import AppTest

    os.environ["ARITHLAB_CACHE"] = scenario["cache"]
    page = scenario["page"]
    at = AppTest.from_file(str(REPO / page if page == "app.py" else REPO / "pages" / page), default_timeout=300)
    at.session_state["prompt_set"] = scenario["prompt_set"]
    if scenario.get("model"):
        from ui.session import ModelChoice
        at.session_state["model_choice"] = ModelChoice(spec=scenario["model"])
    at.run()
    out = {kind: [str(e.value) for e in getattr(at, kind)]
           for kind in ("exception", "error", "warning", "info", "caption")}
    out["charts"] = len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))
    return out


def main() -> None:
    results = [run(s) for s in json.loads(sys.argv[1])]
    sys.stdout.flush()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
