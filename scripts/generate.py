"""Sample text from a checkpoint: a prompt's bytes, then `--max-new` sampled bytes, with dense attention.

    python scripts/generate.py --checkpoint outputs/debug/checkpoint/step-20 --prompt "def main(" --max-new 200
    python scripts/generate.py --checkpoint STEP_DIR --prompt "The" --temperature 0 --device cuda   # greedy

The model and `training.seq_len` come from the record of the run that wrote the checkpoint, as for
scripts/heldout_loss.py (eval/checkpoint_run.py); job arguments override it, and a checkpoint without run records
needs `--job.config_file` of its run. Every step runs the whole window (at most `training.seq_len` tokens, the
model's RoPE table) with dense attention in every layer: a few hundred bytes take seconds on a CPU. Sampling is
softmax(logits / temperature) over the `--top-k` most likely bytes; temperature 0 is greedy. Stops at EOS. The
text goes to stdout, bytes that are not UTF-8 replaced.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recipe.compat import install

install()  # the CPU compatibility layer, before torchtitan is imported

import torch

from eval.checkpoint_run import job_config_of
from eval.cli import load_checkpoint
from eval.heldout import LogitsFn
from recipe.cli import ConfigError, exit_on_config_error
from recipe.tokenizer import BOS_ID, EOS_ID, NUM_BYTES, ByteTokenizer


@torch.no_grad()
def sample(logits_fn: LogitsFn, prompt: list[int], max_new: int, window: int, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None) -> list[int]:
    """Up to `max_new` tokens after `prompt` (ids), each drawn from the logits of the last `window` tokens: bytes
    only (never BOS), stopping after EOS; temperature 0 takes the most likely byte."""
    ids = list(prompt)
    for _ in range(max_new):
        logits = logits_fn(torch.tensor([ids[-window:]]))[0, -1].float().cpu()
        logits[BOS_ID] = -torch.inf
        if temperature == 0:
            token = int(logits.argmax())
        else:
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[-1]] = -torch.inf
            token = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))
        ids.append(token)
        if token == EOS_ID:
            break
    return ids[len(prompt):]


def main(argv: list[str] | None = None) -> str:
    """Load the checkpoint, sample after the prompt, print the prompt and the sampled text; return the text."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml")
    p.add_argument("--checkpoint", required=True, help="a step folder, e.g. outputs/debug/checkpoint/step-20")
    p.add_argument("--prompt", default="", help="text the sample continues (default: none, after BOS)")
    p.add_argument("--max-new", type=int, default=200, help="bytes to sample (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help=f"sample among this many bytes, 1-{NUM_BYTES + 1} "
                   "(default 40)")
    p.add_argument("--seed", type=int, help="the sampling seed (default: a fresh one)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    args, job_argv = p.parse_known_args(argv)
    if args.max_new < 1 or args.temperature < 0 or not 1 <= args.top_k <= NUM_BYTES + 1:
        p.error(f"--max-new={args.max_new} must be >= 1, --temperature={args.temperature} >= 0 and "
                f"--top-k={args.top_k} in [1, {NUM_BYTES + 1}]")
    job_config, _ = job_config_of(Path(args.checkpoint), job_argv)
    job_config.lighthouse.enable = False  # a window grows one token at a time: Lighthouse needs fixed lengths
    window = job_config.training.seq_len
    prompt = ByteTokenizer().encode(args.prompt, add_bos=True, add_eos=False)
    if len(prompt) >= window:
        raise ConfigError(f"--prompt is {len(prompt)} tokens with BOS, not below training.seq_len={window}, the "
                          "model's window")
    _, logits, _ = load_checkpoint(args.checkpoint, args.device, job_config)
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    new = sample(logits, prompt, args.max_new, window, args.temperature, args.top_k, generator)
    text = ByteTokenizer().decode(new)
    print(args.prompt + text, flush=True)
    return text


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
