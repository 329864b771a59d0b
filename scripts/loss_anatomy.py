"""What a held-out loss difference is made of (`eval.metrics.loss_anatomy`): per-token losses of final models on the
same windows, then the difference between two of them by position and by repeated vs fresh context.

    python scripts/loss_anatomy.py dump --checkpoint dense_s2=outputs/payoff/x/dense_s2/checkpoint/step-720 \\
        --checkpoint dense_s3=... --data 'outputs/payoff/corpus/heldout/*.jsonl' --windows 4 \\
        --out outputs/payoff/x/anatomy/s2 --job.config_file configs/time_to_quality/tiny_128k.toml \\
        --lighthouse.no-enable
    python scripts/loss_anatomy.py report --dump outputs/payoff/x/anatomy/s2.npz --dump .../s3.npz \\
        --compare dense_s2,dense_s3 --out outputs/payoff/x/anatomy/report

`dump` scores each checkpoint with the job arguments' attention setting on the first --windows held-out windows
(cut as in training) and writes `<out>.npz` (the windows' tokens and each model's per-token loss, float16) and
`<out>.json` (provenance; with --niah-lengths also each model's NIAH grid at depths 10/50/90%). `report` reads
dumps of the same windows and writes `<out>.json`, `<out>.md` and `<out>.png`: for each --compare HIGHER,LOWER
the mean difference per class and the share of the difference each class carries.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from eval.metrics import loss_anatomy
from eval.options import naming_option, output_file, positive_int, positive_int_list
from eval.records import write_record
from recipe.train.cli import ConfigError, as_config_error, exit_on_config_error

NIAH_DEPTHS = (10, 50, 90)


def named_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH")
    return name, Path(path)


def dump(args: argparse.Namespace, job_argv: list[str]) -> dict:
    """Per-token losses (and NIAH) of every checkpoint on the same windows."""
    import torch

    from eval.checkpoint import build_model, check_lengths, load_weights, logits_function, parse_job_config
    from eval.device import pick_device
    from eval.metrics.heldout import heldout_windows, token_losses
    from eval.metrics.niah import check_prompt_lengths, run_niah, text_encoder
    from eval.records import provenance
    from recipe.data.tokenizer import build_tokenizer

    names = [name for name, _ in args.checkpoint]
    if len(set(names)) != len(names):
        raise ConfigError(f"--checkpoint names {names} repeat a name")
    if missing := [str(path) for _, path in args.checkpoint if not path.is_dir()]:
        raise ConfigError(f"--checkpoint {missing} are not folders (step folders such as run/checkpoint/step-720)")
    job_config = parse_job_config(job_argv)
    with as_config_error():
        tokenizer = build_tokenizer(job_config)
    encode = text_encoder(tokenizer)
    with naming_option("--niah-lengths", args.niah_lengths):
        check_prompt_lengths(encode, args.niah_lengths)
        check_lengths(job_config, args.niah_lengths)
    with as_config_error():
        windows = heldout_windows(args.data, job_config.training.seq_len, args.windows, tokenizer=tokenizer)
    device = pick_device(args.device)
    model = build_model(job_config, device)
    logits = logits_function(model, job_config, device)
    losses, niah, models = {}, {}, {}
    for name, path in args.checkpoint:
        with as_config_error():
            load_weights(model, path)
        rows = [token_losses(logits, w[None, :-1].to(device), w[None, 1:])[0] for w in windows]
        losses[name] = torch.stack(rows).numpy().astype(np.float16)
        models[name] = provenance(path, job_config, device)
        if args.niah_lengths:
            niah[name] = run_niah(logits, encode, args.niah_lengths, NIAH_DEPTHS, device=device,
                                  progress=False).to_dict()
        print(f"{name}: mean loss {losses[name].astype(np.float64).mean():.4f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out.with_suffix(".npz"), windows=windows.numpy().astype(np.uint16),
                        **{f"loss/{name}": loss for name, loss in losses.items()})
    record = {"data": args.data, "windows": args.windows, "seq_len": job_config.training.seq_len,
              "models": models, **({"niah": niah} if niah else {})}
    write_record(args.out, record)
    return record


def report(args: argparse.Namespace) -> dict:
    """The differences named by --compare, as JSON, markdown and a plot."""
    with as_config_error():
        windows, losses, niah = loss_anatomy.read_dumps(args.dump)
    pairs = [pair.split(",") for pair in args.compare]
    if bad := [p for p in args.compare if len(p.split(",")) != 2]:
        raise ConfigError(f"--compare {bad}: give HIGHER,LOWER")
    if unknown := sorted({n for pair in pairs for n in pair} - set(losses)):
        raise ConfigError(f"--compare names {unknown}, not in the dumps (they hold {sorted(losses)})")
    differences = [loss_anatomy.difference(losses, windows, higher, lower) for higher, lower in pairs]
    record = {"describe": loss_anatomy.describe(losses, windows), "differences": differences,
              **({"niah": niah} if niah else {})}
    write_record(args.out, record)
    table = loss_anatomy.markdown(differences)
    args.out.with_suffix(".md").write_text(table + "\n")
    loss_anatomy.plot(differences, str(args.out.with_suffix(".png")),
                      f"what the loss differences are made of ({windows.shape[0]} windows of "
                      f"{windows.shape[1] - 1:,} tokens)")
    print(table)
    return record


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = p.add_subparsers(dest="command", required=True)
    d = commands.add_parser("dump", help="per-token losses of checkpoints on held-out windows",
                            epilog="Other arguments are job arguments (the model and the attention setting).")
    d.add_argument("--checkpoint", type=named_path, action="append", required=True, help="NAME=step folder (repeat)")
    d.add_argument("--data", required=True, help="glob of held-out files")
    d.add_argument("--windows", type=positive_int, default=4, help="number of held-out windows to score")
    d.add_argument("--niah-lengths", type=positive_int_list, default=[],
                   help="also NIAH at these lengths, e.g. 8192,131072")
    d.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    d.add_argument("--out", type=output_file, required=True, help="output path prefix (.npz, .json)")
    r = commands.add_parser("report", help="differences between models of the dumps")
    r.add_argument("--dump", type=Path, action="append", required=True, help="a dump's path prefix (repeat)")
    r.add_argument("--compare", action="append", required=True, help="HIGHER,LOWER model names (repeat)")
    r.add_argument("--out", type=output_file, required=True, help="output path prefix (.json, .md, .png)")
    args, rest = p.parse_known_args(argv)
    if args.command == "report":
        if rest:
            p.error(f"report takes no job arguments: {rest}")
        return report(args)
    return dump(args, rest)


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
