"""scripts/gpu_queue.py: one task per GPU at a time, in file order after the tasks each waits for, resumable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from gpu_queue import read_tasks, run_queue  # noqa: E402

from recipe.experiments.task_queue import exit_record  # noqa: E402


def tasks_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "tasks.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_each_task_runs_once_on_its_own_gpu_after_what_it_waits_for(tmp_path):
    out = tmp_path / "order"
    lines = [f"{name}\t{after}\techo {name} $CUDA_VISIBLE_DEVICES >> {out}" for name, after in
             [("a", "-"), ("b", "-"), ("c", "a,b"), ("d", "c")]]
    codes = run_queue(read_tasks(tasks_file(tmp_path, lines)), ["0", "1"], tmp_path / "logs", poll_s=0.01)
    assert codes == {"a": 0, "b": 0, "c": 0, "d": 0}
    ran = [line.split() for line in out.read_text().splitlines()]
    assert sorted(name for name, _ in ran[:2]) == ["a", "b"] and [name for name, _ in ran[2:]] == ["c", "d"]
    assert {gpu for _, gpu in ran[:2]} == {"0", "1"}  # a and b start together, each on a GPU of its own
    assert {gpu for _, gpu in ran} <= {"0", "1"}
    record = json.loads((tmp_path / "logs" / "c.json").read_text())
    assert record["returncode"] == 0 and record["end"] >= record["start"]


def test_a_failed_task_skips_its_dependants_and_a_rerun_repeats_only_what_did_not_succeed(tmp_path):
    counter = tmp_path / "runs"
    lines = [f"ok\t-\techo ok >> {counter}", "bad\t-\texit 3", "after_bad\tbad\ttrue",
             f"after_ok\tok\techo after_ok >> {counter}"]
    tasks = read_tasks(tasks_file(tmp_path, lines))
    assert run_queue(tasks, ["0"], tmp_path / "logs", poll_s=0.01) == {"ok": 0, "bad": 3, "after_bad": -1,
                                                                        "after_ok": 0}
    assert run_queue(tasks, ["0"], tmp_path / "logs", poll_s=0.01)["after_bad"] == -1
    assert counter.read_text().split() == ["ok", "after_ok"]  # the second run repeated neither success


def test_a_task_whose_command_changed_since_its_success_runs_again(tmp_path):
    """An edited study keeps its task names (`anatomy_s0_0` then scores other models): a record of another command
    under the name must not stand for the new one."""
    out = tmp_path / "ran"
    first = read_tasks(tasks_file(tmp_path, [f"pass\t-\techo first >> {out}", f"same\t-\techo same >> {out}"]))
    run_queue(first, ["0"], tmp_path / "logs", poll_s=0.01)
    edited = read_tasks(tasks_file(tmp_path, [f"pass\t-\techo edited >> {out}", f"same\t-\techo same >> {out}"]))
    assert run_queue(edited, ["0"], tmp_path / "logs", poll_s=0.01) == {"pass": 0, "same": 0}
    assert out.read_text().split() == ["first", "same", "edited"]


@pytest.mark.parametrize("line, message", [
    ("a\t-", r"tasks.tsv:1: expected name<TAB>after<TAB>command"),
    ("a\tb\ttrue", r"tasks.tsv:1: task 'a' waits for \['b'\], not named on an earlier line"),
])
def test_a_malformed_task_line_is_named(tmp_path, line, message):
    with pytest.raises(ValueError, match=message):
        read_tasks(tasks_file(tmp_path, [line]))


def test_the_long_study_queues_every_arm_of_both_seeds_after_its_stage_1(tmp_path):
    listing = subprocess.run(["bash", "scripts/time_to_quality_long.sh", "tasks"], cwd=REPO, capture_output=True,
                             text=True, timeout=60, check=True).stdout
    tasks = {t.name: t for t in read_tasks(tasks_file(tmp_path, listing.splitlines()))}
    for seed in (0, 1):
        assert tasks[f"dense_s{seed}"].after == tasks[f"causal_s{seed}"].after == ()
        assert tasks[f"causal_s{seed}_switch360"].after == (f"causal_s{seed}",)
        for switch in (360, 540):
            stage2 = tasks[f"causal_s{seed}_every4_switch{switch}"]
            assert stage2.after == (f"causal_s{seed}_every4",) and "DENSE_EVERY=4" in stage2.command
            assert f"stage2 causal {seed} {switch}" in stage2.command
    assert len(tasks) == 2 * 6 + 4  # six parts an arm-seed pair, four loss-by-position evaluations


def test_a_queue_stopped_by_its_time_signals_the_running_task_and_starts_no_other(tmp_path):
    """At `stop_after` the running task gets SIGTERM (a trainer saves its step and exits 143), its record says it
    was stopped, and the tasks not yet started are left (-2) for the next run of the queue, which starts with the
    stopped task again."""
    out = tmp_path / "ran"
    lines = [f"first\t-\techo first >> {out}",
             f"long\tfirst\ttrap 'echo saved >> {out}; exit 143' TERM; echo long >> {out}; sleep 30 & wait",
             f"after\tlong\techo after >> {out}", f"other\t-\techo other >> {out}"]
    tasks = read_tasks(tasks_file(tmp_path, lines))
    codes = run_queue(tasks, ["0"], tmp_path / "logs", poll_s=0.05, stop_after=1.0, grace_s=20,
                      invoked_as="study.py run --stop-after 1")
    assert codes == {"first": 0, "long": 143, "after": -2, "other": -2}
    assert out.read_text().split() == ["first", "long", "saved"]
    assert json.loads((tmp_path / "logs" / "long.json").read_text())["stopped"] is True
    assert json.loads((tmp_path / "logs" / "first.json").read_text())["stopped"] is False
    out.unlink()
    again = read_tasks(tasks_file(tmp_path, [line.replace("sleep 30 & wait", "true") for line in lines]))
    assert run_queue(again, ["0"], tmp_path / "logs", poll_s=0.05, invoked_as="study.py run") == {
        "first": 0, "long": 0, "after": 0, "other": 0}
    assert out.read_text().split() == ["long", "after", "other"]
    queues = {name: json.loads((tmp_path / "logs" / f"{name}.json").read_text())["queues"]
              for name in ("first", "long", "after")}
    assert queues == {"first": ["study.py run --stop-after 1"], "long": ["study.py run --stop-after 1", "study.py run"],
                      "after": ["study.py run"]}, "each exit record names the queues that ran its task"


def test_a_stopped_task_that_ignores_sigterm_is_killed_with_what_it_started_after_the_grace(tmp_path):
    child = tmp_path / "child.pid"
    lines = [f"stubborn\t-\ttrap '' TERM; sleep 60 & echo $! > {child}; wait; wait"]
    started = time.monotonic()
    codes = run_queue(read_tasks(tasks_file(tmp_path, lines)), ["0"], tmp_path / "logs", poll_s=0.05,
                      stop_after=0.5, grace_s=1.0)
    assert codes == {"stubborn": -signal.SIGKILL} and time.monotonic() - started < 20
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.read_text().strip()}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the group's SIGKILL reaches the grandchild too; its reaping by init may lag
    assert not Path(f"/proc/{child.read_text().strip()}").exists(), "the task's own child outlived the kill"


def test_a_sigterm_to_the_queue_stops_it_as_its_time_would(tmp_path):
    out = tmp_path / "ran"
    tasks = tasks_file(tmp_path, [f"long\t-\ttrap 'echo saved >> {out}; exit 143' TERM; echo long >> {out}; "
                                  "sleep 60 & wait", f"next\tlong\techo next >> {out}"])
    queue = subprocess.Popen(queue_command(tasks, tmp_path / "logs"), stdout=subprocess.PIPE, text=True,
                             env=queue_env())
    deadline = time.monotonic() + 60
    while not (out.is_file() and "long" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    queue.send_signal(signal.SIGTERM)
    stdout, _ = queue.communicate(timeout=60)
    assert queue.returncode == 1 and out.read_text().split() == ["long", "saved"]
    assert "[queue] stopping, it got SIGTERM: SIGTERM to long; 1 not started" in stdout


@pytest.mark.parametrize("flag", ["--stop-after", "--grace"])
def test_a_negative_or_infinite_time_is_refused_with_exit_2(tmp_path, flag):
    for value in ("-1", "inf"):
        run = subprocess.run(queue_command(tasks_file(tmp_path, ["a\t-\ttrue"]), tmp_path / "logs", flag, value),
                             capture_output=True, text=True, timeout=60, env=queue_env())
        assert run.returncode == 2 and f"{flag} {float(value):g} must be a finite number of seconds >= 0" in run.stderr
        assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("lines", [[], ["# a comment", ""]], ids=["empty", "comments-only"])
def test_a_task_file_without_a_task_is_refused_with_exit_2(tmp_path, lines):
    tasks = tasks_file(tmp_path, lines)
    run = subprocess.run(queue_command(tasks, tmp_path / "logs"), capture_output=True, text=True, timeout=60,
                         env=queue_env())
    assert run.returncode == 2
    assert run.stderr.splitlines()[-1].endswith(f"error: --tasks {tasks} holds no task (a line a task: "
                                                "name<TAB>after<TAB>command)")


def queue_command(tasks: Path, logs: Path, *options: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "gpu_queue.py"), "--tasks", str(tasks), "--gpus", "0",
            "--logs", str(logs), *options]


def queue_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("written", ['{"returncode": 0, "comm', "[0]", '{"returncode": "0", "command": "true"}',
                                     '{"returncode": 0, "command": "true", "queues": "q"}', "\udcff"],
                         ids=["cut-short", "not-object", "string-code", "queues-not-list", "not-utf8"])
def test_an_exit_record_the_queue_did_not_write_is_named_before_anything_runs(tmp_path, written):
    """The queue skips what its records say succeeded: a record edited or copied in by hand is one line naming the
    file (exit 2), and no task starts."""
    out, logs = tmp_path / "ran", tmp_path / "logs"
    logs.mkdir()
    (logs / "b.json").write_bytes(written.encode("utf-8", "surrogateescape"))
    tasks = tasks_file(tmp_path, [f"a\t-\techo a >> {out}", f"b\t-\techo b >> {out}"])
    run = subprocess.run(queue_command(tasks, logs), capture_output=True, text=True, timeout=60, env=queue_env())
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.strip().splitlines()[-1].startswith(f"gpu_queue.py: error: {logs / 'b.json'}: not a queue "
                                                          "exit record (")
    assert run.stderr.strip().splitlines()[-1].endswith("; delete it to run b again")


def test_each_exit_record_is_written_whole_and_read_back_as_written(tmp_path):
    out = tmp_path / "ran"
    tasks = read_tasks(tasks_file(tmp_path, [f"a\t-\techo a >> {out}", "b\ta\texit 7"]))
    assert run_queue(tasks, ["3"], tmp_path / "logs", poll_s=0.01, invoked_as="the queue") == {"a": 0, "b": 7}
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["a.json", "a.log", "b.json", "b.log"]
    record = exit_record(tmp_path / "logs", "b")
    assert (record["name"], record["gpu"], record["returncode"], record["command"], record["queues"]) == (
        "b", "3", 7, "exit 7", ["the queue"])
    assert exit_record(tmp_path / "logs", "c") is None
