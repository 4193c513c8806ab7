"""AppTest of the Compare page: A (operator removed) vs B (operand A changed) on one set -- two heatmaps on one
scale, their difference with the cells whose interval excludes 0 counted, the top-k overlap; a kind B cannot use
on the set is an st.error in the page's words."""

from __future__ import annotations

import re

from tests.app.conftest import errors, page


def _charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def test_operator_removed_vs_operand_a():
    at = page("17_Compare.py", n=8).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert _charts(at) == 3
    md = " ".join(m.value for m in at.markdown)
    m = re.search(r"(\d+) of (\d+) cells differ", md)
    assert m and int(m.group(2)) == 8 * 9 and 0 < int(m.group(1)) < int(m.group(2)), md
    assert any(re.match(r"Top 5 heads: \d of 5 shared", s.value) for s in at.subheader)


def test_a_kind_the_set_cannot_use_is_an_error():
    at = page("17_Compare.py", n=8).run()
    at.selectbox(key="cmp_kind").set_value("carry").run()
    assert not at.exception and any("B cannot use carry flipped on this set" in e for e in errors(at)), errors(at)
