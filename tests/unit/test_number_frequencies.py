"""The Fourier view's control (engine.techniques.numbers.number_frequencies): whole numbers counted in the math sets'
questions, decimals and digit groups not split into smaller numbers; and the shipped sets' own spectrum has the
periods a spectrum of embeddings would be praised for."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.techniques import numbers as N


def test_whole_numbers_are_counted_and_parts_of_numbers_are_not(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    rows = [{"question": "Tom has 3 apples and 12 pears; 3.5 kg cost $1,000 in 2 days\u2028and 3 hours."},
            {"question": "No numbers here."}]
    (tmp_path / "gsm8k" / "test.normalized.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts, read = N.number_frequencies(20, tmp_path)
    assert read == 2
    assert counts.tolist() == [0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]


def test_no_data_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="frequency baseline needs the math sets"):
        N.number_frequencies(10, tmp_path)


def test_the_text_frequency_spectrum_of_the_shipped_sets_peaks_at_numbers_ending_in_0_and_5():
    counts, read = N.number_frequencies(100)
    assert read > 5000
    rows = N.spectrum(np.log1p(counts)[:, None], N.FREQUENCY_SPACE)
    share = {round(r.period, 3): r.share for r in rows}
    assert share[10.0] > np.median(list(share.values())) and share[2.0] > np.median(list(share.values()))
