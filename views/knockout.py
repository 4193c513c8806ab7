"""The Knockout page's chart of the typed prompt: its answer as the top-k heads are knocked out, k = 0..K."""

from __future__ import annotations

import altair as alt
import pandas as pd

from views.charts import PALETTE, display_token, fmt_prob, stretched

HOLDS, BREAKS = "the answer is the top token", "another token is the top token"


def prompt_knockout_chart(df: pd.DataFrame) -> alt.Chart:
    """P(answer) on the typed prompt per k (bars), coloured by whether the answer is still the top token, each bar
    labelled with the top token.  ``df`` columns: k, head, p_answer, top_token, answer_top1."""
    df = df.assign(shown=[f"{k}" if not h else f"{k} (+{h})" for k, h in zip(df["k"], df["head"])],
                   top=[display_token(t) for t in df["top_token"]], p=[fmt_prob(p) for p in df["p_answer"]],
                   status=[HOLDS if t else BREAKS for t in df["answer_top1"]])
    base = alt.Chart(df).encode(
        x=alt.X("shown:N", sort=list(df["shown"]), title="k: the top-k heads knocked out (+ the head added)",
                axis=alt.Axis(labelAngle=0 if len(df) <= 8 else -40, labelOverlap=False, labelLimit=0)),
        tooltip=[alt.Tooltip("k:Q"), alt.Tooltip("head:N", title="head added"),
                 alt.Tooltip("p_answer:Q", title="P(answer)", format=".3g"), alt.Tooltip("top:N", title="top token")])
    bars = base.mark_bar().encode(
        y=alt.Y("p_answer:Q", title="P(answer) on your prompt", scale=alt.Scale(domain=[0, 1.15]),  # room for labels
                axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])),
        color=alt.Color("status:N", scale=alt.Scale(domain=[HOLDS, BREAKS], range=[PALETTE[1], PALETTE[0]]),
                        legend=alt.Legend(orient="bottom", title=None, labelLimit=0)))
    text = base.mark_text(dy=-8).encode(y="p_answer:Q", text="top:N")
    return stretched((bars + text).properties(height=260))


def prompt_knockout_sentence(df: pd.DataFrame, text: str, answer: str) -> str:
    """The sentence of :func:`prompt_knockout_chart`, from its frame: up to which k the typed prompt ``text`` keeps
    its answer ``answer`` (shown as a reader sees it) as the top token, and which k breaks it."""
    rows = df.sort_values("k").to_dict("records")
    broken = next((r for r in rows if not r["answer_top1"]), None)
    if broken is None:
        last = rows[-1]
        return (f"Your prompt `{text}` keeps its answer `{answer}` as the top token with up to the top {last['k']} "
                f"heads knocked out (P(answer) {fmt_prob(last['p_answer'])} then).")
    if broken["k"] == 0:
        return (f"The model does not answer your prompt `{text}` with `{answer}` even with nothing knocked out "
                f"(its top token is `{display_token(broken['top_token'])}`).")
    held = rows[broken["k"] - 1]
    return (f"Your prompt `{text}` keeps its answer `{answer}` as the top token up to the top {held['k']} heads "
            f"knocked out (P(answer) {fmt_prob(held['p_answer'])}); the top {broken['k']} (adding head "
            f"{broken['head']}) break it: the top token becomes `{display_token(broken['top_token'])}` (P(answer) "
            f"{fmt_prob(broken['p_answer'])}).")
