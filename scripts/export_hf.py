"""Export a checkpoint as a Hugging Face Llama folder that transformers, lm-eval-harness and vLLM load.

    python scripts/export_hf.py outputs/paper/stage2/checkpoint/step-2000 outputs/hf/paper \\
        --job.config_file configs/paper/stage2_dense.toml

STEP_DIR and OUT come first, then the job arguments of the run (they give the model and its flavor; the attention
setting does not matter, Lighthouse has no parameters). Writes config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and lighthouse_export.json (source checkpoint, commit, job config) into OUT, which must
not exist or be empty unless --force is given (then files of the same names are replaced). Then:

    AutoModelForCausalLM.from_pretrained(OUT), AutoTokenizer.from_pretrained(OUT)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from recipe.compat import install

install()  # the CPU compatibility layer, before torchtitan is imported

from eval.checkpoint import build_model, load_weights, parse_job_config
from eval.hf_export import export
from eval.records import provenance


def main(argv: list[str] | None = None) -> Path:
    """Export STEP_DIR into OUT; exit code 2 with one line on stderr when OUT or STEP_DIR will not do."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml")
    p.add_argument("checkpoint", metavar="STEP_DIR", help="a step folder, e.g. outputs/run/checkpoint/step-400")
    p.add_argument("out", metavar="OUT", type=Path, help="the folder to write")
    p.add_argument("--force", action="store_true", help="write into OUT even if it is not empty")
    args, job_argv = p.parse_known_args(argv)
    if args.out.exists() and not args.out.is_dir():
        p.exit(2, f"export_hf.py: error: OUT {args.out} exists and is not a folder\n")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        p.exit(2, f"export_hf.py: error: OUT {args.out} is not empty; pass --force to write into it\n")

    device = torch.device("cpu")
    job_config = parse_job_config(job_argv)
    model = build_model(job_config, device)
    try:
        load_weights(model, args.checkpoint)
    except ValueError as err:
        p.exit(2, f"export_hf.py: error: {err}\n")
    record = {**provenance(args.checkpoint, job_config, device), "job_config": dataclasses.asdict(job_config)}
    export(model, job_config, args.out, record)
    print(f"exported {args.checkpoint} -> {args.out}")
    return args.out


if __name__ == "__main__":
    main(sys.argv[1:])
