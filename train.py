"""Train a GPT on a prepared dataset: one process, or several with torchrun.

    python train.py [configs/NAME.json] [--key=value ...]
    python train.py configs/shakespeare_char_cpu.json --norm=custom
    python train.py configs/shakespeare_char_cpu.json --init_from=resume --max_iters=3000
    torchrun --standalone --nproc_per_node=4 train.py configs/shakespeare_char.json
    python train.py --help

Options: the defaults are the TrainConfig dataclass below (each with its meaning); a JSON config file sets some of
them; `--key=value` flags override both. With --init_from=resume the options saved in the checkpoint are the
defaults instead, so `python train.py --init_from=resume --out_dir=DIR` continues a run as it was configured.

The loop is nanoGPT's: AdamW, linear warmup then cosine decay to min_lr, gradient clipping, gradient accumulation,
an estimate of train and val loss every eval_interval iterations, a checkpoint after it. Some things differ:

- Data. Batches are windows at random offsets of train.bin, drawn from a dedicated torch.Generator seeded from
  `seed`; its state is the position in the data stream and goes into the checkpoint with every other RNG state,
  so a resumed run continues exactly the run it was cut from. Each iteration draws the offsets of the whole global
  batch at once, [gradient_accumulation_steps, batch_size], and each process takes its own rows: one process or
  N processes see the same data. Evaluation draws from its own generator, re-seeded at every evaluation: the same
  batches every time, and the training stream is never disturbed.
- The hot loop reads nothing back from the device: the loss of every iteration is kept as a device tensor and
  read (one sync) every log_interval iterations and before every checkpoint. That read also checks that every
  loss was finite, so a NaN stops training before it can reach a checkpoint, with the iteration it appeared at.
- Faults. Checkpoints are written atomically (checkpoint.save_checkpoint). Ctrl-C (SIGINT) or SIGTERM finishes
  the current iteration, saves a checkpoint and exits with 128 + the signal number (130, 143); a second Ctrl-C
  aborts at once without saving. A NaN or inf loss stops with exit status 1 and leaves the last checkpoint alone.
- Debugging hook: LAYERNORM_GPT_INJECT_NAN_AT=<iter> multiplies the loss of that training iteration by NaN
  before backward (the weights then turn NaN too): the way the tests make training diverge on purpose.

Exit status: 0 done, 1 a data, checkpoint or divergence error, 2 a bad option, 130/143 interrupted.
Every error is one line on stderr ("error: ..."), never a traceback.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import random
import resource
import signal
import statistics
import sys
import time
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import layernorm
from checkpoint import FORMAT, INTERCHANGEABLE_NORMS, CheckpointError, config_mismatch, load_checkpoint, save_checkpoint
from checkpoint import model_from_checkpoint as _model_from_checkpoint
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent
INJECT_NAN_ENV = "LAYERNORM_GPT_INJECT_NAN_AT"
EVAL_SEED_OFFSET = 1_000_003  # the eval generator's seed is seed + this: a stream unrelated to the training one
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 200
# Options that fix the shape of the model (and so of the checkpoint); dropout and an interchangeable norm may change
# on resume, these may not.
MODEL_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")


def opt(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A TrainConfig option: its default, its one-line meaning and, for some strings, the valid values."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = opt("out", "folder for ckpt.pt and metrics.jsonl")
    dataset: str = opt("shakespeare_char", "dataset name: its data is data/<dataset>/ unless data_dir is given")
    data_dir: str | None = opt(None, "folder holding train.bin, val.bin and meta.json (None: data/<dataset>)")
    init_from: str = opt(
        "scratch", "scratch: a new model; resume: continue from <out_dir>/ckpt.pt", ("scratch", "resume")
    )
    eval_interval: int = opt(250, "estimate train/val loss (and maybe checkpoint) every this many iterations")
    log_interval: int = opt(10, "print a log line and a metrics record every this many iterations")
    eval_iters: int = opt(200, "batches per split in each loss estimate")
    eval_only: bool = opt(False, "estimate the losses once and exit (no training)")
    always_save_checkpoint: bool = opt(
        True, "checkpoint after every evaluation; False: only when val loss improves (keeps the best model)"
    )
    # data
    batch_size: int = opt(12, "sequences per micro-batch (per process)")
    block_size: int = opt(64, "context length in tokens")
    gradient_accumulation_steps: int = opt(
        1, "micro-batches per optimizer step, over all processes (divisible by their number)"
    )
    # model
    n_layer: int = opt(4, "transformer blocks")
    n_head: int = opt(4, "attention heads per block")
    n_embd: int = opt(128, "model width (divisible by n_head)")
    dropout: float = opt(0.0, "dropout probability, in [0, 1)")
    bias: bool = opt(True, "bias in the Linear layers and the norms")
    norm: str = opt("builtin", "normalization layer: a name from layernorm.NORMS")
    # optimizer and schedule
    learning_rate: float = opt(1e-3, "peak learning rate")
    max_iters: int = opt(2000, "optimizer steps in the whole run")
    weight_decay: float = opt(0.1, "AdamW weight decay (Linear weights only)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the gradient norm to this; 0 disables")
    decay_lr: bool = opt(True, "warmup then cosine decay; False: constant learning_rate")
    warmup_iters: int = opt(100, "iterations of linear warmup")
    lr_decay_iters: int = opt(2000, "iteration at which the cosine reaches min_lr (usually max_iters)")
    min_lr: float = opt(1e-4, "learning rate at the end of the decay (about learning_rate / 10)")
    # system
    device: str = opt("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    dtype: str = opt(
        "auto",
        "auto: bfloat16 autocast on CUDA where supported, else float32; float16 uses a GradScaler",
        ("auto", "float32", "bfloat16", "float16"),
    )
    compile: bool = opt(False, "wrap the model in torch.compile")
    seed: int = opt(1337, "seeds the weights, dropout, the data stream and the eval batches")
    max_wall_s: float | None = opt(None, "stop (evaluate, checkpoint) once training has run this many seconds")
    # logging and sampling
    wandb_log: bool = opt(False, "log to Weights & Biases (needs `pip install wandb`; WANDB_MODE=offline works)")
    wandb_project: str = opt("layernorm-gpt", "wandb project")
    wandb_run_name: str | None = opt(None, "wandb run name (None: <dataset>-<norm>-<time>)")
    sample_at_end: bool = opt(True, "print a sample from the final model when training ends")
    sample_tokens: int = opt(300, "tokens in that sample")


class TrainError(Exception):
    """A failure explained in one line; `exit_code` is the process's exit status."""

    exit_code = 1


class ConfigError(TrainError, ValueError):
    """A bad option: unknown, of the wrong type, out of range, or impossible on this machine."""

    exit_code = 2


class Diverged(TrainError):
    """A loss or a weight became NaN or inf."""


class Interrupted(TrainError):
    """SIGINT/SIGTERM: a checkpoint was saved (the message says where and how to resume)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


# --------------------------------------------------------------------------------------------------------------
# Options


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _type_name(tp: Any, short: bool = False) -> str:
    if tp is bool:
        return "bool" if short else "bool (true/false/1/0)"
    args = typing.get_args(tp)
    if args:  # X | None
        return " or ".join("None" if a is type(None) else a.__name__ for a in args)
    return tp.__name__


def _base_type(tp: Any) -> tuple[type, bool]:
    """(the non-None type, whether None is allowed) of an option's annotation."""
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or args:
        return next(a for a in args if a is not type(None)), type(None) in args
    return tp, False


def _parse_text(key: str, text: str, tp: Any) -> Any:
    """A command-line value -> the option's type, or ConfigError naming the key, the value and the type."""
    base, optional = _base_type(tp)
    if optional and text in ("None", "none", "null"):
        return None
    try:
        if base is bool:
            return {"true": True, "1": True, "false": False, "0": False}[text.lower()]
        return base(text)
    except (KeyError, ValueError):
        raise ConfigError(f"--{key}={text}: expected {_type_name(tp)}, got {text!r}") from None


def _check_json_value(key: str, value: Any, tp: Any, source: str) -> Any:
    """A value from a JSON file or a checkpoint must already have the option's type (an int is a fine float)."""
    base, optional = _base_type(tp)
    if value is None and optional:
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, base) and (base is bool or not isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}={value!r} in {source}: expected {_type_name(tp)}, got {type(value).__name__}")


def _unknown_key(key: str, source: str) -> ConfigError:
    names = [f.name for f in fields(TrainConfig)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown option {key!r} ({source}).{hint} Valid options: {', '.join(names)}")


def valid_norms() -> tuple[str, ...]:
    """layernorm.NORMS, plus "none" (no normalization at all: the baseline of bench/compare_norms.py)."""
    return (*layernorm.NORMS, layernorm.NO_NORM)


def usage() -> str:
    lines = [
        "usage: python train.py [CONFIG.json] [--key=value ...]",
        "",
        "Train a GPT. A JSON config file sets some options, --key=value flags override it; the rest keep their",
        "defaults. With --init_from=resume the checkpoint's saved options are the defaults. Options (=default):",
    ]
    types_ = _field_types()
    for f in fields(TrainConfig):
        choices = f.metadata["choices"] or (valid_norms() if f.name == "norm" else None)
        extra = f" [{'|'.join(choices)}]" if choices else ""
        flag = f"  --{f.name}={f.default}"
        lines.append(f"{flag:<36} ({_type_name(types_[f.name], short=True)}) {f.metadata['help']}{extra}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
    """argv -> (the config file or None, {key: value} from the config file and then the flags, typed).

    Raises ConfigError for an unknown key, a value of the wrong type, an unreadable config file.
    `--help` prints the options and raises SystemExit(0).
    """
    types_ = _field_types()
    config_file = None
    from_file: dict[str, Any] = {}
    from_flags: dict[str, Any] = {}
    for arg in argv:
        if arg in ("-h", "--help"):
            print(usage())
            raise SystemExit(0)
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            key = key.replace("-", "_")
            if key not in types_:
                raise _unknown_key(key, "on the command line")
            if not eq:
                if types_[key] is not bool:
                    raise ConfigError(f"--{key} needs a value: --{key}=VALUE ({_type_name(types_[key])})")
                text = "true"  # a bare --flag turns a bool option on
            from_flags[key] = _parse_text(key, text, types_[key])
        elif arg.startswith("-"):
            raise ConfigError(f"unknown argument {arg!r}: options are written --key=value (see --help)")
        elif config_file is not None:
            raise ConfigError(f"only one config file may be given, got {config_file!r} and {arg!r}")
        else:
            config_file = arg
            from_file = read_config_file(arg)
    return config_file, {**from_file, **from_flags}


def read_config_file(path: str) -> dict[str, Any]:
    """A JSON object of options -> {key: typed value}; ConfigError says what is wrong with it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path!r} not found (config files are JSON, e.g. configs/shakespeare_char.json)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object of options, not {type(data).__name__}")
    types_ = _field_types()
    out = {}
    for key, value in data.items():
        if key not in types_:
            raise _unknown_key(key, f"in {path}")
        out[key] = _check_json_value(key, value, types_[key], path)
    return out


def validate(cfg: TrainConfig) -> None:
    """Range and choice checks; ConfigError names the option, its value and what is valid."""
    for name in ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "gradient_accumulation_steps",
                 "eval_interval", "log_interval", "eval_iters", "lr_decay_iters"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(cfg, name)}")
    for name in ("max_iters", "warmup_iters", "sample_tokens"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in ("weight_decay", "grad_clip", "min_lr"):
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if not cfg.learning_rate > 0:
        raise ConfigError(f"learning_rate must be > 0, got {cfg.learning_rate}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    if not 0 <= cfg.dropout < 1:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    if cfg.decay_lr and cfg.lr_decay_iters <= cfg.warmup_iters:
        raise ConfigError(
            f"lr_decay_iters ({cfg.lr_decay_iters}) must be greater than warmup_iters ({cfg.warmup_iters}) "
            f"when decay_lr=True"
        )
    if cfg.max_wall_s is not None and not cfg.max_wall_s > 0:
        raise ConfigError(f"max_wall_s must be > 0 or None, got {cfg.max_wall_s}")
    for f in fields(TrainConfig):
        choices = f.metadata["choices"]
        if choices and getattr(cfg, f.name) not in choices:
            raise ConfigError(f"{f.name}={getattr(cfg, f.name)!r} is not valid; choose one of {', '.join(choices)}")
    norms = valid_norms()
    if cfg.norm not in norms:
        close = difflib.get_close_matches(cfg.norm, norms, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"norm={cfg.norm!r} is not a norm{hint}; choose one of {', '.join(norms)}")
    dev = cfg.device
    if not (dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ConfigError(f"device={dev!r} is not valid; choose auto, cpu, cuda, cuda:N or mps")
    if not cfg.dataset or not cfg.out_dir:
        raise ConfigError("dataset and out_dir must not be empty")


def build_config(explicit: dict[str, Any], base: dict[str, Any] | None = None, source: str = "") -> TrainConfig:
    """TrainConfig from `base` (defaults when None; a checkpoint's saved options on resume) updated by `explicit`."""
    cfg = TrainConfig()
    if base:
        types_ = _field_types()
        known = {k: _check_json_value(k, v, types_[k], source) for k, v in base.items() if k in types_}
        cfg = replace(cfg, **known)
    cfg = replace(cfg, **explicit)
    validate(cfg)
    return cfg


# --------------------------------------------------------------------------------------------------------------
# Processes, device, precision


@dataclass
class Dist:
    """Where this process stands among the torchrun processes (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def master(self) -> bool:
        return self.rank == 0


def dist_from_env() -> Dist:
    """torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; a plain `python train.py` sets none of them."""
    if "RANK" not in os.environ:
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def resolve_device(name: str, dist: Dist) -> str:
    """The torch device string for --device; ConfigError when the asked-for device is not there."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available() and not dist.enabled:
            name = "mps"
        else:
            name = "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={name!r} is not a device here; choose auto, cpu, cuda, cuda:N or mps")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={name!r} but CUDA is not available here (torch {torch.__version__}); "
                f"use --device=cpu or --device=auto"
            )
        if dist.enabled:
            name = f"cuda:{dist.local_rank}"  # one GPU per process
        if (torch.device(name).index or 0) >= torch.cuda.device_count():
            raise ConfigError(f"device={name!r} but there are only {torch.cuda.device_count()} CUDA devices")
    elif name == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("device='mps' but MPS is not available here; use --device=cpu or --device=auto")
        if dist.enabled:
            raise ConfigError("several processes (torchrun) are supported on CUDA (nccl) and CPU (gloo), not MPS")
    return name


def resolve_dtype(name: str, device_type: str) -> str:
    if name == "auto":
        return "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("dtype='bfloat16' is not supported by this GPU; use --dtype=float16 or --dtype=float32")
    return name


# --------------------------------------------------------------------------------------------------------------
# Data


class Data:
    """train.bin / val.bin (flat uint16 token ids) and meta.json of one prepared dataset.

    Windows are read with one os.pread each: nothing of the files stays mapped in the process (a memmap kept open
    would keep every page it touched resident, and opening one per batch, as nanoGPT does, costs ~4x more).
    Where os.pread does not exist (Windows), a memmap is opened per batch.
    """

    def __init__(self, data_dir: Path, dataset: str, block_size: int, device: str) -> None:
        self.dir = data_dir
        self.block_size = block_size
        self.device = device
        self.pin = device.startswith("cuda")
        prepare = ROOT / "data" / dataset / "prepare.py"
        if prepare.is_file():
            how = f"run `python {prepare.relative_to(ROOT)}`" + (
                "" if data_dir == ROOT / "data" / dataset else f" --out_dir {data_dir}"
            ) + " first"
        else:
            how = "write train.bin, val.bin (np.uint16 token ids) and meta.json there (see data/README.md)"
        for name in ("train.bin", "val.bin", "meta.json"):
            if not (data_dir / name).is_file():
                raise TrainError(f"no {name} in {data_dir} (dataset {dataset!r}): {how}")
        try:
            self.meta = json.loads((data_dir / "meta.json").read_text(encoding="utf-8"))
            self.vocab_size = int(self.meta["vocab_size"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise TrainError(f"{data_dir / 'meta.json'} is unreadable or has no vocab_size ({e}): {how}") from None
        self.tokens = {s: (data_dir / f"{s}.bin").stat().st_size // 2 for s in ("train", "val")}
        for split, n in self.tokens.items():
            if n <= block_size:
                raise TrainError(
                    f"{split}.bin in {data_dir} has {n} tokens but block_size is {block_size}: a window needs "
                    f"block_size + 1 = {block_size + 1} tokens (input and shifted target); use more text or a "
                    f"smaller --block_size"
                )
        self._offsets = np.arange(block_size + 1)
        self._paths = {s: str(data_dir / f"{s}.bin") for s in ("train", "val")}
        self._fds: dict[str, int] | None = {} if hasattr(os, "pread") else None  # opened at first use

    def close(self) -> None:
        for fd in (self._fds or {}).values():
            os.close(fd)
        if self._fds:
            self._fds = {}

    def num_starts(self, split: str) -> int:
        """How many window start positions the split has (0 .. n - block_size - 1)."""
        return self.tokens[split] - self.block_size

    def get(self, split: str, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows at `starts` (int tensor of any shape S) -> inputs and targets [*S, block_size] on the device."""
        if self._fds is not None:
            fd = self._fds.get(split)
            if fd is None:
                fd = self._fds[split] = os.open(self._paths[split], os.O_RDONLY)
            nbytes = 2 * (self.block_size + 1)
            raw = b"".join([os.pread(fd, nbytes, 2 * i) for i in starts.view(-1).tolist()])
            windows = np.frombuffer(raw, dtype=np.uint16).reshape(*starts.shape, self.block_size + 1)
        else:
            data = np.memmap(self._paths[split], dtype=np.uint16, mode="r")
            windows = data[starts.numpy()[..., None] + self._offsets]  # one gather: [*S, block_size + 1]
        x = torch.from_numpy(windows[..., :-1].astype(np.int64))
        y = torch.from_numpy(windows[..., 1:].astype(np.int64))
        if self.pin:
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        if self.device != "cpu":
            return x.to(self.device), y.to(self.device)
        return x, y


# --------------------------------------------------------------------------------------------------------------
# Schedule, RNG, memory


def get_lr(it: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup for warmup_iters, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def rng_state(data_gen: torch.Generator) -> dict[str, Any]:
    """Every random state the run depends on, as tensors and plain data (loadable with weights_only=True)."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np_state,
             "data": data_gen.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], data_gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state(
        {**np_state, "state": {**np_state["state"], "key": np.array(np_state["state"]["key"], dtype=np.uint32)}}
    )
    data_gen.set_state(state["data"].cpu())
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def peak_memory_bytes(device: str) -> int:
    """CUDA: peak allocated by tensors. MPS: driver memory now. CPU: the process's peak resident set."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    if device == "mps" and hasattr(torch.mps, "driver_allocated_memory"):
        return int(torch.mps.driver_allocated_memory())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, kB on Linux


def _all_finite(tensors: Iterator[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


# --------------------------------------------------------------------------------------------------------------
# The run


class Trainer:
    """One training run: setup, the loop, evaluation, checkpoints, logging. `run()` returns the summary."""

    def __init__(self, cfg: TrainConfig, explicit: dict[str, Any], dist: Dist, ckpt: dict[str, Any] | None) -> None:
        self.t_start = time.perf_counter()
        self.cfg = cfg
        self.dist = dist
        self.out_dir = Path(cfg.out_dir)
        self.ckpt_path = self.out_dir / "ckpt.pt"
        self.device = resolve_device(cfg.device, dist)
        self.device_type = self.device.split(":")[0]
        self.dtype = resolve_dtype(cfg.dtype, self.device_type)
        if self.device_type == "cuda":
            if torch.device(self.device).index is not None:  # 'cuda' alone is the current device already
                torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.cuda.reset_peak_memory_stats(self.device)
        data_dir = Path(cfg.data_dir) if cfg.data_dir else ROOT / "data" / cfg.dataset
        self.data = Data(data_dir, cfg.dataset, cfg.block_size, self.device)
        self.micro_steps = cfg.gradient_accumulation_steps // dist.world_size  # this process's share
        self.tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size

        # Seeds: weights and dropout from the global torch RNG (one stream per process), data from its own.
        torch.manual_seed(cfg.seed + dist.rank)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.data_gen = torch.Generator().manual_seed(cfg.seed)

        model_args = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                          bias=cfg.bias, vocab_size=self.data.vocab_size, dropout=cfg.dropout, norm=cfg.norm)
        self.iter_num = 0
        self.best_val_loss = math.inf
        self.resumed = ckpt is not None
        if ckpt is not None:
            check_resumable(ckpt, explicit, self.data, self.ckpt_path)
            model_args = {**ckpt["model_args"], "dropout": cfg.dropout, "norm": cfg.norm}
            self.raw_model = _build(lambda: _model_from_checkpoint({**ckpt, "model_args": model_args}), cfg.norm)
            self.raw_model.to(self.device).train()
        else:
            torch.manual_seed(cfg.seed)  # the same initial weights on every process
            self.raw_model = _build(lambda: GPT(GPTConfig(**model_args)), cfg.norm).to(self.device)
            torch.manual_seed(cfg.seed + dist.rank)
        self.model_args = model_args
        self.params = list(self.raw_model.parameters())
        self.optimizer = self.raw_model.configure_optimizers(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), self.device_type
        )
        self.scaler = torch.amp.GradScaler(self.device_type) if self.dtype == "float16" else None
        if ckpt is not None:
            try:
                self._restore(ckpt)
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                raise CheckpointError(
                    f"{self.ckpt_path} cannot be resumed: its optimizer or RNG state does not fit "
                    f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                ) from None
            if dist.rank:  # only rank 0's dropout stream is saved; the others get a fresh, deterministic one
                torch.manual_seed(cfg.seed + dist.rank + 7919 * self.iter_num)

        ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]
        self.autocast: AbstractContextManager[Any] = (
            nullcontext() if self.dtype == "float32" else torch.autocast(self.device_type, dtype=ptdtype)
        )
        self.model: torch.nn.Module = torch.compile(self.raw_model) if cfg.compile else self.raw_model
        self.train_model: torch.nn.Module = self.model
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_model = DDP(self.model, device_ids=[dist.local_rank] if self.device_type == "cuda" else None)

        inject = os.environ.get(INJECT_NAN_ENV)
        self.inject_nan_at = int(inject) if inject else None
        # The losses (0-d device tensors) and learning rates of the iterations not yet read back, from window_start.
        self.window_start = self.iter_num
        self.window: list[torch.Tensor] = []
        self.window_lrs: list[float] = []
        self.t_window = time.perf_counter()
        self.n_timed = 0  # iterations read back since t_window
        self.paused_s = 0.0  # time spent evaluating/checkpointing inside the current timing window
        self.ms_per_iter: list[float] = []
        self.last_saved_iter: int | None = self.iter_num if ckpt is not None else None
        self.signum: int | None = None  # the signal that asked us to stop, if any
        self.signal_time = 0.0
        self.stop_reason: str | None = None
        self.last_val: float | None = None
        self.metrics = None
        self.wandb = None

    def _restore(self, ckpt: dict[str, Any]) -> None:
        """Optimizer, scaler, iteration, best val loss and every RNG state, from a checkpoint."""
        # The saved moments and step counts; betas and weight decay as configured now (the same unless given
        # explicitly); the learning rate is set at every iteration.
        wanted = [(g["betas"], g["weight_decay"]) for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(ckpt["optimizer"])
        for group, (betas, weight_decay) in zip(self.optimizer.param_groups, wanted, strict=True):
            group["betas"], group["weight_decay"] = betas, weight_decay
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.iter_num = int(ckpt["iter_num"])
        self.best_val_loss = float(ckpt["best_val_loss"])
        set_rng_state(ckpt["rng"], self.data_gen)

    # ---- output (rank 0 only) ----

    def log(self, message: str) -> None:
        if self.dist.master:
            print(message, flush=True)

    def record(self, rec: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()

    def _open_metrics(self) -> None:
        """Start metrics.jsonl afresh; on resume keep what describes the run up to the checkpoint.

        Records of iterations at or after the checkpoint (the tail a killed run wrote after its last checkpoint)
        and a line cut short by a kill are dropped: the file then reads as one uninterrupted run.
        """
        if not self.dist.master:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / "metrics.jsonl"
        if self.cfg.eval_only:  # adds one evaluation to the record of the run
            self.metrics = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in run())
            return
        kept = []
        if self.resumed and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                it = rec.get("iter")
                if it is None or it < self.iter_num or (rec.get("kind") == "eval" and it == self.iter_num):
                    kept.append(line + "\n")
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
        self.metrics = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in run())

    def _init_wandb(self) -> None:
        if not (self.cfg.wandb_log and self.dist.master):
            return
        wandb = import_wandb()
        name = self.cfg.wandb_run_name or f"{self.cfg.dataset}-{self.cfg.norm}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.wandb = wandb.init(project=self.cfg.wandb_project, name=name, config=asdict(self.cfg))

    # ---- checks, evaluation, checkpoints ----

    def _flush(self, it: int, log: bool = False) -> None:
        """Read back the losses of the iterations since the last flush (one sync); stop if one is not finite.

        With several processes the losses are averaged over them in the same all_reduce that agrees on whether
        to stop (a signal or max_wall_s seen by any process), so every process stops at the same iteration.
        """
        losses = torch.stack(self.window).float() if self.window else torch.zeros(0, device=self.device)
        stop = self.signum is not None
        wall = self.cfg.max_wall_s is not None and time.perf_counter() - self.t_start > self.cfg.max_wall_s
        if self.dist.enabled:
            import torch.distributed as tdist

            flags = torch.tensor([float(stop), float(wall)], device=losses.device)
            both = torch.cat([losses, flags])
            tdist.all_reduce(both)
            losses = both[:-2] / self.dist.world_size
            stop, wall = bool(both[-2] > 0), bool(both[-1] > 0)
            if stop and self.signum is None:
                self.signum = signal.SIGINT
        values = losses.tolist()
        now = time.perf_counter()
        n_iters = len(values)
        first = self.window_start
        self.window, self.window_start = [], it + 1 if log else it
        lrs, self.window_lrs = self.window_lrs, []
        for k, v in enumerate(values):
            if not math.isfinite(v):
                self._diverged(f"loss is {v} at iteration {first + k}")
        if wall and self.stop_reason is None:
            self.stop_reason = "max_wall_s"
        if self.dist.enabled and stop:
            self.stop_reason = self.stop_reason or "signal"
        self.n_timed += n_iters
        if not log or not self.n_timed:
            return
        ms = (now - self.t_window - self.paused_s) * 1000 / self.n_timed
        self.t_window, self.paused_s, self.n_timed = now, 0.0, 0
        self.ms_per_iter.append(ms)
        tok_s = self.tokens_per_iter / (ms / 1000) if ms > 0 else 0.0
        loss, lr = values[-1], lrs[-1]
        self.log(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, {ms:.2f} ms/iter, {tok_s:.0f} tok/s")
        self.record({"kind": "train", "iter": it, "loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s})
        if self.wandb is not None:
            self.wandb.log({"train/loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s}, step=it)

    def _diverged(self, what: str) -> None:
        if self.last_saved_iter is not None:
            kept = f"the last good checkpoint, {self.ckpt_path} (iteration {self.last_saved_iter}), was kept"
        else:
            kept = "no checkpoint had been written by this run"
        raise Diverged(
            f"{what}: training stopped; {kept}. To go on from it, resume (--init_from=resume) "
            f"with a lower --learning_rate or a longer --warmup_iters"
        )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over eval_iters batches of each split; the same batches at every call (own generator)."""
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed + EVAL_SEED_OFFSET)
        self.model.eval()
        sums = []
        for split in ("train", "val"):
            starts = torch.randint(self.data.num_starts(split), (cfg.eval_iters, cfg.batch_size), generator=gen)
            total = torch.zeros((), device=self.device)
            for rows in starts[self.dist.rank :: self.dist.world_size]:  # each process evaluates its share
                x, y = self.data.get(split, rows)
                with self.autocast:
                    _, loss = self.model(x, y)
                total += loss.float()
            sums.append(total)
        both = torch.stack(sums)
        if self.dist.enabled:
            import torch.distributed as tdist

            tdist.all_reduce(both)
        self.model.train()
        train_loss, val_loss = (both / cfg.eval_iters).tolist()
        return {"train": train_loss, "val": val_loss}

    def checkpoint(self, it: int, path: Path | None = None) -> None:
        """Save the whole state after `it` iterations (rank 0); refuse weights that are not finite."""
        # Every process checks (their weights are the same), so that all of them stop together.
        if not _all_finite(iter(self.raw_model.state_dict().values())):
            self._diverged(f"the weights are not finite at iteration {it}")
        if not self.dist.master:
            return
        ckpt = {
            "format": FORMAT,
            "model": self.raw_model.state_dict(),
            "model_args": self.model_args,
            "optimizer": self.optimizer.state_dict(),
            "iter_num": it,
            "best_val_loss": self.best_val_loss,
            "config": asdict(self.cfg),
            "tokenizer": self.data.meta.get("tokenizer"),
            "rng": rng_state(self.data_gen),
        }
        if self.scaler is not None:
            ckpt["scaler"] = self.scaler.state_dict()
        path = path or self.ckpt_path
        save_checkpoint(path, ckpt)
        if path == self.ckpt_path:
            self.last_saved_iter = it

    def _eval_and_checkpoint(self, it: int, may_save: bool) -> None:
        t0 = time.perf_counter()
        self._flush(it)  # never evaluate or save weights that a NaN went through
        losses = self.evaluate()
        self.log(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        self.record({"kind": "eval", "iter": it, "train_loss": losses["train"], "val_loss": losses["val"]})
        if self.wandb is not None:
            self.wandb.log({"eval/train_loss": losses["train"], "val/loss": losses["val"]}, step=it)
        if not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
            self._diverged(f"the estimated loss is not finite at iteration {it} ({losses})")
        self.last_val = losses["val"]
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if may_save and (improved or self.cfg.always_save_checkpoint):
            self.checkpoint(it)
            self.log(f"saved checkpoint {self.ckpt_path}")
        self.paused_s += time.perf_counter() - t0

    def _interrupt(self, it: int) -> None:
        """Save the state after `it` iterations and raise Interrupted (with a resume command)."""
        self._flush(it)
        signum = self.signum or signal.SIGINT
        # In best-only mode ckpt.pt is the best model so far; the interrupted state goes beside it.
        path = self.ckpt_path if self.cfg.always_save_checkpoint else self.out_dir / "ckpt_interrupted.pt"
        self.checkpoint(it, path)
        resume = f"python train.py --init_from=resume --out_dir={self.cfg.out_dir}"
        if path != self.ckpt_path:
            resume = f"mv {path} {self.ckpt_path} && {resume}"
        raise Interrupted(
            f"interrupted ({signal.Signals(signum).name}) after {it} iterations; saved {path}. "
            f"To continue the run: {resume}",
            signum,
        )

    # ---- the loop ----

    def _handle_signal(self, signum: int, frame: types.FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is not None:
            # A second signal within a second is the same request (torchrun forwards the terminal's Ctrl-C to
            # processes that already got it); a later one means: stop now, without saving.
            if now - self.signal_time < 1.0:
                return
            signal.signal(signum, signal.SIG_DFL)
            raise KeyboardInterrupt
        self.signum, self.signal_time = signum, now
        if self.dist.master:
            os.write(2, b"\nstopping after this iteration to save a checkpoint (Ctrl-C again to quit without saving)\n")

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self._open_metrics()
        old_handlers = {}
        try:
            self._init_wandb()
            self._describe()
            sample = cfg.sample_at_end and self.dist.master and not cfg.eval_only
            tok = self._sample_tokenizer() if sample else None
            if threading_main():
                for s in (signal.SIGINT, signal.SIGTERM):
                    old_handlers[s] = signal.signal(s, self._handle_signal)
            self._loop()
            summary = self._summary()
            self.record(summary)
            if self.wandb is not None:
                self.wandb.summary.update(summary)
            if tok is not None:
                self._sample(tok)
            return summary
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.data.close()
            if self.metrics is not None:
                self.metrics.close()
            if self.wandb is not None:
                self.wandb.finish()

    def _loop(self) -> None:
        cfg = self.cfg
        it = start = self.iter_num
        optimizer, scaler, params, autocast = self.optimizer, self.scaler, self.params, self.autocast
        train_model, micro_steps, data_gen = self.train_model, self.micro_steps, self.data_gen
        rows = slice(self.dist.rank * micro_steps, (self.dist.rank + 1) * micro_steps)  # this process's share
        no_sync = train_model.no_sync if self.dist.enabled else nullcontext
        n_starts = self.data.num_starts("train")
        global_batch = (cfg.gradient_accumulation_steps, cfg.batch_size)
        self.t_window = time.perf_counter()
        while True:
            end = it >= cfg.max_iters or self.stop_reason == "max_wall_s" or cfg.eval_only
            # A resumed run was evaluated just before its checkpoint: no need to do it again.
            if it % cfg.eval_interval == 0 or end:
                if not (self.resumed and it == start and not end):
                    self._eval_and_checkpoint(it, may_save=it > start and not cfg.eval_only)
            if end:
                break
            if self.signum is not None and (not self.dist.enabled or self.stop_reason == "signal"):
                self._interrupt(it)

            lr = get_lr(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            # The whole global batch's offsets (so any number of processes sees the same data); then ours.
            starts = torch.randint(n_starts, global_batch, generator=data_gen)
            xs, ys = self.data.get("train", starts[rows])
            loss_sum = None
            for m in range(micro_steps):
                # Gradients are all-reduced only after the last micro-step (DDP).
                with no_sync() if m < micro_steps - 1 else nullcontext():
                    with autocast:
                        _, loss = train_model(xs[m], ys[m])
                    if micro_steps > 1:
                        loss = loss / micro_steps
                    if it == self.inject_nan_at:
                        loss = loss * float("nan")
                    if scaler is None:
                        loss.backward()
                    else:
                        scaler.scale(loss).backward()
                loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            if scaler is not None:
                if cfg.grad_clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
            else:
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.window.append(loss_sum)
            self.window_lrs.append(lr)
            if it % cfg.log_interval == 0:
                self._flush(it, log=True)
            it += 1
        self.iter_num = it
        if self.stop_reason is None:
            self.stop_reason = "eval_only" if cfg.eval_only else "max_iters"

    # ---- reporting ----

    def _describe(self) -> None:
        cfg = self.cfg
        n_params = self.raw_model.get_num_params()
        where = f"resuming {self.ckpt_path} at iteration {self.iter_num}" if self.resumed else "from scratch"
        self.log(
            f"training {where}: norm={cfg.norm}, {n_params / 1e6:.2f}M parameters, device={self.device}, "
            f"dtype={self.dtype}, compile={cfg.compile}, processes={self.dist.world_size}"
        )
        self.log(
            f"data {self.data.dir}: {self.data.tokens['train']:,} train / {self.data.tokens['val']:,} val tokens, "
            f"vocab {self.data.vocab_size}; {self.tokens_per_iter:,} tokens per iteration"
        )

    def _summary(self) -> dict[str, Any]:
        timed = self.ms_per_iter[1:] if len(self.ms_per_iter) > 1 else self.ms_per_iter  # the first holds startup
        median_ms = statistics.median(timed) if timed else None
        return {
            "kind": "summary",
            "iters": self.iter_num,
            "final_val_loss": self.last_val,
            "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "median_ms_per_iter": median_ms,
            "median_tokens_per_s": self.tokens_per_iter / (median_ms / 1000) if median_ms else None,
            "wall_s": time.perf_counter() - self.t_start,
            "norm": self.cfg.norm,
            "device": self.device,
            "dtype": self.dtype,
            "compile": self.cfg.compile,
            "world_size": self.dist.world_size,
            "n_params": self.raw_model.get_num_params(),
            "stop_reason": self.stop_reason,
        }

    def _sample_tokenizer(self) -> Any:
        """The dataset's tokenizer for the final sample; None (with a note) if it cannot be built here."""
        from tokenizer import tokenizer_from_meta  # only here: training itself never needs tiktoken

        try:
            return tokenizer_from_meta(self.data.meta["tokenizer"])
        except (KeyError, TypeError, ValueError, ImportError, RuntimeError) as e:
            self.log(f"note: no sample at the end, the dataset's tokenizer cannot be built here ({e})")
            return None

    @torch.no_grad()
    def _sample(self, tok: Any) -> None:
        try:
            start = tok.encode("\n")
        except ValueError:
            start = [0]
        gen = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        self.raw_model.eval()
        with self.autocast:
            out = self.raw_model.generate(
                torch.tensor([start], device=self.device), self.cfg.sample_tokens,
                temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, generator=gen,
            )
        self.raw_model.train()
        print(f"--- sample ({self.cfg.sample_tokens} tokens, temperature {SAMPLE_TEMPERATURE}) ---")
        print(tok.decode(out[0].tolist()), flush=True)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _build(make: Any, norm: str) -> GPT:
    """Build the model; a norm that cannot be built here (e.g. triton without a GPU) -> ConfigError."""
    try:
        return make()
    except (ImportError, NotImplementedError) as e:
        raise ConfigError(f"norm={norm!r} cannot be used here: {e}") from None


def import_wandb() -> Any:
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(
            f"wandb_log=True but wandb cannot be imported ({e}): `pip install wandb`, or drop --wandb_log"
        ) from None
    return wandb


def check_resumable(ckpt: dict[str, Any], explicit: dict[str, Any], data: Data, path: Path) -> None:
    """The model asked for must be the checkpoint's: same shape, same vocabulary; else TrainError naming the keys.

    Only options given explicitly (config file or flags) are compared; the others come from the checkpoint.
    """
    saved = ckpt["model_args"]
    wanted = {k: explicit[k] for k in MODEL_SHAPE_KEYS if k in explicit}
    wanted["vocab_size"] = data.vocab_size
    if "norm" in explicit and explicit["norm"] != saved.get("norm"):
        if not (explicit["norm"] in INTERCHANGEABLE_NORMS and saved.get("norm") in INTERCHANGEABLE_NORMS):
            wanted["norm"] = explicit["norm"]
    diffs = config_mismatch(saved, wanted)
    tok = ckpt.get("tokenizer")
    if tok is not None and data.meta.get("tokenizer") is not None and tok != data.meta["tokenizer"]:
        diffs.append("tokenizer: the dataset's vocabulary is not the checkpoint's")
    if diffs:
        raise TrainError(
            f"cannot resume from {path}: it does not match what was asked for (checkpoint -> asked): "
            f"{'; '.join(diffs)}. Drop those options (or use the dataset it was trained on) to resume it, "
            f"or give another --out_dir to start a new run"
        )


def load_resume_checkpoint(out_dir: str) -> dict[str, Any]:
    ckpt = load_checkpoint(Path(out_dir) / "ckpt.pt", map_location="cpu")
    missing = [k for k in ("model", "model_args", "optimizer", "iter_num", "best_val_loss", "config", "rng")
               if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{Path(out_dir) / 'ckpt.pt'} cannot be resumed: it has no {', '.join(missing)} "
            f"(it was not written by train.py, or by an older version)"
        )
    return ckpt


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train as the command line `argv` asks; return the summary record.

    Raises ConfigError (bad option), TrainError (data, resume mismatch, divergence, interruption) or
    checkpoint.CheckpointError, each with a one-line message; `cli()` turns them into exit statuses.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    config_file, explicit = parse_args(argv)
    cfg = build_config(explicit)
    ckpt = None
    if cfg.init_from == "resume":
        ckpt = load_resume_checkpoint(cfg.out_dir)
        # The checkpoint's options are the defaults; what was given explicitly wins.
        cfg = build_config(explicit, ckpt.get("config"), source=f"{cfg.out_dir}/ckpt.pt")
    dist = dist_from_env()
    steps = cfg.gradient_accumulation_steps
    if dist.enabled and steps % dist.world_size:
        raise ConfigError(
            f"gradient_accumulation_steps={steps} is the global number of micro-batches and must be divisible by "
            f"the number of processes ({dist.world_size}); e.g. "
            f"--gradient_accumulation_steps={dist.world_size * max(1, steps // dist.world_size)}"
        )
    if dist.enabled:
        import torch.distributed as tdist

        device = resolve_device(cfg.device, dist)
        tdist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    try:
        return Trainer(cfg, explicit, dist, ckpt).run()
    finally:
        if dist.enabled:
            import torch.distributed as tdist

            tdist.destroy_process_group()


def cli(argv: Sequence[str] | None = None) -> int:
    """main() with every expected failure as one line on stderr and an exit status (no traceback)."""
    master = dist_from_env().master
    try:
        main(argv)
    except Interrupted as e:
        if master:
            print(str(e), file=sys.stderr)
        return e.exit_code
    except (TrainError, CheckpointError) as e:
        if master:
            print(f"error: {e}", file=sys.stderr)
        return e.exit_code if isinstance(e, TrainError) else 1
    except KeyboardInterrupt:
        print("\ninterrupted: quit without saving", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
