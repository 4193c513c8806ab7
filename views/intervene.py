"""The Intervene page's chart: the next-token distribution at END before and after an intervention."""

from __future__ import annotations

import functools
import json

import altair as alt
import pandas as pd

from views.charts import PALETTE, display_token, fmt_prob, stretched

BEFORE, AFTER = "before", "after"


def distribution_frame(before: list, after: list) -> pd.DataFrame:
    """One row per (token, when) for the tokens of either top list (``TokenProb``-like: token, token_id, prob);
    a token in one list only has its probability there and NaN in the other (not among that top k)."""
    ids = list(dict.fromkeys([t.token_id for t in before] + [t.token_id for t in after]))
    name = {t.token_id: display_token(t.token) for t in [*before, *after]}
    rows = []
    for when, top in ((BEFORE, before), (AFTER, after)):
        p = {t.token_id: t.prob for t in top}
        rows += [{"token": name[i], "token_id": i, "when": when, "prob": p.get(i, float("nan")),
                  "label": fmt_prob(p[i]) if i in p else "not in top", "order": n} for n, i in enumerate(ids)]
    return pd.DataFrame(rows)


def distribution_chart() -> alt.Chart:
    """P(token) before and after, side by side per token (the union of both top lists, before's order first: the
    rows' ``order``), without its rows (:func:`live_spec`)."""
    base = alt.Chart().encode(
        x=alt.X("token:N", sort=alt.EncodingSortField("order", op="min"),
                title="next token (the top tokens before and after)",
                axis=alt.Axis(labelAngle=0, labelLimit=0)),
        xOffset=alt.XOffset("when:N", sort=[BEFORE, AFTER]),
        tooltip=[alt.Tooltip("token:N"), alt.Tooltip("when:N"), alt.Tooltip("label:N", title="probability")])
    bars = base.mark_bar().encode(
        y=alt.Y("prob:Q", title="probability at END", scale=alt.Scale(domain=[0, 1.1]),
                axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])),
        color=alt.Color("when:N", scale=alt.Scale(domain=[BEFORE, AFTER], range=[PALETTE[1], PALETTE[0]]),
                        legend=alt.Legend(orient="bottom", title=None)))
    text = base.mark_text(dy=-8, fontSize=10).encode(y="prob:Q", text="label:N")
    return stretched((bars + text).properties(height=260))


def live_spec() -> dict:
    """The chart as a Vega-Lite spec without rows, shown with ``st.vega_lite_chart(distribution_frame(...), spec)``:
    one spec whatever the tokens (their order is a column), so that a slider's step sends new rows and the browser
    redraws the bars in place (an Altair chart carries its rows in its spec, and a new spec is a new chart to build:
    about 250 ms more per step in Chromium).  Built once (Altair's ~20 ms), a fresh copy each call."""
    return json.loads(_live_spec_json())


@functools.cache
def _live_spec_json() -> str:
    spec = distribution_chart().to_dict()
    spec.pop("datasets", None)  # Altair's stand-in for the missing data, in each layer too
    for layer in spec.get("layer", []):
        layer.pop("data", None)
    return json.dumps(spec)
