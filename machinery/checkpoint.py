"""Checkpoint files: what they hold, written atomically, sealed by a checksum, read without unpickling code, every
failure explained; and which weights a command reads (resolve_weights). What a run saves in them and how it resumes
from them: run.py.

A checkpoint is one dict saved with torch.save (see run.Run.save):

    {"format": FORMAT, "model": state_dict, "model_args": asdict(GPTConfig), "optimizer": state_dict,
     "iter_num": int, "best_val_loss": float, "config": {train options}, "tokenizer": {see tokenizer.py},
     "rng": {torch, data (the position in the data stream), cuda or mps}, "scaler": state_dict (float16),
     "rng_ranks": [every process's "rng"] (several processes), "checksum": sha256 of all the rest (checksum)}

Only tensors, numbers, strings, lists and dicts go in, so `torch.load(..., weights_only=True)` can read it back
without running any pickled code. load_checkpoint verifies the checksum (a file damaged at rest or in a copy is
refused, and so is one without a checksum) and refuses weights that are not finite. It reads nanoGPT's
checkpoints too (nanogpt.py), for sampling and decoding; train.py resumes only its own.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pickle
import re
import resource
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from machinery import nanogpt
from machinery.command import BadOption, Failure, first_line
from machinery.tokenizer import GPT2_BPE
from model import GPTConfig, gpt2_checkpoint

FORMAT = "layernorm-gpt/1"


class CheckpointError(Failure, RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit what it is asked to do."""


def checkpoint_path(out_dir: str | os.PathLike, ckpt: str | os.PathLike | None = None) -> Path:
    """Where a command reads its checkpoint: --ckpt if given, else <out_dir>/ckpt.pt (or out_dir, if it is a file)."""
    if ckpt is not None:
        return Path(ckpt)
    return Path(out_dir) if Path(out_dir).is_file() else Path(out_dir) / "ckpt.pt"


def checksum(checkpoint: dict[str, Any]) -> str:
    """sha256 of every value in `checkpoint`: each tensor's dtype, shape and bytes, each other value's type and repr,
    dict keys in sorted order. One flipped bit anywhere (a weight, the optimizer, an RNG state) changes it."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in checkpoint.items() if k != "checksum"})
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"tensor {flat.dtype} {tuple(value.shape)}:".encode())
        digest.update(flat.view(torch.uint8).numpy())  # the raw bytes, whatever the dtype
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)}:".encode())
        for key in sorted(value, key=repr):  # optimizer state keys are ints, the rest strings
            digest.update(repr(key).encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)}:".encode())
        for item in value:
            _feed(digest, item)
    else:  # numbers, strings, None: repr is exact (a float's repr reads back as the same float)
        digest.update(f"{type(value).__name__} {value!r};".encode())


def save_checkpoint(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Write `checkpoint` with its checksum to a temporary file beside `path`, flush it to disk, then rename it over
    `path`: a rename within one directory is atomic, so a crash at any moment leaves either the old checkpoint or the
    new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{glob.escape(path.name)}.{'[a-z0-9_]' * 8}.tmp"):  # what a killed save left
        with contextlib.suppress(OSError):  # (mkstemp's names; one another process holds on Windows)
            stale.unlink()
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({**checkpoint, "checksum": checksum(checkpoint)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        written = os.stat(tmp).st_size if os.path.exists(tmp) else 0
        Path(tmp).unlink(missing_ok=True)
        # a Ctrl-C, as e or in what e was raised while handling (torch's writer turns a second Ctrl-C into a
        # RuntimeError, "unexpected pos"): quit, `path` as it was
        cause = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__context__
        if cause is not None:
            raise KeyboardInterrupt from None
        # past this process's file size limit (`ulimit -f`)? torch's writer reports EFBIG without the errno
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if isinstance(e, (OSError, RuntimeError)) and limit != resource.RLIM_INFINITY and written >= limit:
            raise CheckpointError(
                f"cannot save {path}: it is larger than this process's file size limit ({limit:,} bytes, "
                f"`ulimit -f`); any checkpoint there before is kept; raise the limit (`ulimit -f unlimited` in the "
                f"shell that starts the run)"
            ) from None
        if isinstance(e, (OSError, RuntimeError)):  # torch's writer turns a full disk into a RuntimeError too
            raise CheckpointError(  # ("file write failed"); `path` is still as it was
                f"cannot save {path} ({getattr(e, 'strerror', None) or first_line(e)}): any checkpoint there before "
                f"is kept; free some space or give an --out_dir you can write to"
            ) from None
        raise


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by save_checkpoint (its checksum verified, then dropped), or by nanoGPT's train.py
    (as nanogpt.to_checkpoint gives it, "format" nanogpt.FORMAT); CheckpointError says what is wrong if it can't, or
    if a weight is not finite."""
    path = Path(path)
    if not path.is_file():  # missing, a folder, or a device or pipe (a read that may never end)
        if path.is_dir():
            raise CheckpointError(
                f"no checkpoint at {path} (a folder): give --out_dir={path} or --ckpt={path / 'ckpt.pt'}"
            )
        what = "not a regular file" if path.exists() else "no such file"
        raise CheckpointError(
            f"no checkpoint at {path} ({what}): give the path of a ckpt.pt file, or train one first "
            f"(python train.py ... --out_dir={path.parent}) or point --out_dir at the folder holding ckpt.pt"
        )
    try:
        with warnings.catch_warnings():  # torch's note on a plain pickle's protocol: noise before our one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch.load fails in many ways on damaged bytes; each gets the same clear answer
        # torch names a global it refuses "Unsupported global", or "unsupported GLOBAL ... is blocked" (os.system)
        if isinstance(e, pickle.UnpicklingError) and "unsupported global" in str(e).lower():
            raise CheckpointError(
                f"{path} holds objects other than tensors and plain data, which are not loaded "
                f"(weights_only=True): it was not written by this project's train.py"
            ) from None
        raise CheckpointError(
            f"{path} is truncated or corrupt ({type(e).__name__}: {first_line(e)}); "
            f"it may come from an interrupted copy: use another checkpoint or train again"
        ) from None
    is_nanogpt = nanogpt.is_checkpoint(checkpoint)
    if not is_nanogpt and (not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT):
        found = (
            f"a dict with keys {', '.join(map(str, list(checkpoint)[:8]))}"
            if isinstance(checkpoint, dict)
            else f"a {type(checkpoint).__name__}"
        )
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (a dict with format {FORMAT!r}) nor nanoGPT's "
            f"(a dict with keys {', '.join(nanogpt.KEYS)}): it holds {found}"
        )
    # the saved checksum, taken out before the rest is summed (None, from a tool that rebuilt the dict, never matches)
    if not is_nanogpt and checkpoint.pop("checksum", None) != checksum(checkpoint):
        raise CheckpointError(
            f"{path} is damaged: its contents no longer match the checksum saved with them (changed on disk or in a "
            f"copy, or saved without one: an older version, or a tool that rebuilt it); copy it again from where it "
            f"came from, use another checkpoint, or train again. If you made or edited it on purpose, seal it again "
            f"with save_checkpoint (docs/06-running.md, 'Editing a checkpoint')"
        )
    try:  # what every reader needs: the model's config and weights
        if is_nanogpt:
            checkpoint = nanogpt.to_checkpoint(checkpoint)
        GPTConfig.from_options(checkpoint["model_args"])
        # the prefixes torch.compile ("_orig_mod.") and DDP ("module.") add to the names, taken off
        checkpoint["model"] = {re.sub(r"^(_orig_mod\.|module\.)+", "", k): v for k, v in checkpoint["model"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(
            f"{path} is incomplete or malformed ({type(e).__name__}: {first_line(e)}); use another checkpoint"
        ) from None
    bad = [
        k
        for k, t in checkpoint["model"].items()
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.isfinite().all()
    ]
    if bad:
        raise CheckpointError(
            f"{path} holds weights that are not finite (NaN or inf) in {len(bad)} tensors ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): it comes from a diverged run or is damaged; use another checkpoint"
        )
    return checkpoint


def resolve_weights(
    out_dir: str | os.PathLike, ckpt: str | os.PathLike | None, init_from: str | None
) -> tuple[dict[str, Any], str]:
    """The weights a command reads (sample.py, batch_independence.py, the benchmarks, the experiments), as a
    checkpoint dict, and where they came from: GPT-2's (--init_from, with GPT-2's BPE as their tokenizer), the file
    --ckpt, or <out_dir>/ckpt.pt."""
    if init_from is not None and ckpt is not None:
        raise BadOption("--init_from and --ckpt each name the weights to read: give one of them")
    if init_from is not None:
        try:
            return gpt2_checkpoint(init_from) | {"tokenizer": GPT2_BPE}, init_from
        except ValueError as e:  # what to install, what to download, what does not fit
            raise CheckpointError(f"--init_from={init_from}: {first_line(e)}") from None
    path = checkpoint_path(out_dir, ckpt)
    return load_checkpoint(path), str(path)
