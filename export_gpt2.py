"""Write a checkpoint, this project's or nanoGPT's, as a Hugging Face GPT-2 folder (model.gpt2_export).

    python export_gpt2.py --out_dir=out-shakespeare --to=gpt2-shakespeare
    python -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('gpt2-shakespeare')"

The folder holds config.json and model.safetensors, what GPT2LMHeadModel.from_pretrained, the hub and this
repository's --init_from read; no tokenizer files (a BPE checkpoint's is GPT-2's own: the hub's gpt2 has them).
A model transformers' GPT-2 does not compute (RMSNorm, post-norm, ...) is refused. Errors are one line: exit status
2 for a bad option, 1 for the rest.
"""

from __future__ import annotations

from machinery.command import quiet_until_started

quiet_until_started(__name__)  # Ctrl-C while torch loads ends the process at once, quietly

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from machinery.checkpoint import resolve_weights
from machinery.command import ArgumentParser, Failure, first_line, run_command
from machinery.tokenizer import GPT2_BPE
from model import GPT, gpt2_export


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out", help="folder holding ckpt.pt (default: out)")
    p.add_argument("--ckpt", help="path of a checkpoint file (this project's or nanoGPT's); overrides --out_dir")
    p.add_argument("--to", required=True, help="the folder to write (made if missing)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Path:
    """Export the checkpoint; return the folder written."""
    args = parse_args(argv)
    checkpoint, path = resolve_weights(args.out_dir, args.ckpt, None)
    if checkpoint.get("tokenizer", GPT2_BPE) != GPT2_BPE:  # (nanoGPT's checkpoints carry none)
        raise Failure(
            f"{path} is not tokenized in GPT-2's BPE: a GPT-2 folder is read with GPT-2's tokenizer, so only a model "
            f"trained on BPE data (data/shakespeare/prepare.py) can be exported"
        )
    try:
        folder = gpt2_export(GPT.from_checkpoint(checkpoint), args.to)
    except ImportError as e:
        raise Failure(f"writing model.safetensors needs {e.name}: pip install safetensors") from None
    except (ValueError, OSError) as e:  # what transformers' GPT-2 does not compute; a folder that cannot be written
        raise Failure(f"cannot export {path}: {first_line(e)}") from None
    print(f"wrote {folder / 'config.json'} and {folder / 'model.safetensors'}")
    return folder


if __name__ == "__main__":
    sys.exit(run_command(main))
