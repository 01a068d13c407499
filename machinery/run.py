"""A training run's state, in one place: what the loop trains (Run), its folder (out_dir: one run's files), and its
checkpoint: saved with every process's RNG state, restored on resume so that the run goes on exactly where it was
cut. The file itself (atomic write, checksum, load) is checkpoint.py's."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from machinery.checkpoint import FORMAT, CheckpointError, checkpoint_path, load_checkpoint, save_checkpoint
from machinery.command import fault_message, first_line
from machinery.dataset import PreparedData
from machinery.device import Dist
from machinery.options import TrainConfig
from model import GPT, GPTConfig

# model_args that fix the weights' shapes or where the norms sit: a resume may change dropout and the norm, not these
MODEL_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "norm_position", "embed_scale")
OPTIMIZER_NOW = ("betas", "weight_decay", "fused", "foreach")  # on resume, as configured now: the kernel, too
RUN_FILES = ("ckpt.pt", "ckpt_interrupted.pt", "metrics.jsonl")  # what a run leaves in its out_dir
LOCK_FILE = ".lock"  # held by the run in out_dir (hold_out_dir); not one of its files: it never blocks a later run


@dataclass
class Run:
    """A run as the loop trains it, from its first iteration (new, or as its checkpoint left it: restore())."""

    cfg: TrainConfig
    device: str
    dtype: str
    dist: Dist
    data: PreparedData
    model: GPT
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    data_gen: torch.Generator  # the batches: one stream, the same on every process
    amp: AbstractContextManager[Any]  # the autocast context (a no-op in float32), built once, entered at every step
    resumed_from: Path | None = None  # the checkpoint a resume goes on from
    iter_num: int = 0
    best_val: float = math.inf
    last_saved: int | None = None  # the iteration of the checkpoint in out_dir that this run wrote or resumed
    argv: tuple[str, ...] = ()  # train.py's command line, for the advice to start it again

    @property
    def ckpt_path(self) -> Path:
        return checkpoint_path(self.cfg.out_dir)

    def save(self, path: Path, iter_num: int) -> None:
        """Checkpoint the run after `iter_num` iterations. Every process calls it: their RNG states are gathered
        (each has its own dropout stream), and rank 0 writes the whole state of the run."""
        rng = {"torch": torch.get_rng_state(), "data": self.data_gen.get_state()}  # weights, dropout; the data stream
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state()  # this process's GPU
        if torch.backends.mps.is_available():  # dropout on MPS draws from the Apple GPU's own generator
            rng["mps"] = torch.mps.get_rng_state()
        ranks = [None] * self.dist.world_size if self.dist.master else None  # every process's rng, on rank 0
        if self.dist.enabled:
            torch.distributed.gather_object(rng, ranks, dst=0, group=self.dist.control)
        if not self.dist.master:
            return
        ckpt = {
            "format": FORMAT,
            "model": self.model.state_dict(),
            "model_args": asdict(self.model.config),
            "optimizer": self.optimizer.state_dict(),
            "iter_num": iter_num,
            "best_val_loss": self.best_val,
            "config": asdict(self.cfg),
            "tokenizer": self.data.meta.get("tokenizer"),
            "rng": rng,
        }
        if self.dist.enabled:
            ckpt["rng_ranks"] = ranks
        if self.scaler.is_enabled():
            ckpt["scaler"] = self.scaler.state_dict()
        save_checkpoint(path, ckpt)
        if path == self.ckpt_path:
            self.last_saved = iter_num
            print(f"saved checkpoint {path}", flush=True)

    def restore(self, ckpt: dict[str, Any]) -> None:
        """Load the optimizer, the scaler, this process's RNG states, the iteration and the best val loss of a
        checkpoint from resumed_from. Each process gets back its own dropout stream; from a checkpoint of another
        number of processes, ranks > 0 start a fresh one, seeded by rank and iteration. A checkpoint that passed its
        checksum but does not fit (hand-made, or another program's) is one CheckpointError naming it."""
        try:
            # Today's OPTIMIZER_NOW (the rate is set every iteration) put into the saved groups before loading: torch
            # moves each saved step counter onto its parameter's device, in float32, only where the group says fused.
            saved = ckpt["optimizer"]
            pairs = zip(saved["param_groups"], self.optimizer.param_groups, strict=True)
            now = [{**old, **{k: group.get(k) for k in OPTIMIZER_NOW}} for old, group in pairs]
            self.optimizer.load_state_dict({**saved, "param_groups": now})
            for param, state in self.optimizer.state.items():  # torch checks only the groups' sizes, and the fused
                for name, value in state.items():  # AdamW step would crash the process on a moment of another shape
                    if value.dim() > 0 and value.shape != param.shape:
                        raise ValueError(f"the optimizer's {name!r} of a weight has shape {tuple(value.shape)}")
            if self.scaler.is_enabled() and ckpt.get("scaler"):
                self.scaler.load_state_dict(ckpt["scaler"])
            self.data_gen.set_state(ckpt["rng"]["data"].cpu())  # the same stream on every process
            ranks = ckpt.get("rng_ranks") or [ckpt["rng"]]
            if len(ranks) == self.dist.world_size or self.dist.master:
                rng = ranks[self.dist.rank] if len(ranks) == self.dist.world_size else ranks[0]
                torch.set_rng_state(rng["torch"].cpu())
                if isinstance(rng.get("cuda"), torch.Tensor) and torch.cuda.is_available():
                    torch.cuda.set_rng_state(rng["cuda"].cpu())
                if isinstance(rng.get("mps"), torch.Tensor) and torch.backends.mps.is_available():
                    torch.mps.set_rng_state(rng["mps"].cpu())
            else:
                torch.manual_seed(int(ckpt["config"]["seed"]) + self.dist.rank + 7919 * int(ckpt["iter_num"]))
            self.iter_num, best = ckpt["iter_num"], ckpt["best_val_loss"]
            if type(self.iter_num) is not int or self.iter_num < 0:  # else the schedule runs from it: a negative
                raise ValueError(f"iter_num is {self.iter_num!r}, not an integer >= 0")  # learning rate, say
            if type(best) not in (int, float) or math.isnan(best):  # else no val loss would ever be better
                raise ValueError(f"best_val_loss is {best!r}, not a number")
            self.best_val = float(best)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as e:
            if fault_message(e, "") is not None:  # out of memory moving the state to the device: not the file's
                raise
            raise CheckpointError(
                f"{self.resumed_from} cannot be resumed: its training state does not fit ({type(e).__name__}: "
                f"{first_line(e)}); start a new run (another --out_dir) or use another checkpoint"
            ) from None
        same_file = self.resumed_from is not None and os.path.realpath(self.resumed_from) == os.path.realpath(
            self.ckpt_path
        )
        self.last_saved = self.iter_num if same_file else None


def load_resume(path: Path) -> dict[str, Any]:
    """The checkpoint at `path`, if it is this project's (nanoGPT's are for sampling); CheckpointError otherwise."""
    ckpt = load_checkpoint(path)
    if ckpt["format"] != FORMAT:
        raise CheckpointError(
            f"{path} is nanoGPT's checkpoint: sample.py and batch_independence.py read it, but train.py resumes only "
            f"its own; give another --out_dir to start a new run"
        )
    if not isinstance(ckpt.get("config"), dict):  # the options a resume starts from
        raise CheckpointError(f"{path} cannot be resumed: it has no config (it was not written by train.py)")
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


def make_out_dir(path: str | Path, new_run: bool = False) -> None:
    """Create the folder for ckpt.pt (and its parents) now, so that a path that can't be one fails before training.
    A new run is refused a folder that holds another run's files (RUN_FILES): it would replace them without a word."""
    out = Path(path)
    try:
        found = [name for name in RUN_FILES if (out / name).exists()] if new_run else []
        if found:
            what = (
                f"{out / 'ckpt.pt'} holds another run's checkpoint"
                if "ckpt.pt" in found
                else f"{out} holds another run's files ({', '.join(found)})"
            )
            raise CheckpointError(
                f"{what}: give this run its own --out_dir, continue that run with --init_from=resume, or replace it "
                f"with --overwrite=True"
            )
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file of that name (File exists), a parent that is a file, no permission
        raise CheckpointError(
            f"out_dir {str(out)!r} cannot be created ({e.strerror or e}): give a folder you can write to"
        ) from None


@contextlib.contextmanager
def hold_out_dir(path: str | Path, master: bool = True) -> Iterator[None]:
    """Create out_dir and hold it for the duration: one run per folder. The lock is flock's on out_dir/.lock, which
    the operating system releases when the process ends, however it ends: a kill -9 leaves the file, never a lock.
    Another run into a held folder is a CheckpointError naming the holder's process id. Under torchrun only rank 0
    (`master`) takes it, for the whole run."""
    make_out_dir(path)
    if not master:
        yield
        return
    lock = Path(path) / LOCK_FILE
    while True:
        try:  # never through a symlink planted there
            f = os.fdopen(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+")
        except OSError as e:
            raise CheckpointError(
                f"cannot open {lock} ({e.strerror or e}): give an --out_dir you can write to"
            ) from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().strip()
            f.close()
            holder = f"process {holder}" if holder.isdecimal() else "another process"
            raise CheckpointError(
                f"out_dir {str(path)!r} is in use by a run that is still going ({holder} holds {lock}): wait for it "
                f"to end or stop it, or give this run another --out_dir"
            ) from None
        with contextlib.suppress(OSError):  # still the file at that name, not one its holder removed as it ended
            if os.path.samestat(os.fstat(f.fileno()), os.stat(lock, follow_symlinks=False)):
                break
        f.close()
    try:
        f.truncate(0)  # who holds it, for the message above
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:  # removed while still held; closing the file releases the lock
        lock.unlink(missing_ok=True)
        f.close()
