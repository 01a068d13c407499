"""One iteration of training, as train.py, the benchmarks and the experiments run it (README.md's layout)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from machinery.options import TrainConfig


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


def train_step(
    model: Callable[..., Any],
    optimizer: torch.optim.Optimizer,
    xs: torch.Tensor,
    ys: torch.Tensor,
    grad_clip: float,
    autocast: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    *,
    set_to_none: bool = True,
) -> torch.Tensor:
    """Forward and backward over the micro-batches xs[m], ys[m] ([micro_steps, B, T]), each loss divided by their
    number so that the gradients add up to the mean's; then the clip (0: none), the optimizer's step, and the
    gradients zeroed (set_to_none=False: to zeros, for a CUDA graph that adds into them). `model(x, y)` returns
    (logits, loss); `scaler` scales the loss for float16. Returns the loss, detached, on the device (no sync)."""
    autocast = autocast or contextlib.nullcontext()
    scaler = scaler or torch.amp.GradScaler(enabled=False)
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)  # DDP's: all-reduce only after the last micro-step
    micro_steps = len(xs)
    loss_sum = torch.zeros((), device=xs.device)
    for m in range(micro_steps):
        with no_sync() if m < micro_steps - 1 else contextlib.nullcontext():
            with autocast:
                _, loss = model(xs[m], ys[m])
            loss = loss / micro_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
    if grad_clip:
        scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=set_to_none)
    return loss_sum
