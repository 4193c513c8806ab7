"""AppTest of the Paper page: one row per finding of the paper, each with the lab's number or the reason
there is none; a second model gives Fig. 12 on one colour scale; a bad second model is an st.error."""

from __future__ import annotations

from engine.models.spec import ORGANISM_DIR
from tests.app.conftest import errors, page


def _table(at):
    return at.table[0].value.reset_index()  # a static table (every cell wrapped in full), indexed by the finding


def asked(at):
    """The page computes its findings when asked (engine.cost: more than HEAVY_S on a cold cache): press its button."""
    go = [b for b in at.button if b.key == "paper_go"]
    return go[0].click().run() if go else at


def n_kept(at) -> int:
    """The pairs the page analyses, from its own caption of the set (\"N of M prompts ... right\")."""
    import re
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    return int(re.search(r"(\d+) of \d+ prompt", text).group(1))


def test_every_finding_has_a_number_or_a_reason():
    at = asked(page("2_Paper.py", n=8).run())
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    df = _table(at)
    assert list(df["finding"]) == ["Fig. 2 / 15", "Fig. 3", "Fig. 5", "Fig. 6 / 13 / 14", "MIB", "Fig. 7",
                                   "Table 3", "Table 4", "Fig. 12", "Tables 1 / 2 / 5"]
    for _, row in df.iterrows():
        assert row["this model"] != "–" or row["verdict"].endswith("not computed"), row.to_dict()
        assert row["how judged"], row.to_dict()
    # each number says how many pairs its interval rests on, and whether they are few
    from engine.numerics.intervals import SMALL_SET
    n = n_kept(at)
    for finding in ("Fig. 2 / 15", "Fig. 3", "Fig. 5", "Fig. 6 / 13 / 14", "MIB"):
        rests = df.loc[df["finding"] == finding, "rests on"].item()
        assert rests.startswith(f"{n} pairs") and ("few" in rests) == (n < SMALL_SET), (finding, rests)


def test_a_small_set_is_said_plainly():
    """Four pairs: the rows say they rest on few pairs; the page says how the set was picked and how to get more."""
    at = asked(page("2_Paper.py", n=1).run())
    assert not at.exception, at.exception
    df = _table(at)
    rests = df.loc[df["finding"] == "Fig. 3", "rests on"].item()
    assert rests.startswith("4 pairs (few"), rests
    text = " ".join(c.value for c in at.caption)
    assert "4 of 4 prompts answered right (a balanced sample of 1 per operation" in text
    assert "every prompt answered right" in text
    # the total is the problems', not how many of them the model answers right (that is known only once computed)
    assert "keeps every one of the " in text and " problems the model answers right" in text, text
    assert "keeps all of the" not in text and "the model gets right" not in text, text
    # Table 3: the bundled model answers too few exponentiation prompts (one): one parenthesis says why and where
    # fine-tuning teaches it, and the count's noun agrees with it
    power = df.loc[df["finding"] == "Table 3", "how judged"].item()
    assert power.count("(") == 1 and power.endswith("are needed; fine-tuning can teach it on the Improve page)"), power
    assert "Improve page can teach it" not in power and " 1 exponentiation prompts" not in power, power
    # the bundled model does the paper's templates: the circuit rows are computed
    computed = df[df["this model"] != "–"]["finding"].tolist()
    assert {"Fig. 2 / 15", "Fig. 3", "Fig. 5", "Fig. 6 / 13 / 14", "MIB"} <= set(computed), computed
    fig12 = df.loc[df["finding"] == "Fig. 12", "how judged"].item()
    assert fig12 == "no second model was given to compare (type a second model above)"


def test_second_model_fills_fig_12_and_a_bad_one_is_an_error():
    at = asked(page("2_Paper.py", n=8).run())
    asked(at.text_input(key="paper_second_input").set_value(str(ORGANISM_DIR)).run())
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    df = _table(at)
    assert df.loc[df["finding"] == "Fig. 12", "this model"].item().startswith(str(ORGANISM_DIR))
    assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) == 2
    at.text_input(key="paper_second_input").set_value("/no/such/model").run()
    assert not at.exception, at.exception
    assert any("Cannot load model" in e for e in errors(at)), errors(at)
