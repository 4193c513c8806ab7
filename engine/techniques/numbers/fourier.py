"""The Fourier view of the number tokens (Zhou et al., 2024): the DFT of their embeddings and unembeddings,
beside that of the numbers' frequency in text.

**2. Fourier view.**  The numbers 0..99 when each is one token of its own under the answer-token rule,
else the digits 0..9 (else a ValueError: no number tokens).  E[n] is the number token's embedding
(``hook_embed``) and U[n] = W_U[:, token(n)] its unembedding, n = 0..N-1.  The DFT over the number
axis, F[k] = Σ_n E[n] e^{-2πikn/N} (a vector of d_model complex numbers, numpy.fft.fft along n), gives
magnitude(k) = ||F[k]||₂ for k = 1..N//2 (period N/k), and share(k) = magnitude(k)² / Σ_{k'=1..N//2}
magnitude(k')².  The three k with the largest magnitude are marked ``dominant``.  The control (space ``text
frequency``): the same spectrum of log(1 + count[n]), count[n] = how often n is written as a whole number in the
questions of GSM8K, SVAMP, AddSub and SingleEq (``../shared/data``) -- periods 2, 5, 10 appear in the frequency of
numbers in text itself, so a peak the embedding shares with it proves nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.prompts.pairs import PromptError, PromptPair, answer_tokens
from engine.techniques.numbers.activations import METHOD, VERSION

N_DOMINANT = 3


# ---------------------------------------------------------------------------------------------
# 2. Fourier view of the number tokens
# ---------------------------------------------------------------------------------------------

def number_range(backend: ModelBackend, prompt: str) -> tuple[list[int], list[int]]:
    """(numbers, their token ids): 0..99 when each is a single token of its own, else 0..9; ValueError if neither."""
    for upto in (99, 9):
        ids = []
        for n in range(upto + 1):
            try:
                t = answer_tokens(backend.tokenizer, prompt, n)
            except PromptError:
                break
            if len(t.answer_ids) != 1:
                break
            ids.append(t.answer_id)
        if len(ids) == upto + 1 and len(set(ids)) == len(ids):
            return list(range(upto + 1)), ids
    raise ValueError("this model's tokenizer has no single tokens for the digits 0-9: the Fourier view needs "
                     "number tokens (pick another model)")


@torch.no_grad()
def number_vectors(backend: ModelBackend, token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """{"embedding": E [N, d], "unembedding": U [N, d]} of the number tokens."""
    _, c = backend.run_with_cache(torch.tensor(list(token_ids))[:, None], None, [hooks.embed()])
    E = c[hooks.embed()][:, 0].double().cpu().numpy()
    W_U, _ = backend.unembed()
    U = W_U[:, list(token_ids)].T.double().cpu().numpy()
    return {"embedding": E, "unembedding": U}


@dataclass(frozen=True)
class SpectrumRow:
    space: str        # embedding | unembedding
    k: int            # frequency (cycles over the N numbers)
    period: float     # N / k
    dominant: bool    # among the N_DOMINANT largest magnitudes
    magnitude: float  # ||F[k]||₂
    share: float      # magnitude² / Σ_k' magnitude²  (k' = 1..N//2)


def spectrum(V: np.ndarray, space: str) -> list[SpectrumRow]:
    """The DFT magnitudes of V [N, d] along the number axis (module docstring, 2)."""
    N = V.shape[0]
    F = np.fft.fft(V, axis=0)  # [N, d]
    ks = np.arange(1, N // 2 + 1)
    mag = np.linalg.norm(F[ks], axis=1)
    energy = float((mag ** 2).sum())
    top = set(ks[np.argsort(-mag, kind="stable")[:N_DOMINANT]].tolist())
    return [SpectrumRow(space, int(k), N / int(k), int(k) in top, float(m), float(m * m / energy) if energy else 0.0)
            for k, m in zip(ks, mag)]


#: The math sets whose question texts give each number's frequency in text (the Fourier view's control).
FREQUENCY_SETS = ("gsm8k", "svamp", "addsub", "singleeq")
FREQUENCY_SPACE = "text frequency"
_WHOLE_NUMBER = re.compile(r"(?<![\d.,])\d+(?![\d]|[.,]\d)")


def number_frequencies(N: int, data_dir: Path | None = None) -> tuple[np.ndarray, int]:
    """How often each integer 0..N-1 is written as a whole number (not part of a longer number or a decimal) in the
    questions of :data:`FREQUENCY_SETS` (every ``*.normalized.jsonl`` split in ``../shared/data``); (counts [N],
    questions read).  ValueError when none can be read."""
    import json

    from engine.paths import default_data_dir
    root = data_dir or default_data_dir()
    counts = np.zeros(N)
    read = 0
    for name in FREQUENCY_SETS:
        for path in sorted((root / name).glob("*.normalized.jsonl")):
            with open(path, encoding="utf-8") as f:  # lines end at "\n" only (questions hold U+2028)
                for line in f:
                    if not line.strip():
                        continue
                    read += 1
                    for m in _WHOLE_NUMBER.findall(json.loads(line).get("question", "")):
                        if int(m) < N:
                            counts[int(m)] += 1
    if not read:
        raise ValueError(f"no question texts under {root} ({', '.join(FREQUENCY_SETS)}): the frequency baseline "
                         f"needs the math sets (set ARITHLAB_DATA)")
    return counts, read


def number_spectrum(backend: ModelBackend, pairs: Sequence[PromptPair]) -> list[SpectrumRow]:
    """The spectra of the number tokens' embeddings and unembeddings, and of log(1 + their frequency in text): a
    period the text's own frequencies have (numbers ending in 0 or 5 are written more often) shows in any vector
    that encodes frequency, so a spectral peak alone proves no Fourier feature."""
    if not pairs:
        raise ValueError("no prompt pairs")
    numbers, ids = number_range(backend, pairs[0].ref_text)
    vecs = number_vectors(backend, ids)
    counts, _ = number_frequencies(len(numbers))
    return (spectrum(vecs["embedding"], "embedding") + spectrum(vecs["unembedding"], "unembedding")
            + spectrum(np.log1p(counts)[:, None], FREQUENCY_SPACE))


def cached_number_spectrum(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None
                           ) -> tuple[list[SpectrumRow], bool]:
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "n_dominant": N_DOMINANT,
              "frequency": {"sets": list(FREQUENCY_SETS), "v": 1}}
    rows, _, computed = run_cached_rows(backend, pairs, METHOD + "_spectrum", params,
                                        lambda: (number_spectrum(backend, pairs), None), SpectrumRow,
                                        ("magnitude", "share"), cache)
    return rows, computed


def dominant_periods(rows: Sequence[SpectrumRow], space: str) -> list[float]:
    mine = sorted((r for r in rows if r.space == space and r.dominant), key=lambda r: -r.magnitude)
    return [round(r.period, 3) for r in mine]
