"""Bad inputs to more of the scripts under scripts/ end as those of tests/test_bad_inputs.py do: exit code 2 and a
last line on stderr naming the flag (or the file) and the value, with no traceback, before anything heavy runs.

Each script runs as a fresh Python process (`run_python`), so that its exit code and stderr are what a user sees.
"""
from __future__ import annotations

import json
import os
import random
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from recipe.data.tokenizer import ByteTokenizer

from .helpers import REPO, child_env
from .warm_python import run_python

DEBUG = str(REPO / "configs" / "debug.toml")
LOSS = "loss_metrics/global_avg_loss"


def refusal(script: str, *argv: str) -> str:
    """The last line on stderr of `python scripts/<script> ARGV`, which must exit with code 2 and no traceback."""
    run = run_python([f"scripts/{script}", *argv], env=child_env(), timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    return run.stderr.splitlines()[-1]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-0.5"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number_at_least_0(tmp_path, value):
    # was: nan and inf drew from NaN probabilities (torch's traceback), a negative one named every flag
    line = refusal("generate.py", "--checkpoint", str(tmp_path), f"--temperature={value}")
    assert line.endswith(f"error: argument --temperature: {value!r} must be a finite number >= 0 (0 is greedy)")


@pytest.mark.parametrize("temperature", [5e-324, 1e-40, 1e300])
def test_generate_samples_at_any_finite_temperature_above_0(temperature):
    """A tiny temperature takes the most likely token, as 0 does; a huge one draws among the allowed tokens (the
    division held NaN in float32: a traceback)."""
    sample = runpy.run_path(str(REPO / "scripts" / "generate.py"))["sample"]
    tokenizer, logits = ByteTokenizer(), torch.randn(258)
    drawn = sample(lambda ids: logits.clone(), [tokenizer.bos_id], 8, tokenizer, temperature, top_k=40)
    assert all(token < tokenizer.get_vocab_size() and token != tokenizer.bos_id for token in drawn)
    if temperature < 1:
        assert drawn == sample(lambda ids: logits.clone(), [tokenizer.bos_id], 8, tokenizer, temperature=0)


@pytest.mark.parametrize("n, rule", [
    (100, "seq_len=100 is not divisible by pool**(levels-1)=16 (pool=4, levels=3)"),
    (16, "seq_len/pool**(levels-1)=1 coarsest entries do not split into topk/tile_budget=4 equal tiles (topk=512, "
         "tile_budget=128)"),
    (1024, "each tile has 16 coarsest entries (seq_len=1024, pool**(levels-1)=16, tiles=4) but needs at least "
           "tile_budget=128"),
], ids=["not-a-multiple-of-16", "too-few-coarsest-entries", "too-few-per-tile"])
def test_dependence_probe_refuses_an_overlap_length_its_selection_cannot_run_on(n, rule):
    line = refusal("dependence_probe.py", "--overlap", str(n))  # was: LighthouseConfig's traceback
    assert line == (f"dependence_probe.py: error: argument --overlap: N={n} does not fit the selection it compares "
                    f"(L3 p4 k512 m128): {rule}")


@pytest.mark.parametrize("folder", ["file/ckpt", "file"])
def test_checkpoint_checksum_cost_refuses_a_folder_under_a_file_or_a_file(tmp_path, folder):
    (tmp_path / "file").write_text("x")  # was: NotADirectoryError when DCP made the folder
    line = refusal("checkpoint_checksum_cost.py", "--fraction", "0.0001", "--folder", str(tmp_path / folder))
    assert line.endswith(f"error: argument --folder: '{tmp_path / folder}': {tmp_path / 'file'} is a file, not a "
                         "folder")


def test_sweep_create_refuses_a_folder_as_its_base_config_and_a_file_as_its_out(tmp_path):
    line = refusal("sweep.py", "create", str(tmp_path), "--topk", "32", "--out", str(tmp_path / "s"))
    assert line.endswith(f"error: argument base: '{tmp_path}' is a folder; name the TOML file every point starts "
                         "from")  # was: IsADirectoryError
    (tmp_path / "file").write_text("x")
    line = refusal("sweep.py", "create", DEBUG, "--topk", "32", "--out", str(tmp_path / "file"))
    assert line.endswith(f"error: argument --out: '{tmp_path / 'file'}': {tmp_path / 'file'} is a file, not a "
                         "folder")  # was: FileExistsError once every point was checked
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("line, fault", [
    ("not json", ":2: not a JSON line (Expecting value)"),  # was: exit code 2, naming neither file nor line
    ('[1, 2]', ":2: a JSON list, not an object"),  # was: "share no logged tag"
    (json.dumps({LOSS: 2.5}), ": record 2 is at step None, not an integer step"),  # was: KeyError: 'step'
    (json.dumps({"step": 2, LOSS: "2.5"}), f": {LOSS}='2.5' at step 2 is not a number"),  # was: TypeError
], ids=["not-json", "not-an-object", "no-step", "not-a-number"])
@pytest.mark.parametrize("bad", [0, 1], ids=["first-run", "second-run"])
def test_run_agreement_names_the_file_of_a_malformed_metrics_record_and_its_line_alone(tmp_path, line, fault, bad):
    runs = [tmp_path / "a", tmp_path / "b"]
    for i, folder in enumerate(runs):
        folder.mkdir()
        last = line if i == bad else json.dumps({"step": 2, LOSS: 2.5})
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, LOSS: 3.0}) + "\n" + last + "\n")
    line = refusal("run_agreement.py", *map(str, runs))  # was: both run folders first, whichever was at fault
    assert line == f"run_agreement.py: error: {runs[bad] / 'metrics.jsonl'}{fault}"


def test_run_agreement_names_both_runs_and_the_tag_they_logged_at_no_common_step(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    split = random.randint(2, 20)  # the second run logged the steps after the first one's last
    for folder, steps in ((first, range(1, split)), (second, range(split, split + random.randint(1, 20)))):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, LOSS: random.random()}) + "\n"
                                                      for s in steps))
    # was: "a and b: the two runs logged this tag at no common step", naming no tag
    assert refusal("run_agreement.py", str(first), str(second)) == (
        f"run_agreement.py: error: {first} and {second} logged {LOSS} at no common step")


def windows_and_losses(rows: int = 2, tokens: int = 33) -> dict[str, np.ndarray]:
    """The arrays of a dump of one model `a`: random token windows and per-token losses."""
    rng = np.random.default_rng()
    return {"windows": rng.integers(0, 256, size=(rows, tokens)).astype(np.uint16),
            "loss/a": rng.random((rows, tokens - 1)).astype(np.float16)}


def unreadable_record(npz: Path) -> None:
    """A dump whose arrays are sound and whose record (.json) is not JSON."""
    np.savez(npz, **windows_and_losses())
    npz.with_suffix(".json").write_text("{")


@pytest.mark.parametrize("write, fault", [
    (lambda npz: npz.write_bytes(os.urandom(random.randrange(16, 512))), ".npz is not an .npz (a zip archive)"),
    (lambda npz: np.savez(npz, **{"loss/a": windows_and_losses()["loss/a"]}),
     ".npz holds no windows array of token ids"),
    (lambda npz: np.savez(npz, windows=windows_and_losses()["windows"]), ".npz holds no loss/<model> array"),
    (lambda npz: np.savez(npz, **windows_and_losses(tokens=17), **{"loss/b": np.zeros((2, 32), np.float16)}),
     ".npz: loss/b is float16 of shape [2, 32], but its windows [2, 17] need floats of shape [2, 16]"),
    (unreadable_record, ".json is not JSON"),
], ids=["random-bytes", "no-windows", "no-losses", "losses-of-other-windows", "record-not-json"])
def test_loss_anatomy_report_names_a_dump_it_cannot_read(tmp_path, write, fault):
    prefix = tmp_path / "dump"
    write(prefix.with_suffix(".npz"))  # was: exit code 2 naming no file, KeyError, or IndexError from the report
    line = refusal("loss_anatomy.py", "report", "--dump", str(prefix), "--compare", "a,b", "--out", str(tmp_path / "r"))
    assert line.startswith(f"error: --dump '{prefix}': {prefix}{fault}")


@pytest.mark.parametrize("below_2", [True, False], ids=["below-2", "not-an-integer"])
def test_make_corpus_names_a_heldout_every_that_is_not_an_integer_at_least_2(tmp_path, below_2):
    value = str(random.randint(-9, 1)) if below_2 else random.choice(["two", "2.5", ""])
    out = tmp_path / "corpus"  # was: "heldout_every=0 must be >= 2", the library's argument, not the flag
    line = refusal("make_corpus.py", "--source", str(tmp_path), "--out", str(out), f"--heldout-every={value}")
    refused = f"{value} must be >= 2" if below_2 else f"{value!r} is not an integer"
    assert line == f"make_corpus.py: error: argument --heldout-every: {refused}"
    assert not out.exists()


def test_make_corpus_names_the_source_flag_of_folders_that_share_a_name(tmp_path):
    name = random.choice(["src", "lib", "pkg"])
    sources = [tmp_path / parent / name for parent in random.sample(["a", "b", "c"], 2)]
    for source in sources:
        source.mkdir(parents=True)
        (source / "module.py").write_text("x = 1\n")
    out = tmp_path / "corpus"  # was: "sources [...] share ...", the library's argument, not the flag
    line = refusal("make_corpus.py", "--source", str(sources[0]), "--source", str(sources[1]), "--out", str(out))
    assert line == (f"make_corpus.py: error: --source {[str(s) for s in sources]} share a folder name; documents "
                    "are named by it")
    assert not out.exists()


def heldout_data(folder: Path, windows: int, empty: int = 0) -> Path:
    """A .jsonl file of `windows` documents of 511 characters, each exactly one window of 513 tokens of
    configs/debug.toml (BOS + 511 bytes + EOS; seq_len 512), and `empty` empty documents among them."""
    texts = ["".join(random.choices("abcdefgh ", k=511)) for _ in range(windows)] + [""] * empty
    random.shuffle(texts)
    path = folder / "heldout.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


@pytest.mark.parametrize("flag, unit", [("--windows", "windows of 513 tokens"),
                                        ("--documents", "non-empty documents")])
def test_heldout_loss_names_the_flag_that_asks_for_more_than_the_data_holds(tmp_path, flag, unit):
    held = random.randint(1, 5)
    data = heldout_data(tmp_path, held, empty=random.randint(0, 3))
    asked = held + random.randint(1, 100)
    line = refusal("heldout_loss.py", "--checkpoint", str(tmp_path), "--data", str(data), flag, str(asked), "--out",
                   str(tmp_path / "out"), "--job.config_file", DEBUG)  # refused before the checkpoint is loaded
    # was: "fewer than count=...", the library's argument, not the flag
    assert line == f"error: --data='{data}' (1 files) holds {held} {unit}, fewer than {flag}={asked}"


@pytest.mark.parametrize("rule", ["rope", "lighthouse"])
def test_niah_names_the_lengths_flag_and_the_length_the_model_cannot_run(tmp_path, rule):
    """configs/debug.toml: training.seq_len 512 (the RoPE table), Lighthouse levels 3, pool 2 (lengths are multiples
    of 4); refused before the checkpoint is loaded."""
    if rule == "rope":
        n = random.randint(513, 4096)
        lengths, refused = f"256,{n}", (f"lengths [{n}] exceed training.seq_len=512, the model's RoPE table; pass "
                                        "--training.seq_len to extend it")
    else:
        n = 4 * random.randint(17, 127) + random.randint(1, 3)  # longer than the needle and question (68 tokens)
        lengths, refused = f"{n},256", (f"length {n} does not fit the Lighthouse setting: seq_len={n} is not "
                                        "divisible by pool**(levels-1)=4 (pool=2, levels=3)")
    line = refusal("niah.py", "--checkpoint", str(tmp_path), "--lengths", lengths, "--out", str(tmp_path / "out"),
                   "--job.config_file", DEBUG)
    assert line == f"error: --lengths={lengths}: {refused}"  # was: no flag named


SHORTEST_PROMPT = 68  # tokens of configs/debug.toml (bytes) in the longest needle sentence and the question


@pytest.mark.parametrize("flag", ["--lengths", "--depths"])
def test_niah_names_the_flag_of_a_grid_value_no_prompt_can_take(tmp_path, flag):
    """Refused before the checkpoint is loaded (tmp_path holds none)."""
    if flag == "--lengths":
        short = random.randint(1, SHORTEST_PROMPT - 1)
        value, refused = f"256,{short}", (f"NIAH lengths [{short}] are shorter than the needle and question "
                                          f"({SHORTEST_PROMPT} tokens)")
    else:
        off = random.choice([random.randint(-99, -1), random.randint(101, 999)])
        value, refused = f"0,{off},50", f"NIAH depths [{off}] must be percentages in [0, 100]"
    line = refusal("niah.py", "--checkpoint", str(tmp_path), "--lengths", "256", f"{flag}={value}",
                   "--out", str(tmp_path / "out"), "--job.config_file", DEBUG)
    assert line == f"error: {flag}={value}: {refused}"  # was: no flag named


@pytest.mark.parametrize("rule", ["short", "rope"])
def test_loss_anatomy_names_the_niah_lengths_flag_and_the_length_no_prompt_or_model_can_take(tmp_path, rule):
    """Refused before the held-out data is read (--data matches nothing) or a checkpoint is loaded."""
    if rule == "short":
        n = random.randint(1, SHORTEST_PROMPT - 1)
        refused = f"NIAH lengths [{n}] are shorter than the needle and question ({SHORTEST_PROMPT} tokens)"
    else:
        n = random.randint(513, 4096)
        refused = (f"lengths [{n}] exceed training.seq_len=512, the model's RoPE table; pass --training.seq_len to "
                   "extend it")
    lengths = f"128,{n}"
    line = refusal("loss_anatomy.py", "dump", "--checkpoint", f"a={tmp_path}", "--data", str(tmp_path / "none*.jsonl"),
                   f"--niah-lengths={lengths}", "--out", str(tmp_path / "out"), "--job.config_file", DEBUG)
    assert line == f"error: --niah-lengths={lengths}: {refused}"  # was: no flag named


@pytest.mark.parametrize("script, argv, flag", [
    ("time_to_quality.py", ["--run", "{tmp}"], "--out"),
    ("payoff_map.py", ["report", "{tmp}/study.toml"], "--out"),
    ("replicate_report.py", ["--run", "{tmp}", "--steps", "10"], "--out"),
    ("gpu_queue.py", ["--tasks", "{tmp}/tasks.tsv", "--gpus", "0"], "--logs"),
], ids=["time-to-quality", "payoff-map-report", "replicate-report", "gpu-queue"])
def test_an_output_under_a_file_is_refused_at_start_up(tmp_path, script, argv, flag):
    (tmp_path / "file").write_text("x")  # was: FileExistsError or NotADirectoryError once the work was done
    out = tmp_path / "file" / random.choice(["report", "out", "logs"])
    line = refusal(script, *(arg.format(tmp=tmp_path) for arg in argv), flag, str(out))
    assert line == f"{script}: error: argument {flag}: '{out}': {tmp_path / 'file'} is a file, not a folder"


@pytest.mark.parametrize("script, argv, flag", [
    ("time_to_quality.py", ["--run", "{tmp}", "--out", "{tmp}/report"], "--seq-len"),
    ("replicate_report.py", ["--run", "{tmp}"], "--steps"),
], ids=["time-to-quality-seq-len", "replicate-report-steps"])
def test_a_length_or_step_count_below_1_is_refused(tmp_path, script, argv, flag):
    value = random.randint(-99, 0)  # was: taken as given into the records
    line = refusal(script, *(arg.format(tmp=tmp_path) for arg in argv), f"{flag}={value}")
    assert line == f"{script}: error: argument {flag}: {value} must be >= 1"


@pytest.mark.parametrize("content, fault", [
    (b"[lighthouse\n", "is not valid TOML: "),  # was: tomllib's message alone, naming no file
    (b"\xff" + os.urandom(8), "is not UTF-8 text (byte 0), as TOML must be"),  # was: the codec's message alone
], ids=["not-toml", "not-utf8"])
def test_sweep_create_names_a_base_config_that_is_not_toml(tmp_path, content, fault):
    base = tmp_path / "base.toml"
    base.write_bytes(content)
    run = run_python(["scripts/sweep.py", "create", str(base), "--topk", "32", "--out", str(tmp_path / "s")],
                     env=child_env(), timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.splitlines()[-1].startswith(f"sweep.py create: {base} {fault}")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("point", [random.randint(0, 9), {"run": "r"}, {"error": None, "run": "r"}],
                         ids=["not-an-object", "no-error", "written-without-its-folders"])
def test_sweep_summary_names_a_sweep_record_whose_points_it_cannot_read(tmp_path, point):
    record = tmp_path / "sweep.json"  # was: TypeError or KeyError from the summary
    record.write_text(json.dumps({"points": [point]}))
    run = run_python(["scripts/sweep.py", "summary", str(tmp_path)], env=child_env(), timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.splitlines()[-1] == (f"sweep.py summary: the sweep record {record} holds a JSON object; "
                                           "expected an object with points, as sweep.py create writes")


@pytest.mark.parametrize("depths", ["", ",", " , "])
def test_niah_refuses_depths_that_name_no_depth(tmp_path, depths):
    """Refused before the checkpoint is loaded (tmp_path holds none)."""
    line = refusal("niah.py", "--checkpoint", str(tmp_path), "--lengths", "256", f"--depths={depths}",
                   "--out", str(tmp_path / "out"), "--job.config_file", DEBUG)
    # was: ZeroDivisionError from the mean of a grid of no cell, once the model had run
    assert line == "error: --depths=: no NIAH depth: give comma-separated percentages in [0, 100], e.g. 0,50,100"


@pytest.mark.parametrize("make, fault", [
    (lambda tasks: None, "cannot be read (No such file or directory)"),
    (lambda tasks: tasks.mkdir(), "cannot be read (Is a directory)"),
    (lambda tasks: tasks.write_bytes(b"a\t-\techo \xff\n"), "is not UTF-8 text (byte 9)"),
], ids=["missing", "folder", "not-utf8"])
def test_gpu_queue_names_the_tasks_flag_of_a_file_it_cannot_read(tmp_path, make, fault):
    tasks = tmp_path / "tasks.tsv"
    make(tasks)  # was: the OSError's or codec's message, naming neither the flag nor (not UTF-8) the file
    line = refusal("gpu_queue.py", "--tasks", str(tasks), "--gpus", "0", "--logs", str(tmp_path / "logs"))
    assert line == f"gpu_queue.py: error: --tasks {tasks} {fault}"


@pytest.mark.parametrize("lengths, fault", [
    (",", "names no value: give comma-separated integers >= 1, e.g. 2048,4096"),
    (" , ", "names no value: give comma-separated integers >= 1, e.g. 2048,4096"),
    ("0", "[0] must be >= 1"),
    ("-8192,8192", "[-8192] must be >= 1"),
], ids=["comma", "blank", "zero", "negative"])
def test_loss_anatomy_refuses_niah_lengths_that_name_no_length_at_least_1(tmp_path, lengths, fault):
    # was: "," and " , " silently meant no NIAH at all
    line = refusal("loss_anatomy.py", "dump", "--checkpoint", f"a={tmp_path}", "--data", str(tmp_path / "x*.jsonl"),
                   f"--niah-lengths={lengths}", "--out", str(tmp_path / "out"), "--job.config_file", DEBUG)
    separator = " " if fault.startswith("names") else ": "
    assert line.endswith(f"error: argument --niah-lengths: {lengths!r}{separator}{fault}")
