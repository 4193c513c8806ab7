"""The glossary (engine/findings/glossary.py): every term the dashboard explains is there, in one or two plain
sentences, found by its name or its other spellings; the Story's screens name only terms it has."""

from __future__ import annotations

import re

import pytest

from engine.findings import glossary

#: the words issue 47 found unexplained, and the brief's list: each must be defined
REQUIRED = ("answer logit", "END", "unembedding", "W_U[C]", "effect", "logit difference", "counterfactual",
            "knockout", "mean ablation", "path patching", "CPR", "CMD", "faithfulness", "bootstrap interval",
            "shuffled head labels", "MLP", "attention head", "residual stream")


@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_word_is_defined(name):
    assert glossary.define(name)


def test_each_definition_is_one_or_two_plain_sentences():
    names = [t.name.lower() for t in glossary.TERMS]
    assert len(names) == len(set(names)), "a term twice"
    spellings = [w.lower() for t in glossary.TERMS for w in (t.name, *t.aliases)]
    assert len(spellings) == len(set(spellings)), "one spelling for two terms"
    for t in glossary.TERMS:
        sentences = [s for s in re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.!?])\s+(?=[A-Z0-9`])", t.plain.strip()) if s]
        assert 1 <= len(sentences) <= 2 and t.plain.endswith("."), (t.name, sentences)
        assert "docs/" not in t.plain and ".py" not in t.plain, t.name  # no file paths for a student


def test_lookup_by_name_or_alias_and_help_text():
    assert glossary.term("the last position") is glossary.term("END")
    assert glossary.term("Mean ablation") is glossary.term("knockout")
    with pytest.raises(KeyError, match="no glossary term 'logits lens'"):
        glossary.term("logits lens")
    text = glossary.help_text("effect", "answer logit", lead="What the heatmap shows.")
    assert text.startswith("What the heatmap shows.\n\n**effect**: ") and "**answer logit**: " in text


def test_words_found_in_a_text():
    found = [t.name for t in glossary.used_in("Path patching changes the answer logit at END; the end of it.")]
    assert found == ["END", "answer logit", "path patching"]  # "end" in lower case is not END


def test_the_story_names_only_glossary_terms():
    from ui.story import WORDS, screen_words, screens
    assert set(WORDS) <= {title for title, _ in screens()}
    for title, _ in screens():
        assert glossary.terms(*screen_words(title)), title  # KeyError for a word the glossary lacks
