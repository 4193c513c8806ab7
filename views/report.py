"""The report as one self-contained HTML file: Vega-Lite charts embedded with their data, offline.

The charts are the dashboard's own (``views.charts``, ``views.circuit_charts``); the Vega, Vega-Lite and
vega-embed libraries are inlined (``vl-convert-python``'s bundle), so the file opens in a browser
with no network.  ``chart_images`` writes each chart as SVG and PNG as well.  No Streamlit here:
the CLI (``python -m engine report``) and the pages both use it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import altair as alt
import pandas as pd

from engine.findings.report import Report
from engine.techniques.circuit import Diagram
from views.charts import component_frame, grouped_bars, heatmap, lines_with_band, with_notes
from views.circuit_charts import lens_lines
from views.circuit_diagram import diagram_chart


def charts(rep: Report) -> dict[str, tuple[str, alt.TopLevelMixin]]:
    """name -> (caption, chart) of every chart of the report."""
    out: dict[str, tuple[str, alt.TopLevelMixin]] = {}
    L, H = rep.model["n_layers"], rep.model["n_heads"]
    grid = component_frame([(r["component"], r["layer"], r["head"], r.get("effect", float("nan")))
                            for r in rep.patching], L, H)
    grid = with_notes(grid, {p["component"]: p["note"] for p in rep.pins})  # pinned cells outlined, notes in tooltips
    out["patching"] = ("Path patching: relative change of the answer logit when one head's (or MLP's) output at the "
                       "last position comes from the counterfactual prompt, every other head frozen. Red = key head.",
                       heatmap(grid, "effect").properties(width=560))
    if rep.roles:
        df = pd.DataFrame(rep.roles).assign(head_name=lambda d: d["layer"].astype(str) + "." + d["head"].astype(str))
        out["roles"] = ("The top heads' last-token attention by token role, averaged over the prompt set.",
                        grouped_bars(df, "role", "value", "head_name", "attention mass").properties(width=560))
    if rep.projections:
        df = pd.DataFrame(rep.projections)
        df["lo"], df["hi"] = df["value"] - df["std"], df["value"] + df["std"]
        out["projections"] = ("MLP projections (Fig. 6): cosine of each layer's MLP input with W_U of the operands, "
                              "and of its contribution with W_U of the answer and of other numbers (± sd).",
                              lines_with_band(df, "layer", "value", "lo", "hi", "metric", "cosine", main="cos_out_C")
                              .properties(width=560))
    if rep.lens:
        out["lens"] = ("Logit lens: the answer's probability and median rank at the last token after each layer.",
                       lens_lines(pd.DataFrame(rep.lens)).properties(width=560))
    if rep.knockout:
        df = pd.DataFrame(rep.knockout)
        long = pd.concat([
            pd.DataFrame({"k": df["k"], "accuracy": df["top_accuracy"], "lo": df["top_accuracy"],
                          "hi": df["top_accuracy"], "knocked out": "top-k heads (by effect)"}),
            pd.DataFrame({"k": df["k"], "accuracy": df["random_mean"], "lo": df["random_min"], "hi": df["random_max"],
                          "knocked out": "k random heads (mean, min-max)"})])
        out["knockout"] = ("Knockout (Fig. 3): accuracy after mean-ablating the top-k heads vs k random heads.",
                           lines_with_band(long, "k", "accuracy", "lo", "hi", "knocked out", "accuracy",
                                           main="top-k heads (by effect)").properties(width=560))
    if rep.circuit:
        out["circuit"] = ("The circuit (Fig. 1): operand and operator tokens -> key heads -> MLPs -> the answer; node "
                          "effect = its path-patching cell, edge width = attention share or |effect|.",
                          diagram_chart(Diagram.from_json(rep.circuit)))
    return out


def _table(rows: list[dict], fmt: str = "{:.4g}") -> str:
    if not rows:
        return "<p><em>none</em></p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f"<td>{html.escape(fmt.format(r[c]) if isinstance(r[c], float) else str(r[c]))}</td>" for c in cols) + "</tr>"
        for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts(d: dict, fmt: str = "{:.4g}") -> str:
    """One record (the model's facts, the prompt set, the versions) as a two-column table, one row per field: it
    fits the page however many fields it has."""
    def value(v) -> str:
        if isinstance(v, float):
            return fmt.format(v)
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td style='text-align:left'>{html.escape(value(v))}</td></tr>"
                   for k, v in d.items())
    return f"<table class='facts'><tbody>{body}</tbody></table>"


def paper_table(rows: list[dict]) -> str:
    """The paper's findings (``PaperFinding.to_json`` rows) as an HTML table: holds / does not hold /
    inconclusive (the interval straddles the criterion) / why not."""
    return _table([{"finding": f"{r['figure']}: {r['claim']}", "paper": r["paper"],
                    "this model": r["lab"] or "-", "verdict": r["verdict"], "how judged": r["note"]}
                   for r in rows]).replace("<td>", "<td style='text-align:left'>")


def render_html(rep: Report) -> str:
    """The whole report as one HTML string (libraries inlined: opens offline)."""
    import vl_convert
    from altair.utils.html import vl_version_for_vl_convert
    bundle = vl_convert.javascript_bundle(vl_version=vl_version_for_vl_convert())
    parts, scripts = [], []
    for i, (name, (caption, chart)) in enumerate(charts(rep).items()):
        parts.append(f'<section><h2>{html.escape(name.capitalize() if name != "lens" else "Logit lens")}</h2>'
                     f'<p class="cap">{html.escape(caption)}</p><div id="chart{i}" class="chart"></div></section>')
        spec = json.dumps(chart.to_dict()).replace("<", "\\u003c")  # no tag of a note ends or opens the script
        scripts.append(f'vegaEmbed("#chart{i}", {spec}, {{"mode": "vega-lite", "renderer": "svg"}})'
                       f'.catch(e => {{ document.getElementById("chart{i}").innerText = "chart error: " + e; }});')
    facts = {k: rep.model[k] for k in ("spec", "architecture", "n_layers", "n_heads", "n_kv_heads", "d_model",
                                       "n_params", "dtype", "fingerprint") if k in rep.model}
    meta = (f"<h2>Model</h2>{_facts(facts)}<h2>Prompt set</h2>{_facts(rep.prompt_set)}"
            f"<h2>Kept prompts per operation</h2>{_table(rep.accuracy)}"
            f"<h2>Top heads</h2>{_table(rep.top_heads)}"
            + (f"<h2>Your pins and notes</h2>{_table(rep.pins)}" if rep.pins else "")  # escaped: plain text
            + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in rep.notes))
    versions = _facts(rep.versions)
    found = [f for f in rep.summary if f.get("computed")]
    if found:
        meta = ("<h2>Circuit summary</h2><ul>" + "".join(
            f"<li><b>{html.escape(f['step'][:1].upper() + f['step'][1:])}.</b> {html.escape(f['text'])}</li>"
            for f in found) + "</ul>" + meta)
    if rep.paper:
        meta = f"<h2>The paper's findings on this model</h2>{paper_table(rep.paper)}" + meta
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(rep.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f3f3f3; }} .cap {{ color: #555; }} .note {{ color: #a15c00; }}
table.facts th {{ text-align: left; font-weight: normal; }}
section {{ margin-bottom: 2em; }}
</style>
<script type="text/javascript">{bundle}</script></head>
<body><h1>{html.escape(rep.title)}</h1>
<p class="cap">Zhang et al., ICML 2024, <em>Interpreting and Improving Large Language Models in Arithmetic
Calculation</em>, reproduced by the arithmetic-circuits lab on {html.escape(rep.created)}.
Every chart below holds its data; this file needs no network.</p>
{meta}
{''.join(parts)}
<h2>Versions</h2>{versions}
<script type="text/javascript">{''.join(scripts)}</script>
</body></html>
"""


def chart_images(rep: Report, out_dir: Path) -> list[Path]:
    """Each chart of the report as ``<name>.svg`` and ``<name>.png`` in ``out_dir``."""
    import vl_convert
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (_, chart) in charts(rep).items():
        spec = chart.to_dict()
        svg = out_dir / f"{name}.svg"
        svg.write_text(vl_convert.vegalite_to_svg(spec))
        png = out_dir / f"{name}.png"
        png.write_bytes(vl_convert.vegalite_to_png(spec, scale=2))
        paths += [svg, png]
    return paths
