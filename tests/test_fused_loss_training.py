"""`[loss] implementation = "fused"` trains as the full loss does: the same losses, validation (Lighthouse and
dense-shadow, bits per byte) and gradient accumulation in one process, with FSDP on two gloo ranks, and compiled
with full activation checkpointing at CP=2; a fused job resumes bit-exactly; "auto" keeps the byte model on the
full loss; and held-out scoring through the fused output layer gives the full loss's nats."""
from __future__ import annotations

import pytest
import torch

from eval.checkpoint import build_model, logits_function, parse_job_config
from eval.metrics.heldout import token_losses
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.train.loss import full_logits_gib, uses_fused_loss

from .helpers import torchrun, train_in_one_process

RELATIVE_TOLERANCE = 1e-5
COMMON = ["--job.config_file", "configs/debug.toml", "--lighthouse.topk", "64", "--checkpoint.enable",
          "--checkpoint.interval", "100", "--metrics.log_freq", "1"]
VALIDATION = ["--validation.enable", "--validation.dataset", "synthetic", "--validation.freq", "2",
              "--validation.steps", "1", "--validation.seq_len", "512"]
FUSED, FULL = ["--loss.implementation", "fused", "--loss.chunk_tokens", "100"], ["--loss.implementation", "full"]
# Two microbatches of one sequence per step: gradient accumulation.
ACCUMULATE = ["--training.local_batch_size", "1", "--training.global_batch_size", "2"]
FSDP2 = ["--parallelism.data_parallel_shard_degree", "2", "--training.local_batch_size", "1"]
CP2 = ["--parallelism.context_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1",
       "--compile.enable", "--compile.backend", "aot_eager", "--activation_checkpoint.mode", "full"]


def metrics(folder, key: str) -> list[float]:
    return [r[key] for r in read_metrics(str(folder / METRICS_FILE)) if key in r]


LOSS = "loss_metrics/global_avg_loss"
SHADOW = ("validation/lighthouse_loss", "validation/dense_loss", "validation/lighthouse_bits_per_byte",
          "validation/dense_bits_per_byte")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """From one seed checkpoint: one-process runs (full, fused, both with gradient accumulation, and the fused run
    stopped at step 2 and resumed), then FSDP on two ranks (full and fused) and a compiled CP=2 fused run."""
    root = tmp_path_factory.mktemp("fused")
    seed = [*COMMON, "--training.steps", "3", "--job.dump_folder", str(root / "seed"),
            "--checkpoint.create_seed_checkpoint"]
    load = ["--checkpoint.initial_load_path", str(root / "seed" / "checkpoint" / "step-0")]
    steps = lambda n: ["--training.steps", str(n), "--lr_scheduler.total_steps", "3"]  # noqa: E731
    one = {"full": [*FULL, *VALIDATION, *steps(3)], "fused": [*FUSED, *VALIDATION, *steps(3)],
           "full_accumulated": [*FULL, *ACCUMULATE, *steps(2)], "fused_accumulated": [*FUSED, *ACCUMULATE, *steps(2)],
           "fused_resumed": [*FUSED, *VALIDATION, *steps(2)]}
    argvs = [seed] + [[*COMMON, *load, "--job.dump_folder", str(root / name), *extra] for name, extra in one.items()]
    argvs.append([*COMMON, *load, "--job.dump_folder", str(root / "fused_resumed"), *FUSED, *VALIDATION, *steps(3)])
    out = train_in_one_process(argvs)
    assert out.returncode == 0, out.stderr[-4000:]
    one_process_log = out.stdout + out.stderr
    launches = {"fsdp_full": [*FULL, *FSDP2], "fsdp_fused": [*FUSED, *FSDP2], "cp2_fused": [*FUSED, *CP2]}
    for name, extra in launches.items():
        out = torchrun(2, ["train.py", *COMMON, *load, *steps(2), "--job.dump_folder", str(root / name), *extra])
        assert out.returncode == 0, f"{name}: " + out.stderr[-4000:]
    return root, one_process_log + out.stdout + out.stderr


@pytest.mark.slow
def test_the_fused_loss_trains_and_validates_as_the_full_loss(runs):
    root, _ = runs
    assert metrics(root / "fused", LOSS) == pytest.approx(metrics(root / "full", LOSS), rel=RELATIVE_TOLERANCE)
    assert len(metrics(root / "fused", LOSS)) == 3
    for key in SHADOW:
        assert metrics(root / "fused", key) == pytest.approx(metrics(root / "full", key), rel=RELATIVE_TOLERANCE), key
        assert len(metrics(root / "fused", key)) == 2  # steps 2 and 3
    assert metrics(root / "fused_accumulated", LOSS) == pytest.approx(metrics(root / "full_accumulated", LOSS),
                                                                      rel=RELATIVE_TOLERANCE)


@pytest.mark.slow
def test_a_fused_job_resumes_bit_exactly(runs):
    root, _ = runs
    assert metrics(root / "fused_resumed", LOSS) == metrics(root / "fused", LOSS)
    assert metrics(root / "fused_resumed", SHADOW[1]) == metrics(root / "fused", SHADOW[1])


@pytest.mark.slow
def test_fsdp_and_compiled_context_parallel_give_the_one_process_losses(runs):
    """FSDP's two ranks read other batches than one process: they are compared with FSDP on the full loss. CP=2
    (compiled, full activation checkpointing) shards one sequence: it gives the one-process fused losses."""
    root, log = runs
    assert metrics(root / "fsdp_fused", LOSS) == pytest.approx(metrics(root / "fsdp_full", LOSS),
                                                               rel=RELATIVE_TOLERANCE)
    assert len(metrics(root / "fsdp_fused", LOSS)) == 2
    assert metrics(root / "cp2_fused", LOSS) == pytest.approx(metrics(root / "fused", LOSS)[:2], rel=RELATIVE_TOLERANCE)
    assert "[loss] fused output loss (implementation='fused'" in log
    assert "[loss] full logits (implementation='full'" in log


def test_auto_keeps_the_byte_model_on_the_full_loss_and_fuses_a_large_vocabulary():
    job = parse_job_config(["--job.config_file", "configs/debug.toml"])
    assert job.loss.implementation == "auto"
    assert not uses_fused_loss(job, 1_048_576, 258)  # the byte model at 1M tokens: 1.0 GiB of logits
    assert uses_fused_loss(job, 98_304, 128_256) and full_logits_gib(98_304, 128_256) == pytest.approx(46.97, abs=0.01)
    job.parallelism.tensor_parallel_degree = 2
    assert not uses_fused_loss(job, 98_304, 128_256)  # tensor parallelism shards the output layer: full loss


def test_heldout_scoring_through_the_fused_output_layer_gives_the_full_nats():
    torch.manual_seed(0)
    fused = parse_job_config(["--job.config_file", "configs/debug.toml", "--lighthouse.no-enable", *FUSED])
    full = parse_job_config(["--job.config_file", "configs/debug.toml", "--lighthouse.no-enable", *FULL])
    model = build_model(fused, torch.device("cpu"))
    windows = torch.randint(0, 256, (2, 130))
    nats = token_losses(logits_function(model, fused, torch.device("cpu")), windows[:, :-1], windows[:, 1:])
    ref = token_losses(logits_function(model, full, torch.device("cpu")), windows[:, :-1], windows[:, 1:])
    assert nats.shape == (2, 129)
    assert nats == pytest.approx(ref, rel=RELATIVE_TOLERANCE)
    scorer = logits_function(model, fused, torch.device("cpu"))
    assert torch.allclose(scorer.last_logits(windows), scorer(windows)[:, -1], rtol=1e-5, atol=1e-6)
