"""What the checkpoint manifest costs (`recipe.resilience.checkpoint_manifest`), scaled to the paper model's checkpoint.

    python scripts/checkpoint_checksum_cost.py --fraction 0.125 --folder /tmp/ckpt-cost

Saves `fraction` of the paper model's full checkpoint (267,977,728 float32 parameters, each with AdamW's two
float32 moments: 12 bytes a parameter) with DCP in one process, then times the save, writing its manifest
(CRC-32 of every file) and verifying it as a resume does, and prints each per GiB and scaled to the whole
checkpoint. The files are read back from the page cache (they were just written); a resume on a cold cache
reads them from disk once more, at the disk's speed. In a job of several processes each rank checksums
1/world of the files. The folder is removed at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings

import torch

from eval.options import output_folder
from recipe.resilience.checkpoint_manifest import manifest_faults, read_manifest, write_manifest

PAPER_PARAMETERS = 267_977_728
BYTES_PER_PARAMETER = 12  # float32 weight + AdamW's exp_avg and exp_avg_sq
TENSOR_ELEMENTS = 2**22  # a 16 MiB tensor per entry, about the size of the paper model's weight matrices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fraction", type=float, default=0.125, help="share of the paper checkpoint to write")
    parser.add_argument("--folder", type=output_folder, default="ckpt-cost",
                        help="where to write it (removed at the end)")
    args = parser.parse_args()
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction={args.fraction} must be in (0, 1]")
    folder = str(args.folder)
    if os.path.exists(folder):
        parser.error(f"--folder={folder!r} exists; name a new folder (it is removed at the end)")
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, on purpose

    total = int(PAPER_PARAMETERS * BYTES_PER_PARAMETER * args.fraction)
    state = {f"entry_{i}": torch.randn(TENSOR_ELEMENTS) for i in range(max(1, total // (4 * TENSOR_ELEMENTS)))}
    try:
        begin = time.perf_counter()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
        saved = time.perf_counter() - begin
        size = sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))
        begin = time.perf_counter()
        write_manifest(folder, data_parallel_degree=1)
        written = time.perf_counter() - begin
        begin = time.perf_counter()
        faults = manifest_faults(folder, read_manifest(folder))
        verified = time.perf_counter() - begin
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert not faults, faults
    scale = PAPER_PARAMETERS * BYTES_PER_PARAMETER / size
    print(f"wrote {size / 2**30:.3f} GiB ({args.fraction:g} of the paper checkpoint, "
          f"{PAPER_PARAMETERS * BYTES_PER_PARAMETER / 2**30:.2f} GiB) on {torch.get_num_threads()} thread(s)")
    for name, seconds in (("DCP save", saved), ("manifest (checksums)", written), ("verification", verified)):
        print(f"{name:22s} {seconds:7.3f} s  {size / 2**30 / seconds:6.2f} GiB/s  paper checkpoint, one process: "
              f"{seconds * scale:6.2f} s")


if __name__ == "__main__":
    main()
