"""Sample text from a checkpoint: a prompt, then `--max-new` sampled tokens, with dense attention.

    python scripts/generate.py --checkpoint outputs/debug/checkpoint/step-20 --prompt "def main(" --max-new 200
    python scripts/generate.py --checkpoint STEP_DIR --prompt "The" --temperature 0 --device cuda   # greedy

The model, its tokenizer (bytes, or the Hugging Face tokenizer of `model.hf_assets_path`) and `training.seq_len`
come from the record of the run that wrote the checkpoint, as for scripts/heldout_loss.py
(eval/checkpoint_run.py); job arguments override it, and a checkpoint without run records needs
`--job.config_file` of its run. Attention is dense in every layer, with a KV cache (eval/metrics/decode.py): the
prompt runs once, then each new token alone; past `training.seq_len` tokens (the model's RoPE table) each step runs
the last window afresh. Sampling is softmax(logits / temperature) over the `--top-k` most likely tokens;
temperature 0 is greedy. Stops at EOS. The text goes to stdout, progress to stderr; a byte model's bytes that are
not UTF-8 print as U+FFFD.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from eval.checkpoint import autocast_dtype
from eval.metrics.cli import checkpoint_job_config, load_checkpoint
from eval.metrics.decode import KVCacheDecoder, NextLogits
from eval.options import positive_int, torch_seed
from recipe.data.tokenizer import build_tokenizer
from recipe.progress import progress_bar
from recipe.train.cli import ConfigError, as_config_error, exit_on_config_error


@torch.no_grad()
def sample(next_logits: NextLogits, prompt: list[int], max_new: int, tokenizer, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None, progress: bool | None = False
           ) -> list[int]:
    """Up to `max_new` tokens after `prompt` (ids), each drawn from `next_logits` of the ids so far: ids of
    `tokenizer`'s vocabulary only (never BOS, nor the padding of the model's output layer), stopping after EOS;
    temperature 0 takes the most likely token."""
    ids = list(prompt)
    bar = progress_bar(max_new, "generate", progress)
    for _ in range(max_new):
        logits = next_logits(ids).float().cpu()
        logits[tokenizer.bos_id] = -torch.inf
        logits[tokenizer.get_vocab_size():] = -torch.inf
        if temperature == 0:
            token = int(logits.argmax())
        else:
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[-1]] = -torch.inf
            # in float64, the largest logit taken off first: every finite temperature > 0 then leaves softmax
            # finite (a tiny one sends the others to -inf, a huge one to about 0; 1e300 is inf in float32)
            scaled = (logits.double() - logits.max()) / temperature
            token = int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))
        ids.append(token)
        bar.update()
        if token == tokenizer.eos_id:
            break
    bar.close()
    return ids[len(prompt):]


def sampling_temperature(text: str) -> float:
    """argparse type of --temperature: a finite number >= 0 (0 is greedy); NaN, an infinity or a negative one
    has no sampling meaning (softmax(logits / temperature) held NaN and the draw failed with a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0 (0 is greedy)")
    return value


def main(argv: list[str] | None = None) -> list[int]:
    """Load the checkpoint, sample after the prompt, print the prompt and the sampled text; return the sampled
    ids (the text of a byte model's sample can hold invalid UTF-8, printed as U+FFFD)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                epilog="Other arguments are job arguments, e.g. --job.config_file configs/debug.toml")
    p.add_argument("--checkpoint", required=True, help="a step folder, e.g. outputs/debug/checkpoint/step-20")
    p.add_argument("--prompt", default="", help="text the sample continues (default: none, after BOS)")
    p.add_argument("--max-new", type=positive_int, default=200, help="tokens to sample (default 200)")
    p.add_argument("--temperature", type=sampling_temperature, default=0.8, help="0 is greedy (default 0.8)")
    p.add_argument("--top-k", type=positive_int, default=40, help="sample among this many tokens (default 40)")
    p.add_argument("--seed", type=torch_seed, help="the sampling seed (default: a fresh one)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress on stderr (default: a bar on a terminal, else a line every few seconds)")
    args, job_argv = p.parse_known_args(argv)
    job_config, _ = checkpoint_job_config(args.checkpoint, job_argv)
    with as_config_error():
        tokenizer = build_tokenizer(job_config)
    if args.top_k > tokenizer.get_vocab_size():
        p.error(f"--top-k={args.top_k} exceeds the tokenizer's {tokenizer.get_vocab_size()} entries")
    job_config.lighthouse.enable = False  # a window grows one token at a time: Lighthouse needs fixed lengths
    window = job_config.training.seq_len
    prompt = tokenizer.encode(args.prompt, add_bos=True, add_eos=False)
    if len(prompt) >= window:
        raise ConfigError(f"--prompt is {len(prompt)} tokens with BOS, not below training.seq_len={window}, the "
                          "model's window")
    model, _, device = load_checkpoint(args.checkpoint, args.device, job_config)
    decoder = KVCacheDecoder(model, window, device, autocast_dtype(job_config, device))
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    new = sample(decoder.next_logits, prompt, args.max_new, tokenizer, args.temperature, args.top_k, generator,
                 args.progress)
    print(args.prompt + tokenizer.decode(new), flush=True)
    return new


if __name__ == "__main__":
    with exit_on_config_error():
        main(sys.argv[1:])
