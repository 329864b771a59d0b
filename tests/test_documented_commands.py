"""Every shell command in README.md and docs/**/*.md (```bash blocks, the study pages of docs/studies/ included, and
the inline commands of README.md and docs/recipe.md) runs as written, on CPU-sized overrides, or is checked without
running, or is listed with the reason it cannot run here; every script under scripts/ answers `--help`.

How each command is handled is decided by ROWS, a reviewed table matched in order against the command (one
logical line, its words joined by spaces, comments and `[--optional ...]` parts left out; `a && b` is two
commands):

- `run`: run it in the test's working folder (the checkout's files, nothing an earlier run left, and the row's
  `inputs`: text of the user's own where the command reads it), with the row's CPU-sized overrides appended;
- `check`: a `train.py` command is parsed and put through the trainer's start-up checks (`check_job`), which
  is what catches a wrong key or value before any device work; `--help` is asked for its text;
- `walk`: a walk-through of docs/recipe.md (the row's `walk`: the evaluation, or the CPU-sized context
  extension), run in document order in one working folder (each command reads what the ones before it wrote),
  with the row's CPU-sized overrides appended;
- `help`: a script command is run (in this process) with `--help` appended, which fails on a value its
  options reject;
- `skip`: not on this machine, for the reason given (GPUs, SLURM, the network, placeholders).

`run` and `walk` commands run in the Quickstart's install as a user makes it (tests/minimal_env.py: a venv with
only `torch==2.13.0` and `pip install -e ".[train]"`, no dev extra, no triton), each as its own process, and so do
the README's Python snippets and `--help` of every script under scripts/; `check` and `help` commands are checked
in this process as well.

A command that matches no row fails the test, and so does a row that matches no command.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import models  # noqa: F401  (registers the llama3_lighthouse TrainSpec that check_job looks up)
from recipe.train.cli import parse_job_config
from recipe.train.trainer import check_job

from .helpers import REPO
from .minimal_env import minimal_env, minimal_python
from .warm_python import run_python

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_DOCS = [REPO / "README.md", REPO / "docs" / "recipe.md"]  # whose inline `python ...` commands count too
INLINE = re.compile(r"`((?:python3?|torchrun|bash|pip|sbatch) [^`]+)`")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
OPTIONAL = re.compile(r"\s\[--[^\]]*\]")  # `[--submit]`, `[--section.key value ...]`: optional parts


@dataclass(frozen=True)
class Row:
    """How the commands matching `pattern` (a regex, from the start of the command) are tested, and why."""

    pattern: str
    how: str  # run, walk, check, help or skip
    reason: str
    overrides: tuple[str, ...] = ()  # appended to a `run` command
    slow: bool = False
    says: str = ""  # a line a `run` command prints on stderr (its progress)
    inputs: tuple[str, ...] = ()  # files of the user's own text a `run` command reads, written first (`.txt`, `.jsonl`)
    walk: str = "evaluation"  # the walk-through a `walk` command belongs to


GPU = "needs NVIDIA GPUs"
ROWS = [
    # ------------------------------------------------------------------ run on CPU, CPU-sized
    Row(r"python train\.py --job\.config_file configs/debug\.toml$", "run",
        "the quickstart: the debug model on the synthetic corpus", ("--training.steps", "3"), slow=True),
    Row(r"torchrun --nproc_per_node=2 --local-ranks-filter 0 train\.py --job\.config_file configs/debug\.toml "
        r"--job\.dump_folder outputs/debug-fsdp$", "run",
        "FSDP over two gloo ranks", ("--training.steps", "2"), slow=True),
    Row(r"torchrun --nproc_per_node=2 --local-ranks-filter 0 scripts/cp_parity\.py --seq-len", "run",
        "CP=2 parity over two gloo ranks, CPU-sized",
        ("--device", "cpu", "--seq-len", "2048", "--heads", "2", "--kv-heads", "2", "--head-dim", "16", "--topk", "128",
         "--tile-budget", "32", "--dtype", "float32", "--warmup", "1", "--iters", "2"), slow=True,
        says="cp_parity: timing CP Lighthouse fwd\n"),
    Row(r"python scripts/sweep\.py create configs/paper/stage1_L3_p4_k2048_norm\.toml --name lh-grid .* "
        r"--stage2-steps 8000$", "run", "writes the sweep's TOMLs, each parsed by torchtitan (no job starts)",
        slow=True),
    Row(r"python scripts/sweep\.py create configs/paper/stage1_L3_p4_k2048_norm\.toml --name lh-grid .* --sbatch ",
        "run", "the same grid with sbatch options; torchtitan's parse of each TOML is the row above's",
        ("--no-torchtitan-check",), slow=True),
    Row(r"python scripts/make_tokenizer\.py --data data/ --vocab-size 32000 --out assets/tokenizer$", "run",
        "the README's tokenizer of your own text, as written", slow=True, inputs=("data/readme.txt",)),
    Row(r"python scripts/make_tokenizer\.py --data my_text/\*\*/\*\.jsonl --vocab-size 32000 --out assets/tokenizer$",
        "run", "docs/recipe.md's form, from JSON lines, as written", slow=True, inputs=("my_text/notes/readme.jsonl",)),
    Row(r"python train\.py --job\.config_file configs/debug\.toml --training\.dataset local --training\.dataset_path "
        r"data/$", "run", "the debug model on text of your own, two steps", ("--training.steps", "2"), slow=True,
        inputs=("data/readme.txt",)),
    Row(r"python scripts/dependence_probe\.py$", "run", "the reference layer in float64 on small geometries, seconds",
        slow=True),
    # ------------------------------------------------------------------ checked without running
    Row(r"python train\.py --help$", "check", "lists every option"),
    Row(r"python train\.py --job\.config_file configs/debug\.toml --job\.dump_folder outputs/try --training\.steps 8 "
        r"--checkpoint\.enable --checkpoint\.interval 3$", "check",
        "the resume example; tests/test_crash_resume.py kills and resumes the debug run"),
    Row(r"torchrun --nproc_per_node=8 --local-ranks-filter 0 train\.py --job\.config_file configs/paper/", "check",
        f"the paper model on 8 GPUs: {GPU}; its configuration passes the start-up checks here"),
    Row(r"python scripts/sweep\.py summary ", "help", "reads the logs of trained sweep points"),
    Row(r"python scripts/cp_throughput\.py ", "help", f"times the paper model with CP: {GPU}"),
    Row(r"torchrun --nproc_per_node=2 --local-ranks-filter 0 train\.py --job\.config_file "
        r"configs/long_context/stage1_L3_p4_k2048_norm_1m_cp2\.toml ", "check",
        f"1M tokens on 2 GPUs of 141 GB: {GPU}; its configuration passes the start-up checks here"),
    Row(r"python scripts/max_context\.py ", "help", f"searches the longest context of the paper model: {GPU}"),
    Row(r"torchrun --nproc_per_node=2 --local-ranks-filter 0 scripts/cp_parity\.py$", "help",
        "the README's CP=2 parity run at the default length, which the run row above covers on CPU"),
    Row(r"torchrun --nproc_per_node=4 --local-ranks-filter 0 scripts/cp_parity\.py ", "help",
        f"CP=4 at 262,144 tokens over NCCL: {GPU}"),
    Row(r"python scripts/time_to_quality\.py --run outputs/time_to_quality ", "help",
        "reports a finished time-to-quality study (GPU hours)"),
    # ------------------------------------------------------------------ the evaluation walk-through, in order
    Row(r"python train\.py --job\.config_file configs/debug\.toml --job\.dump_folder outputs/debug_eval "
        r"--lighthouse\.switch_to_dense_at_step 10$", "walk", "trains the walk-through's checkpoints, as written",
        slow=True),
    Row(r"python scripts/make_corpus\.py --out outputs/corpus$", "walk",
        "builds the held-out corpus, from lighthouse/ instead of the standard library",
        ("--source", "lighthouse", "--heldout-every", "2"), slow=True),
    Row(r"python scripts/heldout_loss\.py --checkpoint outputs/debug_eval/", "walk", "as written", slow=True),
    Row(r"python scripts/niah\.py --checkpoint outputs/debug_eval/", "walk", "one needle depth instead of eleven",
        ("--depths", "50"), slow=True),
    Row(r"python scripts/causality_audit\.py --checkpoint outputs/debug_eval/", "walk", "as written", slow=True),
    Row(r"python scripts/export_hf\.py outputs/debug_eval/checkpoint/step-20 outputs/debug_eval/hf$", "walk",
        "as written", slow=True),
    Row(r"lm_eval --model hf --model_args pretrained=outputs/debug_eval/hf ", "skip",
        "needs the hf extra (lm-eval); tests/test_lm_eval_export.py runs this command on an export"),
    # ------------------------------------------------------------------ the context extension on a CPU, in order
    Row(r"python train\.py --job\.config_file configs/extend/stage0_short\.toml --training\.seq_len 512 ", "walk",
        "stage 0 as written, on your tokenizer and text", slow=True, walk="extension"),
    Row(r"python train\.py --job\.config_file configs/extend/stage1_lighthouse_long\.toml --training\.seq_len 2048 ",
        "walk", "stage 1 as written, from stage 0's newest step", slow=True, walk="extension"),
    Row(r"python train\.py --job\.config_file configs/extend/stage2_dense_long\.toml --training\.seq_len 2048 ",
        "walk", "stage 2 as written, resuming stage 1's newest step", slow=True, walk="extension"),
    Row(r"python scripts/export_hf\.py outputs/extend/stage2_dense_long/checkpoint/step-4 outputs/extended$", "walk",
        "exports stage 2's last step as written", slow=True, walk="extension"),
    # ------------------------------------------------------------------ your tokenizer, data and weights
    # (docs/recipe.md)
    Row(r"python scripts/export_hf\.py outputs/(debug|extend/stage2_dense_long)/checkpoint/", "help",
        "exports a trained checkpoint: the walk-through runs export_hf.py as written, tests/test_bring_your_own.py "
        "exports with a tokenizer"),
    Row(r"python scripts/heldout_loss\.py --checkpoint outputs/debug/checkpoint/", "help",
        "scores held-out files of your own; tests/test_bring_your_own.py checks its bits per byte"),
    # ------------------------------------------------------------------ cannot run here
    Row(r"pip install -e \.\[(train|hf)\]$", "skip", "installs into the environment from the network"),
    Row(r"python -m pip install --no-index --find-links wheelhouse ", "skip",
        "installs into the environment from a built wheelhouse"),
    Row(r"scripts/build_wheelhouse\.sh ", "skip", "downloads wheels (tests/test_wheelhouse.py builds one offline)"),
    Row(r"bash scripts/run_tests\.sh$", "skip", "the test suite itself"),
    Row(r"python3? -m pytest ", "skip", "runs part of the test suite"),
    Row(r"python -m recipe\.experiments\.paper_configs$", "skip",
        "rewrites the tracked configs/paper/ and configs/long_context/; tests/test_recipe_config.py keeps them equal "
        "to what it writes"),
    Row(r"python scripts/checkpoint_checksum_cost\.py ", "help",
        "writes and checksums a quarter of the paper model's checkpoint (0.75 GiB, minutes)"),
    Row(r"python train\.py --job\.config_file <it>$", "skip", "a template: <it> stands for a config"),
    Row(r"(sbatch|slurm/submit\.sh) ", "skip",
        "needs SLURM (tests/test_slurm.py runs the scripts with fake sbatch/srun)"),
    Row(r"torchrun --nproc_per_node=8 --local-ranks-filter 0 train\.py --job\.config_file configs/<name>\.toml", "skip",
        "a template: <name> stands for a config"),
    Row(r"python scripts/train_throughput\.py ", "skip", f"times the paper model: {GPU}"),
    Row(r"scripts/flash_attn_measure\.sh ", "skip", f"FlashAttention-4 beside cuDNN, training the paper model: {GPU}"),
    Row(r"python train\.py --job\.config_file configs/debug\.toml --model\.flavor hf ", "skip",
        "a template: DIR stands for a Hugging Face Llama folder (tests/test_hf_flavor.py imports one on CPU)"),
    Row(r"python train\.py --job\.config_file configs/paper/stage1_L3_p4_k1536_norm\.toml --model\.hf_assets_path ",
        "skip", f"the paper model with Llama-3's tokenizer, which the reader brings: {GPU}"),
    Row(r"python train\.py --job\.config_file configs/extend/", "skip",
        "needs your tokenizer in assets/tokenizer and your text in data/, and trains for minutes even CPU-sized; "
        "tests/test_bring_your_own.py parses the three configs and checks their chain"),
    Row(r"(SP=<site-packages>; |CORPUS_SOURCES=|STEPS=\d+ scripts/replicate\.sh |scripts/time_to_quality\.sh )", "skip",
        f"a study of GPU hours (placeholders for the corpus sources): {GPU}"),
    Row(r"(DEVICE=.* |RUN=outputs/payoff )?scripts/time_to_quality_long\.sh (corpus|run|report)$", "skip",
        f"the 131,072-token study on a 4-GPU machine: {GPU} (tests/test_gpu_queue.py checks its queue)"),
    Row(r"python scripts/causality_audit\.py --checkpoint outputs/payoff/", "help",
        f"audits a 131,072-token checkpoint of the basin study: {GPU}"),
    Row(r"python scripts/generate\.py --checkpoint outputs/debug/", "help",
        "samples from the quickstart's checkpoint; tests/test_evidence_eval.py samples a trained one"),
    Row(r"python scripts/payoff_map\.py (run|report) configs/payoff/example_cpu\.toml", "help",
        "trains the CPU-sized example for minutes: tests/test_payoff_map.py runs it as written (slow)"),
    Row(r"python scripts/payoff_map\.py tasks configs/payoff/", "run", "prints the study's queue, trains nothing"),
    Row(r"python scripts/payoff_map\.py (run|report) configs/payoff/", "help",
        f"trains or reports the 131,072-token study: {GPU} (tests/test_payoff_map.py runs a CPU-sized study)"),
    Row(r"python scripts/payoff_map\.py submit ", "skip", "submits SLURM jobs (tests/test_payoff_map.py)"),
    Row(r"python scripts/payoff_map\.py pack configs/payoff/", "help",
        "packs a run folder where a queue ran: tests/test_study_pack.py packs one part way and continues it (slow)"),
    Row(r"tar xzf ext\.tar\.gz -C ", "skip",
        "unpacks a pack on the other machine: tests/test_study_pack.py unpacks one and continues its queue (slow)"),
]


@dataclass(frozen=True)
class Command:
    """One documented command: its words (optional parts left out) and where it is first written."""

    argv: tuple[str, ...]
    where: str

    @property
    def text(self) -> str:
        return " ".join(self.argv)


def inline_commands(doc: Path) -> list[Command]:
    """The inline `python ...` commands of `doc` outside its fenced blocks (one may wrap onto the next line)."""
    text = FENCED.sub(lambda block: "\n" * block.group(0).count("\n"), doc.read_text())
    where = f"{doc.relative_to(REPO)}:{{}}"
    return [Command(tuple(shlex.split(found.group(1))), where.format(text[:found.start()].count("\n") + 1))
            for found in INLINE.finditer(text)]


def documented_commands() -> list[Command]:
    """The commands of every ```bash block of DOCS, then the inline ones of INLINE_DOCS, each once (where it first
    appears)."""
    commands: dict[tuple[str, ...], Command] = {}
    for doc in DOCS:
        text = doc.read_text()
        for block in BLOCK.finditer(text):
            first = text[:block.start(1)].count("\n") + 1
            pending, start = "", first
            for offset, line in enumerate(block.group(1).split("\n")):
                start = start if pending else first + offset
                if line.endswith("\\"):  # continued on the next line
                    pending += line[:-1] + " "
                    continue
                words, pending = shlex.split(OPTIONAL.sub("", pending + line), comments=True), ""
                while words:
                    part = words[:words.index("&&")] if "&&" in words else words
                    words = words[len(part) + 1:]
                    commands.setdefault(tuple(part), Command(tuple(part), f"{doc.relative_to(REPO)}:{start}"))
    for command in (command for doc in INLINE_DOCS for command in inline_commands(doc)):
        commands.setdefault(command.argv, command)
    return list(commands.values())


def row_of(command: Command) -> Row | None:
    return next((row for row in ROWS if re.match(row.pattern, command.text)), None)


COMMANDS = documented_commands()


def test_every_documented_command_is_run_checked_or_listed_with_its_reason():
    unlisted = [f"{c.where}: {c.text}" for c in COMMANDS if row_of(c) is None]
    assert not unlisted, "documented commands that ROWS neither runs, checks nor lists:\n" + "\n".join(unlisted)


def test_every_row_still_matches_a_documented_command_and_says_how_and_why():
    stale = [row.pattern for row in ROWS if not any(re.match(row.pattern, c.text) for c in COMMANDS)]
    assert not stale, f"rows that match no documented command (remove or update them): {stale}"
    assert all(row.how in ("run", "walk", "check", "help", "skip") and row.reason for row in ROWS)


def python_argv(words: list[str], python: str) -> list[str]:
    """The command's argv with `python` and `torchrun` run by `python`."""
    head, *rest = words
    if head in ("python", "python3"):
        return [python, *rest]
    if head == "torchrun":
        return [python, "-m", "torch.distributed.run", *rest]
    return words


def walk_through(name: str) -> list[Command]:
    """The commands of the walk-through `name`, in document order."""
    return [c for c in COMMANDS if row_of(c) and row_of(c).how == "walk" and row_of(c).walk == name]


def cases(how: str) -> list:
    return [pytest.param(c, marks=[pytest.mark.slow] if row_of(c).slow else [], id=c.where)
            for c in COMMANDS if row_of(c) is not None and row_of(c).how == how]


# A test that uses the install may wait for its build first (minutes; tests/minimal_env.py).
INSTALL_TIMEOUT = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def installed() -> str:
    """The Python of the Quickstart's install (built on first use, tests/minimal_env.py)."""
    return str(minimal_python())


def write_own_text(path: Path) -> None:
    """A user's own text at `path`: the README's paragraphs as documents, one `{"text": ...}` a line for `.jsonl`."""
    paragraphs = [p for p in (REPO / "README.md").read_text().split("\n\n") if p.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": p}) for p in paragraphs] if path.suffix == ".jsonl" else paragraphs
    path.write_text("\n".join(lines) + "\n")


def run_installed(command: Command, python: str) -> subprocess.CompletedProcess:
    """Run the command with its row's overrides in the Quickstart's install; fail naming it unless it succeeds
    without a traceback."""
    argv = python_argv(list(command.argv), python) + list(row_of(command).overrides)
    for path in row_of(command).inputs:
        write_own_text(Path(path))
    if argv[0] == python:  # from the install's warm interpreter (tests/warm_python.py), in this test's folder
        run = run_python(argv[1:], python=python, env=minimal_env(), cwd=os.getcwd(), timeout=600)
    else:
        run = subprocess.run(argv, env=minimal_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{command.where}: {shlex.join(argv)} exited {run.returncode}:\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, f"{command.where}: {shlex.join(argv)}:\n{run.stderr[-3000:]}"
    return run


@pytest.mark.slow
@INSTALL_TIMEOUT
def test_the_minimal_install_is_the_train_extra_without_dev_tools_or_triton(installed):
    missing = subprocess.run([installed, "-c", "import importlib.util as u; print([m for m in ('triton', "
                              "'transformers', 'lm_eval', 'pytest', 'flash_attn') if u.find_spec(m)])"],
                             env=minimal_env(), capture_output=True, text=True, timeout=120)
    assert missing.stdout.strip() == "[]", missing.stdout + missing.stderr


@INSTALL_TIMEOUT
@pytest.mark.parametrize("command", cases("run"))
def test_a_runnable_command_runs_as_written_in_the_quickstart_install_on_cpu_sized_overrides(command, installed):
    assert row_of(command).says in run_installed(command, installed).stderr


@pytest.mark.slow
@INSTALL_TIMEOUT
def test_the_evaluation_walk_through_runs_in_order_in_the_quickstart_install(installed):
    """docs/recipe.md's walk-through in one folder, each command on what the ones before it wrote, and the
    files it promises: the held-out, NIAH and audit records, the plots, the export."""
    walk = walk_through("evaluation")
    assert len(walk) == 6
    for command in walk:
        run_installed(command, installed)
    evaluated = Path("outputs/debug_eval/eval")
    for name in ("heldout.json", "niah.json", "niah.png", "causality.json", "causality.png"):
        assert (evaluated / name).stat().st_size > 0, name
    assert {"config.json", "model.safetensors", "tokenizer.json", "lighthouse_export.json"} <= {
        p.name for p in Path("outputs/debug_eval/hf").iterdir()}


@pytest.mark.slow
@INSTALL_TIMEOUT
def test_the_context_extension_runs_in_order_on_a_cpu_as_written_in_the_quickstart_install(installed):
    """docs/recipe.md's CPU-sized extension: the README's tokenizer of your own text, then stages 0, 1 and 2, each
    starting from the newest step of the one before (the configs name its checkpoint folder), then the export."""
    write_own_text(Path("data/readme.txt"))
    tokenizer = next(c for c in COMMANDS if c.text.startswith("python scripts/make_tokenizer.py --data data/ "))
    run_installed(tokenizer, installed)
    walk = walk_through("extension")
    assert len(walk) == 4
    stages = [run_installed(command, installed) for command in walk]
    for run, taken in zip(stages[1:3], ("stage0_short/checkpoint/step-4", "stage1_lighthouse_long/checkpoint/step-2")):
        assert f"{taken} (its newest complete step)" in run.stdout + run.stderr
    assert ({"config.json", "model.safetensors", "tokenizer.json"}
            <= {p.name for p in Path("outputs/extended").iterdir()})


def readme_snippets() -> list[str]:
    return [block.group(1) for block in PYTHON_BLOCK.finditer((REPO / "README.md").read_text())]


@pytest.mark.slow
@INSTALL_TIMEOUT
@pytest.mark.parametrize("snippet", readme_snippets())
def test_a_readme_python_snippet_runs_as_written_in_the_quickstart_install(snippet, installed):
    run = subprocess.run([installed, "-c", snippet], env=minimal_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


SCRIPTS = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "scripts").glob("*.py"))


@pytest.mark.slow
@INSTALL_TIMEOUT
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_as_its_own_process_in_the_quickstart_install(script, installed):
    run = run_python([script, "--help"], python=installed, env=minimal_env(), cwd=REPO, timeout=300)
    assert run.returncode == 0 and "usage:" in run.stdout, f"{script} --help exited {run.returncode}:\n" + run.stderr


def check_train_command(command: Command) -> bool:
    """Put a train.py command through the trainer's start-up checks, or ask for its `--help` (then True)."""
    args = list(command.argv[command.argv.index("train.py") + 1:])
    if "--help" not in args:
        check_job(parse_job_config(args))
        return False
    with pytest.raises(SystemExit) as exit_info:
        parse_job_config(args)
    assert exit_info.value.code == 0
    return True


def ask_script_for_help(command: Command) -> None:
    """Run the command's script in this process with `--help` appended; SystemExit 0 once its options parse."""
    words = list(command.argv)
    script = next(i for i, w in enumerate(words) if w.endswith(".py"))  # after python or torchrun's options
    argv = sys.argv
    sys.argv = [*words[script:], "--help"]
    try:
        runpy.run_path(words[script], run_name="__main__")
    finally:
        sys.argv = argv


@pytest.mark.parametrize("command", cases("check"))
def test_a_train_command_passes_the_start_up_checks(command, capsys):
    if check_train_command(command):
        assert "--lighthouse.topk" in capsys.readouterr().out


@pytest.mark.parametrize("command", cases("help"))
def test_a_script_command_is_accepted_by_its_options(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ask_script_for_help(command)
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out


def test_a_wrong_key_or_value_in_a_command_fails_its_check(capsys):
    train = ("python", "train.py", "--job.config_file", "configs/debug.toml", "--lighthouse.topk", "40")
    with pytest.raises(ValueError, match="topk=40 must be a positive multiple of tile_budget=16"):
        check_train_command(Command(train, "here"))
    with pytest.raises(SystemExit) as exit_info:
        ask_script_for_help(Command(("python", "scripts/sweep.py", "summary", "s", "--format", "xml"), "here"))
    assert exit_info.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err
