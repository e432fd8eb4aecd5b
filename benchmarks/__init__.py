"""Benchmark scripts and the models they share (not part of the wheel)."""
