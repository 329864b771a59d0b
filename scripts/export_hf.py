"""Export a checkpoint as a Hugging Face Llama folder that transformers, lm-eval-harness and vLLM load.

    python scripts/export_hf.py outputs/paper/stage2_dense_from_L3_p2_k1536_dilated/checkpoint/step-16000 outputs/hf

STEP_DIR and OUT come first. The model (name, flavor, `training.seq_len`, which sets the RoPE table and
`max_position_embeddings`) comes from the record of the run that wrote STEP_DIR (`<dump_folder>/runs/<start
time>/config.toml`, eval/checkpoint_run.py); job arguments after them override it (`--training.seq_len 8192`).
A checkpoint without run records needs `--job.config_file` of its run; one with records refuses a config file
that gives another model or length than the record.

The exported model runs dense attention in every layer, so a checkpoint whose last steps trained with Lighthouse
(stage 1) is refused unless `--allow-stage1` is given: its dense logits are not the ones it trained with.
Writes config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
lighthouse_export.json (source checkpoint and step, the run record, how the weights were trained, commit, job
config) into OUT, which must not exist or be empty unless --force is given (then files of the same names are
replaced). Then:

    AutoModelForCausalLM.from_pretrained(OUT), AutoTokenizer.from_pretrained(OUT)
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from eval.options import output_folder
from recipe.errors import ConfigError


def main(argv: list[str] | None = None) -> Path:
    """Export STEP_DIR into OUT; exit code 2 with one line on stderr when OUT, STEP_DIR or the job will not do."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other arguments are job arguments that override the run's record, "
                                       "e.g. --training.seq_len 8192")
    p.add_argument("checkpoint", metavar="STEP_DIR", type=Path,
                   help="a step folder, e.g. outputs/run/checkpoint/step-400")
    p.add_argument("out", metavar="OUT", type=output_folder, help="the folder to write")
    p.add_argument("--force", action="store_true", help="write into OUT even if it is not empty")
    p.add_argument("--allow-stage1", action="store_true",
                   help="export a checkpoint whose last steps trained with Lighthouse (its dense logits differ)")
    args, job_argv = p.parse_known_args(argv)

    def fail(message: str) -> None:
        p.exit(2, f"export_hf.py: error: {message}\n")

    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        fail(f"OUT {args.out} is not empty; pass --force to write into it")
    if not (args.checkpoint / ".metadata").is_file():
        fail(f"{args.checkpoint} is not a DCP checkpoint folder (no .metadata); expected "
             "<dump_folder>/<checkpoint.folder>/step-<N>")
    from eval.checkpoint_record import recorded_lighthouse_training, stage1_refusal, step_of

    if not args.allow_stage1 and (trained := recorded_lighthouse_training(args.checkpoint, job_argv)):
        fail(stage1_refusal(args.checkpoint, trained))  # the run record tells: no need to wait for the imports
    # after the checks above, which need neither (torch and torchtitan take seconds to import)
    import torch

    from eval.checkpoint import build_model, load_weights
    from eval.checkpoint_run import job_config_of, trained_seq_len, trained_with_lighthouse, training_description
    from eval.records import provenance
    from recipe.hf.export import export

    try:
        job_config, record = job_config_of(args.checkpoint, job_argv)
    except ConfigError as err:
        fail(str(err))
    step = step_of(args.checkpoint)
    stage1 = trained_with_lighthouse(job_config, step)
    trained = training_description(job_config, step)
    if stage1 and not args.allow_stage1:
        fail(stage1_refusal(args.checkpoint, trained))

    device = torch.device("cpu")
    model = build_model(job_config, device)
    try:
        load_weights(model, args.checkpoint, "STEP_DIR")
    except ValueError as err:
        fail(str(err))
    record_info = {
        **provenance(args.checkpoint, job_config, device),
        "attention": "dense",  # the exported model's, in every layer
        "step": step,
        "trained": trained,
        "stage1": stage1,
        # the RoPE table's length (max_position_embeddings) and the one the weights trained at, which a
        # --training.seq_len override makes differ
        "seq_len": {"exported": job_config.training.seq_len, "trained": trained_seq_len(job_config, record)},
        "run_record": None if record is None else str(record),
        "job_config": dataclasses.asdict(job_config),
    }
    export(model, job_config, args.out, record_info)
    print(f"exported {args.checkpoint} -> {args.out}" + (" (stage 1: trained with Lighthouse)" if stage1 else ""))
    return args.out


if __name__ == "__main__":
    main(sys.argv[1:])
