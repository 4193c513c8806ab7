"""Numerics the techniques share: bootstrap intervals over prompt pairs, batched logistic probes."""
