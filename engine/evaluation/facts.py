"""Control facts for real models: does fine-tuning on arithmetic make a model forget what it knew?

MMLU and CommonsenseQA sit at chance for a 135M model, so they cannot show a loss of generic
ability there.  Two finer probes (``bench/improve.py``):

* **facts** -- short factual completions ("The capital of France is" -> " Paris"), scored by the
  first token of the answer (greedy, END row); only the facts the *base* model gets right count,
  and the score of a tuned model is the share of those it still gets right;
* **text loss** -- the mean next-token cross-entropy on a held-out sample of general text
  (:func:`text_loss`).
"""

from __future__ import annotations

from typing import Sequence

#: (prompt, answer): common knowledge, one word answers; the answer follows the prompt after a space.
FACTS: tuple[tuple[str, str], ...] = (
    ("The capital of France is", "Paris"), ("The capital of Germany is", "Berlin"),
    ("The capital of Italy is", "Rome"), ("The capital of Spain is", "Madrid"),
    ("The capital of Japan is", "Tokyo"), ("The capital of Russia is", "Moscow"),
    ("The capital of England is", "London"), ("The capital of Egypt is", "Cairo"),
    ("The capital of China is", "Beijing"), ("The capital of Greece is", "Athens"),
    ("The capital of Canada is", "Ottawa"), ("The capital of Portugal is", "Lisbon"),
    ("The largest planet in the solar system is", "Jupiter"), ("The closest star to the Earth is the", "Sun"),
    ("Water is made of hydrogen and", "oxygen"), ("The chemical symbol for gold is", "Au"),
    ("The opposite of hot is", "cold"), ("The opposite of up is", "down"),
    ("The opposite of day is", "night"), ("The opposite of black is", "white"),
    ("The color of the sky on a clear day is", "blue"), ("The color of grass is", "green"),
    ("Snow is usually the color", "white"), ("Bananas are usually the color", "yellow"),
    ("The first day of the week is", "Monday"), ("The month after January is", "February"),
    ("The month after June is", "July"), ("The season after winter is", "spring"),
    ("A baby cat is called a", "kitten"), ("A baby dog is called a", "puppy"),
    ("Bees make", "honey"), ("Cows give us", "milk"),
    ("The Eiffel Tower is in", "Paris"), ("The Great Wall is in", "China"),
    ("The author of Romeo and Juliet is William", "Shakespeare"), ("The theory of relativity was developed by Albert",
                                                                     "Einstein"),
    ("The people of France speak", "French"), ("The people of Germany speak", "German"),
    ("The people of Spain speak", "Spanish"), ("The people of Italy speak", "Italian"),
    ("Ice is frozen", "water"), ("We breathe in", "oxygen"),
    ("The Statue of Liberty is in New", "York"), ("The longest river in Africa is the", "Nile"),
)


def fact_hits(model, facts: Sequence[tuple[str, str]] = FACTS, batch_size: int = 32) -> list[bool]:
    """Is the argmax at END the answer's first token, per fact (a backend)?"""
    from engine.evaluation.evaluate import last_logits

    tok = model.tokenizer
    enc = [tok(p)["input_ids"] for p, _ in facts]
    first = [tok(f"{p} {a}")["input_ids"][len(e)] for e, (p, a) in zip(enc, facts)]  # the answer's first token
    return [int(t) == f for t, f in zip(last_logits(model, enc, batch_size).argmax(-1).tolist(), first)]


def text_loss(model, texts: Sequence[str], batch_size: int = 8, max_tokens: int = 256) -> float:
    """Mean next-token cross-entropy (nats per token) of ``texts``, each cut to ``max_tokens``."""
    import torch
    import torch.nn.functional as F

    from engine.machinery.batching import pad_batch, tokenizer_pad_id

    tok = model.tokenizer
    pad = tokenizer_pad_id(tok)
    total, count = 0.0, 0
    for i in range(0, len(texts), batch_size):
        enc = [tok(t)["input_ids"][:max_tokens] for t in texts[i:i + batch_size]]
        ids, mask, labels = pad_batch(enc, pad, labels=enc)
        with torch.no_grad():
            logits = model.logits(ids, mask).float()  # [batch, pos, vocab]
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100,
                               reduction="sum")
        total += float(loss)
        count += int((labels[:, 1:] != -100).sum())
    return total / max(count, 1)


__all__ = ["FACTS", "fact_hits", "text_loss"]
