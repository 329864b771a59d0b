"""The run that wrote a checkpoint as a checked JobConfig: its own record of the job (found by
`eval.checkpoint_record`), and the attention the checkpoint was trained with.

The record's `config.toml` is the job as it ran, so tools that rebuild the model
read it rather than a config file named on their command line, which may differ (another `training.seq_len`,
Lighthouse on or off).
"""
from __future__ import annotations

import copy
from pathlib import Path

from torchtitan.config import JobConfig
from torchtitan.protocols.train_spec import get_train_spec

from eval.checkpoint_record import describe_training, run_record_of, step_of
from recipe.logs.run_record import CONFIG_FILE, RUN_FILE, recorded_tokenizer
from recipe.train.cli import CONFIG_FILE_FLAGS, ConfigError, as_config_error, config_file_arg, parse_job_config
from recipe.train.trainer import check_job


def trained_with_lighthouse(job_config: JobConfig, step: int | None) -> bool:
    """Whether the job's last training steps up to `step` ran Lighthouse in some layer: Lighthouse enabled in
    a layer of the model and no `switch_to_dense_at_step` before `step` (unknown step: the job's last step)."""
    spec = get_train_spec(job_config.model.name)
    args = copy.deepcopy(spec.model_args[job_config.model.flavor])
    args.update_from_config(job_config)
    switch = job_config.lighthouse.switch_to_dense_at_step
    step = job_config.training.steps if step is None else step
    return bool(args.lighthouse_layers()) and not 0 < switch < step


def training_description(job_config: JobConfig, step: int | None) -> str:
    """How the weights at `step` were trained, in words (`eval.checkpoint_record.describe_training`)."""
    return describe_training(job_config, trained_with_lighthouse(job_config, step))


def describe_tokenizer(fingerprint: str) -> str:
    """A tokenizer fingerprint (`recipe.data.tokenizer.tokenizer_fingerprint`) in words."""
    kind, _, rest = fingerprint.partition(":")
    if kind != "hf":
        return f"the {fingerprint} tokenizer"
    size, _, digest = rest.partition(":")
    return f"a {size}-entry Hugging Face tokenizer (tokenizer.json sha256 {digest}...)"


def check_trained_tokenizer(step_folder: Path, record: Path | None, fingerprint: str, setting: str) -> None:
    """The tokenizer a tool reads `step_folder` with (`fingerprint`, from the job's `setting`) is the one its run
    trained with, as its run record says: another vocabulary fails the load with a page of size mismatches, and
    another tokenizer of the same size scores other text. Without a record (or one that names none) nothing is
    known to compare."""
    then = recorded_tokenizer(record) if record is not None else None
    if then is not None and then != fingerprint:
        raise ConfigError(f"{setting} gives {describe_tokenizer(fingerprint)}, but {step_folder} was trained with "
                          f"{describe_tokenizer(then)} ({record / RUN_FILE}); drop that setting to use the run's "
                          "tokenizer, or point it at the tokenizer the run trained with")


# Job settings that make the model (dimensions, RoPE table): a config file named on the command line must agree
# with the run's record on them.
MODEL_KEYS = (("model", "name"), ("model", "flavor"), ("training", "seq_len"))


def without_config_file(job_argv: list[str]) -> list[str]:
    """`job_argv` less its `--job.config_file` flag and value (either spelling, `--flag value` or `--flag=value`)."""
    kept, skip = [], False
    for arg in job_argv:
        flag, eq, _ = arg.partition("=")
        if skip:
            skip = False
        elif flag in CONFIG_FILE_FLAGS:
            skip = not eq
        else:
            kept.append(arg)
    return kept


def checked_job_config(argv: list[str]) -> JobConfig:
    """The job config of `argv`, checked as train.py checks it; ConfigError names a mistake."""
    job_config = parse_job_config(argv)
    with as_config_error():
        check_job(job_config)
    return job_config


def model_value(job_config: JobConfig, key: tuple[str, str]) -> object:
    return getattr(getattr(job_config, key[0]), key[1])


def job_config_of(step_folder: Path, job_argv: list[str]) -> tuple[JobConfig, Path | None]:
    """The job config that trained `step_folder` (its run record under the overrides in `job_argv`) and the
    record folder; without records, the config `job_argv` names. ConfigError says what is missing or disagrees."""
    named = config_file_arg(job_argv)
    try:
        record = run_record_of(step_folder)
    except ValueError as err:
        if named is None:
            raise ConfigError(str(err)) from err
        record = None
    if record is None:
        if named is None:
            raise ConfigError(f"{step_folder} has no run record (no runs/<start time>/{CONFIG_FILE} in a folder "
                              "above it): pass --job.config_file of the run that trained it")
        return checked_job_config(job_argv), None
    job_config = checked_job_config(["--job.config_file", str(record / CONFIG_FILE), *without_config_file(job_argv)])
    if named is not None:
        given = checked_job_config(job_argv)
        differ = [f"{'.'.join(key)}={model_value(given, key)!r} (record: {model_value(job_config, key)!r})"
                  for key in MODEL_KEYS if model_value(given, key) != model_value(job_config, key)]
        if differ:
            raise ConfigError(f"--job.config_file {named} differs from the run's record {record / CONFIG_FILE} in "
                              f"{', '.join(differ)}: drop --job.config_file (the record gives the model)")
    return job_config, record


def trained_seq_len(job_config: JobConfig, record: Path | None) -> int:
    """The `training.seq_len` the weights trained at: the run record's (`job_config_of`), whatever length the
    command line overrides it with; without a record, the job's own (its arguments describe the run)."""
    if record is None:
        return job_config.training.seq_len
    return parse_job_config(["--job.config_file", str(record / CONFIG_FILE)]).training.seq_len
