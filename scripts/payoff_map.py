"""The pay-off map: train a grid of Lighthouse -> dense arms (k x switch x dense layers x LR re-warm) and
dense over seeds from one study TOML, then report distributions over seeds (docs/recipe.md, "The pay-off map").

    python scripts/payoff_map.py tasks  configs/payoff/tiny_128k_extension.toml        # print the queue
    python scripts/payoff_map.py run    configs/payoff/tiny_128k_extension.toml --gpus 0,1,2,3   # one machine
    python scripts/payoff_map.py run    configs/payoff/tiny_128k_extension.toml --gpus 0,1,2,3 --order long-first
    python scripts/payoff_map.py run    configs/payoff/tiny_128k_extension.toml --order arm-first \\
        --only stage0_s4,causal_s4,causal_s4_switch360   # a lease's part
    python scripts/payoff_map.py submit configs/payoff/tiny_128k_extension.toml -- --partition=gpu --gres=gpu:1
    python scripts/payoff_map.py report configs/payoff/tiny_128k_extension.toml \\
        [--include docs/records/payoff_extension.json]
    python scripts/payoff_map.py pack   configs/payoff/tiny_128k_extension.toml --out extension.tar.gz   # elsewhere

The study file's format is `recipe.experiments.payoff_grid`'s docstring. `run` queues every run on the GPUs of this
machine (`scripts/gpu_queue.py`: one run per GPU, each after the runs it resumes; rerun to continue a stopped
queue); `submit` makes each run one SLURM job (`sbatch --dependency=afterok` on the runs it resumes; sbatch
options after `--`). With `[study] anatomy_windows`, each seed's final models (in an extension study its frontier
runs too) also get their per-token losses (and NIAH with `niah_lengths`) scored after that seed's runs (with
`--order arm-first`, each model right after it; `scripts/loss_anatomy.py dump`). `report` writes
`<run>/report/payoff.{json,md}`, `payoff_finals.png` (every final loss by arm), the curves, with per-token dumps the
loss anatomy of the lower vs the upper dense group, and in an extension study the loss by position class and past
stage 0 at matched compute (`eval.studies.loss_by_position`). `pack` writes what another machine needs to continue
the queue (`recipe.experiments.study_pack`): unpacked into its run folder, `run` there trains only what is left.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from eval.options import gpu_list, output_file, read_json
from recipe.errors import ConfigError, exit_on_config_error
from recipe.experiments.corpus import corpus_digest, make_corpus
from recipe.experiments.payoff_grid import (Study, arm_first, load_study, long_first, plan_runs, scored_models,
                                           stage0_name, train_command)
from recipe.experiments.study_pack import QUEUE_FOLDER, TASKS_FILE, missing_inputs, write_pack
from recipe.experiments.task_queue import bad_seconds, exit_record

# `tasks`, `run` and `submit` need only the study: the report's modules (torch, torchtitan, matplotlib: seconds to
# import) are imported by `report`, and NIAH's by a study that names NIAH lengths.


def anatomy_command(study: Study, dump: str, models: dict[str, int], python: str) -> str:
    """The per-token pass over the models of one seed, each name at the step of its checkpoint (one process, dense
    attention), written to `<run>/anatomy/<dump>.{npz,json}`."""
    argv = [python, "scripts/loss_anatomy.py", "dump", "--data", str(study.corpus / "heldout" / "*.jsonl"),
            "--windows", str(study.anatomy_windows), "--out", str(study.run / "anatomy" / dump)]
    for name, step in models.items():
        argv += ["--checkpoint", f"{name}={study.run / name / 'checkpoint' / f'step-{step}'}"]
    if study.niah_lengths:
        argv += ["--niah-lengths", ",".join(map(str, study.niah_lengths))]
    return shlex.join(argv + ["--job.config_file", study.config, "--lighthouse.no-enable",
                              "--training.dataset_path", str(study.corpus / "train"),
                              "--validation.dataset_path", str(study.corpus / "heldout")])


ORDERS = ("seed", "long-first", "arm-first")


Task = tuple[str, tuple[str, ...], str]  # name, the tasks it waits for, command


def task_names(text: str) -> list[str]:
    """argparse type of --only: comma-separated task names, at least one (an empty --only, such as an unset shell
    variable, queued the whole study)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no task: give comma-separated task names "
                                         "(`tasks` lists them)")
    return names


def keep_only(tasks: list[Task], names: list[str]) -> list[Task]:
    """The tasks named in `names`, in queue order (`--only`: the part of a queue that fits a lease of known
    length); a config error naming any name that is no task of the queue, or a task whose waits are not named too."""
    known = {name for name, _, _ in tasks}
    if unknown := [n for n in names if n not in known]:
        raise ConfigError(f"--only {','.join(names)}: {unknown} are not tasks of this queue (`tasks` lists them; "
                         "finished runs under `reported` are left out)")
    kept = [task for task in tasks if task[0] in names]
    if missing := {name: [w for w in after if w not in names] for name, after, _ in kept if set(after) - set(names)}:
        raise ConfigError(f"--only {','.join(names)}: the tasks {missing} wait for tasks not named; name them too")
    return kept


def queue(study: Study, python: str = "python3", order: str = "seed", only: list[str] | None = None) -> list[Task]:
    """`ordered_queue`, cut to the tasks named in `only` where it is given (`keep_only`)."""
    tasks = ordered_queue(study, python, order)
    return keep_only(tasks, only) if only else tasks


def ordered_queue(study: Study, python: str, order: str) -> list[Task]:
    """(name, waits, command) of every task in queue order. "seed": the runs as
    `recipe.experiments.payoff_grid.plan_runs` orders them, and with `anatomy_windows` after each seed's runs of a grid
    block the per-token pass over its new scored models (`recipe.experiments.payoff_grid.scored_models`). "long-first":
    the runs as `recipe.experiments.payoff_grid.long_first` orders them (to fit a study into a lease of fixed length on
    several GPUs), then each seed's per-token pass. "arm-first": the runs as `arm_first` orders them (each arm whole
    before the next, on one GPU), each scored model's per-token pass right after it, so that a lease that ends, or a
    machine that is lost, leaves no finished model unscored and no checkpoint that a later pass must read; each pass and
    its dump are named after its model, so that listing finished runs under `reported` renames none of the others and no
    pass overwrites the dump of another."""
    if order == "arm-first":
        tasks = []
        for run in arm_first(plan_runs(study)):
            tasks.append((run.name, run.after, train_command(study, run, python)))
            models = scored_models(study, [run]).get(run.seed) if study.anatomy_windows else None
            if models:
                tasks.append((f"anatomy_{run.name}", (run.name,), anatomy_command(study, run.name, models, python)))
        return tasks
    if order == "long-first":
        runs = long_first(plan_runs(study))
        tasks = [(run.name, run.after, train_command(study, run, python)) for run in runs]
        if study.anatomy_windows:
            tasks += [(f"anatomy_s{seed}_0", tuple(models), anatomy_command(study, f"s{seed}_0", models, python))
                      for seed, models in scored_models(study, runs).items()]
        return tasks
    runs = plan_runs(study)
    tasks, scored = [], set()
    for i, run in enumerate(runs):
        tasks.append((run.name, run.after, train_command(study, run, python)))
        block_ends = i + 1 == len(runs) or runs[i + 1].seed != run.seed
        if study.anatomy_windows and block_ends:
            models = {n: step for n, step in scored_models(study, runs[:i + 1]).get(run.seed, {}).items()
                      if n not in scored}
            if models:
                scored.update(models)
                part = sum(1 for name, _, _ in tasks if name.startswith(f"anatomy_s{run.seed}_"))
                tasks.append((f"anatomy_s{run.seed}_{part}", tuple(models),
                              anatomy_command(study, f"s{run.seed}_{part}", models, python)))
    return tasks


def queue_lines(study: Study, python: str, order: str = "seed", only: list[str] | None = None) -> list[str]:
    """The queue as `scripts/gpu_queue.py` reads it: `name<TAB>waits or -<TAB>command`, one task a line."""
    return [f"{name}\t{','.join(after) or '-'}\t{command}"
            for name, after, command in queue(study, python, order, only)]


def write_queue(study: Study, python: str, order: str = "seed", only: list[str] | None = None) -> Path:
    from recipe.logs.run_record import source_commit

    lines = queue_lines(study, python, order, only)  # a bad --only stops here, before the run folder is made
    study.run.mkdir(parents=True, exist_ok=True)
    path = study.run / TASKS_FILE
    path.write_text("".join(line + "\n" for line in lines))
    (study.run / "study.json").write_text(json.dumps(
        {"study": str(study.path), "toml": study.path.read_text(), "order": order, "only": only,
         "commit": source_commit()},
        indent=1) + "\n")
    return path


def check_corpus(study: Study) -> None:
    """The study's corpus must exist, and give `corpus_digest` where the study pins one; with `corpus_sources` a
    missing one is built first (`recipe.experiments.corpus`)."""
    missing = [str(study.corpus / part) for part in ("train", "heldout") if not (study.corpus / part).is_dir()]
    if missing and study.corpus_sources:
        if absent := [str(s) for s in study.corpus_sources if not s.is_dir()]:
            raise ConfigError(f"{study.path}: study.corpus_sources {absent} are not folders")
        try:
            manifest = make_corpus(study.corpus_sources, study.corpus, heldout_every=4,
                                   sources_option=f"{study.path}: study.corpus_sources")
        except ValueError as err:  # sources that share a folder name, or hold too few files to split
            raise ConfigError(str(err)) from None
        print(f"built the corpus {study.corpus} from {manifest['sources']}: {manifest['train_documents']} training "
              f"and {manifest['heldout_documents']} held-out documents", flush=True)
    elif missing:
        raise ConfigError(f"{study.path}: study.corpus = {str(study.corpus)!r} lacks {missing}; build it with "
                          f"RUN={study.corpus.parent} scripts/time_to_quality_long.sh corpus, or make_corpus.py")
    if study.corpus_digest and not (digest := corpus_digest(study.corpus)).startswith(study.corpus_digest):
        raise ConfigError(f"{study.path}: study.corpus_digest = {study.corpus_digest!r}, but {study.corpus} gives "
                          f"{digest[:len(study.corpus_digest)]}: runs on another corpus would not join the study's "
                          "records (built from other sources or another Python?)")


def submit(study: Study, python: str, sbatch_options: list[str], order: str = "seed",
           only: list[str] | None = None) -> dict[str, str]:
    """One SLURM job per task, each after the jobs of the tasks it waits for; prints and returns the job ids."""
    if shutil.which("sbatch") is None:
        raise ConfigError("submit needs SLURM's sbatch on PATH (none here); `run` queues the study on this machine")
    repo = Path(__file__).resolve().parent.parent
    jobs: dict[str, str] = {}
    for name, after, command in queue(study, python, order, only):
        argv = ["sbatch", "--parsable", f"--job-name={name}", f"--output={study.run / 'slurm' / name}.%j.log",
                *sbatch_options]
        if after:
            argv += [f"--dependency=afterok:{':'.join(jobs[w] for w in after)}", "--kill-on-invalid-dep=yes"]
        argv += ["--wrap", f"cd {shlex.quote(str(repo))} && {command}"]
        out = subprocess.run(argv, capture_output=True, text=True)
        if out.returncode != 0:
            raise ConfigError(f"sbatch failed for {name} (exit {out.returncode}): {out.stderr.strip()}")
        jobs[name] = out.stdout.strip().split(";")[0]
        print(f"{jobs[name]} {name}", flush=True)
    return jobs


def anatomy_pairs(summary: dict, dumps: set[str]) -> list[tuple[str, str]]:
    """The pre-registered comparison: the lowest-numbered dense seed of each group (by the threshold; without
    one, the two dense seeds farthest apart), and the baseline arm of those seeds against their dense run."""
    dense = {s: row for s, row in summary["arms"].get("dense", {}).get("seeds", {}).items() if f"dense_s{s}" in dumps}
    if len(dense) < 2:
        return []
    groups = {g: sorted(s for s, row in dense.items() if row.get("group") == g) for g in ("lower", "upper")}
    if groups["lower"] and groups["upper"]:
        low, high = groups["lower"][0], groups["upper"][0]
    else:
        low, high = min(dense, key=lambda s: dense[s]["final"]), max(dense, key=lambda s: dense[s]["final"])
    pairs = [(f"dense_s{high}", f"dense_s{low}")]
    baseline = summary.get("baseline")
    for seed in (low, high):
        name = baseline.replace("_", f"_s{seed}_", 1) if baseline else None
        if name in dumps:
            pairs.append((name, f"dense_s{seed}"))
    return pairs


def queue_commands(run: Path, record: dict) -> dict:
    """The `command` of the queue that ran `record`'s tasks (stage 1's, then its own), and `commands`, all of them,
    where several queues did (a run stopped and continued); nothing where no exit record names one."""
    from eval.studies.time_to_quality import run_folder, stage1_name

    folder = run_folder(record["name"], record["seed"])
    queues: list[str] = []
    for name in dict.fromkeys([stage1_name(folder), folder]):
        if (ran := exit_record(run / QUEUE_FOLDER, name)) is not None:
            queues += ran.get("queues", [])
    queues = list(dict.fromkeys(queues))
    return {"command": queues[-1], **({"commands": queues} if len(queues) > 1 else {})} if queues else {}


def report(study: Study, out: Path, includes: list[Path], device: str | None, commit: str | None) -> dict:
    """The distributions, tables and plots of every finished run (and the earlier records of `includes`); `device`
    labels the runs (None: the cards their run records name); `commit` (None: the study's record's, else this
    tree's) names the runs whose run records name none."""
    from eval.metrics import loss_anatomy
    from eval.metrics.niah import markdown as niah_markdown
    from eval.records import write_record
    from eval.studies import frontier, loss_by_position, payoff
    from eval.studies.time_to_quality import (against_earlier_dense, final_validation_loss, load_arms, plot_curves,
                                             plot_steps, recorded_starts, report_records, run_folder)
    from recipe.logs.run_record import source_commit

    recorded = study.run / "study.json"
    if not commit and recorded.is_file():  # the record `run` writes of the study it queued, with its tree's commit
        commit = read_json(recorded, "the study record", "an object with the commit `run` ran (a string)",
                           lambda value: isinstance(value, dict) and isinstance(value.get("commit"), str))["commit"]
    commit = commit or source_commit()
    incomplete: list[str] = []
    arms = load_arms(study.run, incomplete) if study.run.is_dir() else []  # nothing trained here: `includes` only
    seq_len = study.base["training"]["seq_len"]
    # None: scratch
    start = {"stage0_seq_len": study.stage0_seq_len or None, "stage0_steps": study.stage0_steps or None}
    records = [{**record, **start, **queue_commands(study.run, record)}
               for record in report_records(arms, seq_len, device, commit, f"scripts/payoff_map.py run {study.path}")]
    if study.stage0_seq_len:  # the weights each run started from, comparable across machines that trained them again
        seeds = {r["seed"] for r in records}
        stage0 = {seed: final_validation_loss(study.run / stage0_name(seed)) for seed in seeds}
        stage0_cards = {seed: recorded_starts(study.run / stage0_name(seed), "card") for seed in seeds}
        for record in records:
            record["stage0_final_heldout_loss"] = stage0[record["seed"]]
            if cards := list(dict.fromkeys(stage0_cards[record["seed"]] + record.get("cards", []))):
                record["cards"] = cards
    dumps = sorted((study.run / "anatomy").glob("*.npz"))
    windows, losses, niah = loss_anatomy.read_dumps([d.with_suffix("") for d in dumps]) if dumps else (None, {}, {})
    if study.stage0_seq_len:  # a later report that joins these records reads the loss by position from them
        own = loss_by_position.model_class_losses(losses, study.stage0_seq_len)
        for record in records:
            if (folder := run_folder(record["name"], record["seed"])) in own:
                record["position_losses"] = own[folder]
    earlier: list[dict] = []
    for path in includes:
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--include {path}: cannot read it as JSON ({err})") from err
        if isinstance(loaded, dict):  # an earlier report of this command: its records
            loaded = loaded.get("records", [])
        if not isinstance(loaded, list) or not all(isinstance(r, dict) for r in loaded):
            raise ConfigError(f"--include {path}: expected a list of run records or a report's payoff.json")
        earlier += [r for r in loaded if r.get("seq_len") == seq_len and all(r.get(k) == v for k, v in start.items())]
    set_aside = payoff.stage0_confounded(records, earlier)
    mixed = payoff.card_mixed(records, earlier)
    records = [r for r in records if r not in set_aside and r not in mixed]
    confounded = [run_folder(r["name"], r["seed"]) for r in set_aside]
    records = payoff.join(against_earlier_dense(records, earlier), earlier)
    if not records:
        raise ConfigError(f"no finished run under {study.run} (and none included)")
    summary = payoff.distributions(records, study.group_threshold, study.baseline)
    scored = {run.name for run in plan_runs(study) if run.kind in ("dense", "frontier", "stage2")} | set(study.reported)
    unrecorded = sorted(scored - {run_folder(r["name"], r["seed"]) for r in records})
    if unrecorded:  # a report of part of the study is read as one: say what it leaves out
        print(f"note: {len(unrecorded)} run(s) of {study.path} have no record here (none finished under {study.run}, "
              f"none in --include): {', '.join(unrecorded[:4])}{', ...' if len(unrecorded) > 4 else ''}; the report "
              "covers the others (summary.unrecorded lists them)", file=sys.stderr)
    summary.update({"study": str(study.path), "incomplete": incomplete, "unrecorded": unrecorded,
                    "baseline": study.baseline,
                    "stage0_confounded": confounded, "card_mixed": [run_folder(r["name"], r["seed"]) for r in mixed]})
    dense = summary["arms"].get("dense", {}).get("seeds", {})
    curves = payoff.dense_step_curves(records, study.base["validation"]["freq"])
    lower = {seed for seed, row in dense.items() if row.get("group") == "lower"}
    summary["separation_step"] = payoff.separation_step(curves, lower)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_record(out, {"summary": summary, "records": records}, indent=1)
    title = f"seq {seq_len:,}, {device or ', '.join(sorted({r['device'] for r in records}))}, {commit}"
    payoff.plot_finals(summary, str(out.with_name(out.name + "_finals.png")), f"final held-out loss by arm, {title}",
                       newest=commit)
    if curves:
        payoff.plot_dense_groups(curves, lower, summary["separation_step"],
                                 str(out.with_name(out.name + "_dense_steps.png")), f"dense seeds by group, {title}")
    if arms:
        plot_curves(arms, str(out.with_name(out.name + "_curves.png")), f"held-out loss vs training seconds, {title}")
        plot_steps(arms, str(out.with_name(out.name + "_steps.png")), f"held-out loss vs steps, {title}")
    table = payoff.markdown(summary)
    lead = []  # matched compute leads, then an extension study's loss by position; the matched-steps view follows
    if study.frontier:
        placed = frontier.place(records, study.base["validation"]["freq"], len(study.frontier) + 1,
                                 study.baseline, study.seeds)
        summary["matched_compute"] = placed
        frontier.plot(placed, str(out.with_name(out.name + "_matched_compute.png")),
                      f"time-matched dense frontiers and Lighthouse arms, {title}")
        lead.append(frontier.markdown(placed))
    scored = {run_folder(r["name"], r["seed"]): r["position_losses"] for r in records if "position_losses" in r}
    if study.stage0_seq_len and scored:
        try:
            summary["loss_by_position"] = loss_by_position.read_out(
                records, scored, study.stage0_seq_len, study.base["validation"]["freq"], len(study.frontier) + 1)
        except ValueError as err:  # an included record scored on other windows' length
            raise ConfigError(f"{study.path}: the loss by position cannot join these models: {err}") from err
        lead.append(loss_by_position.markdown(summary["loss_by_position"]))
        loss_by_position.plot(summary["loss_by_position"], str(out.with_name(out.name + "_loss_by_position.png")),
                              f"loss by position class past stage 0's {study.stage0_seq_len:,} tokens, {title}")
    if lead:
        write_record(out, {"summary": summary, "records": records}, indent=1)
        table = "\n\n".join(lead) + "\n\n" + ("At matched steps:\n\n" if study.frontier else "") + table
    if dumps:
        edges = loss_anatomy.position_edges(study.stage0_seq_len)  # stage 0's length an edge; 0 (none) adds none
        pairs = anatomy_pairs(summary, set(losses))
        if pairs:
            differences = [loss_anatomy.difference(losses, windows, high, low, edges) for high, low in pairs]
            described = loss_anatomy.describe(losses, windows, edges)
            write_record(out.with_name(out.name + "_anatomy"), {"pairs": pairs, "differences": differences,
                                                                "describe": described, "niah": niah}, indent=1)
            loss_anatomy.plot(differences, str(out.with_name(out.name + "_anatomy.png")),
                              f"what the loss differences are made of, {title}")
            table += "\n\n" + loss_anatomy.markdown(differences)
        if niah:
            table += "\n\n" + niah_markdown(niah)
    if incomplete:
        table += f"\n\nNot finished (left out): {', '.join(incomplete)}"
    if confounded:
        table += (f"\n\nConfounded (left out): {', '.join(confounded)}, whose stage 0 ended at another held-out loss "
                  "than the one its seed's included records started from")
    if summary["card_mixed"]:
        table += (f"\n\nOn several cards (left out): {', '.join(summary['card_mixed'])}, whose seed's run records name "
                  "more than one card")
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return summary


def pack(study: Study, out: Path, max_mb: float | None, without_stage0: bool = False) -> int:
    """Write what the run folder takes to another machine to continue its queue there (recipe.experiments.study_pack)
    and say what it holds and what it leaves to train again."""
    if not (study.run / TASKS_FILE).is_file():
        raise ConfigError(f"{study.run}: no {TASKS_FILE}, so no queue ran there to pack (`run` writes it)")
    if max_mb is not None and not max_mb > 0:  # NaN too: no size is over it
        raise ConfigError(f"--max-mb {max_mb:g} must be above 0")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder: pack writes one .tar.gz file")
    if without_stage0 and not study.stage0_deterministic:
        raise ConfigError(f"--without-stage0: {study.path} lacks study.stage0_deterministic = true, so a stage 0 "
                          "trained again would not be the same weights")
    behind = frozenset(stage0_name(seed) for seed in study.seeds) if without_stage0 else frozenset()
    plan = write_pack(study.run, out, max_mb, behind)
    resumed = "".join(f", {name} resumes at {step.relative_to(study.run)}" for name, step in plan["resumed"].items())
    print(f"{out}: {len(plan['finished'])} finished tasks{resumed}, {len(plan['checkpoints'])} checkpoints "
          f"({', '.join(str(p.relative_to(study.run)) for p in plan['checkpoints']) or 'none'}); "
          f"unpack with: tar xzf {out.name} -C {study.run}")
    for name, why in plan["left_out"].items():
        print(f"left out, trains again: {name} ({why})")
    if without := sorted(behind & set(plan["finished"])):
        print(f"packed without their weights (trained again where a run left needs them): {', '.join(without)}")
    return 0


def check_niah_lengths(study: Study) -> None:
    """NIAH's lengths must fit its grid of the byte encoding (checked before any run is queued)."""
    if not study.niah_lengths:
        return
    from eval.metrics.niah import byte_encode, check_grid

    try:
        check_grid(byte_encode, study.niah_lengths)
    except ValueError as err:
        raise ConfigError(f"{study.path}: study.niah_lengths: {err}") from err


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("command", choices=["tasks", "run", "submit", "report", "pack"])
    p.add_argument("study", type=Path, help="the study TOML (configs/payoff/)")
    p.add_argument("--gpus", type=gpu_list, default="0",
                   help="run: comma-separated GPU indices, one run at a time on each")
    p.add_argument("--python", default="python3", help="the interpreter of every run")
    p.add_argument("--order", choices=ORDERS, default="seed",
                   help="tasks, run, submit: seed by seed (default); long-first: dense, then stage 1, then stage 2 "
                        "by its dense steps, most first (packs a lease of fixed length); arm-first: seed by seed with "
                        "each stage 2 right after its stage 1 (one GPU: whole arms first)")
    p.add_argument("--only", type=task_names,
                   help="tasks, run, submit: only these comma-separated tasks of the queue, in its order (each with "
                        "the tasks it waits for named too): the part of a queue that fits a lease of known length")
    p.add_argument("--stop-after", type=float,
                   help="run: seconds after which the running tasks are stopped (each saves its step and resumes "
                        "there when `run` or a pack continues the queue) and no task starts: a lease or job of "
                        "known length")
    p.add_argument("--grace", type=float, default=60.0, help="run: seconds a stopped task has to save before it is "
                                                              "killed")
    p.add_argument("--include", type=Path, action="append", default=[],
                   help="report: earlier records of the same study to join (a JSON list, or an earlier "
                        "report's payoff.json)")
    p.add_argument("--device", help="report: a label for the card the runs ran on, such as '4x H200' (default: the "
                                    "card each run's records name)")
    p.add_argument("--commit", help="report: the commit of the tree that ran them, for runs without a run record "
                                    "that names it (default: the study's record)")
    p.add_argument("--out", type=output_file,
                   help="report: output prefix (default <run>/report/payoff); pack: the tar.gz (default "
                        "<run>/pack.tar.gz)")
    p.add_argument("--without-stage0", action="store_true",
                   help="pack: leave stage 0's weights behind (a deterministic stage 0 trains again bit for bit where "
                        "a run left needs them): a pack that must stay small")
    p.add_argument("--max-mb", type=float, help="pack: leave out checkpoints over this size, and the tasks that wrote "
                                                "them (they train again where the pack is unpacked)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)  # split here: argparse's handling of -- varies by version
    args, sbatch_options = p.parse_args(argv[:split]), argv[split + 1:]
    if sbatch_options and args.command != "submit":
        p.error(f"options after -- {sbatch_options} are sbatch's, for submit only")
    try:
        study = load_study(args.study)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    check_niah_lengths(study)
    if args.only is not None and args.command not in ("tasks", "run", "submit"):
        p.error(f"--only is for tasks, run and submit, not {args.command}")
    if args.without_stage0 and args.command != "pack":
        p.error(f"--without-stage0 is for pack, not {args.command}")
    if args.stop_after is not None and args.command != "run":
        p.error(f"--stop-after is for run, not {args.command}")
    if message := bad_seconds({"--stop-after": args.stop_after, "--grace": args.grace}):
        raise ConfigError(message)
    if args.command in ("tasks", "run", "submit") and not ordered_queue(study, args.python, args.order):
        print(f"{args.study}: no task left to queue: every run of the study is listed under [study] reported (its "
              "records are kept, not retrained); take names out of reported to train them again", file=sys.stderr)
        return 0
    if args.command == "tasks":
        print("\n".join(queue_lines(study, args.python, args.order, args.only)))
        return 0
    if args.command == "submit":
        check_corpus(study)
        submit(study, args.python, sbatch_options, args.order, args.only)
        return 0
    if args.command == "run":
        check_corpus(study)
        path = write_queue(study, args.python, args.order, args.only)
        for name, why in missing_inputs(study.run).items():
            (study.run / QUEUE_FOLDER / f"{name}.json").unlink()
            print(f"{name} trains again: {why}", flush=True)
        stop = ["--stop-after", str(args.stop_after)] if args.stop_after is not None else []
        # The queue takes this process's place, so that a SIGTERM or Ctrl-C meant for it stops its tasks cleanly.
        sys.stdout.flush()
        os.chdir(Path(__file__).resolve().parent.parent)
        os.execv(sys.executable, [sys.executable, "scripts/gpu_queue.py", "--tasks", str(path.resolve()),
                                  "--gpus", args.gpus, "--logs", str((study.run / QUEUE_FOLDER).resolve()),
                                  "--grace", str(args.grace), *stop, "--invoked-as",
                                  shlex.join(["scripts/payoff_map.py", *(sys.argv[1:] if argv is None else argv)])])
    if args.command == "pack":
        return pack(study, args.out or study.run / "pack.tar.gz", args.max_mb, args.without_stage0)
    report(study, args.out or study.run / "report" / "payoff", args.include, args.device, args.commit)
    return 0


if __name__ == "__main__":
    with exit_on_config_error():
        sys.exit(main(sys.argv[1:]))
