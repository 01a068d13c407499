"""Checkpoints: what they hold, written atomically, read without unpickling code, every failure explained, and
the checks and the state that let train.py resume a run exactly.

A checkpoint is one dict saved with torch.save (see save_training_checkpoint):

    {"format": FORMAT, "model": state_dict, "model_args": asdict(GPTConfig), "optimizer": state_dict,
     "iter_num": int, "best_val_loss": float, "config": {train options}, "tokenizer": {see tokenizer.py},
     "rng": {torch, data (the position in the data stream), cuda or mps}, "scaler": state_dict (float16),
     "rng_ranks": [every process's "rng"] (several processes), "checksum": sha256 of all the rest (checksum)}

Only tensors, numbers, strings, lists and dicts go in, so `torch.load(..., weights_only=True)` can read it back
without running any pickled code. load_checkpoint verifies the checksum (a file damaged at rest or in a copy is
refused; one written before checksums loads unchecked) and refuses weights that are not finite. It reads nanoGPT's
checkpoints too (nanogpt.py), for sampling and decoding; train.py resumes only its own.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import math
import os
import pickle
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Generator

from machinery import nanogpt
from model import GPTConfig

FORMAT = "layernorm-gpt/1"
# model_args that fix the weights' shapes or where the norms sit: a resume may change dropout and the norm, not these
MODEL_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "norm_position", "embed_scale")
RESUME_KEYS = ("optimizer", "iter_num", "best_val_loss", "config", "rng")  # beyond model(_args): load_checkpoint
OPTIMIZER_NOW = ("betas", "weight_decay", "fused", "foreach")  # on resume, as configured now: the kernel, too
RUN_FILES = ("ckpt.pt", "ckpt_interrupted.pt", "metrics.jsonl")  # what a run leaves in its out_dir


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit what it is asked to do."""


def checkpoint_path(out_dir: str | os.PathLike, ckpt: str | os.PathLike | None = None) -> Path:
    """Where a command reads its checkpoint: --ckpt if given, else <out_dir>/ckpt.pt (or out_dir, if it is a file)."""
    if ckpt is not None:
        return Path(ckpt)
    return Path(out_dir) if Path(out_dir).is_file() else Path(out_dir) / "ckpt.pt"


def make_out_dir(path: str | os.PathLike, new_run: bool = False) -> None:
    """Create the folder for ckpt.pt (and its parents) now, so that a path that can't be one fails before training.
    A new run is refused a folder that holds another run's files (RUN_FILES): it would replace them without a word."""
    out = Path(path)
    try:
        if out.exists() and not out.is_dir():
            raise CheckpointError(f"out_dir {str(out)!r} is a file, not a folder: give a folder for ckpt.pt")
        found = [name for name in RUN_FILES if (out / name).exists()] if new_run else []
        if found:
            what = f"{out / 'ckpt.pt'} holds another run's checkpoint"
            what = what if "ckpt.pt" in found else f"{out} holds another run's files ({', '.join(found)})"
            raise CheckpointError(
                f"{what}: give this run its own --out_dir, continue that run with --init_from=resume, or replace it "
                f"with --overwrite=True"
            )
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(
            f"out_dir {str(out)!r} cannot be created ({e.strerror or e}): give a folder you can write to"
        ) from None


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


def interrupted(e: BaseException | None) -> bool:
    """Whether a KeyboardInterrupt is e or anywhere in what it was raised while handling."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__context__
    return False


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
        Path(tmp).unlink(missing_ok=True)
        if interrupted(e):  # a second Ctrl-C, which torch's writer turns into a RuntimeError ("unexpected pos"):
            raise KeyboardInterrupt from None  # quit, `path` as it was
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
    if path.exists() and not path.is_file():  # a folder, a device
        what = "a folder" if path.is_dir() else "not a regular file"
        raise CheckpointError(f"{path} is {what}, not a checkpoint: give the path of a ckpt.pt file")
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: train one first (python train.py ... --out_dir={path.parent}) "
            f"or point --out_dir at the folder holding ckpt.pt"
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
        found = f"a {type(checkpoint).__name__}"
        if isinstance(checkpoint, dict):
            found = f"a dict with keys {', '.join(map(str, list(checkpoint)[:8]))}"
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (a dict with format {FORMAT!r}) nor nanoGPT's "
            f"(a dict with keys {', '.join(nanogpt.KEYS)}): it holds {found}"
        )
    saved = None if is_nanogpt else checkpoint.pop("checksum", None)  # None: written before checksums
    if saved is not None and saved != checksum(checkpoint):
        raise CheckpointError(
            f"{path} is damaged: its contents no longer match the checksum saved with them (changed on disk or in a "
            f"copy); copy it again from where it came from, use another checkpoint, or train again"
        )
    try:  # what every reader needs: the model's config and weights
        if is_nanogpt:
            checkpoint = nanogpt.to_checkpoint(checkpoint)
        config = GPTConfig.from_options(checkpoint["model_args"])
        checkpoint["model"] = unprefixed(checkpoint["model"])
        mismatch = mismatch_with_weights(checkpoint["model_args"], config, checkpoint["model"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(
            f"{path} is incomplete or malformed ({type(e).__name__}: {first_line(e)}); use another checkpoint"
        ) from None
    if mismatch:
        raise CheckpointError(f"{path} does not describe its own weights: {mismatch}; use another checkpoint")
    weights = checkpoint["model"].items()
    bad = [k for k, t in weights if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.isfinite().all()]
    if bad:
        raise CheckpointError(
            f"{path} holds weights that are not finite (NaN or inf) in {len(bad)} tensors ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): it comes from a diverged run or is damaged; use another checkpoint"
        )
    return checkpoint


def mismatch_with_weights(model_args: dict[str, Any], config: GPTConfig, state: dict[str, Any]) -> str | None:
    """What a checkpoint's model_args say of its weights' shapes that the weights deny (a size that is missing, and
    would take GPTConfig's default, included); None if they agree."""
    missing = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size") if k not in model_args]
    if missing:
        return f"its model_args lack {', '.join(missing)}"
    expected = {
        "transformer.wte.weight": (config.vocab_size, config.n_embd),  # vocab_size and n_embd
        "transformer.wpe.weight": (config.block_size, config.n_embd),  # block_size
    }
    for name, shape in expected.items():
        found = tuple(state[name].shape) if isinstance(state.get(name), torch.Tensor) else None
        if found is not None and found != shape:
            return f"model_args give {name} the shape {list(shape)}, the weight is {list(found)}"
    blocks = {int(k.split(".")[2]) for k in state if k.startswith("transformer.h.") and k.split(".")[2].isdigit()}
    if blocks and len(blocks) != config.n_layer:
        return f"model_args say n_layer={config.n_layer}, the weights hold {len(blocks)} blocks"
    return None


def first_line(e: BaseException) -> str:
    """The first line of an error's message; of torch's weights-only refusal, only its reason (its first line
    suggests loading with weights_only=False, which would run whatever code the file holds)."""
    text = str(e)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    return text.splitlines()[0] if text else ""


def unprefixed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict with the prefixes torch.compile ('_orig_mod.') and DDP ('module.') add taken off."""
    out = {}
    for key, value in state.items():
        while key.startswith(("_orig_mod.", "module.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


# ---- resuming a training run ----


def rng_state(data_gen: Generator) -> dict[str, Any]:
    """This process's random state: torch's (weights, dropout), the data stream's, and the GPU's (CUDA or MPS)."""
    rng = {"torch": torch.get_rng_state(), "data": data_gen.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()  # this process's GPU
    if torch.backends.mps.is_available():  # dropout on MPS draws from the Apple GPU's own generator
        rng["mps"] = torch.mps.get_rng_state()
    return rng


def save_training_checkpoint(path: Path, run: Any, iter_num: int) -> None:
    """Save train.py's Run after `iter_num` iterations. Every process calls it: their RNG states are gathered (each
    has its own dropout stream), and rank 0 writes the whole state of the run (see the module's docstring)."""
    rng = rng_state(run.data_gen)
    ranks = run.dist.gather(rng)
    if not run.dist.master:
        return
    ckpt = {
        "format": FORMAT,
        "model": run.model.state_dict(),
        "model_args": asdict(run.model.config),
        "optimizer": run.optimizer.state_dict(),
        "iter_num": iter_num,
        "best_val_loss": run.best_val,
        "config": asdict(run.cfg),
        "tokenizer": run.data.meta.get("tokenizer"),
        "rng": rng,
    }
    if run.dist.enabled:
        ckpt["rng_ranks"] = ranks
    if run.scaler.is_enabled():
        ckpt["scaler"] = run.scaler.state_dict()
    save_checkpoint(path, ckpt)


def load_resume_checkpoint(out_dir: str | os.PathLike, ckpt: str | os.PathLike | None = None) -> dict[str, Any]:
    """<out_dir>/ckpt.pt (or the file `ckpt`), with every entry a resume needs; CheckpointError otherwise."""
    path = checkpoint_path(out_dir, ckpt)
    ckpt = load_checkpoint(path)
    if ckpt["format"] != FORMAT:
        raise CheckpointError(
            f"{path} is nanoGPT's checkpoint: sample.py and batch_independence.py read it, but train.py resumes only "
            f"its own; give another --out_dir to start a new run"
        )
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{path} cannot be resumed: it has no {', '.join(missing)} "
            f"(it was not written by train.py, or by an older version)"
        )
    if not isinstance(ckpt["config"], dict):  # the options a resume starts from
        raise CheckpointError(f"{path} cannot be resumed: its config is a {type(ckpt['config']).__name__}, not a dict")
    return ckpt


def check_resume(ckpt: dict[str, Any], explicit: dict[str, Any], vocab_size: int, tokenizer: Any, path: Path) -> None:
    """CheckpointError naming the keys if the model's shape asked for explicitly, the dataset's vocabulary size or
    its tokenizer (`tokenizer`, None if unknown) is not the checkpoint's at `path`."""
    saved = asdict(GPTConfig.from_options(ckpt["model_args"]))
    wanted = {k: explicit[k] for k in MODEL_SHAPE_KEYS if k in explicit} | {"vocab_size": vocab_size}
    diffs = [f"{k}: {saved[k]!r} -> {v!r}" for k, v in sorted(wanted.items()) if saved[k] != v]
    if ckpt.get("tokenizer") is not None and tokenizer is not None and ckpt["tokenizer"] != tokenizer:
        diffs.append("tokenizer: the dataset's vocabulary is not the checkpoint's")
    if diffs:
        raise CheckpointError(
            f"cannot resume from {path}: it does not match what was asked for (checkpoint "
            f"-> asked): {'; '.join(diffs)}. Drop those options (or use the dataset it was trained on) to resume it, "
            f"or give another --out_dir to start a new run"
        )


def restore_training_state(ckpt: dict[str, Any], run: Any) -> None:
    """Load the optimizer, the scaler, this process's RNG states, the iteration and the best val loss into train.py's
    Run. Each process gets back its own dropout stream; from a checkpoint of another number of processes (or of a
    version that saved only rank 0's), ranks > 0 start a fresh one, seeded by rank and iteration."""
    dist = run.dist
    path = checkpoint_path(run.cfg.out_dir, run.cfg.resume_from)
    for rng in [ckpt.get("rng"), *(ckpt.get("rng_ranks") or [])]:
        check_rng(rng, path)
    iter_num, best = ckpt.get("iter_num"), ckpt.get("best_val_loss")
    if type(iter_num) is not int or iter_num < 0:  # not a bool, a float or a string either
        raise CheckpointError(f"{path} cannot be resumed: its iter_num is {iter_num!r}, not an integer >= 0")
    if type(best) not in (int, float) or math.isnan(best):
        raise CheckpointError(f"{path} cannot be resumed: its best_val_loss is {best!r}, not a number")
    try:
        # Today's OPTIMIZER_NOW (the rate is set every iteration) put into the saved groups before loading: torch
        # moves each saved step counter onto its parameter's device, in float32, only where the group says fused.
        saved = ckpt["optimizer"]
        if len(saved["param_groups"]) == len(run.optimizer.param_groups):  # else load_state_dict says why not
            pairs = zip(saved["param_groups"], run.optimizer.param_groups, strict=True)
            now = [{**old, **{k: group.get(k) for k in OPTIMIZER_NOW}} for old, group in pairs]
            saved = {**saved, "param_groups": now}
        run.optimizer.load_state_dict(saved)
        if run.scaler.is_enabled() and ckpt.get("scaler"):
            run.scaler.load_state_dict(ckpt["scaler"])
        run.data_gen.set_state(ckpt["rng"]["data"].cpu())  # the same stream on every process
        ranks = ckpt.get("rng_ranks") or [ckpt["rng"]]
        if len(ranks) == dist.world_size or dist.master:
            _set_rng(ranks[dist.rank] if len(ranks) == dist.world_size else ranks[0])
        else:
            torch.manual_seed(int(ckpt["config"]["seed"]) + dist.rank + 7919 * int(ckpt["iter_num"]))
        run.iter_num = int(ckpt["iter_num"])
        run.best_val = float(ckpt["best_val_loss"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as e:
        raise CheckpointError(
            f"{path} cannot be resumed: its optimizer or RNG state does not fit ({type(e).__name__}: {first_line(e)})"
        ) from None
    check_optimizer(run.optimizer, path, run.iter_num)
    run.last_saved = run.iter_num if path == run.ckpt_path else None  # the iteration of ckpt.pt, if resumed from it


def check_rng(rng: Any, path: Path) -> None:
    """CheckpointError unless `rng` holds torch's and the data stream's states as torch keeps them: uint8 tensors
    of the CPU generator's size (what torch.set_rng_state and Generator.set_state accept)."""
    size = torch.get_rng_state().shape
    for key in ("torch", "data"):
        state = rng.get(key) if isinstance(rng, dict) else None
        if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.shape == size):
            found = f"{state.dtype} {tuple(state.shape)}" if isinstance(state, torch.Tensor) else type(state).__name__
            raise CheckpointError(
                f"{path} cannot be resumed: its RNG state {key!r} is {found}, not a uint8 tensor of {size[0]} "
                f"bytes; start a new run (another --out_dir) or use another checkpoint"
            )


def check_optimizer(optimizer: torch.optim.Optimizer, path: Path, iter_num: int) -> None:
    """CheckpointError unless every loaded optimizer state tensor is finite, AdamW's second moment is not negative,
    and each per-weight one (AdamW's moments) has its weight's shape: torch's load_state_dict checks the groups'
    sizes only. An empty state, which
    AdamW has only before its first step, is refused after one (iter_num > 0)."""
    if iter_num > 0 and not optimizer.state:
        raise CheckpointError(
            f"{path} cannot be resumed: its optimizer holds no state after {iter_num} iterations (AdamW's moments are "
            f"missing); start a new run (another --out_dir) or use another checkpoint"
        )
    for group in optimizer.param_groups:
        for p in group["params"]:
            for name, value in optimizer.state.get(p, {}).items():
                if not isinstance(value, torch.Tensor):
                    continue
                wrong = value.dim() > 0 and value.shape != p.shape
                negative = name in ("exp_avg_sq", "max_exp_avg_sq") and bool((value < 0).any())  # squares' averages
                if wrong or negative or not value.isfinite().all():
                    what = f"shape {tuple(value.shape)}, its weight's {tuple(p.shape)}" if wrong else "not finite"
                    what = "negative in places (an average of squares cannot be)" if negative else what
                    raise CheckpointError(
                        f"{path} cannot be resumed: its optimizer state {name!r} of a weight is {what}; "
                        f"start a new run (another --out_dir) or use another checkpoint"
                    )


def _set_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"].cpu())
    if isinstance(rng.get("cuda"), torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"].cpu())
    if isinstance(rng.get("mps"), torch.Tensor) and torch.backends.mps.is_available():
        torch.mps.set_rng_state(rng["mps"].cpu())
