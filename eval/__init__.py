"""Evaluation and measurement: `metrics` of trained checkpoints, `benchmarks` and parity checks, `studies` (the
reports); the modules at this level load checkpoints and write records for all three.

It imports `recipe` first, which installs the CPU compatibility layer before any of its modules reaches torchtitan.
"""
import recipe  # noqa: F401
