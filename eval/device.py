"""The device a measurement runs on: chosen from a command-line name, or required to be an NVIDIA GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from recipe.errors import ConfigError, exit_on_config_error


def pick_device(name: str) -> torch.device:
    """`name`, the value of `--device`, as a device: "auto" is cuda when torch sees a GPU, else cpu; ConfigError
    naming it when it is neither the CPU nor a CUDA device this machine has (torch would fail later, in a
    traceback)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device={name!r}: use auto, cpu, cuda or cuda:<index>")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device={name!r}, but {no_cuda()}; use --device cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"--device={name!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def no_cuda() -> str:
    """Why torch sees no CUDA GPU, with torch's version."""
    why = "torch was built without CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
    return f"{why} (torch {torch.__version__})"


def require_cuda(hint: str = "") -> None:
    """Exit with code 2 and one line on stderr, naming the script (and `hint`), when torch sees no CUDA GPU:
    the entry check of the scripts that only run on an NVIDIA GPU, one line instead of a torch traceback (under
    torchrun, rank 0's line heads torchrun's summary, as train.py's do: `recipe.errors.exit_on_config_error`)."""
    if torch.cuda.is_available():
        return
    with exit_on_config_error():
        raise ConfigError(f"{Path(sys.argv[0]).name} needs an NVIDIA GPU with CUDA; {no_cuda()}"
                          + (f"; {hint}" if hint else ""))
