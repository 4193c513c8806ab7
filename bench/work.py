"""Counting a benchmark's work in forward-equivalents (shared by ``bench/sweeps.py`` and ``bench/path_patching.py``).

Forward-equivalent (FE): one batched forward pass of the prompt set (right-padded, full logits) = 1.  The work of
every forward call is *counted* (positions through the blocks, positions through the final norm + unembedding,
MLP-branch rows of the exact END chains; a continued prefix: its positions, then the new positions after it) by
wrapping the backend's methods, and weighted by multiply-accumulates per position from the model's shape
(:func:`engine.backends.base.macs_per_position`); attention scores are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.backends.base import macs_per_position


@dataclass
class Counter:
    """Counts the work of every forward call and END chain of one backend (wrapping its methods)."""

    body: int = 0
    unembed: int = 0
    mlp_rows: int = 0
    calls: int = 0
    log: list = field(default_factory=list)

    def attach(self, backend) -> None:
        logits, rwc, mlp = backend.logits, backend.run_with_cache, backend.mlp_branch

        def count(ids, out):
            self.calls += 1
            self.body += int(ids.numel())
            self.unembed += int(out.shape[:-1].numel())

        def logits_w(ids, mask=None):
            out = logits(ids, mask)
            count(ids, out)
            return out

        def rwc_w(ids, mask, names):
            out = rwc(ids, mask, names)
            count(ids, out[0])
            return out

        def mlp_w(layer, x):
            self.mlp_rows += int(x.shape[0])
            return mlp(layer, x)
        backend.logits, backend.run_with_cache, backend.mlp_branch = logits_w, rwc_w, mlp_w
        if backend.continues:  # a prefix's keys and values, and the positions continuing them
            prefix, cont = backend.prefix, backend.continue_end_logits

            def count_last(ids):  # every position through the blocks, the last one (where allowed) unembedded
                self.calls += 1
                self.body += int(ids.numel())
                self.unembed += int(ids.shape[0]) if backend.end_rows_ok() else int(ids.numel())

            def prefix_w(ids):
                count_last(ids)
                return prefix(ids)

            def cont_w(pre, rows, ids, **kw):
                count_last(ids)
                return cont(pre, rows, ids, **kw)
            backend.prefix, backend.continue_end_logits = prefix_w, cont_w
            from engine.backends.base import ModelBackend
            if type(backend).prefix_with_cache_at is not ModelBackend.prefix_with_cache_at:  # its own one pass
                with_acts = backend.prefix_with_cache_at

                def with_acts_w(ids, names, positions):
                    count_last(ids)
                    return with_acts(ids, names, positions)
                backend.prefix_with_cache_at = with_acts_w

    def snapshot(self) -> tuple[int, int, int, int]:
        return self.body, self.unembed, self.mlp_rows, self.calls


def fe(facts, unit_tokens: int, body: float, unembed: float, mlp_rows: float = 0) -> float:
    """Forward-equivalents of counted work; ``unit_tokens`` = positions of one padded pass of the set."""
    c_body, c_unembed, c_mlp = macs_per_position(facts)
    return (body * c_body + unembed * c_unembed + mlp_rows * c_mlp) / (unit_tokens * (c_body + c_unembed))


def print_table(title: str, first: str, rows, width: int = 24) -> None:
    """``title``, then a Markdown table of (name, seconds, forward-equivalents) rows, ``first`` heading the names."""
    print(f"\n{title}")
    print(f"| {first:<{width}} | {'seconds':>8} | {'forward-equivalents':>19} |")
    print(f"| {'-' * width} | {'-' * 8}: | {'-' * 19}: |")
    for key, s, f in rows:
        print(f"| {key:<{width}} | {s:8.1f} | {f:19.1f} |")
