"""What a study's run folder takes to another machine so that its queue continues there: every finished task's
record, log and run folder without checkpoints, and only the checkpoint steps that an unfinished task reads (stage
0's weights for a fresh run, stage 1's switch step for its stage 2, a model its per-token pass has yet to score).
A training task that was stopped part-way (`gpu_queue.py --stop-after`: it saved the step it was on) goes along
with its folder and its latest whole step, and resumes there; it reads no other checkpoint then.

Unpacked into the run folder of the other machine (`tar xzf <pack> -C <run>`), the same `payoff_map.py run`
trains what is left and nothing again. A checkpoint over `max_mb` is left out, and so is the task that wrote it:
that task trains again there, so nothing waits for weights that did not come. Standard library only.
"""
from __future__ import annotations

import shlex
import tarfile
from pathlib import Path

from recipe.experiments.task_queue import Task, exit_record, read_tasks, succeeded

QUEUE_FOLDER = "queue"  # the queue's logs and exit records, under the run folder
TASKS_FILE = "tasks.tsv"
CHECKPOINT_FOLDER = "checkpoint"
WHOLE_STEP = "manifest.json"  # recipe.resilience.checkpoint_manifest: written last, so a step that has it is whole


def read_paths(run: Path, command: str) -> list[Path]:
    """The checkpoint step folders under `run` that `command` reads (`--flag PATH`, `--flag=PATH` or `NAME=PATH`)."""
    paths = []
    for arg in shlex.split(command):
        path = Path(arg.rsplit("=", 1)[-1])
        if path.is_relative_to(run) and CHECKPOINT_FOLDER in path.relative_to(run).parts[1:2]:
            paths.append(path)
    return paths


def outputs(run: Path, task: Task) -> list[Path]:
    """What a finished task left under `run` besides its checkpoints: its queue record and log, and its run folder
    (a training task) or the files of its `--out` prefix (the per-token pass)."""
    found = [run / QUEUE_FOLDER / f"{task.name}{suffix}" for suffix in (".json", ".log")]
    folder = run / task.name
    if folder.is_dir():
        found += [p for p in folder.iterdir() if p.name != CHECKPOINT_FOLDER]
    args = shlex.split(task.command)
    if "--out" in args:
        prefix = Path(args[args.index("--out") + 1])
        found += sorted(prefix.parent.glob(f"{prefix.name}.*"))
    return [p for p in found if p.exists()]


def size_mb(folder: Path) -> float:
    """The bytes of the files under `folder`, in MB."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def latest_whole_step(folder: Path) -> Path | None:
    """The last step folder of a run folder that a resume takes whole (its manifest written), or None."""
    steps = [p for p in (folder / CHECKPOINT_FOLDER).glob("step-*")
             if p.name.removeprefix("step-").isdigit() and (p / WHOLE_STEP).is_file()]
    return max(steps, key=lambda p: int(p.name.removeprefix("step-")), default=None)


def earlier_tasks(run: Path, queued: set[str]) -> tuple[list[Task], dict[str, str]]:
    """The tasks of `run`'s queue records that an earlier `run` (another `--only`) finished and the last queue does
    not name, as tasks waiting for nothing (their records go along; they were dropped from a pack unsaid), and
    {task: why} for those it stopped part-way (their steps stay behind: a queue that names them trains them again)."""
    finished, stopped = [], {}
    for record in sorted((run / QUEUE_FOLDER).glob("*.json")):
        if record.stem in queued:
            continue
        ran = exit_record(run / QUEUE_FOLDER, record.stem)
        if ran["returncode"] == 0 and ran["command"]:
            finished.append(Task(record.stem, (), ran["command"]))
        else:
            stopped[record.stem] = f"not in the queue of the last `run` ({TASKS_FILE}), stopped part-way"
    return finished, stopped


def plan_pack(run: Path, max_mb: float | None = None, behind: frozenset[str] = frozenset()) -> dict:
    """{"finished": task names to pack (the last queue's, then those an earlier queue of the folder finished),
    "resumed": {task: its latest whole step} for the training tasks stopped part-way, "checkpoints": step folders to
    pack (those the tasks left read, and the resumed steps), "files": every path the pack holds (the finished and
    resumed tasks' `outputs` and the checkpoints), "left_out": {task: why}} for the queue of `run` (its tasks.tsv and
    records). A stopped task whose step is over `max_mb` trains again whole. A task left out takes every finished
    task that started from it along: they would otherwise sit beside a new training of their parent, which on a GPU
    is not the same weights. The finished tasks named in `behind` go without their checkpoints (`missing_inputs`
    trains them again where a task left reads one): only for tasks that train again bit for bit."""
    tasks = read_tasks(run / TASKS_FILE)
    finished = {t.name for t in tasks if succeeded(run / QUEUE_FOLDER, t)}
    earlier, left_out = earlier_tasks(run, {t.name for t in tasks})
    tasks += earlier
    finished |= {t.name for t in earlier}
    resumed = {t.name: step for t in tasks if t.name not in finished and (step := latest_whole_step(run / t.name))}
    for name, step in list(resumed.items()):
        if max_mb is not None and (mb := size_mb(step)) > max_mb:
            del resumed[name]
            left_out[name] = f"{step.relative_to(run)} holds {mb:.1f} MB, over {max_mb:g}: trains again whole"
    while True:  # leaving tasks out can make another checkpoint needed: until nothing changes
        needed = {path for t in tasks if t.name not in finished and t.name not in resumed
                  for path in read_paths(run, t.command)
                  if path.relative_to(run).parts[0] in finished - behind}
        refused = {}
        for path in sorted(needed):
            shown = path.relative_to(run)
            if not (path / ".metadata").is_file():
                refused[shown.parts[0]] = f"{shown} is not a complete checkpoint"
            elif max_mb is not None and (mb := size_mb(path)) > max_mb:
                refused[shown.parts[0]] = f"{shown} holds {mb:.1f} MB, over {max_mb:g}"
        if not refused:
            break
        for task in tasks:  # file order: a task's parents come first
            parent = next((p for p in task.after if p in refused), None)
            if (task.name in finished or task.name in resumed) and (task.name in refused or parent):
                finished.discard(task.name)
                resumed.pop(task.name, None)
                left_out[task.name] = refused.get(task.name) or f"it started from {parent}, left out"
                refused.setdefault(task.name, left_out[task.name])
    packed = [t for t in tasks if t.name in finished or t.name in resumed]
    checkpoints = sorted(needed | set(resumed.values()))
    return {"finished": [t.name for t in packed if t.name in finished], "resumed": resumed,
            "checkpoints": checkpoints, "files": [p for t in packed for p in outputs(run, t)] + checkpoints,
            "left_out": left_out}


def write_pack(run: Path, out: Path, max_mb: float | None = None, behind: frozenset[str] = frozenset()) -> dict:
    """Write the tar.gz of `plan_pack` to `out` (paths relative to `run`); returns the plan."""
    plan = plan_pack(run, max_mb, behind)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for path in plan["files"]:
            tar.add(path, arcname=str(path.relative_to(run)))
    return plan


def missing_inputs(run: Path) -> dict[str, str]:
    """{finished task: why it trains again} for the finished tasks of `run`'s queue whose checkpoint step that a
    task left to train reads is not here (not whole): a pack carried without it, to fit a size limit. A task that
    resumes its own step reads nothing else."""
    tasks = read_tasks(run / TASKS_FILE)
    finished = {t.name for t in tasks if succeeded(run / QUEUE_FOLDER, t)}
    stale: dict[str, str] = {}
    for task in tasks:
        if task.name in finished or latest_whole_step(run / task.name):
            continue
        for path in read_paths(run, task.command):
            writer = path.relative_to(run).parts[0]
            if writer in finished and writer not in stale and not (path / ".metadata").is_file():
                stale[writer] = f"{task.name} reads {path.relative_to(run)}, which is not here"
    return stale
