"""Sample text from a trained checkpoint, this project's or nanoGPT's, or from GPT-2's weights.

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3 --max_new_tokens=200
    python sample.py --out_dir=out-shakespeare-char --temperature=0 --norm=custom     # greedy, another LayerNorm
    python sample.py --ckpt=path/to/ckpt.pt --start=FILE:prompt.txt
    python sample.py --out_dir=../nanoGPT/out-shakespeare-char --temperature=0 --norm=custom   # nanoGPT's checkpoint
    python sample.py --init_from=gpt2 --norm=custom --start="To be, or not to be"   # GPT-2's weights (model.py)
    python sample.py --init_from=gpt2 --prompts=prompts.txt --dtype=bfloat16   # one prompt a line, in one batch

The checkpoint's tokenizer (a nanoGPT checkpoint's: nanogpt.tokenizer_meta; GPT-2's: its BPE) turns text into
tokens; `--norm` runs the same weights with another LayerNorm (GPT.from_checkpoint refuses the others). Each sample
streams: the prompt, the text of each token as soon as it is whole (GPT.stream), then a line of dashes; prompts
from --prompts decode together, left padded (model.pad_left), and print when the batch is done. A sample ends at
the tokenizer's <|endoftext|>, as transformers' generate does (--ignore_eot decodes past it). Greedy
decoding and --no_kv_cache past block_size: README.md. Errors are one line, "error: ...": exit status 2 for a bad
option, 1 for the rest.
"""

from __future__ import annotations

from machinery.command import quiet_until_started

quiet_until_started(__name__)  # Ctrl-C while torch loads ends the process at once, quietly

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from data.common import read_text_file
from layernorm import NO_NORM, NORMS
from machinery import nanogpt
from machinery.checkpoint import resolve_weights
from machinery.command import ArgumentParser, BadOption, Failure, first_line, run_command
from machinery.device import DEVICE_HELP, autocast, check_norm_device, resolve_device, resolve_dtype
from machinery.options import SEEDS
from machinery.tokenizer import CharTokenizer, TiktokenTokenizer, tokenizer_from_meta
from model import GPT, pad_left

SEPARATOR = "-" * 40
MIN_TEMPERATURE = 1e-6  # the logits over it stay finite in float32 up to 3e32: any model's


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description="Sample text from a checkpoint written by train.py or nanoGPT's.")
    p.add_argument("--out_dir", default="out", help="folder holding ckpt.pt (default: out)")
    p.add_argument("--ckpt", help="path of a checkpoint file (this project's or nanoGPT's); overrides --out_dir")
    p.add_argument("--init_from", help="GPT-2's weights instead: a hub id (gpt2, distilgpt2, ...) or a folder")
    p.add_argument("--meta", help="a nanoGPT checkpoint's meta.pkl (default: beside it, else its data/<dataset>/)")
    p.add_argument("--start", default="\n", help="prompt, or FILE:path to read it from a UTF-8 file (default: newline)")
    p.add_argument("--prompts", help="a UTF-8 file of prompts, one a line: decoded together, in one left-padded batch")
    p.add_argument("--ignore_eot", action="store_true", help="decode past <|endoftext|> (default: a sample ends there)")
    p.add_argument("--num_samples", type=int, default=1, help="how many samples to draw (default 1)")
    p.add_argument("--max_new_tokens", type=int, default=500, help="tokens generated per sample (default 500)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; <1 sharper, >1 flatter (default 0.8)")
    p.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens; 0 = all (default 200)")
    p.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="autocast dtype; auto (default): bfloat16 on a GPU that has it, else float32",
    )
    p.add_argument("--norm", choices=(*NORMS, NO_NORM), help="run with this norm instead of the checkpoint's")
    p.add_argument("--no_kv_cache", action="store_true", help="recompute the whole context every step")
    args = p.parse_args(argv)
    if args.num_samples < 1:
        raise BadOption(f"--num_samples must be >= 1, got {args.num_samples}")
    if args.seed not in SEEDS:
        raise BadOption(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    if 0 < args.temperature < MIN_TEMPERATURE or args.temperature == math.inf:  # below 0, NaN: GPT.stream says
        raise BadOption(
            f"--temperature must be 0 (greedy) or a finite number from {MIN_TEMPERATURE:g} up, got "
            f"{args.temperature} (nearer 0, logits / temperature overflow float32)"
        )
    return args  # --max_new_tokens, --temperature and --top_k: GPT.stream checks them


def load(args: argparse.Namespace, device: str) -> tuple[GPT, CharTokenizer | TiktokenTokenizer]:
    """The checkpoint's model, with --norm swapped in, in eval mode, and its tokenizer (for a nanoGPT checkpoint, its
    meta.pkl's characters or GPT-2's BPE)."""
    checkpoint, path = resolve_weights(args.out_dir, args.ckpt, args.init_from)
    check_norm_device(args.norm or checkpoint["model_args"].get("norm"), device)  # before building, what to do
    try:
        model = GPT.from_checkpoint(checkpoint, norm=args.norm).to(device)
    except (ValueError, RuntimeError) as e:  # another function than the weights', weights that do not fit
        raise Failure(f"cannot build the model from {path}: {first_line(e)}") from None
    nanogpt_format = checkpoint.get("format") == nanogpt.FORMAT
    if args.meta is not None and not nanogpt_format:
        raise BadOption(f"--meta is for a nanoGPT checkpoint; {path} carries its own tokenizer: drop --meta")
    if checkpoint.get("tokenizer") is None and not nanogpt_format:  # (a dataset whose meta.json named none)
        raise Failure(f"{path} has no tokenizer, so its tokens can't be turned into text")
    try:
        meta = nanogpt.tokenizer_meta(Path(path), checkpoint, args.meta) if nanogpt_format else checkpoint["tokenizer"]
        return model, tokenizer_from_meta(meta)
    except (ValueError, TypeError, RuntimeError) as e:  # nanogpt.MetaError, a malformed entry, tiktoken's ranks
        raise Failure(str(e)) from None


def restrict_to_vocab(model: GPT, vocab_size: int) -> None:
    """Never sample ids the tokenizer can't decode: a model's vocabulary may be padded past the tokenizer's."""

    def mask(_module: torch.nn.Module, _inputs: tuple, logits: torch.Tensor) -> torch.Tensor:
        logits[..., vocab_size:] = float("-inf")
        return logits

    if model.config.vocab_size > vocab_size:  # else nothing to mask: no hook on every decoding step
        model.lm_head.register_forward_hook(mask)


def encode(tokenizer: CharTokenizer | TiktokenTokenizer, prompt: str, vocab_size: int, flag: str) -> list[int]:
    """The prompt's token ids (`flag` names where it came from); an empty prompt is <|endoftext|> for BPE, as GPT-2
    starts."""
    try:  # an empty prompt: BPE starts from <|endoftext|>, as GPT-2 does; characters have none (None)
        ids = tokenizer.encode(prompt) or [getattr(tokenizer, "eot_token", None)]
    except ValueError as e:  # a character the vocabulary lacks
        raise BadOption(f"{flag}: {e}") from None
    if ids == [None]:
        raise BadOption("--start is empty: give a prompt of at least one character (the default is a newline)")
    if max(ids) >= vocab_size:
        raise Failure(f"the prompt encodes to token id {max(ids)}, outside the model's vocabulary of {vocab_size}")
    return ids


def main(argv: Sequence[str] | None = None) -> list[str]:
    """Draw the samples, print them, and return them (each: the prompt followed by the generated text)."""
    args = parse_args(argv)
    device = resolve_device(args.device)  # train.py's rule
    # the prompt: --start itself, or the UTF-8 file named after 'FILE:' (read as the prepare scripts do); or --prompts
    prompts = [read_text_file(Path(args.start.removeprefix("FILE:"))) if args.start.startswith("FILE:") else args.start]
    if args.prompts is not None:
        if args.start != "\n":
            raise BadOption("--start and --prompts each give the prompt: give one of them")
        prompts = [line for line in read_text_file(Path(args.prompts)).splitlines() if line]
        if not prompts:
            raise BadOption(f"--prompts: {args.prompts} holds no prompt; write one a line")
    dtype = resolve_dtype(args.dtype, torch.device(device).type)
    model, tokenizer = load(args, device)
    eot = getattr(tokenizer, "eot_token", None)
    flag = "--start" if args.prompts is None else "--prompts"
    rows = [encode(tokenizer, prompt, model.config.vocab_size, flag) for prompt in prompts]
    restrict_to_vocab(model, tokenizer.vocab_size)

    torch.manual_seed(args.seed)  # seeds every device's generator
    idx, mask = pad_left(rows, pad_token=eot or 0)
    stop = None if args.ignore_eot else eot  # GPT-2's <|endoftext|>; characters have none
    samples = []
    with autocast(device, dtype):
        for _ in range(args.num_samples):
            try:  # the checks run here, before anything is printed; their messages start with the argument's name
                steps = model.stream(
                    idx.to(device),
                    args.max_new_tokens,
                    attention_mask=mask.to(device),
                    temperature=args.temperature,
                    top_k=args.top_k or None,
                    use_kv_cache=not args.no_kv_cache,
                    stop_token=stop,
                )
            except ValueError as e:
                raise BadOption(f"--{e}") from None
            if len(prompts) == 1:  # streamed: each piece printed as soon as it is whole
                samples.append(prompts[0])
                print(prompts[0], end="", flush=True)
                for piece in tokenizer.decode_stream(int(t[0]) for t, _ in steps if int(t[0]) != stop):
                    print(piece, end="", flush=True)
                    samples[-1] += piece
                print("\n" + SEPARATOR, flush=True)
                continue
            new = torch.cat([t for t, _ in steps] or [idx[:, :0]], dim=1).tolist()  # the batch, then each row
            for prompt, tokens in zip(prompts, new, strict=True):
                end = tokens.index(stop) if stop in tokens else len(tokens)
                samples.append(prompt + tokenizer.decode(tokens[:end]))
                print(samples[-1] + "\n" + SEPARATOR, flush=True)
    return samples


if __name__ == "__main__":
    sys.exit(run_command(main, "--max_new_tokens, or sample on another --device"))
