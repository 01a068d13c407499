"""Train a GPT on a prepared dataset: one process, or several with torchrun.

    python train.py [configs/NAME.json] [--key=value ...]        (--help lists the options: options.py)
    python train.py configs/shakespeare_char_cpu.json --norm=custom
    python train.py --init_from=resume --out_dir=DIR --max_iters=3000   (the checkpoint's options are the defaults)
    torchrun --standalone --nproc_per_node=4 train.py configs/shakespeare_char.json

The loop is nanoGPT's: AdamW, linear warmup then cosine decay to min_lr, gradient clipping, gradient accumulation,
an estimate of train and val loss every eval_interval iterations, a checkpoint after it. What differs:
- A resumed run continues exactly the run it was cut from: batches come from a generator of their own, whose
  state (the position in the data stream) is checkpointed with every other RNG state. One process or N processes
  see the same data, and evaluation never disturbs the stream.
- The hot loop reads nothing back from the device: the losses are read (one sync) at the next log line or
  checkpoint, and a NaN or inf among them stops the run before it can reach a checkpoint (`_read_back`).
- Ctrl-C (SIGINT) or SIGTERM saves a checkpoint after the current iteration and exits with 130 (143); a second
  Ctrl-C quits at once. Other exit statuses: 0 done, 1 a data, checkpoint or divergence error, 2 a bad option.
  Every error is one line on stderr ("error: ..."), never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import checkpoint
from data.common import DataError, PreparedData
from device import DeviceError, Dist, StopRequest, autocast, dist_from_env, peak_memory, resolve_device, resolve_dtype
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
def estimate_loss(model: GPT, data: PreparedData, cfg: TrainConfig, dist: Dist, device: str,
                  autocast: Any) -> dict[str, float]:
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
        out = model.generate(torch.tensor([start], device=device), cfg.sample_tokens,
                             temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, generator=gen)
    print(f"--- sample ({cfg.sample_tokens} tokens, temperature {SAMPLE_TEMPERATURE}) ---")
    print(tok.decode(out[0].tolist()), flush=True)


class Trainer:
    """One training run: the constructor sets it up, `run()` trains and returns the summary record."""

    def __init__(self, cfg: TrainConfig, explicit: dict[str, Any], device: str, dtype: str,
                 ckpt: dict[str, Any] | None) -> None:
        self.t_start = time.perf_counter()
        self.cfg, self.device, self.dtype, self.resumed = cfg, device, dtype, ckpt is not None
        self.dist = dist = dist_from_env()  # this process among torchrun's (one process: rank 0 of 1)
        self.ckpt_path = Path(cfg.out_dir) / "ckpt.pt"
        self.data = PreparedData(cfg.data_dir, cfg.dataset, cfg.block_size)
        self.micro_steps = cfg.gradient_accumulation_steps // dist.world_size  # this process's share
        self.tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
        self.data_gen = checkpoint.seed_rngs(cfg.seed, dist.rank)  # the data stream's own generator
        if ckpt is None:
            torch.manual_seed(cfg.seed)  # the same initial weights on every process
            model_args = {k: getattr(cfg, k) for k in MODEL_KEYS}
            self.raw_model = GPT(GPTConfig(**model_args, vocab_size=self.data.vocab_size)).to(device)
            torch.manual_seed(cfg.seed + dist.rank)
        else:
            self.raw_model = checkpoint.resume_model(ckpt, explicit, cfg.norm, cfg.dropout, self.data.vocab_size,
                                                     self.data.meta.get("tokenizer"), self.ckpt_path, device)
        device_type = device.split(":")[0]
        self.optimizer = self.raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate,
                                                             (cfg.beta1, cfg.beta2), device_type)
        # Loss scaling is for float16 only; disabled, each of its calls passes straight through.
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        self.iter_num, self.best_val_loss = 0, math.inf
        if ckpt is not None:
            self.iter_num, self.best_val_loss = checkpoint.restore_training_state(ckpt, self.optimizer, self.scaler,
                                                                                  self.data_gen, self.ckpt_path)
            if dist.rank:  # only rank 0's dropout stream is saved; the others get a fresh, deterministic one
                torch.manual_seed(cfg.seed + dist.rank + 7919 * self.iter_num)
        self.autocast = autocast(device, dtype)
        self.model = torch.compile(self.raw_model) if cfg.compile else self.raw_model  # evaluates
        self.train_model = dist.wrap(self.model, device)  # trains: with several processes, wrapped in DDP
        # What the run is, for the first log line and the summary.
        self.facts = {"norm": cfg.norm, "device": device, "dtype": dtype, "compile": cfg.compile,
                      "world_size": dist.world_size, "n_params": self.raw_model.get_num_params()}
        self.window: list[tuple[int, torch.Tensor, float]] = []  # (iteration, loss on the device, lr) not yet read
        self.n_timed = 0  # iterations read back since t_window
        self.paused_s = 0.0  # time spent evaluating/checkpointing inside the current timing window
        self.ms_per_iter: list[float] = []
        self.last_saved_iter = self.iter_num if self.resumed else None
        self.stop = StopRequest(announce=dist.master)  # SIGINT and SIGTERM
        self.stop_reason: str | None = None
        self.last_val: float | None = None
        self.metrics: Any = None  # metrics.jsonl (rank 0)
        self.wandb: Any = None  # the wandb run, when asked for (rank 0)

    def run(self) -> dict[str, Any]:
        cfg, f = self.cfg, self.facts
        with contextlib.ExitStack() as closing:
            closing.callback(self.data.close)
            if self.dist.master:
                # On resume, what describes the run up to the checkpoint is kept; eval_only adds to the record.
                path, resumed_at = self.ckpt_path.parent / "metrics.jsonl", self.iter_num if self.resumed else None
                self.metrics = closing.enter_context(checkpoint.open_metrics(path, resumed_at, append=cfg.eval_only))
                if cfg.wandb_log:  # (build_config made sure that wandb can be imported)
                    import wandb

                    name = cfg.wandb_run_name or f"{cfg.dataset}-{cfg.norm}-{time.strftime('%Y%m%d-%H%M%S')}"
                    self.wandb = wandb.init(project=cfg.wandb_project, name=name, config=asdict(cfg))
                    closing.callback(self.wandb.finish)
            where = f"resuming {self.ckpt_path} at iteration {self.iter_num}" if self.resumed else "from scratch"
            self.dist.print(
                f"training {where}: norm={f['norm']}, {f['n_params'] / 1e6:.2f}M parameters, device={f['device']}, "
                f"dtype={f['dtype']}, compile={f['compile']}, processes={f['world_size']}"
            )
            self.dist.print(f"{self.data.describe()}; {self.tokens_per_iter:,} tokens per iteration")
            with self.stop:
                self._loop()
            summary = self._summary()
            self.record(summary)
            if self.wandb is not None:
                self.wandb.summary.update(summary)
            if cfg.sample_at_end and self.dist.master and not cfg.eval_only:
                print_sample(self.raw_model, self.data, cfg, self.device, self.autocast)
            return summary

    # ---- the loop ----

    def _loop(self) -> None:
        cfg, optimizer, scaler = self.cfg, self.optimizer, self.scaler
        it = start = self.iter_num
        rows = slice(self.dist.rank * self.micro_steps, (self.dist.rank + 1) * self.micro_steps)  # this process's
        no_sync = self.train_model.no_sync if self.dist.enabled else contextlib.nullcontext
        n_starts = self.data.num_starts("train")
        self.t_window = time.perf_counter()
        while True:
            end = it >= cfg.max_iters or self.stop_reason == "max_wall_s" or cfg.eval_only
            # A resumed run was evaluated just before its checkpoint: no need to do it again.
            if (it % cfg.eval_interval == 0 or end) and not (self.resumed and it == start and not end):
                self._eval_and_checkpoint(it, may_save=it > start and not cfg.eval_only)
            if end:
                break
            if self.stop.signum is not None and (not self.dist.enabled or self.stop_reason == "signal"):
                self._interrupt(it)

            lr = get_lr(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            # The whole global batch's offsets (so any number of processes sees the same data); then ours.
            starts = torch.randint(n_starts, (cfg.gradient_accumulation_steps, cfg.batch_size), generator=self.data_gen)
            xs, ys = self.data.get("train", starts[rows], self.device)
            loss_sum = 0.0
            for m in range(self.micro_steps):
                # Gradients are all-reduced only after the last micro-step (DDP).
                with no_sync() if m < self.micro_steps - 1 else contextlib.nullcontext():
                    with self.autocast:
                        _, loss = self.train_model(xs[m], ys[m])
                    loss = loss / self.micro_steps
                    scaler.scale(loss).backward()
                loss_sum = loss_sum + loss.detach()
            if cfg.grad_clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            self.window.append((it, loss_sum, lr))
            if it % cfg.log_interval == 0:
                self._read_back(log=True)
            it += 1
        self.iter_num = it
        self.stop_reason = self.stop_reason or ("eval_only" if cfg.eval_only else "max_iters")

    def _read_back(self, log: bool = False) -> None:
        """Read back the losses of the iterations since the last read (one sync); stop if one is not finite.

        With several processes the losses are averaged over them in the same all_reduce that agrees on whether
        to stop (a signal or max_wall_s seen by any process), so every process stops at the same iteration.
        """
        window, self.window = self.window, []
        losses = torch.stack([loss for _, loss, _ in window]).float() if window else torch.zeros(0, device=self.device)
        wall = self.cfg.max_wall_s is not None and time.perf_counter() - self.t_start > self.cfg.max_wall_s
        flags = torch.tensor([float(self.stop.signum is not None), float(wall)], device=losses.device)
        *sums, stop, wall = self.dist.all_reduce(torch.cat([losses, flags])).tolist()
        now = time.perf_counter()
        for (it, _, _), total in zip(window, sums, strict=True):
            if not math.isfinite(total):
                self._diverged(f"loss is {total / self.dist.world_size} at iteration {it}")
        if stop and self.stop.signum is None:  # another process got the signal
            self.stop.signum = signal.SIGINT
        if wall or stop:  # (one process acts on a signal at once, several only on this agreement)
            self.stop_reason = self.stop_reason or ("max_wall_s" if wall else "signal")
        self.n_timed += len(window)
        if not log or not self.n_timed:
            return
        ms = (now - self.t_window - self.paused_s) * 1000 / self.n_timed
        self.t_window, self.paused_s, self.n_timed = now, 0.0, 0
        self.ms_per_iter.append(ms)
        (it, _, lr), loss = window[-1], sums[-1] / self.dist.world_size
        tok_s = self.tokens_per_iter / (ms / 1000) if ms > 0 else 0.0
        self.dist.print(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, {ms:.2f} ms/iter, {tok_s:.0f} tok/s")
        self.record({"kind": "train", "iter": it, "loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s},
                    wandb={"train/loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s})

    def _diverged(self, what: str) -> None:
        if self.last_saved_iter is not None:
            kept = f"the last good checkpoint, {self.ckpt_path} (iteration {self.last_saved_iter}), was kept"
        else:
            kept = "no checkpoint had been written by this run"
        raise TrainError(f"{what}: training stopped; {kept}. To go on from it, resume (--init_from=resume) "
                         f"with a lower --learning_rate or a longer --warmup_iters")

    # ---- evaluation and checkpoints ----

    def _eval_and_checkpoint(self, it: int, may_save: bool) -> None:
        t0 = time.perf_counter()
        self._read_back()  # never evaluate or save weights that a NaN went through
        losses = estimate_loss(self.model, self.data, self.cfg, self.dist, self.device, self.autocast)
        self.dist.print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        self.record({"kind": "eval", "iter": it, "train_loss": losses["train"], "val_loss": losses["val"]},
                    wandb={"eval/train_loss": losses["train"], "val/loss": losses["val"]})
        if not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
            self._diverged(f"the estimated loss is not finite at iteration {it} ({losses})")
        self.last_val = losses["val"]
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if may_save and (improved or self.cfg.always_save_checkpoint):
            self._checkpoint(it)
            self.dist.print(f"saved checkpoint {self.ckpt_path}")
        self.paused_s += time.perf_counter() - t0

    def _checkpoint(self, it: int, path: Path | None = None) -> None:
        """Save the whole state after `it` iterations (rank 0); refuse weights that are not finite."""
        # Every process checks (their weights are the same), so that all of them stop together.
        weights = self.raw_model.state_dict().values()
        if not all(bool(torch.isfinite(t).all()) for t in weights if t.is_floating_point()):
            self._diverged(f"the weights are not finite at iteration {it}")
        if not self.dist.master:
            return
        path = path or self.ckpt_path
        checkpoint.save_checkpoint(path, checkpoint.training_checkpoint(
            model=self.raw_model, optimizer=self.optimizer, scaler=self.scaler,
            iter_num=it, best_val_loss=self.best_val_loss, config=asdict(self.cfg),
            tokenizer=self.data.meta.get("tokenizer"), data_gen=self.data_gen,
        ))
        if path == self.ckpt_path:
            self.last_saved_iter = it

    def _interrupt(self, it: int) -> None:
        """Save the state after `it` iterations and raise Interrupted (with a resume command)."""
        self._read_back()
        signum = self.stop.signum or signal.SIGINT
        # In best-only mode ckpt.pt is the best model so far; the interrupted state goes beside it.
        path = self.ckpt_path if self.cfg.always_save_checkpoint else self.ckpt_path.parent / "ckpt_interrupted.pt"
        self._checkpoint(it, path)
        resume = f"python train.py --init_from=resume --out_dir={self.cfg.out_dir}"
        if path != self.ckpt_path:
            resume = f"mv {path} {self.ckpt_path} && {resume}"
        raise Interrupted(f"interrupted ({signal.Signals(signum).name}) after {it} iterations; saved {path}. "
                          f"To continue the run: {resume}", signum)

    # ---- output (rank 0 only) and the end ----

    def record(self, rec: dict[str, Any], wandb: dict[str, float] | None = None) -> None:
        """One line of metrics.jsonl and, if given and wandb is on, the same figures under wandb's names."""
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()
        if self.wandb is not None and wandb is not None:
            self.wandb.log(wandb, step=rec["iter"])

    def _summary(self) -> dict[str, Any]:
        timed = self.ms_per_iter[1:] if len(self.ms_per_iter) > 1 else self.ms_per_iter  # the first holds startup
        median_ms = statistics.median(timed) if timed else None
        return {
            "kind": "summary",
            "iters": self.iter_num,
            "final_val_loss": self.last_val,
            "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
            "peak_memory_bytes": peak_memory(self.device),
            "median_ms_per_iter": median_ms,
            "median_tokens_per_s": self.tokens_per_iter / (median_ms / 1000) if median_ms else None,
            "wall_s": time.perf_counter() - self.t_start,
            **self.facts,
            "stop_reason": self.stop_reason,
        }


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
    checkpoint.make_out_dir(cfg.out_dir)
    with dist.use(device):
        return Trainer(cfg, explicit, device, dtype, ckpt).run()


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
