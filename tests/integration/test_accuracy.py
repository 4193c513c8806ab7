"""The accuracy table and the keep-only-right filter (engine/techniques/accuracy.py), on both backends: the scores
(teacher-forced, END.. positions only) equal a full-logits computation; the filter's own pass (the prompts alone)
keeps what full logits keep, and reads the accuracy table's pass when that ran first."""

from __future__ import annotations

import pytest
import torch

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.machinery.batching import pad, pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.accuracy import score_pairs


@pytest.fixture(scope="module", params=["bridge", "nnsight"])
def organism(request):
    """The bundled model on each backend."""
    return open_model("organism", device="cpu", backend=request.param)


def _padded(backend, seqs):
    ids, mask, _ = pad(seqs, pad_id(backend))
    return ids, mask


def test_accuracy_scores_equal_full_logits(organism):
    ps, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul", "pow"), n=8, seed=11))
    scores = score_pairs(organism, ps)
    ids, mask = _padded(organism, [p.ref_ids + p.answer_ids for p in ps])
    with torch.no_grad():
        full = organism.logits(ids, mask).float()
    for p, s, lg in zip(ps, scores, full):
        end = len(p.ref_ids) - 1
        pred = lg[end:end + len(p.answer_ids) + 1].argmax(-1).tolist()
        assert s.first_ok == (pred[0] == p.answer_id)
        assert s.full_ok == (pred[:len(p.answer_ids)] == p.answer_ids and
                             not any(c.isdigit() for c in organism.tokenizer.convert_ids_to_tokens(pred[-1])))
        assert abs(s.p_answer - torch.softmax(lg[end], -1)[p.answer_id].item()) < 1e-5
    assert any(not s.first_ok for s in scores) and any(s.first_ok for s in scores)


def test_the_first_token_filter_equals_full_logits_without_the_answer(organism):
    """The filter's own pass (the prompts alone, END their last position) keeps what full logits keep."""
    from engine.techniques.accuracy import first_token_right, forget_scores
    ps, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "mul", "pow"), n=8, seed=12))
    forget_scores()  # not read from the memo: the filter's own pass
    organism.meter = WorkMeter()
    right = first_token_right(organism, ps)
    own = organism.meter.body_tokens
    organism.meter = WorkMeter()
    assert right == [s.first_ok for s in score_pairs(organism, ps)]  # the teacher-forced pass agrees
    assert own < organism.meter.body_tokens  # and costs more positions
    assert first_token_right(organism, ps) == right  # now read from the memo
    ids, mask = _padded(organism, [p.ref_ids for p in ps])
    with torch.no_grad():
        full = organism.logits(ids, mask).float()
    assert right == [int(lg[len(p.ref_ids) - 1].argmax()) == p.answer_id for p, lg in zip(ps, full)]
    assert any(right) and not all(right)


def test_filter_reads_the_accuracy_tables_pass(organism):
    """The accuracy table first: the filter of the same set reads its pass.  The filter first: its own pass of the
    prompts alone, fewer positions than the table's teacher-forced one."""
    from engine.techniques.accuracy import accuracy_report, forget_scores, kept_pairs
    spec = PromptSetSpec(ops=("sub",), n=5, seed=99 + len(organism.name))  # the backends share memo entries
    organism.meter = WorkMeter()
    accuracy_report(organism, spec)
    calls, table_tokens = organism.meter.forward_calls, organism.meter.body_tokens
    assert calls >= 1
    kept_pairs(organism, spec)
    assert organism.meter.forward_calls == calls
    forget_scores()
    organism.meter = WorkMeter()
    kept_pairs(organism, spec)
    assert 1 <= organism.meter.forward_calls and organism.meter.body_tokens < table_tokens
