"""Experiments built on the training job: sweeps, pay-off grids, the paper configs and the study corpus."""
