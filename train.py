"""Train a GPT on a prepared dataset: one process, or several with torchrun.

    python train.py [configs/NAME.json] [--key=value ...]        (--help lists the options: machinery/options.py)
    python train.py configs/shakespeare_char_cpu.json --norm=custom
    python train.py --init_from=resume --out_dir=DIR --max_iters=3000   (the checkpoint's options are the defaults)
    python train.py configs/finetune_shakespeare.json --init_from=gpt2   (GPT-2's weights: model.gpt2_checkpoint)
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

from machinery.command import quiet_until_started

quiet_until_started(__name__)  # Ctrl-C while torch loads ends the process at once, quietly

import contextlib
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from machinery import runlog
from machinery.checkpoint import CheckpointError, checkpoint_path
from machinery.command import Failure, Interrupted, run_command
from machinery.dataset import DataError, PreparedData
from machinery.device import (
    Dist,
    StopRequest,
    autocast,
    check_norm_device,
    dist_from_env,
    peak_memory,
    resolve_device,
    resolve_dtype,
)
from machinery.options import ConfigError, TrainConfig, build_config, parse_args
from machinery.run import MODEL_SHAPE_KEYS, RUN_FILES, Run, check_resume, hold_out_dir, load_resume, make_out_dir
from machinery.step import get_lr, train_step
from machinery.tokenizer import GPT2_BPE
from model import GPT, GPTConfig, gpt2_checkpoint

EVAL_SEED_OFFSET = 1_000_003  # the eval generator's seed is seed + this: a stream unrelated to the training one
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 200


def setup(
    cfg: TrainConfig,
    explicit: dict[str, Any],
    ckpt: dict[str, Any] | None,
    device: str,
    dtype: str,
    dist: Dist,
    resumed_from: Path | None = None,
) -> Run:
    """The run's one set-up, which the benchmarks and the experiments share: the data, the model (new, its weights
    drawn from cfg.seed, or the checkpoint's, a resume's or GPT-2's, with cfg's norm and dropout), the optimizer,
    the loss scaler, the data stream and the seeds; a resume's state (from the checkpoint at resumed_from) last."""
    data = PreparedData(cfg.data_dir, cfg.dataset, cfg.block_size)
    device_type = torch.device(device).type
    fine_tune = cfg.init_from not in ("scratch", "resume")  # GPT-2's weights (from_gpt2)
    if ckpt is None:
        model = GPT.from_seed(GPTConfig.from_options(cfg, vocab_size=data.vocab_size), cfg.seed)  # on every process
    else:
        where = f"--init_from={cfg.init_from}" if fine_tune else f"cannot resume from {resumed_from}"
        if not fine_tune:
            check_resume(ckpt, explicit, data.vocab_size, data.meta.get("tokenizer"), resumed_from)
        elif data.meta.get("tokenizer") != GPT2_BPE or data.vocab_size != ckpt["model_args"]["vocab_size"]:
            raise DataError(
                f"{where} needs a dataset in GPT-2's BPE of {ckpt['model_args']['vocab_size']} tokens "
                f"(data/shakespeare/prepare.py writes one), not {data.describe()}"
            )
        try:
            model = GPT.from_checkpoint(ckpt, norm=cfg.norm, dropout=cfg.dropout).train()
        except ValueError as e:  # a norm that computes another function, weights that do not fit
            raise CheckpointError(f"{where}: {e}") from None
    model.to(device)
    torch.manual_seed(cfg.seed + dist.rank)  # dropout: one stream per process; a resume restores each
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")  # loss scaling for float16
    data_gen = torch.Generator().manual_seed(cfg.seed)  # the batches: one stream, the same on every process
    run = Run(cfg, device, dtype, dist, data, model, optimizer, scaler, data_gen, autocast(device, dtype), resumed_from)
    if ckpt is not None and not fine_tune:
        run.restore(ckpt)
    return run


def from_gpt2(cfg: TrainConfig, explicit: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """GPT-2's weights (model.gpt2_checkpoint) with positions past cfg.block_size cut off (nanoGPT's
    crop_block_size), and cfg with their shape; an option asking for another shape is a ConfigError naming it."""
    try:
        ckpt = gpt2_checkpoint(cfg.init_from)
    except ValueError as e:
        raise CheckpointError(f"--init_from={cfg.init_from}: {e}") from None
    args = ckpt["model_args"]
    keys = [k for k in MODEL_SHAPE_KEYS if k != "block_size" and k in explicit]
    asked = [f"{k}={explicit[k]!r} (it has {args[k]!r})" for k in keys if explicit[k] != args[k]]
    if cfg.block_size > args["block_size"]:
        asked.append(f"block_size={cfg.block_size} (it has {args['block_size']} positions)")
    if asked:
        raise ConfigError(f"--init_from={cfg.init_from} has a shape of its own: drop or lower {'; '.join(asked)}")
    ckpt["model"]["transformer.wpe.weight"] = ckpt["model"]["transformer.wpe.weight"][: cfg.block_size]
    args["block_size"] = cfg.block_size
    return replace(cfg, **{k: args[k] for k in ("n_layer", "n_head", "n_embd", "bias")}), ckpt


class LossOnly(torch.nn.Module):
    """The model returning its loss alone: what the graphed micro-step returns. Every output of a graphed callable
    that requires grad gets a gradient copied into the graph at each replay: for logits, a zero-filled [B, T, V]."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(idx, targets)[1]


def wrap(run: Run) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """The model that evaluates (compiled, if asked) and the one that trains: the same, in DDP with several
    processes, with its micro-step (forward and backward) captured once in a CUDA graph and replayed, if asked."""
    cfg = run.cfg
    model = torch.compile(run.model, mode=cfg.compile_mode) if cfg.compile else run.model
    train_model = model
    if run.dist.enabled:
        train_model = DDP(model, device_ids=[run.dist.local_rank] if run.device.startswith("cuda") else None)
    if cfg.cuda_graphs:  # static shapes: every micro-batch is [batch_size, block_size]
        with autocast(run.device, run.dtype, cache_enabled=False):  # (the casts are captured into the graph)
            sample = run.data.get("train", torch.zeros(cfg.batch_size, dtype=torch.long), run.device)
            rng = torch.cuda.get_rng_state(run.device)  # the capture's eager warm-up passes draw dropout masks from it:
            graphed = torch.cuda.make_graphed_callables(LossOnly(train_model), sample)
            torch.cuda.set_rng_state(rng, run.device)  # the loop starts where setup() (or a resume) left the stream
        train_model = lambda idx, targets: (None, graphed(idx, targets))  # (logits, loss), as the loop unpacks
        for p in run.model.parameters():  # .grad buffers of our own, added into: a replay rewrites the graph's
            p.grad = torch.zeros_like(p)  # gradient outputs, which must never become .grad (pytorch#181723)
    return model, train_model


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, run: Run) -> dict[str, float]:
    """Mean loss over eval_iters batches of each split: the same batches at every call (a generator of their own)."""
    cfg = run.cfg
    gen = torch.Generator().manual_seed(cfg.seed + EVAL_SEED_OFFSET)
    model.eval()
    sums = []
    for split in ("train", "val"):
        starts = torch.randint(run.data.num_starts(split), (cfg.eval_iters, cfg.batch_size), generator=gen)
        total = torch.zeros((), device=run.device)
        for rows in starts[run.dist.rank :: run.dist.world_size]:  # each process evaluates its share
            x, y = run.data.get(split, rows, run.device)
            with run.amp:
                _, loss = model(x, y)
            total += loss.float()
        sums.append(total)
    model.train()
    train_loss, val_loss = (run.dist.all_reduce(torch.stack(sums)) / cfg.eval_iters).tolist()
    return {"train": train_loss, "val": val_loss}


def diverged(what: str, run: Run) -> Failure:
    """The error that stops a run whose loss or weights are not finite, with the command that goes on: a resume
    from the last checkpoint this run wrote or resumed; else (none yet, or only the one an --overwrite replaces) the
    same command again, replacing what this run left, with half the learning rate."""
    if run.last_saved is not None:
        kept = f"the last good checkpoint, {run.ckpt_path} (iteration {run.last_saved}), was kept"
        how = "To go on from it, resume (--init_from=resume) with a lower --learning_rate or a longer --warmup_iters"
    else:
        # the same command line with two flags added (later flags win: parse_args), as a shell reads it back
        again = ["python", "train.py", *run.argv, "--overwrite=True", f"--learning_rate={run.cfg.learning_rate / 2:g}"]
        kept = "no checkpoint had been written by this run"
        how = f"To start it again with a lower learning rate (or a longer --warmup_iters): {shlex.join(again)}"
    return Failure(f"{what}: training stopped; {kept}. {how}")


def finite(read: list[tuple[int, float, float]], run: Run) -> list[tuple[int, float, float]]:
    for i, loss, _ in read:
        if not math.isfinite(loss):
            raise diverged(f"loss is {loss} at iteration {i}", run)
    return read


def save(run: Run, it: int, path: Path) -> None:
    """Checkpoint the run after `it` iterations, if every weight is finite (else diverged(): the last one stays)."""
    if not all(bool(torch.isfinite(t).all()) for t in run.model.state_dict().values() if t.is_floating_point()):
        raise diverged(f"the weights are not finite at iteration {it}", run)
    run.save(path, it)


def save_interrupted(run: Run, it: int, signum: int) -> Interrupted:
    """Save the run a signal stopped after `it` iterations; the error to raise says how to go on. In best-only
    mode ckpt.pt is the best model so far: the interrupted state goes beside it. With save_checkpoint=False, nothing."""
    name = signal.Signals(signum).name
    if not run.cfg.save_checkpoint:
        return Interrupted(f"interrupted ({name}) after {it} iterations; saved nothing (save_checkpoint=False)", signum)
    path = run.ckpt_path if run.cfg.always_save_checkpoint else Path(run.cfg.out_dir) / "ckpt_interrupted.pt"
    save(run, it, path)
    resume = f"python train.py --init_from=resume --out_dir={run.ckpt_path.parent}"
    resume = resume if path == run.ckpt_path else f"{resume} --resume_from={path}"  # ckpt.pt stays the best model
    return Interrupted(
        f"interrupted ({name}) after {it} iterations; saved {path}. To continue the run: {resume}", signum
    )


@torch.no_grad()
def print_sample(run: Run) -> None:
    """Print a sample of the final model, if the dataset's tokenizer can be built here (else a note)."""
    try:
        tok = run.data.tokenizer()
    except DataError as e:
        print(f"note: no sample at the end, {e}")
        return
    try:
        start = tok.encode("\n")
    except ValueError:  # a vocabulary without a newline
        start = [0]
    n = run.cfg.sample_tokens
    gen = torch.Generator(device=run.device).manual_seed(run.cfg.seed)
    idx = torch.tensor([start], device=run.device)
    run.model.eval()
    with run.amp:
        out = run.model.generate(idx, n, temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, generator=gen)
    print(f"--- sample ({n} tokens, temperature {SAMPLE_TEMPERATURE}) ---")
    print(tok.decode(out[0].tolist()), flush=True)


def announce(run: Run, resumed: bool, tokens_per_iter: int) -> None:
    """The lines a run starts with: what trains, on what data, and a schedule that would not decay fully."""
    cfg = run.cfg
    where = f"resuming {run.resumed_from} at iteration {run.iter_num}" if resumed else f"from {cfg.init_from}"
    run.dist.print(
        f"training {where}: norm={cfg.norm}, {cfg.norm_position}-norm, {run.model.get_num_params() / 1e6:.2f}M "
        f"parameters, device={run.device}, dtype={run.dtype}, compile={cfg.compile}, processes={run.dist.world_size}"
    )
    run.dist.print(f"{run.data.describe()}; {tokens_per_iter:,} tokens per iteration")
    if cfg.decay_lr and cfg.lr_decay_iters > cfg.max_iters:
        run.dist.print(
            f"note: lr_decay_iters={cfg.lr_decay_iters} is past max_iters={cfg.max_iters}, so the learning rate ends "
            f"at {get_lr(cfg.max_iters - 1, cfg):.2e}, not min_lr={cfg.min_lr:.2e}; "
            f"--lr_decay_iters={cfg.max_iters} decays it fully"
        )


def evaluate(model: torch.nn.Module, run: Run, it: int, log: Callable[..., None]) -> tuple[float, bool]:
    """Estimate the losses and log them; return the val loss and whether it is the best yet (kept in run.best_val).
    A loss that is not finite stops the run."""
    losses = estimate_loss(model, run)
    bpb = run.data.bits_per_byte("val", losses["val"])  # (None: a meta.json without byte counts)
    in_bits = f" ({bpb:.4f} bits/byte)" if bpb is not None else ""
    run.dist.print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}{in_bits}")
    log(
        {"kind": "eval", "iter": it, "train_loss": losses["train"], "val_loss": losses["val"], "val_bpb": bpb},
        wandb={"eval/train_loss": losses["train"], "val/loss": losses["val"], "val/bpb": bpb},
    )
    if not (math.isfinite(losses["train"]) and math.isfinite(losses["val"])):
        raise diverged(f"the estimated loss is not finite at iteration {it} ({losses})", run)
    improved = losses["val"] < run.best_val
    run.best_val = min(run.best_val, losses["val"])
    return losses["val"], improved


def sample_at_end(run: Run, iters: int) -> None:
    """The sample printed when the run is done (evaluated, saved), past StopRequest: Ctrl-C stops it, saying so."""
    try:
        print_sample(run)
    except KeyboardInterrupt:
        saved = f"its checkpoint is {run.ckpt_path}" if run.ckpt_path.exists() else "it saved no checkpoint"
        raise Interrupted(
            f"interrupted (SIGINT) during the sample at the end; the run is done ({iters} iterations) and {saved}",
            signal.SIGINT,
        ) from None


def train(
    cfg: TrainConfig,
    explicit: dict[str, Any],
    device: str,
    dtype: str,
    ckpt: dict[str, Any] | None,
    dist: Dist,
    resumed_from: Path | None = None,
    argv: Sequence[str] = (),
) -> dict[str, Any]:
    """Set up, then the loop: evaluate and checkpoint, set the learning rate, step, log. Returns the summary."""
    t_start = time.perf_counter()
    run = setup(cfg, explicit, ckpt, device, dtype, dist, resumed_from)
    run.argv = tuple(argv)
    model, train_model = wrap(run)
    resumed = resumed_from is not None
    tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    announce(run, resumed, tokens_per_iter)
    micro_steps = cfg.gradient_accumulation_steps // dist.world_size  # this process's share of the global batch
    rows = slice(dist.rank * micro_steps, (dist.rank + 1) * micro_steps)
    start = run.iter_num
    it = start
    with (
        runlog.open_log(cfg, dist, start if resumed else None) as log,
        StopRequest(dist, catch=not cfg.eval_only, saves=cfg.save_checkpoint) as stop,
        contextlib.closing(run.data),
    ):
        window = runlog.LossWindow(dist, tokens_per_iter, log)
        while True:
            over_time = cfg.max_wall_s is not None and time.perf_counter() - t_start > cfg.max_wall_s
            stop_reason = stop.agreed(over_time)  # (the same on every process)
            end = it >= cfg.max_iters or stop_reason == "max_wall_s" or cfg.eval_only
            # every eval_interval iterations and at the end; not at a resume's start (evaluated before it was saved)
            if end or (it % cfg.eval_interval == 0 and not (resumed and it == start)):
                t0 = time.perf_counter()
                finite(window.read(), run)  # never evaluate or save weights that a NaN went through
                val_loss, improved = evaluate(model, run, it, log)
                # (eval_only: it == start, so never saves)
                if it > start and cfg.save_checkpoint and (improved or cfg.always_save_checkpoint):
                    save(run, it, run.ckpt_path)
                window.paused_s += time.perf_counter() - t0
            if end:
                break
            if stop_reason == "signal":
                finite(window.read(), run)
                raise save_interrupted(run, it, stop.signum)

            lr = get_lr(it, cfg)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            # The whole global batch's offsets (so any number of processes sees the same data); then ours.
            shape = (cfg.gradient_accumulation_steps, cfg.batch_size)
            starts = torch.randint(run.data.num_starts("train"), shape, generator=run.data_gen)
            xs, ys = run.data.get("train", starts[rows], device)
            loss = train_step(
                train_model, run.optimizer, xs, ys, cfg.grad_clip, run.amp, run.scaler, set_to_none=not cfg.cuda_graphs
            )
            window.pending.append((it, loss, lr))
            if it % cfg.log_interval == 0:
                window.log_line(finite(window.read(), run)[-1])
            it += 1
        summary = window.summary(
            iters=it,
            final_val_loss=val_loss,  # (the loop ends after an evaluation)
            best_val_loss=run.best_val if math.isfinite(run.best_val) else None,
            best_val_bpb=run.data.bits_per_byte("val", run.best_val) if math.isfinite(run.best_val) else None,
            peak_memory_bytes=peak_memory(device),
            wall_s=time.perf_counter() - t_start,
            norm=cfg.norm,
            device=device,
            dtype=dtype,
            compile=cfg.compile,
            cuda_graphs=cfg.cuda_graphs,
            world_size=dist.world_size,
            n_params=run.model.get_num_params(),
            stop_reason="eval_only" if cfg.eval_only else stop_reason or "max_iters",
        )
        log(summary)
    if cfg.sample_at_end and dist.master and not cfg.eval_only and stop.signum is None:  # (a signal: no sample)
        sample_at_end(run, it)
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train as the command line `argv` asks; return the summary record. Every expected failure is a Failure with a
    one-line message (machinery/command.py), which cli() turns into an exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    explicit = parse_args(argv)
    dist = dist_from_env()
    ckpt = resumed_from = read = None
    if explicit.get("init_from") == "resume":  # the checkpoint's options are the defaults
        resumed_from = checkpoint_path(explicit.get("out_dir", TrainConfig.out_dir), explicit.get("resume_from"))
        read = file_version(resumed_from)
        ckpt = load_resume(resumed_from)
    cfg = build_config(explicit, ckpt and ckpt["config"], source=str(resumed_from or ""), processes=dist.world_size)
    if cfg.init_from not in ("scratch", "resume"):
        cfg, ckpt = from_gpt2(cfg, explicit)
    device = resolve_device(cfg.device, dist)
    dtype = resolve_dtype(cfg.dtype, torch.device(device).type)
    check_norm_device(cfg.norm, device)  # before any data or model is loaded
    if cfg.cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"cuda_graphs=True needs a CUDA device, got device={device!r}: drop --cuda_graphs")
    # a resume from a file in out_dir continues the run there; from a file elsewhere, out_dir is a new run's
    in_place = resumed_from is not None and os.path.realpath(resumed_from.parent) == os.path.realpath(cfg.out_dir)
    with hold_out_dir(cfg.out_dir, master=dist.master):  # one run per folder, until this process ends
        if resumed_from is not None and file_version(resumed_from) != read:
            raise CheckpointError(
                f"{resumed_from} was replaced while this run read it (the run that held {cfg.out_dir} saved it as it "
                f"ended): run this command again to resume from the new one"
            )
        make_out_dir(cfg.out_dir, new_run=not in_place and not cfg.overwrite)
        if cfg.overwrite and not in_place:  # the replaced run's interrupted state and record, never to be mixed in
            for name in RUN_FILES[1:]:  # (ckpt.pt: replaced at the first save)
                (Path(cfg.out_dir) / name).unlink(missing_ok=True)
        with dist.use(device):
            return train(cfg, explicit, device, dtype, ckpt, dist, resumed_from, argv)


def file_version(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (a save renames a new file over it): inode, size, mtime."""
    with contextlib.suppress(OSError):
        st = path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns
    return None


def cli(argv: Sequence[str] | None = None) -> int:
    """main() through the front door: its exit status, every expected failure one line on stderr."""
    return run_command(
        lambda: main(argv),
        lower="--batch_size or --block_size, or the model's size (--n_layer, --n_embd)",
        interrupted="interrupted: quit without saving",
    )


if __name__ == "__main__":
    sys.exit(cli())
