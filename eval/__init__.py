"""Evaluations of trained checkpoints."""
