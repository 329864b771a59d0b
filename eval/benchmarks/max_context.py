"""The longest context a number of GPUs trains, Lighthouse and dense (scripts/max_context.py): a search over
lengths, each probe a training job of its own (an out-of-memory probe cannot poison the next).

A probe trains the config at one length on W GPUs (`parallelism.context_parallel_degree = W`, no FSDP, local
batch 1, synthetic data; `eval.benchmarks.cp_throughput.variant_args`) for a few steps; it fits when the job ends
cleanly. The search doubles from a start length while probes fit, then bisects between the longest fit and
the shortest failure on multiples of a resolution the CP geometry allows, so every length probed is one the
job accepts. Out of memory and a probe past its time limit are failures (recorded with their reason); any
other failure of the first probe stops the search (a mistake in the settings), of a later probe is a failure
recorded with its message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eval.benchmarks.cp_throughput import CpThroughputJob, Variant, attempt, variant_args
from eval.benchmarks.throughput import fmt
from lighthouse import LighthouseConfig
from lighthouse.context_parallel.geometry import check_context_parallel

ATTENTIONS = ("lighthouse", "dense")
NOT_MEASURED = "not measured yet"


@dataclass(frozen=True)
class ProbeJob:
    """What every probe shares: the config, checkpointing, compile, steps, a time limit per probe (seconds;
    None: none) and more train.py arguments."""

    config: str
    ac: str = "full"
    compile: bool = True
    steps: int = 2
    timeout_s: float | None = None
    train_args: list[str] = field(default_factory=list)


def geometry_step(config: LighthouseConfig, gpus: list[int]) -> int:
    """The smallest length step the CP geometry of every GPU count divides: 2W chunks, whole tiles of coarsest
    entries, and chunks of whole dilation strides for the dilated scorer."""
    step = math.lcm(*(2 * w * (config.dilation if config.scorer == "dilated" else 1) for w in gpus))
    return math.lcm(step, config.coarsest_span * config.num_tiles) if config.levels > 1 else step


def check_lengths(config: LighthouseConfig, start: int, resolution: int, gpus: list[int]) -> None:
    """ValueError naming the value unless `resolution` is a multiple of the geometry step, `start` a multiple
    of `resolution` and a length every GPU count takes (then so is every multiple of `resolution` above it:
    the rules are divisibility and a minimum length)."""
    step = geometry_step(config, gpus)
    if resolution % step:
        raise ValueError(f"--resolution={resolution} is not a multiple of {step:,}, the length step the CP geometry "
                         f"of {gpus} GPUs takes")
    if start % resolution:
        raise ValueError(f"--start={start} is not a multiple of --resolution={resolution}")
    for w in gpus:
        try:
            check_context_parallel(config, start, w)
        except ValueError as err:
            raise ValueError(f"--start={start} does not fit {w} GPU(s): {err}") from None


def search(fits: Callable[[int], bool], start: int, resolution: int, limit: int) -> tuple[int | None, int | None]:
    """(the longest length that fits, the shortest that does not; None where none was found): doubling from
    `start` while lengths fit (up to `limit`), then bisection on multiples of `resolution` between the two.
    Nothing shorter than `start` is probed."""
    longest, failed, n = None, None, start
    while n <= limit:
        if not fits(n):
            failed = n
            break
        longest, n = n, 2 * n
    if longest is None or failed is None:
        return longest, failed
    while failed - longest > resolution:
        mid = (longest + failed) // 2 // resolution * resolution
        if fits(mid):
            longest = mid
        else:
            failed = mid
    return longest, failed


def probe(job: ProbeJob, gpus: int, attention: str, seq_len: int, folder: Path) -> dict:
    """Train `seq_len` tokens on `gpus` GPUs: {"seq_len", "fits", and the run's tok/s and peak memory, or its
    error}."""
    cp_job = CpThroughputJob(job.config, seq_len // gpus, job.steps, job.ac, compile_modes=(job.compile,),
                             train_args=job.train_args)
    argv = variant_args(cp_job, Variant(gpus, attention, job.compile), folder)
    run = attempt(argv, folder, job.steps, gpus, timeout_s=job.timeout_s)
    return {"seq_len": seq_len, "fits": "error" not in run,
            **{k: v for k, v in run.items() if k in ("tok_s", "peak_gib", "process_s", "error", "line")}}


def find_longest(job: ProbeJob, gpus: int, attention: str, start: int, resolution: int, limit: int,
                 folder: Path, known: dict[int, dict] | None = None,
                 on_probe: Callable[[dict], None] | None = None) -> dict:
    """The search for one (GPU count, attention): its result and every probe (those in `known`, by length,
    are not trained again); `on_probe` sees each new probe. RuntimeError when the first probe fails for a
    reason other than memory or time."""
    probes: dict[int, dict] = dict(known or {})

    def fits(seq_len: int) -> bool:
        if seq_len not in probes:
            result = probe(job, gpus, attention, seq_len, folder / f"{attention}_{gpus}gpu_{seq_len}")
            if seq_len == start and not result["fits"] and result["error"] not in ("out of memory", "timeout"):
                raise RuntimeError(f"{gpus} GPU(s), {attention}, {seq_len:,} tokens: {reason(result['error'])}")
            probes[seq_len] = result
            if on_probe:
                on_probe(result)
        return probes[seq_len]["fits"]

    longest, failed = search(fits, start, resolution, limit)
    return {"gpus": gpus, "attention": attention, "longest": longest, "shortest_failed": failed,
            "failed_because": probes[failed]["error"] if failed else None,
            "probes": [probes[n] for n in sorted(probes)]}


def reason(error: str) -> str:
    """One line for a probe's error: the job's own `error:` line if it printed one, else the message's first
    line with its last (a traceback's exception)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("error:")]
    if own:
        return own[-1].removeprefix("error:").strip()
    return lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}"


def cell(result: dict | None, limit: int | None = None) -> str:
    """A table cell: the longest length with its peak memory, and what stopped the next one."""
    if result is None:
        return NOT_MEASURED
    if result["longest"] is None:
        return f"none from {result['shortest_failed']:,} ({reason(result['failed_because'])})"
    best = next(p for p in result["probes"] if p["seq_len"] == result["longest"])
    text = f"**{result['longest']:,}** (peak {fmt(best.get('peak_gib'), '.1f')} GiB)"
    if result["shortest_failed"] is None:
        return text + f"; nothing longer probed{f' (limit {limit:,})' if limit else ''}"
    return text + f"; {result['shortest_failed']:,}: {reason(result['failed_because'])}"


def table(results: list[dict], gpus: list[int], limit: int | None = None) -> str:
    """The markdown table of docs/context_parallel.md: per GPU count, the longest context of each attention."""
    lines = ["| GPUs | Lighthouse: longest context trained | dense: longest context trained |", "| --- | --- | --- |"]
    for w in gpus:
        found = {r["attention"]: r for r in results if r["gpus"] == w}
        lines.append(f"| {w} | {cell(found.get('lighthouse'), limit)} | {cell(found.get('dense'), limit)} |")
    return "\n".join(lines)

