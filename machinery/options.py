"""train.py's options: one dataclass (each option's default and meaning), a JSON config file that sets some of
them, and `--key=value` flags that override both. Every bad value is one BadOption line naming the option (a
ConfigError; argparse's own, through machinery.command, for a flag it cannot read)."""

from __future__ import annotations

import difflib
import json
import math
import typing
from argparse import SUPPRESS, ArgumentTypeError
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import layernorm
from machinery.command import ArgumentParser, BadOption, first_line
from machinery.device import DEVICE_HELP
from model import GPT2_SIZES, GPTConfig, is_hub_id


class ConfigError(BadOption, ValueError):
    """A bad option: unknown, of the wrong type, out of range, or impossible on this machine (exit status 2)."""


VALID_NORMS = (*layernorm.NORMS, layernorm.NO_NORM)  # and "none": no normalization, the comparison's baseline
# What torch.manual_seed takes is below 2**64; train.py adds the rank and an offset for the eval batches to it.
SEEDS = range(2**63)


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
        "scratch", "scratch: a new model; resume: go on from <out_dir>/ckpt.pt; gpt2 ... gpt2-xl or a folder: GPT-2's"
    )
    resume_from: str | None = opt(None, "init_from=resume goes on from this checkpoint file (None: <out_dir>/ckpt.pt)")
    overwrite: bool = opt(False, "a new run (init_from=scratch) may replace the checkpoint already in out_dir")
    eval_interval: int = opt(250, "estimate train/val loss (and maybe checkpoint) every this many iterations")
    log_interval: int = opt(10, "print a log line and a metrics record every this many iterations")
    eval_iters: int = opt(200, "batches per split in each loss estimate")
    eval_only: bool = opt(False, "estimate the losses once and exit (no training)")
    always_save_checkpoint: bool = opt(True, "checkpoint after every evaluation; False: only when val loss improves")
    save_checkpoint: bool = opt(True, "False: write no checkpoint at all (a timing run: metrics.jsonl has its figures)")
    # data
    batch_size: int = opt(12, "sequences per micro-batch (per process)")
    block_size: int = opt(64, "context length in tokens")
    gradient_accumulation_steps: int = opt(1, "micro-batches per step, over all processes (divisible by their number)")
    # model
    n_layer: int = opt(4, "transformer blocks")
    n_head: int = opt(4, "attention heads per block")
    n_embd: int = opt(128, "model width (divisible by n_head)")
    dropout: float = opt(0.0, "dropout probability, in [0, 1)")
    bias: bool = opt(True, "bias in the Linear layers and the norms")
    norm: str = opt("builtin", "normalization layer: a name from layernorm.NORMS, or none", VALID_NORMS)
    norm_position: str = opt(
        "pre", "pre: x + f(norm(x)), as GPT-2; post: norm(x + f(x)), as the original Transformer", ("pre", "post")
    )
    norm_alpha: float | None = opt(None, "DyT's starting alpha; None: its recipe by width (layernorm.DyT)")
    embed_scale: bool | None = opt(None, "embeddings times a learned scalar from sqrt(n_embd); None: on with dyt only")
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
    device: str = opt("auto", DEVICE_HELP)
    dtype: str = opt(
        "auto",
        "auto: bfloat16 autocast on CUDA where supported, else float32; float16 uses a GradScaler",
        ("auto", "float32", "bfloat16", "float16"),
    )
    compile: bool = opt(False, "wrap the model in torch.compile")
    compile_mode: str = opt("default", "torch.compile's mode", ("default", "reduce-overhead", "max-autotune"))
    cuda_graphs: bool = opt(
        False,
        "capture the micro-step in a CUDA graph, replay it (CUDA, one process; not with compile: use compile_mode="
        "reduce-overhead)",
    )
    seed: int = opt(1337, "seeds the weights, dropout, the data stream and the eval batches")
    max_wall_s: float | None = opt(None, "stop (evaluate, checkpoint) once training has run this many seconds")
    # logging and sampling
    wandb_log: bool = opt(False, "log to Weights & Biases (needs `pip install wandb`; WANDB_MODE=offline works)")
    wandb_project: str = opt("layernorm-gpt", "wandb project")
    wandb_run_name: str | None = opt(None, "wandb run name (None: <dataset>-<norm>-<time>)")
    sample_at_end: bool = opt(True, "print a sample from the final model when training ends")
    sample_tokens: int = opt(300, "tokens in that sample")


# Each option's type and whether it may be None: int, (float, optional), ...
HINTS = typing.get_type_hints(TrainConfig)
TYPES = {k: next(a for a in (*typing.get_args(t), t) if a is not type(None)) for k, t in HINTS.items()}
OPTIONAL = {k for k, t in HINTS.items() if type(None) in typing.get_args(t)}
BOOLS = {"true": True, "1": True, "false": False, "0": False}  # what a bool option's flag may say
# Each option's own rule, where GPTConfig does not check it (it checks the model's sizes and dropout itself): name ->
# (test, rule). A float from a flag ("inf", "1e309") or a config (Infinity) may be infinite or NaN: `not test` refuses
# both, but for the two options where inf means no limit.
RULES = {
    **dict.fromkeys(
        ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "eval_iters", "lr_decay_iters"),
        (lambda v: v >= 1, "a positive integer"),
    ),
    **dict.fromkeys(
        ("max_iters", "warmup_iters", "sample_tokens", "weight_decay", "min_lr"),
        (lambda v: 0 <= v < math.inf, "finite and >= 0"),
    ),
    "grad_clip": (lambda v: v >= 0, ">= 0 (inf: no clipping)"),
    "learning_rate": (lambda v: 0 < v < math.inf, "finite and > 0"),
    "seed": (lambda v: v in SEEDS, "an integer in [0, 2**63)"),
    "max_wall_s": (lambda v: v is None or v > 0, "> 0 (inf: no limit) or None"),
    **dict.fromkeys(("beta1", "beta2"), (lambda v: 0 <= v < 1, "in [0, 1)")),
    "norm_alpha": (lambda v: v is None or 0 < v < math.inf, "finite and > 0, or None"),
    **dict.fromkeys(("dataset", "out_dir"), (lambda v: v != "", "a name, not empty")),
    "init_from": (
        lambda v: v in ("scratch", "resume") or is_hub_id(v) or Path(v).is_dir(),
        f"scratch, resume, a hub id ({', '.join(GPT2_SIZES)}, owner/name) or a folder holding a Hugging Face GPT-2 "
        f"(config.json and its weights)",
    ),
}


def _did_you_mean(word: str, names: list[str] | tuple[str, ...], form: str) -> str:
    close = difflib.get_close_matches(word, names, n=1)
    return form.format(close[0]) if close else ""


def _typed(key: str, value: Any, source: str) -> Any:
    """A value from a JSON `source` (a config file, a checkpoint's options) as the option's type; else ConfigError."""
    if key not in TYPES:
        raise ConfigError(
            f"unknown option {key!r} (in {source}).{_did_you_mean(key, list(TYPES), ' Did you mean {!r}?')}"
            f" Valid options: {', '.join(TYPES)}"
        )
    base = TYPES[key]
    if (value is None and key in OPTIONAL) or (isinstance(value, base) and isinstance(value, bool) == (base is bool)):
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):  # an int is a fine float
        return float(value)
    raise ConfigError(f"{key}={value!r} in {source}: expected {type_name(key)}, got {type(value).__name__}")


def type_name(key: str) -> str:
    return TYPES[key].__name__ + (" or None" if key in OPTIONAL else "")


def from_text(key: str) -> Callable[[str], Any]:
    """--key's text as the option's type (argparse's `type`): true/false/1/0 for a bool, None for an optional one."""
    expected = "bool (true/false/1/0)" if TYPES[key] is bool else type_name(key)

    def convert(text: str) -> Any:
        try:
            if key in OPTIONAL and text in ("None", "none", "null"):
                return None
            return BOOLS[text.lower()] if TYPES[key] is bool else TYPES[key](text)
        except (KeyError, ValueError):
            raise ArgumentTypeError(f"expected {expected}, got {text!r}") from None

    return convert


def spelt_out(arg: str) -> str:
    """A flag as the parser reads it: --data-dir=x as --data_dir=x (the value as it is), a bare --flag of a bool
    option as --flag=true."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg[2:].partition("=")
    key = key.replace("-", "_")
    return f"--{key}{eq}{value}" if eq or TYPES.get(key) is not bool else f"--{key}=true"


def parse_args(argv: list[str]) -> dict[str, Any]:
    """argv -> {key: typed value} from the config file (if one is given), then the flags; a BadOption if one is
    bad. `--help` prints the options and raises SystemExit(0)."""
    p = ArgumentParser(
        prog="train.py",
        usage="python train.py [CONFIG.json] [--key=value ...]",
        description="Train a GPT. A JSON config file sets some options, --key=value flags override it; the rest keep "
        "their defaults. With --init_from=resume the checkpoint's saved options are the defaults.",
        allow_abbrev=False,
    )
    p.add_argument("config", nargs="?", help="a JSON file of options, such as configs/shakespeare_char.json")
    for f in fields(TrainConfig):
        choices = f" [{'|'.join(f.metadata['choices'])}]" if f.metadata["choices"] else ""
        p.add_argument(
            f"--{f.name}",
            type=from_text(f.name),
            default=SUPPRESS,  # only the options given
            metavar=type_name(f.name),
            help=f"{f.metadata['help']}{choices} (default: {f.default})",
        )
    args, unknown = p.parse_known_args([spelt_out(arg) for arg in argv])
    if unknown:  # an option of another name, or a second config file
        hint = _did_you_mean(unknown[0].lstrip("-").partition("=")[0], list(TYPES), " (did you mean --{}?)")
        raise ConfigError(
            f"unknown argument {unknown[0]!r}{hint}: train.py takes one config file and --key=value options "
            f"(--help lists them)"
        )
    from_flags = vars(args)
    config_file = from_flags.pop("config")
    return {**(read_config_file(config_file) if config_file else {}), **from_flags}


def read_config_file(path: str) -> dict[str, Any]:
    """A JSON object of options -> {key: typed value}; ConfigError says what is wrong with it."""
    if not Path(path).is_file():
        what = "is a folder, not a file" if Path(path).is_dir() else "not found"
        raise ConfigError(f"config file {path!r} {what} (config files are JSON, e.g. configs/shakespeare_char.json)")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested thousands deep
        raise ConfigError(f"config file {path} is not a flat JSON object of options ({first_line(e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object of options, not {type(data).__name__}")
    return {key: _typed(key, value, path) for key, value in data.items()}


def build_config(
    explicit: dict[str, Any], base: dict[str, Any] | None = None, source: str = "", processes: int = 1
) -> TrainConfig:
    """TrainConfig from `base` (defaults when None; a checkpoint's saved options on resume) updated by `explicit`,
    checked for a run of that many processes: the checks GPTConfig does not make, then GPTConfig's own."""
    # (resume_from, where this resume reads from, is never a saved run's default)
    known = {k: _typed(k, v, source) for k, v in (base or {}).items() if k in TYPES and k != "resume_from"}
    if "dataset" in explicit and "data_dir" not in explicit:  # --dataset names data/<dataset>/, over a saved data_dir
        known.pop("data_dir", None)
    cfg = replace(TrainConfig(), **{**known, **explicit})
    if cfg.embed_scale is None:  # DyT's recipe scales the embeddings (layernorm.DyT); the other norms run without
        cfg = replace(cfg, embed_scale=cfg.norm == "dyt")
    for name, (ok, rule) in RULES.items():
        if not ok(getattr(cfg, name)):  # `not ok` also catches NaN
            raise ConfigError(f"{name} must be {rule}, got {getattr(cfg, name)!r}")
    steps = cfg.gradient_accumulation_steps
    if steps % processes:
        raise ConfigError(
            f"gradient_accumulation_steps={steps} is the global number of micro-batches and must be "
            f"divisible by the number of processes ({processes}); e.g. "
            f"--gradient_accumulation_steps={processes * max(1, steps // processes)}"
        )
    if cfg.cuda_graphs and cfg.compile:
        raise ConfigError(
            "cuda_graphs=True cannot run with compile=True: use --compile_mode=reduce-overhead, which "
            "captures CUDA graphs itself, or drop one of them"
        )
    if cfg.cuda_graphs and processes > 1:
        raise ConfigError(f"cuda_graphs=True runs one process, not {processes}: drop --cuda_graphs or run one process")
    if cfg.compile_mode != "default" and not cfg.compile:
        raise ConfigError(f"compile_mode={cfg.compile_mode!r} needs compile=True: add --compile=True")
    if cfg.decay_lr and cfg.lr_decay_iters <= cfg.warmup_iters:
        raise ConfigError(
            f"lr_decay_iters ({cfg.lr_decay_iters}) must be greater than warmup_iters "
            f"({cfg.warmup_iters}) when decay_lr=True"
        )
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        choices = f.metadata["choices"]
        if choices and value not in choices:
            hint = _did_you_mean(value, choices, " (did you mean {!r}?)")
            raise ConfigError(
                f"{f.name}={value!r} is not {'a norm' if f.name == 'norm' else 'valid'}{hint}; "
                f"choose one of {', '.join(choices)}"
            )
    if cfg.eval_only and cfg.init_from == "scratch":  # random weights: nothing worth a record in out_dir
        raise ConfigError("eval_only=True evaluates a trained model: add --init_from=resume (or GPT-2's --init_from)")
    if cfg.resume_from is not None and cfg.init_from != "resume":
        raise ConfigError(f"resume_from={cfg.resume_from!r} needs init_from=resume: add --init_from=resume")
    if cfg.wandb_log:  # only then: a run without it never imports wandb
        try:
            import wandb  # noqa: F401
        except ImportError as e:
            raise ConfigError(
                f"wandb_log=True but wandb cannot be imported ({e}): `pip install wandb`, or drop --wandb_log"
            ) from None
    try:  # the model's own checks: sizes, n_embd divisible by n_head, dropout in [0, 1)
        GPTConfig.from_options(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg
