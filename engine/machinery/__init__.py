"""The intervention machinery every technique stands on: batching pairs, patching rows, the END chain, the
components of a model, the checked shortcut (a fast path that proves itself against the textbook loop)."""
