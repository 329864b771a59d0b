"""The device a measurement runs on: chosen from a command-line name, or required to be an NVIDIA GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from recipe.errors import ConfigError, exit_on_config_error


def pick_device(name: str) -> torch.device:
    """`name` as a device; "auto" is cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def require_cuda(hint: str = "") -> None:
    """Exit with code 2 and one line on stderr, naming the script (and `hint`), when torch sees no CUDA GPU:
    the entry check of the scripts that only run on an NVIDIA GPU, one line instead of a torch traceback (under
    torchrun, rank 0's line heads torchrun's summary, as train.py's do: `recipe.errors.exit_on_config_error`)."""
    if torch.cuda.is_available():
        return
    why = "torch was built without CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
    with exit_on_config_error():
        raise ConfigError(f"{Path(sys.argv[0]).name} needs an NVIDIA GPU with CUDA; {why} (torch {torch.__version__})"
                          + (f"; {hint}" if hint else ""))
