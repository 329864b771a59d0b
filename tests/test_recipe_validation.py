"""Dense-shadow validation (recipe/train/validation.py): every `validation.freq` steps the same held-out windows are
scored with Lighthouse and with dense attention on the same weights, and logged beside the training metrics."""
import itertools
import math
from pathlib import Path

import pytest
import torch

from eval.checkpoint import build_model, load_weights, parse_job_config
from eval.metrics.heldout import heldout_windows, mean_loss, token_losses
from recipe.data.loader import PackedDocuments, build_source
from recipe.data.tokenizer import ByteTokenizer, token_bytes
from recipe.experiments.corpus import make_corpus
from recipe.logs.layout import METRICS_FILE, read_metrics
from recipe.train.trainer import check_job
from recipe.train.validation import SYNTHETIC_SEED_OFFSET, check_validation

from .helpers import REPO, torchrun, train_in_one_process

SEQ_LEN, STEPS, BATCH, VAL_STEPS = 256, 4, 2, 2
COMMON = ["--job.config_file", "configs/debug.toml", "--training.seq_len", str(SEQ_LEN), "--training.steps", str(STEPS),
          "--lr_scheduler.warmup_steps", "1", "--metrics.log_freq", "1", "--checkpoint.enable",
          "--checkpoint.interval", "100", "--validation.enable", "--validation.freq", "2",
          "--validation.steps", str(VAL_STEPS), "--validation.seq_len", str(SEQ_LEN),
          "--validation.local_batch_size", str(BATCH)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four debug runs in one process: Lighthouse on local data (held-out files validated), one that switches
    to dense after step 2, dense from scratch, and one whose weights never move (lr 0)."""
    root = tmp_path_factory.mktemp("validation")
    make_corpus([REPO / "lighthouse", REPO / "recipe", REPO / "lighthouse_kernels"], root / "corpus", heldout_every=3)
    data = ["--training.dataset", "local", "--training.dataset_path", str(root / "corpus" / "train" / "*.jsonl"),
            "--validation.dataset", "local", "--validation.dataset_path", str(root / "corpus" / "heldout" / "*.jsonl")]
    jobs = {
        "lighthouse": data,
        "switch": [*data, "--lighthouse.switch_to_dense_at_step", "2"],
        "dense": [*data, "--lighthouse.no-enable"],
        "frozen": ["--validation.dataset", "synthetic", "--optimizer.lr", "0"],
    }
    argvs = [COMMON + ["--job.dump_folder", str(root / name)] + extra for name, extra in jobs.items()]
    out = train_in_one_process(argvs, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return root, out.stdout + out.stderr


def validations(root: Path, name: str) -> list[dict]:
    return [r for r in read_metrics(str(root / name / METRICS_FILE)) if "validation_metrics/loss" in r]


@pytest.mark.slow
def test_lighthouse_run_logs_both_losses_at_step_1_and_every_freq_steps(runs):
    root, log = runs
    records = validations(root, "lighthouse")
    assert [r["step"] for r in records] == [1, 2, 4]
    for r in records:
        assert r["validation/lighthouse_loss"] != r["validation/dense_loss"]
        assert r["validation_metrics/loss"] == r["validation/lighthouse_loss"]
        assert 0 < r["validation/dense_loss"] < 2 * torch.log(torch.tensor(258.0)).item()
    assert "validation  lighthouse_loss:" in log and "dense_loss:" in log


@pytest.mark.slow
def test_after_the_switch_and_without_lighthouse_only_the_dense_loss_is_logged(runs):
    root, _ = runs
    switch = validations(root, "switch")
    assert ["validation/lighthouse_loss" in r for r in switch] == [True, True, False]
    assert all("validation/lighthouse_loss" not in r and "validation/dense_loss" in r
               for r in validations(root, "dense"))
    # up to its switch the switch run is the Lighthouse run, the dense shadow included
    both = ("validation/lighthouse_loss", "validation/dense_loss")
    assert ([[r[k] for k in both] for r in switch[:2]]
            == [[r[k] for k in both] for r in validations(root, "lighthouse")[:2]])


@pytest.mark.slow
def test_every_evaluation_scores_the_same_windows(runs):
    root, _ = runs
    frozen = validations(root, "frozen")
    assert len(frozen) == 3
    assert len({(r["validation/lighthouse_loss"], r["validation/dense_loss"]) for r in frozen}) == 1


@pytest.mark.slow
def test_the_logged_losses_are_the_held_out_losses_of_the_checkpoint(runs):
    root, _ = runs
    job = parse_job_config([*COMMON, "--training.dataset", "local", "--validation.dataset", "synthetic"])
    model = build_model(job, torch.device("cpu"))
    load_weights(model, root / "lighthouse" / "checkpoint" / f"step-{STEPS}")
    windows = heldout_windows(str(root / "corpus" / "heldout" / "*.jsonl"), SEQ_LEN, VAL_STEPS * BATCH)
    last = validations(root, "lighthouse")[-1]
    assert mean_loss(model, windows, BATCH) == pytest.approx(last["validation/lighthouse_loss"], rel=1e-5)
    model.set_lighthouse_enabled(False)
    assert mean_loss(model, windows, BATCH) == pytest.approx(last["validation/dense_loss"], rel=1e-5)


@pytest.mark.parametrize("override, message", [
    (["--validation.dataset", "c4_validation"],
     r"validation.dataset='c4_validation' is not one of \('local', 'synthetic'\)"),
    (["--validation.dataset", "local"], r"validation.dataset = \"local\" needs validation.dataset_path"),
    (["--validation.dataset", "synthetic", "--validation.steps", "-1"], r"validation.steps=-1 must be >= 1"),
])
def test_validation_that_cannot_give_fixed_windows_is_rejected_at_start_up_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        parse_job_config(["--job.config_file", "configs/debug.toml", "--validation.enable", *override])


def test_the_debug_config_validates_offline_out_of_the_box():
    for extra in ([], ["--validation.steps", "2"]):
        job = parse_job_config(["--job.config_file", "configs/debug.toml", "--validation.enable", *extra])
        check_job(job)
        assert job.validation.dataset == "synthetic" and job.validation.seq_len == job.training.seq_len


def test_validation_off_is_not_checked():
    check_validation(parse_job_config(["--job.config_file", "configs/debug.toml", "--validation.dataset", "c4"]))


@pytest.mark.slow
def test_two_data_parallel_ranks_report_the_bits_per_byte_of_both_ranks_windows(tmp_path):
    """Each rank scores its own held-out windows; the logged bits per byte are the nats of both ranks' windows over
    the bytes of both (not one rank's ratio, nor a mean of the two), and the loss the mean over their tokens."""
    job_argv = ["--job.config_file", "configs/debug.toml", "--training.steps", "2", "--lr_scheduler.warmup_steps", "1",
                "--lighthouse.no-enable", "--validation.enable", "--validation.dataset", "synthetic",
                "--validation.freq", "2", "--validation.steps", "1", "--validation.seq_len", str(SEQ_LEN),
                "--validation.local_batch_size", str(BATCH), "--checkpoint.enable", "--checkpoint.interval", "2"]
    out = torchrun(2, ["train.py", *job_argv, "--job.dump_folder", str(tmp_path)])
    assert out.returncode == 0, out.stderr[-4000:]
    logged = validations(tmp_path, "")[-1]

    job = parse_job_config(job_argv)
    model = build_model(job, torch.device("cpu"))
    load_weights(model, tmp_path / "checkpoint" / "step-2")
    tokenizer = ByteTokenizer()
    seed = (job.debug.seed or 0) + SYNTHETIC_SEED_OFFSET
    nats, text_bytes, tokens = [], [], []
    for rank in (0, 1):
        source = build_source("synthetic", None, seed, SEQ_LEN, rank, 2, section="validation")
        windows = list(itertools.islice(PackedDocuments(source, tokenizer, SEQ_LEN), BATCH))
        inputs, labels = torch.stack([w[0]["input"] for w in windows]), torch.stack([w[1] for w in windows])
        with torch.no_grad():
            nats.append(token_losses(model, inputs, labels).double().sum())
        text_bytes.append(token_bytes(tokenizer)[labels].sum())
        tokens.append(labels.numel())
    assert logged["validation/dense_bits_per_byte"] == pytest.approx(
        float(sum(nats) / sum(text_bytes) / math.log(2)), rel=1e-5)
    assert logged["validation/dense_loss"] == pytest.approx(float(sum(nats) / sum(tokens)), rel=1e-5)
    # The ranks' windows differ, so one rank's own ratio would not pass the first check.
    assert abs(float(nats[0] / text_bytes[0] - nats[1] / text_bytes[1])) > 1e-3
