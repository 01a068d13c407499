"""nanoGPT's checkpoints (github.com/karpathy/nanoGPT) and its meta.pkl, read without running pickled code.

nanoGPT's train.py saves one dict with torch.save:

    {"model": state_dict, "optimizer": state_dict, "model_args": {n_layer, n_head, n_embd, block_size, bias,
     vocab_size, dropout}, "iter_num": int, "best_val_loss": float, "config": {train options, "dataset" among them}}

Its GPT has this repository's parameter names and layout, and its LayerNorm is PyTorch's (builtin here), so its
weights load as they are: a compiled run's "_orig_mod." prefixes come off (checkpoint.load_checkpoint), and the
causal-mask buffers an older PyTorch made it keep ("attn.bias") are dropped. The vocabulary of a character-level
dataset is in data/<dataset>/meta.pkl, a pickle written by its prepare.py: {"vocab_size": int, "itos": {int: str},
"stoi": {str: int}}; without one, GPT-2's BPE (tokenizer_meta), as nanoGPT's sample.py assumes.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from machinery.command import first_line
from machinery.tokenizer import GPT2_BPE, CharTokenizer

FORMAT = "nanoGPT"  # what checkpoint.load_checkpoint marks a converted nanoGPT checkpoint with
KEYS = ("model", "model_args", "config", "iter_num")  # what nanoGPT's train.py saves and this project's does too
GPT2_VOCAB_SIZE = 50257  # the tokens of GPT-2's BPE, which nanoGPT pads to 50304


class MetaError(ValueError):
    """A meta.pkl that is missing, is not plain data, or does not fit the checkpoint."""


def is_checkpoint(obj: Any) -> bool:
    """A dict with nanoGPT's keys and without this project's "format"."""
    return isinstance(obj, dict) and "format" not in obj and all(k in obj for k in KEYS)


def to_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A nanoGPT checkpoint as this project's readers take it: its LayerNorm named builtin, no optimizer."""
    return {
        "format": FORMAT,
        "model": {k: v for k, v in ckpt["model"].items() if not k.endswith(".attn.bias")},  # the mask, not c_attn.bias
        "model_args": {**ckpt["model_args"], "norm": "builtin"},
        "iter_num": ckpt["iter_num"],
        "best_val_loss": ckpt.get("best_val_loss"),
        "config": ckpt["config"],
    }


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers, which need no global; any class or function is refused, so no
    pickled code can run (every call a pickle makes goes through find_class for its callable; an object outside
    the file, a persistent id, pickle.Unpickler refuses by itself)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not loaded: nothing in the file ran")


def read_meta(path: Path, vocab_size: int) -> dict[str, Any]:
    """The char tokenizer entry (tokenizer.py) of the meta.pkl at `path`, for a checkpoint of vocab_size tokens;
    whatever keeps it from being that (not a pickle, not plain data, no 'itos', another dataset's) is one MetaError
    naming the file and the cause."""
    try:
        meta = _PlainDataUnpickler(io.BytesIO(path.read_bytes())).load()
        itos = meta["itos"]  # {id: character}, ids 0..n-1
        tokenizer = CharTokenizer([itos[i] for i in range(len(itos))])  # single characters, no duplicates
        if meta.get("stoi", tokenizer.stoi) != tokenizer.stoi:  # (its prompts would be read as other ids, silently)
            raise ValueError("its 'stoi' is not the inverse of its 'itos'")
        if tokenizer.vocab_size != vocab_size:  # (another dataset's characters would decode the ids, silently)
            raise ValueError(
                f"it holds {tokenizer.vocab_size} characters, but the checkpoint's vocabulary is {vocab_size} tokens"
            )
    except FileNotFoundError:  # (only a --meta names a file that may not be there)
        raise MetaError(f"--meta={path}: no such file; give the meta.pkl that nanoGPT's prepare.py wrote") from None
    except Exception as e:  # the unpickler's, Python's or ours: one line
        why = "no 'itos' dict of the token ids 0..n-1" if isinstance(e, KeyError) else first_line(e)
        raise MetaError(
            f"{path} is not this checkpoint's meta.pkl ({type(e).__name__}: {why}): give the meta.pkl that "
            f"nanoGPT's prepare.py wrote for its dataset with --meta=PATH"
        ) from None
    return tokenizer.meta


def tokenizer_meta(ckpt_path: Path, ckpt: dict[str, Any], meta: str | None = None) -> dict[str, Any]:
    """The tokenizer entry (tokenizer.py) for a nanoGPT checkpoint: the characters of its meta.pkl (`meta`, else the
    first found beside it, then as data/<dataset>/meta.pkl in the folder its out_dir is in (nanoGPT's layout) and in
    the working directory (where nanoGPT's sample.py looks)), else GPT-2's BPE, which needs GPT2_VOCAB_SIZE tokens."""
    vocab_size = ckpt["model_args"]["vocab_size"]
    folder = ckpt_path.resolve().parent
    searched = [folder / "meta.pkl"]
    dataset = ckpt["config"].get("dataset") if isinstance(ckpt["config"], dict) else None
    if isinstance(dataset, str) and dataset:
        searched += [folder.parent / "data" / dataset / "meta.pkl", Path.cwd() / "data" / dataset / "meta.pkl"]
    path = Path(meta) if meta is not None else next((p for p in searched if p.is_file()), None)
    if path is not None:
        return read_meta(path, vocab_size)
    if vocab_size < GPT2_VOCAB_SIZE:
        raise MetaError(
            f"{ckpt_path} has a vocabulary of {vocab_size} tokens, fewer than GPT-2's BPE ({GPT2_VOCAB_SIZE}), so its "
            f"text needs the meta.pkl of its dataset, in none of {', '.join(dict.fromkeys(map(str, searched)))}: "
            f"give it with --meta=PATH (nanoGPT writes it to data/<dataset>/meta.pkl)"
        )
    return GPT2_BPE
