"""Evaluation and measurement: `metrics` of trained checkpoints, `benchmarks` and parity checks, `studies` (the
reports); the modules at this level load checkpoints and write records for all three."""
