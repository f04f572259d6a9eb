"""Bounded recomputes over the streaming code: scheduled interval recompute, replay, late-data correction."""
