"""The replication's pieces on CPU: the corpus split (per file and per package), the switch analysis, the
report of a fabricated run (in the run folder; docs/ only with --publish), and the pipeline's refusal of
step counts whose switch points fall between logged steps and of unknown arguments."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from eval.studies import replicate
from recipe.experiments.corpus import is_heldout, make_corpus

from .helpers import script_exit_code

REPO = Path(__file__).resolve().parents[1]

ISSUE_ARM_KEYS = {"name", "lighthouse_steps", "dense_steps", "final_train_loss", "final_heldout_loss",
                  "wall_clock_s", "niah_mean"}


def _write_sources(root: Path, rng: random.Random, n: int) -> None:
    for i in range(n):
        path = root / f"pkg{i % 3}" / f"module_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"value_{j} = {rng.random()!r}\n" for j in range(rng.randint(1, 5))))


def test_corpus_split_is_disjoint_by_file_and_independent_of_the_seed(tmp_path):
    rng = random.Random()
    _write_sources(tmp_path / "src", rng, 60)
    (tmp_path / "src" / "site-packages").mkdir()
    (tmp_path / "src" / "site-packages" / "skipped.py").write_text("x = 1\n")
    (tmp_path / "src" / "latin1.py").write_bytes(b"s = '\xe9'\n")
    first = make_corpus([tmp_path / "src"], tmp_path / "a", heldout_every=4, seed=1)
    second = make_corpus([tmp_path / "src"], tmp_path / "b", heldout_every=4, seed=2)

    def records(root, split):
        return [json.loads(line) for line in (root / split / "corpus.jsonl").read_text().splitlines()]

    train, heldout = records(tmp_path / "a", "train"), records(tmp_path / "a", "heldout")
    names = {r["path"] for r in train} | {r["path"] for r in heldout}
    assert names == {f"src/pkg{i % 3}/module_{i}.py" for i in range(60)}  # site-packages and non-UTF-8 left out
    assert not {r["path"] for r in train} & {r["path"] for r in heldout}
    assert all(is_heldout(r["path"], 4) for r in heldout)
    assert first["skipped_not_utf8"] == 1 and first["heldout_files"] == first["heldout_documents"] == len(heldout) > 0
    assert first["documents"] == "files" and first["train_document_bytes"]["max"] == max(
        len(r["text"].encode()) for r in train)
    assert records(tmp_path / "b", "heldout") == heldout  # the seed orders training documents only
    assert sorted(r["path"] for r in records(tmp_path / "b", "train")) == sorted(r["path"] for r in train)
    assert second["train_bytes"] == first["train_bytes"]


def test_package_documents_join_a_folders_own_files_in_path_order_and_split_by_folder(tmp_path):
    rng = random.Random()
    _write_sources(tmp_path / "src", rng, 30)  # src/pkg0..pkg2, 10 modules each
    (tmp_path / "src" / "pkg0" / "sub").mkdir()
    (tmp_path / "src" / "pkg0" / "sub" / "b.py").write_text("b = 2\n")
    (tmp_path / "src" / "pkg0" / "sub" / "a.py").write_text("a = 1")  # no final newline
    (tmp_path / "src" / "pkg0" / "sub" / "empty.py").write_text("\n")  # blank files are no text
    (tmp_path / "src" / "top.py").write_text("top = 0\n")
    manifest = make_corpus([tmp_path / "src"], tmp_path / "out", heldout_every=4, documents="packages")

    def records(split):
        return {r["path"]: r["text"] for r in map(json.loads, (tmp_path / "out" / split / "corpus.jsonl").open())}

    train, heldout = records("train"), records("heldout")
    assert sorted([*train, *heldout]) == ["src", "src/pkg0", "src/pkg0/sub", "src/pkg1", "src/pkg2"]
    assert set(heldout) == {"src/pkg0", "src/pkg2"}  # the SHA-1 of the folder name decides, as for files
    assert all(is_heldout(name, 4) for name in heldout)
    documents = {**train, **heldout}
    assert documents["src/pkg0/sub"] == "# ---- src/pkg0/sub/a.py ----\na = 1\n# ---- src/pkg0/sub/b.py ----\nb = 2\n"
    assert documents["src"] == "# ---- src/top.py ----\ntop = 0\n"  # a folder's own files, not its subfolders'
    for i in range(3):  # ten modules, in path order (module_12 before module_3)
        modules = sorted((tmp_path / "src" / f"pkg{i}").glob("*.py"), key=lambda path: path.name)
        assert documents[f"src/pkg{i}"] == "".join(f"# ---- src/pkg{i}/{m.name} ----\n{m.read_text()}" for m in modules)
    sizes = {name: len(text.encode()) for name, text in documents.items()}
    assert manifest["documents"] == "packages"
    assert (manifest["heldout_documents"], manifest["heldout_files"]) == (2, 20)
    assert (manifest["train_documents"], manifest["train_files"]) == (3, 10 + 2 + 1)
    assert manifest["heldout_bytes"] == sizes["src/pkg0"] + sizes["src/pkg2"]
    train_sizes = sorted(sizes[name] for name in train)
    assert manifest["train_document_bytes"] == {"mean": round(sum(train_sizes) / 3, 1), "median": train_sizes[1],
                                                "max": train_sizes[2]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(heldout_every=1), "heldout_every=1 must be >= 2"),
    (dict(same_names=True), r"^sources \['.*/x/src', '.*/y/src'\] share a folder name"),  # the library's argument
    (dict(documents="modules"), r"documents='modules' is not one of \('files', 'packages'\)"),
], ids=["every-file-held-out", "duplicate-folder-names", "unknown-document-mode"])
def test_corpus_rejects_bad_settings(tmp_path, kwargs, message):
    _write_sources(tmp_path / "x" / "src", random.Random(), 4)
    _write_sources(tmp_path / "y" / "src", random.Random(), 4)
    sources = [tmp_path / "x" / "src", tmp_path / "y" / "src"] if kwargs.pop("same_names", False) else \
        [tmp_path / "x" / "src"]
    with pytest.raises(ValueError, match=message):
        make_corpus(sources, tmp_path / "out", **kwargs)


@pytest.mark.parametrize("argv, message", [
    (["--source", "{tmp}/missing"], "--source ['{tmp}/missing']: not a folder"),
    (["--source", "{tmp}/empty"], "--source ['{tmp}/empty']: 0 files give 0 training and 0 held-out documents"),
    (["--source", "{tmp}/src", "--heldout-every", "1"], "argument --heldout-every: 1 must be >= 2"),
], ids=["missing-folder", "no-python-files", "every-file-held-out"])
def test_the_corpus_command_refuses_bad_options_in_one_line_with_exit_2(argv, message, tmp_path, monkeypatch,
                                                                         capsys):
    _write_sources(tmp_path / "src", random.Random(), 4)
    (tmp_path / "empty").mkdir()
    argv = [a.format(tmp=tmp_path) for a in argv] + ["--out", str(tmp_path / "out")]
    assert script_exit_code("make_corpus.py", argv, monkeypatch) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"make_corpus.py: error: {message.format(tmp=tmp_path)}"), lines
    assert not (tmp_path / "out").exists()


def _arm_with_gaps(dense: dict[int, float], switch: int, before: float, after: list[float]):
    losses = {s: dense[s] + before for s in range(10, switch + 1, 10)}
    losses.update({switch + 1 + i: dense[switch + 1 + i] + g for i, g in enumerate(after)})
    return replicate.Arm("switch", switch, losses, [])


def test_switch_analysis_measures_spike_recovery_and_match_against_the_dense_arm():
    rng = random.Random()
    steps, switch = 120, 70
    dense = {s: 3.0 - 0.01 * s + rng.uniform(-0.2, 0.2) for s in range(1, steps + 1)}
    # After the switch: 5 steps 0.4 above dense, 20 steps 0.015 above, then 0.02 below.
    after = [0.4] * 5 + [0.015] * 20 + [-0.02] * 25
    result = replicate.switch_analysis(_arm_with_gaps(dense, switch, 0.02, after), dense, steps)
    assert result["gap_before_switch"] == pytest.approx(0.02)
    assert result["switch_spike"] == pytest.approx(0.38)
    # First 10-step window at or under 0.02: it must skip all five 0.4 steps -> starts at step 6 after the switch.
    assert result["recovery_steps"] == 6
    # At or under 0: at most 5 of the 0.015 steps (positions 6..25) in the window -> starts at 21.
    assert result["steps_to_match_dense"] == 21
    assert result["final_gap_to_dense"] == pytest.approx(-0.02)


def test_switch_analysis_says_never_when_the_arm_stays_above_dense():
    dense = {s: 2.0 for s in range(1, 81)}
    result = replicate.switch_analysis(_arm_with_gaps(dense, 50, -0.01, [0.05] * 30), dense, 80)
    assert result["recovery_steps"] is None and result["steps_to_match_dense"] is None


def _fabricate_run(run: Path, steps: int, rng: random.Random) -> dict[str, float]:
    """A replicate.sh output folder with plausible contents; returns the process wall times written."""
    a, b = steps * 5 // 8, steps * 3 // 4
    dense = {s: 3.0 - s / steps + rng.uniform(-0.1, 0.1) for s in range(1, steps + 1)}

    def write_metrics(folder: str, losses: dict[int, float], tps: float) -> None:
        (run / folder).mkdir(parents=True, exist_ok=True)
        with open(run / folder / "metrics.jsonl", "w") as f:
            for step, loss in sorted(losses.items()):
                f.write(json.dumps({"step": step, "loss_metrics/global_avg_loss": loss,
                                    "throughput(tps)": tps * rng.uniform(0.95, 1.05)}) + "\n")

    write_metrics("dense", dense, 1000.0)
    write_metrics("lighthouse", {s: dense[s] + 0.05 for s in [1, *range(10, b + 1, 10)]}, 2500.0)
    for switch in (a, b):
        write_metrics(f"switch_{switch}", {s: dense[s] - 0.01 for s in range(switch + 1, steps + 1)}, 1000.0)
    walltimes = {f"dense-to-{steps}": 100.0, f"lighthouse-to-{a}": 30.0, f"lighthouse-to-{b}": 8.0,
                 f"switch_{a}-to-{steps}": 40.0, f"switch_{b}-to-{steps}": 27.0}
    with open(run / "walltime.jsonl", "w") as f:
        for name, seconds in walltimes.items():
            f.write(json.dumps({"name": name, "start": 1000.0, "end": 1000.0 + seconds}) + "\n")
    (run / "eval").mkdir()
    provenance = {"device": "NVIDIA H100 80GB HBM3", "seq_len": 16384, "date": "2026-11-26T07:00:00+00:00",
                  "commit": "abc1234"}
    for name in ("dense", f"switch_{a}", f"switch_{b}", f"stage1_{a}", f"stage1_{b}"):
        loss = {"dense": rng.uniform(1, 2)}
        if name.startswith("stage1"):
            loss["lighthouse"] = rng.uniform(1, 2)
        (run / "eval" / f"heldout_{name}.json").write_text(json.dumps({"loss": loss, **provenance}))
        (run / "eval" / f"niah_{name}.json").write_text(json.dumps({"mean": rng.randint(0, 10) / 10}))
    (run / "corpus").mkdir()
    (run / "corpus" / "manifest.json").write_text(json.dumps({"train_files": 3}))
    return walltimes


def test_report_of_a_run_has_the_issues_keys_and_sums_each_arms_stages(tmp_path):
    rng, steps, run, docs = random.Random(), 160, tmp_path / "run", tmp_path / "docs"
    walltimes = _fabricate_run(run, steps, rng)
    rates = {"dense": 1000.0, "lighthouse": 2500.0}  # the tok/s _fabricate_run logs (within 5%)
    docs.mkdir()
    tokens_per_step = replicate.tokens_per_step(["--job.config_file", "configs/replicate/small.toml"])
    results, table = replicate.write_report(run, steps, tokens_per_step, run, publish_to=docs)
    assert json.loads((run / "results.json").read_text()) == results and (run / "report.md").read_text() == table
    assert (run / "replicate_loss.png").stat().st_size > 0 and "| switch_100 | 100 |" in (run / "report.md").read_text()
    # --publish copies results and plot into docs/; the tables stay in the run folder
    assert sorted(p.name for p in docs.iterdir()) == ["replicate_loss.png", "results.json"]
    assert json.loads((docs / "results.json").read_text()) == results
    assert (docs / "replicate_loss.png").read_bytes() == (run / "replicate_loss.png").read_bytes()
    assert results["device"] == "NVIDIA H100 80GB HBM3"
    assert results["tokens_per_arm"] == steps * 4 * 16384  # configs/replicate/small.toml: batch 4 x 16,384
    arms = {a["name"]: a for a in results["arms"]}
    assert list(arms) == ["dense", "switch_100", "switch_120"]
    assert all(ISSUE_ARM_KEYS <= set(a) for a in arms.values())
    assert [(a["lighthouse_steps"], a["dense_steps"]) for a in arms.values()] == [(0, 160), (100, 60), (120, 40)]
    assert arms["dense"]["wall_clock_s"] == pytest.approx(walltimes["dense-to-160"])
    assert arms["switch_100"]["wall_clock_s"] == pytest.approx(30.0 + 40.0)
    assert arms["switch_120"]["wall_clock_s"] == pytest.approx(30.0 + 8.0 + 27.0)
    assert arms["switch_120"]["final_gap_to_dense"] == pytest.approx(-0.01)
    for arm in arms.values():
        assert arm["loop_s"] == pytest.approx(sum(arm["stage_loop_s"].values()))
        steps_of = {"lighthouse": arm["lighthouse_steps"], "dense": arm["dense_steps"]}
        for stage, tok_s in arm["stage_tok_s"].items():
            assert 0.95 * rates[stage] <= tok_s <= 1.05 * rates[stage]
            assert arm["stage_loop_s"][stage] == pytest.approx(steps_of[stage] * 4 * 16384 / tok_s)
    assert arms["switch_100"]["gap_before_switch"] == pytest.approx(0.05)
    heldout = json.loads((tmp_path / "run" / "eval" / "heldout_switch_100.json").read_text())
    assert arms["switch_100"]["final_heldout_loss"] == heldout["loss"]["dense"]
    assert set(results["stage1_heldout_loss"]["100"]) == {"lighthouse", "dense", "niah_mean_lighthouse"}


@pytest.mark.parametrize("steps, message", [("100", "a positive multiple of 80"), ("0", "a whole number >= 1"),
                                           ("-80", "a whole number >= 1")])
def test_replicate_refuses_step_counts_that_are_not_multiples_of_80(steps, message, tmp_path):
    out = subprocess.run(["bash", "scripts/replicate.sh", "dense"], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "STEPS": steps, "RUN": str(tmp_path)})
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith(f"STEPS={steps} must be {message}")


@pytest.mark.slow
def test_replicate_report_goes_to_the_run_folder_and_leaves_the_tracked_docs_alone(tmp_path):
    """`replicate.sh report` without --publish: results, plot and tables under $RUN, docs/ untouched."""
    run = tmp_path / "run"
    _fabricate_run(run, 160, random.Random())
    tracked = [REPO / "docs" / "records" / "results.json", REPO / "docs" / "records" / "replicate_loss.png"]
    before = [(path.read_bytes(), path.stat().st_mtime_ns) for path in tracked]
    env = {key: value for key, value in os.environ.items() if key != "REPORT_OUT"}
    out = subprocess.run(["bash", "scripts/replicate.sh", "report"], cwd=REPO, capture_output=True, text=True,
                         env={**env, "STEPS": "160", "RUN": str(run), "PYTHON": sys.executable}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [(path.read_bytes(), path.stat().st_mtime_ns) for path in tracked] == before
    assert json.loads((run / "results.json").read_text())["steps"] == 160
    assert (run / "replicate_loss.png").stat().st_size > 0
    assert (run / "report.md").read_text() in out.stdout


@pytest.mark.parametrize("argv, env, message", [
    (["dense", "--publish"], {}, "usage:"),
    (["report", "--publish", "docs"], {}, "usage:"),
    (["report"], {"REPORT_OUT": "docs"}, "REPORT_OUT=docs is not read"),
], ids=["publish-without-report", "extra-argument", "report-out"])
def test_replicate_refuses_unknown_arguments_and_the_old_report_folder(argv, env, message, tmp_path):
    out = subprocess.run(["bash", "scripts/replicate.sh", *argv], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "RUN": str(tmp_path), **env})
    assert out.returncode == 2 and message in out.stderr
    assert not list(tmp_path.iterdir())
