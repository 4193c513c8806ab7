"""Read what a page's charts actually draw, from the browser: Vega's SVG scenegraph of every Altair chart.

Streamlit draws an Altair chart with Vega's SVG renderer (under 2,000 data points per mark): every axis label,
title, legend entry and text mark is an SVG ``<text>`` in the page, and a label that Vega hides because it would
overlap its neighbour is kept with ``opacity="0"``.  Each axis group carries Vega's ARIA description, which names
its scale and, for a discrete one, how many categories it has ("X-axis titled 'layer' for a discrete scale with 8
values: ...").  :func:`read_charts` collects, per chart on the page:

* every discrete axis: its ARIA description, the number of categories it states, and each tick label's text,
  opacity and box;
* every drawn text (labels, titles, legends, text marks) whose box leaves the chart's own drawing (``svg.marks``:
  the browser clips what lies outside it) by more than ``SLACK_PX`` -- a cut title;
* texts truncated by Vega's ``labelLimit`` (they end in "…");
* the chart's right edge against the page's main column (a panel run off the page);
* the number of data items its marks draw (an empty chart draws its axes and nothing else);
* the texts its text marks draw (values on bars, node labels): none may lie on another (the same text in the
  same box twice is one: a halo drawn under a note);
* legend symbols drawn with no paint (a line piece with no stroke: the Numbers page's dash legends once showed
  "probe" and "shuffled labels" with nothing beside them).

:func:`chart_problems` turns that into sentences, one per defect; an empty list is a legible chart.
"""

from __future__ import annotations

import re

#: a text box may pass the drawing's edge by this much (font ascent and descent round up the glyph box)
SLACK_PX = 4

READ_JS = r"""
(slack) => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  const mr = main ? main.getBoundingClientRect() : null;
  const box = (e) => { const b = e.getBoundingClientRect();
                       return {l: b.left, r: b.right, t: b.top, b: b.bottom, w: b.width, h: b.height}; };
  const shown = (t) => t.getAttribute('opacity') !== '0' && t.textContent.trim() !== '';
  const out = [];
  document.querySelectorAll('[data-testid="stVegaLiteChart"]').forEach((c, i) => {
    if (c.offsetParent === null) return;              // in a hidden tab or a collapsed expander
    const svg = c.querySelector('svg.marks');
    if (!svg) { out.push({i, drawn: false}); return; }
    const r = box(svg);
    const axes = [...svg.querySelectorAll('g.role-axis')].map(ax => ({
      aria: ax.getAttribute('aria-label') || '',
      labels: [...ax.querySelectorAll('g.role-axis-label text')].map(t => ({
        text: t.textContent, hidden: t.getAttribute('opacity') === '0', box: box(t)})),
    })).filter(a => a.aria.includes('discrete scale'));
    const texts = [...svg.querySelectorAll('text')].filter(shown);
    const outside = texts.map(t => { const b = box(t);
        return [t.textContent, Math.min(b.l - r.l, r.r - b.r, b.t - r.t, r.b - b.b)]; })
      .filter(([_, d]) => d < -slack).map(([t, d]) => `${t} (${Math.round(-d)} px outside)`);
    const cut = texts.filter(t => t.textContent.endsWith('…')).map(t => t.textContent);
    const marks = [...svg.querySelectorAll('g.role-mark')]
      .filter(g => !g.closest('.role-axis, .role-legend, .role-title'));
    const items = marks.reduce((s, g) => s + [...g.children]
      .filter(e => e.tagName !== 'g' || e.children.length).length, 0);
    const legends = [...svg.querySelectorAll('g.role-legend-label text')].filter(shown).map(t => t.textContent);
    const marks_text = [...svg.querySelectorAll('g.mark-text.role-mark text')]
      .filter(t => shown(t) && !t.closest('.role-axis, .role-legend, .role-title'))
      .map(t => ({text: t.textContent, box: box(t)}));
    const paint = (v) => v && v !== 'none' && v !== 'transparent' && !/rgba\(.*,\s*0\)$/.test(v);
    const unseen = [...svg.querySelectorAll('g.role-legend-symbol path')].filter(p => {
        const st = getComputedStyle(p), stroked = paint(st.stroke) && parseFloat(st.strokeWidth) > 0;
        const line = /^M[^A-Za-z]*L[^A-Za-z]*$/.test(p.getAttribute('d') || '');  // a line piece: no area to fill
        return +st.opacity === 0 || !(stroked || (!line && paint(st.fill))); })
      .map(p => { let e = p.parentNode; while (e && e !== svg && !e.querySelector('text')) e = e.parentNode;
                  const t = e ? e.querySelector('text') : null; return t ? t.textContent : '?'; });
    out.push({i, drawn: true, width: r.w, height: r.h, axes, outside, cut, items, legends, marks_text, unseen,
              past_page: mr ? r.r - mr.r : 0});
  });
  return out;
}
"""

_COUNT = re.compile(r"discrete scale with (\d+) values?")


def read_charts(page) -> list[dict]:
    """Every visible chart of ``page`` (a Playwright page whose run has finished), as :data:`READ_JS` reads it."""
    return page.evaluate(READ_JS, SLACK_PX)


def _overlap(a: dict, b: dict) -> bool:
    return min(a["r"], b["r"]) - max(a["l"], b["l"]) > 1 and min(a["b"], b["b"]) - max(a["t"], b["t"]) > 1


def _one_text(a: dict, b: dict) -> bool:
    """The same text drawn twice in one place (a white halo under a note, then the note) reads as one text."""
    return a["text"] == b["text"] and all(abs(a["box"][k] - b["box"][k]) <= 1 for k in ("l", "r", "t", "b"))


def axis_problems(axis: dict) -> list[str]:
    """A discrete axis must draw one readable label per category: none hidden, none overlapping another."""
    name = axis["aria"].split(" for ")[0]
    labels = axis["labels"]
    out = []
    m = _COUNT.search(axis["aria"])
    if m and int(m.group(1)) != len(labels):
        out.append(f"{name}: {len(labels)} labels for {m.group(1)} categories")
    hidden = [x["text"] for x in labels if x["hidden"]]
    if hidden:
        out.append(f"{name}: labels not drawn (hidden by overlap): {', '.join(hidden)}")
    drawn = [x for x in labels if not x["hidden"]]
    clash = [f"{a['text']}/{b['text']}" for i, a in enumerate(drawn) for b in drawn[i + 1:]
             if _overlap(a["box"], b["box"])]
    if clash:
        out.append(f"{name}: labels drawn over each other: {', '.join(clash[:6])}")
    return out


def chart_problems(chart: dict) -> list[str]:
    """Sentences, one per defect of one chart read by :func:`read_charts` (empty: every label drawn, nothing cut)."""
    if not chart["drawn"]:
        return ["the chart has no drawing (no SVG)"]
    out = [p for ax in chart["axes"] for p in axis_problems(ax)]
    if chart["outside"]:
        out.append("text cut at the chart's edge: " + "; ".join(chart["outside"]))
    if chart["cut"]:
        out.append("text truncated: " + "; ".join(chart["cut"]))
    if chart["past_page"] > SLACK_PX:
        out.append(f"the chart runs {chart['past_page']:.0f} px past the page's right edge")
    if chart.get("unseen"):
        out.append("legend symbols not drawn (no stroke or fill): " + ", ".join(chart["unseen"]))
    if chart["items"] == 0:
        out.append("the chart draws no data (axes only)")
    texts = chart["marks_text"]
    clash = [f"{a['text']}/{b['text']}" for i, a in enumerate(texts) for b in texts[i + 1:]
             if _overlap(a["box"], b["box"]) and not _one_text(a, b)]
    if clash:
        out.append(f"texts drawn over each other: {', '.join(clash[:6])}")
    return out
