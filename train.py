"""Train Llama-3 with Lighthouse attention on torchtitan.

    torchrun --nproc_per_node=8 --local-ranks-filter 0 train.py \\
        --job.config_file configs/paper/stage1_L3_p2_k1536_dilated.toml
    python train.py --job.config_file configs/debug.toml   # one process, CPU or GPU

CLI flags override the TOML file (`--training.steps 100`, `--lighthouse.topk 2048`, ...); `--help` lists them.
A configuration mistake ends in one line and exit code 2 (`LIGHTHOUSE_DEBUG=1`: with its traceback); Ctrl-C and
SIGTERM, from the first line on, in one line and exit code 130 and 143.
"""
import os
import sys

from recipe.errors import exit_on_config_error, speaks_for_the_job
from recipe.resilience.held_signals import hold_signals
from recipe.train.cpu_size import check_cpu_size_at_once
from recipe.train.hf_at_once import check_hf_shape_at_once

if __name__ == "__main__":  # before the heavy imports: a signal during them is acted on once the settings are read
    hold_signals(sigterm=speaks_for_the_job())  # under torchrun, SIGTERM stops another rank at once, as before
    with exit_on_config_error():  # a GPU-sized job on a CPU, or weights of another shape, end at once, not after
        check_cpu_size_at_once(sys.argv[1:])  # 20 s of imports
        check_hf_shape_at_once(sys.argv[1:])

from recipe.launch import one_process_env  # noqa: E402
from recipe.train.trainer import main  # noqa: E402

if __name__ == "__main__":
    os.environ.update(one_process_env(os.environ))  # a plain `python train.py` is a one-process job
    try:
        main()
    except BrokenPipeError:  # the reader of stdout left early (`train.py --help | head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail too
        sys.exit(1)
    finally:
        hold_signals(sigterm=speaks_for_the_job())  # the job has ended with its line: a signal now changes nothing
