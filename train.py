"""Train a GPT on a prepared dataset: one process, or several with torchrun.

    python train.py [configs/NAME.json] [--key=value ...]        (--help lists the options: options.py)
    python train.py configs/shakespeare_char_cpu.json --norm=custom
    python train.py --init_from=resume --out_dir=DIR --max_iters=3000   (the checkpoint's options are the defaults)
    torchrun --standalone --nproc_per_node=2 train.py configs/shakespeare_char.json --gradient_accumulation_steps=2

The loop is nanoGPT's: AdamW, linear warmup then cosine decay to min_lr, gradient clipping, gradient accumulation,
an estimate of train and val loss every eval_interval iterations, a checkpoint after it. What differs:
- A resumed run continues exactly the run it was cut from: batches come from a generator of their own, whose
  state (the position in the data stream) is checkpointed with every process's RNG state. One process or N
  processes see the same data, and evaluation never disturbs the stream.
- The hot loop reads nothing back from the device: the losses are read (one sync) at the next log line or
  checkpoint, and a NaN or inf among them stops the run before it can reach a checkpoint.
- Ctrl-C (SIGINT) or SIGTERM saves a checkpoint after the current iteration and exits with 130 (143); with several
  processes, every one of them stops at that same iteration. A second Ctrl-C quits at once. Other exit statuses:
  0 done, 1 a data, checkpoint or divergence error, 2 a bad option. Every error is one line on stderr
  ("error: ..."), never a traceback.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import checkpoint
import runlog
from data.common import DataError, PreparedData
from device import DeviceError, Dist, StopRequest, autocast, dist_from_env, resolve_device, resolve_dtype
from layernorm import TritonUnavailableError, check_triton_device
from model import GPT, GPTConfig
from options import MODEL_KEYS, ConfigError, TrainConfig, build_config, parse_args

EVAL_SEED_OFFSET = 1_000_003  # the eval generator's seed is seed + this: a stream unrelated to the training one
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 200
OPTION_ERRORS = (ConfigError, DeviceError, TritonUnavailableError)  # exit status 2; the others exit with 1


class TrainError(Exception):
    """Training stopped: a loss or a weight became NaN or inf (the message says what to do)."""


class Interrupted(TrainError):
    """SIGINT/SIGTERM: a checkpoint was saved (the message says where and how to resume)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum

    @classmethod
    def at(cls, it: int, path: Path, ckpt_path: Path, stop: StopRequest) -> Interrupted:
        """Saved at `path` after `it` iterations: the message says how to go on (ckpt_path is where resume reads)."""
        resume = f"python train.py --init_from=resume --out_dir={ckpt_path.parent}"
        resume = resume if path == ckpt_path else f"mv {path} {ckpt_path} && {resume}"
        return cls(
            f"interrupted ({stop.name}) after {it} iterations; saved {path}. To continue the run: {resume}",
            stop.signum or signal.SIGINT,
        )


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


@torch.no_grad()
def estimate_loss(
    model: GPT, data: PreparedData, cfg: TrainConfig, dist: Dist, device: str, autocast: Any
) -> dict[str, float]:
    """Mean loss over eval_iters batches of each split: the same batches at every call, from a generator of their
    own, so that evaluating never moves the training data stream."""
    gen = torch.Generator().manual_seed(cfg.seed + EVAL_SEED_OFFSET)
    model.eval()
    sums = []
    for split in ("train", "val"):
        starts = torch.randint(data.num_starts(split), (cfg.eval_iters, cfg.batch_size), generator=gen)
        total = torch.zeros((), device=device)
        for rows in starts[dist.rank :: dist.world_size]:  # each process evaluates its share
            x, y = data.get(split, rows, device)
            with autocast:
                _, loss = model(x, y)
            total += loss.float()
        sums.append(total)
    model.train()
    train_loss, val_loss = (dist.all_reduce(torch.stack(sums)) / cfg.eval_iters).tolist()
    return {"train": train_loss, "val": val_loss}


@torch.no_grad()
def print_sample(model: GPT, data: PreparedData, cfg: TrainConfig, device: str, autocast: Any) -> None:
    """Print a sample of the final model, if the dataset's tokenizer can be built here (else a note)."""
    try:
        tok = data.tokenizer()
    except DataError as e:
        print(f"note: no sample at the end, {e}")
        return
    try:
        start = tok.encode("\n")
    except ValueError:  # a vocabulary without a newline
        start = [0]
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    model.eval()
    with autocast:
        out = model.generate(
            torch.tensor([start], device=device),
            cfg.sample_tokens,
            temperature=SAMPLE_TEMPERATURE,
            top_k=SAMPLE_TOP_K,
            generator=gen,
        )
    print(f"--- sample ({cfg.sample_tokens} tokens, temperature {SAMPLE_TEMPERATURE}) ---")
    print(tok.decode(out[0].tolist()), flush=True)


# ---- set-up: each function returns plain values ----


def setup(
    cfg: TrainConfig, explicit: dict[str, Any], ckpt: dict[str, Any] | None, device: str, dtype: str, dist: Dist
) -> tuple[PreparedData, GPT, torch.optim.Optimizer, torch.amp.GradScaler, torch.Generator, int, float]:
    """The data; the model (new, with the same initial weights on every process, or the checkpoint's), its
    optimizer and loss scaler; the data stream's own generator; the iteration and best val loss to start from."""
    data = PreparedData(cfg.data_dir, cfg.dataset, cfg.block_size)
    path = Path(cfg.out_dir) / "ckpt.pt"
    data_gen = checkpoint.seed_rngs(cfg.seed, dist.rank)
    if ckpt is not None:
        raw_model = checkpoint.resume_model(
            ckpt, explicit, cfg.norm, cfg.dropout, data.vocab_size, data.meta.get("tokenizer"), path, device
        )
    else:
        torch.manual_seed(cfg.seed)
        raw_model = GPT(GPTConfig(**{k: getattr(cfg, k) for k in MODEL_KEYS}, vocab_size=data.vocab_size)).to(device)
        torch.manual_seed(cfg.seed + dist.rank)  # dropout: one stream per process
    optimizer = raw_model.configure_optimizers(
        cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device.split(":")[0]
    )
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")  # loss scaling for float16
    it = 0
    best_val = math.inf
    if ckpt is not None:
        it, best_val = checkpoint.restore_training_state(ckpt, optimizer, scaler, data_gen, path, dist)
    return data, raw_model, optimizer, scaler, data_gen, it, best_val


class LossOnly(torch.nn.Module):
    """The model returning its loss alone: what the graphed micro-step returns. Every output of a graphed callable
    that requires grad gets a gradient copied into the graph at each replay: for logits, a zero-filled [B, T, V]."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(idx, targets)[1]


def wrap(
    raw_model: GPT, cfg: TrainConfig, data: PreparedData, device: str, dtype: str, dist: Dist
) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """The model that evaluates (compiled, if asked) and the one that trains: the same, in DDP with several
    processes, with its micro-step (forward and backward) captured once in a CUDA graph and replayed, if asked."""
    model = torch.compile(raw_model, mode=cfg.compile_mode) if cfg.compile else raw_model
    train_model = dist.wrap(model, device)
    if cfg.cuda_graphs:  # static shapes: every micro-batch is [batch_size, block_size]
        with autocast(device, dtype, cache_enabled=False):  # (the casts are captured into the graph)
            sample = data.get("train", torch.zeros(cfg.batch_size, dtype=torch.long), device)
            graphed = torch.cuda.make_graphed_callables(LossOnly(train_model), sample)
        train_model = lambda idx, targets: (None, graphed(idx, targets))  # (logits, loss), as the loop unpacks
        for p in raw_model.parameters():  # .grad buffers of our own, added into: a replay rewrites the graph's
            p.grad = torch.zeros_like(p)  # gradient outputs, which must never become .grad (pytorch#181723)
    return model, train_model


def diverged(what: str, last_saved: int | None, ckpt_path: Path) -> TrainError:
    kept = (
        f"the last good checkpoint, {ckpt_path} (iteration {last_saved}), was kept"
        if last_saved is not None
        else "no checkpoint had been written by this run"
    )
    return TrainError(
        f"{what}: training stopped; {kept}. To go on from it, resume (--init_from=resume) "
        f"with a lower --learning_rate or a longer --warmup_iters"
    )


def train(
    cfg: TrainConfig, explicit: dict[str, Any], device: str, dtype: str, ckpt: dict[str, Any] | None, dist: Dist
) -> dict[str, Any]:
    """Set up, then the loop: evaluate and checkpoint, set the learning rate, run the micro-steps, clip and step,
    log. Returns the summary record."""
    t_start = time.perf_counter()
    ckpt_path = Path(cfg.out_dir) / "ckpt.pt"
    data, raw_model, optimizer, scaler, data_gen, it, best_val = setup(cfg, explicit, ckpt, device, dtype, dist)
    model, train_model = wrap(raw_model, cfg, data, device, dtype, dist)
    start = it
    last_saved = it if ckpt else None
    last_val = None
    stop_reason = None
    amp = autocast(device, dtype)
    micro_steps = cfg.gradient_accumulation_steps // dist.world_size  # this process's share
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size

    def save(it: int, path: Path) -> None:
        if not all(bool(torch.isfinite(t).all()) for t in raw_model.state_dict().values() if t.is_floating_point()):
            raise diverged(f"the weights are not finite at iteration {it}", last_saved, ckpt_path)
        checkpoint.save_training_checkpoint(
            path,
            dist,
            model=raw_model,
            optimizer=optimizer,
            scaler=scaler,
            iter_num=it,
            best_val_loss=best_val,
            config=asdict(cfg),
            tokenizer=data.meta.get("tokenizer"),
            data_gen=data_gen,
        )

    def read_back() -> list[tuple[int, float, float]]:  # and stop if a loss is not finite
        read = window.read()
        for i, loss, _ in read:
            if not math.isfinite(loss):
                raise diverged(f"loss is {loss} at iteration {i}", last_saved, ckpt_path)
        return read

    where = f"resuming {ckpt_path} at iteration {it}" if ckpt else "from scratch"
    dist.print(
        f"training {where}: norm={cfg.norm}, {cfg.norm_position}-norm, "
        f"{raw_model.get_num_params() / 1e6:.2f}M parameters, device={device}, dtype={dtype}, compile={cfg.compile}, "
        f"processes={dist.world_size}"
    )
    dist.print(f"{data.describe()}; {tokens_per_iter:,} tokens per iteration")
    if cfg.decay_lr and cfg.lr_decay_iters > cfg.max_iters:
        dist.print(
            f"note: lr_decay_iters={cfg.lr_decay_iters} is past max_iters={cfg.max_iters}, so the learning rate ends "
            f"at {get_lr(cfg.max_iters - 1, cfg):.2e}, not min_lr={cfg.min_lr:.2e}; "
            f"--lr_decay_iters={cfg.max_iters} decays it fully"
        )
    rows = slice(dist.rank * micro_steps, (dist.rank + 1) * micro_steps)  # this process's micro-batches
    no_sync = train_model.no_sync if dist.enabled else contextlib.nullcontext
    with (
        runlog.open_log(cfg, dist, start if ckpt else None) as log,
        StopRequest(announce=dist.master) as stop,
        contextlib.closing(data),
    ):
        window = runlog.LossWindow(dist)
        while True:
            stop_reason = stop_reason or stop.agreed(
                dist, cfg.max_wall_s is not None and time.perf_counter() - t_start > cfg.max_wall_s
            )
            end = it >= cfg.max_iters or stop_reason == "max_wall_s" or cfg.eval_only
            # Evaluate (and maybe checkpoint); a resumed run was evaluated just before its checkpoint.
            if (it % cfg.eval_interval == 0 or end) and not (ckpt and it == start and not end):
                t0 = time.perf_counter()
                read_back()  # never evaluate or save weights that a NaN went through
                losses = estimate_loss(model, data, cfg, dist, device, amp)
                dist.print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                log(
                    {"kind": "eval", "iter": it, "train_loss": losses["train"], "val_loss": losses["val"]},
                    wandb={"eval/train_loss": losses["train"], "val/loss": losses["val"]},
                )
                if not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
                    raise diverged(
                        f"the estimated loss is not finite at iteration {it} ({losses})", last_saved, ckpt_path
                    )
                last_val = losses["val"]
                improved = last_val < best_val
                best_val = min(best_val, last_val)
                if it > start and not cfg.eval_only and (improved or cfg.always_save_checkpoint):
                    save(it, ckpt_path)
                    last_saved = it
                    dist.print(f"saved checkpoint {ckpt_path}")
                window.paused_s += time.perf_counter() - t0
            if end:
                break
            if stop_reason == "signal":
                read_back()
                # In best-only mode ckpt.pt is the best model so far; the interrupted state goes beside it.
                path = ckpt_path if cfg.always_save_checkpoint else ckpt_path.parent / "ckpt_interrupted.pt"
                save(it, path)
                raise Interrupted.at(it, path, ckpt_path, stop)

            lr = get_lr(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            # The whole global batch's offsets (so any number of processes sees the same data); then ours.
            starts = torch.randint(
                data.num_starts("train"), (cfg.gradient_accumulation_steps, cfg.batch_size), generator=data_gen
            )
            xs, ys = data.get("train", starts[rows], device)
            loss_sum = 0.0
            for m in range(micro_steps):
                # Gradients are all-reduced only after the last micro-step (DDP).
                with no_sync() if m < micro_steps - 1 else contextlib.nullcontext():
                    with amp:
                        _, loss = train_model(xs[m], ys[m])
                    loss = loss / micro_steps
                    scaler.scale(loss).backward()
                loss_sum = loss_sum + loss.detach()
            if cfg.grad_clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=not cfg.cuda_graphs)
            window.pending.append((it, loss_sum, lr))
            if it % cfg.log_interval == 0:
                window.log_line(read_back()[-1], tokens_per_iter, log)
            it += 1
        facts = {
            "norm": cfg.norm,
            "device": device,
            "dtype": dtype,
            "compile": cfg.compile,
            "cuda_graphs": cfg.cuda_graphs,
            "world_size": dist.world_size,
            "n_params": raw_model.get_num_params(),
        }
        summary = runlog.summarize(
            it,
            window.ms_per_iter,
            last_val,
            best_val,
            tokens_per_iter,
            t_start,
            facts,
            "eval_only" if cfg.eval_only else stop_reason or "max_iters",
        )
        log(summary)
        if cfg.sample_at_end and dist.master and not cfg.eval_only:
            print_sample(raw_model, data, cfg, device, amp)
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train as the command line `argv` asks; return the summary record.

    Raises one of OPTION_ERRORS (a bad option), or DataError, CheckpointError or TrainError (data, resume
    mismatch, divergence, interruption), each with a one-line message; `cli()` turns them into exit statuses.
    """
    explicit = parse_args(sys.argv[1:] if argv is None else list(argv))
    dist = dist_from_env()
    cfg = build_config(explicit, processes=dist.world_size)
    ckpt = None
    if cfg.init_from == "resume":
        ckpt = checkpoint.load_resume_checkpoint(cfg.out_dir)
        # The checkpoint's options are the defaults; what was given explicitly wins.
        cfg = build_config(explicit, ckpt["config"], source=f"{cfg.out_dir}/ckpt.pt", processes=dist.world_size)
    device = resolve_device(cfg.device, dist)
    dtype = resolve_dtype(cfg.dtype, device.split(":")[0])
    if cfg.norm == "triton":
        check_triton_device(device)  # before any data or model is loaded
    if cfg.cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"cuda_graphs=True needs a CUDA device, got device={device!r}: drop --cuda_graphs")
    checkpoint.make_out_dir(cfg.out_dir, new_run=cfg.init_from == "scratch" and not cfg.overwrite)
    with dist.use(device):
        return train(cfg, explicit, device, dtype, ckpt, dist)


def cli(argv: Sequence[str] | None = None) -> int:
    """main() with every expected failure as one line on stderr and an exit status (no traceback)."""
    dist = dist_from_env()
    try:
        main(argv)
    except Interrupted as e:
        dist.print(e, file=sys.stderr)
        return 128 + e.signum
    except (*OPTION_ERRORS, DataError, checkpoint.CheckpointError, TrainError) as e:
        dist.print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, OPTION_ERRORS) else 1
    except KeyboardInterrupt:
        print("\ninterrupted: quit without saving", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
