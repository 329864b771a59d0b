"""Report of scripts/time_to_quality.sh: held-out loss against training seconds, speedups, one plot.

    python scripts/time_to_quality.py --run outputs/time_to_quality --out outputs/time_to_quality/report

Reads every arm under --run (eval.time_to_quality) and writes `<out>.json` (one object per arm: name,
selection, switch_step, total_steps, seq_len, seed, device, train_seconds, final_heldout_loss, curve, and for
Lighthouse arms the seconds dense needs to reach that loss, the time-to-quality speedup and the stage-1
per-step speedup, against the dense arm of the same seed) and `<out>.png`; prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.time_to_quality import arm_record, load_arms, plot_curves  # noqa: E402


def table(records: list[dict]) -> str:
    rows = ["| arm | seed | switch | train s | final held-out | dense s to that loss | time-to-quality speedup | "
            "stage-1 step speedup |", "|" + "---|" * 8]
    for r in records:
        reach = r.get("dense_seconds_to_this_loss", "-")
        rows.append(f"| {r['name']} | {r['seed']} | {r['switch_step'] or '-'} | {r['train_seconds']:.1f} | "
                    f"{r['final_heldout_loss']:.4f} | {'never' if reach is None else reach} | "
                    f"{r.get('time_to_quality_speedup') or ('-' if reach == '-' else 'none')} | "
                    f"{r.get('stage1_step_speedup', '-')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="the RUN folder of scripts/time_to_quality.sh")
    p.add_argument("--out", type=Path, required=True, help="output path prefix (.json, .png)")
    p.add_argument("--seq-len", type=int, default=65536, help="tokens per window of the runs")
    p.add_argument("--device", default="unknown", help="the card the arms ran on")
    p.add_argument("--commit", default="unknown", help="the commit of the tree the arms ran")
    args = p.parse_args(argv)
    arms = load_arms(args.run)
    if not arms:
        raise SystemExit(f"no complete arm under {args.run}")
    dense = {a.seed: a for a in arms if a.selection == "dense"}
    command = "scripts/time_to_quality.sh (configs/time_to_quality/tiny_64k.toml)"
    records = [{**arm_record(a, dense.get(a.seed), args.seq_len, args.device), "commit": args.commit, "command": command}
               for a in arms]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    plot_curves(arms, str(args.out.with_suffix(".png")),
                f"held-out loss vs training seconds, seq {args.seq_len:,}, {args.device}")
    print(table(records))
    return records


if __name__ == "__main__":
    main()
