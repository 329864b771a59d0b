"""Metrics of trained checkpoints: held-out loss, NIAH, the causality audit and probe, loss anatomy, and
the command-line plumbing their scripts share."""
