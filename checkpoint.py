"""Checkpoints: written atomically, read without unpickling code, and every failure explained.

A checkpoint is one dict saved with torch.save:

    {"format": FORMAT, "model": state_dict, "model_args": asdict(GPTConfig), "optimizer": state_dict,
     "iter_num": int, "best_val_loss": float, "config": {train options}, "tokenizer": {see tokenizer.py},
     "rng": {...}}

Only tensors, numbers, strings, lists and dicts go in, so `torch.load(..., weights_only=True)` can read it back
without running any pickled code.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from model import GPT, GPTConfig

FORMAT = "layernorm-gpt/1"
# The LayerNorm implementations compute the same function from the same parameters, so a checkpoint trained with
# one can be run with any other. RMSNorm and BatchNorm compute other functions (BatchNorm also has buffers).
INTERCHANGEABLE_NORMS = ("custom", "builtin", "triton")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit what it is asked to do."""


def save_checkpoint(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename it over `path`.

    A rename within one directory is atomic, so a crash or a kill at any moment leaves either the old
    checkpoint or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by save_checkpoint; CheckpointError says what is wrong if it can't."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: train one first (python train.py ... --out_dir={path.parent}) "
            f"or point --out_dir at the folder holding ckpt.pt"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch.load fails in many ways on damaged bytes; each gets the same clear answer
        first_line = str(e).splitlines()[0] if str(e) else ""
        if isinstance(e, pickle.UnpicklingError) and "Unsupported global" in str(e):
            raise CheckpointError(
                f"{path} holds objects other than tensors and plain data, which are not loaded "
                f"(weights_only=True): it was not written by this project's train.py"
            ) from None
        raise CheckpointError(
            f"{path} is truncated or corrupt ({type(e).__name__}: {first_line}); "
            f"it may come from an interrupted copy: use another checkpoint or train again"
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"{path} is not a checkpoint of this project (format {found!r}, expected {FORMAT!r})")
    return checkpoint


def config_mismatch(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """The keys on which two model_args dicts differ, as 'key: saved -> wanted' lines."""
    return [f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in sorted(wanted) if saved.get(k) != wanted.get(k)]


def checkpoint_config(checkpoint: dict[str, Any]) -> GPTConfig:
    """The GPTConfig a checkpoint was trained with (keys this version does not know are left out)."""
    known = {f.name for f in fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in checkpoint["model_args"].items() if k in known})


def checkpoint_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's state_dict, with the prefixes torch.compile and DDP add taken off."""
    return {_strip_wrappers(k): v for k, v in checkpoint["model"].items()}


def model_from_checkpoint(
    checkpoint: dict[str, Any], norm: str | None = None, device: str | torch.device = "cpu"
) -> GPT:
    """Build the GPT a checkpoint describes, load its weights, and put it in eval mode.

    `norm` swaps the normalization implementation: any of INTERCHANGEABLE_NORMS for a checkpoint trained with
    one of them. Swapping to a norm that computes another function is refused rather than run silently.
    """
    config = checkpoint_config(checkpoint)
    if norm is not None and norm != config.norm:
        if not (norm in INTERCHANGEABLE_NORMS and config.norm in INTERCHANGEABLE_NORMS):
            raise CheckpointError(
                f"this checkpoint was trained with norm={config.norm!r}; it can run with "
                f"{', '.join(INTERCHANGEABLE_NORMS) if config.norm in INTERCHANGEABLE_NORMS else config.norm!r} "
                f"but not with {norm!r}, which computes a different function"
            )
        config = replace(config, norm=norm)
    model = GPT(config)
    state = checkpoint_weights(checkpoint)
    missing, unexpected = _key_mismatch(model.state_dict(), state)
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint's weights do not fit the model it describes (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"the checkpoint's weights do not fit its model: {str(e).splitlines()[-1]}") from None
    return model.to(device).eval()


def _strip_wrappers(key: str) -> str:
    """State-dict keys of a torch.compile'd or DDP-wrapped model carry a prefix; the plain model's do not."""
    for prefix in ("_orig_mod.", "module."):
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def _key_mismatch(expected: dict[str, Any], found: dict[str, Any]) -> tuple[list[str], list[str]]:
    return sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
