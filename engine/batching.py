"""Padding and batching of prompt pairs, shared by every technique.

Prompts are right-padded; a technique reads the END position (the last real token, where the
model must emit the answer) through the returned END index.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.prompts import PromptPair


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [b, pos], mask [b, pos], END index [b]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask, torch.tensor([len(s) - 1 for s in seqs])


def pad_id(backend) -> int:
    """The tokenizer's pad id, else its EOS id, else 0 (padded positions are masked anyway)."""
    tok = backend.tokenizer
    for cand in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None)):
        if cand is not None:
            return int(cand)
    return 0


def check_pairs(pairs: Sequence[PromptPair], vocab: int) -> None:
    """ValueError unless there are pairs, X_r and X_c align, and every answer id is in the vocabulary."""
    if not pairs:
        raise ValueError("no prompt pairs: generate a prompt set first")
    for p in pairs:
        if len(p.ref_ids) != len(p.cf_ids):
            raise ValueError(f"X_r and X_c differ in length for {p.ref_text!r}")
        if not 0 <= p.answer_id < vocab:
            raise ValueError(f"answer id {p.answer_id} outside the vocabulary of {vocab}")


def batches(n: int, size: int) -> list[range]:
    """Index ranges of consecutive batches of at most ``size``."""
    return [range(i, min(i + size, n)) for i in range(0, n, size)]
