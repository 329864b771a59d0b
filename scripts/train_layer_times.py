"""train.py, timing every transformer block's forward and backward on every step (`eval.benchmarks.layer_times`): the
rank that logs metrics writes them to `<dump_folder>/layer_times.json`. `scripts/cp_throughput.py
--layer-times` runs it in place of train.py; it takes train.py's arguments.

    python scripts/train_layer_times.py --job.config_file configs/debug.toml --training.steps 3 \
        --checkpoint.no-enable --job.dump_folder outputs/layer_times
"""
import os

from eval.benchmarks.layer_times import LayerTimedTrainer
from recipe.launch import one_process_env
from recipe.train.trainer import main

if __name__ == "__main__":
    os.environ.update(one_process_env(os.environ))  # a plain `python` start is a one-process job, as for train.py
    main(trainer_cls=LayerTimedTrainer)
