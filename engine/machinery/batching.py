"""Padding and batching, shared by every technique, the benchmark evaluation, fine-tuning and the
organism's training (:func:`pad_batch` is the one padding routine).

Prompts are right-padded; a technique reads the END position (the last real token, where the
model must emit the answer) through the returned END index.  Generation and scoring of
continuations left-pad instead (``left=True``), so every row's last real token is the last column.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import torch

from engine.prompts.pairs import PromptPair


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, *, left: bool = False,
              labels: Sequence[Sequence[int]] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Token ids [b, pos] padded with ``pad_id``, attention mask [b, pos] (1 on real tokens) and, when
    ``labels`` (one list per sequence, at most as long) are given, labels [b, pos] with -100 on padding.
    Right-padded unless ``left``."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [batch, pos]
    lab = None if labels is None else torch.full((len(seqs), width), -100, dtype=torch.long)  # [batch, pos]
    for i, s in enumerate(seqs):
        if not len(s):
            continue
        start = width - len(s) if left else 0
        ids[i, start:start + len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, start:start + len(s)] = 1
        if lab is not None and len(labels[i]):
            lab[i, start:start + len(labels[i])] = torch.tensor(list(labels[i]), dtype=torch.long)
    return ids, mask, lab


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [b, pos], mask [b, pos], END index [b]."""
    ids, mask, _ = pad_batch(seqs, pad_id)
    return ids, mask, torch.tensor([len(s) - 1 for s in seqs])


def tokenizer_pad_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id, else 0 (padded positions are masked anyway)."""
    for cand in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if cand is not None:
            return int(cand)
    return 0


def pad_id(backend) -> int:
    """:func:`tokenizer_pad_id` of a backend's tokenizer."""
    return tokenizer_pad_id(backend.tokenizer)


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


@dataclass(frozen=True)
class PairBatch:
    """One batch of prompt pairs, right-padded; X_r and X_c share the mask and END index (same lengths)."""

    pairs: list[PromptPair]
    ref: torch.Tensor     # [P, pos]  X_r ids
    cf: torch.Tensor      # [P, pos]  X_c ids
    mask: torch.Tensor    # [P, pos]
    end: torch.Tensor     # [P]       index of the last real token
    answer: torch.Tensor  # [P]       answer token ids (CPU)
    index: torch.Tensor   # [P]       each row's place among the pairs as given (see :func:`in_pair_order`)

    @property
    def rows(self) -> torch.Tensor:
        return torch.arange(len(self.pairs))

    def end_rows(self, t: torch.Tensor) -> torch.Tensor:
        """The END position of every row.  # [P, pos, ...] -> [P, ...]"""
        return t[self.rows.to(t.device), self.end.to(t.device)]


def pair_batches(backend, pairs: Sequence[PromptPair], batch_size: int) -> list[PairBatch]:
    """``pairs`` checked (see :func:`check_pairs`) and cut into padded batches of at most ``batch_size`` prompts
    of similar length (:func:`length_batches`: the least padding for the calls; each batch is a pass on X_r and
    one on X_c).  Per-pair results go back into the pairs' order with :func:`in_pair_order`."""
    check_pairs(pairs, backend.facts.vocab_size)
    pid = pad_id(backend)
    out = []
    for idx in length_batches([len(p.ref_ids) for p in pairs], batch_size, 2 * call_tokens(backend.facts)):
        chunk = [pairs[i] for i in idx]
        ref, mask, end = pad([p.ref_ids for p in chunk], pid)
        cf, _, _ = pad([p.cf_ids for p in chunk], pid)
        out.append(PairBatch(chunk, ref, cf, mask, end, torch.tensor([p.answer_id for p in chunk]),
                             torch.tensor(idx, dtype=torch.long)))
    return out


def in_pair_order(index: Sequence[torch.Tensor], parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-batch results ``parts`` ([P_b, ...] each, in batch order) as one tensor [P, ...] in the pairs' order
    (``index``: each batch's :attr:`PairBatch.index`)."""
    x = torch.cat(list(parts))
    out = torch.empty_like(x)
    out[torch.cat(list(index))] = x
    return out


#: cached positions x rows of one batched pass (END-only logits): knockouts, head -> head rows and
#: layer x position cells all fill their passes up to this many token positions
TOKENS_PER_PASS = 4096


#: a forward call's fixed cost (hook dispatch, per layer), in multiply-accumulates: on 2 CPU cores a hooked
#: TransformerBridge call of SmolLM2-135M on 1 x 6 tokens takes about 95 ms, as long as about 55 more positions
#: in a batch (1.6 ms each), i.e. 2e8 multiply-accumulates per layer of its 30 (see docs/benchmarks.md)
CALL_MACS_PER_LAYER = 2e8


def call_tokens(facts) -> float:
    """A forward call's fixed cost in token positions of the model's blocks (:data:`CALL_MACS_PER_LAYER`)."""
    from engine.backends.base import macs_per_position
    return facts.n_layers * CALL_MACS_PER_LAYER / max(1.0, macs_per_position(facts)[0])


def length_batches(lengths: Sequence[int], max_rows: int, call_cost: float = 0.0) -> list[list[int]]:
    """Indices of sequences of ``lengths`` in right-padded batches of at most ``max_rows``, chosen to cost least:
    a batch costs the positions it runs (rows x its longest sequence, padding included) plus ``call_cost``
    positions for the call (:func:`call_tokens`).  Sorted by length, the best cut into consecutive runs is found
    by dynamic programming over the first j sequences (O(n x max_rows)); the batches come shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n, rows = len(order), max(1, max_rows)
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # the j shortest sequences, the last batch ending at the j-th
        width = lengths[order[j - 1]]
        for i in range(max(0, j - rows), j):
            cost = best[i] + (j - i) * width + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    out, j = [], n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


def length_chunks(pairs: Sequence[PromptPair], tokens_per_pass: int) -> list[list[int]]:
    """Indices of ``pairs`` in chunks of equal prompt length (so no padding), each chunk at most
    ``tokens_per_pass`` tokens (one prompt at least)."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(pairs):
        by_len[len(p.ref_ids)].append(i)
    out = []
    for length, idx in sorted(by_len.items()):
        cap = max(1, tokens_per_pass // max(length, 1))
        out += [idx[j:j + cap] for j in range(0, len(idx), cap)]
    return out
