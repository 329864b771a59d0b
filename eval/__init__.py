"""Evaluation and measurement: held-out loss, NIAH, the causality audit, throughput, the single-layer benchmark,
GPU and context-parallel parity, the study reports and the Hugging Face export of trained checkpoints."""
