"""Kernel tests on a machine without CUDA run through Triton's interpreter (set before kernels import)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
